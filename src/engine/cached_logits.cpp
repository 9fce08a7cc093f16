#include "engine/cached_logits.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "core/error.h"
#include "engine/block_manager.h"
#include "engine/model_runner.h"
#include "engine/scheduler.h"

namespace qinfer::engine {

CachedLogits cached_prompt_logits(models::Runner& model, const std::vector<int32_t>& prompt, int64_t n,
                                  int32_t block_size, int32_t checkpoint_interval) {
  const auto L = static_cast<int64_t>(prompt.size());
  QINFER_CHECK(L > 0, "the prompt is empty");
  QINFER_CHECK(n >= 1 && n <= L, "cached:{}: the earlier request's length must be in 1..{} (the prompt's)", n, L);
  const int64_t vocab = model.config().vocab_size;
  const bool state = model.cache_shape().linear_layers > 0;
  // Room for both requests' blocks at once, and a checkpoint for every block.
  const int64_t blocks = 2 * ((L + block_size - 1) / block_size + 1);
  BlockManager manager(blocks, block_size, state ? 1 : 0, /*prefix_caching=*/true, state ? blocks + 1 : 0);
  const int32_t budget = std::max<int32_t>(2048, checkpoint_interval);
  Scheduler scheduler({.max_running = 1, .step_token_budget = budget, .checkpoint_interval = checkpoint_interval},
                      manager);
  ModelRunner runner(model, {blocks, block_size, manager.total_slots() + manager.total_checkpoints(), 1, L + 1, vocab});

  CachedLogits out{host_tensor(DType::f32, {L, vocab}), 0};
  const SequenceLimits limits{1, L + 1, {}};
  for (int pass = 0; pass < 2; ++pass) {
    auto s = std::make_unique<Sequence>();
    s->request = static_cast<uint64_t>(pass + 1);
    s->tokens.assign(prompt.begin(), prompt.begin() + (pass == 0 ? n : L));
    s->prompt_tokens = static_cast<int32_t>(s->tokens.size());
    s->limits = &limits;
    scheduler.add(std::move(s));
    while (!scheduler.idle()) {
      const StepPlan plan = scheduler.schedule();
      QINFER_CHECK(!plan.empty(), "cached:{}: the scheduler planned nothing", n);
      ModelRunner::Result result = runner.run(plan, false, /*all_rows=*/true);
      int64_t row = 0;
      for (const StepPlan::Chunk& c : plan.chunks) {
        const int64_t first = c.sequence->cache.cached;
        if (pass == 1 && first + c.tokens <= L) out.cached = c.sequence->cached_prompt_tokens;
        // The earlier request's rows stand for the positions the prompt took from the cache.
        const int64_t from = pass == 0 ? first : std::max(first, out.cached);
        for (int64_t p = from; p < first + c.tokens && p < L; ++p)
          std::memcpy(out.logits.ptr<float>() + p * vocab, result.rows.ptr<float>() + (row + p - first) * vocab,
                      static_cast<size_t>(vocab) * sizeof(float));
        row += c.tokens;
      }
      (void)scheduler.postprocess(plan, result.ids);
    }
  }
  return out;
}

}  // namespace qinfer::engine
