#pragma once
// Continuous batching: one thread owns the model and its caches and, every step, runs one Batch made
// of the running decodes plus chunks of waiting prefills under a token budget. Requests arrive from
// any thread; their results leave through a per-request sink called on the scheduler thread.
//
// Policy, in short:
// - Admission is strictly first come, first served: the head of the queue waits until there is a
//   running place for all its choices and (unless nothing runs) free KV blocks for its tokens.
// - Each step: every running decode (one token each, oldest first), then prefill chunks of the
//   others, oldest first, under step_token_budget and the free blocks.
// - When a decode needs a block and none is free, the youngest running sequence is preempted by
//   recompute: its blocks and slot are freed and it goes back to the front of the queue with its
//   prompt + generated tokens, to be prefilled again. Nothing is emitted twice and sampling goes on
//   identically (the seed, step and history travel with it).
// - n > 1: choice 0 prefills the prompt up to its last whole block before the last prompt token;
//   choices 1..n-1 then share those blocks (reference counts) and a copy of the recurrent state, and
//   each prefills the short tail itself into a block of its own (a shared partial block would be
//   written by every choice). Their `cached_prompt_tokens` is that shared length; choice 0's is 0.
// - A failing model step ends every request in that batch with "error" (their caches may be
//   half-written); a failure while handling one sequence's token, or a sink that throws, ends only
//   that request. The thread keeps going.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "backend/sampling.h"
#include "models/model.h"
#include "tokenizer/tokenizer.h"

namespace qinfer::engine {

struct SchedulerOptions {
  int64_t kv_blocks = 0;         // KV blocks in the pool (0: enough for max_running × max_context, within
                                 // memory_fraction of a device's free memory)
  double memory_fraction = 0.9;  // of a GPU's free memory the KV pool and recurrent states may take
  int32_t block_size = 16;       // tokens per KV block
  int32_t max_running = 64;      // sequences decoding at once (also the number of recurrent-state slots)
  int32_t max_waiting = 256;     // queued requests beyond which submit() refuses (HTTP 429)
  int32_t step_token_budget = 2048;  // tokens one forward may carry (decodes first, then prefill chunks)
  int64_t max_context = 0;       // prompt + completion limit per sequence (0: the model's max positions)
};

// KV blocks that fit `free_bytes` × o.memory_fraction after the recurrent states of o.max_running
// sequences; throws when not even one block does.
int64_t kv_blocks_in_memory(const CacheShape& shape, const SchedulerOptions& o, uint64_t free_bytes);

struct RequestParams {
  std::vector<int32_t> prompt;
  SamplingParams sampling;       // seed applies to choice 0; choice i uses seed + i
  int32_t max_tokens = 256;      // completion tokens per choice
  int32_t n = 1;                 // choices sampled from the same prompt
  std::vector<std::string> stop;     // stop strings: output ends before the first match
  std::vector<int32_t> stop_ids;     // token ids that end a choice (not part of the output)
  int32_t top_logprobs = -1;     // -1: no logprobs; 0..20: the chosen token's logprob and this many alternatives
};

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0;  // log-softmax of the raw logits (before penalties and temperature)
  std::vector<std::pair<int32_t, float>> top;  // the top_logprobs most likely ids, most likely first
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
  // kind == finished:
  std::string finish_reason;           // "stop" | "length" | "cancelled" | "error"
  std::string error;                   // why, when finish_reason == "error"
  // Per choice. completion_tokens counts every sampled token, a final stop id included.
  int64_t prompt_tokens = 0, cached_prompt_tokens = 0, completion_tokens = 0;
};

using EventSink = std::function<void(const Event&)>;

struct SchedulerStats {
  int64_t running = 0, waiting = 0;  // sequences (one per choice; a preempted one waits again)
  int64_t kv_blocks_total = 0, kv_blocks_used = 0;
  int64_t state_slots_total = 0, state_slots_used = 0;
  int64_t prompt_tokens_total = 0, completion_tokens_total = 0;
  int64_t preemptions_total = 0;
};

class Scheduler {
 public:
  // Starts the scheduler thread. The model and tokenizer must outlive the scheduler, and nothing
  // else may run the model meanwhile. Bad options (step_token_budget < max_running, …) throw.
  Scheduler(models::Runner& model, const tokenizer::Tokenizer& tokenizer, const SchedulerOptions& options);
  // Finishes every pending request with "cancelled", joins the thread. Not from inside a sink.
  ~Scheduler();

  // Queues a request. Returns its id, or nullopt when the queue is full. Invalid params throw
  // qinfer::Error before anything is queued: an empty prompt, a prompt id outside the vocabulary,
  // a prompt of max_context tokens or more, n outside 1..max_running, bad sampling values, an empty
  // stop string, or a request that could never fit (prompt + max_tokens needs more KV blocks than
  // the whole pool). The sink is called on the scheduler thread without the scheduler's lock held:
  // it may call submit() and cancel(); it should return quickly, as the whole batch waits for it.
  std::optional<uint64_t> submit(RequestParams params, EventSink sink);
  // Ends a request: its sequences are freed within one step and each unfinished choice gets
  // `finished` with "cancelled". Unknown or finished ids are ignored. Any thread.
  void cancel(uint64_t id);

  SchedulerStats stats() const;
  // The options in effect: kv_blocks and max_context resolved from their 0 defaults.
  const SchedulerOptions& options() const { return options_; }

 private:
  struct Impl;
  SchedulerOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qinfer::engine
