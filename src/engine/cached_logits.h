#pragma once
// Prompt logits through the prefix cache: the oracle for reuse (`qinfer eval --mode cached:N`). An
// earlier request of the prompt's first N ids runs through the engine's block manager, scheduler
// and model runner, leaving what it computed (KV blocks and, for a model with recurrent state, its
// checkpoints) in the cache; the prompt then runs as a request of its own that starts from there.
#include <cstdint>
#include <vector>

#include "backend/tensor.h"
#include "models/model.h"

namespace qinfer::engine {

struct CachedLogits {
  // f32 [L, vocab]: rows [0, cached) are the earlier request's, the rest the prompt's own forwards.
  Tensor logits;
  int64_t cached = 0;  // prompt tokens the second request took from the cache
};

// `n` in 1..L. `checkpoint_interval` as SchedulerConfig's.
CachedLogits cached_prompt_logits(models::Runner& model, const std::vector<int32_t>& prompt, int64_t n,
                                  int32_t block_size = 16, int32_t checkpoint_interval = 1024);

}  // namespace qinfer::engine
