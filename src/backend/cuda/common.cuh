#pragma once
// Device helpers every kernel file shares: warp and block reductions, launch sizing, and reporting
// a bad index into the Ops' DeviceStatus.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

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

// Programmatic dependent launch (sm_90 and later). A kernel started with launch_overlapped may begin
// while the kernel before it in the stream still runs (its launch and its first loads, such as
// weights, overlap that kernel's tail: a decode step is hundreds of short kernels). Every such
// kernel calls wait_for_previous_kernel() before it touches memory an earlier kernel writes or
// reads (on every path, so that its end implies the end of all before it), and may call
// allow_next_kernel() to let the following kernel start early in turn.
__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}

// Loads of what an earlier kernel wrote, in kernels started with launch_overlapped. __ldg's
// read-only path is for memory that does not change while the kernel runs, and the compiler may
// serve or hoist such loads ahead of wait_for_previous_kernel(); these are plain loads, kept after it
// (volatile asm keeps its order).
__device__ __forceinline__ float load_after_wait(const float* p) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ int32_t load_after_wait(const int32_t* p) {
  int32_t v;
  asm volatile("ld.global.s32 %0, [%1];" : "=r"(v) : "l"(p));
  return v;
}

__device__ __forceinline__ float2 load_after_wait(const float2* p) {
  float2 v;
  asm volatile("ld.global.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p));
  return v;
}

__device__ __forceinline__ float4 load_after_wait(const float4* p) {
  float4 v;
  asm volatile("ld.global.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
  return v;
}

// kernel<<<grid, block, shared_bytes, stream>>>(args...) as a programmatic dependent launch.
template <typename... Params, typename... Args>
void launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes, cudaStream_t stream,
                       Args... args) {
  cudaLaunchAttribute overlap{};
  overlap.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  overlap.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = &overlap;
  config.numAttrs = 1;
  QINFER_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, static_cast<Params>(args)...));
}

// Blocks for a grid-stride loop over n items: enough to fill the device, never zero, never past the
// grid limit (the loop covers the rest).
inline unsigned grid_for(int64_t n, int threads, int64_t max_blocks = 4096) {
  const int64_t blocks = (n + threads - 1) / threads;
  return static_cast<unsigned>(std::clamp<int64_t>(blocks, 1, max_blocks));
}

// KV pool elements (KvPoolView): f32 kept as is, bf16 rounded to nearest even, both widened back
// to f32 exactly.
template <typename E>
__device__ __forceinline__ E to_kv(float x) {
  if constexpr (std::is_same_v<E, float>) return x;
  else return __float2bfloat16_rn(x);
}
__device__ __forceinline__ float from_kv(float x) { return x; }
__device__ __forceinline__ float from_kv(__nv_bfloat16 x) { return __bfloat162float(x); }
// Four pool elements at p (16-byte aligned for f32, 8 for bf16), widened; read-only for the kernel.
__device__ __forceinline__ float4 load4_kv(const float* p) { return __ldg(reinterpret_cast<const float4*>(p)); }
__device__ __forceinline__ float4 load4_kv(const __nv_bfloat16* p) {
  const uint2 bits = __ldg(reinterpret_cast<const uint2*>(p));
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits.y));
  return float4{lo.x, lo.y, hi.x, hi.y};
}

// Calls f(E{}) with E the element type of a KvPoolView: float, or __nv_bfloat16.
template <typename F>
void with_kv_type(const KvPoolView& pool, F&& f) {
  if (pool.bf16) f(__nv_bfloat16{});
  else f(float{});
}

}  // namespace qinfer::cuda
