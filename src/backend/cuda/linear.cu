// Decode-sized linear layers as fused GEMV kernels (weights read once and dequantized in registers,
// f32 accumulation), the dequantize-to-bf16-pairs kernel that feeds cuBLASLt for prefill-sized ones, and
// embedding lookups (dense and quantized rows).
#include <cuda_bf16.h>

#include <algorithm>

#include "backend/cuda/weights.cuh"

namespace qinfer::cuda {
namespace {

// --- tiles: kR rows × kT tokens per warp --------------------------------------------------------
// Lane l reads units l, l + 32, … of each of its warp's kR rows, so a warp's weight loads are
// contiguous and its x reads (one float4 per 4 elements and token, shared by the kR rows) are too.
// Each weight element is loaded and decoded once and used for every token from registers. Loads
// are double-buffered: the next kU units of every row are in flight while this batch is summed
// (Little's law: a few KiB per warp keeps HBM busy).

constexpr int kTileWarps = 4;

// Σ v·x over one unit for kR rows and T ≤ kT tokens, into dot[r][t]; Σx into xsum[t] (affine only).
template <class Fmt, int kT, int kR>
__device__ __forceinline__ void unit_dot(const uint32_t (&raw)[kR][Fmt::kUnitWords], const float* __restrict__ x,
                                         int64_t ldx, int T, float (&dot)[kR][kT], float (&xsum)[kT]) {
#pragma unroll
  for (int c = 0; c < Fmt::kUnit / 4; ++c) {
    float v[kR][4];
#pragma unroll
    for (int r = 0; r < kR; ++r) Fmt::decode4(raw[r], c, v[r]);
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      if (t < T) {
        const float4 xv = load_after_wait(reinterpret_cast<const float4*>(x + t * ldx + 4 * c));
        if constexpr (Fmt::kCombine == Combine::affine) xsum[t] += (xv.x + xv.y) + (xv.z + xv.w);
#pragma unroll
        for (int r = 0; r < kR; ++r)
          dot[r][t] = fmaf(v[r][3], xv.w, fmaf(v[r][2], xv.z, fmaf(v[r][1], xv.y, fmaf(v[r][0], xv.x, dot[r][t]))));
      }
    }
  }
}

template <class Fmt, int kT, int kR, int kU>
__global__ void __launch_bounds__(kTileWarps* kWarp)
    gemv_tile_kernel(const float* __restrict__ x, int T, WeightView w, float* __restrict__ y) {
  allow_next_kernel();
  wait_for_previous_kernel();
  constexpr int kWords = Fmt::kUnitWords;
  constexpr bool kGrouped = Fmt::kCombine != Combine::plain;
  const int lane = threadIdx.x % kWarp;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kTileWarps + threadIdx.x / kWarp) * kR;
  if (row0 >= w.rows) return;  // the whole warp leaves together
  // A short last tile reads the last row again and drops those sums.
  int64_t row[kR];
  const uint32_t* words[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    row[r] = row0 + r < w.rows ? row0 + r : w.rows - 1;
    words[r] = Fmt::row_words(w, row[r]);
  }
  const int64_t units = w.in / Fmt::kUnit;

  struct Batch {
    uint32_t raw[kU][kR][kWords];
    GroupScale scale[kU][kGrouped ? kR : 1];
  };
  // Units first + 32·i, i < kU, of every row (those past the row end are neither read nor used).
  auto fetch = [&](int64_t first, Batch& b) {
#pragma unroll
    for (int i = 0; i < kU; ++i) {
      const int64_t u = first + i * kWarp;
      if (u < units) {
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          load_unit<kWords>(words[r] + u * kWords, b.raw[i][r]);
          if constexpr (kGrouped) b.scale[i][r] = Fmt::unit_scale(w, row[r], u * Fmt::kUnit);
        }
      }
    }
  };

  float acc[kR][kT];
#pragma unroll
  for (int r = 0; r < kR; ++r)
