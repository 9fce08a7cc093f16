// Greedy picks on the device: sampling.h's argmax (NaN never wins, −0 equals +0, the lowest id of
// the largest logit), so a greedy step copies one id per row to the host instead of the logits.
#include <climits>

#include "backend/cuda/common.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kThreads = 1024;

// The integer with the order of the canonical float (NaN → −inf, −0 → +0): sampling.cpp's order_key.
__device__ __forceinline__ int32_t order_key(float f) {
  uint32_t b = __float_as_uint(f);
  b = (b & 0x7FFFFFFFu) > 0x7F800000u ? 0xFF800000u : b == 0x80000000u ? 0u : b;
  const auto key = static_cast<int32_t>(b);
  return key ^ ((key >> 31) & 0x7FFFFFFF);
}

struct Best {
  int32_t key, id;
};

__device__ __forceinline__ Best better(Best a, Best b) {
  return b.key > a.key || (b.key == a.key && b.id < a.id) ? b : a;
}

__global__ void __launch_bounds__(kThreads, 1) argmax_kernel(const float* __restrict__ logits, int64_t S, int64_t V,
                                                          int32_t* __restrict__ out) {
  __shared__ Best scratch[kWarp];
  for (int64_t s = blockIdx.x; s < S; s += gridDim.x) {
    const float* row = logits + s * V;
    Best best{INT_MIN, INT_MAX};
    for (int64_t i = threadIdx.x; i < V; i += kThreads) best = better(best, Best{order_key(row[i]), static_cast<int32_t>(i)});
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset /= 2)
      best = better(best, Best{__shfl_xor_sync(0xFFFFFFFFu, best.key, offset), __shfl_xor_sync(0xFFFFFFFFu, best.id, offset)});
    const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
    __syncthreads();
    if (lane == 0) scratch[warp] = best;
    __syncthreads();
    if (warp == 0) {
      best = lane < kThreads / kWarp ? scratch[lane] : Best{INT_MIN, INT_MAX};
#pragma unroll
      for (int offset = kWarp / 2; offset > 0; offset /= 2)
        best = better(best, Best{__shfl_xor_sync(0xFFFFFFFFu, best.key, offset), __shfl_xor_sync(0xFFFFFFFFu, best.id, offset)});
      if (lane == 0) out[s] = best.id;
    }
  }
}

}  // namespace

void launch_argmax_rows(const float* logits, int64_t S, int64_t V, int32_t* out, cudaStream_t stream) {
  if (S == 0) return;
  if (V <= 0 || V > INT_MAX) throw_error("cuda argmax: the vocabulary must have 1 .. 2^31 - 1 entries");
  argmax_kernel<<<static_cast<unsigned>(std::min<int64_t>(S, 65535)), kThreads, 0, stream>>>(logits, S, V, out);
  QINFER_CUDA_CHECK_LAUNCH("argmax_kernel<<<>>>");
}

}  // namespace qinfer::cuda
