// The real openai npm client against `qinfer serve` with a tiny random-weight model: chat and
// completions, streamed and not, n > 1, stop strings, logprobs, usage, tools, and errors.
import { check, client, collectChat, done } from './common.mjs';

const openai = client();
const models = await openai.models.list();
check(models.data.length === 1, 'one served model');
const model = models.data[0].id;
check(models.data[0].object === 'model', 'models.list() entries are models');

// Chat, not streamed.
const messages = [{ role: 'user', content: 'Hello there, how are you?' }];
const plain = await openai.chat.completions.create({ model, messages, max_tokens: 10, seed: 5, temperature: 0.8 });
check(plain.object === 'chat.completion', 'object chat.completion');
check(plain.id.startsWith('chatcmpl-'), 'chat ids');
const first = plain.choices[0];
check(first.message.role === 'assistant', 'assistant role');
check(['stop', 'length'].includes(first.finish_reason), `finish_reason ${first.finish_reason}`);
const u = plain.usage;
check(u.prompt_tokens > 5, 'prompt tokens counted');
check(u.completion_tokens >= 1 && u.completion_tokens <= 10, `completion tokens ${u.completion_tokens}`);
check(u.total_tokens === u.prompt_tokens + u.completion_tokens, 'total tokens');
check(typeof u.prompt_tokens_details?.cached_tokens === 'number', 'usage.prompt_tokens_details.cached_tokens');

// The same request streamed gives the same text (same seed, the model alone on the server).
const streamed = await collectChat(
  await openai.chat.completions.create({
    model, messages, max_tokens: 10, seed: 5, temperature: 0.8, stream: true, stream_options: { include_usage: true },
  }),
);
const s0 = streamed.choices.get(0);
check(s0.role === 'assistant', 'the stream opens with the role');
check(s0.content === (first.message.content ?? ''), `streamed content ${JSON.stringify(s0.content)} vs ${JSON.stringify(first.message.content)}`);
check(s0.reasoning === (first.message.reasoning_content ?? ''), 'streamed reasoning equals the whole response');
check(s0.finish === first.finish_reason, 'same finish reason');
check(streamed.usage && streamed.usage.completion_tokens === u.completion_tokens, 'usage chunk with include_usage');

// n > 1, streamed and not.
const multi = await openai.chat.completions.create({ model, messages, max_tokens: 6, n: 3, temperature: 1, seed: 9 });
check(multi.choices.length === 3, 'n = 3 gives 3 choices');
check(multi.choices.map((c) => c.index).join() === '0,1,2', 'choice indexes');
check(multi.usage.completion_tokens <= 18 && multi.usage.completion_tokens >= 3, 'usage sums the choices');
const multiStream = await collectChat(
  await openai.chat.completions.create({ model, messages, max_tokens: 6, n: 2, temperature: 1, stream: true }),
);
check(multiStream.choices.size === 2, 'n = 2 streamed');
for (const [index, c] of multiStream.choices) check(c.finish !== null, `choice ${index} finished`);

// Completions and stop strings (raw text: no template, no reasoning split).
const prompt = 'The quick brown fox';
const base = await openai.completions.create({ model, prompt, max_tokens: 16, temperature: 0 });
check(base.object === 'text_completion', 'object text_completion');
const text = base.choices[0].text;
const streamedText = [];
for await (const chunk of await openai.completions.create({ model, prompt, max_tokens: 16, temperature: 0, stream: true }))
  for (const c of chunk.choices) streamedText.push(c.text);
check(streamedText.join('') === text, 'streamed completion equals the whole one');
const points = Array.from(text);
let k = 1;
while (k + 1 < points.length && (points[k] === '\uFFFD' || points[k + 1] === '\uFFFD' || points[k] === ' ')) k += 1;
check(points.length >= 3 && k + 1 < points.length, `greedy text long enough for a stop string: ${JSON.stringify(text)}`);
const stop = points[k] + points[k + 1];
const cut = await openai.completions.create({ model, prompt, max_tokens: 16, temperature: 0, stop: [stop, 'never-seen'] });
check(cut.choices[0].text === text.slice(0, text.indexOf(stop)), `stop ${JSON.stringify(stop)} cuts ${JSON.stringify(text)} to ${JSON.stringify(cut.choices[0].text)}`);
check(cut.choices[0].finish_reason === 'stop', 'a stop string ends with finish_reason stop');
const chatStop = await openai.chat.completions.create({ model, messages, max_tokens: 8, temperature: 0, stop: 'zzzzqqq' });
check(chatStop.choices[0].finish_reason !== null, 'chat accepts a stop string');

