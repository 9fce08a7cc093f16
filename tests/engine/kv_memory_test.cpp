// Sizing the KV pool from a device's free memory (serve on a GPU): what fits after the recurrent
// states, and a clear error when nothing does.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/error.h"
#include "engine/engine.h"
#include "engine/model_runner.h"

namespace qinfer::engine {
namespace {

TEST(KvBlocksInMemory, Qwen3_8bBlocksFillTheFractionOfFreeMemory) {
  CacheShape s;
  s.attention_layers = 36, s.kv_heads = 8, s.head_dim = 128;
  EngineOptions o;
  o.block_size = 16, o.max_running = 64, o.memory_fraction = 0.9;
  // One block: K and V of 16 tokens × 8 heads × 128 floats in 36 layers = 4.5 MiB. One of the blocks
  // that fit is the model runner's scratch block (padding rows of a decode step).
  const uint64_t block = 2ull * 36 * 16 * 8 * 128 * 4;
  EXPECT_EQ(kv_blocks_in_memory(s, o, 100 * block, true), 89);
  o.memory_fraction = 0.5;
  EXPECT_EQ(kv_blocks_in_memory(s, o, 100 * block, true), 49);
}

TEST(KvBlocksInMemory, Bf16PoolsHoldTwiceTheBlocks) {
  CacheShape s;
  s.attention_layers = 36, s.kv_heads = 8, s.head_dim = 128, s.kv_dtype = DType::bf16;
  EngineOptions o;
  o.block_size = 16, o.max_running = 64, o.memory_fraction = 0.9;
  const uint64_t f32_block = 2ull * 36 * 16 * 8 * 128 * 4;
  EXPECT_EQ(kv_blocks_in_memory(s, o, 100 * f32_block, true), 179);  // 0.9 · 200 bf16 blocks, less the scratch block
}

TEST(KvBlocksInMemory, RecurrentStatesComeFirst) {
  CacheShape s;  // Qwen3.5-9B: 8 attention and 24 linear-attention layers
  s.attention_layers = 8, s.kv_heads = 4, s.head_dim = 256;
  s.linear_layers = 24, s.conv_channels = 8192, s.conv_window = 3, s.value_heads = 32, s.value_head_dim = 128,
  s.key_head_dim = 128;
  EngineOptions o;
  o.block_size = 16, o.max_running = 10, o.memory_fraction = 1.0;
  const uint64_t block = 2ull * 8 * 16 * 4 * 256 * 4;
  const uint64_t state = 24ull * 4 * (3 * 8192 + 32 * 128 * 128);  // one sequence
  // The states of the 10 sequences and of the 3 padding rows a decode step may get (batch sizes 1, 2,
  // 4, 8, 10: 5..7 pad to 8) come first, then the scratch block.
  ASSERT_EQ(decode_padding(10), 3);
  EXPECT_EQ(kv_blocks_in_memory(s, o, 13 * state + 7 * block, true), 6);
  // Unrecorded steps are not padded: one scratch slot past the 10, and two states' worth of 1 MiB
  // blocks (100.5) more.
  EXPECT_EQ(kv_blocks_in_memory(s, o, 13 * state + 7 * block, false), 106);
  try {
    kv_blocks_in_memory(s, o, 13 * state + block, true);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), ::testing::HasSubstr("leaves no room for the KV cache"));
    EXPECT_THAT(e.what(), ::testing::HasSubstr("10 sequences"));
  }
}

}  // namespace
}  // namespace qinfer::engine
