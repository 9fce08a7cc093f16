#include "engine/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <numeric>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "core/log.h"
#include "engine/block_manager.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"
#include "engine/text_stream.h"

namespace qinfer::engine {
namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

int64_t blocks_for(int64_t tokens, int64_t block_size) { return (tokens + block_size - 1) / block_size; }

// log-softmax of one raw logits row at `token`, and the `top` most likely ids (lower id first on ties);
// `rank`: the token's too.
TokenLogprob logprob_of(const float* row, int64_t vocab, int32_t token, int32_t top, bool rank = false) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t v = 0; v < vocab; ++v)
    if (row[v] > max) max = row[v];
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v)
    if (!std::isnan(row[v])) sum += std::exp(static_cast<double>(row[v]) - max);
  const double log_total = max + std::log(sum);
  TokenLogprob out{token, static_cast<float>(row[token] - log_total), {}};
  if (rank) {
    out.rank = 1;
    for (int64_t v = 0; v < vocab; ++v) out.rank += row[v] > row[token];
  }
  if (top > 0) {
    auto key = [&](int32_t v) { return std::isnan(row[v]) ? -std::numeric_limits<float>::infinity() : row[v]; };
    std::vector<int32_t> ids(static_cast<size_t>(vocab));
    std::iota(ids.begin(), ids.end(), 0);
    const auto end = ids.begin() + std::min<int64_t>(top, vocab);
    std::partial_sort(ids.begin(), end, ids.end(),
                      [&](int32_t a, int32_t b) { return key(a) > key(b) || (key(a) == key(b) && a < b); });
    for (auto it = ids.begin(); it != end; ++it)
      out.top.emplace_back(*it, static_cast<float>(row[*it] - log_total));
  }
  return out;
}

// K and V of one block in every attention layer, in bytes.
double kv_block_bytes(const CacheShape& s, int32_t block_size) {
  const auto block_elements = static_cast<uint64_t>(s.attention_layers * block_size * s.kv_heads * s.head_dim);
  return 2.0 * static_cast<double>(storage_bytes(s.kv_dtype, block_elements));
}

// The recurrent states of the engine's slots, its checkpoints and the runner's (at least one:
// ModelRunner's cache), in bytes.
double state_bytes(const CacheShape& s, const EngineOptions& o, bool records_steps) {
  const double slots = static_cast<double>(o.max_running + std::max(1, padding_rows(o.max_running, records_steps))) +
                       static_cast<double>(o.state_checkpoints);
  return slots * static_cast<double>(state_slot_bytes(s));
}

}  // namespace

std::optional<uint64_t> host_available_memory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib) {
    if (key == "MemAvailable:") return kib * 1024;
    std::getline(in, unit);
  }
  return std::nullopt;
}

