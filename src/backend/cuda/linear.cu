// Decode-sized linear layers as fused GEMV kernels (one warp per weight row, every format read and
// dequantized in registers, f32 accumulation), the dequantize-rows kernel that feeds cuBLAS for
// prefill-sized ones, and embedding lookups (dense and quantized rows).
#include <cuda_bf16.h>

#include "backend/cuda/weights.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kGemvWarps = 8;  // weight rows per block

// Several tokens keep kMaxT accumulators and activation loads in flight: one block per SM may take
// all the registers it wants; one token leaves room for two.
template <class Fmt, int kMaxT, bool kVec>
__global__ void __launch_bounds__(kGemvWarps* kWarp, kMaxT == 1 ? 2 : 1)
    gemv_kernel(const float* __restrict__ x, int T, WeightView w, float* __restrict__ y) {
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

template <class Fmt>
__global__ void dequantize_kernel(WeightView w, int64_t row0, int64_t rows, float* __restrict__ out) {
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x)
    for (int64_t j = threadIdx.x; j < w.in; j += blockDim.x) out[r * w.in + j] = Fmt::element(w, row0 + r, j);
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
      lo[r * w.in + j] = __float2bfloat16_rn(v - __bfloat162float(h));
    }
  }
}

__global__ void to_bf16_pair_kernel(const float* __restrict__ x, int64_t n, __nv_bfloat16* __restrict__ hi,
                                    __nv_bfloat16* __restrict__ lo) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const __nv_bfloat16 h = __float2bfloat16_rn(x[i]);
    hi[i] = h;
    lo[i] = __float2bfloat16_rn(x[i] - __bfloat162float(h));
  }
}

template <class Fmt>
__global__ void embedding_kernel(const int32_t* __restrict__ ids, int64_t T, WeightView table, float* __restrict__ out,
                                 DeviceStatus* status) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int32_t id = ids[t];
    float* o = out + t * table.in;
    if (id < 0 || id >= table.rows) {
      if (threadIdx.x == 0) report(status, kStatusEmbeddingId, t, id, table.rows);
      for (int64_t j = threadIdx.x; j < table.in; j += blockDim.x) o[j] = 0.0f;
      continue;
    }
    for (int64_t j = threadIdx.x; j < table.in; j += blockDim.x) o[j] = Fmt::element(table, id, j);
  }
}

constexpr int kRowThreads = 256;
constexpr int64_t kMaxRowBlocks = 65535;

}  // namespace

void launch_gemv(const float* x, int64_t T, const WeightView& w, float* y, cudaStream_t stream) {
  if (T == 0 || w.rows == 0) return;
  if (T > kGemvMaxTokens) throw_error("cuda gemv: at most 8 tokens per call");
  const bool x_vec = aligned16(x) && w.in % 4 == 0;
  const auto blocks = static_cast<unsigned>((w.rows + kGemvWarps - 1) / kGemvWarps);
  dispatch(w, [&](auto format) {
    using Fmt = decltype(format);
    const bool vec = x_vec && Fmt::vectorizable(w);
    const int t = static_cast<int>(T);
    if (T == 1) {
      if (vec) gemv_kernel<Fmt, 1, true><<<blocks, kGemvWarps * kWarp, 0, stream>>>(x, t, w, y);
      else gemv_kernel<Fmt, 1, false><<<blocks, kGemvWarps * kWarp, 0, stream>>>(x, t, w, y);
    } else {
      if (vec) gemv_kernel<Fmt, kGemvMaxTokens, true><<<blocks, kGemvWarps * kWarp, 0, stream>>>(x, t, w, y);
      else gemv_kernel<Fmt, kGemvMaxTokens, false><<<blocks, kGemvWarps * kWarp, 0, stream>>>(x, t, w, y);
    }
  });
  QINFER_CUDA_CHECK_LAUNCH("gemv_kernel<<<>>>");
}

void launch_dequantize_rows(const WeightView& w, int64_t row0, int64_t rows, float* out, cudaStream_t stream) {
  if (rows == 0 || w.in == 0) return;
  const auto blocks = static_cast<unsigned>(std::min(rows, kMaxRowBlocks));
  dispatch(w, [&](auto format) {
    dequantize_kernel<decltype(format)><<<blocks, kRowThreads, 0, stream>>>(w, row0, rows, out);
  });
  QINFER_CUDA_CHECK_LAUNCH("dequantize_kernel<<<>>>");
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
  const auto blocks = static_cast<unsigned>(std::min(T, kMaxRowBlocks));
  dispatch(table, [&](auto format) {
    embedding_kernel<decltype(format)><<<blocks, kRowThreads, 0, stream>>>(ids, T, table, out, status);
  });
  QINFER_CUDA_CHECK_LAUNCH("embedding_kernel<<<>>>");
}

}  // namespace qinfer::cuda
