// Tool calls constrained to the request's tools, against a tiny random-weight model (Hermes calls
// for Qwen3's template, XML calls for Qwen3.5's): a random model writes whatever the grammar mask
// allows, so every call below names a declared tool with arguments its schema accepts because the
// grammar made it so. tool_choice required, named and auto; parallel_tool_calls; n > 1, streamed and
// not; a call cut by max_tokens ends in "length" with only the arguments written; strict tools the
// grammar cannot follow are refused; the openai client's runTools and LangChain's function-calling
// structured output on top. Schemas are bounded (enums, integer ranges, booleans) so that calls
// complete well within max_tokens: the XML format writes strings as raw text, which no bound limits.
import { baseURL, check, client, collectChat, done, importPackage } from './common.mjs';

const { zodFunction } = await importPackage('openai/helpers/zod');
const { ChatOpenAI } = await importPackage('@langchain/openai');
const { z } = await importPackage('zod');

const openai = client();
const model = (await openai.models.list()).data[0].id;
// Without this a random model would first write a free <think> block that rarely closes.
const noThinking = { chat_template_kwargs: { enable_thinking: false } };

const weatherParams = {
  type: 'object',
  properties: {
    city: { type: 'string', enum: ['Paris', 'Oslo', 'Lima'] },
    days: { type: 'integer', minimum: 1, maximum: 7 },
    metric: { type: 'boolean' },
  },
  required: ['city', 'days'],
  additionalProperties: false,
};
const timeParams = {
  type: 'object',
  properties: { zone: { type: 'string', enum: ['UTC', 'CET'] } },
  required: ['zone'],
  additionalProperties: false,
};
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather for a city', parameters: weatherParams } },
  { type: 'function', function: { name: 'get_time', description: 'The time in a zone', parameters: timeParams } },
];
const messages = [{ role: 'user', content: 'What is the weather in Paris, and the time there?' }];
const base = { model, messages, tools, temperature: 1, max_tokens: 1000, ...noThinking };

// An independent check of a call against the schemas above.
function callError(call) {
  let args;
  try {
    args = JSON.parse(call.arguments);
  } catch {
    return `arguments are not JSON: ${JSON.stringify(call.arguments)}`;
  }
  if (typeof args !== 'object' || args === null || Array.isArray(args)) return `arguments are not an object: ${call.arguments}`;
  const keys = Object.keys(args);
  if (call.name === 'get_weather') {
    if (!keys.every((k) => ['city', 'days', 'metric'].includes(k))) return `extra key in ${call.arguments}`;
    if (!['Paris', 'Oslo', 'Lima'].includes(args.city)) return `city in ${call.arguments}`;
    if (!Number.isInteger(args.days) || args.days < 1 || args.days > 7) return `days in ${call.arguments}`;
    if ('metric' in args && typeof args.metric !== 'boolean') return `metric in ${call.arguments}`;
    return null;
  }
  if (call.name === 'get_time') {
    if (keys.length !== 1 || !['UTC', 'CET'].includes(args.zone)) return `zone in ${call.arguments}`;
    return null;
  }
  return `undeclared tool ${JSON.stringify(call.name)}`;
}
function checkCalls(calls, what) {
  for (const c of calls) {
    const error = callError(c.function ?? c);
    check(!error, `${what}: ${error}`);
  }
}

// required, not streamed, n = 3: only calls, every one valid.
let calls = 0;
for (const seed of [1, 2, 3, 4]) {
  const r = await openai.chat.completions.create({ ...base, tool_choice: 'required', n: 3, seed });
  check(r.choices.length === 3, 'three choices');
  for (const c of r.choices) {
    check(c.finish_reason === "tool_calls", `required seed ${seed} finish ${c.finish_reason}: ${JSON.stringify(c.message)}`);
    check(c.message.tool_calls?.length >= 1, `required seed ${seed} makes a call`);
    check(!c.message.content, `required seed ${seed} writes no content: ${JSON.stringify(c.message.content)}`);
    checkCalls(c.message.tool_calls, `required seed ${seed}`);
    calls += c.message.tool_calls.length;
    if (seed === 1 && c.index === 0) console.log(`required sample: ${JSON.stringify(c.message.tool_calls.map((t) => t.function))}`);
  }
}
console.log(`tool_choice required: ${calls} calls in 12 choices, all valid`);