#pragma unroll
    for (int t = 0; t < kT; ++t) acc[r][t] = 0.0f;

  Batch cur;
  fetch(lane, cur);
  for (int64_t first = lane; first < units; first += kWarp * kU) {
    Batch next;
    fetch(first + kWarp * kU, next);
#pragma unroll
    for (int i = 0; i < kU; ++i) {
      const int64_t u = first + i * kWarp;
      if (u >= units) break;
      const float* xu = x + u * Fmt::kUnit;
      float xsum[kT] = {};
      if constexpr (kGrouped) {
        float dot[kR][kT] = {};
        unit_dot<Fmt, kT, kR>(cur.raw[i], xu, w.in, T, dot, xsum);
#pragma unroll
        for (int r = 0; r < kR; ++r) {
          const auto g = cur.scale[i][r];
#pragma unroll
          for (int t = 0; t < kT; ++t) {
            if constexpr (Fmt::kCombine == Combine::affine) acc[r][t] = fmaf(g.scale, dot[r][t], fmaf(g.bias, xsum[t], acc[r][t]));
            else acc[r][t] = fmaf(g.scale, dot[r][t], acc[r][t]);
          }
        }
      } else {
        unit_dot<Fmt, kT, kR>(cur.raw[i], xu, w.in, T, acc, xsum);
      }
    }
    cur = next;
  }

#pragma unroll
  for (int r = 0; r < kR; ++r) {
#pragma unroll
    for (int t = 0; t < kT; ++t) {
      if (t < T) {
        const float sum = warp_sum(acc[r][t]);
        if (lane == 0 && row0 + r < w.rows) y[t * w.rows + row0 + r] = sum;
      }
    }
  }
}

// Rows per warp and units per lane and batch: one token takes two rows (more warps, for small
// matrices) and four units; more tokens take four rows, which halves the x reads per weight
// element, and two units, which keeps the accumulators of every token in registers.
template <class Fmt, int kT>
void launch_tile(const float* x, int T, const WeightView& w, float* y, cudaStream_t stream) {
  constexpr int kR = kT == 1 ? 2 : 4;
  constexpr int kU = kT == 1 ? 4 : 2;
  const int64_t tiles = (w.rows + kR - 1) / kR;
  const auto blocks = static_cast<unsigned>((tiles + kTileWarps - 1) / kTileWarps);
  launch_overlapped(gemv_tile_kernel<Fmt, kT, kR, kU>, blocks, kTileWarps * kWarp, 0, stream, x, T, w, y);
}

// --- the generic path: one warp per row (formats and alignments the tiles do not take) -----------

constexpr int kGemvWarps = 8;  // weight rows per block

// Several tokens keep kMaxT accumulators and activation loads in flight: one block per SM may take
// all the registers it wants; one token leaves room for two.
template <class Fmt, int kMaxT, bool kVec>
__global__ void __launch_bounds__(kGemvWarps* kWarp, kMaxT == 1 ? 2 : 1)
    gemv_kernel(const float* __restrict__ x, int T, WeightView w, float* __restrict__ y) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int lane = threadIdx.x % kWarp;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kGemvWarps + threadIdx.x / kWarp;
  if (row >= w.rows) return;  // the whole warp leaves together
  float acc[kMaxT];
#pragma unroll
  for (int t = 0; t < kMaxT; ++t) acc[t] = 0.0f;
  Fmt::template row_dot<kMaxT, kVec>(w, row, x, w.in, T, lane, acc);
#pragma unroll
  for (int t = 0; t < kMaxT; ++t) {
    if (t < T) {
      const float sum = warp_sum(acc[t]);
      if (lane == 0) y[t * w.rows + row] = sum;
    }
  }
}