EngineOptions resolve_options(const EngineOptions& o, const models::Runner& model,
                              std::optional<uint64_t> host_available) {
  const int64_t positions = model.config().max_position_embeddings;
  QINFER_CHECK(o.block_size > 0, "engine: block_size must be positive, got {}", o.block_size);
  QINFER_CHECK(o.max_running > 0, "engine: max_running must be positive, got {}", o.max_running);
  QINFER_CHECK(o.max_waiting > 0, "engine: max_waiting must be positive, got {}", o.max_waiting);
  QINFER_CHECK(o.step_token_budget >= o.max_running,
               "engine: step_token_budget ({}) must be at least max_running ({}) so that every running "
               "sequence can decode in each step",
               o.step_token_budget, o.max_running);
  QINFER_CHECK(o.max_context >= 0 && o.max_context <= positions,
               "engine: max_context {} is outside 0..{} (the model's max_position_embeddings)", o.max_context,
               positions);
  QINFER_CHECK(o.kv_blocks >= 0, "engine: kv_blocks must not be negative, got {}", o.kv_blocks);
  QINFER_CHECK(o.memory_fraction > 0 && o.memory_fraction <= 1, "engine: memory_fraction {} is outside (0, 1]",
               o.memory_fraction);
  QINFER_CHECK(o.state_checkpoint_interval >= 0 && o.state_checkpoint_interval % o.block_size == 0,
               "engine: state_checkpoint_interval {} must be a multiple of the block size {} (0: none)",
               o.state_checkpoint_interval, o.block_size);
  QINFER_CHECK(o.state_checkpoint_gb == -1 || o.state_checkpoint_gb >= 0,
               "engine: state_checkpoint_gb must be -1 (auto) or at least 0, got {}", o.state_checkpoint_gb);
  EngineOptions r = o;
  if (r.max_context == 0) r.max_context = positions;
  const std::optional<uint64_t> free = model.ops().free_memory();
  // The KV pool comes out of the device's free memory, or on the CPU out of the host's, which every
  // rank of this process takes its share of.
  const std::optional<uint64_t> pool_memory =
      free ? free : host_available ? std::optional<uint64_t>(*host_available / model.local_ranks()) : std::nullopt;
  const char* memory_kind = free ? "free device memory" : "available host memory";
  const uint64_t slot_bytes = state_slot_bytes(model.cache_shape());
  r.state_checkpoints = 0;
  if (slot_bytes > 0 && r.prefix_caching) {
    const double gb = r.state_checkpoint_gb >= 0 ? r.state_checkpoint_gb
                      : free                     ? 0.1 * static_cast<double>(*free) * r.memory_fraction / 1e9
                                                 : 0.25;
    r.state_checkpoints = static_cast<int64_t>(gb * 1e9 / static_cast<double>(slot_bytes));
  }
  const CacheShape shape = model.cache_shape();
  const bool records = model.ops().records_steps();
  if (r.kv_blocks == 0) {
    r.kv_blocks = r.max_running * blocks_for(r.max_context, r.block_size);
    // The pool takes what max_running x max_context needs, and no more than memory_fraction of what is
    // free after the weights: on the CPU a default must not push the host into swap.
    if (pool_memory) {
      r.kv_blocks = std::min(r.kv_blocks, kv_blocks_in_memory(shape, r, *pool_memory, records, memory_kind));
      log_info("engine: {} KV blocks of {} tokens ({:.2f} GB) in {:.2f} GB of {}", r.kv_blocks, r.block_size,
               static_cast<double>(r.kv_blocks) * kv_block_bytes(shape, r.block_size) / 1e9,
               static_cast<double>(*pool_memory) / 1e9, memory_kind);
    }
  } else if (pool_memory) {
    // An explicit pool is what was asked for, up to all of the memory: past that, allocation would fail
    // (or swap) later and less clearly. One more block is the runner's scratch block.
    const double need = static_cast<double>(r.kv_blocks + 1) * kv_block_bytes(shape, r.block_size) +
                        state_bytes(shape, r, records);
    QINFER_CHECK(need <= static_cast<double>(*pool_memory),
                 "engine: kv_blocks {} needs {:.2f} GB (KV blocks of {} tokens and the recurrent state of {} "
                 "sequences), but only {:.2f} GB of {} is left; lower --kv-blocks or --max-running",
                 r.kv_blocks, need / 1e9, r.block_size, r.max_running, static_cast<double>(*pool_memory) / 1e9,
                 memory_kind);
  }
  // More would never be attached: one per cached block, one rolling per running sequence.
  r.state_checkpoints = std::min(r.state_checkpoints, r.kv_blocks + r.max_running);
  QINFER_CHECK(std::isfinite(r.host_cache_gb) && r.host_cache_gb >= 0, "engine: host_cache_gb must be at least 0, got {}",
               r.host_cache_gb);
  r.host_blocks = r.host_checkpoints = 0;
  if (r.host_cache_gb > 0 && r.prefix_caching && (slot_bytes == 0 || r.state_checkpoints > 0)) {
    const double bytes = r.host_cache_gb * 1e9;
    if (host_available)
      QINFER_CHECK(bytes <= static_cast<double>(*host_available),
                   "engine: host_cache_gb {} is more than the host's {:.2f} GB of available memory", r.host_cache_gb,
                   static_cast<double>(*host_available) / 1e9);
    // A host block or checkpoint holds every rank's share of this process.
    const double ranks = model.local_ranks();
    const double block = kv_block_bytes(shape, r.block_size) * ranks;
    const double checkpoint = static_cast<double>(slot_bytes) * ranks;
    const double for_checkpoints = slot_bytes > 0 ? 0.1 * bytes : 0;
    r.host_checkpoints = slot_bytes > 0 ? static_cast<int64_t>(for_checkpoints / checkpoint) : 0;
    r.host_blocks = block > 0 ? static_cast<int64_t>((bytes - for_checkpoints) / block) : 0;
    r.host_blocks = std::min<int64_t>(r.host_blocks, std::numeric_limits<int32_t>::max());
    r.host_checkpoints = std::min<int64_t>(r.host_checkpoints, std::numeric_limits<int32_t>::max());
    log_info("engine: host cache tier of {:.2f} GB: {} blocks, {} state checkpoints", r.host_cache_gb, r.host_blocks,
             r.host_checkpoints);
  }
  if (r.state_checkpoints > 0)
    log_info("engine: {} state checkpoints ({:.2f} GB), one every {} prefill tokens", r.state_checkpoints,
             static_cast<double>(r.state_checkpoints) * static_cast<double>(slot_bytes) / 1e9,
             r.state_checkpoint_interval);
  return r;
}