// parallel_tool_calls false: exactly one call.
for (const seed of [5, 6, 7]) {
  const r = await openai.chat.completions.create({ ...base, tool_choice: 'required', parallel_tool_calls: false, n: 2, seed });
  for (const c of r.choices) {
    check(c.message.tool_calls?.length === 1, `parallel_tool_calls false: one call, got ${c.message.tool_calls?.length}`);
    checkCalls(c.message.tool_calls, 'parallel_tool_calls false');
  }
}

// A named tool, streamed: that tool once.
for (const seed of [1, 2, 3]) {
  const r = await collectChat(await openai.chat.completions.create({
    ...base, tool_choice: { type: 'function', function: { name: 'get_time' } }, stream: true, seed,
  }));
  const c = r.choices.get(0);
  check(c.finish === 'tool_calls', `named finish ${c.finish}`);
  check(c.calls.length === 1 && c.calls[0].name === 'get_time', `named: one get_time call, got ${JSON.stringify(c.calls)}`);
  check(c.calls[0].id.startsWith('call_'), 'streamed call ids');
  checkCalls(c.calls, `named seed ${seed}`);
}

// auto: text, or calls that are valid; the text never holds an unparsed call.
const outcomes = { text: 0, calls: 0, length: 0 };
for (const seed of [1, 2, 3, 4, 5, 6, 7, 8]) {
  const r = await openai.chat.completions.create({ ...base, tool_choice: 'auto', seed, max_tokens: 60 });
  const c = r.choices[0];
  check(['stop', 'length', 'tool_calls'].includes(c.finish_reason), `auto finish ${c.finish_reason}`);
  check(!(c.message.content ?? '').includes('<tool_call>'), `auto content holds no call: ${c.message.content}`);
  if (c.finish_reason === 'tool_calls') checkCalls(c.message.tool_calls, `auto seed ${seed}`);
  outcomes[c.finish_reason === 'tool_calls' ? 'calls' : c.finish_reason === 'stop' ? 'text' : 'length'] += 1;
}
console.log(`tool_choice auto over 8 seeds: ${JSON.stringify(outcomes)}`);

// Cut by max_tokens: "length", and the call holds only what the model wrote, a prefix of what the
// same seed writes with room to finish (nothing closed or made up).
let cut = 0;
for (const seed of [11, 12, 13, 14]) {
  const full = await openai.chat.completions.create({ ...base, tool_choice: 'required', parallel_tool_calls: false, seed });
  const whole = full.choices[0].message.tool_calls[0].function;
  for (const max_tokens of [8, 14, 20]) {
    const r = await openai.chat.completions.create({ ...base, tool_choice: 'required', parallel_tool_calls: false, seed, max_tokens });
    const c = r.choices[0];
    if (c.finish_reason !== 'length') {
      check(c.finish_reason === 'tool_calls', `cut seed ${seed}: finish ${c.finish_reason}`);
      continue;
    }
    cut += 1;
    for (const t of c.message.tool_calls ?? []) {
      check(t.function.name === whole.name, `a cut call keeps its name (${t.function.name} vs ${whole.name})`);
      check(whole.arguments.startsWith(t.function.arguments) && t.function.arguments !== whole.arguments,
        `a cut call's arguments are a strict prefix of the whole call's: ${JSON.stringify(t.function.arguments)} vs ${JSON.stringify(whole.arguments)}`);
    }
  }
}
check(cut >= 4, `some calls were cut by max_tokens (${cut})`);

