// Row norms: RMSNorm (optionally gated by silu(z)) and L2 norm. A row is reduced by one warp when it
// is short (per-head q/k norms: many rows of 64-256) or by a whole block when it is long (hidden
// states); both read the row once for the sum and once more to write, so y may alias x.
#include "backend/cuda/common.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kWarpRowMax = 1024;  // rows up to this long go one per warp
constexpr int64_t kMaxBlocks = 65535;

enum class Norm { rms, rms_gated, l2 };

// Σ x² over one row by `kRowThreads` threads (a warp, or the whole block).
template <int kRowThreads>
__device__ float row_sum_squares(const float* __restrict__ x, int64_t D, int rank, float* scratch) {
  float s = 0.0f;
  for (int64_t i = rank; i < D; i += kRowThreads) s = fmaf(x[i], x[i], s);
  if constexpr (kRowThreads == kWarp) return warp_sum(s);
  else return block_sum(s, scratch);
}

template <Norm kNorm, int kRowThreads>
__global__ void __launch_bounds__(kThreads, 1)
    norm_kernel(const float* x, const float* __restrict__ w, const float* __restrict__ z, float eps, float scale,
                int64_t N, int64_t D, float* y) {
  __shared__ float scratch[kWarp];
  constexpr int kRowsPerBlock = kThreads / kRowThreads;
  const int rank = threadIdx.x % kRowThreads;
  // Every thread of a block runs the same number of iterations (block_sum has barriers).
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock; base < N;
       base += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t r = base + threadIdx.x / kRowThreads;
    const bool live = r < N;
    const float* xr = x + (live ? r : 0) * D;
    float sum = 0.0f;
    if (kRowThreads == kWarp) {
      if (live) sum = row_sum_squares<kRowThreads>(xr, D, rank, scratch);
    } else {
      sum = row_sum_squares<kRowThreads>(xr, D, rank, scratch);
    }
    if (!live) continue;
    float* yr = y + r * D;
    if constexpr (kNorm == Norm::l2) {
      const float factor = 1.0f / sqrtf(sum + eps);
      for (int64_t i = rank; i < D; i += kRowThreads) yr[i] = scale * (xr[i] * factor);
    } else {
      const float inv_rms = 1.0f / sqrtf(sum / static_cast<float>(D) + eps);
      for (int64_t i = rank; i < D; i += kRowThreads) {
        float v = xr[i] * inv_rms * w[i];
        if constexpr (kNorm == Norm::rms_gated) v *= silu(z[r * D + i]);
        yr[i] = v;
      }
    }
  }
}

template <Norm kNorm>
void launch(const float* x, const float* w, const float* z, float eps, float scale, int64_t N, int64_t D, float* y,
            cudaStream_t stream) {
  if (N == 0 || D == 0) return;
  if (D <= kWarpRowMax) {
    constexpr int kRows = kThreads / kWarp;
    const auto blocks = static_cast<unsigned>(std::min((N + kRows - 1) / kRows, kMaxBlocks));
    norm_kernel<kNorm, kWarp><<<blocks, kThreads, 0, stream>>>(x, w, z, eps, scale, N, D, y);
  } else {
    const auto blocks = static_cast<unsigned>(std::min(N, kMaxBlocks));
    norm_kernel<kNorm, kThreads><<<blocks, kThreads, 0, stream>>>(x, w, z, eps, scale, N, D, y);
  }
  QINFER_CUDA_CHECK_LAUNCH("norm_kernel<<<>>>");
}

}  // namespace

void launch_rms_norm(const float* x, const float* w, const float* z, float eps, int64_t N, int64_t D, float* y,
                     cudaStream_t stream) {
  if (z) launch<Norm::rms_gated>(x, w, z, eps, 1.0f, N, D, y, stream);
  else launch<Norm::rms>(x, w, nullptr, eps, 1.0f, N, D, y, stream);
}

void launch_l2_norm(const float* x, float eps, float scale, int64_t N, int64_t D, float* y, cudaStream_t stream) {
  launch<Norm::l2>(x, nullptr, nullptr, eps, scale, N, D, y, stream);
}

}  // namespace qinfer::cuda
