// The cpu backend's quantized linear / embedding / experts against ref, for every MLX format and
// affine width, at decode (direct AVX2 dot) and prefill (dequantized rows) token counts.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include <fmt/format.h>

#include "backend/ops.h"
#include "core/thread_pool.h"

namespace qinfer {
namespace {

// A random quantized matrix [rows, in] in `layout`, quantized from N(0, 0.1) weights by the reference quantizer.
Weight random_weight(const quant::Layout& layout, std::vector<int64_t> shape, std::mt19937& rng) {
  std::normal_distribution<float> normal(0, 0.1f);
  const int64_t in = shape.back();
  int64_t rows = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) rows *= shape[i];
  Weight w;
  w.layout = layout;
  std::vector<int64_t> packed = shape, grouped = shape;
  packed.back() = quant::packed_words(in, layout.bits);
  grouped.back() = in / layout.group_size;
  const bool affine = layout.mode == quant::Mode::affine;
  w.codes = host_tensor(DType::u32, packed);
  w.scales = host_tensor(affine ? DType::bf16 : DType::u8, grouped);
  if (affine) w.biases = host_tensor(DType::bf16, grouped);
  std::vector<float> row(in), scales(in / layout.group_size), biases(in / layout.group_size);
  std::vector<uint8_t> codes8(in / layout.group_size);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = normal(rng);
    quant::quantize_row(layout, row.data(), in, w.codes.ptr<uint32_t>() + r * packed.back(), scales.data(),
                        biases.data(), codes8.data());
    for (size_t g = 0; g < scales.size(); ++g) {
      if (affine) {
        w.scales.ptr<uint16_t>()[r * scales.size() + g] = f32_to_bf16(scales[g]);
        w.biases.ptr<uint16_t>()[r * scales.size() + g] = f32_to_bf16(biases[g]);
      } else {
        w.scales.ptr<uint8_t>()[r * scales.size() + g] = codes8[g];
      }
    }
  }
  return w;
}

double relative_rms(const Tensor& a, const Tensor& b) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff += std::pow(double(a.ptr<float>()[i]) - b.ptr<float>()[i], 2);
    norm += std::pow(double(b.ptr<float>()[i]), 2);
  }
  return std::sqrt(diff / std::max(norm, 1e-30));
}

std::vector<quant::Layout> layouts() {
  std::vector<quant::Layout> out;
  for (int bits : {2, 3, 4, 5, 6, 8})
    for (int group : {32, 64, 128}) out.push_back({quant::Mode::affine, bits, group});
  out.push_back({quant::Mode::mxfp4, 4, 32});
  out.push_back({quant::Mode::nvfp4, 4, 16});
  out.push_back({quant::Mode::mxfp8, 8, 32});
  return out;
}

TEST(QuantizedOps, CpuMatchesRefForEveryFormat) {
  std::mt19937 rng(21);
  std::normal_distribution<float> normal(0, 1);
  auto ref = make_ref_ops();
  auto cpu = make_cpu_ops(global_thread_pool());
  for (const quant::Layout& layout : layouts()) {
    const std::string label = fmt::format("{} {}-bit g{}", quant::traits(layout.mode).name, layout.bits,
                                          layout.group_size);
    const int64_t in = 256, out = 37;
    Weight w = random_weight(layout, {out, in}, rng);
    for (int64_t T : {1, 3, 9, 17}) {
      Tensor x = host_tensor(DType::f32, {T, in});
      for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = normal(rng);
      Tensor a = host_tensor(DType::f32, {T, out}), b = host_tensor(DType::f32, {T, out});
      cpu->linear(x, w, a);
      ref->linear(x, w, b);
      EXPECT_LE(relative_rms(a, b), 1e-5) << label << " linear T=" << T;
    }
    Tensor ids = host_tensor(DType::i32, {4});
    for (int i = 0; i < 4; ++i) ids.ptr<int32_t>()[i] = (i * 11) % out;
    Tensor a = host_tensor(DType::f32, {4, in}), b = host_tensor(DType::f32, {4, in});
    cpu->embedding(ids, w, a);
    ref->embedding(ids, w, b);
    EXPECT_EQ(relative_rms(a, b), 0.0) << label << " embedding";
  }
}

TEST(QuantizedOps, ExpertsMatchRef) {
  std::mt19937 rng(4);
  std::normal_distribution<float> normal(0, 1);
  auto ref = make_ref_ops();
  auto cpu = make_cpu_ops(global_thread_pool());
  const int64_t E = 4, I = 64, H = 128, T = 5, k = 2;
  for (const quant::Layout& layout : {quant::Layout{quant::Mode::affine, 4, 64}, quant::Layout{quant::Mode::affine, 3, 32},
                                      quant::Layout{quant::Mode::mxfp4, 4, 32}}) {
    Weight gate = random_weight(layout, {E, I, H}, rng), up = random_weight(layout, {E, I, H}, rng);
    Weight down = random_weight(layout, {E, H, I}, rng);
    Tensor x = host_tensor(DType::f32, {T, H}), ids = host_tensor(DType::i32, {T, k}), weights = host_tensor(DType::f32, {T, k});
    for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] = normal(rng);
    for (int64_t i = 0; i < T * k; ++i) {
      ids.ptr<int32_t>()[i] = static_cast<int32_t>((i * 3 + 1) % E);
      weights.ptr<float>()[i] = 0.5f;
    }
    Tensor a = host_tensor(DType::f32, {T, H}), b = host_tensor(DType::f32, {T, H});
    cpu->moe_experts(x, ids, weights, gate, up, down, a);
    ref->moe_experts(x, ids, weights, gate, up, down, b);
    EXPECT_LE(relative_rms(a, b), 1e-5) << quant::traits(layout.mode).name << layout.bits;
  }
}

}  // namespace
}  // namespace qinfer