uint64_t state_slot_bytes(const CacheShape& s) {
  return static_cast<uint64_t>(s.linear_layers) * sizeof(float) *
         static_cast<uint64_t>(s.conv_window * s.conv_channels + s.value_heads * s.value_head_dim * s.key_head_dim);
}

int64_t kv_blocks_in_memory(const CacheShape& s, const EngineOptions& o, uint64_t free_bytes, bool records_steps,
                            std::string_view memory_kind) {
  const double block_bytes = kv_block_bytes(s, o.block_size);
  const double states = state_bytes(s, o, records_steps);
  const double budget = static_cast<double>(free_bytes) * o.memory_fraction - states;
  QINFER_CHECK(budget >= 2 * block_bytes,
               "engine: {:.2f} GB of {} x memory fraction {} leaves no room for the KV cache after "
               "{:.2f} GB of recurrent state for {} sequences (lower --max-running or raise --memory-fraction)",
               static_cast<double>(free_bytes) / 1e9, memory_kind, o.memory_fraction, states / 1e9, o.max_running);
  if (block_bytes == 0) return std::numeric_limits<int32_t>::max();  // no attention layers: nothing to hold
  return static_cast<int64_t>(budget / block_bytes) - 1;  // one scratch block for padding rows
}

struct Engine::Impl {
  // One request, shared by the two threads: params and sink are fixed at submit; `live` and
  // `admitted` are the model thread's, `choices` and `sink_threw` the output thread's.
  struct Request {
    struct Choice {
      std::optional<TextStream> text;
      bool finished = false;  // its finished event went to the sink
      int64_t cached_prompt_tokens = 0, completion_tokens = 0;
      std::vector<TokenLogprob> prompt_logprobs;  // gathered until its first event carries them
      bool sent_prompt_logprobs = false;
    };
    uint64_t id = 0;
    RequestParams params;
    SequenceLimits limits;
    EventSink sink;
    int32_t live = 0;
    bool admitted = false;
    std::vector<Choice> choices;
    bool sink_threw = false;
    int32_t unfinished = 0;
    // Set by cancel() at once: no delta reaches the sink after it, though steps already run are queued.
    std::atomic<bool> cancelled{false};
  };
  using RequestPtr = std::shared_ptr<Request>;

  // What the output thread works on, in the order the model thread produced it.
  struct Output {
    std::vector<SampledToken> tokens;
    std::vector<RequestPtr> requests;  // tokens[i]'s request
    Tensor logits;                     // rows by SampledToken::row, when some request wants logprobs
    // Prompt logprobs: rows of prompt_logits (ModelRunner::Result::prompt_rows) for positions
    // [first, first + count) of a choice's prompt.
    struct PromptRows {
      RequestPtr request;
      int32_t choice = 0, first = 0, count = 0;
      int64_t row = 0;
    };
    std::vector<PromptRows> prompt_rows;
    Tensor prompt_logits;
    // Or: a request ended by the engine (cancelled, failed): its unfinished choices finish so.
    RequestPtr ended;
    std::string reason, error;
  };

  Impl(models::Runner& model, const tokenizer::Tokenizer& tokenizer, const EngineOptions& options)
      : model(model),
        tokenizer(tokenizer),
        options(options),
        blocks(options.kv_blocks, options.block_size,
               model.cache_shape().linear_layers > 0 ? options.max_running : 0, options.prefix_caching,
               options.state_checkpoints, options.host_blocks, options.host_checkpoints),
        scheduler({options.max_running, options.step_token_budget, options.state_checkpoint_interval}, blocks),
        runner(model, {options.kv_blocks, options.block_size, blocks.total_slots() + blocks.total_checkpoints(),
                       options.max_running, options.max_context, tokenizer.vocab_size(), blocks.total_host_blocks(),
                       blocks.total_host_checkpoints()}),
        slot_bytes(static_cast<double>(state_slot_bytes(model.cache_shape()))) {}

