#include "quant/quant.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace qinfer::quant {
namespace {

constexpr ModeTraits kModes[] = {
    {Mode::affine, "affine", 0, 0, true, true, DType::u8},
    {Mode::mxfp4, "mxfp4", 4, 32, false, false, DType::e8m0},
    {Mode::nvfp4, "nvfp4", 4, 16, false, false, DType::f8_e4m3},
    {Mode::mxfp8, "mxfp8", 8, 32, false, false, DType::e8m0},
};

void pack(uint32_t* row, int64_t j, int bits, uint32_t code) {
  const uint64_t bit = static_cast<uint64_t>(j) * static_cast<uint64_t>(bits);
  const uint64_t word = bit >> 5, shift = bit & 31;
  row[word] |= code << shift;
  if (shift + bits > 32) row[word + 1] |= code >> (32 - shift);
}

}  // namespace

const ModeTraits& traits(Mode mode) { return kModes[static_cast<int>(mode)]; }

Mode parse_mode(std::string_view name) {
  for (const ModeTraits& t : kModes)
    if (t.name == name) return t.mode;
  fail("unknown quantization mode '{}' (expected affine, mxfp4, nvfp4 or mxfp8)", name);
}

void validate(const Layout& layout) {
  const ModeTraits& t = traits(layout.mode);
  if (layout.mode == Mode::affine) {
    QINFER_CHECK(layout.bits == 2 || layout.bits == 3 || layout.bits == 4 || layout.bits == 5 || layout.bits == 6 ||
                     layout.bits == 8,
                 "affine quantization: bits must be 2, 3, 4, 5, 6 or 8, got {}", layout.bits);
    QINFER_CHECK(layout.group_size == 32 || layout.group_size == 64 || layout.group_size == 128,
                 "affine quantization: group size must be 32, 64 or 128, got {}", layout.group_size);
    return;
  }
  QINFER_CHECK(layout.bits == t.bits && layout.group_size == t.group_size,
               "{} quantization uses {} bits in groups of {}, got {} bits in groups of {}", t.name, t.bits,
               t.group_size, layout.bits, layout.group_size);
}

float decode_scale(const Layout& layout, DType scale_dtype, const void* scales, int64_t index, float global_scale) {
  const auto* bytes = static_cast<const uint8_t*>(scales);
  switch (layout.mode) {
    case Mode::affine: {
      float v;
      if (scale_dtype == DType::f32) std::memcpy(&v, bytes + 4 * index, 4);
      else convert_to_f32(scale_dtype, bytes + 2 * index, &v, 1);
      return v;
    }
    case Mode::mxfp4:
    case Mode::mxfp8: return e8m0_to_f32(bytes[index]);
    case Mode::nvfp4: return e4m3_to_f32(bytes[index]) * (global_scale > 0 ? global_scale / (448.0f * 6.0f) : 1.0f);
  }
  return 0;
}

void dequantize_row(const Layout& layout, const uint32_t* codes, DType scale_dtype, const void* scales,
                    const void* biases, float global_scale, int64_t in, float* out) {
  const int64_t groups = in / layout.group_size;
  if (layout.mode != Mode::affine) {
    // Every element code's value, decoded once: the exact decoders are branchy, and rows are long.
    static const std::array<float, 256> e4m3 = [] {
      std::array<float, 256> t{};
      for (int c = 0; c < 256; ++c) t[c] = e4m3_to_f32(static_cast<uint8_t>(c));
      return t;
    }();
    static const std::array<float, 16> e2m1 = [] {
      std::array<float, 16> t{};
      for (int c = 0; c < 16; ++c) t[c] = e2m1_to_f32(static_cast<uint8_t>(c));
      return t;
    }();
    const float* table = layout.mode == Mode::mxfp8 ? e4m3.data() : e2m1.data();
    for (int64_t g = 0; g < groups; ++g) {
      const float scale = decode_scale(layout, scale_dtype, scales, g, global_scale);
      for (int64_t j = g * layout.group_size; j < (g + 1) * layout.group_size; ++j)
        out[j] = table[extract(codes, j, layout.bits)] * scale;
    }
    return;
  }
  for (int64_t g = 0; g < groups; ++g) {
    const float scale = decode_scale(layout, scale_dtype, scales, g, global_scale);
    const float bias = decode_scale(layout, scale_dtype, biases, g, 0);
    for (int64_t j = g * layout.group_size; j < (g + 1) * layout.group_size; ++j)
      out[j] = scale * static_cast<float>(extract(codes, j, layout.bits)) + bias;
  }
}

void quantize_row(const Layout& layout, const float* w, int64_t in, uint32_t* codes, float* scales, float* biases,
                  uint8_t* scale_codes) {
  std::fill(codes, codes + packed_words(in, layout.bits), 0u);
  const int64_t gs = layout.group_size;
  for (int64_t g = 0; g < in / gs; ++g) {
    const float* x = w + g * gs;
    if (layout.mode == Mode::affine) {
      // MLX's affine rule: the edge farther from zero is represented exactly, so 0.0 is too.
      const float n_bins = static_cast<float>((1 << layout.bits) - 1);
      const auto [lo, hi] = std::minmax_element(x, x + gs);
      const float w_min = *lo, w_max = *hi;
      float s = std::max((w_max - w_min) / n_bins, 1e-7f);
      const bool min_is_edge = std::abs(w_min) > std::abs(w_max);
      if (!min_is_edge) s = -s;
      const float edge = min_is_edge ? w_min : w_max;
      const float q0 = std::nearbyint(edge / s);
      float bias = 0.0f;
      if (q0 != 0.0f) {
        s = edge / q0;
        bias = edge;
      }
      for (int64_t j = 0; j < gs; ++j) {
        const float q = std::clamp(std::nearbyint((x[j] - bias) / s), 0.0f, n_bins);
        pack(codes, g * gs + j, layout.bits, static_cast<uint32_t>(q));
      }
      scales[g] = s;
      biases[g] = bias;
      continue;
    }
    // Floating modes: scale = max|w| / element max; MX scales are powers of two (E8M0), NV's E4M3.
    float amax = 0.0f;
    for (int64_t j = 0; j < gs; ++j) amax = std::max(amax, std::abs(x[j]));
    const float element_max = layout.mode == Mode::mxfp8 ? 448.0f : 6.0f;
    uint8_t code;
    float scale;
    if (layout.mode == Mode::nvfp4) {
      code = f32_to_e4m3(amax / element_max);
      scale = e4m3_to_f32(code);
    } else {
      code = amax > 0.0f ? f32_to_e8m0(amax / element_max) : 0;
      scale = e8m0_to_f32(code);
    }
    scale_codes[g] = code;
    for (int64_t j = 0; j < gs; ++j) {
      const float v = scale > 0.0f ? x[j] / scale : 0.0f;
      const uint32_t q = layout.mode == Mode::mxfp8 ? f32_to_e4m3(v) : f32_to_e2m1(v);
      pack(codes, g * gs + j, layout.bits, q);
    }
  }
}

}  // namespace qinfer::quant
