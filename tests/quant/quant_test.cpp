// MLX quantization formats: bit packing across word boundaries, the reference quantizer, and
// bit-identity with the Python reference quantizer that made the 4-bit golden fixture.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "core/error.h"
#include "io/json.h"
#include "models/registry.h"
#include "quant/quant.h"

namespace qinfer::quant {
namespace {

void pack_codes(uint32_t* row, const std::vector<uint32_t>& q, int bits) {
  for (size_t j = 0; j < q.size(); ++j) {
    const uint64_t bit = j * static_cast<uint64_t>(bits);
    row[bit / 32] |= q[j] << (bit % 32);
    if (bit % 32 + bits > 32) row[bit / 32 + 1] |= q[j] >> (32 - bit % 32);
  }
}

TEST(Quant, ExtractReadsEveryWidthIncludingWordStraddles) {
  std::mt19937 rng(3);
  for (int bits : {2, 3, 4, 5, 6, 8}) {
    const int64_t in = 128;
    std::vector<uint32_t> q(in), words(packed_words(in, bits));
    for (auto& v : q) v = rng() & ((1u << bits) - 1);
    pack_codes(words.data(), q, bits);
    for (int64_t j = 0; j < in; ++j) ASSERT_EQ(extract(words.data(), j, bits), q[j]) << bits << " bits, j " << j;
  }
  // 3-bit: element 10 spans bits 30..32, i.e. the top two bits of word 0 and the lowest of word 1.
  uint32_t row[3] = {0b11u << 30, 0b1u, 0};
  EXPECT_EQ(extract(row, 10, 3), 0b111u);
}

// MLX's rule pins the edge farther from zero exactly, so the other end may be clipped: the error is a
// half step for in-range values and shrinks with the bit width overall.
TEST(Quant, AffineRoundTripErrorShrinksWithBitsAndKeepsZeroExact) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0, 1);
  const std::pair<int, double> bound[] = {{2, 0.6}, {3, 0.3}, {4, 0.15}, {5, 0.08}, {6, 0.04}, {8, 0.01}};
  for (const auto& [bits, max_rel_rms] : bound) {
    for (int group : {32, 64, 128}) {
      const Layout layout{Mode::affine, bits, group};
      const int64_t in = 256;
      std::vector<float> w(in), back(in), scales(in / group), biases(in / group);
      for (auto& v : w) v = normal(rng);
      w[7] = 0.0f;
      std::vector<uint32_t> codes(packed_words(in, bits));
      quantize_row(layout, w.data(), in, codes.data(), scales.data(), biases.data(), nullptr);
      dequantize_row(layout, codes.data(), DType::f32, scales.data(), biases.data(), 0, in, back.data());
      double err = 0, norm = 0;
      for (int64_t j = 0; j < in; ++j) {
        const float s = std::abs(scales[j / group]);
        const float lo = std::min(biases[j / group], biases[j / group] + scales[j / group] * ((1 << bits) - 1));
        const float hi = std::max(biases[j / group], biases[j / group] + scales[j / group] * ((1 << bits) - 1));
        if (w[j] >= lo && w[j] <= hi) ASSERT_LE(std::abs(back[j] - w[j]), s * 0.5001f) << bits << "/" << group;
        err += (back[j] - w[j]) * double(back[j] - w[j]);
        norm += w[j] * double(w[j]);
      }
      EXPECT_LE(std::sqrt(err / norm), max_rel_rms) << bits << "/" << group;
      EXPECT_EQ(back[7], 0.0f) << bits << "/" << group;
    }
  }
}

TEST(Quant, FloatingModesRoundTrip) {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0, 1);
  for (Mode mode : {Mode::mxfp4, Mode::nvfp4, Mode::mxfp8}) {
    const Layout layout{mode, traits(mode).bits, traits(mode).group_size};
    const int64_t in = 128;
    std::vector<float> w(in), back(in);
    for (auto& v : w) v = normal(rng);
    std::vector<uint32_t> codes(packed_words(in, layout.bits));
    std::vector<uint8_t> scale_codes(in / layout.group_size);
    quantize_row(layout, w.data(), in, codes.data(), nullptr, nullptr, scale_codes.data());
    dequantize_row(layout, codes.data(), DType::u8, scale_codes.data(), nullptr, 0, in, back.data());
    double err = 0, norm = 0;
    for (int64_t j = 0; j < in; ++j) {
      err += (back[j] - w[j]) * double(back[j] - w[j]);
      norm += w[j] * double(w[j]);
    }
    EXPECT_LT(std::sqrt(err / norm), mode == Mode::mxfp8 ? 0.08 : 0.2) << traits(mode).name;
  }
  // mxfp4: E8M0 scale 2^(s-127) times the E2M1 element.
  uint32_t word = 0x7u | (0xFu << 4);  // elements 6 and -6
  uint8_t scale = 126;                  // 0.5
  std::vector<uint8_t> scales(1, scale);
  float out[32];
  std::vector<uint32_t> row(4, 0);
  row[0] = word;
  dequantize_row({Mode::mxfp4, 4, 32}, row.data(), DType::u8, scales.data(), nullptr, 0, 32, out);
  EXPECT_EQ(out[0], 3.0f);
  EXPECT_EQ(out[1], -3.0f);
  EXPECT_EQ(out[2], 0.0f);
}

