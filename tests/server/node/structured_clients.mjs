// Structured outputs through the client libraries applications use, against a tiny random-weight
// model: the Vercel AI SDK (generateObject / streamObject, on the OpenAI-compatible provider and on
// the OpenAI provider's chat model), LangChain's ChatOpenAI.withStructuredOutput (jsonSchema and
// jsonMode) and the openai client's chat.completions.parse / stream with zodResponseFormat. A random
// model writes whatever the grammar mask allows, so an object that validates shows the library sent
// a schema the server compiled and followed (each request body is recorded and checked too), not
// that the model understood anything. Schemas are bounded (maxLength, maxItems, enums, integer
// ranges) so that every output completes well within max_tokens.
import { baseURL, check, client, done, importPackage } from './common.mjs';

const { generateObject, streamObject } = await importPackage('ai');
const { createOpenAICompatible } = await importPackage('@ai-sdk/openai-compatible');
const { createOpenAI } = await importPackage('@ai-sdk/openai');
const { ChatOpenAI } = await importPackage('@langchain/openai');
const { z } = await importPackage('zod');
const { zodResponseFormat } = await importPackage('openai/helpers/zod');

const openai = client();
const model = (await openai.models.list()).data[0].id;
// Qwen3's template leaves the reasoning block to the model unless enable_thinking is false, and a
// random model would write a free-text <think> block first that rarely closes within max_tokens.
const noThinking = { chat_template_kwargs: { enable_thinking: false } };
const prompt = 'Describe a person as JSON.';

// A bounded string, an enum, an integer range, an optional bounded array of bounded strings.
const Person = z.object({
  name: z.string().min(1).max(8),
  role: z.enum(['admin', 'user', 'guest']),
  age: z.number().int().min(0).max(150),
  tags: z.array(z.string().max(4)).max(3).optional(),
});
// OpenAI strict mode (the openai client's zodResponseFormat refuses .optional() without .nullable():
// every property is required there), so the array is nullable instead of optional.
const StrictPerson = Person.extend({ tags: z.array(z.string().max(4)).max(3).nullable() });

function validates(schema, value, what) {
  const r = schema.safeParse(value);
  check(r.success, `${what} validates: ${JSON.stringify(value)} ${r.success ? '' : JSON.stringify(r.error.issues)}`);
}

// A fetch that records each request body (and can add fields to it, for clients with no way to).
function recordingFetch(extra = {}) {
  const bodies = [];
  const f = async (url, init) => {
    if (init?.body && typeof init.body === 'string') {
      const body = { ...JSON.parse(init.body), ...extra };
      bodies.push(body);
      init = { ...init, body: JSON.stringify(body) };
    }
    return fetch(url, init);
  };
  return { fetch: f, bodies, last: () => bodies.at(-1) };
}
function sentJsonSchema(body, what) {
  check(body?.response_format?.type === 'json_schema', `${what} sends response_format json_schema: ${JSON.stringify(body?.response_format)}`);
  check(typeof body.response_format.json_schema?.schema === 'object', `${what} sends the schema`);
  check(body.chat_template_kwargs?.enable_thinking === false, `${what} sends chat_template_kwargs`);
}

// (a) AI SDK generateObject, OpenAI-compatible provider (the provider for self-hosted servers):
// supportsStructuredOutputs makes it send response_format json_schema (without it: json_object and
// the schema only in the prompt); unknown providerOptions keys go into the body as they are.
const compatRecorder = recordingFetch();
const compat = createOpenAICompatible({
  name: 'qinfer',
  baseURL,
  apiKey: 'unused',
  supportsStructuredOutputs: true,
  includeUsage: true,
  fetch: compatRecorder.fetch,
});
const aiOptions = { temperature: 1, maxOutputTokens: 300, maxRetries: 0, providerOptions: { qinfer: noThinking } };
for (const seed of [1, 2, 3]) {
  const r = await generateObject({ model: compat.chatModel(model), schema: Person, schemaName: 'person', prompt, seed, ...aiOptions });
  if (seed === 1) console.log(`ai generateObject sample: ${JSON.stringify(r.object)}`);
  validates(Person, r.object, `generateObject seed ${seed}`);
  check(r.finishReason === 'stop', `generateObject finish ${r.finishReason}`);
  check(r.usage.outputTokens > 0, 'generateObject usage');
  const body = compatRecorder.last();
  sentJsonSchema(body, 'generateObject');
  check(body.seed === seed && body.temperature === 1 && body.max_tokens === 300, `generateObject sampling fields: ${JSON.stringify(body)}`);
}
console.log('ai generateObject (openai-compatible provider): 3 seeds validate');

