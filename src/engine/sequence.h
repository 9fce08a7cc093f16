#pragma once
// One choice of one request as the engine tracks it: its tokens (prompt + generated), where its
// cache stands, how it samples, and whether it waits, runs or has finished.
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/sampling.h"
#include "cache/cache.h"
#include "grammar/mask.h"

namespace qinfer::engine {

// What every choice of a request shares, fixed at submit.
struct SequenceLimits {
  int32_t max_tokens = 256;        // completion tokens
  int64_t max_context = 0;         // prompt + completion
  std::vector<int32_t> stop_ids;   // ids that end the choice (not part of the output)
  int32_t min_tokens = 0;          // stop_ids are masked out before this many completion tokens
  std::vector<int32_t> banned_tokens, exclusive_tokens;  // RequestParams' (logit_bias)
  int32_t prompt_logprobs = -1;    // RequestParams': ≥ 0 asks for the logits of every prompt position
};

struct Sequence {
  enum class Status { waiting, running, finished };

  uint64_t request = 0;  // the engine's request id
  int32_t choice = 0;
  std::vector<int32_t> tokens;  // prompt + generated; the cache holds tokens[0, cache.cached)
  int32_t prompt_tokens = 0;
  SequenceCache cache;
  SamplingParams sampling;  // the request's, with seed + choice
  const SequenceLimits* limits = nullptr;
  // Choice 0 of an n > 1 request: choices 1..forks branch off once its cache holds fork_at tokens (the
  // whole blocks before the last prompt token), sharing those blocks and a copy of the recurrent state.
  int32_t forks = 0, fork_at = 0;
  int32_t cached_prompt_tokens = 0;  // prompt tokens this choice did not compute itself
  // Prompt logprobs: the prompt positions whose logits rows a step has returned (position p's row
  // scores prompt token p + 1, so positions 0 .. prompt_tokens - 2 are wanted). A recompute after
  // preemption does not return them again.
  int32_t prompt_rows_done = 0;
  // Checkpoints of the recurrent state (a model with state, with a prefix cache): the whole blocks
  // after which its prefill saves one for good (where the cached path it followed goes on without
  // a checkpoint: the junction; its last whole block before its last token), and the deepest whole
  // block after which the cache already has its state (one it started from or kept). Past that, its
  // rolling slot: each step from a block boundary writes the state there and leaves the state it read
  // behind in the other slot (the two swap), so the rolling slot holds the state after the last
  // boundary it passed (`rolling_blocks`), attached when it lets go of its blocks.
  int64_t junction_blocks = 0, end_blocks = 0, kept_blocks = 0;
  int32_t rolling = -1;
  int64_t rolling_blocks = 0;
  Status status = Status::waiting;
  // Constrained decoding: the grammar state of this choice's output (null: unconstrained). Its
  // mask is applied to the choice's logits before sampling; the sampled token advances it.
  std::unique_ptr<grammar::TokenConstraint> constraint;

  int32_t generated() const { return static_cast<int32_t>(tokens.size()) - prompt_tokens; }
  // Tokens the model has yet to read: 1 while decoding, more while prefilling.
  int32_t uncached() const { return static_cast<int32_t>(tokens.size()) - cache.cached; }
  bool finished() const { return status == Status::finished; }
  // Its prefill must return every position's logits: it takes nothing from the prefix cache.
  bool wants_prompt_rows() const { return limits->prompt_logprobs >= 0 && prompt_rows_done < prompt_tokens - 1; }
};

}  // namespace qinfer::engine
