// The KV pool on the CPU: sized from the host's available memory like a GPU's from its free memory
// (max_running x max_context at most, memory_fraction of what is available at most), an explicit
// pool that cannot fit is a clear error, and blocks nothing has written take no memory.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "core/error.h"
#include "engine/engine.h"
#include "engine_support.h"

namespace qinfer::engine {
namespace {

using ::testing::HasSubstr;
using testing::fixture_model;
using testing::test_tokenizer;

constexpr int64_t kAll = 64 * (4096 / 16);  // default max_running x the fixture's 4096 positions / block_size

double block_bytes(const models::Runner& m) {
  const CacheShape s = m.cache_shape();
  return 2.0 * static_cast<double>(storage_bytes(s.kv_dtype, static_cast<uint64_t>(s.attention_layers) * 16 *
                                                                 static_cast<uint64_t>(s.kv_heads * s.head_dim)));
}

TEST(HostKvPool, AvailableMemoryIsRead) {
  const std::optional<uint64_t> available = host_available_memory();
  ASSERT_TRUE(available.has_value());
  EXPECT_GT(*available, 0u);
}

TEST(HostKvPool, DefaultIsWhatMaxRunningTimesMaxContextNeedsWhenItFits) {
  const models::Model& m = fixture_model("qwen3");
  EXPECT_EQ(resolve_options({}, m, std::nullopt).kv_blocks, kAll);
  EXPECT_EQ(resolve_options({}, m, uint64_t{1} << 40).kv_blocks, kAll);
}

// A 30 MB model took 874 MB of KV pool and state at start, whatever the host had.
TEST(HostKvPool, DefaultShrinksToAFractionOfAvailableHostMemory) {
  const models::Model& m = fixture_model("qwen3");
  const uint64_t available = 64'000'000;
  const int64_t blocks = resolve_options({}, m, available).kv_blocks;
  EXPECT_LT(blocks, kAll);
  EXPECT_LE((static_cast<double>(blocks) + 1) * block_bytes(m), 0.9 * static_cast<double>(available));
  EXPECT_GT((static_cast<double>(blocks) + 2) * block_bytes(m), 0.9 * static_cast<double>(available));
  EngineOptions half;
  half.memory_fraction = 0.45;
  EXPECT_NEAR(static_cast<double>(resolve_options(half, m, available).kv_blocks), blocks / 2.0, 1.0);

  try {
    resolve_options({}, m, 10'000);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("of available host memory x memory fraction 0.9 leaves no room for the KV cache"));
  }
}

TEST(HostKvPool, ExplicitKvBlocksThatDoNotFitAreAnError) {
  const models::Model& m = fixture_model("qwen3");
  EngineOptions o;
  o.kv_blocks = 1'000'000;
  try {
    resolve_options(o, m, 1'000'000'000);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("engine: kv_blocks 1000000 needs"));
    EXPECT_THAT(e.what(), HasSubstr("but only 1.00 GB of available host memory is left"));
  }
  o.kv_blocks = 1000;  // asked for, so not capped by memory_fraction
  EXPECT_EQ(resolve_options(o, m, static_cast<uint64_t>(1001 * block_bytes(m))).kv_blocks, 1000);
}

uint64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "VmRSS:") {
      uint64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
    std::getline(status, key);
  }
  return 0;
}

// The pool is sized for the worst case; until requests write to it, it costs nothing.
TEST(HostKvPool, UnwrittenBlocksTakeNoMemory) {
  models::Model& m = fixture_model("qwen3");
  const std::optional<uint64_t> available = host_available_memory();
  const double pool = static_cast<double>(kAll) * block_bytes(m);
  if (!available || static_cast<double>(*available) < 2 * pool) GTEST_SKIP() << "too little host memory";
  const uint64_t before = resident_bytes();
  Engine engine(m, test_tokenizer(), {});
  ASSERT_EQ(engine.options().kv_blocks, kAll);
  const double grown = static_cast<double>(resident_bytes()) - static_cast<double>(before);
  EXPECT_LT(grown, pool / 4) << "a " << static_cast<int64_t>(pool / 1e6) << " MB pool took "
                             << static_cast<int64_t>(grown / 1e6) << " MB at start";
}

}  // namespace
}  // namespace qinfer::engine
