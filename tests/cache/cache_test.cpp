// Caches: equal shares for fixed sequences, zeroed slots, the room a forward needs, and recurrent-state
// snapshot / restore as rollback uses it. (Who holds which block: tests/engine/scheduler_test.cpp.)
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

TEST(ModelCache, EqualSharesForFixedSequences) {
  auto ops = make_ref_ops();
  ModelCache cache(*ops, hybrid_shape(), 8, 4, 2);
  const SequenceCache first = cache.sequence(0), second = cache.sequence(1);
  EXPECT_EQ(first.blocks, (std::vector<int32_t>{0, 1, 2, 3}));
  EXPECT_EQ(second.blocks, (std::vector<int32_t>{4, 5, 6, 7}));
  EXPECT_EQ(first.slot, 0);
  EXPECT_EQ(second.slot, 1);
  EXPECT_EQ(second.cached, 0);
  EXPECT_THROW(cache.sequence(2), Error);
}

TEST(ModelCache, ZeroSlotClearsOneSlotsState) {
  auto ops = make_ref_ops();
  ModelCache cache(*ops, hybrid_shape(), 8, 4, 2);
  cache.delta_state(0).ptr<float>()[0] = 3.0f;   // slot 0
  cache.conv_state(1).ptr<float>()[18] = 2.0f;   // slot 1 (a slot's window is 3 x 6)
  cache.zero_slot(0);
  EXPECT_EQ(cache.delta_state(0).ptr<float>()[0], 0.0f);
  EXPECT_EQ(cache.conv_state(1).ptr<float>()[18], 2.0f) << "another slot keeps its state";
}

TEST(ModelCache, CopySlotCopiesOneSlotsState) {
  auto ops = make_ref_ops();
  ModelCache cache(*ops, hybrid_shape(), 8, 4, 3);
  for (int64_t i = 0; i < cache.delta_state(1).numel(); ++i) cache.delta_state(1).ptr<float>()[i] = static_cast<float>(i);
  for (int64_t i = 0; i < cache.conv_state(0).numel(); ++i) cache.conv_state(0).ptr<float>()[i] = static_cast<float>(-i);
  const ModelCache::StateSnapshot before = cache.snapshot(0);
  cache.copy_slot(0, 2);
  const ModelCache::StateSnapshot after = cache.snapshot(2);
  EXPECT_EQ(after.conv, before.conv);
  EXPECT_EQ(after.delta, before.delta);
  EXPECT_NE(cache.snapshot(1).delta, before.delta) << "slot 1 is untouched";
}

TEST(ModelCache, ForwardNeedsRoomAndASlot) {
  auto ops = make_ref_ops();
  ModelCache cache(*ops, hybrid_shape(), 8, 4, 2);
  SequenceCache s{{0, 1}, 5, 0};
  EXPECT_NO_THROW(check_room(cache, s, 3));
  try {
    check_room(cache, s, 4);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("too few for its 5 cached + 4 new tokens"));
  }
  s.slot = -1;
  EXPECT_THROW(check_room(cache, s, 1), Error) << "the model has recurrent state";
  s = {{9}, 0, 0};
  EXPECT_THROW(check_room(cache, s, 1), Error) << "block 9 is not in the cache";
}

// Rollback: snapshot a sequence's recurrent state, run ahead, restore, and the same continuation gives
// bit-identical logits (KV needs no copy: positions past `cached` are simply overwritten).
TEST(ModelCache, SnapshotRestoreReplaysIdentically) {
  const auto dir = std::filesystem::path(QINFER_TEST_DATA) / "golden" / "qwen3_5";
  models::Checkpoint ck = models::open_checkpoint(dir);
  auto ops = make_cpu_ops(global_thread_pool());
  models::Model model(ck, *ops);
  ModelCache cache = models::make_cache(model, 64);
  SequenceCache seq = cache.sequence(0);
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