// The OpenAI provider's chat model against a base URL (its default openai('m') model speaks the
// Responses API, which this server does not serve). It has no way to add a body field, so the
// recording fetch adds chat_template_kwargs.
const oaiRecorder = recordingFetch(noThinking);
const aiOpenAI = createOpenAI({ baseURL, apiKey: 'unused', fetch: oaiRecorder.fetch });
{
  const r = await generateObject({ model: aiOpenAI.chat(model), schema: Person, schemaName: 'person', prompt, seed: 4, ...aiOptions });
  validates(Person, r.object, 'generateObject on @ai-sdk/openai .chat');
  sentJsonSchema(oaiRecorder.last(), '@ai-sdk/openai .chat');
  check(oaiRecorder.last().response_format.json_schema.strict === true, '@ai-sdk/openai sends strict');
}
console.log('ai generateObject (openai provider, chat model): validates');

// (b) AI SDK streamObject: the partial objects grow into the final one, which validates.
for (const [name, chatModel, recorder] of [
  ['openai-compatible', compat.chatModel(model), compatRecorder],
  ['openai .chat', aiOpenAI.chat(model), oaiRecorder],
]) {
  const errors = [];
  const s = streamObject({ model: chatModel, schema: Person, schemaName: 'person', prompt, seed: 5, ...aiOptions, onError: ({ error }) => errors.push(error) });
  const partials = [];
  for await (const p of s.partialObjectStream) partials.push(p);
  const object = await s.object;
  check(errors.length === 0, `streamObject (${name}) errors: ${errors.map(String).join('; ')}`);
  validates(Person, object, `streamObject (${name})`);
  check(partials.length >= 2, `streamObject (${name}) streams partial objects (${partials.length})`);
  check(JSON.stringify(partials.at(-1)) === JSON.stringify(object), `streamObject (${name}) ends at the final object`);
  for (const p of partials)
    check(Object.keys(p).every((k) => ['name', 'role', 'age', 'tags'].includes(k)), `partial keys ${JSON.stringify(p)}`);
  check((await s.usage).outputTokens > 0, `streamObject (${name}) usage`);
  const body = recorder.last();
  sentJsonSchema(body, `streamObject (${name})`);
  check(body.stream === true, `streamObject (${name}) streams`);
  console.log(`ai streamObject (${name}): ${partials.length} partial objects, final validates: ${JSON.stringify(object)}`);
}

