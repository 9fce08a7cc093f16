// Rotary embeddings in place, rotate-half pairing over the first rotary_dim features, MRoPE axes per
// frequency, optionally after an RMSNorm of each head (the q/k norms). The angle follows HF's f32
// arithmetic (the host computed inv_freq the same way).
#include "backend/cuda/common.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarpsPerBlock = kThreads / kWarp;
constexpr int kMaxPassVecs = 8;  // features past rotary_dim each lane holds: up to 256 of them

// One launch's operands: x [T, heads, head_dim], w [head_dim] when normed.
struct Heads {
  float* x;
  const float* w;
  float eps;
  const int32_t* positions;
  int64_t T, heads, head_dim, half;
};

// One warp per (token, head), the head in registers: lane l holds the rotation pairs (x[i],
// x[i + half]) of frequencies i = l + 32k (k < kFreqs) and, when normed, the features past
// rotary_dim j = 2·half + l + 32k (k < kPass). Loads and stores are coalesced; every element is
// read and written by one lane.
template <bool kNorm, int kFreqs, int kPass>
__global__ void __launch_bounds__(kThreads) rope_kernel(const Heads h, const __grid_constant__ RopeTable table) {
  const int lane = threadIdx.x % kWarp;
  const int64_t rows = h.T * h.heads, half = h.half;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const int64_t t = row / h.heads;
    float* xh = h.x + row * h.head_dim;
    float a[kFreqs], b[kFreqs], angle[kFreqs], pass[kPass > 0 ? kPass : 1];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kFreqs; ++k) {
      const int i = lane + k * kWarp;
      a[k] = b[k] = angle[k] = 0.0f;
      if (i >= half) continue;
      a[k] = xh[i];
      b[k] = xh[i + half];
      angle[k] = static_cast<float>(h.positions[table.axis[i] * h.T + t]) * table.inv_freq[i];
      sum = fmaf(a[k], a[k], sum);
      sum = fmaf(b[k], b[k], sum);
    }
#pragma unroll
    for (int k = 0; k < kPass; ++k) {
      const int64_t j = 2 * half + lane + k * kWarp;
      pass[k] = j < h.head_dim ? xh[j] : 0.0f;
      sum = fmaf(pass[k], pass[k], sum);
    }
    if constexpr (kNorm) {
      // rms_norm's arithmetic: x · (1 / rms) · w.
      const float inv_rms = 1.0f / sqrtf(warp_sum(sum) / static_cast<float>(h.head_dim) + h.eps);
#pragma unroll
      for (int k = 0; k < kFreqs; ++k) {
        const int i = lane + k * kWarp;
        if (i >= half) continue;
        a[k] = a[k] * inv_rms * h.w[i];
        b[k] = b[k] * inv_rms * h.w[i + half];
      }
#pragma unroll
      for (int k = 0; k < kPass; ++k) {
        const int64_t j = 2 * half + lane + k * kWarp;
        if (j < h.head_dim) xh[j] = pass[k] * inv_rms * h.w[j];
      }
    }
#pragma unroll
    for (int k = 0; k < kFreqs; ++k) {
      const int i = lane + k * kWarp;
      if (i >= half) continue;
      float s, c;
      sincosf(angle[k], &s, &c);
      xh[i] = a[k] * c - b[k] * s;
      xh[i + half] = b[k] * c + a[k] * s;
    }
  }
}

template <bool kNorm, int kFreqs, int kPass>
void launch_heads(const Heads& h, const RopeTable& table, cudaStream_t stream) {
  rope_kernel<kNorm, kFreqs, kPass><<<grid_for(h.T * h.heads, kWarpsPerBlock, 65535), kThreads, 0, stream>>>(h, table);
  QINFER_CUDA_CHECK_LAUNCH("rope_kernel<<<>>>");
}

// kFreqs from half (at most kRopeMaxHalf: 8 per lane).
template <bool kNorm, int kPass>
void launch_freqs(const Heads& h, const RopeTable& table, cudaStream_t stream) {
  static_assert(kRopeMaxHalf == 8 * kWarp);
  if (h.half <= kWarp) launch_heads<kNorm, 1, kPass>(h, table, stream);
  else if (h.half <= 2 * kWarp) launch_heads<kNorm, 2, kPass>(h, table, stream);
  else if (h.half <= 4 * kWarp) launch_heads<kNorm, 4, kPass>(h, table, stream);
  else launch_heads<kNorm, 8, kPass>(h, table, stream);
}

}  // namespace

void launch_rope(float* x, const int32_t* positions, int64_t T, int64_t heads, int64_t head_dim, int64_t half,
                 const RopeTable& table, cudaStream_t stream) {
  if (T == 0 || half == 0 || heads == 0) return;
  launch_freqs<false, 0>(Heads{x, nullptr, 0.0f, positions, T, heads, head_dim, half}, table, stream);
}

void launch_rms_norm_rope(float* x, const float* w, float eps, const int32_t* positions, int64_t T, int64_t heads,
                          int64_t head_dim, int64_t half, const RopeTable& table, cudaStream_t stream) {
  if (T == 0 || heads == 0 || head_dim == 0) return;
  const int64_t pass = head_dim - 2 * half;
  if (pass > kMaxPassVecs * kWarp) {
    // Heads too long to hold in registers: the norm over the rows of head_dim, then the rotation.
    launch_rms_norm(x, w, nullptr, eps, T * heads, head_dim, x, stream);
    return launch_rope(x, positions, T, heads, head_dim, half, table, stream);
  }
  const Heads h{x, w, eps, positions, T, heads, head_dim, half};
  if (pass == 0) launch_freqs<true, 0>(h, table, stream);
  else if (pass <= 2 * kWarp) launch_freqs<true, 2>(h, table, stream);
  else launch_freqs<true, kMaxPassVecs>(h, table, stream);
}

}  // namespace qinfer::cuda