  void validate(const RequestParams& p) const;
  void model_loop();
  void step();
  void end_request(uint64_t id, const std::string& reason, const std::string& error);
  void take_inbox();
  void shut_down();
  void push_output(Output out, bool wait_for_room);
  void publish();

  void output_loop();
  void process(Output& out);
  void emit(Request& r, Event e);
  void finish_choice(Request& r, int32_t choice, const std::string& reason, const std::string& error,
                     const std::string& stop_string = "");

  models::Runner& model;
  const tokenizer::Tokenizer& tokenizer;
  const EngineOptions options;
  BlockManager blocks;
  Scheduler scheduler;
  ModelRunner runner;
  double slot_bytes;

  // Shared by every thread: under mu.
  mutable std::mutex mu;
  std::condition_variable wake;        // the model thread: inbox, cancels, finishes, stopping
  std::condition_variable output_cv;   // the output thread: outputs; the model thread: room in it
  std::deque<RequestPtr> inbox;
  std::vector<uint64_t> cancels;
  struct Finish {
    uint64_t request;
    int32_t choice;  // -1: every choice
  };
  std::vector<Finish> finishes;  // choices the output thread ended (stop strings, sinks that threw)
  std::deque<Output> outputs;
  bool output_busy = false;
  bool stopping = false, output_stopping = false;
  uint64_t next_id = 1;
  EngineStats published;
  std::unordered_map<uint64_t, std::weak_ptr<Request>> unfinished;  // for cancel()

  // The model thread's own.
  std::map<uint64_t, RequestPtr> requests;
  EngineStats totals;

  std::thread model_thread, output_thread;
};

void Engine::Impl::validate(const RequestParams& p) const {
  const int64_t L = static_cast<int64_t>(p.prompt.size()), vocab = model.config().vocab_size;
  QINFER_CHECK(L > 0, "request: the prompt is empty");
  for (size_t i = 0; i < p.prompt.size(); ++i)
    QINFER_CHECK(p.prompt[i] >= 0 && p.prompt[i] < vocab,
                 "request: prompt token {} (at position {}) is outside the vocabulary 0..{}", p.prompt[i], i,
                 vocab - 1);
  QINFER_CHECK(L < options.max_context,
               "request: the prompt has {} tokens but the context limit is {} (prompt + completion)", L,
               options.max_context);
  QINFER_CHECK(p.max_tokens >= 1, "request: max_tokens must be at least 1, got {}", p.max_tokens);
  QINFER_CHECK(p.min_tokens >= 0 && p.min_tokens <= p.max_tokens,
               "request: min_tokens must be between 0 and max_tokens ({}), got {}", p.max_tokens, p.min_tokens);
  for (const auto* ids : {&p.banned_tokens, &p.exclusive_tokens})
    for (const int32_t id : *ids)
      QINFER_CHECK(id >= 0 && id < vocab, "request: logit_bias token {} is outside the vocabulary 0..{}", id, vocab - 1);
  QINFER_CHECK(p.n >= 1 && p.n <= options.max_running,
               "request: n must be between 1 and {} (the engine's max_running), got {}", options.max_running, p.n);
  QINFER_CHECK(p.top_logprobs >= -1 && p.top_logprobs <= 20,
               "request: top_logprobs must be between 0 and 20 (or -1: none), got {}", p.top_logprobs);
  QINFER_CHECK(p.prompt_logprobs >= -1 && p.prompt_logprobs <= 20,
               "request: prompt_logprobs must be between 0 and 20 (or -1: none), got {}", p.prompt_logprobs);
  const SamplingParams& s = p.sampling;
  QINFER_CHECK(std::isfinite(s.temperature) && s.temperature >= 0,
               "request: temperature must be a finite number >= 0, got {}", s.temperature);
  QINFER_CHECK(s.top_k >= 0, "request: top_k must be >= 0 (0: off), got {}", s.top_k);
  QINFER_CHECK(s.top_p > 0 && s.top_p <= 1, "request: top_p must be in (0, 1], got {}", s.top_p);
  QINFER_CHECK(s.min_p >= 0 && s.min_p <= 1, "request: min_p must be in [0, 1], got {}", s.min_p);
  QINFER_CHECK(std::isfinite(s.repetition_penalty) && s.repetition_penalty > 0,
               "request: repetition_penalty must be a finite number > 0, got {}", s.repetition_penalty);
  QINFER_CHECK(std::isfinite(s.presence_penalty) && std::isfinite(s.frequency_penalty),
               "request: presence_penalty and frequency_penalty must be finite");
  for (const std::string& stop : p.stop) QINFER_CHECK(!stop.empty(), "request: a stop string is empty");
  // The last sampled token is never fed back, so the cache holds at most longest - 1 tokens.
  const int64_t longest = std::min<int64_t>(L + p.max_tokens, options.max_context);
  const int64_t needed = blocks_for(longest - 1, options.block_size);
  QINFER_CHECK(needed <= options.kv_blocks,
               "request: the prompt ({} tokens) + max_tokens ({}) needs {} KV blocks of {} tokens, more than the "
               "whole cache ({} blocks); lower max_tokens or shorten the prompt",
               L, p.max_tokens, needed, options.block_size, options.kv_blocks);
}

