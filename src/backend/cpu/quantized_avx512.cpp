// The affine 4/8-bit GEMV with AVX-512 VNNI. A float GEMV spends three instructions per 16 codes
// (mask, convert, FMA); vpdpbusd multiplies 64 byte codes by 64 signed bytes in one. To keep f32
// accuracy the activation is split, per group, into three int8 parts:
//   x ≈ S·(X0 + X1/2^7 + X2/2^14),  S a power of two with max|x| / S ≤ 127,
// so x is represented within 2^-21 of its group's largest |x|, close to f32 rounding of the sum. A
// block of 16 packed words is dotted with each part into 16 int32 lanes, combined by shifts (Horner)
// and scaled once by s_group·S/2^14. Compiled with -mavx512f -mavx512bw -mavx512vl; called only
// after cpu_has_avx512() and a check for VNNI (quantized.cpp); GFNI is used where present.
// GCC 12's own avx512fintrin.h trips -Wmaybe-uninitialized (its _mm512_undefined_* helpers); not ours.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "backend/cpu/quantized_kernels.h"

namespace qinfer::cpu {
namespace {

constexpr int kParts = 3;
constexpr int kPartBits = 7;  // |X1|, |X2| ≤ 2^6: a part never leaves int8
constexpr int kMinExponent = -112;  // S/2^14 stays a normal float (groups of |x| < 2^-105 lose digits)

// A block is 16 packed words. 4-bit: the low and the high nibbles of its 64 bytes are two byte
// vectors ("halves"); byte 4l+j of half h is element 8l+2j+h, lane l holds elements 8l..8l+7.
// 8-bit: one half, byte i is element i, lane l holds elements 4l..4l+3.
template <int Bits>
struct Block {
  static constexpr int halves = Bits == 4 ? 2 : 1;
  static constexpr int elements = 64 * halves;
  static constexpr int per_lane = elements / 16;
  static constexpr int part_bytes = 64 * halves;
  static constexpr int bytes = kParts * part_bytes;  // the parts of a block, one after another
};

// The prepared activation: the blocks' parts (3 bytes per element), then each group's S/2^14,
// then (at `in` floats) each group's Σx.
inline const float* group_scales(const float* prepared, int64_t in) {
  return reinterpret_cast<const float*>(reinterpret_cast<const char*>(prepared) + kParts * in);
}

// vpdpbusd through asm: GCC 12 copies the accumulator of _mm512_dpbusd_epi32 through a spare
// register on every call (measured ~10% slower), and the intrinsic needs a VNNI target attribute.
// The parts stay memory operands: for the second row on they are L1 hits, and as values GCC would
// spill them to the stack.
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

// The high nibble of every byte, (v >> 4) & 0xF: one GF(2) affine map (bit i ← bit i+4) with
// GFNI, else a shift and a mask.
template <bool Gfni>
inline __m512i high_nibbles(__m512i v) {
  if constexpr (Gfni) {
    __m512i hi;
    asm("vgf2p8affineqb $0, %2, %1, %0" : "=v"(hi) : "v"(v), "v"(_mm512_set1_epi64(0x1020408000000000)));
    return hi;
  } else {
    return _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F));
  }
}

