// Mixture of experts for prefill-sized batches, grouped by expert: a stable counting sort of the
// slots (t, j) by expert, the gather of their x rows into one block of bf16 rows per expert (the
// GEMM operands; cuda_ops.cpp runs the GEMMs through cuBLASLt), silu(gate)·up between the GEMMs,
// and the combine of each token's k down rows, weighted and summed in slot order (no atomics).
#include <cuda_bf16.h>

#include "backend/cuda/common.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kSortSlotsPerWarp = 512;  // slots one warp of the sort counts and places, in order
constexpr int kRowThreads = 256;
constexpr int64_t kMaxBlocks = 65535;

__device__ __forceinline__ int64_t round_up(int64_t n, int64_t align) { return (n + align - 1) / align * align; }

// hist[b, e] = slots of expert e among warp b's range; a bad id is reported and counted nowhere.
__global__ void __launch_bounds__(kWarp) moe_histogram_kernel(const int32_t* __restrict__ ids, int64_t slots,
                                                              int64_t index_base, int E, int32_t* __restrict__ hist,
                                                              DeviceStatus* status) {
  extern __shared__ int32_t counts[];  // [E]
  const int lane = threadIdx.x;
  for (int e = lane; e < E; e += kWarp) counts[e] = 0;
  __syncwarp();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kSortSlotsPerWarp;
  const int64_t end = min(slots, begin + kSortSlotsPerWarp);
  for (int64_t s = begin + lane; s < end; s += kWarp) {
    const int32_t e = ids[s];
    if (e >= 0 && e < E) atomicAdd(&counts[e], 1);
    else report(status, kStatusExpertId, index_base + s, e, E);
  }
  __syncwarp();
  for (int e = lane; e < E; e += kWarp) hist[static_cast<int64_t>(blockIdx.x) * E + e] = counts[e];
}

// One block: meta = [counts E | first row E | rows], each expert's block of rows starting at a
// multiple of `align`; then hist[b, e] becomes the first row of warp b's slots of expert e.
__global__ void __launch_bounds__(kRowThreads) moe_offsets_kernel(int32_t* __restrict__ hist, int warps, int E,
                                                                  int align, int32_t* __restrict__ meta) {
  extern __shared__ int32_t first[];  // [E]
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t n = 0;
    for (int b = 0; b < warps; ++b) n += hist[static_cast<int64_t>(b) * E + e];
    meta[e] = n;
    first[e] = static_cast<int32_t>(round_up(n, align));
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t row = 0;
    for (int e = 0; e < E; ++e) {
      const int32_t padded = first[e];
      first[e] = row;
      row += padded;
    }
    meta[2 * E] = row;
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int32_t row = first[e];
    meta[E + e] = row;
    for (int b = 0; b < warps; ++b) {
      const int32_t n = hist[static_cast<int64_t>(b) * E + e];
      hist[static_cast<int64_t>(b) * E + e] = row;
      row += n;
    }
  }
}

// slot_row[s] = the row of slot s in its expert's block: slots of one expert keep their (t, j)
// order (lanes of a step rank by lane, steps and warps follow the slots). −1 for a bad id.
__global__ void __launch_bounds__(kWarp) moe_place_kernel(const int32_t* __restrict__ ids, int64_t slots, int E,
                                                          const int32_t* __restrict__ hist,
                                                          int32_t* __restrict__ slot_row) {
  extern __shared__ int32_t cursor[];  // [E]
  const int lane = threadIdx.x;
  for (int e = lane; e < E; e += kWarp) cursor[e] = hist[static_cast<int64_t>(blockIdx.x) * E + e];
  __syncwarp();
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kSortSlotsPerWarp;
  const int64_t end = min(slots, begin + kSortSlotsPerWarp);
  for (int64_t step = begin; step < end; step += kWarp) {
    const int64_t s = step + lane;
    const int32_t e = s < end ? ids[s] : -1;
    const bool valid = s < end && e >= 0 && e < E;
    // Lanes without a valid expert get keys of their own (negative), so they match no other lane.
    const unsigned peers = __match_any_sync(0xFFFFFFFFu, valid ? e : -1 - lane);
    const int rank = __popc(peers & ((1u << lane) - 1u));
    const int32_t row = valid ? cursor[e] + rank : -1;
    __syncwarp();
    if (valid && rank == 0) cursor[e] += __popc(peers);
    __syncwarp();
    if (s < end) slot_row[s] = row;
  }
}

