#include "engine/scheduler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "core/error.h"
#include "core/log.h"
#include "engine/generate.h"
#include "engine/text_stream.h"

namespace qinfer::engine {
namespace {

int64_t blocks_for(int64_t tokens, int64_t block_size) { return (tokens + block_size - 1) / block_size; }

// log-softmax of one raw logits row at `token`, and the `top` most likely ids (lower id first on ties).
TokenLogprob logprob_of(const float* row, int64_t vocab, int32_t token, int32_t top) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t v = 0; v < vocab; ++v)
    if (row[v] > max) max = row[v];
  double sum = 0;
  for (int64_t v = 0; v < vocab; ++v)
    if (!std::isnan(row[v])) sum += std::exp(static_cast<double>(row[v]) - max);
  const double log_total = max + std::log(sum);
  TokenLogprob out{token, static_cast<float>(row[token] - log_total), {}};
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

}  // namespace

int64_t kv_blocks_in_memory(const CacheShape& s, const SchedulerOptions& o, uint64_t free_bytes) {
  const double block_bytes = 2.0 * static_cast<double>(s.attention_layers * o.block_size * s.kv_heads * s.head_dim) * 4;
  const double state_bytes = static_cast<double>(o.max_running) * static_cast<double>(s.linear_layers) * 4.0 *
                             static_cast<double>(s.conv_window * s.conv_channels +
                                                 s.value_heads * s.value_head_dim * s.key_head_dim);
  const double budget = static_cast<double>(free_bytes) * o.memory_fraction - state_bytes;
  QINFER_CHECK(budget >= block_bytes,
               "scheduler: {:.2f} GB of free device memory x memory fraction {} leaves no room for the KV cache after "
               "{:.2f} GB of recurrent state for {} sequences (lower --max-running or raise --memory-fraction)",
               static_cast<double>(free_bytes) / 1e9, o.memory_fraction, state_bytes / 1e9, o.max_running);
  if (block_bytes == 0) return std::numeric_limits<int64_t>::max();  // no attention layers: nothing to hold
  return static_cast<int64_t>(budget / block_bytes);
}

namespace {

SchedulerOptions resolve(const SchedulerOptions& o, const models::Runner& model) {
  const int64_t positions = model.config().max_position_embeddings;
  QINFER_CHECK(o.block_size > 0, "scheduler: block_size must be positive, got {}", o.block_size);
  QINFER_CHECK(o.max_running > 0, "scheduler: max_running must be positive, got {}", o.max_running);
  QINFER_CHECK(o.max_waiting > 0, "scheduler: max_waiting must be positive, got {}", o.max_waiting);
  QINFER_CHECK(o.step_token_budget >= o.max_running,
               "scheduler: step_token_budget ({}) must be at least max_running ({}) so that every running "
               "sequence can decode in each step",
               o.step_token_budget, o.max_running);
  QINFER_CHECK(o.max_context >= 0 && o.max_context <= positions,
               "scheduler: max_context {} is outside 0..{} (the model's max_position_embeddings)", o.max_context,
               positions);
  QINFER_CHECK(o.kv_blocks >= 0, "scheduler: kv_blocks must not be negative, got {}", o.kv_blocks);
  QINFER_CHECK(o.memory_fraction > 0 && o.memory_fraction <= 1, "scheduler: memory_fraction {} is outside (0, 1]",
               o.memory_fraction);
  SchedulerOptions r = o;
  if (r.max_context == 0) r.max_context = positions;
  if (r.kv_blocks == 0) {
    r.kv_blocks = r.max_running * blocks_for(r.max_context, r.block_size);
    // On a device with its own memory, the pool takes what is free (after the weights), not more.
    if (const std::optional<uint64_t> free = model.ops().free_memory()) {
      r.kv_blocks = std::min(r.kv_blocks, kv_blocks_in_memory(model.cache_shape(), r, *free));
      log_info("scheduler: {} KV blocks of {} tokens in {:.2f} GB of free device memory", r.kv_blocks, r.block_size,
               static_cast<double>(*free) / 1e9);
    }
  }
  return r;
}

}  // namespace

