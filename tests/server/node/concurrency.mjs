// 64 simultaneous streams through the openai client; every third is aborted mid-stream. All the
// others must complete, and afterwards every KV block and recurrent-state slot must be free.
import { check, client, done, getRoot } from './common.mjs';

const openai = client();
const model = (await openai.models.list()).data[0].id;
const streams = Number(process.env.QINFER_STREAMS ?? 64);

async function one(i) {
  const abort = i % 3 === 0;
  // A stream to abort runs to the end of the context (ignore_eos: a random model samples its end
  // token often), so only a cancel can end it soon.
  const stream = await openai.chat.completions.create({
    model,
    messages: [{ role: 'user', content: `Request number ${i}: say something.` }],
    ...(abort ? { ignore_eos: true } : { max_tokens: 12 }),
    temperature: 1,
    seed: i,
    stream: true,
  });
  let chunks = 0;
  let finish = null;
  for await (const chunk of stream) {
    chunks += 1;
    for (const c of chunk.choices) if (c.finish_reason) finish = c.finish_reason;
    if (abort && chunks === 2) {
      stream.controller.abort();
      break;
    }
  }
  return { i, abort, chunks, finish };
}

const started = Date.now();
const results = await Promise.all(Array.from({ length: streams }, (_, i) => one(i)));
for (const r of results) {
  if (r.abort) check(r.finish === null && r.chunks === 2, `stream ${r.i} aborted after its first token`);
  else check(['stop', 'length'].includes(r.finish), `stream ${r.i} completed (finish ${r.finish}, ${r.chunks} chunks)`);
}

// The aborted requests are cancelled by the server; nothing may stay allocated.
let health;
const deadline = Date.now() + 15_000;
do {
  health = await (await getRoot('/health')).json();
  if (health.running === 0 && health.waiting === 0 && health.kv_blocks_used === 0 && health.state_slots_used === 0) break;
  await new Promise((resolve) => setTimeout(resolve, 20));
} while (Date.now() < deadline);
check(health.running === 0 && health.waiting === 0, `nothing running or waiting: ${JSON.stringify(health)}`);
check(health.kv_blocks_used === 0, `every KV block free: ${JSON.stringify(health)}`);
check(health.state_slots_used === 0, `every state slot free: ${JSON.stringify(health)}`);
check(health.kv_blocks_total > 0, 'a KV pool exists');
const metrics = await (await getRoot('/metrics')).text();
check(/^qinfer_kv_blocks_used 0$/m.test(metrics), '/metrics shows no KV block in use');
check(/^qinfer_state_slots_used 0$/m.test(metrics), '/metrics shows no state slot in use');
const cancelled = metrics.match(/^qinfer_choices_finished_total\{reason="cancelled"\} (\d+)$/m);
check(cancelled && Number(cancelled[1]) === Math.floor((streams + 2) / 3), `aborted streams counted as cancelled: ${metrics.match(/^qinfer_choices_finished_total.*$/gm)}`);
console.log(`${streams} streams in ${Date.now() - started} ms`);
done('concurrency');
