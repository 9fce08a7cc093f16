// AVX2 dot products of f32 activations with MLX affine 4- and 8-bit rows, without materializing the
// dequantized row: per group g, Σ x·(s·q + b) = s·Σ x·q + b·Σ x. Eight packed words are loaded at once
// and each code position is masked in place; the activations were permuted and pre-scaled by
// prepare() so that the masked integer converts straight to the right float product.
// Compiled with -mavx2 -mfma -mf16c; called only after cpu_has_avx2().
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cpu/quantized_kernels.h"

namespace qinfer::cpu {
namespace {

float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Σ over one block of 8 words of code·lane, per lane (the caller scales by the group's scale).
// 4-bit: 8 codes per lane. Codes 0..6 are masked in place (at most 15·2^24 < 2^31, exact in f32);
// the top one is shifted down so the sign bit never makes it negative.
// Masks for code i in place: 4-bit rows 0..6 (0xF << 4i), 8-bit rows 7..9 (0xFF << 8i).
alignas(32) constexpr uint32_t kMaskTable[10][8] = {
#define QINFER_ROW(m) {m, m, m, m, m, m, m, m}
    QINFER_ROW(0xFu),        QINFER_ROW(0xF0u),     QINFER_ROW(0xF00u),     QINFER_ROW(0xF000u),
    QINFER_ROW(0xF0000u),    QINFER_ROW(0xF00000u), QINFER_ROW(0xF000000u), QINFER_ROW(0xFFu),
    QINFER_ROW(0xFF00u),     QINFER_ROW(0xFF0000u),
#undef QINFER_ROW
};

// The table's address hidden from the optimizer: otherwise GCC rebuilds each constant from a
// general register (two port-5 uops) on every use instead of a folded memory operand.
inline const __m256i* masks() {
  const void* p = kMaskTable;
  asm("" : "+r"(p));
  return static_cast<const __m256i*>(p);
}

inline __m256 code(__m256i v, const __m256i* mask) {
  return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_load_si256(mask)));
}

inline __m256 block4(__m256i v, const float* x, const __m256i* m) {
  __m256 a0 = _mm256_mul_ps(code(v, m + 0), _mm256_loadu_ps(x));
  __m256 a1 = _mm256_mul_ps(code(v, m + 1), _mm256_loadu_ps(x + 8));
  a0 = _mm256_fmadd_ps(code(v, m + 2), _mm256_loadu_ps(x + 16), a0);
  a1 = _mm256_fmadd_ps(code(v, m + 3), _mm256_loadu_ps(x + 24), a1);
  a0 = _mm256_fmadd_ps(code(v, m + 4), _mm256_loadu_ps(x + 32), a0);
  a1 = _mm256_fmadd_ps(code(v, m + 5), _mm256_loadu_ps(x + 40), a1);
  a0 = _mm256_fmadd_ps(code(v, m + 6), _mm256_loadu_ps(x + 48), a0);
  a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 28)), _mm256_loadu_ps(x + 56), a1);
  return _mm256_add_ps(a0, a1);
}

// 8-bit: 4 codes per lane.
inline __m256 block8(__m256i v, const float* x, const __m256i* m) {
  __m256 a0 = _mm256_mul_ps(code(v, m + 7), _mm256_loadu_ps(x));
  __m256 a1 = _mm256_mul_ps(code(v, m + 8), _mm256_loadu_ps(x + 8));
  a0 = _mm256_fmadd_ps(code(v, m + 9), _mm256_loadu_ps(x + 16), a0);
  a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(v, 24)), _mm256_loadu_ps(x + 24), a1);
  return _mm256_add_ps(a0, a1);
}

inline __m256i load_words(const uint32_t* w) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)); }

// A block's per-lane scale: one group per block, or (4-bit, groups of 32) two halves.
inline __m256 split_scale(float low, float high) {
  return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_set1_ps(low)), _mm_set1_ps(high), 1);
}

template <DType D>
inline float scale_at(const void* p, int64_t g) {
  if constexpr (D == DType::f32) {
    return static_cast<const float*>(p)[g];
  } else {
    const uint16_t h = static_cast<const uint16_t*>(p)[g];
    if constexpr (D == DType::f16) return _cvtsh_ss(h);
    const uint32_t bits = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
  }
}

