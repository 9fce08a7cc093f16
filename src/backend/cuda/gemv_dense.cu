// One-token GEMV over dense weights (f32 | bf16 | f16), the decode step's bandwidth-bound core;
// several matrices reading the same x (q/k/v, gate/up) share one launch.
// A block owns kRows consecutive rows and its warps split the row length between them, so that a
// matrix of few rows (the k/v projections: 1024) still spreads over every SM; each lane keeps
// kRows × kUnits 16-byte weight loads in flight (Little's law: ~32 KiB per SM keeps HBM busy) and
// reads each x value once for all kRows rows. Warps' partial sums meet in shared memory and are
// added in a fixed order: results do not depend on scheduling.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/weights.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRows = 4;   // rows per block
constexpr int kUnits = 2;  // 16-byte loads per lane and row in flight

// Weight bytes skip L1, which keeps x (read by every block) cached there.
__device__ __forceinline__ uint4 load_weights(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// acc += Σ w·x over one 16-byte unit: 8 bf16/f16 or 4 f32 weights against x[j ..].
template <class Elem>
__device__ __forceinline__ float unit_dot(const uint4& raw, const float* __restrict__ x, float acc) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
  if constexpr (sizeof(typename Elem::Storage) == 4) {
    const float4 v = load_after_wait(reinterpret_cast<const float4*>(x));
    acc = fmaf(__uint_as_float(words[0]), v.x, acc);
    acc = fmaf(__uint_as_float(words[1]), v.y, acc);
    acc = fmaf(__uint_as_float(words[2]), v.z, acc);
    return fmaf(__uint_as_float(words[3]), v.w, acc);
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 v = load_after_wait(reinterpret_cast<const float4*>(x) + h);
      float w[4];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t word = words[2 * h + i];
        if constexpr (std::is_same_v<Elem, Bf16Elem>) {
          w[2 * i] = __uint_as_float(word << 16);
          w[2 * i + 1] = __uint_as_float(word & 0xFFFF0000u);
        } else {
          const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&word));
          w[2 * i] = f.x;
          w[2 * i + 1] = f.y;
        }
      }
      acc = fmaf(w[0], v.x, acc);
      acc = fmaf(w[1], v.y, acc);
      acc = fmaf(w[2], v.z, acc);
      acc = fmaf(w[3], v.w, acc);
    }
    return acc;
  }
}

// The matrices of one launch: matrix i owns blocks [first_block[i], first_block[i + 1]).
struct DenseBatch {
  int count;
  int64_t in;
  const void* w[kMaxGemvMatrices];
  float* y[kMaxGemvMatrices];
  int64_t rows[kMaxGemvMatrices];
  int64_t first_block[kMaxGemvMatrices + 1];
};

// kSwiglu: the batch is (gate, up) of one shape and y[0] gets silu(x·gate)·(x·up); a block owns
// kRows / 2 rows of each.
template <class Elem, bool kSwiglu>
__global__ void __launch_bounds__(kWarps* kWarp) gemv_dense_kernel(const float* __restrict__ x,
                                                                   const __grid_constant__ DenseBatch batch) {
  constexpr int kPerUnit = 16 / static_cast<int>(sizeof(typename Elem::Storage));
  __shared__ float partial[kWarps][kRows];
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  int m = 0;
  if constexpr (!kSwiglu)
    while (m + 1 < batch.count && blockIdx.x >= batch.first_block[m + 1]) ++m;
  float* __restrict__ y = batch.y[m];
  const int64_t rows = batch.rows[m];
  constexpr int kOut = kSwiglu ? kRows / 2 : kRows;  // outputs per block
  const int64_t row0 = (static_cast<int64_t>(blockIdx.x) - batch.first_block[m]) * kOut;
  const int64_t units = batch.in / kPerUnit;
  // Warp `warp` takes units [begin, end) of every row of the block, in steps of 32·kUnits.
  const int64_t begin = units * warp / kWarps, end = units * (warp + 1) / kWarps;
  const uint4* base[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const int64_t row = row0 + r % kOut < rows ? row0 + r % kOut : rows - 1;  // a short last block re-reads a row
    base[r] = static_cast<const uint4*>(batch.w[kSwiglu ? r / kOut : m]) + row * units;
  }
  float acc[kRows] = {};
  uint4 raw[kRows][kUnits];
  auto load = [&](int64_t u0) {
#pragma unroll
    for (int i = 0; i < kUnits; ++i) {
      const int64_t u = u0 + i * kWarp;
#pragma unroll
      for (int r = 0; r < kRows; ++r) raw[r][i] = u < end ? load_weights(base[r] + u) : make_uint4(0, 0, 0, 0);
    }
  };
  // The first weights are on their way before x (the previous kernel's output) may be read.
  allow_next_kernel();
  load(begin + lane);
  wait_for_previous_kernel();
  for (int64_t u0 = begin + lane; u0 < end;) {
#pragma unroll
    for (int i = 0; i < kUnits; ++i) {
      const int64_t u = u0 + i * kWarp;
      if (u < end) {
#pragma unroll
        for (int r = 0; r < kRows; ++r) acc[r] = unit_dot<Elem>(raw[r][i], x + u * kPerUnit, acc[r]);
      }
    }
    u0 += kWarp * kUnits;
    if (u0 < end) load(u0);
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float sum = warp_sum(acc[r]);
    if (lane == 0) partial[warp][r] = sum;
  }
  __syncthreads();
  if (threadIdx.x < kOut && row0 + threadIdx.x < rows) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][threadIdx.x];
    if constexpr (kSwiglu) {
      float up = 0.0f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) up += partial[w][threadIdx.x + kOut];
      sum = silu(sum) * up;  // silu_mul's arithmetic
    }
    y[row0 + threadIdx.x] = sum;
  }
}

}  // namespace