// (c) LangChain ChatOpenAI.withStructuredOutput. modelKwargs go into every request body as they are.
const lcRecorder = recordingFetch();
const llm = new ChatOpenAI({
  model,
  apiKey: 'unused',
  configuration: { baseURL, fetch: lcRecorder.fetch },
  temperature: 1,
  maxTokens: 300,
  maxRetries: 0,
  modelKwargs: noThinking,
});
const messages = [
  ['system', 'You answer in JSON.'],
  ['user', prompt],
];
// jsonSchema: response_format json_schema (strict, from the zod schema), the content parsed and
// validated by LangChain (it throws when the content does not validate).
for (const seed of [1, 2]) {
  const r = await llm.withStructuredOutput(StrictPerson, { method: 'jsonSchema', name: 'person', includeRaw: true }).invoke(messages, { seed });
  validates(StrictPerson, r.parsed, `LangChain jsonSchema seed ${seed}`);
  check(r.raw.response_metadata?.finish_reason === 'stop', `LangChain jsonSchema finish ${r.raw.response_metadata?.finish_reason}`);
  sentJsonSchema(lcRecorder.last(), 'LangChain jsonSchema');
  check(lcRecorder.last().seed === seed, 'LangChain sends the seed');
}
{
  // Without includeRaw: what an application gets is the object itself.
  const parsed = await llm.withStructuredOutput(StrictPerson, { method: 'jsonSchema', name: 'person' }).invoke(messages, { seed: 3 });
  validates(StrictPerson, parsed, 'LangChain jsonSchema without includeRaw');
}
console.log('LangChain withStructuredOutput jsonSchema: 3 calls validate');
// jsonMode: response_format json_object, so only "a JSON object" is promised; the schema given is
// every object. Any JSON object has no length bound, and a random model at times keeps writing one
// until max_tokens: then LangChain cannot parse the cut text. So a call must either return an object
// (finish "stop") or end with finish "length" and no parse; at least one of the seeds must complete.
// A random model's strings hold any text the grammar allows, "<think>" too: with enable_thinking
// false that is answer text, and it must stay in the content (seed 4 writes one inside a key).
const jsonModeLlm = new ChatOpenAI({
  model,
  apiKey: 'unused',
  configuration: { baseURL, fetch: lcRecorder.fetch },
  temperature: 1,
  maxTokens: 800,
  maxRetries: 0,
  modelKwargs: noThinking,
});
let jsonModeCompleted = 0;
const jsonModeSeeds = [1, 2, 3, 4, 5, 6];
for (const seed of jsonModeSeeds) {
  const r = await jsonModeLlm
    .withStructuredOutput(z.record(z.string(), z.unknown()), { method: 'jsonMode', includeRaw: true })
    .invoke(messages, { seed });
  const body = lcRecorder.last();
  check(body.response_format?.type === 'json_object', `LangChain jsonMode sends json_object: ${JSON.stringify(body.response_format)}`);
  const finish = r.raw.response_metadata?.finish_reason;
  const content = String(r.raw.content);
  const reasoning = r.raw.additional_kwargs?.reasoning_content;
  check(!reasoning, `LangChain jsonMode seed ${seed}: with enable_thinking false the server split "reasoning" out of the ` +
    `answer (a <think> inside a JSON string?): content ${JSON.stringify(content.slice(-40))}, reasoning_content ` +
    `${JSON.stringify(String(reasoning).slice(0, 40))}`);
  check(content.trimStart().startsWith('{'), `LangChain jsonMode content starts an object: ${JSON.stringify(content.slice(0, 80))}`);
  if (finish === 'stop') {
    check(r.parsed !== null && typeof r.parsed === 'object' && !Array.isArray(r.parsed), `LangChain jsonMode seed ${seed} parsed an object: ${content}`);
    jsonModeCompleted += 1;
  } else {
    check(finish === 'length', `LangChain jsonMode ends with stop or length, got ${finish}`);
    check(r.parsed === null, 'a cut JSON object does not parse');
  }
}
check(jsonModeCompleted >= 1, `at least one LangChain jsonMode call completes (${jsonModeCompleted} of ${jsonModeSeeds.length})`);
console.log(`LangChain withStructuredOutput jsonMode: ${jsonModeCompleted} of ${jsonModeSeeds.length} completed as objects, the rest hit max_tokens`);

// (d) The openai client's parse helpers with zodResponseFormat: message.parsed is the validated object.
for (const seed of [1, 2, 3]) {
  const r = await openai.chat.completions.parse({
    model,
    messages: [{ role: 'user', content: prompt }],
    response_format: zodResponseFormat(StrictPerson, 'person'),
    temperature: 1,
    seed,
    max_tokens: 300,
    ...noThinking,
  });
  const m = r.choices[0].message;
  check(r.choices[0].finish_reason === 'stop', `parse finish ${r.choices[0].finish_reason}`);
  check(!m.refusal, 'no refusal');
  validates(StrictPerson, m.parsed, `openai parse seed ${seed}`);
  check(JSON.stringify(JSON.parse(m.content)) === JSON.stringify(m.parsed), 'parsed is the content');
}
{
  const stream = openai.chat.completions.stream({
    model,
    messages: [{ role: 'user', content: prompt }],
    response_format: zodResponseFormat(StrictPerson, 'person'),
    temperature: 1,
    seed: 9,
    max_tokens: 300,
    ...noThinking,
  });
  let deltas = 0;
  stream.on('content.delta', () => (deltas += 1));
  const final = await stream.finalChatCompletion();
  check(deltas >= 2, `openai stream content deltas (${deltas})`);
  validates(StrictPerson, final.choices[0].message.parsed, 'openai stream finalChatCompletion parsed');
}
console.log('openai chat.completions.parse / stream with zodResponseFormat: 4 calls validate');

done('structured-output client libraries');