// --- tensor cores: mma.m16n8k16 (bf16 × bf16 → f32) for dense bf16 and MLX affine 4/8-bit ------
// A is 16 weight rows × 16 k, exact in bf16 (dense values as stored; affine codes q as small
// integers); B is 16 k × 8 columns of activations. An f32 activation is split exactly into three
// bf16 pieces by truncation, x = hi + lo + lo2 (hi: x's top 16 bits; lo: the top 16 bits of the
// exact f32 rest x − hi, which has ≤ 16 significant bits; lo2: the rest of that, ≤ 8 bits, so
// exact), so every product is exact and only the f32 accumulation rounds. Up to two tokens put
// their 3·T (token, piece) columns in one mma; more tokens take one mma per piece into the same
// accumulator, columns = tokens.
//
// A warp owns 32 rows (two 16-row tiles) and a range of groups; a block's warps split the row's
// groups and add their sums through shared memory in a fixed order (deterministic). Within a group
// the k order is free when A and B agree: lane (g = lane/4, q = lane%4) loads quarter q of the
// group of its rows g, g+8, 16+g, 24+g — contiguous bytes, 16 at a time where the group allows —
// and k16 step i takes 4 elements of every quarter; B takes the same 4 x values of each quarter.
// Affine: y = Σ_groups s·Σq·x + b·Σx, with Σq·x in a per-group accumulator and Σx from the x
// values the lanes load anyway.

constexpr int kMmaMaxWarps = 8;
constexpr int kMmaRows = 32;  // rows per block (two m16 tiles per warp)
constexpr uint32_t kHiBits = 0xFFFF0000u;

// kBits 16: dense bf16 (a "group" is just how often the mma accumulator is flushed into f32);
// kBits 4 | 8: MLX affine codes, kGroup << kScaleShift elements per scale (a scale group may be
// summed in parts: 8-bit groups of 128 in halves, which keeps the stages small enough for registers).
template <int kBits_, int kGroup_, int kScaleShift_ = 0>
struct MmaFormat {
  static constexpr int kBits = kBits_;
  static constexpr int kGroup = kGroup_;
  static constexpr int kScaleShift = kScaleShift_;
  static constexpr bool kAffine = kBits != 16;
  static constexpr int kQuarterBytes = kGroup * kBits / 32;  // one lane's share of a row's group
  static constexpr int kQuarterWords = kQuarterBytes / 4;
  static constexpr int kLoadBytes = kQuarterBytes < 16 ? kQuarterBytes : 16;
  static constexpr int kStepGroups = kQuarterBytes >= 16 ? 1 : 16 / kQuarterBytes;  // ≥ 16 bytes per row and step
  static constexpr int kK16 = kGroup / 16;                                              // mma k-steps per group
  static constexpr int kGroupBytes = kGroup * kBits / 8;
};

// Streamed weight bytes skip L1, which keeps the activations (read by every warp) cached there.
template <int kBytes>
__device__ __forceinline__ void load_stream(const char* p, uint32_t* dst) {
  if constexpr (kBytes == 16) {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(dst[0]), "=r"(dst[1]), "=r"(dst[2]), "=r"(dst[3])
                 : "l"(p));
  } else if constexpr (kBytes == 8) {
    asm volatile("ld.global.nc.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(dst[0]), "=r"(dst[1]) : "l"(p));
  } else {
    static_assert(kBytes == 4);
    asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];" : "=r"(dst[0]) : "l"(p));
  }
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// The top 16 bits of two f32 as one bf16 pair (u in the low half): exact for the pieces.
__device__ __forceinline__ uint32_t top_halves(float u, float v) {
  return __byte_perm(__float_as_uint(u), __float_as_uint(v), 0x7632);
}
// v minus its top 16 bits: exact in f32.
__device__ __forceinline__ float rest(float v) { return __fsub_rn(v, __uint_as_float(__float_as_uint(v) & kHiBits)); }
// v minus its top 16 bits when mask is kHiBits, v when it is 0.
__device__ __forceinline__ float rest_if(float v, uint32_t mask) {
  return __fsub_rn(v, __uint_as_float(__float_as_uint(v) & mask));
}