struct Scheduler::Impl {
  struct Request {
    struct Choice {
      bool finished = false;  // its finished event is in the outbox or delivered
      int64_t cached_prompt_tokens = 0, completion_tokens = 0;
    };
    uint64_t id = 0;
    RequestParams params;
    EventSink sink;
    std::vector<Choice> choices;
    bool admitted = false;    // counted in prompt_tokens_total
    bool sink_threw = false;  // only finished events reach the sink after that
  };

  // One choice of a request: what the cache must hold, and where its text stream stands.
  struct Sequence {
    enum class State { running, preempted, gone };
    std::shared_ptr<Request> request;
    int32_t choice = 0;
    std::vector<int32_t> tokens;  // prompt + generated; the cache holds tokens[0, cache.cached)
    SequenceCache cache;
    SamplingParams sampling;
    TextStream text;
    // Choice 0 of an n > 1 request: choices 1..forks branch off once the cache holds fork_at tokens
    // (the whole blocks before the last prompt token), sharing those blocks and the recurrent state.
    int32_t forks = 0, fork_at = 0;
    int32_t chunk = 0;  // tokens in this step's batch
    State state = State::running;

    int32_t remaining() const { return static_cast<int32_t>(tokens.size()) - cache.cached; }
    int32_t generated() const {
      return static_cast<int32_t>(tokens.size() - request->params.prompt.size());
    }
  };

  struct Outgoing {
    std::shared_ptr<Request> request;
    Event event;
  };

  Impl(models::Runner& model, const tokenizer::Tokenizer& tokenizer, const SchedulerOptions& options)
      : model(model),
        tokenizer(tokenizer),
        options(options),
        cache(model.make_cache(options.kv_blocks, options.block_size, options.max_running)),
        recurrent(model.cache_shape().linear_layers > 0) {}

  void validate(const RequestParams& p) const;
  std::unique_ptr<Sequence> make_sequence(const std::shared_ptr<Request>& request, int32_t choice) const;

  void loop();
  void step();
  void admit();
  std::vector<Sequence*> build_batch();
  bool make_room(Sequence& s);
  void preempt(Sequence& s);
  void fork(Sequence& parent);
  void advance(Sequence& s, int32_t token, const float* logits_row, int64_t vocab);
  void finish(Sequence& s, const std::string& reason);
  void finish_choice(const std::shared_ptr<Request>& request, int32_t choice, const std::string& reason,
                     const std::string& error);
  void end_request(const std::shared_ptr<Request>& request, const std::string& reason, const std::string& error);
  void cancel_now(uint64_t id);
  void compact();
  void publish();
  void deliver();

  models::Runner& model;
  const tokenizer::Tokenizer& tokenizer;
  const SchedulerOptions options;
  ModelCache cache;
  const bool recurrent;

  // Shared with submit(), cancel() and stats(): under mu.
  mutable std::mutex mu;
  std::condition_variable wake;
  std::deque<std::unique_ptr<Sequence>> waiting;
  std::vector<uint64_t> cancels;
  bool stopping = false;
  uint64_t next_id = 1;
  SchedulerStats published;  // everything but `waiting`, as of the last step

  // The scheduler thread's own.
  std::vector<std::unique_ptr<Sequence>> running;  // admission order: the last is the youngest
  std::vector<Outgoing> outbox;                    // events of this step, delivered without the lock
  int64_t prompt_tokens_total = 0, completion_tokens_total = 0, preemptions_total = 0;
  std::thread thread;
};