// --- the model thread ------------------------------------------------------------------------------

void Engine::Impl::model_loop() {
  while (true) {
    std::vector<uint64_t> cancelled;
    std::vector<Finish> finished;
    {
      std::unique_lock lock(mu);
      wake.wait(lock, [&] {
        return stopping || !inbox.empty() || !cancels.empty() || !finishes.empty() || !scheduler.idle();
      });
      if (stopping) break;
      cancelled.swap(cancels);
      finished.swap(finishes);
    }
    take_inbox();
    for (const Finish& f : finished)
      if (auto it = requests.find(f.request); it != requests.end()) {
        it->second->live -= static_cast<int32_t>(scheduler.finish(f.request, f.choice).size());
        if (it->second->live <= 0) requests.erase(it);
      }
    for (uint64_t id : cancelled) end_request(id, "cancelled", "");
    try {
      step();
    } catch (const std::exception& e) {
      // A bug outside the model step: the running requests' state is unknown, end them.
      for (uint64_t id : scheduler.requests()) end_request(id, "error", fmt::format("the engine step failed: {}", e.what()));
    }
    publish();
  }
  shut_down();
}

void Engine::Impl::take_inbox() {
  std::deque<RequestPtr> arrived;
  {
    std::lock_guard lock(mu);
    arrived.swap(inbox);
    published.waiting += static_cast<int64_t>(arrived.size());  // still waiting, now in the scheduler's queue
  }
  for (RequestPtr& r : arrived) {
    const RequestParams& p = r->params;
    auto s = std::make_unique<Sequence>();
    s->request = r->id;
    s->tokens = p.prompt;
    s->prompt_tokens = static_cast<int32_t>(p.prompt.size());
    s->sampling = p.sampling;
    s->limits = &r->limits;
    s->forks = p.n - 1;
    if (p.constraint) s->constraint = std::make_unique<grammar::TokenConstraint>(p.constraint);
    // Choices share the prompt's whole blocks, but not when each must see every position's logits.
    if (s->forks > 0 && p.prompt_logprobs < 0)
      s->fork_at = (s->prompt_tokens - 1) / options.block_size * options.block_size;
    r->live = p.n;
    scheduler.add(std::move(s));
    requests.emplace(r->id, std::move(r));
  }
}