// 4-bit codes at bits shift..shift+3 of each half of w as an exact bf16 pair: 0x4300 | q is the
// bf16 128 + q (mantissa step 1), and 128 is subtracted exactly.
__device__ __forceinline__ uint32_t u4_pair(uint32_t w, int shift) {
  const uint32_t biased = ((w >> shift) & 0x000F000Fu) | 0x43004300u;
  const uint32_t k128 = 0x43004300u;
  const __nv_bfloat162 v = __hsub2(*reinterpret_cast<const __nv_bfloat162*>(&biased),
                                   *reinterpret_cast<const __nv_bfloat162*>(&k128));
  return *reinterpret_cast<const uint32_t*>(&v);
}
// Byte codes b, b+1 of w as an exact bf16 pair: 2^23 | q is the f32 2^23 + q, and q < 256 has
// at most 8 significant bits, so the conversion to bf16 is exact.
__device__ __forceinline__ uint32_t u8_pair(uint32_t w, int b) {
  const float lo = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7650 + b)) - 8388608.0f;
  const float hi = __uint_as_float(__byte_perm(w, 0x4B000000u, 0x7651 + b)) - 8388608.0f;
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// A-fragment half for k16 step i of a group from one row's quarter: {k 2q..2q+1, k 2q+8..2q+9}
// are elements {e0, e1} and {e2, e3} of the quarter, with (e0, e1, e2, e3) =
//   bf16 / 8-bit: 4i + (0, 1, 2, 3);   4-bit: 8(i/2) + 2(i%2) + (0, 4, 1, 5) (nibble pairs of a word).
template <class F>
__device__ __forceinline__ void a_half(const uint32_t (&words)[F::kQuarterWords], int i, uint32_t& lo, uint32_t& hi) {
  if constexpr (F::kBits == 16) {
    lo = words[2 * i];
    hi = words[2 * i + 1];
  } else if constexpr (F::kBits == 8) {
    lo = u8_pair(words[i], 0);
    hi = u8_pair(words[i], 2);
  } else {
    const int shift = 8 * (i % 2);
    lo = u4_pair(words[i / 2], shift);
    hi = u4_pair(words[i / 2], shift + 4);
  }
}

