// Every unquantized family against HF transformers' logits, through the one forward path in all
// three modes (prefill, token-by-token decode, chunked prefill), plus greedy continuations and a
// two-sequence batch. Tolerances: relative RMS of logits <= 1e-2; argmax identical wherever the
// reference top-2 margin is >= 1e-2; greedy tokens identical.
#include <gtest/gtest.h>

#include <cmath>
#include <fmt/format.h>

#include <fstream>

#include "core/thread_pool.h"
#include "io/json.h"
#include "layers/attention.h"
#include "models/eval.h"
#include "support/golden_reference.h"

namespace qinfer::models {
namespace {

using golden::compare;
using golden::Comparison;
using golden::kGolden;
using golden::load_reference;
using golden::Reference;

struct Case {
  std::string fixture;
  std::string device;
};

class GoldenForward : public ::testing::TestWithParam<Case> {};

std::unique_ptr<Ops> make_ops(const std::string& device) {
  return device == "ref" ? make_ref_ops() : make_cpu_ops(global_thread_pool());
}

TEST_P(GoldenForward, LogitsInEveryModeAndGreedy) {
  const std::filesystem::path dir = kGolden / GetParam().fixture;
  Checkpoint checkpoint = open_checkpoint(dir);
  std::unique_ptr<Ops> ops = make_ops(GetParam().device);
  Model model(checkpoint, *ops);
  Reference ref = load_reference(dir);
  for (const char* mode_name : {"prefill", "decode", "chunked:5", "chunked:64"}) {
    const EvalMode mode = parse_eval_mode(mode_name);
    for (size_t k = 0; k < ref.prompts.size(); ++k) {
      Tensor logits = prompt_logits(model, ref.prompts[k], mode);
      Comparison c = compare(logits.ptr<float>(), ref.logits[k], ref.vocab);
      EXPECT_LE(c.relative_rms, 1e-2) << mode_name << " prompt " << k;
      EXPECT_EQ(c.argmax_mismatches, 0) << mode_name << " prompt " << k;
      if (k == 2) RecordProperty(std::string("rel_rms_") + mode_name, fmt::format("{:.3g}", c.relative_rms));
    }
  }
  for (size_t k = 0; k < ref.prompts.size(); ++k)
    EXPECT_EQ(greedy_continuation(model, ref.prompts[k], static_cast<int32_t>(ref.greedy[k].size())), ref.greedy[k])
        << "prompt " << k;
}

// Two prompts of different lengths in one batch give each prompt's logits as when run alone, and
// keep doing so when decoding continues batched.
TEST_P(GoldenForward, BatchOfTwoMatchesSingleRuns) {
  const std::filesystem::path dir = kGolden / GetParam().fixture;
  Checkpoint checkpoint = open_checkpoint(dir);
  std::unique_ptr<Ops> ops = make_ops(GetParam().device);
  Model model(checkpoint, *ops);
  Reference ref = load_reference(dir);
  const auto& a = ref.prompts[1];
  const auto& b = ref.prompts[2];
  const int64_t V = ref.vocab;
  ModelCache cache = make_cache(model, 128, 2);
  SequenceCache sa = cache.sequence(0), sb = cache.sequence(1);
  Batch batch;
  batch.sequences.push_back({a, &sa, true});
  batch.sequences.push_back({b, &sb, true});
  Tensor logits = model.forward(batch, cache);
  Comparison ca = compare(logits.ptr<float>(), ref.logits[1], V);
  Comparison cb = compare(logits.ptr<float>() + a.size() * V, ref.logits[2], V);
  EXPECT_LE(ca.relative_rms, 1e-2);
  EXPECT_LE(cb.relative_rms, 1e-2);
  EXPECT_EQ(ca.argmax_mismatches + cb.argmax_mismatches, 0);
  // A batched decode step continues both sequences like the single-sequence greedy runs.
  Batch step;
  step.sequences.push_back({{ref.greedy[1][0]}, &sa, false});
  step.sequences.push_back({{ref.greedy[2][0]}, &sb, false});
  Tensor next = model.forward(step, cache);
  auto argmax = [&](int64_t row) {
    const float* r = next.ptr<float>() + row * V;
    return static_cast<int32_t>(std::max_element(r, r + V) - r);
  };
  EXPECT_EQ(argmax(0), ref.greedy[1][1]);
  EXPECT_EQ(argmax(1), ref.greedy[2][1]);
}

// A bf16 KV cache (the cuda backend's fast precision): the cache holds bf16 pools, and the logits stay
// as close to HF's as the f32 cache's tolerance allows (the rounding is 2^-9 relative per key; 2-30e-4
// measured). qwen3_next is left out: its last token of prompt 1 routes between two experts whose
// scores nearly tie, and the rounding flips the pick there (0.2 at that position, 3e-4 elsewhere).
TEST_P(GoldenForward, LogitsOverABf16KvCache) {
  if (GetParam().fixture == "qwen3_next") GTEST_SKIP() << "a near-tie in its expert routing (see above)";
  const std::filesystem::path dir = kGolden / GetParam().fixture;
  Checkpoint checkpoint = open_checkpoint(dir);
  std::unique_ptr<Ops> ops = make_ops(GetParam().device);
  ops->set_kv_dtype(DType::bf16);
  Model model(checkpoint, *ops);
  Reference ref = load_reference(dir);
  const ModelCache cache = make_cache(model, 16);
  for (int64_t l = 0; l < cache.shape().attention_layers; ++l)
    EXPECT_EQ(const_cast<ModelCache&>(cache).kv(l).k.dtype, DType::bf16);
  for (const char* mode_name : {"prefill", "decode"}) {
    for (size_t k = 0; k < ref.prompts.size(); ++k) {
      Tensor logits = prompt_logits(model, ref.prompts[k], parse_eval_mode(mode_name));
      Comparison c = compare(logits.ptr<float>(), ref.logits[k], ref.vocab);
      EXPECT_LE(c.relative_rms, 1e-2) << mode_name << " prompt " << k;
      EXPECT_EQ(c.argmax_mismatches, 0) << mode_name << " prompt " << k;
      if (k == 2) RecordProperty(std::string("bf16_kv_rel_rms_") + mode_name, fmt::format("{:.3g}", c.relative_rms));
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const char* f : {"qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_mlx",
                        "qwen3_5_moe_mlx_4bit", "qwen3_mlx_8bit", "qwen3_5_mlx_6bit", "qwen3_5_mlx_3bit",
                        "qwen3_5_mlx_mxfp4", "qwen3_yarn"})
    for (const char* d : {"cpu", "ref"}) out.push_back({f, d});
  return out;
}

// The YaRN fixture's rotary constants are transformers' own (its rotary embedding's inv_freq and
// attention_scaling as loaded, in reference.json): inv_freq within an ulp (torch's vectorized pow may
// round its last bit otherwise than powf), the attention factor exactly.
TEST(GoldenYarn, RotaryFrequenciesAreTransformers) {
  const std::filesystem::path dir = kGolden / "qwen3_yarn";
  const Checkpoint checkpoint = open_checkpoint(dir);
  const io::json rope = io::read_json_file(dir / "reference.json").at("rope");
  const RopeFrequencies f = rope_frequencies("qwen3_yarn", layers::rope_params(checkpoint.config.text));
  const auto inv_freq = rope.at("inv_freq").get<std::vector<float>>();
  ASSERT_EQ(f.inv_freq.size(), inv_freq.size());
  for (size_t i = 0; i < inv_freq.size(); ++i)
    EXPECT_NEAR(f.inv_freq[i], inv_freq[i], std::abs(inv_freq[i]) * 1.2e-7f) << "frequency " << i;
  EXPECT_EQ(f.attention_factor, rope.at("attention_scaling").get<float>());
  EXPECT_EQ(checkpoint.config.text.max_position_embeddings, 128);  // 4 x 32
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenForward, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.fixture + "_" + info.param.device; });

}  // namespace
}  // namespace qinfer::models