// Logprobs.
const lp = await openai.chat.completions.create({ model, messages, max_tokens: 5, temperature: 0, logprobs: true, top_logprobs: 3 });
const entries = lp.choices[0].logprobs.content;
const expectedEntries = lp.usage.completion_tokens - (lp.choices[0].finish_reason === 'stop' ? 1 : 0);
check(entries.length === expectedEntries, `one logprob entry per output token (${entries.length} vs ${expectedEntries})`);
for (const e of entries) {
  check(typeof e.token === 'string' && e.logprob <= 0 && Array.isArray(e.bytes), 'logprob entry shape');
  check(e.top_logprobs.length === 3, 'top_logprobs has 3 alternatives');
  check(e.top_logprobs[0].logprob >= e.top_logprobs[2].logprob, 'alternatives sorted');
  check(e.token === e.top_logprobs[0].token, 'greedy picks the most likely token');
}
const clp = await openai.completions.create({ model, prompt, max_tokens: 3, temperature: 0, logprobs: 2 });
check(clp.choices[0].logprobs.tokens.length === clp.choices[0].logprobs.top_logprobs.length, 'completion logprobs columns');

// Tools. A named choice constrains the answer to that call, so even random weights stream it
// (tests/server/node/tool_calls.mjs checks the calls themselves).
const tools = [{
  type: 'function',
  function: { name: 'get_weather', description: 'Weather for a city', parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] } },
}];
const weather = [{ role: 'user', content: 'What is the weather in Paris?' }];
const named = await collectChat(await openai.chat.completions.create({
  model, messages: weather, tools, tool_choice: { type: 'function', function: { name: 'get_weather' } }, max_tokens: 40, stream: true,
  chat_template_kwargs: { enable_thinking: false },
}));
const call = named.choices.get(0).calls[0];
check(call && call.name === 'get_weather' && call.id.startsWith('call_'), 'named tool choice streams that call');
check(['tool_calls', 'length'].includes(named.choices.get(0).finish), `named call finish ${named.choices.get(0).finish}`);
for (const tool_choice of ['auto', 'none', 'required']) {
  const r = await openai.chat.completions.create({ model, messages: weather, tools, tool_choice, max_tokens: 6 });
  check(['stop', 'length', 'tool_calls'].includes(r.choices[0].finish_reason), `tool_choice ${tool_choice} completes`);
  if (tool_choice === 'none') check(!r.choices[0].message.tool_calls, 'tool_choice none makes no calls');
}
const followUp = await openai.chat.completions.create({
  model, tools, max_tokens: 4,
  messages: [...weather,
    { role: 'assistant', content: null, tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: 'Sunny, 21 C' }],
});
check(followUp.choices.length === 1, 'a tool result turn is accepted');

// Thinking switched off through chat_template_kwargs is accepted (vLLM's extension field).
const noThink = await openai.chat.completions.create({ model, messages, max_tokens: 3, chat_template_kwargs: { enable_thinking: false } });
check(noThink.choices.length === 1, 'chat_template_kwargs accepted');

// Errors come back as the client's typed errors with the server's message.
try {
  await openai.chat.completions.create({ model: 'no-such-model', messages, max_tokens: 2 });
  check(false, 'an unknown model is refused');
} catch (e) {
  check(e.status === 404 && e.code === 'model_not_found', `unknown model: ${e.status} ${e.code}`);
}
try {
  await openai.chat.completions.create({ model, messages: [{ role: 'user', content: 5 }], max_tokens: 2 });
  check(false, 'a bad content is refused');
} catch (e) {
  check(e.status === 400 && /messages\[0\]\.content/.test(e.message), `bad content: ${e.status} ${e.message}`);
}
try {
  await openai.chat.completions.create({ model, messages, max_tokens: 10_000_000 });
  check(false, 'too many tokens is refused');
} catch (e) {
  check(e.status === 400 && /maximum context length/.test(e.message), `context length: ${e.status} ${e.message}`);
}
done('openai_client');