template <class F, bool kPacked>
__global__ void __launch_bounds__(kMmaMaxWarps* kWarp)
    gemv_mma_kernel(const float* __restrict__ x, int T, WeightView w, float* __restrict__ y) {
  allow_next_kernel();
  wait_for_previous_kernel();
  extern __shared__ float partial[];  // [warps][kMmaRows][8 columns]
  static_assert(F::kAffine || F::kScaleShift == 0, "dense rows have no scales");
  constexpr int kPieces = kPacked ? 1 : 3;
  constexpr int kWords = F::kQuarterWords;
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const int g = lane / 4, q = lane % 4;
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kMmaRows;

  // This lane's rows (tile r/2, half r%2) and quarters; a short last block reads the last row again.
  int64_t row[4];
  const char* quarter[4];
  const int64_t row_bytes = F::kAffine ? w.row_words * 4 : w.in * 2;
#pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int64_t want = row0 + 16 * (r / 2) + 8 * (r % 2) + g;
    row[r] = want < w.rows ? want : w.rows - 1;
    quarter[r] = static_cast<const char*>(w.data) + row[r] * row_bytes + q * F::kQuarterBytes;
  }
  const int64_t groups = w.in / F::kGroup;
  const int64_t steps = (groups + F::kStepGroups - 1) / F::kStepGroups;
  const int64_t step_begin = steps * warp / warps, step_end = steps * (warp + 1) / warps;

  // This lane's B column: (token, piece) = (g/3, g%3) packed, token g otherwise; unused columns are 0.
  const int t = kPacked ? g / 3 : g;
  const int piece = kPacked ? g % 3 : 0;
  const bool live = t < T;
  const float* xq = x + (live ? t : 0) * w.in + q * (F::kGroup / 4);
  const uint32_t cut1 = piece >= 1 ? kHiBits : 0u, cut2 = piece >= 2 ? kHiBits : 0u;

  struct Stage {
    uint32_t words[F::kStepGroups][4][kWords];
    float scale[F::kAffine ? F::kStepGroups : 1][4], bias[F::kAffine ? F::kStepGroups : 1][4];
  };
  auto fetch = [&](int64_t step, Stage& s) {
#pragma unroll
    for (int j = 0; j < F::kStepGroups; ++j) {
      const int64_t group = step * F::kStepGroups + j;
      if (group < groups) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
#pragma unroll
          for (int l = 0; l < F::kQuarterBytes / F::kLoadBytes; ++l)
            load_stream<F::kLoadBytes>(quarter[r] + group * F::kGroupBytes + l * F::kLoadBytes,
                                       &s.words[j][r][l * F::kLoadBytes / 4]);
          if constexpr (F::kAffine) {
            const int64_t at = row[r] * (groups >> F::kScaleShift) + (group >> F::kScaleShift);
            s.scale[j][r] = load_float(w.scales, at, w.scale_dtype);
            s.bias[j][r] = load_float(w.biases, at, w.scale_dtype);
          }
        }
      }
    }
  };

  float acc[2][4] = {};
  Stage cur;
  if (step_begin < step_end) fetch(step_begin, cur);
  for (int64_t step = step_begin; step < step_end; ++step) {
    Stage next;
    if (step + 1 < step_end) fetch(step + 1, next);
#pragma unroll
    for (int j = 0; j < F::kStepGroups; ++j) {
      const int64_t group = step * F::kStepGroups + j;
      if (group >= groups) break;
      const float* xg = xq + group * F::kGroup;
      float c[2][4] = {};
      float xsum = 0.0f;
#pragma unroll
      for (int i = 0; i < F::kK16; ++i) {
        // The x values of this step's elements (e0, e1, e2, e3): b0 = (e0, e1), b1 = (e2, e3).
        float v[4];
        if constexpr (F::kBits == 4) {
          const float4 z = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          const float4 u = live ? load_after_wait(reinterpret_cast<const float4*>(xg + 8 * (i / 2))) : z;
          const float4 h = live ? load_after_wait(reinterpret_cast<const float4*>(xg + 8 * (i / 2) + 4)) : z;
          if (i % 2 == 0) v[0] = u.x, v[1] = h.x, v[2] = u.y, v[3] = h.y;
          else v[0] = u.z, v[1] = h.z, v[2] = u.w, v[3] = h.w;
        } else {
          const float4 u = live ? load_after_wait(reinterpret_cast<const float4*>(xg + 4 * i)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
          v[0] = u.x, v[1] = u.y, v[2] = u.z, v[3] = u.w;
        }
        if constexpr (F::kAffine) xsum += (v[0] + v[1]) + (v[2] + v[3]);
        // B pieces, smallest first (they are added into the accumulator in this order).
        uint32_t b[kPieces][2];
        if constexpr (kPacked) {
          float p[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) p[e] = rest_if(rest_if(v[e], cut1), cut2);
          b[0][0] = top_halves(p[0], p[1]);
          b[0][1] = top_halves(p[2], p[3]);
        } else {
          float r1[4], r2[4];
#pragma unroll
          for (int e = 0; e < 4; ++e) r1[e] = rest(v[e]), r2[e] = rest(r1[e]);
          b[0][0] = top_halves(r2[0], r2[1]), b[0][1] = top_halves(r2[2], r2[3]);
          b[1][0] = top_halves(r1[0], r1[1]), b[1][1] = top_halves(r1[2], r1[3]);
          b[2][0] = top_halves(v[0], v[1]), b[2][1] = top_halves(v[2], v[3]);
        }
#pragma unroll
        for (int tile = 0; tile < 2; ++tile) {
          uint32_t a[4];
          a_half<F>(cur.words[j][2 * tile], i, a[0], a[2]);
          a_half<F>(cur.words[j][2 * tile + 1], i, a[1], a[3]);
#pragma unroll
          for (int pc = 0; pc < kPieces; ++pc) mma_bf16(c[tile], a, b[pc][0], b[pc][1]);
        }
      }
      if constexpr (F::kAffine) {
        // Σx of this group per column: the quad's lanes hold its 4 quarters; pieces other than
        // hi get none (their column carries no bias term).
        xsum += __shfl_xor_sync(0xFFFFFFFFu, xsum, 1);
        xsum += __shfl_xor_sync(0xFFFFFFFFu, xsum, 2);
        if (piece != 0) xsum = 0.0f;
        const float sx0 = __shfl_sync(0xFFFFFFFFu, xsum, 8 * q);  // column 2q lives in lanes 4·(2q)..
        const float sx1 = __shfl_sync(0xFFFFFFFFu, xsum, 8 * q + 4);
#pragma unroll
        for (int tile = 0; tile < 2; ++tile) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int r = 2 * tile + e / 2;
            acc[tile][e] = fmaf(cur.scale[j][r], c[tile][e], fmaf(cur.bias[j][r], e % 2 ? sx1 : sx0, acc[tile][e]));
          }
        }
      } else {
#pragma unroll
        for (int tile = 0; tile < 2; ++tile)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[tile][e] += c[tile][e];
      }
    }
    cur = next;
  }

  // C fragment: c0, c1 at (row g, columns 2q, 2q+1), c2, c3 at row g + 8.
  float* mine = partial + warp * kMmaRows * 8;
