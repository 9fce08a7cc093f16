// Greedy picks on the device: sampling.h's argmax (NaN never wins, −0 equals +0, the lowest id of
// the largest logit), so a greedy step copies one id per row to the host instead of the logits.
#include <algorithm>
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

// The best of a block's threads (every thread gets it back from warp 0 through shared memory).
__device__ Best block_best(Best best, Best* scratch) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    best = better(best, Best{__shfl_xor_sync(0xFFFFFFFFu, best.key, offset), __shfl_xor_sync(0xFFFFFFFFu, best.id, offset)});
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  __syncthreads();
  if (lane == 0) scratch[warp] = best;
  __syncthreads();
  best = lane < static_cast<int>(blockDim.x) / kWarp ? scratch[lane] : Best{INT_MIN, INT_MAX};
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    best = better(best, Best{__shfl_xor_sync(0xFFFFFFFFu, best.key, offset), __shfl_xor_sync(0xFFFFFFFFu, best.id, offset)});
  return best;
}

// Block (p, s) takes part p of row s's vocabulary: one block per row would read a 152k-entry row at
// one SM's bandwidth (~20 µs on an H200). Parts' bests go to `parts`; better() is a total order, so
// the merge below gives the same id whatever the split.
__global__ void __launch_bounds__(kThreads) argmax_parts_kernel(const float* __restrict__ logits, int64_t V,
                                                                 int64_t part_len, Best* __restrict__ parts) {
  __shared__ Best scratch[kWarp];
  const int64_t s = blockIdx.y, begin = blockIdx.x * part_len, end = min(V, begin + part_len);
  const float* row = logits + s * V;
  Best best{INT_MIN, INT_MAX};
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    best = better(best, Best{order_key(row[i]), static_cast<int32_t>(i)});
  best = block_best(best, scratch);
  if (threadIdx.x == 0) parts[s * gridDim.x + blockIdx.x] = best;  // gridDim.x = P
}

__global__ void __launch_bounds__(kWarp) argmax_merge_kernel(const Best* __restrict__ parts, int64_t S, int P,
                                                              int32_t* __restrict__ out) {
  for (int64_t s = blockIdx.x; s < S; s += gridDim.x) {
    Best best{INT_MIN, INT_MAX};
    for (int p = threadIdx.x; p < P; p += kWarp) best = better(best, parts[s * P + p]);
#pragma unroll
    for (int offset = kWarp / 2; offset > 0; offset /= 2)
      best = better(best, Best{__shfl_xor_sync(0xFFFFFFFFu, best.key, offset), __shfl_xor_sync(0xFFFFFFFFu, best.id, offset)});
    if (threadIdx.x == 0) out[s] = best.id;
  }
}

// Parts of a row: about 8 loads a thread, at most kMaxParts.
constexpr int kMaxParts = 64;
constexpr int64_t kMaxGridY = 65535;
int argmax_parts(int64_t V) {
  return static_cast<int>(std::clamp<int64_t>((V + 8 * kThreads - 1) / (8 * kThreads), 1, kMaxParts));
}

}  // namespace

size_t argmax_scratch_bytes(int64_t S, int64_t V) {
  return static_cast<size_t>(std::max<int64_t>(S, 0)) * argmax_parts(V) * sizeof(Best);
}

void launch_argmax_rows(const float* logits, int64_t S, int64_t V, int32_t* out, void* scratch, cudaStream_t stream) {
  if (S == 0) return;
  if (V <= 0 || V > INT_MAX) throw_error("cuda argmax: the vocabulary must have 1 .. 2^31 - 1 entries");
  const int P = argmax_parts(V);
  const int64_t part_len = (V + P - 1) / P;
  auto* parts = static_cast<Best*>(scratch);
  for (int64_t s0 = 0; s0 < S; s0 += kMaxGridY) {  // rows are grid y
    const int64_t rows = std::min(S - s0, kMaxGridY);
    argmax_parts_kernel<<<dim3(static_cast<unsigned>(P), static_cast<unsigned>(rows)), kThreads, 0, stream>>>(
        logits + s0 * V, V, part_len, parts + s0 * P);
    QINFER_CUDA_CHECK_LAUNCH("argmax_parts_kernel<<<>>>");
  }
  argmax_merge_kernel<<<static_cast<unsigned>(std::min(S, kMaxGridY)), kWarp, 0, stream>>>(parts, S, P, out);
  QINFER_CUDA_CHECK_LAUNCH("argmax_merge_kernel<<<>>>");
}

}  // namespace qinfer::cuda