void Engine::Impl::step() {
  const auto start = Clock::now();
  StepPlan plan = scheduler.schedule();
  if (plan.empty()) return;
  bool logprobs = false;
  for (const StepPlan::Chunk& c : plan.chunks) {
    Request& r = *requests.at(c.sequence->request);
    if (!r.admitted) {
      r.admitted = true;
      totals.prompt_tokens_total += static_cast<int64_t>(r.params.prompt.size());
    }
    logprobs = logprobs || (c.samples && r.params.top_logprobs >= 0);
  }
  double host = since(start);
  const auto forward_start = Clock::now();
  ModelRunner::Result result;
  try {
    result = runner.run(plan, logprobs);
  } catch (const std::exception& e) {
    // The cache of every sequence in the step may be half-written: end their requests.
    for (uint64_t id : Scheduler::requests_of(plan))
      end_request(id, "error", fmt::format("the model step running this request failed: {}", e.what()));
    return;
  }
  totals.forward_seconds_total += since(forward_start);
  totals.device_seconds_total += result.device_seconds.value_or(0.0);
  const auto post_start = Clock::now();
  Output out;
  int64_t prompt_row = 0;
  for (const StepPlan::Chunk& c : plan.chunks) {
    if (!c.prompt_rows) continue;
    // Rows of positions a recompute after preemption had already returned are not sent again.
    const Sequence& s = *c.sequence;
    const int32_t first = std::max(s.cache.cached, s.prompt_rows_done);
    const int32_t end = std::min(s.cache.cached + c.tokens, s.prompt_tokens - 1);
    if (end > first)
      out.prompt_rows.push_back({requests.at(s.request), s.choice, first, end - first, prompt_row + first - s.cache.cached});
    prompt_row += c.tokens;
  }
  out.prompt_logits = std::move(result.prompt_rows);
  out.tokens = scheduler.postprocess(plan, result.ids);
  out.logits = std::move(result.logits);
  for (const SampledToken& t : out.tokens) {
    auto it = requests.find(t.request);
    out.requests.push_back(it->second);
    if (!t.finish_reason.empty() && --it->second->live <= 0) requests.erase(it);
  }
  ++totals.steps_total;
  totals.decode_steps_total += plan.decode_only();
  totals.host_seconds_total += host + since(post_start);
  publish();  // before the sinks see this step's tokens
  if (!out.tokens.empty() || !out.prompt_rows.empty()) push_output(std::move(out), /*wait_for_room=*/true);
}

void Engine::Impl::end_request(uint64_t id, const std::string& reason, const std::string& error) {
  auto it = requests.find(id);
  if (it == requests.end()) return;
  scheduler.finish(id, -1, /*keep_cache=*/reason != "error");
  Output out;
  out.ended = it->second;
  out.reason = reason;
  out.error = error;
  requests.erase(it);
  push_output(std::move(out), /*wait_for_room=*/false);
}

void Engine::Impl::push_output(Output out, bool wait_for_room) {
  std::unique_lock lock(mu);
  // At most two steps behind: a slow sink slows the model thread instead of growing the queue.
  if (wait_for_room) output_cv.wait(lock, [&] { return outputs.size() < 2; });
  outputs.push_back(std::move(out));
  output_cv.notify_all();
}

void Engine::Impl::publish() {
  EngineStats s = totals;
  const SchedulerCounts c = scheduler.counts();
  s.running = c.running;
  s.waiting = c.waiting;
  s.preemptions_total = c.preemptions;
  s.kv_blocks_total = blocks.total_blocks();
  s.kv_blocks_used = blocks.used_blocks();
  s.kv_blocks_cached = blocks.cached_blocks();
  s.prefix_reused_tokens_total = c.reused_tokens;
  s.prefix_evictions_total = blocks.evictions();
  s.prefix_hits_total = c.prefix_hits;
  s.prefix_misses_total = c.prefix_misses;
  s.state_checkpoints_total = blocks.total_checkpoints();
  s.state_checkpoints_cached = blocks.attached_checkpoints();
  s.state_checkpoint_evictions_total = blocks.checkpoint_evictions();
  s.state_checkpoint_bytes = static_cast<double>(s.state_checkpoints_cached) * slot_bytes;
  s.state_slots_total = blocks.total_slots();
  s.state_slots_used = blocks.used_slots();
  s.host_blocks_total = blocks.total_host_blocks();
  s.host_blocks_cached = blocks.host_blocks();
  s.host_checkpoints_total = blocks.total_host_checkpoints();
  s.host_checkpoints_cached = blocks.host_checkpoints();
  s.host_loaded_blocks_total = blocks.host_loaded_blocks();
  s.host_loaded_checkpoints_total = blocks.host_loaded_checkpoints();
  std::lock_guard lock(mu);
  s.completion_tokens_total = published.completion_tokens_total;  // the output thread's count
  published = s;
}

