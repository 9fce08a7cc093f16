// One-token GEMV for MLX affine 4/8-bit weights: y[row] = Σ_groups s·Σq·x + b·Σx, read at HBM speed;
// several matrices reading the same x (q/k/v, gate/up) share one launch.
//
// A code masked in place at bit p (< 16) of a 16-bit half of its word is, as f32 bits, the denormal
// q·2^(p−149): exact, one AND per element and no offset to subtract. x is read with each element
// multiplied by 2^(S−p) for the bit position p its code sits at, so one FMA per element adds the
// exact product q·x·2^(S−149) and only the f32 sum rounds (as in a plain dot). S is chosen per
// 16-byte chunk of codes from its x's largest magnitude, which keeps those products normal (≈ 2^-24
// for the largest) and x·2^S finite; the chunk's 2^(149−S) is folded into the group scale. Limits:
// |x| or |s·x| beyond ~2^100 overflows, and a chunk whose largest |x| is below ~2^-80 keeps less than
// f32 precision in its own (negligible) share of the sum; no activation comes near either.
//
// A small kernel writes that pre-scaled x once per call (with each chunk's 2^(149−S) and Σx) to
// stream-ordered scratch; the main kernel is launched as its programmatic dependent, so its first
// code loads go out while x is prepared. In the main kernel a warp owns kRows rows and a slice of
// the row length (the block's warps split the row, as in gemv_dense.cu, so that few rows still
// spread over every SM): each lane loads one chunk of all kRows rows at once and reads its x once
// for all of them. Warps' partial sums meet in shared memory and are added in a fixed order:
// results depend on neither grid nor scheduling.
#include <cuda_fp16.h>

#include <array>
#include <atomic>

#include "backend/cuda/weights.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 8;  // rows per warp: kRows 16-byte loads in flight per lane
// Two blocks per SM within 128 registers a thread, no spills: 16 warps × 32 lanes × kRows·16 code
// bytes = 64 KiB in flight per SM, what Little's law asks at ~4.3 TB/s.
constexpr int kBlocksPerSm = 2;

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

// The matrices of one launch, sharing x and its quantization layout: matrix i owns blocks
// [first_block[i], first_block[i + 1]); a block's warps form kWarps / split row groups of kRows
// rows, each row split into `split` slices.
struct AffineBatch {
  int count, split, group_shift;
  int64_t chunks, row_bytes, groups;  // per row; chunks: 16-byte code chunks
  const char* codes[kMaxGemvMatrices];
  const void* scales[kMaxGemvMatrices];
  const void* biases[kMaxGemvMatrices];
  float* y[kMaxGemvMatrices];
  int64_t rows[kMaxGemvMatrices];
  int64_t first_block[kMaxGemvMatrices + 1];
};

__device__ __forceinline__ float pow2(int e) { return __uint_as_float(static_cast<uint32_t>(e + 127) << 23); }

// Streamed code bytes skip L1, which keeps x and the scales (shared by neighbouring lanes) cached there.
__device__ __forceinline__ void load_chunk(const char* p, uint32_t (&dst)[4]) {
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(dst[0]), "=r"(dst[1]), "=r"(dst[2]), "=r"(dst[3])
               : "l"(p));
}

