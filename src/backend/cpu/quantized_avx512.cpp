// The affine 4/8-bit GEMV with AVX-512 VNNI. A float GEMV spends three instructions per 16 codes
// (mask, convert, FMA); vpdpbusd multiplies 64 byte codes by 64 signed bytes in one. To keep f32
// accuracy the activation is split, per group, into three int8 parts:
//   x ≈ S·(X0 + X1/2^7 + X2/2^14),  S a power of two with max|x| / S ≤ 127,
// so x is represented to 2^-15 of its group's maximum, like an f32 product sum. A block of 16 packed
// words is dotted with each part into 16 int32 lanes, combined by shifts (Horner) and scaled once
// by s_group·S/2^14. Compiled with -mavx512f -mavx512bw -mavx512vl; called only after
// cpu_has_avx512() and a CPUID check for VNNI (quantized.cpp).
// GCC 12's own avx512fintrin.h trips -Wmaybe-uninitialized (its _mm512_undefined_* helpers); not ours.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "backend/cpu/quantized_kernels.h"

namespace qinfer::cpu {
namespace {

constexpr int kParts = 3;
constexpr int kPartBits = 7;  // |X1|, |X2| ≤ 2^6: a part never leaves int8
constexpr int kMinExponent = -100;  // S ≥ 2^-100 keeps 1/S finite for tiny groups

// A block is 16 packed words. 4-bit: the low and the high nibbles of its 64 bytes are two byte
// vectors ("halves"); byte 4l+j of half h is element 8l+2j+h, lane l holds elements 8l..8l+7.
// 8-bit: one half, byte i is element i, lane l holds elements 4l..4l+3.
template <int Bits>
struct Block {
  static constexpr int halves = Bits == 4 ? 2 : 1;
  static constexpr int elements = 64 * halves;
  static constexpr int per_lane = elements / 16;
  // Prepared bytes per block: each part's halves, then the 16 lane scales S/2^14 as f32.
  static constexpr int part_bytes = 64 * halves;
  static constexpr int bytes = kParts * part_bytes + 64;
  static_assert(bytes <= 4 * elements, "a prepared block must fit the f32 activation it replaces");
};

// vpdpbusd through asm: GCC 12 copies the accumulator of _mm512_dpbusd_epi32 through a spare
// register on every call (~20% of this loop's time), and clang 14 would need a target attribute.
inline __m512i dpbusd(__m512i acc, __m512i codes, const int8_t* parts) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(codes), "m"(*reinterpret_cast<const __m512i*>(parts)));
  return acc;
}
// The same on a zeroed accumulator; the xor is a zeroing idiom the core resolves at rename.
inline __m512i dpbusd_first(__m512i codes, const int8_t* parts) {
  __m512i acc;
  asm("vpxord %0, %0, %0\n\tvpdpbusd %2, %1, %0"
      : "=&v"(acc)
      : "v"(codes), "m"(*reinterpret_cast<const __m512i*>(parts)));
  return acc;
}

// Σ code·(X0·2^14 + X1·2^7 + X2) per lane for one block: at most 4·255·(127·2^14 + 2^13 + 2^6)
// < 2^31 for 8-bit codes (4 per lane), far less for 4-bit.
template <int Bits>
inline __m512i block_dot(const uint32_t* codes, const int8_t* parts) {
  const __m512i v = _mm512_loadu_si512(codes);
  if constexpr (Bits == 8) {
    __m512i acc = dpbusd_first(v, parts);
    acc = dpbusd(_mm512_slli_epi32(acc, kPartBits), v, parts + 64);
    return dpbusd(_mm512_slli_epi32(acc, kPartBits), v, parts + 128);
  } else {
    const __m512i nibble = _mm512_set1_epi8(0x0F);
    const __m512i lo = _mm512_and_si512(v, nibble), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nibble);
    __m512i acc = dpbusd(dpbusd_first(lo, parts), hi, parts + 64);
    acc = dpbusd(dpbusd(_mm512_slli_epi32(acc, kPartBits), lo, parts + 128), hi, parts + 192);
    return dpbusd(dpbusd(_mm512_slli_epi32(acc, kPartBits), lo, parts + 256), hi, parts + 320);
  }
}

