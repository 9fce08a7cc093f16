#pragma once
// The only code that runs the model for the engine: turns a step plan into a forward (token ids,
// each sequence's cache view), pads decode steps to a fixed ladder of batch sizes whose recordings
// (CUDA graphs) are made once at start-up, and samples each sampling chunk's row on the device.
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "cache/cache.h"
#include "cache/host_tier.h"
#include "engine/scheduler.h"
#include "models/model.h"

namespace qinfer::engine {

// The logits rows sampling chooses from: the columns of ids the tokenizer has. Checkpoints round
// vocab_size up (Qwen3: 151936 rows for 151669 tokens); those padding rows are no text, and a model
// that has not learned to keep them low (random weights) would sample them. `logits` itself when it
// has no such columns.
Tensor text_logits(Ops& ops, const Tensor& logits, int64_t text_vocab);

struct RunnerOptions {
  int64_t kv_blocks = 0;      // the block manager's blocks (the runner adds one scratch block)
  int32_t block_size = 16;
  int64_t state_slots = 0;    // the block manager's slots, its checkpoints' included (0: no recurrent
                              // state; else the runner adds decode_padding(max_batch) scratch slots)
  int32_t max_batch = 1;      // the largest decode batch (the scheduler's max_running)
  int64_t max_context = 0;    // tokens per sequence: the widest block table of a recorded decode step
  int64_t text_vocab = 0;     // logits columns that are text (text_logits)
  int64_t host_blocks = 0, host_checkpoints = 0;  // the prefix cache's host tier (HostTier)
};

// The decode batch sizes that get a recording: 1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, …
// (doubling with a half step between), up to and including max_batch. Each is recorded at two
// block-table widths (decode_widths): contexts up to 4096 tokens, and up to the longest one whose
// table of `batch` rows stays within 1M entries (4 MB staged a step); a decode step past that runs
// unrecorded.
std::vector<int32_t> decode_buckets(int32_t max_batch);
// The most padding rows a decode step of at most max_batch sequences gets (63 for 256). Each has a
// recurrent-state slot of its own: a batch's sequences never share one (Ops::conv1d_causal).
int32_t decode_padding(int32_t max_batch);
// The padding rows the model runner keeps (a scratch block each, and a scratch slot past the block
// manager's where the model has state): decode_padding, at least one, where steps are recorded;
// none where they are not (nothing is padded).
int32_t padding_rows(int32_t max_batch, bool records_steps);
// The block-table widths a decode step of `batch` rows is recorded at, narrowest first (one when equal).
std::vector<int32_t> decode_widths(int32_t batch, int64_t max_context, int32_t block_size);

class ModelRunner {
 public:
  ModelRunner(models::Runner& model, const RunnerOptions& options);

  // Runs each bucket's decode step on scratch sequences so that the backend records it (where it
  // records steps at all), with a progress bar; returns the seconds it took. Serving then replays.
  double record_decode_steps();

  struct Result {
    std::vector<int32_t> ids;  // one per sampling chunk, in plan order
    Tensor logits;             // with `logprobs`: host f32 [sampling chunks, text vocab], raw (for logprobs)
    std::optional<double> device_seconds;  // the step's time on the device (Ops::end_device_timing)
    // With all_rows: host f32 [plan tokens, vocab], the logits of every position of every chunk in
    // plan order (raw: every column of the model's vocabulary).
    Tensor rows;
    // The prompt_rows chunks' logits: host f32 [their tokens, text vocab], every position of each in
    // plan order (raw: before any mask).
    Tensor prompt_rows;
  };
  // Applies the plan's slot work, runs its forward, saves the checkpoints it asks for and samples
  // each sampling chunk's row (its seeded draw at step = tokens generated so far). `all_rows`: the
  // logits of every position too (prompt evaluation), from an unpadded, unrecorded step, and each
  // sampling chunk takes its greedy pick (lowest id on ties) instead of sampling.
  Result run(const StepPlan& plan, bool logprobs, bool all_rows = false);

 private:
  Result run_step(const StepPlan& plan, bool logprobs, bool all_rows);
  // Each constrained sampling row's grammar mask, for Ops::mask_logits over V logits columns (host
  // tensors; none where no row is constrained).
  struct GrammarRows {
    Tensor rows, allowed;
  };
  static GrammarRows grammar_rows(const StepPlan& plan, const std::vector<size_t>& sampling, int64_t V);
  // The all_rows result: `rows` as they came, each sampling chunk's greedy pick from its last row.
  Result prompt_rows(const StepPlan& plan, Tensor rows) const;
  // A forward's logits with prompt_rows chunks: those chunks' rows into `out`, and the logits with
  // one row per chunk (its last) that sampling takes, on the device.
  Tensor split_prompt_rows(const StepPlan& plan, const Tensor& raw, Tensor& out) const;

  models::Runner& model_;
  RunnerOptions options_;
  ModelCache cache_;
  std::unique_ptr<HostTier> host_;  // null without a host tier
  bool records_;
  std::vector<int32_t> buckets_;
  std::vector<SequenceCache> padding_;  // padding rows: the scratch block, a scratch slot each
};

}  // namespace qinfer::engine
