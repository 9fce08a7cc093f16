// OpenAI's Responses API through the clients that default to it: the openai client's
// responses.create / responses.stream (plain, streamed, a function tool, previous_response_id,
// retrieve and delete, store false), the AI SDK's default openai('…') model (generateText,
// streamText) and @openai/agents with its default transport (an agent run, and one that calls a
// tool). Against a tiny random-weight model: the checks are about the protocol, and tool calls are
// valid because the grammar makes them so.
import { baseURL, check, client, done, importPackage } from './common.mjs';

const { createOpenAI } = await importPackage('@ai-sdk/openai');
const { generateText, streamText } = await importPackage('ai');
const agents = await importPackage('@openai/agents');
const { z } = await importPackage('zod');

const openai = client();
const model = (await openai.models.list()).data[0].id;
const noReasoning = { reasoning: { effort: 'none' } };

// Plain.
const plain = await openai.responses.create({ model, input: 'Hello there', max_output_tokens: 12, ...noReasoning });
check(plain.object === 'response' && plain.id.startsWith('resp_'), JSON.stringify(plain).slice(0, 300));
check(['completed', 'incomplete'].includes(plain.status), `status ${plain.status}`);
check(plain.status !== 'incomplete' || plain.incomplete_details?.reason === 'max_output_tokens', JSON.stringify(plain.incomplete_details));
check(plain.output.some((o) => o.type === 'message' && o.content[0].type === 'output_text'), JSON.stringify(plain.output));
check(typeof plain.output_text === 'string', 'output_text');
check(plain.usage.input_tokens > 0 && plain.usage.output_tokens > 0 && plain.usage.output_tokens <= 12, JSON.stringify(plain.usage));
check(plain.max_output_tokens === 12 && plain.store === true, 'settings echoed');

// Streamed: events in order, numbered, assembled by the client into the same kind of response.
const stream = openai.responses.stream({ model, input: [{ role: 'user', content: 'Hello' }], instructions: 'Be brief.', max_output_tokens: 16, ...noReasoning });
const types = [];
let deltas = '';
let sequence = -1;
for await (const e of stream) {
  types.push(e.type);
  check(e.sequence_number === sequence + 1, `sequence ${e.sequence_number} after ${sequence}`);
  sequence = e.sequence_number;
  if (e.type === 'response.output_text.delta') deltas += e.delta;
}
const streamed = await stream.finalResponse();
check(types[0] === 'response.created' && types[1] === 'response.in_progress', types.slice(0, 3).join());
check(['response.completed', 'response.incomplete'].includes(types.at(-1)), types.at(-1));
check(types.includes('response.output_item.added') && types.includes('response.output_item.done'), types.join());
check(streamed.output_text === deltas, `output_text ${JSON.stringify(streamed.output_text)} vs ${JSON.stringify(deltas)}`);
check(streamed.instructions === 'Be brief.', 'instructions echoed');

// A function tool, then its output sent back through previous_response_id.
const weather = {
  type: 'function',
  name: 'get_weather',
  description: 'Weather for a city',
  parameters: {
    type: 'object',
    properties: { city: { type: 'string', enum: ['Paris', 'Oslo'] }, days: { type: 'integer', minimum: 1, maximum: 5 } },
    required: ['city', 'days'],
    additionalProperties: false,
  },
  strict: true,
};
function checkCall(call) {
  check(call.type === 'function_call' && call.name === 'get_weather' && call.call_id, JSON.stringify(call));
  const args = JSON.parse(call.arguments);
  check(['Paris', 'Oslo'].includes(args.city) && Number.isInteger(args.days) && args.days >= 1 && args.days <= 5, call.arguments);
}
for (const streamIt of [false, true]) {
  const request = { model, input: 'Weather in Paris?', tools: [weather], tool_choice: 'required', parallel_tool_calls: false, max_output_tokens: 400, ...noReasoning };
  const r = streamIt ? await openai.responses.stream(request).finalResponse() : await openai.responses.create(request);
  const calls = r.output.filter((o) => o.type === 'function_call');
  check(calls.length === 1, `one call (stream ${streamIt}): ${JSON.stringify(r.output)}`);
  checkCall(calls[0]);
  const next = await openai.responses.create({
    model, previous_response_id: r.id, tools: [weather], max_output_tokens: 8, ...noReasoning,
    input: [{ type: 'function_call_output', call_id: calls[0].call_id, output: 'Sunny, 21 C' }],
  });
  check(next.previous_response_id === r.id, 'previous_response_id echoed');
  check(next.usage.input_tokens > r.usage.input_tokens, `the conversation carried over: ${next.usage.input_tokens} vs ${r.usage.input_tokens}`);
}

