// Anthropic's Messages API through the real @anthropic-ai/sdk client, as Claude Code and other
// Anthropic clients call it: messages.create (plain, streamed), messages.stream's assembled message,
// tool use with tool_choice any / tool and a tool_result turn after it, stop sequences, countTokens,
// and errors in Anthropic's shape. Against a tiny random-weight model, so the checks are about the
// protocol: a random model's tool calls still name declared tools with valid input, as the grammar
// makes them.
import { baseURL, check, done, importPackage } from './common.mjs';

const { default: Anthropic } = await importPackage('@anthropic-ai/sdk');

const anthropic = new Anthropic({
  baseURL: baseURL.replace(/\/v1\/?$/, ''),
  apiKey: process.env.QINFER_API_KEY ?? 'unused',
  maxRetries: 0,
  timeout: 60_000,
});
const model = (await (await fetch(`${baseURL}/models`)).json()).data[0].id;
const noThinking = { thinking: { type: 'disabled' } };
const hello = [{ role: 'user', content: 'Hello there' }];
// The prompt's tokens: those read from the prefix cache are counted apart, as Anthropic counts them.
const promptTokens = (u) => u.input_tokens + (u.cache_read_input_tokens ?? 0);

// Plain.
const plain = await anthropic.messages.create({ model, max_tokens: 12, messages: hello, ...noThinking });
check(plain.type === 'message' && plain.role === 'assistant', `message: ${JSON.stringify(plain)}`);
check(plain.id.startsWith('msg_'), `id ${plain.id}`);
check(plain.model === model, `model ${plain.model}`);
check(Array.isArray(plain.content) && plain.content.every((b) => b.type === 'text'), JSON.stringify(plain.content));
check(['end_turn', 'max_tokens'].includes(plain.stop_reason), `stop_reason ${plain.stop_reason}`);
check(plain.usage.input_tokens > 0 && plain.usage.output_tokens > 0 && plain.usage.output_tokens <= 12,
  JSON.stringify(plain.usage));

// A system prompt as blocks, and an earlier assistant turn with a thinking block.
const turns = await anthropic.messages.create({
  model, max_tokens: 4, ...noThinking,
  system: [{ type: 'text', text: 'Be brief.', cache_control: { type: 'ephemeral' } }],
  messages: [
    { role: 'user', content: [{ type: 'text', text: 'Hi' }] },
    { role: 'assistant', content: [{ type: 'thinking', thinking: 'greet', signature: '' }, { type: 'text', text: 'Hello!' }] },
    { role: 'user', content: 'And again?' },
  ],
});
check(promptTokens(turns.usage) > promptTokens(plain.usage), `more input: ${JSON.stringify(turns.usage)}`);

// Streamed: the raw events in Anthropic's order, and the SDK's assembled message.
const events = [];
for await (const e of await anthropic.messages.create({ model, max_tokens: 16, messages: hello, stream: true, ...noThinking }))
  events.push(e);
check(events[0].type === 'message_start', `first ${events[0].type}`);
check(events.at(-1).type === 'message_stop', `last ${events.at(-1).type}`);
check(events.at(-2).type === 'message_delta' && events.at(-2).usage.output_tokens > 0, JSON.stringify(events.at(-2)));
let open = -1;
let streamedText = '';
for (const e of events) {
  if (e.type === 'content_block_start') {
    check(open === -1, 'a block starts while another is open');
    open = e.index;
  } else if (e.type === 'content_block_delta') {
    check(e.index === open, 'a delta outside its block');
    if (e.delta.type === 'text_delta') streamedText += e.delta.text;
  } else if (e.type === 'content_block_stop') {
    check(e.index === open, `a stop of a block not open: ${JSON.stringify(events)}`);
    open = -1;
  }
}
check(open === -1, 'a block left open');
const assembled = await anthropic.messages.stream({ model, max_tokens: 16, messages: hello, ...noThinking }).finalMessage();
check(assembled.content.length > 0 && assembled.usage.output_tokens > 0, JSON.stringify(assembled));
check(typeof streamedText === 'string', 'streamed text');