// Items below `slots`: slot s's x row as bf16 hi (and lo) into its expert's block, whose hi rows
// come first and lo rows after its padded count. Items past them: expert e's padding rows, zeroed
// so that the GEMMs, which run over padded counts, read finite values.
__global__ void __launch_bounds__(kRowThreads) moe_gather_kernel(const float* __restrict__ x, int64_t H, int64_t k,
                                                                 int64_t slots, int E, int align,
                                                                 const int32_t* __restrict__ ids,
                                                                 const int32_t* __restrict__ slot_row,
                                                                 const int32_t* __restrict__ meta, bool pairs,
                                                                 __nv_bfloat16* __restrict__ rows) {
  const int64_t f = pairs ? 2 : 1;
  const __nv_bfloat16 zero = __float2bfloat16_rn(0.0f);
  for (int64_t item = blockIdx.x; item < slots + E; item += gridDim.x) {
    if (item < slots) {
      const int32_t row = slot_row[item];
      if (row < 0) continue;
      const int e = ids[item];
      const int64_t first = meta[E + e], padded = round_up(meta[e], align);
      __nv_bfloat16* hi = rows + (f * first + (row - first)) * H;
      __nv_bfloat16* lo = hi + padded * H;
      const float* xt = x + (item / k) * H;
      for (int64_t c = threadIdx.x; c < H; c += blockDim.x) {
        const float v = xt[c];
        const __nv_bfloat16 h = __float2bfloat16_rn(v);
        hi[c] = h;
        if (pairs) lo[c] = __float2bfloat16_rn(v - __bfloat162float(h));
      }
    } else {
      const int e = static_cast<int>(item - slots);
      const int64_t n = meta[e], first = meta[E + e], padded = round_up(n, align);
      __nv_bfloat16* hi = rows + (f * first + n) * H;
      for (int64_t c = threadIdx.x; c < (padded - n) * H; c += blockDim.x) {
        hi[c] = zero;
        if (pairs) hi[padded * H + c] = zero;
      }
    }
  }
}

// act[r, i] = silu(gate[r, i]) · up[r, i] as bf16 hi (and lo); `stacked`: gate and up are the sums
// of rows r and rows + r (the products of x's hi and lo rows).
__global__ void __launch_bounds__(kRowThreads) moe_silu_mul_kernel(const float* __restrict__ gate,
                                                                   const float* __restrict__ up, int64_t ld,
                                                                   int64_t rows, int64_t I, bool stacked,
                                                                   __nv_bfloat16* __restrict__ hi,
                                                                   __nv_bfloat16* __restrict__ lo) {
  const int64_t n = rows * I;
  for (int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; idx < n;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / I, i = idx % I;
    float g = gate[r * ld + i], u = up[r * ld + i];
    if (stacked) {
      g += gate[(rows + r) * ld + i];
      u += up[(rows + r) * ld + i];
    }
    const float a = silu(g) * u;
    const __nv_bfloat16 h = __float2bfloat16_rn(a);
    hi[idx] = h;
    if (lo) lo[idx] = __float2bfloat16_rn(a - __bfloat162float(h));
  }
}

