// rope_frequencies (backend/ops.h) against YaRN's formula written out in double here, and bit for bit
// against the f32 values of a numpy transcription of transformers 5's _compute_yarn_parameters
// (tools/make_golden.py yarn_inv_freq: Python floats for the ramp's ends and the attention factor,
// float32 arrays for the rest, powers correctly rounded as glibc's powf rounds them; torch's
// vectorized pow is within an ulp of those); then the ref and cpu rotations with those frequencies
// and the attention factor.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <complex>
#include <numbers>
#include <random>

#include "backend/ops.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace qinfer {
namespace {

// YaRN in double: inv_freq[i] = θ^(-2i/d) · (ramp_i / factor + 1 - ramp_i), the ramp rising from 0
// to 1 between the dimensions whose frequencies turn beta_fast and beta_slow times over the
// original context.
std::vector<double> yarn_formula(int64_t d, double theta, const YarnParams& y) {
  const auto dim_for = [&](double rotations) {
    return d * std::log(y.original_max_positions / (rotations * 2 * std::numbers::pi)) / (2 * std::log(theta));
  };
  double low = dim_for(y.beta_fast), high = dim_for(y.beta_slow);
  if (y.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, static_cast<double>(d - 1));
  if (low == high) high += 0.001;
  std::vector<double> inv_freq;
  for (int64_t i = 0; i < d / 2; ++i) {
    const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
    inv_freq.push_back(std::pow(theta, -2.0 * i / d) * (ramp / y.factor + 1 - ramp));
  }
  return inv_freq;
}

std::vector<uint32_t> bits(const std::vector<float>& v) {
  std::vector<uint32_t> out;
  for (float x : v) out.push_back(std::bit_cast<uint32_t>(x));
  return out;
}

TEST(RopeFrequencies, DefaultIsThetaToTheMinus2iOverD) {
  const RopeFrequencies f = rope_frequencies("test", {.rotary_dim = 8, .theta = 1e6});
  ASSERT_EQ(f.inv_freq.size(), 4u);
  for (int64_t i = 0; i < 4; ++i)
    EXPECT_EQ(f.inv_freq[i], 1.0f / std::pow(1e6f, static_cast<float>(2 * i) / 8.0f)) << i;
  EXPECT_EQ(f.attention_factor, 1.0f);
  EXPECT_EQ(f.axis, std::vector<int8_t>(4, 0));
  EXPECT_EQ(rope_frequencies("test", {.rotary_dim = 12, .mrope_section = {2, 2, 1}}).axis,
            (std::vector<int8_t>{0, 1, 2, 0, 1, 0}));
}

// The golden qwen3_yarn fixture's rotation: head_dim 32, theta 1e6, factor 4 over 32 positions. Its
// ramp runs over dimensions 0..2: frequency 0 kept, 1 half-blended, the rest divided by 4.
TEST(RopeFrequencies, YarnMatchesTransformersBitForBit) {
  const YarnParams y{.factor = 4.0, .original_max_positions = 32};
  const RopeFrequencies f = rope_frequencies("test", {.rotary_dim = 32, .theta = 1e6, .yarn = y});
  EXPECT_EQ(bits(f.inv_freq),
            (std::vector<uint32_t>{0x3f800000, 0x3e86f161, 0x3d361887, 0x3c99940d, 0x3c0186e3, 0x3b5a7bf2,
                                   0x3ab8449c, 0x3a1b690d, 0x3983126f, 0x38dd1725, 0x383a7753, 0x379d43a4,
                                   0x3704a2b2, 0x365fba4f, 0x35bcb0c1, 0x351f23e4}));
  EXPECT_EQ(std::bit_cast<uint32_t>(f.attention_factor), 0x3f91be9cu);  // 0.1 ln 4 + 1 = 1.13862943...

  // Qwen3.5's partial rotary (head_dim 32 x 0.25) with an MRoPE section: the axes are YaRN's too.
  const RopeFrequencies partial =
      rope_frequencies("test", {.rotary_dim = 8, .theta = 1e7, .mrope_section = {2, 1, 1}, .yarn = y});
  EXPECT_EQ(bits(partial.inv_freq), (std::vector<uint32_t>{0x3f800000, 0x3b91ad39, 0x38a5cb60, 0x35bcb0c1}));
  EXPECT_EQ(partial.axis, (std::vector<int8_t>{0, 1, 2, 0}));

  // Untruncated ramp ends (11.47..20.11), other betas, and DeepSeek's mscale ratio for the attention factor.
  const YarnParams deepseek{.factor = 40.0, .original_max_positions = 4096, .beta_fast = 24, .beta_slow = 2,
                            .mscale = 0.707, .mscale_all_dim = 1.0, .truncate = false};
  const RopeFrequencies d = rope_frequencies("test", {.rotary_dim = 64, .theta = 1e4, .yarn = deepseek});
  EXPECT_EQ(bits(d.inv_freq),
            (std::vector<uint32_t>{0x3f800000, 0x3f3ff911, 0x3f0ff59a, 0x3ed7e89b, 0x3ea1e89b, 0x3e72d423, 0x3e361887,
                                   0x3e088d77, 0x3dcccccd, 0x3d99940d, 0x3d6655c2, 0x3d2cba15, 0x3cf39979, 0x3ca0bc34,
                                   0x3c502a58, 0x3c036d91, 0x3ba01bbc, 0x3b38a0b2, 0x3ac1a9b1, 0x3a259c88, 0x38f4955c,
                                   0x3878a815, 0x383a7753, 0x380bd471, 0x37d1b717, 0x379d43a3, 0x376bdcf0, 0x3730df51,
                                   0x3704a2b3, 0x36c6ecdd, 0x36952c42, 0x365fba4f}));
  EXPECT_EQ(std::bit_cast<uint32_t>(d.attention_factor), 0x3f6bc96fu);  // (0.0707 ln 40 + 1) / (0.1 ln 40 + 1)

  // An explicit attention factor wins over the one from factor.
  const YarnParams given{.factor = 2.5, .original_max_positions = 100, .attention_factor = 0.9};
  const RopeFrequencies g = rope_frequencies("test", {.rotary_dim = 16, .theta = 1e4, .yarn = given});
  EXPECT_EQ(bits(g.inv_freq), (std::vector<uint32_t>{0x3f800000, 0x3e8186e2, 0x3d75c28f, 0x3c4f3e38, 0x3b83126f,
                                                     0x3aa5cb60, 0x39d1b717, 0x3904a2b3}));
  EXPECT_EQ(g.attention_factor, 0.9f);
}

TEST(RopeFrequencies, YarnFollowsItsFormula) {
  // Qwen3's model-card setting (factor 4 over 32768 positions, head_dim 128), a partial rotary, and an
  // untruncated ramp.
  struct Case {
    int64_t d;
    double theta;
    YarnParams y;
  };
  const Case cases[] = {{128, 1e6, {.factor = 4.0, .original_max_positions = 32768}},
                        {64, 1e7, {.factor = 4.0, .original_max_positions = 262144}},
                        {64, 1e4, {.factor = 8.0, .original_max_positions = 4096, .truncate = false}}};
  for (const auto& [d, theta, y] : cases) {
    const RopeFrequencies f = rope_frequencies("test", {.rotary_dim = d, .theta = theta, .yarn = y});
    const std::vector<double> expected = yarn_formula(d, theta, y);
    ASSERT_EQ(f.inv_freq.size(), expected.size());
    for (size_t i = 0; i < expected.size(); ++i)
      EXPECT_NEAR(f.inv_freq[i], expected[i], 2e-6 * expected[i]) << "d " << d << " i " << i;
    EXPECT_NEAR(f.attention_factor, 0.1 * std::log(y.factor) + 1, 1e-7);
  }
  // The fast frequencies are exactly the plain ones, the slow ones exactly divided by factor.
  const RopeFrequencies plain = rope_frequencies("test", {.rotary_dim = 128, .theta = 1e6});
  const RopeFrequencies f = rope_frequencies(
      "test", {.rotary_dim = 128, .theta = 1e6, .yarn = YarnParams{.factor = 4.0, .original_max_positions = 32768}});
  for (int i = 0; i < 23; ++i) EXPECT_EQ(f.inv_freq[i], plain.inv_freq[i]) << i;
  for (int i = 40; i < 64; ++i) {
    const float pos_freq = std::pow(1e6f, static_cast<float>(2 * i) / 128.0f);
    EXPECT_EQ(f.inv_freq[i], 1.0f / (4.0f * pos_freq)) << i;
  }
}

TEST(RopeFrequencies, RejectsBadParameters) {
  const auto yarn = [](YarnParams y) { return RopeParams{.rotary_dim = 8, .theta = 1e4, .yarn = y}; };
  EXPECT_THROW(rope_frequencies("test", {.rotary_dim = 7}), Error);
  EXPECT_THROW(rope_frequencies("test", {.rotary_dim = 8, .theta = 0}), Error);
  EXPECT_THROW(rope_frequencies("test", yarn({.factor = 0, .original_max_positions = 32})), Error);
  EXPECT_THROW(rope_frequencies("test", yarn({.factor = 4, .original_max_positions = 0})), Error);
  EXPECT_THROW(rope_frequencies("test", yarn({.factor = 4, .original_max_positions = 32, .beta_slow = -1})), Error);
  RopeParams theta_one = yarn({.factor = 4, .original_max_positions = 32});
  theta_one.theta = 1;
  EXPECT_THROW(rope_frequencies("test", theta_one), Error);
  try {
    rope_frequencies("cpu rope", yarn({.factor = NAN, .original_max_positions = 32}));
    FAIL() << "a NaN factor passed";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("cpu rope: yarn factor nan"), std::string::npos) << e.what();
  }
}

