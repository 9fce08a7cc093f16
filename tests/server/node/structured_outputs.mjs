// Structured outputs through the real `openai` npm client against a tiny random-weight model: a
// random model writes whatever its mask allows, so every output checks the grammar, not the model.
// json_schema (n > 1, streamed and not), json_object, vLLM's guided_regex / guided_choice /
// guided_grammar / structured_outputs, completions, and the refusals.
import { check, client, collectChat, done } from './common.mjs';

const openai = client();
const model = (await openai.models.list()).data[0].id;
// enable_thinking false: the template closes the reasoning block, so the answer starts at once.
const base = { model, messages: [{ role: 'user', content: 'Describe a person as JSON.' }], chat_template_kwargs: { enable_thinking: false } };

// An independent check of the schema below (not the server's grammar): types, bounds, enums, keys.
const person = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 8 },
    age: { type: 'integer', minimum: 0, maximum: 150 },
    role: { enum: ['admin', 'user', null] },
    tags: { type: 'array', items: { type: 'string', enum: ['a', 'bb', 'ccc'] }, maxItems: 3 },
    address: {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 6 }, zip: { type: 'string', pattern: '^[0-9]{5}$' } },
      required: ['zip'],
      additionalProperties: false,
    },
  },
  required: ['name', 'age', 'role'],
  additionalProperties: false,
};
function validPerson(text) {
  let v;
  try {
    v = JSON.parse(text);
  } catch {
    return `not JSON: ${JSON.stringify(text)}`;
  }
  const keys = Object.keys(v);
  if (!keys.every((k) => ['name', 'age', 'role', 'tags', 'address'].includes(k))) return `extra key in ${text}`;
  if (typeof v.name !== 'string' || [...v.name].length < 1 || [...v.name].length > 8) return `name in ${text}`;
  if (!Number.isInteger(v.age) || v.age < 0 || v.age > 150) return `age in ${text}`;
  if (!['admin', 'user', null].includes(v.role)) return `role in ${text}`;
  if ('tags' in v && (!Array.isArray(v.tags) || v.tags.length > 3 || !v.tags.every((t) => ['a', 'bb', 'ccc'].includes(t))))
    return `tags in ${text}`;
  if ('address' in v) {
    const a = v.address;
    if (typeof a !== 'object' || a === null || !/^[0-9]{5}$/.test(a.zip)) return `address.zip in ${text}`;
    if (!Object.keys(a).every((k) => k === 'city' || k === 'zip')) return `address key in ${text}`;
    if ('city' in a && (typeof a.city !== 'string' || [...a.city].length > 6)) return `address.city in ${text}`;
  }
  return null;
}

// Not streamed, four choices (forks share the prompt; each has its own grammar state).
const response_format = { type: 'json_schema', json_schema: { name: 'person', schema: person, strict: true } };
for (const seed of [1, 2, 3]) {
  const r = await openai.chat.completions.create({ ...base, response_format, n: 4, temperature: 1, seed, max_tokens: 400 });
  check(r.choices.length === 4, 'four choices');
  if (seed === 1) console.log(`json_schema sample: ${r.choices[0].message.content}`);
  for (const c of r.choices) {
    check(c.finish_reason === 'stop', `a bounded schema completes within max_tokens (finish ${c.finish_reason})`);
    const why = validPerson(c.message.content);
    check(why === null, `json_schema output validates: ${why}`);
  }
}

// Streamed: the deltas join into a valid document.
const streamed = await collectChat(
  await openai.chat.completions.create({ ...base, response_format, temperature: 1, seed: 8, max_tokens: 400, stream: true }),
);
const s0 = streamed.choices.get(0);
check(s0.finish === 'stop', 'streamed finish stop');
check(validPerson(s0.content) === null, `streamed output validates: ${validPerson(s0.content)}`);

