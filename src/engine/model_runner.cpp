#include "engine/model_runner.h"

#include <algorithm>
#include <chrono>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"

namespace qinfer::engine {

Tensor text_logits(Ops& ops, const Tensor& logits, int64_t text_vocab) {
  const int64_t rows = logits.dim(0);
  if (logits.dim(1) <= text_vocab) return logits;
  Tensor narrow = ops.alloc_output(DType::f32, {rows, text_vocab});
  ops.copy_columns(logits, 0, narrow, 0, text_vocab);
  return narrow;
}

std::vector<int32_t> decode_buckets(int32_t max_batch) {
  std::vector<int32_t> sizes;
  for (int32_t b = 1; b < max_batch;) {
    sizes.push_back(b);
    // Doubling up to 16, then a half step between doublings (24, 48, 96, ...): padding stays ≤ 1/3.
    const int32_t next = b < 16 ? 2 * b : (b & (b - 1)) == 0 ? b + b / 2 : b / 3 * 4;
    b = next;
  }
  sizes.push_back(max_batch);
  return sizes;
}

int32_t padding_rows(int32_t max_batch, bool records_steps) {
  return records_steps ? std::max(1, decode_padding(max_batch)) : 0;
}

int32_t decode_padding(int32_t max_batch) {
  const std::vector<int32_t> sizes = decode_buckets(max_batch);
  int32_t most = 0;
  for (size_t i = 1; i < sizes.size(); ++i) most = std::max(most, sizes[i] - sizes[i - 1] - 1);
  return most;
}

std::vector<int32_t> decode_widths(int32_t batch, int64_t max_context, int32_t block_size) {
  constexpr int64_t kShortContext = 4096, kTableEntries = int64_t{1} << 20;
  const int64_t most = (max_context + block_size - 1) / block_size;
  const int64_t narrow = std::min(most, (kShortContext + block_size - 1) / block_size);
  const int64_t wide = std::max(narrow, std::min(most, kTableEntries / batch));
  if (wide == narrow) return {static_cast<int32_t>(narrow)};
  return {static_cast<int32_t>(narrow), static_cast<int32_t>(wide)};
}

namespace {

ModelCache make_runner_cache(const models::Runner& model, const RunnerOptions& o) {
  QINFER_CHECK(o.kv_blocks > 0 && o.block_size > 0 && o.max_batch > 0 && o.max_context > 0 && o.text_vocab > 0,
               "model runner: blocks, block size, batch, context and vocabulary must be positive");
  // Past the block manager's: one block, and a slot per padding row of a decode step.
  const int32_t padding = o.state_slots > 0 ? padding_rows(o.max_batch, model.ops().records_steps()) : 0;
  return model.make_cache(o.kv_blocks + 1, o.block_size, o.state_slots + std::max(padding, 1));
}

}  // namespace

ModelRunner::ModelRunner(models::Runner& model, const RunnerOptions& options)
    : model_(model),
      options_(options),
      cache_(make_runner_cache(model, options)),
      records_(model.ops().records_steps()) {
  if (records_) buckets_ = decode_buckets(options.max_batch);
  if (options.host_blocks > 0 || options.host_checkpoints > 0)
    host_ = std::make_unique<HostTier>(cache_, options.host_blocks, options.host_checkpoints);
  // Every padding row writes its key and value into the one scratch block: what lands there is never read.
  for (int32_t i = 0; i < padding_rows(options.max_batch, records_); ++i)
    padding_.push_back({{static_cast<int32_t>(options.kv_blocks)}, 0,
                        options.state_slots > 0 ? static_cast<int32_t>(options.state_slots + i) : -1});
}

double ModelRunner::record_decode_steps() {
  if (buckets_.empty()) return 0;
  const auto start = std::chrono::steady_clock::now();
  ProgressBar progress("recording decode steps", buckets_.size(), ProgressBar::Unit::items);
  const size_t most = static_cast<size_t>(options_.max_batch);
  size_t recorded = 0;
  for (const int32_t bucket : buckets_) {
    // A key's first step runs as is, its second is recorded (Ops::begin_step). Its rows: padding rows
    // and, past those, the block manager's first slots (zero when nothing runs yet).
    for (const int32_t width : decode_widths(bucket, options_.max_context, options_.block_size)) {
      for (int run = 0; run < 2; ++run) {
        std::vector<SequenceCache> views(padding_.begin(), padding_.begin() + std::min(padding_.size(), most));
        for (int32_t slot = 0; views.size() < static_cast<size_t>(bucket); ++slot)
          views.push_back({{static_cast<int32_t>(options_.kv_blocks)}, 0, options_.state_slots > 0 ? slot : -1});
        views.resize(static_cast<size_t>(bucket));
        models::Batch batch;
        batch.block_table_width = width;
        for (SequenceCache& v : views) batch.sequences.push_back({{0}, &v, false});
        (void)to_host(model_.ops(), text_logits(model_.ops(), model_.forward(batch, cache_), options_.text_vocab));
        recorded += run;
      }
    }
    progress.advance();
  }
  progress.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log_info("recorded {} decode steps ({} batch sizes, 1..{}) in {:.2f} s", recorded, buckets_.size(), buckets_.back(),
           seconds);
  return seconds;
}

ModelRunner::Result ModelRunner::run(const StepPlan& plan, bool logprobs, bool all_rows) {
  model_.ops().begin_device_timing();
  Result result = run_step(plan, logprobs, all_rows);
  result.device_seconds = model_.ops().end_device_timing();
  return result;
}

ModelRunner::Result ModelRunner::run_step(const StepPlan& plan, bool logprobs, bool all_rows) {
  // In the scheduler's order: a slot a fork's parent copied from may be handed out again and zeroed,
  // a block or checkpoint is copied to the host before its new owner writes it.
  for (const StepPlan::SlotWork& w : plan.slot_work) {
    using Kind = CacheWork::Kind;
    if (w.kind != Kind::state) {
      QINFER_CHECK(host_ != nullptr, "model runner: host-tier work with no host tier");
      if (w.kind == Kind::save_block) host_->save_block(w.from, w.to);
      else if (w.kind == Kind::load_block) host_->load_block(w.from, w.to);
      else if (w.kind == Kind::save_state) host_->save_state(w.from, w.to);
      else host_->load_state(w.from, w.to);
      continue;
    }
    if (host_) host_->run();  // the queued copies go first
    if (w.from < 0) cache_.zero_slot(w.to);
    else cache_.copy_slot(w.from, w.to);
  }
  if (host_) host_->run();

  // A decode step is padded up to the next recorded batch size and block-table width, whose graph then
  // replays; one whose contexts are too long for the widest runs as is, unrecorded.
  size_t rows = plan.chunks.size();
  int32_t width = 0;
  if (records_ && plan.decode_only() && !all_rows) {
    const auto bucket = std::lower_bound(buckets_.begin(), buckets_.end(), static_cast<int32_t>(rows));
    QINFER_CHECK(bucket != buckets_.end(), "model runner: a decode step of {} sequences, past the largest batch {}",
                 rows, buckets_.back());
    size_t blocks = 0;
    for (const StepPlan::Chunk& c : plan.chunks) blocks = std::max(blocks, c.sequence->cache.blocks.size());
    for (const int32_t w : decode_widths(*bucket, options_.max_context, options_.block_size))
      if (width == 0 && blocks <= static_cast<size_t>(w)) width = w;
    if (width > 0) rows = static_cast<size_t>(*bucket);
  }
  // The forward advances copies of the caches; the scheduler's postprocess advances the sequences'.
  std::vector<SequenceCache> views;
  views.reserve(rows);  // never reallocated: the batch points into it
  models::Batch batch;
  for (const StepPlan::Chunk& c : plan.chunks) {
    const Sequence& s = *c.sequence;
    views.push_back(s.cache);
    const auto begin = s.tokens.begin() + s.cache.cached;
    batch.sequences.push_back(
        {std::vector<int32_t>(begin, begin + c.tokens), &views.back(), all_rows || c.prompt_rows, c.state_to, c.save_at,
         c.save_to});
  }
  for (size_t i = 0; views.size() < rows; ++i) {
    views.push_back(padding_.at(i));
    batch.sequences.push_back({{0}, &views.back(), false});
  }
  batch.block_table_width = width;
  batch.may_record = width > 0;
  Ops& ops = model_.ops();
  Tensor raw = model_.forward(batch, cache_);
  if (all_rows) return prompt_rows(plan, to_host(ops, raw));
  Tensor prompt_logits;
  if (std::any_of(plan.chunks.begin(), plan.chunks.end(), [](const StepPlan::Chunk& c) { return c.prompt_rows; }))
    raw = split_prompt_rows(plan, raw, prompt_logits);
  Tensor logits = text_logits(ops, raw, options_.text_vocab);

  // Rows that do not sample (prefill chunks, padding) take the cheap greedy pick.
  std::vector<SamplingParams> params(rows);
  std::vector<std::vector<int32_t>> history(rows);
  std::vector<uint64_t> steps(rows, 0);
  std::vector<size_t> sampling;
  for (size_t r = 0; r < plan.chunks.size(); ++r) {
    const StepPlan::Chunk& c = plan.chunks[r];
    if (!c.samples) continue;
    sampling.push_back(r);
    params[r] = c.sequence->sampling;
    if (has_penalties(params[r])) history[r] = c.sequence->tokens;  // the penalties are history's only use
    steps[r] = static_cast<uint64_t>(c.sequence->generated());
  }
  Result result;
  result.prompt_rows = std::move(prompt_logits);
  if (sampling.empty()) return result;
  // Masks are computed on the host while the device may still run the forward; logprobs wait for it.
  const GrammarRows grammars = grammar_rows(plan, sampling, logits.dim(1));
  if (logprobs) {  // the raw logits, before any grammar's mask
    const Tensor host = to_host(ops, logits);
    const int64_t vocab = host.dim(1);
    result.logits = host_tensor(DType::f32, {static_cast<int64_t>(sampling.size()), vocab});
    for (size_t i = 0; i < sampling.size(); ++i)
      std::copy_n(host.ptr<float>() + static_cast<int64_t>(sampling[i]) * vocab, vocab,
                  result.logits.ptr<float>() + static_cast<int64_t>(i) * vocab);
  }
  if (grammars.rows.data) ops.mask_logits(logits, to_backend(ops, grammars.rows), to_backend(ops, grammars.allowed));
  std::vector<int32_t> next;
  ops.sample(logits, params, history, steps, next);
  for (size_t r : sampling) result.ids.push_back(next[r]);
  return result;
}

ModelRunner::GrammarRows ModelRunner::grammar_rows(const StepPlan& plan, const std::vector<size_t>& sampling,
                                                   int64_t V) {
  // A row is masked when its grammar says what may follow, when it may not end yet (min_tokens), or
  // when logit_bias bans ids or allows only some.
  auto too_early = [](const Sequence& s) {
    return !s.limits->stop_ids.empty() && s.generated() < s.limits->min_tokens;
  };
  auto biased = [](const Sequence& s) {
    return !s.limits->banned_tokens.empty() || !s.limits->exclusive_tokens.empty();
  };
  std::vector<int32_t> rows;
  for (size_t r : sampling) {
    const Sequence& s = *plan.chunks[r].sequence;
    if (s.constraint || too_early(s) || biased(s)) rows.push_back(static_cast<int32_t>(r));
  }
  if (rows.empty()) return {};
  const int64_t words = (V + 31) / 32, R = static_cast<int64_t>(rows.size());
  Tensor allowed = host_tensor(DType::u32, {R, words});
  for (int64_t i = 0; i < R; ++i) {
    const Sequence& s = *plan.chunks[rows[i]].sequence;
    uint32_t* dst = allowed.ptr<uint32_t>() + i * words;
    if (s.constraint) {
      // The mask covers the tokenizer's ids; logits columns past them (none, after text_logits) stay out.
      const grammar::TokenBits& mask = s.constraint->mask();
      const int64_t n = std::min<int64_t>(words, static_cast<int64_t>(mask.size()));
      std::copy_n(mask.begin(), n, dst);
      std::fill(dst + n, dst + words, 0u);
    } else {
      std::fill(dst, dst + words, ~0u);
      if (V % 32) dst[words - 1] = (1u << (V % 32)) - 1;
    }
    if (biased(s)) {
      // Applied where something remains: a grammar's (or min_tokens') choice is never emptied.
      std::vector<uint32_t> kept(dst, dst + words);
      if (!s.limits->exclusive_tokens.empty()) {
        std::vector<uint32_t> only(static_cast<size_t>(words), 0u);
        for (const int32_t id : s.limits->exclusive_tokens)
          if (id >= 0 && id < V) only[static_cast<size_t>(id / 32)] |= 1u << (id % 32);
        for (size_t w = 0; w < kept.size(); ++w) kept[w] &= only[w];
      }
      for (const int32_t id : s.limits->banned_tokens)
        if (id >= 0 && id < V) kept[static_cast<size_t>(id / 32)] &= ~(1u << (id % 32));
      if (std::any_of(kept.begin(), kept.end(), [](uint32_t w) { return w != 0; })) std::copy(kept.begin(), kept.end(), dst);
    }
    if (too_early(s)) {
      // Stop ids out, unless they are all the grammar allows (a complete grammar ends the choice).
      std::vector<uint32_t> kept(dst, dst + words);
      for (const int32_t id : s.limits->stop_ids)
        if (id >= 0 && id < V) kept[static_cast<size_t>(id / 32)] &= ~(1u << (id % 32));
      if (std::any_of(kept.begin(), kept.end(), [](uint32_t w) { return w != 0; })) std::copy(kept.begin(), kept.end(), dst);
    }
  }
  Tensor row_ids = host_tensor(DType::i32, {R});
  std::copy(rows.begin(), rows.end(), row_ids.ptr<int32_t>());
  return {std::move(row_ids), std::move(allowed)};
}

Tensor ModelRunner::split_prompt_rows(const StepPlan& plan, const Tensor& raw, Tensor& out) const {
  // Rarely taken (evaluation): the rows go through the host, which computes their logprobs anyway.
  Ops& ops = model_.ops();
  const Tensor host = to_host(ops, raw);
  const int64_t vocab = host.dim(1), text = std::min(vocab, options_.text_vocab);
  int64_t prompt_rows = 0;
  for (const StepPlan::Chunk& c : plan.chunks) prompt_rows += c.prompt_rows ? c.tokens : 0;
  out = host_tensor(DType::f32, {prompt_rows, text});
  Tensor last = host_tensor(DType::f32, {static_cast<int64_t>(plan.chunks.size()), vocab});
  int64_t row = 0, kept = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const StepPlan::Chunk& c = plan.chunks[i];
    const int64_t rows = c.prompt_rows ? c.tokens : 1;
    for (int64_t r = 0; c.prompt_rows && r < rows; ++r)
      std::copy_n(host.ptr<float>() + (row + r) * vocab, text, out.ptr<float>() + (kept++) * text);
    std::copy_n(host.ptr<float>() + (row + rows - 1) * vocab, vocab, last.ptr<float>() + static_cast<int64_t>(i) * vocab);
    row += rows;
  }
  return to_backend(ops, last);
}

ModelRunner::Result ModelRunner::prompt_rows(const StepPlan& plan, Tensor rows) const {
  Result result;
  const int64_t vocab = rows.dim(1), text = std::min(vocab, options_.text_vocab);
  int64_t row = 0;
  for (const StepPlan::Chunk& c : plan.chunks) {
    row += c.tokens;
    if (!c.samples) continue;
    const float* last = rows.ptr<float>() + (row - 1) * vocab;
    result.ids.push_back(static_cast<int32_t>(std::max_element(last, last + text) - last));
  }
  result.rows = std::move(rows);
  return result;
}

}  // namespace qinfer::engine
