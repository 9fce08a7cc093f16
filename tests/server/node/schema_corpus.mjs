// Every schema of the grammar corpus (tests/fixtures/grammar/schemas.json) sent as response_format
// json_schema over seeded runs, each finished output validated by ajv — a JSON Schema validator
// independent of the server's grammar — and regular expressions and choices checked with
// JavaScript's own RegExp and string equality. Run against a served model given as the first
// argument: the demo model (a trained Qwen3.5 hybrid with its own 8k vocabulary) and a random-weight
// Qwen3 with the real 152k-token Qwen3 tokenizer, whose multi-byte tokens cross JSON token
// boundaries everywhere. An output cut by max_tokens cannot be validated; it is counted, and most
// must finish.
import { readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath } from 'node:url';

import { check, client, done, importPackage } from './common.mjs';

const { default: Ajv2020 } = await importPackage('ajv/dist/2020.js');
const { default: Ajv07 } = await importPackage('ajv');
const { default: addFormats } = await importPackage('ajv-formats');

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const corpus = JSON.parse(readFileSync(join(root, 'tests', 'fixtures', 'grammar', 'schemas.json'), 'utf8'));
const openai = client();
const model = (await openai.models.list()).data[0].id;
const seeds = Number(process.env.QINFER_CORPUS_SEEDS ?? 2);  // choices (n) per schema
const every = Number(process.env.QINFER_CORPUS_EVERY ?? 1);  // every k-th schema

const maxTokens = 192;

// Draft 2020-12 for $defs and prefixItems; draft 7 where a schema uses the array form of items.
// ajv's strict mode is off: the corpus has OpenAPI's nullable and annotations ajv does not know.
function validator(schema) {
  const text = JSON.stringify(schema);
  const draft7 = /"items":\s*\[/.test(text) || /"additionalItems"/.test(text);
  const ajv = draft7 ? new Ajv07({ strict: false, allErrors: true }) : new Ajv2020({ strict: false, allErrors: true });
  addFormats(ajv);
  const copy = structuredClone(schema);
  delete copy.$schema;  // each class knows its own draft
  return ajv.compile(copy);
}
// Draft 4's boolean exclusiveMinimum / exclusiveMaximum: neither ajv class reads it, so such a
// schema is not validated here (the C++ corpus test covers it).
const draft4 = (schema) => /"exclusive(Minimum|Maximum)":\s*(true|false)/.test(JSON.stringify(schema));

// The prompt tells the model nothing about the schema: the grammar alone must make the output valid.
const base = { model, messages: [{ role: 'user', content: 'Answer in JSON.' }], temperature: 1, max_tokens: maxTokens,
  chat_template_kwargs: { enable_thinking: false } };

// A connection the server closed without an answer is sent again (and counted): the HTTP front end's
// connection handling under load is tested elsewhere; here the grammar is.
let resent = 0;
async function create(body) {
  for (let attempt = 0; ; ++attempt) {
    try {
      return await openai.chat.completions.create(body);
    } catch (e) {
      if (attempt >= 2 || e?.constructor?.name !== 'APIConnectionError') throw e;
      resent += 1;
    }
  }
}

const started = Date.now();
let validated = 0, cut = 0, skipped = 0;
const failures = [];
const jobs = [];
for (const [index, entry] of corpus.entries()) {
  if (index % every !== 0) continue;
  if (draft4(entry.schema) || entry.options?.any_whitespace) {
    skipped += 1;  // any_whitespace is not an API option
    continue;
  }
  const validate = validator(entry.schema);
  const strict = entry.options?.strict ?? false;
  const response_format = { type: 'json_schema', json_schema: { name: 'corpus', schema: entry.schema, strict } };
  jobs.push(async () => {
    const r = await create({ ...base, response_format, n: seeds, seed: index });
    for (const c of r.choices) {
      if (c.finish_reason === 'length') {
        cut += 1;
        continue;
      }
      check(c.finish_reason === 'stop', `${entry.name}: finish ${c.finish_reason}`);
      let value;
      try {
        value = JSON.parse(c.message.content);
      } catch {
        failures.push(`${entry.name}: not JSON: ${JSON.stringify(c.message.content)}`);
        continue;
      }
      if (!validate(value)) failures.push(`${entry.name}: ${c.message.content} fails: ${JSON.stringify(validate.errors)}`);
      else validated += 1;
    }
  });
}
// 64 requests in flight (the server runs 64 sequences at once), as a connection pool would send them.
await Promise.all(Array.from({ length: 64 }, async () => {
  while (jobs.length) await jobs.shift()();
}));
for (const f of failures.slice(0, 20)) console.log(`invalid: ${f}`);
check(failures.length === 0, `${failures.length} outputs do not validate against their schema`);
const total = validated + cut;
check(validated >= 0.6 * total, `most outputs finish within ${maxTokens} tokens (${validated} of ${total})`);
console.log(`json_schema corpus on ${model}: ${validated} outputs validated by ajv, ${cut} cut by max_tokens, ` +
  `${skipped} schemas not checkable here, over ${Math.ceil(corpus.length / every) - skipped} schemas x ${seeds} seeds (${resent} requests resent after a closed connection), in ${((Date.now() - started) / 1000).toFixed(1)} s`);

// Regular expressions (matched whole by RegExp) and choices.
const regexes = ['[a-z]{3,8}', '\\d{3}-\\d{4}', '(yes|no|maybe)', '[A-Z][a-z]+ [A-Z][a-z]+', '0x[0-9a-f]{2,6}',
  '(\\+|-)?[0-9]+(\\.[0-9]{1,3})?', '[^\\s]{1,12}', '\\w+@\\w+\\.(com|org)', '(ab|cd)*ef', '[\\u00e0-\\u00ff]{2,4}'];
let regexOutputs = 0;
for (const [i, pattern] of regexes.entries()) {
  const re = new RegExp(`^(?:${pattern})$`, 'u');
  const r = await create({ ...base, guided_regex: pattern, n: seeds, seed: i, max_tokens: 64 });
  for (const c of r.choices) {
    if (c.finish_reason === 'length') continue;
    check(re.test(c.message.content), `guided_regex ${pattern}: ${JSON.stringify(c.message.content)} does not match`);
    regexOutputs += 1;
  }
}
check(regexOutputs >= regexes.length * seeds / 2, `regex outputs finish (${regexOutputs})`);
const choices = ['red', 'green', 'blue', 'dark blue', 'naïve', '日本', '{"json": true}'];
for (const seed of [1, 2, 3, 4]) {
  const r = await create({ ...base, guided_choice: choices, n: seeds, seed });
  for (const c of r.choices) check(choices.includes(c.message.content), `guided_choice: ${JSON.stringify(c.message.content)}`);
}
console.log(`regex: ${regexOutputs} outputs matched by RegExp over ${regexes.length} patterns; choice: ${4 * seeds} outputs`);

done(`schema corpus on ${model}`);