bool gemv_swiglu_fits(const float* x, const WeightView& gate, const WeightView& up) {
  const int64_t per_unit = gate.dtype == DType::f32 ? 4 : 8;
  return aligned16(x) && !gate.quantized && !up.quantized && gate.dtype == up.dtype &&
         (gate.dtype == DType::bf16 || gate.dtype == DType::f16 || gate.dtype == DType::f32) && gate.in == up.in &&
         gate.rows == up.rows && gate.in % per_unit == 0 && aligned16(gate.data) && aligned16(up.data);
}

void launch_gemv_swiglu(const float* x, const WeightView& gate, const WeightView& up, float* out, cudaStream_t stream) {
  DenseBatch b{};
  b.count = 2;
  b.in = gate.in;
  b.w[0] = gate.data;
  b.w[1] = up.data;
  b.y[0] = out;
  b.rows[0] = gate.rows;
  const auto blocks = static_cast<unsigned>((gate.rows + kRows / 2 - 1) / (kRows / 2));
  if (blocks == 0) return;
  switch (gate.dtype) {
    case DType::bf16: launch_overlapped(gemv_dense_kernel<Bf16Elem, true>, blocks, kWarps * kWarp, 0, stream, x, b); break;
    case DType::f16: launch_overlapped(gemv_dense_kernel<F16Elem, true>, blocks, kWarps * kWarp, 0, stream, x, b); break;
    default: launch_overlapped(gemv_dense_kernel<F32Elem, true>, blocks, kWarps * kWarp, 0, stream, x, b); break;
  }
}

bool try_launch_gemv_dense(const float* x, const GemvBatch& batch, cudaStream_t stream) {
  if (batch.count < 1 || batch.count > kMaxGemvMatrices || !aligned16(x)) return false;
  const WeightView& first = batch.w[0];
  const int64_t per_unit = first.dtype == DType::f32 ? 4 : 8;
  DenseBatch b{};
  b.count = batch.count;
  b.in = first.in;
  for (int i = 0; i < batch.count; ++i) {
    const WeightView& w = batch.w[i];
    if (w.quantized || w.dtype != first.dtype || w.in != first.in || w.in % per_unit != 0 || !aligned16(w.data))
      return false;
    b.w[i] = w.data;
    b.y[i] = batch.y[i];
    b.rows[i] = w.rows;
    b.first_block[i + 1] = b.first_block[i] + (w.rows + kRows - 1) / kRows;
  }
  const auto blocks = static_cast<unsigned>(b.first_block[batch.count]);
  if (blocks == 0) return true;
  switch (first.dtype) {
    case DType::bf16: launch_overlapped(gemv_dense_kernel<Bf16Elem, false>, blocks, kWarps * kWarp, 0, stream, x, b); break;
    case DType::f16: launch_overlapped(gemv_dense_kernel<F16Elem, false>, blocks, kWarps * kWarp, 0, stream, x, b); break;
    case DType::f32: launch_overlapped(gemv_dense_kernel<F32Elem, false>, blocks, kWarps * kWarp, 0, stream, x, b); break;
    default: return false;
  }
  return true;
}

}  // namespace qinfer::cuda