// Chunk c's x as the dot reads it: xs[k] = x_k·2^(S−p_k), and meta = (2^(149−S), Σx in a fixed order).
template <int kBits>
__global__ void __launch_bounds__(256) prepare_x_kernel(const float* __restrict__ x, int64_t chunks,
                                                        float* __restrict__ xs, float2* __restrict__ meta) {
  using L = Layout<kBits>;
  allow_next_kernel();
  wait_for_previous_kernel();
  const int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (c >= chunks) return;
  float v[L::kChunk];
#pragma unroll
  for (int i = 0; i < L::kChunk / 4; ++i) {
    const float4 f = load_after_wait(reinterpret_cast<const float4*>(x + c * L::kChunk) + i);
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
  for (int i = 0; i < L::kChunk / 4; ++i) {
    float4 f;
    f.x = v[4 * i] * pow2(S - kBits * ((4 * i) % L::kHalfCodes));
    f.y = v[4 * i + 1] * pow2(S - kBits * ((4 * i + 1) % L::kHalfCodes));
    f.z = v[4 * i + 2] * pow2(S - kBits * ((4 * i + 2) % L::kHalfCodes));
    f.w = v[4 * i + 3] * pow2(S - kBits * ((4 * i + 3) % L::kHalfCodes));
    reinterpret_cast<float4*>(xs + c * L::kChunk)[i] = f;
  }
  meta[c] = make_float2(pow2(149 - S), sum);
}

template <int kBits, class Scale>
__global__ void __launch_bounds__(kWarps* kWarp, kBlocksPerSm)
    gemv_affine_kernel(const float* __restrict__ xs, const float2* __restrict__ meta,
                       const __grid_constant__ AffineBatch b) {
  using L = Layout<kBits>;
  using Raw = typename Scale::Raw;
  __shared__ float partial[kWarps][kRows];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  int m = 0;
  while (m + 1 < b.count && blockIdx.x >= b.first_block[m + 1]) ++m;
  const int row_groups = kWarps / b.split, row_group = warp / b.split, slice = warp % b.split;
  const int64_t block_row0 = (static_cast<int64_t>(blockIdx.x) - b.first_block[m]) * row_groups * kRows;
  const int64_t rows = b.rows[m], row0 = block_row0 + static_cast<int64_t>(row_group) * kRows;
  // Warp `warp` takes chunks [begin, end) of its rows; a short last group re-reads its last row
  // (and drops those sums), a group past the matrix's end reads nothing.
  const int64_t begin = b.chunks * slice / b.split, end = row0 < rows ? b.chunks * (slice + 1) / b.split : begin;
  const int live = static_cast<int>(rows - row0 < kRows ? rows - row0 : kRows);
  const char* codes = b.codes[m] + row0 * b.row_bytes;
  const Raw* scales = static_cast<const Raw*>(b.scales[m]) + row0 * b.groups;
  const Raw* biases = static_cast<const Raw*>(b.biases[m]) + row0 * b.groups;

  float acc[kRows] = {};
  uint32_t raw[kRows][4];
  Raw scale[kRows], bias[kRows];
  auto load = [&](int64_t c) {
    const int64_t group = (c * L::kChunk) >> b.group_shift;
    const char* row_codes = codes + c * 16;
    const Raw *row_scale = scales + group, *row_bias = biases + group;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      load_chunk(row_codes, raw[r]);
      scale[r] = __ldg(row_scale);
      bias[r] = __ldg(row_bias);
      if (r + 1 < live) row_codes += b.row_bytes, row_scale += b.groups, row_bias += b.groups;
    }
  };
  // The first codes are on their way while prepare_x_kernel runs; x is read after it has finished.
  allow_next_kernel();
  if (begin + lane < end) load(begin + lane);
  wait_for_previous_kernel();
  for (int64_t c = begin + lane; c < end; c += kWarp) {
    if (c != begin + lane) load(c);
    const float2 chunk = load_after_wait(meta + c);
    const float4* x = reinterpret_cast<const float4*>(xs + c * L::kChunk);
    float dot[kRows] = {};
#pragma unroll
    for (int word = 0; word < 4; ++word) {
      float xv[L::kWordCodes];
#pragma unroll
      for (int i = 0; i < L::kWordCodes / 4; ++i) {
        const float4 f = load_after_wait(x + word * (L::kWordCodes / 4) + i);
        xv[4 * i] = f.x, xv[4 * i + 1] = f.y, xv[4 * i + 2] = f.z, xv[4 * i + 3] = f.w;
      }
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const uint32_t lo = raw[r][word], hi = lo >> 16;
#pragma unroll
        for (int j = 0; j < L::kWordCodes; ++j) {
          const uint32_t bits = (j < L::kHalfCodes ? lo : hi) & (L::kMask << (kBits * (j % L::kHalfCodes)));
          dot[r] = __fmaf_rn(__uint_as_float(bits), xv[j], dot[r]);
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      // dot·2^(149−S) first: exact (a power of two), and finite wherever the true partial sum is.
      acc[r] = __fmaf_rn(Scale::decode(scale[r]), dot[r] * chunk.x, __fmaf_rn(Scale::decode(bias[r]), chunk.y, acc[r]));
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float sum = warp_sum(acc[r]);
    if (lane == 0) partial[warp][r] = sum;
  }
  __syncthreads();
  if (threadIdx.x < row_groups * kRows) {
    const int group = static_cast<int>(threadIdx.x) / kRows, r = static_cast<int>(threadIdx.x) % kRows;
    const int64_t row = block_row0 + static_cast<int64_t>(group) * kRows + r;
    if (row < rows) {
      float sum = 0.0f;
      for (int s = 0; s < b.split; ++s) sum += partial[group * b.split + s][r];
      b.y[m][row] = sum;
    }
  }
}

// SMs per device, read from the driver once (a launch must not wait on attribute queries).
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

// Blocks for b at its split; also fills first_block.
int64_t plan_blocks(AffineBatch& b) {
  const int64_t block_rows = static_cast<int64_t>(kWarps / b.split) * kRows;
  for (int i = 0; i < b.count; ++i) b.first_block[i + 1] = b.first_block[i] + (b.rows[i] + block_rows - 1) / block_rows;
  return b.first_block[b.count];
}

template <int kBits, class Scale>
void launch_kernel(const float* x, AffineBatch& b, cudaStream_t stream) {
  // Warps split a row only as far as a warp's 32 lanes have a chunk each, and further while the
  // blocks are fewer than the SMs.
  b.split = 1;
  while (b.split < kWarps && b.split * kWarp < b.chunks) b.split *= 2;
  int64_t blocks = plan_blocks(b);
  const int sms = sm_count();
  while (b.split < kWarps && blocks < sms) b.split *= 2, blocks = plan_blocks(b);
  if (blocks == 0) return;

  using L = Layout<kBits>;
  const int64_t in = b.chunks * L::kChunk;
  void* scratch = nullptr;
  QINFER_CUDA_CHECK(cudaMallocAsync(&scratch, in * sizeof(float) + b.chunks * sizeof(float2), stream));
  float* xs = static_cast<float*>(scratch);
  float2* meta = reinterpret_cast<float2*>(xs + in);  // in is a multiple of 32: aligned
  launch_overlapped(prepare_x_kernel<kBits>, static_cast<unsigned>((b.chunks + 255) / 256), 256, 0, stream, x,
                    b.chunks, xs, meta);
  launch_overlapped(gemv_affine_kernel<kBits, Scale>, static_cast<unsigned>(blocks), kWarps * kWarp, 0, stream, xs,
                    meta, b);
  QINFER_CUDA_CHECK(cudaFreeAsync(scratch, stream));
}

template <class Scale>
void launch_scaled(const float* x, AffineBatch& b, int bits, cudaStream_t stream) {
  if (bits == 8) return launch_kernel<8, Scale>(x, b, stream);
  launch_kernel<4, Scale>(x, b, stream);
}

// Whether the kernel takes w, and w with the batch's first matrix shares x's layout.
bool takes(const WeightView& w, const WeightView& first) {
  if (!w.quantized || w.mode != quant::Mode::affine || (w.bits != 4 && w.bits != 8) || !w.biases) return false;
  if ((w.group_size != 32 && w.group_size != 64 && w.group_size != 128) || w.in <= 0 || w.in % w.group_size != 0)
    return false;
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
  b.chunks = first.in * first.bits / 128;
  b.group_shift = first.group_shift;
  b.row_bytes = first.row_words * 4;
  b.groups = first.in >> first.group_shift;
  if (first.scale_dtype == DType::bf16) launch_scaled<ScaleBf16>(x, b, first.bits, stream);
  else if (first.scale_dtype == DType::f16) launch_scaled<ScaleF16>(x, b, first.bits, stream);
  else launch_scaled<ScaleF32>(x, b, first.bits, stream);
  return true;
}

}  // namespace qinfer::cuda
