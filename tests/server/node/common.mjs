// Shared by the node tests: the real `openai` npm client (installed by scripts/fetch-test-data.sh
// into .deps/node), pointed at the server URL given as the first argument.
import { existsSync, readFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..', '..', '..');
const nodeModules = join(root, '.deps', 'node', 'node_modules');
const entry = join(nodeModules, 'openai', 'index.mjs');
if (!existsSync(entry)) {
  console.error(`the openai npm package is missing (${entry}): run scripts/fetch-test-data.sh`);
  process.exit(3);
}
const { default: OpenAI } = await import(pathToFileURL(entry).href);

// Imports another package installed there ('ai', '@langchain/openai', 'openai/helpers/zod'): the test
// scripts live outside .deps/node, so bare specifiers do not resolve from them. Follows the package's
// "exports" with the conditions node's ESM loader uses (node, import, default), so that a package
// imported here and the same package imported by another one (zod by ai) are one module instance.
export async function importPackage(specifier) {
  const [, name, rest] = /^((?:@[^/]+\/)?[^/]+)(\/.*)?$/.exec(specifier);
  const dir = join(nodeModules, name);
  if (!existsSync(join(dir, 'package.json'))) {
    console.error(`the ${name} npm package is missing (${dir}): run scripts/fetch-test-data.sh`);
    process.exit(3);
  }
  const manifest = JSON.parse(readFileSync(join(dir, 'package.json'), 'utf8'));
  const subpath = '.' + (rest ?? '');
  let target = null;
  if (manifest.exports !== undefined) {
    const exports_ =
      typeof manifest.exports === 'object' && !Array.isArray(manifest.exports) && Object.keys(manifest.exports).some((k) => k.startsWith('.'))
        ? manifest.exports
        : { '.': manifest.exports };
    const pick = (t) => {
      if (typeof t === 'string') return t;
      if (Array.isArray(t)) return t.map(pick).find((x) => x) ?? null;
      if (t && typeof t === 'object')
        for (const [condition, value] of Object.entries(t))
          if (['node', 'import', 'default'].includes(condition)) {
            const found = pick(value);
            if (found) return found;
          }
      return null;
    };
    if (subpath in exports_) {
      target = pick(exports_[subpath]);
    } else {
      for (const [key, value] of Object.entries(exports_)) {
        const star = key.indexOf('*');
        if (star < 0) continue;
        const [before, after] = [key.slice(0, star), key.slice(star + 1)];
        if (subpath.startsWith(before) && subpath.endsWith(after) && subpath.length >= key.length - 1) {
          const found = pick(value);
          if (found) target = found.replace('*', subpath.slice(before.length, subpath.length - after.length));
          if (target) break;
        }
      }
    }
  } else {
    target = rest ? subpath : (manifest.module ?? manifest.main ?? 'index.js');
  }
  if (!target) throw new Error(`${specifier}: ${name}'s package.json exports no ESM entry for ${subpath}`);
  return import(pathToFileURL(join(dir, target)).href);
}

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
