// Tensor-parallel forward on the host: every golden fixture split over two ranks (threads of this
// process, ThreadGroup, the ref backend) gives TP=1's prompt logits, in prefill and in decode, up to
// f32 summation order (relative RMS <= 1e-5). A fixture that cannot split gives the error that says
// why instead.
#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"
#include "models/eval.h"
#include "parallel/tp_checkpoints.h"
#include "support/golden_reference.h"

namespace qinfer::parallel {
namespace {

using models::EvalMode;

// Prompt logits of every prompt from `size` ranks; checks that all ranks agree bit for bit.
std::vector<Tensor> tp_logits(const models::Checkpoint& checkpoint, int size,
                              const std::vector<std::vector<int32_t>>& prompts, EvalMode mode, bool cpu = false) {
  ThreadGroup group(size);
  std::vector<std::vector<Tensor>> logits(static_cast<size_t>(size));
  group.run([&](Communicator& comm) {
    // The cpu backend's pool takes one rank's loop at a time; ref has no pool.
    std::unique_ptr<Ops> ops = cpu ? make_cpu_ops(global_thread_pool()) : make_ref_ops();
    models::Model model(checkpoint, *ops, &comm);
    for (const auto& prompt : prompts)
      logits[static_cast<size_t>(comm.rank())].push_back(models::prompt_logits(model, prompt, mode));
  });
  for (int r = 1; r < size; ++r)
    for (size_t k = 0; k < prompts.size(); ++k)
      EXPECT_EQ(std::memcmp(logits[r][k].data, logits[0][k].data, logits[0][k].nbytes()), 0)
          << "rank " << r << " prompt " << k;
  return logits[0];
}

// `prompts` from the golden fixture `fixture` (its reference.json), run on the checkpoint in `dir`.
void expect_tp_matches_single(const std::filesystem::path& dir, const std::string& fixture, int size,
                              bool cpu = false) {
  const models::Checkpoint checkpoint = models::open_checkpoint(dir);
  const golden::Reference ref = golden::load_reference(golden::kGolden / fixture);
  std::unique_ptr<Ops> ops = cpu ? make_cpu_ops(global_thread_pool()) : make_ref_ops();
  models::Model single(checkpoint, *ops);
  for (const char* mode_name : {"prefill", "decode"}) {
    const EvalMode mode = models::parse_eval_mode(mode_name);
    const std::vector<Tensor> split = tp_logits(checkpoint, size, ref.prompts, mode, cpu);
    for (size_t k = 0; k < ref.prompts.size(); ++k) {
      const Tensor whole = models::prompt_logits(single, ref.prompts[k], mode);
      const std::vector<float> want(whole.ptr<float>(), whole.ptr<float>() + whole.numel());
      const golden::Comparison c = golden::compare(split[k].ptr<float>(), want, ref.vocab);
      EXPECT_LE(c.relative_rms, 1e-5) << mode_name << " prompt " << k;
      EXPECT_EQ(c.argmax_mismatches, 0) << mode_name << " prompt " << k;
    }
  }
}

class TensorParallelForward : public ::testing::TestWithParam<std::string> {};

TEST_P(TensorParallelForward, TwoRanksGiveTheLogitsOfOne) {
  const std::filesystem::path dir = golden::kGolden / GetParam();
  if (GetParam() == "qwen3_5_moe_mlx_4bit") {
    // o_proj's and the experts' 64 inputs split into 32 per rank, inside one 64-wide quantization group.
    const models::Checkpoint checkpoint = models::open_checkpoint(dir);
    try {
      tp_logits(checkpoint, 2, {{1, 2}}, models::parse_eval_mode("prefill"));
      FAIL() << "a split inside quantization groups loaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not a multiple of its quantization group size 64"), std::string::npos)
          << e.what();
    }
    return;
  }
  expect_tp_matches_single(dir, GetParam(), 2);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TensorParallelForward, ::testing::ValuesIn(golden::kFixtures),
                         [](const auto& info) { return info.param; });

TEST(TensorParallelForward, QuantizedMoeSplitOnGroupBoundaries) {
  // The golden prompts against the 4-bit model's own TP=1 logits.
  expect_tp_matches_single(moe_4bit_g32(), "qwen3_5_moe", 2);
}

TEST(TensorParallelForward, CpuBackendRanksShareThePool) {
  expect_tp_matches_single(golden::kGolden / "qwen3_next", "qwen3_next", 2, /*cpu=*/true);
}

TEST(TensorParallelForward, CacheShapeIsTheRanks) {
  const models::Checkpoint checkpoint = models::open_checkpoint(golden::kGolden / "qwen3_next");
  ThreadGroup group(2);
  std::vector<CacheShape> shapes(2);
  group.run([&](Communicator& comm) {
    std::unique_ptr<Ops> ops = make_ref_ops();
    shapes[static_cast<size_t>(comm.rank())] = models::Model(checkpoint, *ops, &comm).cache_shape();
  });
  std::unique_ptr<Ops> ops = make_ref_ops();
  const CacheShape whole = models::Model(checkpoint, *ops).cache_shape();
  for (const CacheShape& s : shapes) {
    EXPECT_EQ(s.kv_heads, whole.kv_heads / 2);
    EXPECT_EQ(s.value_heads, whole.value_heads / 2);
    EXPECT_EQ(s.conv_channels, whole.conv_channels / 2);
    EXPECT_EQ(s.head_dim, whole.head_dim);
    EXPECT_EQ(s.key_head_dim, whole.key_head_dim);
    EXPECT_EQ(s.attention_layers, whole.attention_layers);
    EXPECT_EQ(s.linear_layers, whole.linear_layers);
  }
}

TEST(TensorParallelForward, HeadsThatDoNotSplitAreAnErrorOnEveryRank) {
  const models::Checkpoint checkpoint = models::open_checkpoint(golden::kGolden / "qwen3");
  ThreadGroup group(4);
  try {
    group.run([&](Communicator& comm) {
      std::unique_ptr<Ops> ops = make_ref_ops();
      models::Model model(checkpoint, *ops, &comm);
    });
    FAIL() << "4 ranks loaded 2 KV heads";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "tensor parallel 4: num_key_value_heads 2 is not divisible by 4");
  }
}

}  // namespace
}  // namespace qinfer::parallel