// Strict tools whose schema the grammar cannot follow: a 400 naming the tool, never an unconstrained call.
{
  const strictTools = [{ type: 'function', function: { name: 'tag', strict: true, parameters: {
    type: 'object', properties: { tags: { type: 'array', items: { type: 'integer' }, uniqueItems: true } },
    required: ['tags'], additionalProperties: false } } }];
  let status = 0, message = '';
  try {
    await openai.chat.completions.create({ ...base, tools: strictTools, tool_choice: 'required' });
  } catch (e) {
    status = e.status;
    message = e.message;
  }
  check(status === 400 && message.includes('tools[0].function.parameters') && message.includes('uniqueItems'),
    `an unsupported strict schema is a 400 naming it: ${status} ${message}`);
  // The same schema, not strict: the names are still constrained, the arguments any object.
  const r = await openai.chat.completions.create({ ...base, tools: [{ ...strictTools[0], function: { ...strictTools[0].function, strict: false } }],
    tool_choice: 'required', seed: 1, max_tokens: 300 });
  for (const t of r.choices[0].message.tool_calls ?? []) check(t.function.name === 'tag', 'a loose tool keeps its name');
}

// The openai client's runTools with tool_choice required: zodFunction tools (strict), arguments
// parsed and validated by the client before each callback runs; every round calls a tool.
{
  const seen = [];
  const runner = openai.chat.completions.runTools({
    model, messages, temperature: 1, max_tokens: 200, seed: 3, ...noThinking, tool_choice: 'required',
    tools: [
      zodFunction({ name: 'get_weather', parameters: z.object({ city: z.enum(['Paris', 'Oslo', 'Lima']), days: z.number().int().min(1).max(7) }),
        function: (args) => (seen.push(['get_weather', args]), 'Sunny, 21 C') }),
      zodFunction({ name: 'get_time', parameters: z.object({ zone: z.enum(['UTC', 'CET']) }),
        function: (args) => (seen.push(['get_time', args]), '12:00') }),
    ],
  }, { maxChatCompletions: 3 });
  await runner.done();
  const completions = runner.allChatCompletions();
  check(completions.length === 3, `runTools ran 3 completions (${completions.length})`);
  check(completions.every((c) => c.choices[0].finish_reason === 'tool_calls'), 'every runTools round called a tool');
  check(seen.length >= 3, `runTools ran the callbacks with parsed arguments (${seen.length})`);
  const toolResults = runner.messages.filter((m) => m.role === 'tool');
  check(toolResults.every((m) => m.content === 'Sunny, 21 C' || m.content === '12:00'),
    `no tool result is an argument error: ${JSON.stringify(toolResults.map((m) => m.content))}`);
  console.log(`openai runTools required: ${seen.length} callbacks over 3 rounds: ${JSON.stringify(seen)}`);
}

// LangChain ChatOpenAI.withStructuredOutput, method functionCalling: a tool named after the schema,
// tool_choice naming it, the call's arguments parsed with zod.
{
  const bodies = [];
  const llm = new ChatOpenAI({
    model, apiKey: 'unused', temperature: 1, maxTokens: 200, maxRetries: 0, modelKwargs: noThinking,
    configuration: { baseURL, fetch: async (url, init) => (bodies.push(JSON.parse(init.body)), fetch(url, init)) },
  });
  const Forecast = z.object({ city: z.enum(['Paris', 'Oslo', 'Lima']), days: z.number().int().min(1).max(7), metric: z.boolean() });
  for (const seed of [1, 2, 3]) {
    const r = await llm.withStructuredOutput(Forecast, { method: 'functionCalling', name: 'forecast', includeRaw: true })
      .invoke([['user', 'Forecast for Oslo?']], { seed });
    const parsed = Forecast.safeParse(r.parsed);
    check(parsed.success, `LangChain functionCalling seed ${seed} validates: ${JSON.stringify(r.parsed)}`);
    const body = bodies.at(-1);
    check(body.tool_choice?.function?.name === 'forecast', `LangChain names its tool: ${JSON.stringify(body.tool_choice)}`);
  }
  console.log('LangChain withStructuredOutput functionCalling: 3 calls validate');
}

done('tool calls');
