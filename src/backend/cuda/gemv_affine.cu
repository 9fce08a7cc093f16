// One-token GEMV for MLX affine 4/8-bit weights: y[row] = Σ_groups s·Σq·x + b·Σx, read at HBM speed;
// several matrices reading the same x (q/k/v, gate/up) share one launch.
//
// A code masked in place at bit p (< 16) of a 16-bit half of its word is, as f32 bits, the denormal
// q·2^(p−149): exact, one AND per element and no offset to subtract. Each thread holds its share of x
// in registers with each element multiplied by 2^(S−p) for the bit position p its code sits at, so
// one FMA per element adds the exact product q·x·2^(S−149) and only the f32 sum rounds (as in a plain
// dot). S is chosen per 16-byte chunk of codes from its x's largest magnitude, which keeps those
// products normal (≈ 2^-24 for the largest) and x·2^S finite; the chunk's 2^(149−S) is folded into
// the group scale. Limits: |x| or |s·x| beyond ~2^100 overflows, and a chunk whose largest |x| is
// below ~2^-80 keeps less than f32 precision in its own (negligible) share of the sum; no activation
// comes near either.
//
// A block's threads split the row length: thread i owns chunks i, i + blockDim, … (coalesced 512-byte
// warp loads) and prepares their x once, then the block walks row tiles (every matrix of the batch)
// with a grid stride, loading the next tile while it adds this one. A tile's per-warp sums meet in
// shared memory and are added in a fixed order, so results depend on neither grid nor scheduling.
#include <cuda_fp16.h>

#include <array>
#include <atomic>

#include "backend/cuda/weights.cuh"

namespace qinfer::cuda {
namespace {

// x in registers: a thread owns one or two 16-byte chunks of codes (32 to 64 values of x), which
// takes rows of up to 2·kMaxThreads chunks (32768 4-bit or 16384 8-bit inputs).
constexpr int kMaxThreads = 512;

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
  static constexpr int kChunk = 128 / kBits;  // elements per 16-byte chunk of codes
  static constexpr int kWordCodes = 32 / kBits;
  static constexpr int kHalfCodes = 16 / kBits;  // codes per 16-bit half: bit position p = kBits·(k % this)
  static constexpr uint32_t kMask = (1u << kBits) - 1u;
};

// The matrices of one launch, sharing x and its quantization layout: matrix i owns row tiles
// [first_tile[i], first_tile[i + 1]).
struct AffineBatch {
  int count, chunks, group_shift;  // chunks: 16-byte code chunks per row
  int64_t row_bytes, groups;       // per row
  const char* codes[kMaxGemvMatrices];
  const void* scales[kMaxGemvMatrices];
  const void* biases[kMaxGemvMatrices];
  float* y[kMaxGemvMatrices];
  int64_t rows[kMaxGemvMatrices];
  int64_t first_tile[kMaxGemvMatrices + 1];
};

__device__ __forceinline__ float pow2(int e) { return __uint_as_float(static_cast<uint32_t>(e + 127) << 23); }

// Streamed code bytes skip L1, which keeps x and the scales (shared by neighbouring lanes) cached there.
__device__ __forceinline__ void load_chunk(const char* p, uint32_t (&dst)[4]) {
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(dst[0]), "=r"(dst[1]), "=r"(dst[2]), "=r"(dst[3])
               : "l"(p));
}

// One chunk's x as the dot reads it: x_k·2^(S−p_k), and 2^(149−S) and Σx (in a fixed order).
template <int kBits>
struct ChunkX {
  float v[Layout<kBits>::kChunk];
  float unscale, sum;
};

template <int kBits>
__device__ __forceinline__ void prepare_chunk(const float* __restrict__ x, ChunkX<kBits>& out) {
  using L = Layout<kBits>;
#pragma unroll
  for (int i = 0; i < L::kChunk / 4; ++i) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(x) + i);
    out.v[4 * i] = f.x, out.v[4 * i + 1] = f.y, out.v[4 * i + 2] = f.z, out.v[4 * i + 3] = f.w;
  }
  float top = 0.0f, sum = 0.0f;
#pragma unroll
  for (int i = 0; i < L::kChunk; ++i) top = fmaxf(top, fabsf(out.v[i])), sum += out.v[i];
  // |x| < 2^(e − 126) for biased exponent e, so |x|·2^S < 2^126 with S = 252 − e; S ≤ 127 keeps
  // 2^(S−p) normal, S ≥ 22 keeps 2^(149−S) finite.
  const int e = static_cast<int>(__float_as_uint(top) >> 23);
  const int S = min(max(252 - e, 22), 127);
#pragma unroll
  for (int i = 0; i < L::kChunk; ++i) out.v[i] *= pow2(S - kBits * (i % L::kHalfCodes));
  out.unscale = pow2(149 - S);
  out.sum = sum;
}

