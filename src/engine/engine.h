#pragma once
// The engine: continuous batching over one model. Requests arrive from any thread; a model thread
// owns the model and its caches and loops schedule() → run the plan → postprocess(); an output
// thread turns sampled ids into text (detokenizing, stop strings, logprobs) and calls each request's
// sink. `qinfer serve`, `run`, `chat` and generate() all submit here.
//
// - Scheduling policy: engine/scheduler.h. Blocks and slots: engine/block_manager.h. The forward,
//   its recorded decode steps and sampling: engine/model_runner.h.
// - A failing model step ends every request in that step with "error" (their caches may be
//   half-written); a failure while handling one choice's token, or a sink that throws, ends only
//   that request. Both threads keep going.
// - The output thread runs at most two steps behind the model thread; a sink that blocks holds
//   the model thread after that.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/sampling.h"
#include "grammar/mask.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace qinfer::engine {

struct EngineOptions {
  int64_t kv_blocks = 0;         // KV blocks in the pool (0: enough for max_running × max_context, within
                                 // memory_fraction of a device's free memory or of the host's available one)
  double memory_fraction = 0.9;  // of that memory the KV pool and recurrent states may take
  int32_t block_size = 16;       // tokens per KV block
  int32_t max_running = 64;      // sequences decoding at once (also the number of recurrent-state slots)
  int32_t max_waiting = 256;     // queued requests beyond which submit() refuses (HTTP 429)
  int32_t step_token_budget = 2048;  // tokens one forward may carry (decodes first, then prefill chunks)
  int64_t max_context = 0;       // prompt + completion limit per sequence (0: the model's max positions)
  // Keep computed blocks for later requests that share their prefix (BlockManager).
  bool prefix_caching = true;
  // Models with recurrent state: memory (GB) for checkpoints of the state, which a reused prefix
  // starts from (-1: a tenth of what the KV cache may take on a device, 0.25 in host memory; 0:
  // none, and such a model reuses nothing), and the tokens between a long prefill's checkpoints (a
  // multiple of block_size; 0: none between).
  double state_checkpoint_gb = -1;
  int32_t state_checkpoint_interval = 1024;
  int64_t state_checkpoints = 0;  // resolved: the checkpoint slots those GB hold (at most one per
                                  // block and one per running sequence), 0 without state
  // The prefix cache's host tier: host memory (GB, pinned where the model is on a device) that
  // evicted blocks and checkpoints are copied into and come back from on a hit (0: none). A model
  // with state gives a tenth of it to checkpoints.
  double host_cache_gb = 0;
  int64_t host_blocks = 0, host_checkpoints = 0;  // resolved: what those GB hold
};

// One sequence's recurrent state (every linear-attention layer of one rank), in bytes.
uint64_t state_slot_bytes(const CacheShape& shape);

// KV blocks that fit `free_bytes` × o.memory_fraction after the recurrent states of o.max_running
// sequences, of o.state_checkpoints checkpoints and of the padding rows of decode steps
// (`records_steps`: the backend records them, and pads to the recorded batch sizes); throws, naming
// `memory_kind`, when not even one block does.
int64_t kv_blocks_in_memory(const CacheShape& shape, const EngineOptions& o, uint64_t free_bytes, bool records_steps,
                            std::string_view memory_kind = "free device memory");

// MemAvailable of /proc/meminfo (what the host can hand out without swapping); nullopt where unknown.
std::optional<uint64_t> host_available_memory();

// The options an Engine runs with: max_context, kv_blocks and state_checkpoints resolved from their
// defaults. The KV pool is sized from the device's free memory, or on the CPU from `host_available`
// (nullopt: unknown, no cap); an explicit kv_blocks that does not fit in it throws.
EngineOptions resolve_options(const EngineOptions& o, const models::Runner& model,
                              std::optional<uint64_t> host_available);

struct RequestParams {
  std::vector<int32_t> prompt;
  SamplingParams sampling;       // seed applies to choice 0; choice i uses seed + i
  int32_t max_tokens = 256;      // completion tokens per choice
  int32_t n = 1;                 // choices sampled from the same prompt
  std::vector<std::string> stop;     // stop strings: output ends before the first match
  bool include_stop_str = false;     // the matched stop string ends the output instead
  std::vector<int32_t> stop_ids;     // token ids that end a choice (not part of the output)
  // Completion tokens before a choice may end: stop ids are masked out and stop strings not
  // matched until then (a grammar that is complete still ends it).
  int32_t min_tokens = 0;
  // OpenAI's logit_bias at its two exact values: ids never sampled (-100) and, when any are given,
  // the only ids sampled (+100). A grammar or min_tokens still decides what remains.
  std::vector<int32_t> banned_tokens, exclusive_tokens;
  int32_t top_logprobs = -1;     // -1: no logprobs; 0..20: the chosen token's logprob and this many alternatives
  // -1: none; 0..20: each prompt token's logprob given the tokens before it, its rank, and this many
  // alternatives (Event::prompt_logprobs). Such a prompt is computed whole: it takes nothing from
  // the prefix cache, and its n choices compute it each.
  int32_t prompt_logprobs = -1;
  // Constrained decoding (structured outputs): every choice's output follows this grammar, whose
  // masks allow stop_ids once it can end; a choice whose grammar is complete stops there. Null: free.
  std::shared_ptr<grammar::GrammarMasks> constraint;
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;  // log-softmax of the raw logits (before penalties and temperature)
  std::vector<std::pair<int32_t, float>> top;  // the top_logprobs most likely ids, most likely first
  int32_t rank = 0;  // prompt logprobs: 1 + the ids more likely than `token`
};