// Tools: the call names a declared tool, its input follows input_schema.
const tools = [
  {
    name: 'get_weather',
    description: 'Weather for a city',
    input_schema: {
      type: 'object',
      properties: { city: { type: 'string', enum: ['Paris', 'Oslo'] }, days: { type: 'integer', minimum: 1, maximum: 5 } },
      required: ['city', 'days'],
      additionalProperties: false,
    },
  },
  { name: 'get_time', input_schema: { type: 'object', properties: { zone: { type: 'string', enum: ['UTC'] } }, required: ['zone'] } },
];
const ask = [{ role: 'user', content: 'Weather in Paris?' }];
function checkWeather(block) {
  check(block.type === 'tool_use' && block.id && block.name === 'get_weather', JSON.stringify(block));
  check(['Paris', 'Oslo'].includes(block.input.city) && Number.isInteger(block.input.days) && block.input.days >= 1 &&
    block.input.days <= 5 && Object.keys(block.input).length === 2, JSON.stringify(block.input));
}
for (const stream of [false, true]) {
  const request = { model, max_tokens: 400, messages: ask, tools, tool_choice: { type: 'tool', name: 'get_weather' }, ...noThinking };
  const message = stream ? await anthropic.messages.stream(request).finalMessage() : await anthropic.messages.create(request);
  const uses = message.content.filter((b) => b.type === 'tool_use');
  check(uses.length === 1, `one tool_use (stream ${stream}): ${JSON.stringify(message.content)}`);
  checkWeather(uses[0]);
  check(message.stop_reason === 'tool_use', `stop_reason ${message.stop_reason}`);
  if (stream) continue;
  // The result goes back as a tool_result block; the next answer is a normal turn.
  const next = await anthropic.messages.create({
    model, max_tokens: 8, tools, ...noThinking,
    messages: [...ask, { role: 'assistant', content: message.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: uses[0].id, content: [{ type: 'text', text: 'Sunny, 21 C' }] }] }],
  });
  check(next.type === 'message' && promptTokens(next.usage) > promptTokens(message.usage), JSON.stringify(next.usage));
}
const any = await anthropic.messages.create({ model, max_tokens: 400, messages: ask, tools, tool_choice: { type: 'any', disable_parallel_tool_use: true }, ...noThinking });
const anyUses = any.content.filter((b) => b.type === 'tool_use');
check(anyUses.length === 1 && ['get_weather', 'get_time'].includes(anyUses[0].name), JSON.stringify(any.content));

// A stop sequence a random model soon writes: which one stopped it is reported.
const stops = ['e', 'a', 'o', 'i', 't', 's', 'n'];
const stopped = await anthropic.messages.create({ model, max_tokens: 200, messages: hello, stop_sequences: stops, temperature: 1, ...noThinking });
if (stopped.stop_reason === 'stop_sequence') {
  check(stops.includes(stopped.stop_sequence), `stop_sequence ${stopped.stop_sequence}`);
  const text = stopped.content.filter((b) => b.type === 'text').map((b) => b.text).join('');
  check(!stops.some((s) => text.includes(s)), `text holds a stop sequence: ${JSON.stringify(text)}`);
} else {
  check(['end_turn', 'max_tokens'].includes(stopped.stop_reason), `stop_reason ${stopped.stop_reason}`);
}

// countTokens agrees with what a request reports as its input.
const counted = await anthropic.messages.countTokens({ model, messages: hello, ...noThinking });
check(counted.input_tokens === promptTokens(plain.usage),
  `count ${counted.input_tokens} vs ${JSON.stringify(plain.usage)}`);

// Errors come back in Anthropic's shape, which the SDK turns into its error classes.
async function expectError(request, Kind, says) {
  try {
    await anthropic.messages.create(request);
    check(false, `accepted ${JSON.stringify(request)}`);
  } catch (e) {
    check(e instanceof Kind, `${e.constructor.name}: ${e.message}`);
    check(e.error?.type === 'error' && typeof e.error?.error?.message === 'string', JSON.stringify(e.error));
    check(e.message.includes(says), `${e.message} lacks ${says}`);
  }
}
await expectError({ model, messages: hello }, Anthropic.BadRequestError, 'max_tokens');
await expectError({ model: 'other', max_tokens: 4, messages: hello }, Anthropic.NotFoundError, 'does not exist');
await expectError({ model, max_tokens: 4, messages: hello, tools: [{ type: 'web_search_20250305', name: 'web_search' }] },
  Anthropic.BadRequestError, 'server tools');
await expectError({ model, max_tokens: 4, messages: [{ role: 'user', content: [{ type: 'image', source: { type: 'url', url: 'http://x/y.png' } }] }] },
  Anthropic.BadRequestError, 'messages[0].content[0].type');
await expectError({ model, max_tokens: 4, messages: hello, thinking: { type: 'enabled', budget_tokens: 1024 } },
  Anthropic.BadRequestError, 'budget');

done('anthropic_client');
