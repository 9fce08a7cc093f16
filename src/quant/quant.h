#pragma once
// MLX quantization formats as data (qwen-spec §9). A quantized matrix [..., out, in] is stored as
// packed codes uint32 [..., out, in·bits/32] (an LSB-first bitstream per row: element j occupies
// stream bits [j·bits, (j+1)·bits), stream bit s is bit s%32 of word s/32, so 3/5/6-bit codes straddle
// words), plus one scale per group of `group_size` inputs (and, for affine, one bias per group).
#include <cstdint>
#include <string_view>

#include "core/dtype.h"

namespace qinfer::quant {

enum class Mode : uint8_t { affine, mxfp4, nvfp4, mxfp8 };

struct ModeTraits {
  Mode mode;
  std::string_view name;
  int bits;        // element bits; 0 = chosen per tensor (affine: 2, 3, 4, 5, 6 or 8)
  int group_size;  // 0 = chosen per tensor (affine: 32, 64 or 128)
  bool has_biases;
  bool float_scales;  // affine scales are stored in the weight dtype; the fp modes store uint8 codes
  DType scale_codes;  // what those uint8 codes are (E8M0 exponents, E4M3 values); affine: unused
};

const ModeTraits& traits(Mode mode);
// Error naming the mode when unknown.
Mode parse_mode(std::string_view name);

struct Layout {
  Mode mode = Mode::affine;
  int bits = 4;
  int group_size = 64;
};
// Error when the combination is not one MLX writes (affine bits / group, fixed fp layouts).
void validate(const Layout& layout);

inline int64_t packed_words(int64_t in, int bits) { return in * bits / 32; }

// Code j of a row of packed words.
inline uint32_t extract(const uint32_t* row, int64_t j, int bits) {
  const uint64_t bit = static_cast<uint64_t>(j) * static_cast<uint64_t>(bits);
  const uint64_t word = bit >> 5, shift = bit & 31;
  uint64_t v = row[word] >> shift;
  if (shift + bits > 32) v |= static_cast<uint64_t>(row[word + 1]) << (32 - shift);
  return static_cast<uint32_t>(v & ((1u << bits) - 1));
}

// Value of one group's scale (and bias) as f32: affine reads the stored float dtype; mxfp4/mxfp8
// decode an E8M0 exponent, nvfp4 an E4M3 value times `global_scale` / (448·6) when a global scale is stored.
float decode_scale(const Layout& layout, DType scale_dtype, const void* scales, int64_t index, float global_scale);

// Dequantizes one row of `in` elements. scales / biases point at the row's first group.
void dequantize_row(const Layout& layout, const uint32_t* codes, DType scale_dtype, const void* scales,
                    const void* biases, float global_scale, int64_t in, float* out);

// The reference quantizer of one row (MLX's rule, qwen-spec §9.1 / §9.2). Affine writes f32 scales and
// biases that the caller rounds to the stored dtype (codes are computed from the unrounded values, as
// MLX does); the fp modes write uint8 scale codes into scale_codes.
void quantize_row(const Layout& layout, const float* w, int64_t in, uint32_t* codes, float* scales, float* biases,
                  uint8_t* scale_codes);

}  // namespace qinfer::quant