#pragma unroll
  for (int tile = 0; tile < 2; ++tile)
#pragma unroll
    for (int e = 0; e < 4; ++e) mine[(16 * tile + 8 * (e / 2) + g) * 8 + 2 * q + e % 2] = acc[tile][e];
  __syncthreads();
  for (int o = threadIdx.x; o < kMmaRows * T; o += blockDim.x) {
    const int r = o % kMmaRows, tok = o / kMmaRows;
    if (row0 + r >= w.rows) continue;
    float sum = 0.0f;
    for (int k = 0; k < warps; ++k) {
      const float* col = partial + (k * kMmaRows + r) * 8;
      sum += kPacked ? (col[3 * tok] + col[3 * tok + 1]) + col[3 * tok + 2] : col[tok];
    }
    y[tok * w.rows + row0 + r] = sum;
  }
}

template <class F>
void launch_mma(const float* x, int T, const WeightView& w, float* y, cudaStream_t stream) {
  const int64_t blocks = (w.rows + kMmaRows - 1) / kMmaRows;
  const int64_t steps = (w.in / F::kGroup + F::kStepGroups - 1) / F::kStepGroups;
  // Enough warps to keep HBM busy (about 16 per SM of an H200) and two steps per warp at least.
  int64_t warps = std::clamp<int64_t>((2048 + blocks - 1) / blocks, 1, kMmaMaxWarps);
  warps = std::max<int64_t>(1, std::min(warps, steps / 2));
  const auto threads = static_cast<unsigned>(warps * kWarp);
  const size_t smem = static_cast<size_t>(warps) * kMmaRows * 8 * sizeof(float);
  if (T <= 2) launch_overlapped(gemv_mma_kernel<F, true>, static_cast<unsigned>(blocks), threads, smem, stream, x, T, w, y);
  else launch_overlapped(gemv_mma_kernel<F, false>, static_cast<unsigned>(blocks), threads, smem, stream, x, T, w, y);
}

// The tensor-core path when it takes the view: dense bf16, or affine 4/8-bit with groups of
// 32/64/128, rows and x 16-byte aligned and in a multiple of 64.
bool try_launch_mma(const float* x, int T, const WeightView& w, float* y, cudaStream_t stream) {
  if (!aligned16(x) || !aligned16(w.data) || w.in % 64 != 0) return false;
  if (!w.quantized) {
    if (w.dtype != DType::bf16) return false;
    launch_mma<MmaFormat<16, 64>>(x, T, w, y, stream);
    return true;
  }
  if (w.mode != quant::Mode::affine || (w.bits != 4 && w.bits != 8) || w.row_words % 4 != 0 || !w.biases) return false;
  if (w.scale_dtype != DType::f32 && w.scale_dtype != DType::bf16 && w.scale_dtype != DType::f16) return false;
  switch (w.bits * 1000 + w.group_size) {
    case 4032: launch_mma<MmaFormat<4, 32>>(x, T, w, y, stream); return true;
    case 4064: launch_mma<MmaFormat<4, 64>>(x, T, w, y, stream); return true;
    case 4128: launch_mma<MmaFormat<4, 128>>(x, T, w, y, stream); return true;
    case 8032: launch_mma<MmaFormat<8, 32>>(x, T, w, y, stream); return true;
    case 8064: launch_mma<MmaFormat<8, 64>>(x, T, w, y, stream); return true;
    case 8128: launch_mma<MmaFormat<8, 64, 1>>(x, T, w, y, stream); return true;
    default: return false;
  }
}

