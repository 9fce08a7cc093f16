#!/usr/bin/env node
// Load generator for `qinfer serve` (or any OpenAI-compatible server): at each concurrency level it
// keeps that many streaming requests in flight and reports output tok/s, time to first token and
// inter-token latency percentiles. Plain fetch + SSE parsing, no dependencies (node >= 18).
//
//   node tools/loadgen.mjs --url http://127.0.0.1:8000/v1 --concurrency 1,16,64,256 --max-tokens 128
//
// Options: --url (default http://127.0.0.1:8000/v1), --model (default: the first of /v1/models),
// --concurrency (list, default 1,16,64,256), --requests (per level, default max(8, 2 x concurrency)),
// --max-tokens (default 128), --prompt-words (default 64), --endpoint chat|completions (default chat),
// --api-key (default $QINFER_API_KEY), --temperature (default 1), --ignore-eos true|false (default
// true: every request generates max_tokens, vLLM's extension field), --json (one JSON object per level).
// TTFT and ITL are measured where the events arrive; TPOT is each request's (last - first token
// time) / (tokens - 1), which does not depend on how the network batches events.
import { parseArgs } from 'node:util';

const { values: opts } = parseArgs({
  options: {
    url: { type: 'string', default: 'http://127.0.0.1:8000/v1' },
    model: { type: 'string' },
    concurrency: { type: 'string', default: '1,16,64,256' },
    requests: { type: 'string' },
    'max-tokens': { type: 'string', default: '128' },
    'prompt-words': { type: 'string', default: '64' },
    endpoint: { type: 'string', default: 'chat' },
    'api-key': { type: 'string', default: process.env.QINFER_API_KEY ?? '' },
    temperature: { type: 'string', default: '1' },
    'ignore-eos': { type: 'string', default: 'true' },
    json: { type: 'boolean', default: false },
  },
});

const base = opts.url.replace(/\/$/, '');
const headers = { 'Content-Type': 'application/json' };
if (opts['api-key']) headers.Authorization = `Bearer ${opts['api-key']}`;
const maxTokens = Number(opts['max-tokens']);
const promptWords = Number(opts['prompt-words']);
const levels = opts.concurrency.split(',').map(Number).filter((c) => c > 0);
if (!['chat', 'completions'].includes(opts.endpoint)) throw new Error('--endpoint: chat or completions');
if (!['true', 'false'].includes(opts['ignore-eos'])) throw new Error('--ignore-eos: true or false');

async function firstModel() {
  const r = await fetch(`${base}/models`, { headers });
  if (!r.ok) throw new Error(`GET /models: HTTP ${r.status} ${await r.text()}`);
  return (await r.json()).data[0].id;
}

// Random words, so requests share no prefix beyond the template.
const vocabulary = 'alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu'.split(' ');
function prompt() {
  const words = [];
  for (let i = 0; i < promptWords; i += 1) words.push(vocabulary[Math.floor(Math.random() * vocabulary.length)]);
  return `Continue this list: ${words.join(' ')}`;
}

// One streamed request: times of the first token and of every later token-bearing event.
async function one(model) {
  const body = { model, max_tokens: maxTokens, temperature: Number(opts.temperature), stream: true, stream_options: { include_usage: true } };
  if (opts['ignore-eos'] === 'true') body.ignore_eos = true;
  if (opts.endpoint === 'chat') body.messages = [{ role: 'user', content: prompt() }];
  else body.prompt = prompt();
  const start = performance.now();
  const response = await fetch(`${base}/${opts.endpoint === 'chat' ? 'chat/completions' : 'completions'}`, {
    method: 'POST', headers, body: JSON.stringify(body),
  });
  if (!response.ok) return { ok: false, error: `HTTP ${response.status}: ${(await response.text()).slice(0, 200)}` };
  const decoder = new TextDecoder();
  let buffer = '';
  let first = null;
  let last = null;
  const gaps = [];
  let tokens = 0;
  let error = null;
  for await (const bytes of response.body) {
    buffer += decoder.decode(bytes, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      if (!event.startsWith('data: ')) continue;
      const data = event.slice(6);
      if (data === '[DONE]') continue;
      const chunk = JSON.parse(data);
      if (chunk.error) error = chunk.error.message;
      if (chunk.usage) tokens = chunk.usage.completion_tokens;
      const produced = (chunk.choices ?? []).some((c) => c.text || c.delta?.content || c.delta?.reasoning_content || c.delta?.tool_calls);
      if (!produced) continue;
      const now = performance.now();
      if (first === null) first = now;
      else gaps.push(now - last);
      last = now;
    }
  }
  if (error) return { ok: false, error };
  const tpot = first !== null && tokens > 1 ? (last - first) / (tokens - 1) : null;
  return { ok: true, ttft: first === null ? null : first - start, gaps, tokens, tpot, e2e: performance.now() - start };
}

