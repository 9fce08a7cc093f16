#pragma once
// Device helpers every kernel file shares: warp and block reductions, launch sizing, and reporting
// a bad index into the Ops' DeviceStatus.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "backend/cuda/check.h"
#include "backend/cuda/launch.h"

namespace qinfer::cuda {

constexpr int kWarp = 32;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(0xFFFFFFFFu, v, offset));
  return v;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// `scratch` holds 32 values; the call begins and ends with a barrier so it can be called repeatedly.
template <typename T>
__device__ T block_sum(T v, T* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  T total = lane < warps ? scratch[lane] : T(0);
  total = warp_sum(total);
  return total;
}

// Max over the block, as block_sum.
__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, warps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  return warp_max(lane < warps ? scratch[lane] : -INFINITY);
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// Records the first bad index a kernel meets; later reports are dropped.
__device__ __forceinline__ void report(DeviceStatus* status, int32_t code, int64_t index, int32_t value, int64_t limit) {
  if (atomicCAS(&status->code, 0, -1) == 0) {
    status->index = static_cast<int32_t>(index);
    status->value = value;
    status->limit = static_cast<int32_t>(limit);
    __threadfence();
    atomicExch(&status->code, code);
  }
}

// Blocks for a grid-stride loop over n items: enough to fill the device, never zero, never past the
// grid limit (the loop covers the rest).
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 4096) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, max_blocks));
}

}  // namespace qinfer::cuda
