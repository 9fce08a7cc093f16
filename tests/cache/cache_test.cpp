// Caches: block accounting, slot lifetime, and recurrent-state snapshot / restore as rollback uses it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "cache/cache.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "models/eval.h"

namespace qinfer {
namespace {

CacheShape hybrid_shape() {
  return CacheShape{.attention_layers = 1, .kv_heads = 2, .head_dim = 4, .linear_layers = 2, .conv_channels = 6,
                    .conv_window = 3, .value_heads = 2, .value_head_dim = 4, .key_head_dim = 4};
}

TEST(ModelCache, BlocksAreReferenceCountedAndExhaustionIsAnError) {
  auto ops = make_ref_ops();
  ModelCache cache(*ops, hybrid_shape(), 3, 4, 1);
  int32_t a = cache.allocate_block(), b = cache.allocate_block(), c = cache.allocate_block();
  EXPECT_EQ(cache.free_blocks(), 0);
  EXPECT_THROW(cache.allocate_block(), Error);
  cache.retain_block(b);  // shared by a second sequence
  cache.release_block(b);
  EXPECT_EQ(cache.free_blocks(), 0);
  cache.release_block(b);
  EXPECT_EQ(cache.free_blocks(), 1);
  EXPECT_EQ(cache.allocate_block(), b);
  EXPECT_THROW(cache.release_block(17), Error);
  cache.release_block(a);
  cache.release_block(c);
  cache.release_block(b);
  EXPECT_THROW(cache.release_block(b), Error);
}

TEST(ModelCache, SequenceReservesBlocksAndAFreshSlot) {
  auto ops = make_ref_ops();
  ModelCache cache(*ops, hybrid_shape(), 8, 4, 2);
  SequenceCache seq;
  seq.reserve(cache, 5);
  EXPECT_EQ(seq.blocks.size(), 2u);
  ASSERT_GE(seq.slot, 0);
  // Dirty the slot, release it, and a new sequence gets it back zeroed.
  cache.delta_state(0).ptr<float>()[seq.slot * 32] = 3.0f;
  seq.release(cache);
  EXPECT_EQ(cache.free_blocks(), 8);
  SequenceCache next;
  next.reserve(cache, 1);
  EXPECT_EQ(cache.delta_state(0).ptr<float>()[next.slot * 32], 0.0f);
}

// Rollback: snapshot a sequence's recurrent state, run ahead, restore, and the same continuation gives
// bit-identical logits (KV needs no copy: positions past `cached` are simply overwritten).
TEST(ModelCache, SnapshotRestoreReplaysIdentically) {
  const auto dir = std::filesystem::path(QINFER_TEST_DATA) / "golden" / "qwen3_5";
  models::Checkpoint ck = models::open_checkpoint(dir);
  auto ops = make_cpu_ops(global_thread_pool());
  models::Model model(ck, *ops);
  ModelCache cache = models::make_cache(model, 64);
  SequenceCache seq;
  std::vector<int32_t> prefix = {5, 17, 300, 42, 7, 7, 99, 1, 0, 250};
  std::vector<int32_t> ahead = {11, 12, 13, 14, 15, 16};
  models::Batch first;
  first.sequences.push_back({prefix, &seq, false});
  model.forward(first, cache);
  const ModelCache::StateSnapshot saved = cache.snapshot(seq.slot);
  const int32_t cached = seq.cached;

  models::Batch go;
  go.sequences.push_back({ahead, &seq, true});
  Tensor once = model.forward(go, cache);
  models::Batch other;  // diverge: different tokens after the prefix
  other.sequences.push_back({{400, 401}, &seq, false});
  model.forward(other, cache);

  cache.restore(seq.slot, saved);
  seq.cached = cached;
  Tensor again = model.forward(go, cache);
  ASSERT_EQ(once.nbytes(), again.nbytes());
  EXPECT_EQ(std::memcmp(once.data, again.data, once.nbytes()), 0);
}

}  // namespace
}  // namespace qinfer