void Engine::Impl::shut_down() {
  // Until the queue stays empty: a sink may still submit while its request is being cancelled.
  while (true) {
    take_inbox();
    std::vector<uint64_t> ids;
    for (const auto& [id, r] : requests) ids.push_back(id);
    for (uint64_t id : ids) end_request(id, "cancelled", "");
    publish();
    std::unique_lock lock(mu);
    output_cv.wait(lock, [&] { return outputs.empty() && !output_busy; });
    if (inbox.empty()) {
      output_stopping = true;
      output_cv.notify_all();
      return;
    }
  }
}

// --- the output thread -----------------------------------------------------------------------------

void Engine::Impl::output_loop() {
  while (true) {
    Output out;
    {
      std::unique_lock lock(mu);
      output_cv.wait(lock, [&] { return output_stopping || !outputs.empty(); });
      if (outputs.empty()) return;
      out = std::move(outputs.front());
      outputs.pop_front();
      output_busy = true;
      output_cv.notify_all();  // room for the model thread
    }
    process(out);
    std::lock_guard lock(mu);
    output_busy = false;
    output_cv.notify_all();
  }
}

void Engine::Impl::process(Output& out) {
  if (out.ended) {
    Request& r = *out.ended;
    for (int32_t c = 0; c < static_cast<int32_t>(r.choices.size()); ++c) finish_choice(r, c, out.reason, out.error);
    return;
  }
  // Before the step's tokens: a choice's last prompt rows come in the step that samples its first.
  for (const Output::PromptRows& p : out.prompt_rows) {
    Request& r = *p.request;
    const int64_t text = out.prompt_logits.dim(1);
    std::vector<TokenLogprob>& into = r.choices[static_cast<size_t>(p.choice)].prompt_logprobs;
    for (int32_t i = 0; i < p.count; ++i)
      into.push_back(logprob_of(out.prompt_logits.ptr<float>() + (p.row + i) * text, text,
                                r.params.prompt[static_cast<size_t>(p.first + i + 1)], r.params.prompt_logprobs,
                                /*rank=*/true));
  }
  // Counted before any sink hears of them (a choice has one token in a step).
  int64_t counted = 0;
  for (size_t i = 0; i < out.tokens.size(); ++i)
    counted += !out.requests[i]->choices[static_cast<size_t>(out.tokens[i].choice)].finished;
  {
    std::lock_guard lock(mu);
    published.completion_tokens_total += counted;
  }
  const int64_t vocab = out.logits.data ? out.logits.dim(1) : 0;
  for (size_t i = 0; i < out.tokens.size(); ++i) {
    const SampledToken& t = out.tokens[i];
    Request& r = *out.requests[i];
    Request::Choice& c = r.choices[static_cast<size_t>(t.choice)];
    if (c.finished) continue;  // ended here already (a stop string, a sink that threw)
    try {
      ++c.completion_tokens;
      c.cached_prompt_tokens = t.cached_prompt_tokens;
      if (!c.text) c.text.emplace(tokenizer, r.params.stop, r.params.include_stop_str);
      if (t.stop_id) {
        if (std::string rest = c.text->finish(); !rest.empty()) emit(r, Event{Event::Kind::delta, t.choice, std::move(rest)});
        finish_choice(r, t.choice, "stop", "");
        continue;
      }
      Event delta{Event::Kind::delta, t.choice, c.text->push(t.token, c.completion_tokens >= r.params.min_tokens),
                  {t.token}};
      if (r.params.top_logprobs >= 0)
        delta.logprobs.push_back(
            logprob_of(out.logits.ptr<float>() + int64_t{t.row} * vocab, vocab, t.token, r.params.top_logprobs));
      const bool stopped = c.text->stopped();
      if (!stopped && !t.finish_reason.empty()) delta.text += c.text->finish();
      emit(r, std::move(delta));
      if (stopped) {
        finish_choice(r, t.choice, "stop", "", c.text->matched());
        // The model thread may have run it a step further; it frees it now.
        if (t.finish_reason.empty()) {
          std::lock_guard lock(mu);
          finishes.push_back({r.id, t.choice});
          wake.notify_one();
        }
      } else if (!t.finish_reason.empty()) {
        finish_choice(r, t.choice, t.finish_reason, t.error);
      }
    } catch (const std::exception& e) {
      for (int32_t k = 0; k < static_cast<int32_t>(r.choices.size()); ++k)
        finish_choice(r, k, "error", fmt::format("processing a generated token failed: {}", e.what()));
      std::lock_guard lock(mu);
      finishes.push_back({r.id, -1});
      wake.notify_one();
    }
  }
}

