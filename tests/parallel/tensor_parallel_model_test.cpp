// models::TensorParallelModel as the engine sees it: one forward advances each sequence's cache
// once, every cache operation reaches every rank, a bad batch is refused before any rank runs, and
// a rank that fails mid-forward surfaces as an Error in the caller instead of hanging the others.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "models/tensor_parallel.h"
#include "support/golden_reference.h"

namespace qinfer::models {
namespace {

using ::testing::HasSubstr;

std::unique_ptr<TensorParallelModel> group_of(const Checkpoint& checkpoint, int size) {
  std::vector<std::unique_ptr<Ops>> ops;
  for (int r = 0; r < size; ++r) ops.push_back(make_ref_ops());
  return std::make_unique<TensorParallelModel>(checkpoint, std::move(ops));
}

Tensor logits_of(Runner& model, ModelCache& cache, SequenceCache& seq, std::vector<int32_t> tokens) {
  Batch batch;
  batch.sequences.push_back({std::move(tokens), &seq, false});
  return to_host(model.ops(), model.forward(batch, cache));
}

TEST(TensorParallelModel, ForwardsAdvanceTheCacheOnceAndMatchOneModel) {
  const Checkpoint checkpoint = open_checkpoint(golden::kGolden / "qwen3_5");
  const std::unique_ptr<Ops> ops = make_ref_ops();
  Model one(checkpoint, *ops);
  const auto group = group_of(checkpoint, 2);
  EXPECT_EQ(group->size(), 2);
  EXPECT_EQ(group->cache_shape().kv_heads, one.cache_shape().kv_heads / 2);
  ModelCache single_cache = one.cache_for(64), split_cache = group->cache_for(64, 2);
  EXPECT_EQ(split_cache.ranks(), 2);
  SequenceCache a = single_cache.sequence(0), b = split_cache.sequence(0);
  for (const std::vector<int32_t>& step : {std::vector<int32_t>{3, 1, 4, 1, 5}, {9}, {2}}) {
    const Tensor want = logits_of(one, single_cache, a, step), got = logits_of(*group, split_cache, b, step);
    EXPECT_EQ(b.cached, a.cached);
    EXPECT_EQ(b.blocks, a.blocks);
    EXPECT_EQ(b.slot, a.slot);
    const std::vector<float> w(want.ptr<float>(), want.ptr<float>() + want.numel());
    EXPECT_LE(golden::compare(got.ptr<float>(), w, want.dim(1)).relative_rms, 1e-5);
  }
  EXPECT_EQ(b.cached, 7);
  // A state snapshot holds every rank's layers; restored into another slot it continues alike.
  const ModelCache::StateSnapshot state = split_cache.snapshot(b.slot);
  EXPECT_EQ(state.delta.size(), 2 * single_cache.snapshot(a.slot).delta.size());
  // The copy shares b's blocks (it overwrites the same position in them, after b's step read it).
  SequenceCache copy{b.blocks, b.cached, 1};
  split_cache.restore(copy.slot, state);
  const Tensor from_b = logits_of(*group, split_cache, b, {6}), from_copy = logits_of(*group, split_cache, copy, {6});
  EXPECT_EQ(std::memcmp(from_b.data, from_copy.data, from_b.nbytes()), 0);
}

TEST(TensorParallelModel, BadBatchesAreRefusedBeforeAnyRankRuns) {
  const Checkpoint checkpoint = open_checkpoint(golden::kGolden / "qwen3");
  const auto group = group_of(checkpoint, 2);
  ModelCache cache = group->cache_for(32);
  SequenceCache seq = cache.sequence(0);
  try {
    logits_of(*group, cache, seq, {1, 512});
    FAIL() << "an id outside the vocabulary ran";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("token id 512 is outside the vocabulary"));
  }
  const std::unique_ptr<Ops> ops = make_ref_ops();
  Model one(checkpoint, *ops);
  ModelCache single = one.cache_for(32);
  EXPECT_THROW(group->forward(Batch{{{{1}, &seq, false}}}, single), Error) << "a cache of one rank";
  EXPECT_EQ(logits_of(*group, cache, seq, {1, 2}).dim(0), 1) << "the group still runs";
}

TEST(TensorParallelModel, AFailingRankStopsTheGroupWithItsError) {
  const Checkpoint checkpoint = open_checkpoint(golden::kGolden / "qwen3");
  const auto group = group_of(checkpoint, 2);
  ModelCache cache = group->cache_for(32);
  // Rank 1 fails while rank 0 runs a forward and waits for it in the first all-reduce.
  try {
    group->for_each_rank([&](Model& model) {
      if (model.shard().rank == 1) fail("rank 1 ran out of something");
      SequenceCache seq = cache.sequence(0);
      Batch batch;
      batch.sequences.push_back({{1, 2, 3}, &seq, false});
      model.forward(batch, cache.rank(0));
    });
    FAIL() << "the failure did not surface";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1 ran out of something"));
  }
  SequenceCache seq = cache.sequence(0);
  try {
    logits_of(*group, cache, seq, {1});
    FAIL() << "a failed group ran again";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("the group stopped after a rank failed (rank 1 ran out of something)"));
  }
}

TEST(TensorParallelModel, ASplitThatDoesNotDivideNamesTheField) {
  const Checkpoint checkpoint = open_checkpoint(golden::kGolden / "qwen3");
  try {
    group_of(checkpoint, 4);
    FAIL() << "4 ranks over 2 KV heads loaded";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor parallel 4: num_key_value_heads 2 is not divisible by 4"));
  }
}

}  // namespace
}  // namespace qinfer::models
