// AVX2 dot products of f32 activations with MLX affine 4- and 8-bit rows, without materializing the
// dequantized row: per group g, Σ x·(s·q + b) = s·Σ x·q + b·Σ x, with Σ x per group computed once per
// token. Compiled with -mavx2 -mfma -mf16c; called only after cpu_has_avx2().
#include <immintrin.h>

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

// Σ_j x[j]·q[j] over one group of `n` (multiple of 8) 4-bit codes starting at word `w`.
inline __m256 dot4(const float* x, const uint32_t* w, int64_t n, __m256 acc) {
  const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
  const __m256i mask = _mm256_set1_epi32(0xF);
  for (int64_t j = 0; j < n; j += 8) {
    const __m256i codes = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(w[j / 8])), shifts), mask);
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + j), _mm256_cvtepi32_ps(codes), acc);
  }
  return acc;
}

inline __m256 dot8(const float* x, const uint32_t* w, int64_t n, __m256 acc) {
  const auto* bytes = reinterpret_cast<const uint8_t*>(w);
  for (int64_t j = 0; j < n; j += 8) {
    __m128i eight;
    std::memcpy(&eight, bytes + j, 8);  // low 8 bytes; the rest of the register is ignored
    const __m256i codes = _mm256_cvtepu8_epi32(eight);
    acc = _mm256_fmadd_ps(_mm256_loadu_ps(x + j), _mm256_cvtepi32_ps(codes), acc);
  }
  return acc;
}

}  // namespace

float affine_row_dot_avx2(const float* x, const float* x_group_sums, const uint32_t* codes, const float* scales,
                          const float* biases, int64_t in, int group_size, int bits) {
  const int64_t groups = in / group_size;
  const int64_t words_per_group = group_size * bits / 32;
  __m256 total = _mm256_setzero_ps();
  float bias_part = 0.0f;
  for (int64_t g = 0; g < groups; ++g) {
    const float* xg = x + g * group_size;
    const uint32_t* wg = codes + g * words_per_group;
    const __m256 acc = bits == 4 ? dot4(xg, wg, group_size, _mm256_setzero_ps())
                                 : dot8(xg, wg, group_size, _mm256_setzero_ps());
    total = _mm256_fmadd_ps(_mm256_set1_ps(scales[g]), acc, total);
    bias_part += biases[g] * x_group_sums[g];
  }
  return hsum(total) + bias_part;
}

}  // namespace qinfer::cpu
