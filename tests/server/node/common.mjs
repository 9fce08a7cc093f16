// Shared by the node tests: the real `openai` npm client (installed by scripts/fetch-test-data.sh
// into .deps/node), pointed at the server URL given as the first argument.
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const entry = join(root, '.deps', 'node', 'node_modules', 'openai', 'index.mjs');
if (!existsSync(entry)) {
  console.error(`the openai npm package is missing (${entry}): run scripts/fetch-test-data.sh`);
  process.exit(3);
}
const { default: OpenAI } = await import(pathToFileURL(entry).href);

export const baseURL = process.argv[2];
if (!baseURL) {
  console.error('usage: node <test>.mjs http://127.0.0.1:PORT/v1');
  process.exit(2);
}

export function client() {
  return new OpenAI({ baseURL, apiKey: process.env.QINFER_API_KEY ?? 'unused', maxRetries: 0, timeout: 60_000 });
}

let checks = 0;
export function check(condition, message) {
  checks += 1;
  if (!condition) throw new Error(`check failed: ${message}`);
}
export function done(name) {
  console.log(`${name}: ${checks} checks passed`);
}

// GET on the server root (health, metrics), outside /v1.
export async function getRoot(path) {
  const response = await fetch(baseURL.replace(/\/v1\/?$/, '') + path);
  return response;
}

// Collects a chat stream the way an application would.
export async function collectChat(stream) {
  const choices = new Map();
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks += 1;
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      if (!choices.has(c.index)) choices.set(c.index, { role: null, content: '', reasoning: '', calls: [], finish: null });
      const a = choices.get(c.index);
      if (c.delta.role) a.role = c.delta.role;
      a.content += c.delta.content ?? '';
      a.reasoning += c.delta.reasoning_content ?? '';
      for (const t of c.delta.tool_calls ?? []) {
        if (t.id) a.calls[t.index] = { id: t.id, name: t.function.name, arguments: '' };
        a.calls[t.index].arguments += t.function.arguments ?? '';
      }
      if (c.finish_reason) a.finish = c.finish_reason;
    }
  }
  return { choices, usage, chunks };
}