// What a request's sink receives. Every choice gets zero or more `delta`s, then exactly one `finished`.
struct Event {
  enum class Kind { delta, finished } kind = Kind::delta;
  int32_t choice = 0;
  std::string text;                    // new UTF-8-complete text (stop strings and their prefixes held back)
  // The tokens this delta adds: every sampled token but a stop id, the one completing a stop string
  // included (its text is cut before the match).
  std::vector<int32_t> tokens;
  std::vector<TokenLogprob> logprobs;  // one per token when requested
  // With prompt_logprobs, in each choice's first event only: prompt tokens 1 .. L-1 (the first has
  // nothing before it), in order.
  std::vector<TokenLogprob> prompt_logprobs;
  // kind == finished:
  std::string finish_reason;           // "stop" | "length" | "cancelled" | "error"
  std::string error;                   // why, when finish_reason == "error"
  std::string stop_string;             // the stop string that ended it ("stop" by a stop string)
  // Per choice. completion_tokens counts every sampled token, a final stop id included.
  int64_t prompt_tokens = 0, cached_prompt_tokens = 0, completion_tokens = 0;
};

using EventSink = std::function<void(const Event&)>;

struct EngineStats {
  int64_t running = 0, waiting = 0;  // sequences (one per choice; a preempted one waits again)
  int64_t kv_blocks_total = 0, kv_blocks_used = 0;
  int64_t kv_blocks_cached = 0;  // in the prefix cache, held or not (unheld ones count as free)
  int64_t prefix_reused_tokens_total = 0, prefix_evictions_total = 0;
  int64_t prefix_hits_total = 0, prefix_misses_total = 0;  // admissions that reused tokens, or none
  // Checkpoints of recurrent state: slots, those attached to cached blocks (and their bytes), evicted.
  int64_t state_checkpoints_total = 0, state_checkpoints_cached = 0, state_checkpoint_evictions_total = 0;
  double state_checkpoint_bytes = 0;
  int64_t state_slots_total = 0, state_slots_used = 0;
  // The host tier: its room, what it holds, and what came back from it on hits.
  int64_t host_blocks_total = 0, host_blocks_cached = 0, host_checkpoints_total = 0, host_checkpoints_cached = 0;
  int64_t host_loaded_blocks_total = 0, host_loaded_checkpoints_total = 0;
  int64_t prompt_tokens_total = 0, completion_tokens_total = 0;
  int64_t preemptions_total = 0;
  // Model steps, and where their time went: the model thread's own work (scheduling, building the
  // batch, postprocessing), the forward with sampling (as the host waits for it), and of that the
  // device's share from each step's first work on the device to its last (device backends only; the
  // rest of a forward is the host staging the step while the device idles).
  int64_t steps_total = 0, decode_steps_total = 0;
  double host_seconds_total = 0, forward_seconds_total = 0, device_seconds_total = 0;
  double recording_seconds = 0;  // the decode steps recorded at start-up
};

class Engine {
 public:
  // Records the decode steps (on a backend that records) and starts the threads. The model and
  // tokenizer must outlive the engine, and nothing else may run the model meanwhile. Bad options
  // (step_token_budget < max_running, …) throw.
  Engine(models::Runner& model, const tokenizer::Tokenizer& tokenizer, const EngineOptions& options);
  // Finishes every pending request with "cancelled", joins the threads. Not from inside a sink.
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues a request. Returns its id, or nullopt when the queue is full. Invalid params throw
  // qinfer::Error before anything is queued: an empty prompt, a prompt id outside the vocabulary,
  // a prompt of max_context tokens or more, n outside 1..max_running, bad sampling values, an empty
  // stop string, or a request that could never fit (prompt + max_tokens needs more KV blocks than
  // the whole pool). The sink is called on the output thread: it may call submit() and cancel(); it
  // should return quickly.
  std::optional<uint64_t> submit(RequestParams params, EventSink sink);
  // Ends a request: its sequences are freed within one step and each unfinished choice gets
  // `finished` with "cancelled". Unknown or finished ids are ignored. Any thread.
  void cancel(uint64_t id);

  EngineStats stats() const;
  // The options in effect: kv_blocks and max_context resolved from their 0 defaults.
  const EngineOptions& options() const { return options_; }

 private:
  struct Impl;
  EngineOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qinfer::engine