// 16 scales or biases from `p` (only those in `mask`) as f32.
template <DType D>
inline __m512 load_f32(const void* p, __mmask16 mask) {
  if constexpr (D == DType::f32) {
    return _mm512_maskz_loadu_ps(mask, p);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(mask, p);
    if constexpr (D == DType::f16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

// The scale of each lane's group, from the `count` groups a block touches starting at `p`.
// bf16 goes straight to f32 lanes by one word permute into the high halves.
template <DType D>
inline __m512 lane_scales(const void* p, __mmask16 count_mask, __m512i lane_group, __m512i lane_group_words) {
  if constexpr (D == DType::bf16)
    return _mm512_castsi512_ps(_mm512_maskz_permutexvar_epi16(
        0xAAAAAAAAu, lane_group_words, _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(count_mask, p))));
  else
    return _mm512_permutexvar_ps(lane_group, load_f32<D>(p, count_mask));
}

template <DType D>
inline const char* at(const void* p, int64_t i) {
  return static_cast<const char*>(p) + i * (D == DType::f32 ? 4 : 2);
}

template <int Bits, DType D>
float row_dot(const float* prepared, const AffineShape& shape, const AffineRow& row) {
  using B = Block<Bits>;
  const int64_t blocks = shape.in / B::elements, groups = shape.in / shape.group_size;
  const int group_shift = __builtin_ctz(static_cast<unsigned>(shape.group_size));  // MLX: 32, 64 or 128
  // Lane l's group, counted from the block's first group.
  const __m512i lane_group = _mm512_srli_epi32(
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                         _mm512_set1_epi32(B::per_lane)),
      static_cast<unsigned>(group_shift));
  const __m512i lane_group_words = _mm512_slli_epi32(lane_group, 16);
  const int groups_per_block = B::elements > shape.group_size ? B::elements >> group_shift : 1;
  const __mmask16 block_groups = static_cast<__mmask16>((1u << groups_per_block) - 1);
  const auto* x = reinterpret_cast<const int8_t*>(prepared);
  const auto block_sum = [&](int64_t k) {
    const int8_t* xb = x + k * B::bytes;
    const __m512 s = _mm512_mul_ps(lane_scales<D>(at<D>(row.scales, (k * B::elements) >> group_shift), block_groups,
                                                  lane_group, lane_group_words),
                                   _mm512_loadu_ps(xb + kParts * B::part_bytes));
    return std::pair{s, _mm512_cvtepi32_ps(block_dot<Bits>(row.codes + 16 * k, xb))};
  };
  // Two totals: the scale-and-add chain is the only dependency between blocks.
  __m512 t0 = _mm512_setzero_ps(), t1 = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 1 < blocks; k += 2) {
    const auto [s0, d0] = block_sum(k);
    t0 = _mm512_fmadd_ps(s0, d0, t0);
    const auto [s1, d1] = block_sum(k + 1);
    t1 = _mm512_fmadd_ps(s1, d1, t1);
  }
  if (k < blocks) {
    const auto [s0, d0] = block_sum(k);
    t0 = _mm512_fmadd_ps(s0, d0, t0);
  }
  // Bias term: Σ_g b_g · Σ x over g.
  const float* group_sums = prepared + shape.in;
  for (int64_t g = 0; g < groups; g += 16) {
    const __mmask16 m = static_cast<__mmask16>(_bzhi_u32(0xFFFFu, static_cast<unsigned>(std::min<int64_t>(groups - g, 16))));
    t1 = _mm512_fmadd_ps(load_f32<D>(at<D>(row.biases, g), m), _mm512_maskz_loadu_ps(m, group_sums + g), t1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(t0, t1));
}

// The int8 parts of x, block by block (see Block), the lane scales S/2^14 and each group's Σx.
template <int Bits>
void prepare(const float* x, const AffineShape& shape, float* prepared) {
  using B = Block<Bits>;
  const int gs = shape.group_size;
  auto* out = reinterpret_cast<int8_t*>(prepared);
  float* group_sums = prepared + shape.in;
  // 4-bit: the even elements of 16 go to the low-nibble half, the odd ones to the high.
  const __m128i deinterleave = _mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  for (int64_t g = 0; g < shape.in / gs; ++g) {
    const float* xg = x + g * gs;
    __m512 amax = _mm512_setzero_ps(), sum = _mm512_setzero_ps();
    for (int j = 0; j < gs; j += 16) {
      const __m512 v = _mm512_loadu_ps(xg + j);
      amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
      sum = _mm512_add_ps(sum, v);
    }
    group_sums[g] = _mm512_reduce_add_ps(sum);
    // S = 2^e, the least power of two with max|x| / S ≤ 127. A non-finite group keeps S = max|x|
    // with zero parts, so its dot comes out non-finite as the exact one would.
    const float a = _mm512_reduce_max_ps(amax);
    float S = a, inverse = 0.0f;
    if (std::isfinite(a)) {
      uint32_t bits;
      const float a127 = a / 127.0f;
      std::memcpy(&bits, &a127, 4);
      const int e = std::max(static_cast<int>(bits >> 23) - 126, kMinExponent);  // ⌊log2⌋ + 1; a ≥ 0
      S = std::ldexp(1.0f, e);
      inverse = std::ldexp(1.0f, -e);
    }
    const __m512 inv = _mm512_set1_ps(inverse), step = _mm512_set1_ps(1 << kPartBits);
    for (int j = 0; j < gs; j += 16) {
      const int64_t e = g * gs + j, k = e / B::elements, chunk = e % B::elements / 16;
      __m512 r = _mm512_mul_ps(_mm512_loadu_ps(xg + j), inv);  // exact: a power of two
      for (int p = 0; p < kParts; ++p) {
        // Round to nearest; the remainder is exact and at most half a unit, so scaled by 2^7 it
        // rounds into [-64, 64].
        const __m512 q = _mm512_roundscale_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_mul_ps(_mm512_sub_ps(r, q), step);
        __m128i bytes = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(q));
        int8_t* dst = out + k * B::bytes + p * B::part_bytes;
        if constexpr (Bits == 4) {
          bytes = _mm_shuffle_epi8(bytes, deinterleave);
          _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + 8 * chunk), bytes);
          _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + 64 + 8 * chunk), _mm_unpackhi_epi64(bytes, bytes));
        } else {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16 * chunk), bytes);
        }
      }
    }
    // The lanes of this group in every block it covers.
    const float lane_scale = S / static_cast<float>(1 << (2 * kPartBits));
    for (int64_t e = g * gs; e < (g + 1) * gs; e += B::per_lane) {
      float* lanes = reinterpret_cast<float*>(out + e / B::elements * B::bytes + kParts * B::part_bytes);
      lanes[e % B::elements / B::per_lane] = lane_scale;
    }
  }
}

template <int Bits>
constexpr float (*row_dot_for(DType d))(const float*, const AffineShape&, const AffineRow&) {
  return d == DType::f32 ? row_dot<Bits, DType::f32> : d == DType::f16 ? row_dot<Bits, DType::f16> : row_dot<Bits, DType::bf16>;
}

void prepare_any(const float* x, const AffineShape& shape, float* prepared) {
  (shape.bits == 4 ? prepare<4> : prepare<8>)(x, shape, prepared);
}

float row_dot_any(const float* prepared, const AffineShape& shape, const AffineRow& row) {
  return (shape.bits == 4 ? row_dot_for<4>(shape.scale_dtype) : row_dot_for<8>(shape.scale_dtype))(prepared, shape, row);
}

}  // namespace

const AffineKernel& affine_kernel_avx512_vnni() {
  static const AffineKernel kernel{16, prepare_any, row_dot_any};
  return kernel;
}

}  // namespace qinfer::cpu