function percentile(sorted, p) {
  if (sorted.length === 0) return NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i];
}

async function level(model, concurrency) {
  const total = opts.requests ? Number(opts.requests) : Math.max(8, 2 * concurrency);
  let next = 0;
  const results = [];
  const start = performance.now();
  async function worker() {
    while (next < total) {
      next += 1;
      try {
        results.push(await one(model));
      } catch (e) {
        results.push({ ok: false, error: String(e) });
      }
    }
  }
  await Promise.all(Array.from({ length: Math.min(concurrency, total) }, worker));
  const seconds = (performance.now() - start) / 1000;
  const ok = results.filter((r) => r.ok);
  const ttft = ok.map((r) => r.ttft).filter((t) => t !== null).sort((a, b) => a - b);
  const itl = ok.flatMap((r) => r.gaps).sort((a, b) => a - b);
  const tpot = ok.map((r) => r.tpot).filter((t) => t !== null).sort((a, b) => a - b);
  const tokens = ok.reduce((sum, r) => sum + r.tokens, 0);
  const errors = results.filter((r) => !r.ok).map((r) => r.error);
  return {
    concurrency, requests: total, ok: ok.length, failed: errors.length, seconds: +seconds.toFixed(2),
    output_tokens: tokens, output_tok_s: +(tokens / seconds).toFixed(1), requests_s: +(ok.length / seconds).toFixed(2),
    ttft_ms: { p50: percentile(ttft, 50), p90: percentile(ttft, 90), p99: percentile(ttft, 99) },
    itl_ms: { p50: percentile(itl, 50), p90: percentile(itl, 90), p99: percentile(itl, 99) },
    tpot_ms: { p50: percentile(tpot, 50), p90: percentile(tpot, 90), p99: percentile(tpot, 99) },
    first_error: errors[0],
  };
}

const model = opts.model ?? (await firstModel());
const f = (x) => (Number.isFinite(x) ? x.toFixed(1) : '-');
if (!opts.json) {
  console.log(`model ${model} at ${base}; ${opts.endpoint}, max_tokens ${maxTokens}, ~${promptWords}-word prompts`);
  console.log('conc  reqs  fail  out tok/s  req/s   TTFT p50 / p90 / p99 ms        ITL p50 / p90 / p99 ms     TPOT p50 / p90 / p99 ms');
}
for (const c of levels) {
  const r = await level(model, c);
  if (opts.json) {
    console.log(JSON.stringify(r));
    continue;
  }
  console.log(
    `${String(c).padStart(4)}  ${String(r.requests).padStart(4)}  ${String(r.failed).padStart(4)}  ${f(r.output_tok_s).padStart(9)}  ${f(r.requests_s).padStart(5)}` +
      `   ${f(r.ttft_ms.p50).padStart(8)} / ${f(r.ttft_ms.p90).padStart(8)} / ${f(r.ttft_ms.p99).padStart(8)}` +
      `   ${f(r.itl_ms.p50).padStart(7)} / ${f(r.itl_ms.p90).padStart(7)} / ${f(r.itl_ms.p99).padStart(7)}` +
      `   ${f(r.tpot_ms.p50).padStart(7)} / ${f(r.tpot_ms.p90).padStart(7)} / ${f(r.tpot_ms.p99).padStart(7)}`,
  );
  if (r.first_error) console.log(`      first error: ${r.first_error}`);
}