// The tensor-core GEMM's operands as bf16 pairs: v = hi + lo with hi = bf16(v), lo = bf16(v − hi),
// which together carry 16 mantissa bits (a product of pairs is exact to ~2^-16, where one bf16
// operand alone costs ~2^-9 per element: enough to move the logits of small models by percents).
template <class Fmt>
__global__ void dequantize_bf16_pair_kernel(WeightView w, int64_t row0, int64_t rows, __nv_bfloat16* __restrict__ hi,
                                            __nv_bfloat16* __restrict__ lo) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    for (int64_t j = threadIdx.x; j < w.in; j += blockDim.x) {
      const float v = Fmt::element(w, row0 + r, j);
      const __nv_bfloat16 h = __float2bfloat16_rn(v);
      hi[r * w.in + j] = h;
      if (lo) lo[r * w.in + j] = __float2bfloat16_rn(v - __bfloat162float(h));
    }
  }
}

__global__ void to_bf16_pair_kernel(const float* __restrict__ x, int64_t n, __nv_bfloat16* __restrict__ hi,
                                    __nv_bfloat16* __restrict__ lo) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const __nv_bfloat16 h = __float2bfloat16_rn(x[i]);
    hi[i] = h;
    if (lo) lo[i] = __float2bfloat16_rn(x[i] - __bfloat162float(h));
  }
}

template <class Fmt>
__global__ void embedding_kernel(const int32_t* __restrict__ ids, int64_t T, WeightView table, float* __restrict__ out,
                                 DeviceStatus* status) {
  allow_next_kernel();
  wait_for_previous_kernel();
  // Grid y cuts a row into pieces: one block per token would decode a whole row alone (a decode
  // step's single token took ~11 µs on an H200).
  const int64_t first = blockIdx.y * int64_t{blockDim.x} + threadIdx.x, stride = int64_t{gridDim.y} * blockDim.x;
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int32_t id = ids[t];
    float* o = out + t * table.in;
    if (id < 0 || id >= table.rows) {
      if (first == 0) report(status, kStatusEmbeddingId, t, id, table.rows);
      for (int64_t j = first; j < table.in; j += stride) o[j] = 0.0f;
      continue;
    }
    for (int64_t j = first; j < table.in; j += stride) o[j] = Fmt::element(table, id, j);
  }
}

constexpr int kRowThreads = 256;
constexpr int64_t kMaxRowBlocks = 65535;

}  // namespace