void Engine::Impl::emit(Request& r, Event e) {
  const bool finished = e.kind == Event::Kind::finished;
  if ((r.sink_threw || r.cancelled) && !finished) return;
  if (Request::Choice& c = r.choices[static_cast<size_t>(e.choice)]; r.params.prompt_logprobs >= 0 && !c.sent_prompt_logprobs) {
    c.sent_prompt_logprobs = true;
    e.prompt_logprobs = std::move(c.prompt_logprobs);
  }
  std::string what;
  try {
    r.sink(e);
    return;
  } catch (const std::exception& ex) {
    what = ex.what();
  } catch (...) {
    what = "an exception that is not a std::exception";
  }
  if (r.sink_threw) return;
  // A sink that throws ends its request; its unfinished choices still get their finished event.
  r.sink_threw = true;
  for (int32_t c = 0; c < static_cast<int32_t>(r.choices.size()); ++c)
    finish_choice(r, c, "error", "the request's event sink threw: " + what);
  std::lock_guard lock(mu);
  finishes.push_back({r.id, -1});
  wake.notify_one();
}

void Engine::Impl::finish_choice(Request& r, int32_t choice, const std::string& reason, const std::string& error,
                                 const std::string& stop_string) {
  Request::Choice& c = r.choices[static_cast<size_t>(choice)];
  if (c.finished) return;
  c.finished = true;
  if (--r.unfinished == 0) {
    std::lock_guard lock(mu);
    unfinished.erase(r.id);
  }
  Event e{Event::Kind::finished, choice};
  e.finish_reason = reason;
  e.error = error;
  e.stop_string = stop_string;
  e.prompt_tokens = static_cast<int64_t>(r.params.prompt.size());
  e.cached_prompt_tokens = c.cached_prompt_tokens;
  e.completion_tokens = c.completion_tokens;
  emit(r, std::move(e));
}

// --- Engine ------------------------------------------------------------------------------------------

Engine::Engine(models::Runner& model, const tokenizer::Tokenizer& tokenizer, const EngineOptions& options)
    : options_(resolve_options(options, model, host_available_memory())),
      impl_(std::make_unique<Impl>(model, tokenizer, options_)) {
  impl_->totals.recording_seconds = impl_->runner.record_decode_steps();
  impl_->publish();
  impl_->output_thread = std::thread([impl = impl_.get()] { impl->output_loop(); });
  impl_->model_thread = std::thread([impl = impl_.get()] { impl->model_loop(); });
}

Engine::~Engine() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->wake.notify_one();
  impl_->model_thread.join();
  impl_->output_thread.join();
}

std::optional<uint64_t> Engine::submit(RequestParams params, EventSink sink) {
  impl_->validate(params);
  QINFER_CHECK(static_cast<bool>(sink), "request: the event sink is empty");
  auto request = std::make_shared<Impl::Request>();
  request->choices.resize(static_cast<size_t>(params.n));
  request->unfinished = params.n;
  request->limits = {params.max_tokens, options_.max_context, params.stop_ids, params.min_tokens,
                     params.banned_tokens, params.exclusive_tokens, params.prompt_logprobs};
  request->params = std::move(params);
  request->sink = std::move(sink);
  uint64_t id = 0;
  {
    std::lock_guard lock(impl_->mu);
    const int64_t waiting = impl_->published.waiting + static_cast<int64_t>(impl_->inbox.size());
    if (waiting >= options_.max_waiting) return std::nullopt;
    id = request->id = impl_->next_id++;
    impl_->unfinished.emplace(id, request);
    impl_->inbox.push_back(std::move(request));
  }
  impl_->wake.notify_one();
  return id;
}

void Engine::cancel(uint64_t id) {
  {
    std::lock_guard lock(impl_->mu);
    if (auto it = impl_->unfinished.find(id); it != impl_->unfinished.end())
      if (auto request = it->second.lock()) request->cancelled = true;
    impl_->cancels.push_back(id);
  }
  impl_->wake.notify_one();
}

EngineStats Engine::stats() const {
  std::lock_guard lock(impl_->mu);
  EngineStats s = impl_->published;
  s.waiting += static_cast<int64_t>(impl_->inbox.size());
  return s;
}

}  // namespace qinfer::engine
