// One-token GEMV for MLX affine 4/8-bit weights: y[row] = Σ_groups s·Σq·x + b·Σx, read at HBM speed.
//
// A code masked in place at bit p (< 16) of a 16-bit half of its word is, as f32 bits, the denormal
// q·2^(p−149): exact, one AND per element and no offset to subtract. The block stages x once in shared
// memory with each element multiplied by 2^(S−p) for the bit position p its code sits at, so one FMA
// per element adds the exact product q·x·2^(S−149) and only the f32 sum rounds (as in a plain dot).
// S is chosen per chunk of x from its largest magnitude, which keeps those products normal
// (≈ 2^-24 for the largest) and x·2^S finite; the chunk's 2^(149−S) is folded into the group scale.
// Limits: |x| or |s·x| beyond ~2^100 overflows, and a chunk whose largest |x| is below ~2^-80 keeps
// less than f32 precision in its own (negligible) share of the sum; no activation comes near either.
//
// A lane owns chunks lane, lane + 32, … (16 code bytes each) of kRows rows, so a warp reads whole
// rows with 512-byte coalesced loads, keeps kInFlight chunk loads in flight per lane, and adds its
// rows with one warp reduction each (deterministic: a fixed order everywhere).
#include <cuda_fp16.h>

#include <algorithm>

#include "backend/cuda/weights.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kWarps = 4;  // small blocks: 1024 rows still spread over every SM
constexpr int kThreads = kWarps * kWarp;
constexpr int kInFlight = 8;  // 16-byte chunk loads in flight per lane (128 B: 4 KiB per warp)

// How affine scales and biases are stored: Raw is loaded, decode gives the f32 value.
struct ScaleF32 {
  using Raw = float;
  __device__ static float decode(Raw v) { return v; }
};
struct ScaleBf16 {
  using Raw = unsigned short;
  __device__ static float decode(Raw v) { return format::Bf16::decode(v); }
};
struct ScaleF16 {
  using Raw = unsigned short;
  // The hardware conversion is exact (it differs from F16::decode only in NaN payloads).
  __device__ static float decode(Raw v) { return __half2float(__ushort_as_half(v)); }
};

template <int kBits>
struct Layout {
  static constexpr int kChunk = 128 / kBits;   // elements per 16-byte chunk of codes
  static constexpr int kWordCodes = 32 / kBits;
  static constexpr int kHalfCodes = 16 / kBits;  // codes per 16-bit half: bit position p = kBits·(k % this)
  static constexpr int kStride = kChunk + 4;     // floats per staged chunk: x', then 2^(149−S), Σx, padding
  static constexpr uint32_t kMask = (1u << kBits) - 1u;
  // The padding also spreads the lanes' chunk reads (stride kStride floats) over all banks.
  static_assert(kStride % 8 == 4, "an odd number of bank quads per chunk: a quarter warp's 16-byte reads never collide");
};

__device__ __forceinline__ float pow2(int e) { return __uint_as_float(static_cast<uint32_t>(e + 127) << 23); }

// Streamed code bytes skip L1, which keeps the scales (shared by neighbouring lanes) cached there.
__device__ __forceinline__ void load_chunk(const char* p, uint32_t (&dst)[4]) {
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(dst[0]), "=r"(dst[1]), "=r"(dst[2]), "=r"(dst[3])
               : "l"(p));
}

// Chunk c of x into its shared record: x_k·2^(S−p_k), then 2^(149−S) and Σx (in a fixed order).
template <int kBits>
__device__ __forceinline__ void stage_chunk(const float* __restrict__ x, float* dst) {
  using L = Layout<kBits>;
  float v[L::kChunk];
#pragma unroll
  for (int i = 0; i < L::kChunk / 4; ++i) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(x) + i);
    v[4 * i] = f.x, v[4 * i + 1] = f.y, v[4 * i + 2] = f.z, v[4 * i + 3] = f.w;
  }
  float top = 0.0f, sum = 0.0f;
#pragma unroll
  for (int i = 0; i < L::kChunk; ++i) top = fmaxf(top, fabsf(v[i])), sum += v[i];
  // |x| < 2^(e − 126) for biased exponent e, so |x|·2^S < 2^126 with S = 252 − e; S ≤ 127 keeps
  // 2^(S−p) normal, S ≥ 22 keeps 2^(149−S) finite.
  const int e = static_cast<int>(__float_as_uint(top) >> 23);
  const int S = min(max(252 - e, 22), 127);