// Both host backends rotate by YaRN's frequencies and scale by its attention factor, over partial
// rotary dims (the rest pass through) and MRoPE axes.
TEST(RopeFrequencies, HostBackendsRotateByYarnFrequenciesTimesTheAttentionFactor) {
  const int64_t T = 3, heads = 2, head_dim = 12, d = 8;
  const RopeParams params{.rotary_dim = d, .theta = 1e4, .mrope_section = {2, 1, 1},
                          .yarn = YarnParams{.factor = 4.0, .original_max_positions = 16}};
  const std::vector<double> inv_freq = yarn_formula(d, 1e4, *params.yarn);
  const double attention = 0.1 * std::log(4.0) + 1;
  const int axis_of[4] = {0, 1, 2, 0};
  const std::vector<int32_t> pos = {5, 40, 70, 6, 41, 3, 7, 45, 60};  // rows t, h, w
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  std::vector<float> before(T * heads * head_dim);
  for (float& v : before) v = uniform(rng);
  std::unique_ptr<Ops> ref = make_ref_ops(), cpu = make_cpu_ops(global_thread_pool());
  for (Ops* ops : {ref.get(), cpu.get()}) {
    Tensor positions = host_tensor(DType::i32, {3, T});
    std::copy(pos.begin(), pos.end(), positions.ptr<int32_t>());
    Tensor x = host_tensor(DType::f32, {T, heads, head_dim});
    std::copy(before.begin(), before.end(), x.ptr<float>());
    ops->rope(x, positions, params);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < heads; ++h) {
        const float* x0 = before.data() + (t * heads + h) * head_dim;
        const float* x1 = x.ptr<float>() + (t * heads + h) * head_dim;
        for (int64_t i = 0; i < d / 2; ++i) {
          const double angle = pos[axis_of[i] * T + t] * inv_freq[i];
          const std::complex<double> z =
              attention * std::complex<double>(x0[i], x0[i + d / 2]) * std::polar(1.0, angle);
          EXPECT_NEAR(x1[i], z.real(), 2e-5) << ops->name() << " t " << t << " i " << i;
          EXPECT_NEAR(x1[i + d / 2], z.imag(), 2e-5) << ops->name() << " t " << t << " i " << i;
        }
        for (int64_t i = d; i < head_dim; ++i) EXPECT_EQ(x1[i], x0[i]) << ops->name();
      }
  }
}

}  // namespace
}  // namespace qinfer