// One tile's loads: kRows rows × kK chunks of codes, with each chunk's group scale and bias.
template <class Scale, int kRows, int kK>
struct Tile {
  uint32_t codes[kRows][kK][4];
  typename Scale::Raw scale[kRows][kK], bias[kRows][kK];
};

// The matrix of tile t and the tile's first row.
__device__ __forceinline__ int tile_matrix(const AffineBatch& b, int64_t t, int64_t& row0, int rows_per_tile) {
  int m = 0;
  while (m + 1 < b.count && t >= b.first_tile[m + 1]) ++m;
  row0 = (t - b.first_tile[m]) * rows_per_tile;
  return m;
}

// kK chunks per thread, tiles of kRows rows.
template <int kBits, class Scale, int kK, int kRows>
__global__ void __launch_bounds__(kMaxThreads) gemv_affine_kernel(const float* __restrict__ x,
                                                                   const __grid_constant__ AffineBatch b) {
  using L = Layout<kBits>;
  using Raw = typename Scale::Raw;
  __shared__ float partial[2][kMaxThreads / kWarp][kRows];  // by tile parity: one barrier per tile
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  const int64_t tiles = b.first_tile[b.count], stride = gridDim.x;

  bool owns[kK];
  int64_t code_offset[kK], group[kK];
#pragma unroll
  for (int k = 0; k < kK; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    owns[k] = c < b.chunks;
    code_offset[k] = static_cast<int64_t>(c) * 16;
    group[k] = (static_cast<int64_t>(c) * L::kChunk) >> b.group_shift;
  }
  // A short last tile reads its matrix's last row again and drops those sums.
  auto fetch = [&](int64_t t, Tile<Scale, kRows, kK>& s) {
    if (t >= tiles) return;
    int64_t row0;
    const int m = tile_matrix(b, t, row0, kRows);
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const int64_t row = min(row0 + r, b.rows[m] - 1);
      const char* codes = b.codes[m] + row * b.row_bytes;
      const Raw* scales = static_cast<const Raw*>(b.scales[m]) + row * b.groups;
      const Raw* biases = static_cast<const Raw*>(b.biases[m]) + row * b.groups;
#pragma unroll
      for (int k = 0; k < kK; ++k) {
        if (owns[k]) {
          load_chunk(codes + code_offset[k], s.codes[r][k]);
          s.scale[r][k] = __ldg(scales + group[k]);
          s.bias[r][k] = __ldg(biases + group[k]);
        }
      }
    }
  };

  // The first two tiles' loads go out before x is prepared, so HBM is busy meanwhile.
  Tile<Scale, kRows, kK> buf[2];
  fetch(blockIdx.x, buf[0]);
  fetch(blockIdx.x + stride, buf[1]);
  ChunkX<kBits> xs[kK];
#pragma unroll
  for (int k = 0; k < kK; ++k) {
    if (owns[k]) prepare_chunk<kBits>(x + (threadIdx.x + static_cast<int64_t>(k) * blockDim.x) * L::kChunk, xs[k]);
  }

  for (int64_t t0 = blockIdx.x; t0 < tiles; t0 += 2 * stride) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int64_t t = t0 + i * stride;
      if (t >= tiles) break;  // t depends on the block alone: the whole block leaves together
      float acc[kRows];
      {
        const Tile<Scale, kRows, kK>& s = buf[i];
        float dot[kRows][kK];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          acc[r] = 0.0f;
#pragma unroll
          for (int k = 0; k < kK; ++k) dot[r][k] = 0.0f;
        }
#pragma unroll
        for (int word = 0; word < 4; ++word) {
#pragma unroll
          for (int k = 0; k < kK; ++k) {
#pragma unroll
            for (int r = 0; r < kRows; ++r) {
              const uint32_t lo = s.codes[r][k][word], hi = lo >> 16;
#pragma unroll
              for (int j = 0; j < L::kWordCodes; ++j) {
                const uint32_t bits = (j < L::kHalfCodes ? lo : hi) & (L::kMask << (kBits * (j % L::kHalfCodes)));
                dot[r][k] = __fmaf_rn(__uint_as_float(bits), xs[k].v[word * L::kWordCodes + j], dot[r][k]);
              }
            }
          }
        }
#pragma unroll
        for (int k = 0; k < kK; ++k) {
          if (!owns[k]) continue;
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            acc[r] = __fmaf_rn(Scale::decode(s.scale[r][k]) * xs[k].unscale, dot[r][k],
                               __fmaf_rn(Scale::decode(s.bias[r][k]), xs[k].sum, acc[r]));
          }
        }
      }
      fetch(t + 2 * stride, buf[i]);
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const float sum = warp_sum(acc[r]);
        if (lane == 0) partial[i][warp][r] = sum;
      }
      __syncthreads();
      if (threadIdx.x < kRows) {
        int64_t row0;
        const int m = tile_matrix(b, t, row0, kRows);
        const int64_t row = row0 + threadIdx.x;
        if (row < b.rows[m]) {
          float sum = 0.0f;
          for (int w = 0; w < warps; ++w) sum += partial[i][w][threadIdx.x];
          b.y[m][row] = sum;
        }
      }
    }
  }
}