// JSON mode: whatever object the model starts, the text is always a prefix of JSON; when it stops, JSON.
let parsed = 0;
for (const seed of [4, 5, 6, 7]) {
  const r = await openai.chat.completions.create({ ...base, response_format: { type: 'json_object' }, temperature: 1, seed, max_tokens: 200 });
  const c = r.choices[0];
  check(c.message.content.startsWith('{'), `json_object starts an object: ${JSON.stringify(c.message.content)}`);
  if (c.finish_reason === 'stop') {
    const v = JSON.parse(c.message.content);
    check(typeof v === 'object' && v !== null && !Array.isArray(v), 'json_object gives an object');
    parsed += 1;
  }
}

// vLLM's extras (extra body fields the openai client passes through).
for (const seed of [1, 2, 3]) {
  const r = await openai.chat.completions.create({ ...base, guided_regex: '[0-9]{3}-[0-9]{4}', temperature: 1, seed, max_tokens: 50 });
  check(/^[0-9]{3}-[0-9]{4}$/.test(r.choices[0].message.content), `guided_regex: ${r.choices[0].message.content}`);
  check(r.choices[0].finish_reason === 'stop', 'a complete regex match stops');
}
const choices = ['positive', 'negative', 'neutral'];
for (const seed of [1, 2, 3, 4]) {
  const r = await openai.chat.completions.create({ ...base, guided_choice: choices, temperature: 1, seed, max_tokens: 20 });
  check(choices.includes(r.choices[0].message.content), `guided_choice: ${r.choices[0].message.content}`);
}
const gbnf = 'root ::= "(" item ("," item){0,3} ")"\nitem ::= [a-c] [0-9]?';
const g = await openai.chat.completions.create({ ...base, guided_grammar: gbnf, temperature: 1, seed: 3, max_tokens: 40 });
check(/^\([a-c][0-9]?(,[a-c][0-9]?){0,3}\)$/.test(g.choices[0].message.content), `guided_grammar: ${g.choices[0].message.content}`);
const so = await openai.chat.completions.create({ ...base, structured_outputs: { choice: ['yes', 'no'] }, temperature: 1, seed: 2, max_tokens: 5 });
check(['yes', 'no'].includes(so.choices[0].message.content), `structured_outputs.choice: ${so.choices[0].message.content}`);

// Completions take the same constraints.
const comp = await openai.completions.create({ model, prompt: 'The year is', guided_regex: ' (19|20)[0-9]{2}', temperature: 1, seed: 4, max_tokens: 10 });
check(/^ (19|20)[0-9]{2}$/.test(comp.choices[0].text), `completion guided_regex: ${comp.choices[0].text}`);

// Refusals name the field and say what is wrong.
async function refused(body, param, fragment) {
  try {
    await openai.chat.completions.create({ ...base, max_tokens: 5, ...body });
    check(false, `${param} should be refused`);
  } catch (e) {
    check(e.status === 400, `${param}: 400, got ${e.status}`);
    check(e.param === param, `param ${e.param} is ${param}`);
    check(String(e.message).includes(fragment), `${param} message ${e.message} mentions ${fragment}`);
  }
}
await refused({ response_format: { type: 'json_schema', json_schema: { name: 'x', schema: { type: 'array', uniqueItems: true } } } },
  'response_format.json_schema.schema', 'uniqueItems');
await refused({ response_format: { type: 'json_schema', json_schema: { name: 'x' } } }, 'response_format.json_schema.schema', 'required');
await refused({ response_format: { type: 'yaml' } }, 'response_format.type', 'yaml');
await refused({ guided_regex: '(a)\\1' }, 'guided_regex', 'backreference');
await refused({ guided_grammar: 'root ::= missing' }, 'guided_grammar', 'missing');
await refused({ guided_choice: ['a'], guided_regex: 'a' }, 'guided_choice', 'only one');
await refused({ guided_whitespace_pattern: ' *' }, 'guided_whitespace_pattern', 'not supported');

done(`structured outputs (${parsed} of 4 json_object runs completed)`);