// Stored responses can be read back and deleted; store false keeps nothing.
const kept = await openai.responses.retrieve(plain.id);
check(kept.id === plain.id && kept.output_text === plain.output_text, 'retrieve');
const deleted = await openai.responses.delete(plain.id);
check(deleted === undefined || deleted === null || deleted.deleted === true || typeof deleted === 'object', 'delete');
async function expectError(call, status, says) {
  try {
    await call();
    check(false, 'accepted');
  } catch (e) {
    check(e.status === status, `status ${e.status}: ${e.message}`);
    check(e.message.includes(says), `${e.message} lacks ${says}`);
  }
}
await expectError(() => openai.responses.retrieve(plain.id), 404, 'not found');
const unstored = await openai.responses.create({ model, input: 'x', max_output_tokens: 2, store: false, ...noReasoning });
await expectError(() => openai.responses.create({ model, input: 'y', previous_response_id: unstored.id }), 404, 'not found');
await expectError(() => openai.responses.create({ model, input: 'y', tools: [{ type: 'web_search' }] }), 400, 'tools[0].type');
await expectError(() => openai.responses.create({ model, input: 'y', reasoning: { effort: 'medium' } }), 400, 'reasoning.effort');

// The AI SDK's default model for a provider is the Responses API.
const provider = createOpenAI({ baseURL, apiKey: 'unused' });
const generated = await generateText({ model: provider(model), prompt: 'Hello', maxOutputTokens: 12, providerOptions: { openai: { reasoningEffort: 'minimal' } } });
check(typeof generated.text === 'string' && generated.usage.outputTokens > 0, JSON.stringify(generated.usage));
const textStream = streamText({ model: provider(model), prompt: 'Hello', maxOutputTokens: 12, providerOptions: { openai: { reasoningEffort: 'minimal' } } });
let aiText = '';
for await (const piece of textStream.textStream) aiText += piece;
check(aiText === (await textStream.text), 'streamText text');
check((await textStream.usage).outputTokens > 0, 'streamText usage');

// @openai/agents with its default transport (Responses), an agent that answers and one that calls a tool.
agents.setDefaultOpenAIClient(client());
agents.setTracingDisabled(true);
const plainAgent = new agents.Agent({ name: 'greeter', instructions: 'Be brief.', model, modelSettings: { maxTokens: 12, reasoning: { effort: 'none' } } });
const answered = await agents.run(plainAgent, 'Hello');
check(typeof answered.finalOutput === 'string', `finalOutput ${JSON.stringify(answered.finalOutput)}`);
let toolRuns = 0;
const getWeather = agents.tool({
  name: 'get_weather',
  description: 'Weather for a city',
  parameters: z.object({ city: z.enum(['Paris', 'Oslo']) }),
  execute: async ({ city }) => {
    toolRuns += 1;
    check(['Paris', 'Oslo'].includes(city), `city ${city}`);
    return `Sunny in ${city}`;
  },
});
const toolAgent = new agents.Agent({
  name: 'weather', instructions: 'Use the tool.', model, tools: [getWeather],
  modelSettings: { maxTokens: 400, toolChoice: 'required', parallelToolCalls: false, reasoning: { effort: 'none' } },
});
const withTool = await agents.run(toolAgent, 'Weather in Paris?', { maxTurns: 4 });
check(toolRuns >= 1, `the tool ran ${toolRuns} times`);
check(typeof withTool.finalOutput === 'string', `finalOutput ${JSON.stringify(withTool.finalOutput)}`);

done('responses_client');