// Σ code·(X0·2^14 + X1·2^7 + X2) per lane for one block, from the block's parts: at most
// 4·255·(127·2^14 + 2^13 + 2^6) < 2^31 for 8-bit codes (4 per lane), far less for 4-bit.
template <int Bits, bool Gfni>
inline __m512i block_dot(const uint32_t* codes, const int8_t* parts) {
  const __m512i v = _mm512_loadu_si512(codes);
  if constexpr (Bits == 8) {
    __m512i acc = dpbusd_first(v, parts);
    acc = dpbusd(_mm512_slli_epi32(acc, kPartBits), v, parts + 64);
    return dpbusd(_mm512_slli_epi32(acc, kPartBits), v, parts + 128);
  } else {
    const __m512i lo = _mm512_and_si512(v, _mm512_set1_epi8(0x0F)), hi = high_nibbles<Gfni>(v);
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

template <DType D>
inline const char* at(const void* p, int64_t i) {
  return static_cast<const char*>(p) + i * (D == DType::f32 ? 4 : 2);
}

// Rows go 16 groups at a time: their combined scales s_g·S_g/2^14 fill one vector, and block j of
// those 16 picks its lanes' scales from it by a fixed permute, LaneGroups::index[j].
constexpr int kChunkGroups = 16;

template <int Bits, int GroupSize>
struct LaneGroups {
  static constexpr int blocks = kChunkGroups * GroupSize / Block<Bits>::elements;
  alignas(64) int32_t index[blocks][16];
  constexpr LaneGroups() : index{} {
    for (int j = 0; j < blocks; ++j)
      for (int l = 0; l < 16; ++l) index[j][l] = (j * Block<Bits>::elements + l * Block<Bits>::per_lane) / GroupSize;
  }
};
template <int Bits, int GroupSize>
constexpr LaneGroups<Bits, GroupSize> kLaneGroups{};

struct LaneTable {
  const int32_t (*index)[16];
  int blocks;  // per kChunkGroups groups
};

template <int Bits>
LaneTable lane_table(int group_size) {  // quant::validate allows 32, 64 and 128
  if (group_size == 32) return {kLaneGroups<Bits, 32>.index, kLaneGroups<Bits, 32>.blocks};
  if (group_size == 64) return {kLaneGroups<Bits, 64>.index, kLaneGroups<Bits, 64>.blocks};
  return {kLaneGroups<Bits, 128>.index, kLaneGroups<Bits, 128>.blocks};
}

// f(0), …, f(N − 1) with compile-time indices, so per-row values stay in registers.
template <int N, typename F>
inline void for_rows(F&& f) {
  [&]<int... r>(std::integer_sequence<int, r...>) { (f(std::integral_constant<int, r>{}), ...); }(
      std::make_integer_sequence<int, N>{});
}

// N rows against one activation, block by block: the rows after the first find its parts in L1.
template <int Bits, bool Gfni, DType D, int N>
void rows_dot(const float* prepared, const AffineShape& shape, const AffineRow* rows, float* dots) {
  using B = Block<Bits>;
  const LaneTable lanes = lane_table<Bits>(shape.group_size);
  const int64_t blocks = shape.in / B::elements, groups = shape.in / shape.group_size;
  const auto* parts = reinterpret_cast<const int8_t*>(prepared);
  const float* x_scales = group_scales(prepared, shape.in);
  const float* group_sums = prepared + shape.in;
  __m512 total[N];
  for_rows<N>([&](auto r) { total[r] = _mm512_setzero_ps(); });
  for (int64_t g = 0; g < groups; g += kChunkGroups) {
    const __mmask16 m = groups - g >= kChunkGroups ? 0xFFFF : static_cast<__mmask16>((1u << (groups - g)) - 1);
    const __m512 xs = _mm512_maskz_loadu_ps(m, x_scales + g), sums = _mm512_maskz_loadu_ps(m, group_sums + g);
    __m512 scales[N];
    for_rows<N>([&](auto r) {
      scales[r] = _mm512_mul_ps(load_f32<D>(at<D>(rows[r].scales, g), m), xs);
      // Bias term: Σ_g b_g · Σ x over g.
      total[r] = _mm512_fmadd_ps(load_f32<D>(at<D>(rows[r].biases, g), m), sums, total[r]);
    });
    const int64_t k0 = g * shape.group_size / B::elements, n = std::min<int64_t>(lanes.blocks, blocks - k0);
    for (int j = 0; j < n; ++j) {
      const int64_t k = k0 + j;
      const __m512i index = _mm512_load_si512(lanes.index[j]);
      for_rows<N>([&](auto r) {
        const __m512 d = _mm512_cvtepi32_ps(block_dot<Bits, Gfni>(rows[r].codes + 16 * k, parts + k * B::bytes));
        total[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(index, scales[r]), d, total[r]);
      });
    }
  }
  for_rows<N>([&](auto r) { dots[r] = _mm512_reduce_add_ps(total[r]); });
}

template <int Bits, bool Gfni, DType D>
void rows_dot_any(const float* prepared, const AffineShape& shape, const AffineRow* rows, int count, float* dots) {
  if (count == kAffineRows) return rows_dot<Bits, Gfni, D, kAffineRows>(prepared, shape, rows, dots);
  for (int r = 0; r < count; ++r) rows_dot<Bits, Gfni, D, 1>(prepared, shape, rows + r, dots + r);
}

inline int exponent_field(float f) {  // f ≥ 0
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  return static_cast<int>(bits >> 23);
}

inline float power_of_two(int e) {  // -126 ≤ e ≤ 127
  const uint32_t bits = static_cast<uint32_t>(e + 127) << 23;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// The int8 parts of x, block by block (see Block), each group's S/2^14 and Σx.
// Σx is taken over the represented x̃, not x: the dot is then exactly Σ w·x̃, an error Σ w·(x − x̃);
// with the exact Σx it would be Σ s·q·(x − x̃), several times larger since the codes q are all
// positive while the weights w = s·q + b are centred.
template <int Bits>
void prepare(const float* x, const AffineShape& shape, float* prepared) {
  using B = Block<Bits>;
  const int64_t gs = shape.group_size, groups = shape.in / gs;
  auto* out = reinterpret_cast<int8_t*>(prepared);
  float* x_scales = const_cast<float*>(group_scales(prepared, shape.in));
  float* group_sums = prepared + shape.in;
  // Two passes, so that no group's parts wait on its own horizontal max and sum.
  for (int64_t g = 0; g < groups; ++g) {
    __m512 amax = _mm512_setzero_ps(), sum = _mm512_setzero_ps();
    for (int64_t j = g * gs; j < (g + 1) * gs; j += 16) {
      const __m512 v = _mm512_loadu_ps(x + j);
      amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
      sum = _mm512_add_ps(sum, v);
    }
    // S = 2^e, the least power of two with max|x| / S ≤ 127. A non-finite group keeps S = max|x|
    // and gets zero parts below, so its dot comes out non-finite as the exact one would.
    const float a = _mm512_reduce_max_ps(amax);
    const int e = std::max(exponent_field(a / 127.0f) - 126, kMinExponent);  // ⌊log2⌋ + 1
    x_scales[g] = (std::isfinite(a) ? power_of_two(e) : a) / static_cast<float>(1 << (2 * kPartBits));
    group_sums[g] = _mm512_reduce_add_ps(sum);
  }
  // 4-bit: the even elements of 16 go to the low-nibble half, the odd ones to the high.
  const __m512i deinterleave = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15);
  const __m512 step = _mm512_set1_ps(1 << kPartBits);
  for (int64_t g = 0; g < groups; ++g) {
    const float S = x_scales[g] * static_cast<float>(1 << (2 * kPartBits));
    const __m512 inv = _mm512_set1_ps(std::isfinite(S) ? 1.0f / S : 0.0f);  // exact: a power of two
    __m512 residual = _mm512_setzero_ps();  // Σ (x − x̃) in units of S/2^14
    for (int64_t j = g * gs; j < (g + 1) * gs; j += 16) {
      const int64_t k = j / B::elements, chunk = j % B::elements / 16;
      __m512 v = _mm512_loadu_ps(x + j);
      if constexpr (Bits == 4) v = _mm512_permutexvar_ps(deinterleave, v);
      __m512 r = _mm512_mul_ps(v, inv);
      for (int p = 0; p < kParts; ++p) {
        // Round to nearest: the remainder is exact and at most half a unit, so scaled by 2^7 the
        // next part rounds into [-64, 64].
        const __m512 q = _mm512_roundscale_ps(r, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        r = _mm512_sub_ps(r, q);
        if (p + 1 < kParts) r = _mm512_mul_ps(r, step);
        const __m128i bytes = _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(q));
        int8_t* dst = out + k * B::bytes + p * B::part_bytes;
        if constexpr (Bits == 4) {
          _mm_storel_epi64(reinterpret_cast<__m128i*>(dst + 8 * chunk), bytes);
          _mm_storeh_pd(reinterpret_cast<double*>(dst + 64 + 8 * chunk), _mm_castsi128_pd(bytes));
        } else {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 16 * chunk), bytes);
        }
      }
      residual = _mm512_add_ps(residual, r);
    }
    group_sums[g] -= x_scales[g] * _mm512_reduce_add_ps(residual);
  }
}

template <int Bits, bool Gfni>
AffineRowsDot rows_dot_for(DType d) {
  return d == DType::f32   ? rows_dot_any<Bits, Gfni, DType::f32>
         : d == DType::f16 ? rows_dot_any<Bits, Gfni, DType::f16>
                           : rows_dot_any<Bits, Gfni, DType::bf16>;
}

bool cpu_has_gfni() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;  // CPUID leaf 7: ECX bit 8
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 8)) != 0;
}

AffineRowsDot pick_rows_dot(const AffineShape& shape) {
  static const bool gfni = cpu_has_gfni();
  if (shape.bits == 8) return rows_dot_for<8, false>(shape.scale_dtype);
  return gfni ? rows_dot_for<4, true>(shape.scale_dtype) : rows_dot_for<4, false>(shape.scale_dtype);
}

void prepare_any(const float* x, const AffineShape& shape, float* prepared) {
  (shape.bits == 4 ? prepare<4> : prepare<8>)(x, shape, prepared);
}

}  // namespace

const AffineKernel& affine_kernel_avx512_vnni() {
  static const AffineKernel kernel{16, prepare_any, pick_rows_dot};
  return kernel;
}

}  // namespace qinfer::cpu