TEST(Quant, ValidateRejectsWhatMlxNeverWrites) {
  EXPECT_THROW(validate({Mode::affine, 7, 64}), Error);
  EXPECT_THROW(validate({Mode::affine, 4, 48}), Error);
  EXPECT_THROW(validate({Mode::nvfp4, 4, 32}), Error);
  EXPECT_NO_THROW(validate({Mode::mxfp8, 8, 32}));
  EXPECT_THROW(parse_mode("int4"), Error);
}

// The quantized golden fixtures came from tools/make_golden.py's quantizers (numpy, on the GPU
// machine) applied to their source fixture's bf16 weights. Ours must reproduce every code, scale and
// bias bit for bit, in every mode and width the fixtures cover.
class ReferenceQuantizer : public ::testing::TestWithParam<std::pair<const char*, const char*>> {};

TEST_P(ReferenceQuantizer, MatchesThePythonReferenceBitForBit) {
  const auto golden = std::filesystem::path(QINFER_TEST_DATA) / "golden";
  models::Checkpoint source = models::open_checkpoint(golden / GetParam().first);
  models::Checkpoint quantized = models::open_checkpoint(golden / GetParam().second);
  int tensors = 0;
  for (const auto& [name, t] : quantized.plan.tensors) {
    if (!t.quant || !name.ends_with(".weight")) continue;
    const std::string base = name.substr(0, name.size() - 7);
    const Layout layout{parse_mode(t.quant->mode), t.quant->bits, t.quant->group_size};
    const bool affine = layout.mode == Mode::affine;
    const io::CanonicalTensor* original = source.plan.find(name);
    if (original == nullptr) original = &source.plan.at("model.embed_tokens.weight");  // tied head
    std::vector<float> w = original->read_f32();
    const int64_t in = original->shape.back(), rows = static_cast<int64_t>(w.size()) / in;
    const std::vector<std::byte> want_codes = t.read_bytes();
    const std::vector<std::byte> want_scales = quantized.plan.at(base + ".scales").read_bytes();
    const std::vector<std::byte> want_biases = affine ? quantized.plan.at(base + ".biases").read_bytes()
                                                      : std::vector<std::byte>{};
    const auto* wc = reinterpret_cast<const uint32_t*>(want_codes.data());
    const int64_t words = packed_words(in, layout.bits), groups = in / layout.group_size;
    std::vector<uint32_t> codes(words);
    std::vector<float> scales(groups), biases(groups);
    std::vector<uint8_t> scale_codes(groups);
    for (int64_t r = 0; r < rows; ++r) {
      quantize_row(layout, w.data() + r * in, in, codes.data(), scales.data(), biases.data(), scale_codes.data());
      for (int64_t k = 0; k < words; ++k) ASSERT_EQ(codes[k], wc[r * words + k]) << name << " row " << r;
      for (int64_t g = 0; g < groups; ++g) {
        if (affine) {
          const auto* ws = reinterpret_cast<const uint16_t*>(want_scales.data());
          const auto* wb = reinterpret_cast<const uint16_t*>(want_biases.data());
          ASSERT_EQ(f32_to_bf16(scales[g]), ws[r * groups + g]) << name << " row " << r << " group " << g;
          ASSERT_EQ(f32_to_bf16(biases[g]), wb[r * groups + g]) << name << " row " << r << " group " << g;
        } else {
          ASSERT_EQ(scale_codes[g], static_cast<uint8_t>(want_scales[r * groups + g])) << name << " row " << r;
        }
      }
    }
    ++tensors;
  }
  EXPECT_GT(tensors, 20);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ReferenceQuantizer,
                         ::testing::Values(std::pair{"qwen3_5_moe", "qwen3_5_moe_mlx_4bit"},
                                           std::pair{"qwen3", "qwen3_mlx_8bit"},
                                           std::pair{"qwen3_5", "qwen3_5_mlx_6bit"},
                                           std::pair{"qwen3_5", "qwen3_5_mlx_3bit"},
                                           std::pair{"qwen3_5", "qwen3_5_mlx_mxfp4"}),
                         [](const auto& info) { return std::string(info.param.second); });

}  // namespace
}  // namespace qinfer::quant