#pragma unroll
  for (int i = 0; i < L::kChunk; i += 4) {
    float4 f;
    f.x = v[i] * pow2(S - kBits * (i % L::kHalfCodes));
    f.y = v[i + 1] * pow2(S - kBits * ((i + 1) % L::kHalfCodes));
    f.z = v[i + 2] * pow2(S - kBits * ((i + 2) % L::kHalfCodes));
    f.w = v[i + 3] * pow2(S - kBits * ((i + 3) % L::kHalfCodes));
    *reinterpret_cast<float4*>(dst + i) = f;
  }
  *reinterpret_cast<float2*>(dst + L::kChunk) = make_float2(pow2(149 - S), sum);
}

template <class Scale, int kRows>
struct Stage {
  uint32_t codes[kRows][4];
  typename Scale::Raw scale[kRows], bias[kRows];
};

// acc[r] += s·Σq·x + b·Σx over one chunk of each row, from its staged record xs.
template <int kBits, class Scale, int kRows>
__device__ __forceinline__ void chunk_dot(const Stage<Scale, kRows>& s, const float* xs, float (&acc)[kRows]) {
  using L = Layout<kBits>;
  float dot[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) dot[r] = 0.0f;
#pragma unroll
  for (int word = 0; word < 4; ++word) {
    float xv[L::kWordCodes];
#pragma unroll
    for (int i = 0; i < L::kWordCodes; i += 4) {
      const float4 f = *reinterpret_cast<const float4*>(xs + word * L::kWordCodes + i);
      xv[i] = f.x, xv[i + 1] = f.y, xv[i + 2] = f.z, xv[i + 3] = f.w;
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const uint32_t lo = s.codes[r][word], hi = lo >> 16;
#pragma unroll
      for (int k = 0; k < L::kWordCodes; ++k) {
        const uint32_t bits = (k < L::kHalfCodes ? lo : hi) & (L::kMask << (kBits * (k % L::kHalfCodes)));
        dot[r] = __fmaf_rn(__uint_as_float(bits), xv[k], dot[r]);
      }
    }
  }
  const float2 fx = *reinterpret_cast<const float2*>(xs + L::kChunk);  // 2^(149−S), Σx
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    acc[r] = __fmaf_rn(Scale::decode(s.scale[r]) * fx.x, dot[r], __fmaf_rn(Scale::decode(s.bias[r]), fx.y, acc[r]));
}

template <int kBits, class Scale, int kRows>
__global__ void __launch_bounds__(kThreads) gemv_affine_kernel(const float* __restrict__ x, WeightView w,
                                                                 float* __restrict__ y) {
  using L = Layout<kBits>;
  constexpr int kDepth = kInFlight / kRows;
  extern __shared__ float4 staged_storage[];
  float* staged = reinterpret_cast<float*>(staged_storage);
  const int lane = threadIdx.x % kWarp;
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) * kWarps + threadIdx.x / kWarp) * kRows;
  const bool live = row0 < w.rows;  // a warp past the last row still helps stage x
  const int chunks = static_cast<int>(w.in / L::kChunk);
  const int64_t groups = w.in >> w.group_shift;

  // This lane's first chunk of each row and its group; a short last batch reads the last row again
  // and drops those sums.
  using Raw = typename Scale::Raw;
  const char* codes[kRows];
  const Raw *scales[kRows], *biases[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = row0 + r < w.rows ? row0 + r : w.rows - 1;
    codes[r] = static_cast<const char*>(w.data) + row * w.row_words * 4 + lane * 16;
    const int64_t group = row * groups + ((lane * L::kChunk) >> w.group_shift);
    scales[r] = static_cast<const Raw*>(w.scales) + group;
    biases[r] = static_cast<const Raw*>(w.biases) + group;
  }
  const int round_groups = (kWarp * L::kChunk) >> w.group_shift;  // a round (32 chunks) spans whole groups
  // Round j: chunk lane + 32·j of every row (none past the row end).
  auto fetch = [&](int j, Stage<Scale, kRows>& s) {
    if (live && lane + kWarp * j < chunks) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        load_chunk(codes[r] + j * (kWarp * 16), s.codes[r]);
        s.scale[r] = __ldg(scales[r] + j * round_groups);
        s.bias[r] = __ldg(biases[r] + j * round_groups);
      }
    }
  };

  // The first loads go out before the staging, so HBM is busy while x is prepared.
  Stage<Scale, kRows> buf[kDepth];