void Scheduler::Impl::validate(const RequestParams& p) const {
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
  QINFER_CHECK(p.n >= 1 && p.n <= options.max_running,
               "request: n must be between 1 and {} (the scheduler's max_running), got {}", options.max_running, p.n);
  QINFER_CHECK(p.top_logprobs >= -1 && p.top_logprobs <= 20,
               "request: top_logprobs must be between 0 and 20 (or -1: none), got {}", p.top_logprobs);
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

std::unique_ptr<Scheduler::Impl::Sequence> Scheduler::Impl::make_sequence(const std::shared_ptr<Request>& request,
                                                                          int32_t choice) const {
  const RequestParams& p = request->params;
  SamplingParams sampling = p.sampling;
  sampling.seed += static_cast<uint64_t>(choice);
  return std::make_unique<Sequence>(
      Sequence{request, choice, p.prompt, SequenceCache{}, sampling, TextStream(tokenizer, p.stop)});
}

void Scheduler::Impl::loop() {
  while (true) {
    std::vector<uint64_t> cancelled;
    bool stop = false;
    {
      std::unique_lock lock(mu);
      wake.wait(lock, [&] { return stopping || !cancels.empty() || !waiting.empty() || !running.empty(); });
      cancelled.swap(cancels);
      stop = stopping;
    }
    if (stop) {
      // Until the queue stays empty: a sink may still submit while its request is being cancelled.
      while (true) {
        std::deque<std::unique_ptr<Sequence>> queued;
        {
          std::lock_guard lock(mu);
          queued.swap(waiting);
        }
        if (queued.empty() && running.empty()) return;
        for (auto& s : queued) end_request(s->request, "cancelled", "");
        for (auto& s : running)
          if (s->state != Sequence::State::gone) end_request(s->request, "cancelled", "");
        compact();
        publish();
        deliver();
      }
    }
    for (uint64_t id : cancelled) cancel_now(id);
    try {
      compact();
      step();
    } catch (const std::exception& e) {
      // A bug outside the model step: the running requests' state is unknown, end them.
      for (auto& s : running)
        if (s->state != Sequence::State::gone)
          end_request(s->request, "error", fmt::format("the scheduler step failed: {}", e.what()));
    }
    compact();
    publish();
    deliver();
  }
}

void Scheduler::Impl::step() {
  admit();
  std::vector<Sequence*> batch = build_batch();
  if (batch.empty()) return;
  Tensor logits;
  std::vector<int32_t> next;
  std::vector<size_t> ready;  // rows whose sequence has its whole context cached: they sample
  try {
    models::Batch b;
    for (Sequence* s : batch) {
      const auto begin = s->tokens.begin() + s->cache.cached;
      b.sequences.push_back({std::vector<int32_t>(begin, begin + s->chunk), &s->cache, false});
    }
    logits = text_logits(model.ops(), model.forward(b, cache), tokenizer);

    std::vector<SamplingParams> params(batch.size());  // greedy (cheap) for rows that do not sample
    std::vector<std::vector<int32_t>> history(batch.size());
    std::vector<uint64_t> steps(batch.size(), 0);
    for (size_t r = 0; r < batch.size(); ++r) {
      const Sequence& s = *batch[r];
      if (s.remaining() != 0) continue;
      ready.push_back(r);
      params[r] = s.sampling;
      if (has_penalties(s.sampling)) history[r] = s.tokens;  // the penalties are history's only use
      steps[r] = static_cast<uint64_t>(s.generated());
    }
    if (!ready.empty()) model.ops().sample(logits, params, history, steps, next);
  } catch (const std::exception& e) {
    // The cache of every sequence in the batch may be half-written: end their requests.
    for (Sequence* s : batch)
      if (s->state == Sequence::State::running)
        end_request(s->request, "error", fmt::format("the model step running this request failed: {}", e.what()));
    return;
  }
  for (Sequence* s : batch) {
    s->chunk = 0;
    if (s->state == Sequence::State::running && s->forks > 0 && s->cache.cached == s->fork_at) {
      try {
        fork(*s);
      } catch (const std::exception& e) {
        end_request(s->request, "error", fmt::format("branching the {} choices failed: {}", s->forks + 1, e.what()));
      }
    }
  }
  const int64_t vocab = logits.dim(1);
  // Logprobs read the logits in host memory: a device backend copies them only when asked for.
  const bool logprobs = std::any_of(ready.begin(), ready.end(),
                                    [&](size_t r) { return batch[r]->request->params.top_logprobs >= 0; });
  const Tensor host_logits = logprobs ? to_host(model.ops(), logits) : Tensor{};
  for (size_t r : ready) {
    Sequence& s = *batch[r];
    if (s.state != Sequence::State::running) continue;
    try {
      advance(s, next[r], logprobs ? host_logits.ptr<float>() + static_cast<int64_t>(r) * vocab : nullptr, vocab);
    } catch (const std::exception& e) {
      end_request(s.request, "error", fmt::format("processing a generated token failed: {}", e.what()));
    }
  }
}

void Scheduler::Impl::admit() {
  // Running places and KV blocks already spoken for: pending branches and unprefilled tokens.
  int64_t places = 0, promised = 0;
  auto blocks_wanted = [&](const Sequence& s) {
    const int64_t own = blocks_for(static_cast<int64_t>(s.tokens.size()), options.block_size);
    const int64_t branch = own - s.fork_at / options.block_size;
    return std::max<int64_t>(0, own - static_cast<int64_t>(s.cache.blocks.size())) + s.forks * branch;
  };
  for (const auto& s : running) {
    places += 1 + s->forks;
    promised += blocks_wanted(*s);
  }
  std::lock_guard lock(mu);
  // Strictly first come, first served: the head waits until it fits, and everything behind it too.
  while (!waiting.empty()) {
    Sequence& s = *waiting.front();
    const int64_t blocks = blocks_wanted(s);
    if (places + 1 + s.forks > options.max_running) break;
    if (!running.empty() && blocks > cache.free_blocks() - promised) break;
    places += 1 + s.forks;
    promised += blocks;
    if (!s.request->admitted) {
      s.request->admitted = true;
      prompt_tokens_total += static_cast<int64_t>(s.request->params.prompt.size());
    }
    running.push_back(std::move(waiting.front()));
    waiting.pop_front();
    if (running.back()->forks > 0 && running.back()->fork_at == 0) fork(*running.back());
  }
}

std::vector<Scheduler::Impl::Sequence*> Scheduler::Impl::build_batch() {
  std::vector<Sequence*> batch;
  while (true) {
    int64_t budget = options.step_token_budget;
    // Decodes first, oldest first: each needs one token and, at a block boundary, one block.
    for (size_t i = 0; i < running.size() && budget > 0; ++i) {
      Sequence& s = *running[i];
      if (s.state != Sequence::State::running || s.remaining() != 1 || !make_room(s)) continue;
      s.chunk = 1;
      batch.push_back(&s);
      --budget;
    }
    // Then prefill chunks, oldest first, as far as the budget and the free blocks go.
    for (size_t i = 0; i < running.size() && budget > 0; ++i) {
      Sequence& s = *running[i];
      if (s.state != Sequence::State::running || s.chunk > 0) continue;
      int64_t chunk = std::min<int64_t>(s.remaining(), budget);
      if (s.forks > 0) chunk = std::min<int64_t>(chunk, s.fork_at - s.cache.cached);  // branch at fork_at
      const int64_t room =
          (static_cast<int64_t>(s.cache.blocks.size()) + cache.free_blocks()) * options.block_size - s.cache.cached;
      chunk = std::min(chunk, room);
      if (chunk <= 0) continue;
      s.chunk = static_cast<int32_t>(chunk);
      s.cache.reserve(cache, s.chunk);
      batch.push_back(&s);
      budget -= chunk;
    }
    if (!batch.empty()) return batch;
    // Nothing could move (prefills holding the blocks each other need): free the youngest and retry.
    auto youngest = std::find_if(running.rbegin(), running.rend(),
                                 [](const auto& s) { return s->state == Sequence::State::running; });
    if (youngest == running.rend()) return batch;
    preempt(**youngest);
  }
}

bool Scheduler::Impl::make_room(Sequence& s) {
  while (blocks_for(s.cache.cached + 1, options.block_size) >
         static_cast<int64_t>(s.cache.blocks.size()) + cache.free_blocks()) {
    // Recompute preemption: the youngest running sequence gives its blocks back (possibly s itself).
    Sequence& victim = **std::find_if(running.rbegin(), running.rend(),
                                      [](const auto& v) { return v->state == Sequence::State::running; });
    preempt(victim);
    if (&victim == &s) return false;
  }
  s.cache.reserve(cache, 1);
  return true;
}

void Scheduler::Impl::preempt(Sequence& s) {
  s.cache.release(cache);
  s.chunk = 0;
  s.state = Sequence::State::preempted;
  ++preemptions_total;
}

void Scheduler::Impl::fork(Sequence& parent) {
  Request& request = *parent.request;
  std::optional<ModelCache::StateSnapshot> state;
  if (recurrent && parent.fork_at > 0) state = cache.snapshot(parent.cache.slot);
  const int32_t forks = parent.forks;
  parent.forks = 0;
  for (int32_t c = 1; c <= forks; ++c) {
    std::unique_ptr<Sequence> s = make_sequence(parent.request, c);
    if (parent.fork_at > 0) {
      // Whole blocks only: the tail that follows fork_at goes to each choice's own new block.
      for (int32_t b : parent.cache.blocks) {
        cache.retain_block(b);
        s->cache.blocks.push_back(b);
      }
      s->cache.cached = parent.fork_at;
      if (state) {
        s->cache.slot = cache.allocate_slot();
        cache.restore(s->cache.slot, *state);
      }
      request.choices[c].cached_prompt_tokens = parent.fork_at;
    }
    running.push_back(std::move(s));
  }
}

void Scheduler::Impl::advance(Sequence& s, int32_t token, const float* logits_row, int64_t vocab) {
  const RequestParams& p = s.request->params;
  ++s.request->choices[s.choice].completion_tokens;
  ++completion_tokens_total;
  if (std::find(p.stop_ids.begin(), p.stop_ids.end(), token) != p.stop_ids.end()) {
    if (std::string rest = s.text.finish(); !rest.empty())
      outbox.push_back({s.request, Event{Event::Kind::delta, s.choice, std::move(rest)}});
    finish(s, "stop");
    return;
  }
  Event delta{Event::Kind::delta, s.choice, s.text.push(token), {token}};
  if (p.top_logprobs >= 0) delta.logprobs.push_back(logprob_of(logits_row, vocab, token, p.top_logprobs));
  s.tokens.push_back(token);
  const bool length =
      s.generated() >= p.max_tokens || static_cast<int64_t>(s.tokens.size()) >= options.max_context;
  if (!s.text.stopped() && length) delta.text += s.text.finish();
  outbox.push_back({s.request, std::move(delta)});
  if (s.text.stopped()) finish(s, "stop");
  else if (length) finish(s, "length");
}

void Scheduler::Impl::finish(Sequence& s, const std::string& reason) {
  s.cache.release(cache);
  s.state = Sequence::State::gone;
  finish_choice(s.request, s.choice, reason, "");
}

void Scheduler::Impl::finish_choice(const std::shared_ptr<Request>& request, int32_t choice,
                                    const std::string& reason, const std::string& error) {
  Request::Choice& c = request->choices[choice];
  if (c.finished) return;
  c.finished = true;
  Event e{Event::Kind::finished, choice};
  e.finish_reason = reason;
  e.error = error;
  e.prompt_tokens = static_cast<int64_t>(request->params.prompt.size());
  e.cached_prompt_tokens = c.cached_prompt_tokens;
  e.completion_tokens = c.completion_tokens;
  outbox.push_back({request, std::move(e)});
}

void Scheduler::Impl::end_request(const std::shared_ptr<Request>& request, const std::string& reason,
                                  const std::string& error) {
  for (auto& s : running)
    if (s->request == request && s->state != Sequence::State::gone) {
      s->cache.release(cache);
      s->state = Sequence::State::gone;
    }
  {
    std::lock_guard lock(mu);
    std::erase_if(waiting, [&](const auto& s) { return s->request == request; });
  }
  for (int32_t c = 0; c < static_cast<int32_t>(request->choices.size()); ++c) finish_choice(request, c, reason, error);
}

void Scheduler::Impl::cancel_now(uint64_t id) {
  std::shared_ptr<Request> request;
  for (const auto& s : running)
    if (s->request->id == id && s->state != Sequence::State::gone) request = s->request;
  if (!request) {
    std::lock_guard lock(mu);
    for (const auto& s : waiting)
      if (s->request->id == id) request = s->request;
  }
  if (request) end_request(request, "cancelled", "");
}

void Scheduler::Impl::compact() {
  // Preempted sequences go back to the front of the queue, the oldest first, to be recomputed.
  std::vector<std::unique_ptr<Sequence>> kept, preempted;
  for (auto& s : running) {
    if (s->state == Sequence::State::running) kept.push_back(std::move(s));
    else if (s->state == Sequence::State::preempted) {
      s->state = Sequence::State::running;
      preempted.push_back(std::move(s));
    }
  }
  running = std::move(kept);
  if (preempted.empty()) return;
  std::lock_guard lock(mu);
  for (auto it = preempted.rbegin(); it != preempted.rend(); ++it) waiting.push_front(std::move(*it));
}

void Scheduler::Impl::publish() {
  SchedulerStats s;
  for (const auto& seq : running) s.running += seq->state == Sequence::State::running;
  s.kv_blocks_total = options.kv_blocks;
  s.kv_blocks_used = options.kv_blocks - cache.free_blocks();
  s.state_slots_total = recurrent ? options.max_running : 0;
  s.state_slots_used = recurrent ? options.max_running - cache.free_slots() : 0;
  s.prompt_tokens_total = prompt_tokens_total;
  s.completion_tokens_total = completion_tokens_total;
  s.preemptions_total = preemptions_total;
  std::lock_guard lock(mu);
  published = s;
}

void Scheduler::Impl::deliver() {
  while (!outbox.empty()) {
    std::vector<Outgoing> out;
    out.swap(outbox);
    std::vector<std::pair<std::shared_ptr<Request>, std::string>> broken;
    for (Outgoing& o : out) {
      Request& r = *o.request;
      if (r.sink_threw && o.event.kind != Event::Kind::finished) continue;
      std::string what;
      try {
        r.sink(o.event);
        continue;
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
        what = "an exception that is not a std::exception";
      }
      if (!r.sink_threw) broken.emplace_back(o.request, what);
      r.sink_threw = true;
    }
    // A sink that throws ends its request; its unfinished choices still get their finished event.
    for (auto& [request, what] : broken) end_request(request, "error", "the request's event sink threw: " + what);
    compact();
    publish();
  }
}

Scheduler::Scheduler(models::Runner& model, const tokenizer::Tokenizer& tokenizer, const SchedulerOptions& options)
    : options_(resolve(options, model)), impl_(std::make_unique<Impl>(model, tokenizer, options_)) {
  impl_->publish();
  impl_->thread = std::thread([impl = impl_.get()] { impl->loop(); });
}

Scheduler::~Scheduler() {
  {
    std::lock_guard lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->wake.notify_one();
  impl_->thread.join();
}

std::optional<uint64_t> Scheduler::submit(RequestParams params, EventSink sink) {
  impl_->validate(params);
  QINFER_CHECK(static_cast<bool>(sink), "request: the event sink is empty");
  auto request = std::make_shared<Impl::Request>();
  request->choices.resize(static_cast<size_t>(params.n));
  request->params = std::move(params);
  request->sink = std::move(sink);
  std::unique_ptr<Impl::Sequence> first = impl_->make_sequence(request, 0);
  const int32_t prompt = static_cast<int32_t>(request->params.prompt.size());
  first->forks = request->params.n - 1;
  if (first->forks > 0) first->fork_at = (prompt - 1) / options_.block_size * options_.block_size;
  uint64_t id = 0;
  {
    std::lock_guard lock(impl_->mu);
    if (static_cast<int64_t>(impl_->waiting.size()) >= options_.max_waiting) return std::nullopt;
    id = request->id = impl_->next_id++;
    impl_->waiting.push_back(std::move(first));
  }
  impl_->wake.notify_one();
  return id;
}

void Scheduler::cancel(uint64_t id) {
  {
    std::lock_guard lock(impl_->mu);
    impl_->cancels.push_back(id);
  }
  impl_->wake.notify_one();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(impl_->mu);
  SchedulerStats s = impl_->published;
  s.waiting = static_cast<int64_t>(impl_->waiting.size());
  return s;
}

}  // namespace qinfer::engine