// Launch-time facts read from the driver once: SM counts per device, and resident blocks per SM of
// each kernel and block size (a launch must not wait on attribute queries).
int sm_count() {
  constexpr int kDevices = 64;
  static std::array<std::atomic<int>, kDevices> cache{};
  int device = 0;
  QINFER_CUDA_CHECK(cudaGetDevice(&device));
  std::atomic<int>* slot = device < kDevices ? &cache[device] : nullptr;
  int sms = slot ? slot->load(std::memory_order_relaxed) : 0;
  if (sms == 0) {
    QINFER_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    if (slot) slot->store(sms, std::memory_order_relaxed);
  }
  return sms;
}

template <int kBits, class Scale, int kK, int kRows>
void launch_kernel(const float* x, AffineBatch& b, cudaStream_t stream) {
  for (int i = 0; i < b.count; ++i) b.first_tile[i + 1] = b.first_tile[i] + (b.rows[i] + kRows - 1) / kRows;
  const int64_t tiles = b.first_tile[b.count];
  if (tiles == 0) return;
  const auto kernel = gemv_affine_kernel<kBits, Scale, kK, kRows>;
  const int warps = (b.chunks + kK * kWarp - 1) / (kK * kWarp);
  static std::array<std::atomic<int>, kMaxThreads / kWarp + 1> resident{};
  int per_sm = resident[warps].load(std::memory_order_relaxed);
  if (per_sm == 0) {
    QINFER_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, warps * kWarp, 0));
    per_sm = std::max(per_sm, 1);
    resident[warps].store(per_sm, std::memory_order_relaxed);
  }
  // Every block resident at once: a block prepares x once and takes tiles until none are left.
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(tiles, static_cast<int64_t>(sm_count()) * per_sm));
  kernel<<<blocks, warps * kWarp, 0, stream>>>(x, b);
  QINFER_CUDA_CHECK_LAUNCH("gemv_affine_kernel<<<>>>");
}

// 4-bit: one chunk per thread and four rows per tile (64 code bytes per thread), or two chunks and
// one row for rows past kMaxThreads chunks, within the registers; 8-bit: two chunks and two rows.
template <class Scale>
void launch_scaled(const float* x, AffineBatch& b, int bits, cudaStream_t stream) {
  if (bits == 8) return launch_kernel<8, Scale, 2, 2>(x, b, stream);
  if (b.chunks <= kMaxThreads) return launch_kernel<4, Scale, 1, 4>(x, b, stream);
  launch_kernel<4, Scale, 2, 1>(x, b, stream);
}

// Whether the kernel takes w, and w with the batch's first matrix shares x's layout.
bool takes(const WeightView& w, const WeightView& first) {
  if (!w.quantized || w.mode != quant::Mode::affine || (w.bits != 4 && w.bits != 8) || !w.biases) return false;
  if ((w.group_size != 32 && w.group_size != 64 && w.group_size != 128) || w.in % w.group_size != 0) return false;
  if (w.in <= 0 || w.in * w.bits > 2 * kMaxThreads * 128) return false;
  if (w.scale_dtype != DType::f32 && w.scale_dtype != DType::bf16 && w.scale_dtype != DType::f16) return false;
  if (!aligned16(w.data) || w.row_words % 4 != 0 || w.row_words * 32 != w.in * w.bits) return false;
  return w.bits == first.bits && w.group_size == first.group_size && w.scale_dtype == first.scale_dtype &&
         w.in == first.in;
}

}  // namespace

bool try_launch_gemv_affine(const float* x, const GemvBatch& batch, cudaStream_t stream) {
  if (batch.count < 1 || batch.count > kMaxGemvMatrices || !aligned16(x)) return false;
  const WeightView& first = batch.w[0];
  AffineBatch b{};
  b.count = batch.count;
  for (int i = 0; i < batch.count; ++i) {
    const WeightView& w = batch.w[i];
    if (!takes(w, first)) return false;
    b.codes[i] = static_cast<const char*>(w.data);
    b.scales[i] = w.scales;
    b.biases[i] = w.biases;
    b.y[i] = batch.y[i];
    b.rows[i] = w.rows;
  }
  b.chunks = static_cast<int>(first.in * first.bits / 128);
  b.group_shift = first.group_shift;
  b.row_bytes = first.row_words * 4;
  b.groups = first.in >> first.group_shift;
  if (first.scale_dtype == DType::bf16) launch_scaled<ScaleBf16>(x, b, first.bits, stream);
  else if (first.scale_dtype == DType::f16) launch_scaled<ScaleF16>(x, b, first.bits, stream);
  else launch_scaled<ScaleF32>(x, b, first.bits, stream);
  return true;
}

}  // namespace qinfer::cuda