// Eight scales or biases from `p` + g as f32.
template <DType D>
inline __m256 load8_f32(const void* p, int64_t g) {
  if constexpr (D == DType::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(p) + g);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + g));
    if constexpr (D == DType::f16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <int Bits, DType D>
float row_dot(const float* lanes, const AffineShape& shape, const AffineRow& row) {
  constexpr int block = Bits == 4 ? 64 : 32;  // elements per 8 words
  const int64_t in = shape.in, group_size = shape.group_size, groups = in / group_size;
  const uint32_t* codes = row.codes;
  const __m256i* m = masks();
  __m256 t0 = _mm256_setzero_ps(), t1 = _mm256_setzero_ps();
  const auto block_sum = [&](int64_t k) {  // block k's per-lane Σ code·lane
    return Bits == 4 ? block4(load_words(codes + 8 * k), lanes + 64 * k, m)
                     : block8(load_words(codes + 8 * k), lanes + 32 * k, m);
  };
  if (group_size < block) {
    // 4-bit groups of 32: each block holds two groups, one per 128-bit half.
    for (int64_t k = 0; k < in / 64; ++k)
      t0 = _mm256_fmadd_ps(split_scale(scale_at<D>(row.scales, 2 * k), scale_at<D>(row.scales, 2 * k + 1)),
                           block_sum(k), t0);
  } else {
    // Groups in pairs into two totals: the scale-and-add chain is the only dependency between groups.
    const int64_t per_group = group_size / block;
    const auto group_sum = [&](int64_t g) {
      __m256 p = block_sum(g * per_group);
      for (int64_t k = 1; k < per_group; ++k) p = _mm256_add_ps(p, block_sum(g * per_group + k));
      return p;
    };
    const auto scale = [&](int64_t g) { return _mm256_set1_ps(scale_at<D>(row.scales, g)); };
    int64_t g = 0;
    for (; g + 1 < groups; g += 2) {
      t0 = _mm256_fmadd_ps(scale(g), group_sum(g), t0);
      t1 = _mm256_fmadd_ps(scale(g + 1), group_sum(g + 1), t1);
    }
    if (g < groups) t0 = _mm256_fmadd_ps(scale(g), group_sum(g), t0);
  }
  // Bias term: Σ_g b_g · Σ x over g.
  const float* group_sums = lanes + in;
  __m256 bias = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8)
    bias = _mm256_fmadd_ps(load8_f32<D>(row.biases, g), _mm256_loadu_ps(group_sums + g), bias);
  float tail = 0.0f;
  for (; g < groups; ++g) tail += scale_at<D>(row.biases, g) * group_sums[g];
  return hsum(_mm256_add_ps(_mm256_add_ps(t0, t1), bias)) + tail;
}

// The activation in the order the kernel meets it. Code i of lane l of a block is element
// block_start + l·k + i (k = 32/bits codes per lane); lanes[block_start + i·8 + l] is that element
// times 2^-(bits·i) for all but the top code, so that masking code i in place (value q·2^(bits·i))
// and converting it to float needs no shift: the power of two cancels exactly.
void prepare(const float* x, const AffineShape& shape, float* lanes) {
  const int bits = shape.bits, per_lane = 32 / bits, block = 8 * per_lane;
  for (int64_t b = 0; b < shape.in; b += block)
    for (int i = 0; i < per_lane; ++i) {
      const float factor = i + 1 == per_lane ? 1.0f : std::ldexp(1.0f, -bits * i);
      for (int l = 0; l < 8; ++l) lanes[b + i * 8 + l] = x[b + l * per_lane + i] * factor;
    }
  float* group_sums = lanes + shape.in;
  for (int64_t g = 0; g < shape.in / shape.group_size; ++g) {
    __m256 s = _mm256_setzero_ps();
    for (int j = 0; j < shape.group_size; j += 8) s = _mm256_add_ps(s, _mm256_loadu_ps(x + g * shape.group_size + j));
    group_sums[g] = hsum(s);
  }
}

template <int Bits, DType D>
void rows_dot(const float* lanes, const AffineShape& shape, const AffineRow* rows, int count, float* dots) {
  for (int r = 0; r < count; ++r) dots[r] = row_dot<Bits, D>(lanes, shape, rows[r]);
}

template <int Bits>
AffineRowsDot rows_dot_for(DType d) {
  return d == DType::f32   ? rows_dot<Bits, DType::f32>
         : d == DType::f16 ? rows_dot<Bits, DType::f16>
                           : rows_dot<Bits, DType::bf16>;
}

AffineRowsDot pick_rows_dot(const AffineShape& shape) {
  return shape.bits == 4 ? rows_dot_for<4>(shape.scale_dtype) : rows_dot_for<8>(shape.scale_dtype);
}

}  // namespace

const AffineKernel& affine_kernel_avx2() {
  static const AffineKernel kernel{8, prepare, pick_rows_dot};
  return kernel;
}

}  // namespace qinfer::cpu