void launch_gemv(const float* x, int64_t T, const WeightView& w, float* y, bool fast, cudaStream_t stream) {
  if (T == 0 || w.rows == 0) return;
  if (T > kGemvMaxTokens) throw_error("cuda gemv: at most 8 tokens per call");
  const bool x_vec = aligned16(x) && w.in % 4 == 0;
  const auto blocks = static_cast<unsigned>((w.rows + kGemvWarps - 1) / kGemvWarps);
  const int t = static_cast<int>(T);
  // Measured on the H200: one token reads fastest through the warp-per-row kernel (dense) and the
  // tiles (quantized formats gemv_affine does not take); several tokens through the tensor cores,
  // whose time hardly grows with T.
  if (T == 1) {
    GemvBatch one;
    one.count = 1;
    one.fast = fast;
    one.w[0] = w;
    one.y[0] = y;
    if (try_launch_gemv_dense(x, one, stream) || try_launch_gemv_affine(x, one, stream)) return;
  }
  if (T > 1 && try_launch_mma(x, t, w, y, stream)) {
    QINFER_CUDA_CHECK_LAUNCH("gemv_mma_kernel<<<>>>");
    return;
  }
  // Dense weights the tensor cores do not take: the warp-per-row kernel beats the tiles at every T.
  dispatch(w, [&](auto format) {
    using Fmt = decltype(format);
    if constexpr (Fmt::kTile && Fmt::kCombine != Combine::plain) {
      if (x_vec && Fmt::tileable(w)) {
        if (T == 1) return launch_tile<Fmt, 1>(x, t, w, y, stream);
        if (T == 2) return launch_tile<Fmt, 2>(x, t, w, y, stream);
        if (T <= 4) return launch_tile<Fmt, 4>(x, t, w, y, stream);
        return launch_tile<Fmt, kGemvMaxTokens>(x, t, w, y, stream);
      }
    }
    const bool vec = x_vec && Fmt::vectorizable(w);
    if (T == 1) {
      if (vec) launch_overlapped(gemv_kernel<Fmt, 1, true>, blocks, kGemvWarps * kWarp, 0, stream, x, t, w, y);
      else launch_overlapped(gemv_kernel<Fmt, 1, false>, blocks, kGemvWarps * kWarp, 0, stream, x, t, w, y);
    } else {
      if (vec) launch_overlapped(gemv_kernel<Fmt, kGemvMaxTokens, true>, blocks, kGemvWarps * kWarp, 0, stream, x, t, w, y);
      else launch_overlapped(gemv_kernel<Fmt, kGemvMaxTokens, false>, blocks, kGemvWarps * kWarp, 0, stream, x, t, w, y);
    }
  });
  QINFER_CUDA_CHECK_LAUNCH("gemv_kernel<<<>>>");
}

void launch_gemv_batch(const float* x, int64_t T, const GemvBatch& batch, cudaStream_t stream) {
  if (T == 1 && (try_launch_gemv_dense(x, batch, stream) || try_launch_gemv_affine(x, batch, stream))) return;
  for (int i = 0; i < batch.count; ++i) launch_gemv(x, T, batch.w[i], batch.y[i], batch.fast, stream);
}

void launch_dequantize_rows_bf16_pair(const WeightView& w, int64_t row0, int64_t rows, void* hi, void* lo,
                                      cudaStream_t stream) {
  if (rows == 0 || w.in == 0) return;
  const auto blocks = static_cast<unsigned>(std::min(rows, kMaxRowBlocks));
  dispatch(w, [&](auto format) {
    dequantize_bf16_pair_kernel<decltype(format)><<<blocks, kRowThreads, 0, stream>>>(
        w, row0, rows, static_cast<__nv_bfloat16*>(hi), static_cast<__nv_bfloat16*>(lo));
  });
  QINFER_CUDA_CHECK_LAUNCH("dequantize_bf16_pair_kernel<<<>>>");
}

void launch_to_bf16_pair(const float* x, int64_t n, void* hi, void* lo, cudaStream_t stream) {
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + kRowThreads - 1) / kRowThreads, 4096));
  to_bf16_pair_kernel<<<blocks, kRowThreads, 0, stream>>>(x, n, static_cast<__nv_bfloat16*>(hi),
                                                          static_cast<__nv_bfloat16*>(lo));
  QINFER_CUDA_CHECK_LAUNCH("to_bf16_pair_kernel<<<>>>");
}

void launch_embedding(const int32_t* ids, int64_t T, const WeightView& table, float* out, DeviceStatus* status,
                      cudaStream_t stream) {
  if (T == 0 || table.in == 0) return;
  // Pieces of kEmbeddingPiece elements a block; few tokens get several blocks each.
  constexpr int64_t kEmbeddingPiece = 4 * kRowThreads;
  const int64_t pieces = T >= 64 ? 1 : std::min<int64_t>((table.in + kEmbeddingPiece - 1) / kEmbeddingPiece, 64);
  const dim3 blocks(static_cast<unsigned>(std::min(T, kMaxRowBlocks)), static_cast<unsigned>(pieces));
  dispatch(table, [&](auto format) {
    launch_overlapped(embedding_kernel<decltype(format)>, blocks, kRowThreads, 0, stream, ids, T, table, out, status);
  });
  QINFER_CUDA_CHECK_LAUNCH("embedding_kernel<<<>>>");
}

}  // namespace qinfer::cuda