#pragma unroll
  for (int i = 0; i < kDepth; ++i) fetch(i, buf[i]);
  for (int c = threadIdx.x; c < chunks; c += kThreads)
    stage_chunk<kBits>(x + static_cast<int64_t>(c) * L::kChunk, staged + c * L::kStride);
  __syncthreads();
  if (!live) return;

  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;
  const int rounds = (chunks + kWarp - 1) / kWarp;
  for (int j0 = 0; j0 < rounds; j0 += kDepth) {
#pragma unroll
    for (int i = 0; i < kDepth; ++i) {
      const int c = lane + kWarp * (j0 + i);
      if (c < chunks) chunk_dot<kBits, Scale, kRows>(buf[i], staged + c * L::kStride, acc);
      fetch(j0 + i + kDepth, buf[i]);
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float sum = warp_sum(acc[r]);
    if (lane == 0 && row0 + r < w.rows) y[row0 + r] = sum;
  }
}

template <int kBits, class Scale, int kRows>
void launch_kernel(const float* x, const WeightView& w, float* y, size_t shared, cudaStream_t stream) {
  const auto kernel = gemv_affine_kernel<kBits, Scale, kRows>;
  // Beyond 48 KiB a kernel must opt in (a per-device function attribute, cheap to set again).
  if (shared > 48 * 1024)
    QINFER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  const int64_t per_block = static_cast<int64_t>(kWarps) * kRows;
  const auto blocks = static_cast<unsigned>((w.rows + per_block - 1) / per_block);
  kernel<<<blocks, kThreads, shared, stream>>>(x, w, y);
  QINFER_CUDA_CHECK_LAUNCH("gemv_affine_kernel<<<>>>");
}

// Rows per warp: four (x staged once per 16 rows) while that still gives every SM two blocks, fewer
// for smaller matrices, whose loads must then spread over more warps to be in flight at once.
template <int kBits, class Scale>
void launch_rows(const float* x, const WeightView& w, float* y, size_t shared, int sms, cudaStream_t stream) {
  const int64_t want = 2 * static_cast<int64_t>(sms) * kWarps;
  if (w.rows >= 4 * want) return launch_kernel<kBits, Scale, 4>(x, w, y, shared, stream);
  if (w.rows >= 2 * want) return launch_kernel<kBits, Scale, 2>(x, w, y, shared, stream);
  launch_kernel<kBits, Scale, 1>(x, w, y, shared, stream);
}

template <int kBits>
void launch_bits(const float* x, const WeightView& w, float* y, size_t shared, int sms, cudaStream_t stream) {
  if (w.scale_dtype == DType::bf16) return launch_rows<kBits, ScaleBf16>(x, w, y, shared, sms, stream);
  if (w.scale_dtype == DType::f16) return launch_rows<kBits, ScaleF16>(x, w, y, shared, sms, stream);
  launch_rows<kBits, ScaleF32>(x, w, y, shared, sms, stream);
}

}  // namespace

bool try_launch_gemv_affine(const float* x, const WeightView& w, float* y, cudaStream_t stream) {
  if (!w.quantized || w.mode != quant::Mode::affine || (w.bits != 4 && w.bits != 8) || !w.biases) return false;
  if ((w.group_size != 32 && w.group_size != 64 && w.group_size != 128) || w.in % w.group_size != 0) return false;
  if (w.scale_dtype != DType::f32 && w.scale_dtype != DType::bf16 && w.scale_dtype != DType::f16) return false;
  if (!aligned16(x) || !aligned16(w.data) || w.row_words % 4 != 0 || w.rows == 0) return false;
  const int chunk = 128 / w.bits;  // groups of 32+ hold whole chunks
  const size_t shared = static_cast<size_t>(w.in / chunk) * (chunk + 4) * sizeof(float);
  int device = 0, sms = 0, max_shared = 0;
  QINFER_CUDA_CHECK(cudaGetDevice(&device));
  QINFER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  QINFER_CUDA_CHECK(cudaDeviceGetAttribute(&max_shared, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  if (shared > static_cast<size_t>(max_shared)) return false;
  if (w.bits == 4) launch_bits<4>(x, w, y, shared, sms, stream);
  else launch_bits<8>(x, w, y, shared, sms, stream);
  return true;
}

}  // namespace qinfer::cuda