// out[t, o] = Σ_j weights[t, j] · down_rows[slot_row[t·k + j], o], j in order; bad slots add nothing.
__global__ void __launch_bounds__(kRowThreads) moe_combine_kernel(const float* __restrict__ down_rows,
                                                                  const int32_t* __restrict__ slot_row,
                                                                  const float* __restrict__ weights, int64_t T,
                                                                  int64_t k, int64_t H, float* __restrict__ out) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    for (int64_t o = threadIdx.x; o < H; o += blockDim.x) {
      float total = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int32_t row = slot_row ? slot_row[t * k + j] : static_cast<int32_t>(t * k + j);
        if (row >= 0) total += weights[t * k + j] * down_rows[static_cast<int64_t>(row) * H + o];
      }
      out[t * H + o] = total;
    }
  }
}

int64_t sort_warps(int64_t slots) { return (slots + kSortSlotsPerWarp - 1) / kSortSlotsPerWarp; }

}  // namespace

int64_t moe_sort_work_ints(int64_t slots, int64_t E) { return sort_warps(slots) * E; }

void launch_moe_sort(const int32_t* ids, int64_t slots, int64_t index_base, int64_t E, int64_t row_align,
                     int32_t* work, int32_t* slot_row, int32_t* meta, DeviceStatus* status, cudaStream_t stream) {
  const int64_t warps = sort_warps(slots);
  const size_t shared = static_cast<size_t>(E) * sizeof(int32_t);
  const int e = static_cast<int>(E);
  if (warps > 0) {
    moe_histogram_kernel<<<static_cast<unsigned>(warps), kWarp, shared, stream>>>(ids, slots, index_base, e, work,
                                                                                   status);
    QINFER_CUDA_CHECK_LAUNCH("moe_histogram_kernel<<<>>>");
  }
  moe_offsets_kernel<<<1, kRowThreads, shared, stream>>>(work, static_cast<int>(warps), e, static_cast<int>(row_align),
                                                         meta);
  QINFER_CUDA_CHECK_LAUNCH("moe_offsets_kernel<<<>>>");
  if (warps > 0) {
    moe_place_kernel<<<static_cast<unsigned>(warps), kWarp, shared, stream>>>(ids, slots, e, work, slot_row);
    QINFER_CUDA_CHECK_LAUNCH("moe_place_kernel<<<>>>");
  }
}

void launch_moe_gather(const float* x, int64_t H, int64_t k, int64_t slots, const int32_t* ids, const int32_t* slot_row,
                       const int32_t* meta, int64_t E, int64_t row_align, bool pairs, void* rows,
                       cudaStream_t stream) {
  if (H == 0) return;
  const auto blocks = static_cast<unsigned>(std::min(slots + E, kMaxBlocks));
  moe_gather_kernel<<<blocks, kRowThreads, 0, stream>>>(x, H, k, slots, static_cast<int>(E),
                                                        static_cast<int>(row_align), ids, slot_row, meta, pairs,
                                                        static_cast<__nv_bfloat16*>(rows));
  QINFER_CUDA_CHECK_LAUNCH("moe_gather_kernel<<<>>>");
}

void launch_moe_silu_mul(const float* gate, const float* up, int64_t ld, int64_t rows, int64_t I, bool stacked,
                         void* hi, void* lo, cudaStream_t stream) {
  if (rows * I == 0) return;
  moe_silu_mul_kernel<<<grid_for(rows * I, kRowThreads), kRowThreads, 0, stream>>>(
      gate, up, ld, rows, I, stacked, static_cast<__nv_bfloat16*>(hi), static_cast<__nv_bfloat16*>(lo));
  QINFER_CUDA_CHECK_LAUNCH("moe_silu_mul_kernel<<<>>>");
}

void launch_moe_combine(const float* down_rows, const int32_t* slot_row, const float* weights, int64_t T, int64_t k,
                        int64_t H, float* out, cudaStream_t stream) {
  if (T == 0 || H == 0) return;
  const auto blocks = static_cast<unsigned>(std::min(T, kMaxBlocks));
  moe_combine_kernel<<<blocks, kRowThreads, 0, stream>>>(down_rows, slot_row, weights, T, k, H, out);
  QINFER_CUDA_CHECK_LAUNCH("moe_combine_kernel<<<>>>");
}

}  // namespace qinfer::cuda
