// The affine 4/8-bit GEMV of quantized_avx2.cpp on 16 lanes: a block is 16 packed words (128 4-bit or
// 64 8-bit codes). A block may span several groups; each lane's scale is picked by a permute from the
// block's first groups. Compiled with -mavx512f -mavx512bw -mavx512vl; called only after cpu_has_avx512().
// GCC 12's own avx512fintrin.h trips -Wmaybe-uninitialized (its _mm512_undefined_* helpers); not ours.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstdint>

#include "backend/cpu/quantized_kernels.h"

namespace qinfer::cpu {
namespace {

// Code masks 0xF << 4i (4-bit, i < 7) and 0xFF << 8i (8-bit, i < 3), behind an opaque pointer so the
// compiler uses broadcast memory operands instead of rebuilding each constant from a register.
constexpr uint32_t kMasks[10] = {0xFu,     0xF0u,     0xF00u,     0xF000u,  0xF0000u,
                                 0xF00000u, 0xF000000u, 0xFFu, 0xFF00u, 0xFF0000u};
inline const uint32_t* masks() {
  const void* p = kMasks;
  asm("" : "+r"(p));
  return static_cast<const uint32_t*>(p);
}

inline __m512 code(__m512i v, uint32_t mask) {
  return _mm512_cvtepi32_ps(_mm512_and_epi32(v, _mm512_set1_epi32(static_cast<int>(mask))));
}

inline __m512 block4(__m512i v, const float* x, const uint32_t* m) {
  __m512 a0 = _mm512_mul_ps(code(v, m[0]), _mm512_loadu_ps(x));
  __m512 a1 = _mm512_mul_ps(code(v, m[1]), _mm512_loadu_ps(x + 16));
  a0 = _mm512_fmadd_ps(code(v, m[2]), _mm512_loadu_ps(x + 32), a0);
  a1 = _mm512_fmadd_ps(code(v, m[3]), _mm512_loadu_ps(x + 48), a1);
  a0 = _mm512_fmadd_ps(code(v, m[4]), _mm512_loadu_ps(x + 64), a0);
  a1 = _mm512_fmadd_ps(code(v, m[5]), _mm512_loadu_ps(x + 80), a1);
  a0 = _mm512_fmadd_ps(code(v, m[6]), _mm512_loadu_ps(x + 96), a0);
  a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 28)), _mm512_loadu_ps(x + 112), a1);
  return _mm512_add_ps(a0, a1);
}

inline __m512 block8(__m512i v, const float* x, const uint32_t* m) {
  __m512 a0 = _mm512_mul_ps(code(v, m[7]), _mm512_loadu_ps(x));
  __m512 a1 = _mm512_mul_ps(code(v, m[8]), _mm512_loadu_ps(x + 16));
  a0 = _mm512_fmadd_ps(code(v, m[9]), _mm512_loadu_ps(x + 32), a0);
  a1 = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(v, 24)), _mm512_loadu_ps(x + 48), a1);
  return _mm512_add_ps(a0, a1);
}

}  // namespace

float affine_row_dot_avx512(const float* lanes, const float* group_sums, const uint32_t* codes, const float* scales,
                            const float* biases, int64_t in, int group_size, int bits) {
  const int per_lane = 32 / bits, block = 16 * per_lane;
  const int64_t blocks = in / block, groups = in / group_size;
  const uint32_t* m = masks();
  const auto block_sum = [&](int64_t k) {
    const __m512i v = _mm512_loadu_si512(codes + 16 * k);
    return bits == 4 ? block4(v, lanes + block * k, m) : block8(v, lanes + block * k, m);
  };
  __m512 t0 = _mm512_setzero_ps(), t1 = _mm512_setzero_ps();
  if (group_size < block) {
    // Lane l holds elements l·per_lane … of the block: group (l·per_lane) / group_size of the block's.
    // (group sizes are powers of two: MLX allows 32, 64 and 128)
    const __m512i lane_group =
        _mm512_srli_epi32(_mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                             _mm512_set1_epi32(per_lane)),
                          static_cast<unsigned>(__builtin_ctz(static_cast<unsigned>(group_size))));
    const int64_t groups_per_block = block / group_size;
    for (int64_t k = 0; k < blocks; ++k) {
      const __m512 s = _mm512_permutexvar_ps(lane_group, _mm512_loadu_ps(scales + k * groups_per_block));
      t0 = _mm512_fmadd_ps(s, block_sum(k), t0);
    }
  } else {
    const int64_t per_group = group_size / block;
    const auto group_sum = [&](int64_t g) {
      __m512 p = block_sum(g * per_group);
      for (int64_t k = 1; k < per_group; ++k) p = _mm512_add_ps(p, block_sum(g * per_group + k));
      return p;
    };
    int64_t g = 0;
    for (; g + 1 < groups; g += 2) {
      t0 = _mm512_fmadd_ps(_mm512_set1_ps(scales[g]), group_sum(g), t0);
      t1 = _mm512_fmadd_ps(_mm512_set1_ps(scales[g + 1]), group_sum(g + 1), t1);
    }
    if (g < groups) t0 = _mm512_fmadd_ps(_mm512_set1_ps(scales[g]), group_sum(g), t0);
  }
  __m512 bias = _mm512_setzero_ps();
  int64_t g = 0;
  for (; g + 16 <= groups; g += 16)
    bias = _mm512_fmadd_ps(_mm512_loadu_ps(biases + g), _mm512_loadu_ps(group_sums + g), bias);
  float tail = 0.0f;
  for (; g < groups; ++g) tail += biases[g] * group_sums[g];
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(t0, t1), bias)) + tail;
}

}  // namespace qinfer::cpu
