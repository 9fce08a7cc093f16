// Rotary embeddings in place, rotate-half pairing over the first rotary_dim features, MRoPE axes per
// frequency. The angle follows HF's f32 arithmetic (the host computed inv_freq the same way).
#include "backend/cuda/common.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kThreads = 256;

// One thread per (token, frequency): the angle once, then every head.
__global__ void rope_kernel(float* __restrict__ x, const int32_t* __restrict__ positions, int64_t T, int64_t heads,
                            int64_t head_dim, int64_t half, const __grid_constant__ RopeTable table) {
  const int64_t n = T * half;
  for (int64_t idx = blockIdx.x * int64_t{kThreads} + threadIdx.x; idx < n; idx += int64_t{gridDim.x} * kThreads) {
    const int64_t t = idx / half, i = idx % half;
    const float angle = static_cast<float>(positions[table.axis[i] * T + t]) * table.inv_freq[i];
    float s, c;
    sincosf(angle, &s, &c);
    for (int64_t h = 0; h < heads; ++h) {
      float* xh = x + (t * heads + h) * head_dim;
      const float a = xh[i], b = xh[i + half];
      xh[i] = a * c - b * s;
      xh[i + half] = b * c + a * s;
    }
  }
}

}  // namespace

void launch_rope(float* x, const int32_t* positions, int64_t T, int64_t heads, int64_t head_dim, int64_t half,
                 const RopeTable& table, cudaStream_t stream) {
  if (T == 0 || half == 0 || heads == 0) return;
  rope_kernel<<<grid_for(T * half, kThreads), kThreads, 0, stream>>>(x, positions, T, heads, head_dim, half, table);
  QINFER_CUDA_CHECK_LAUNCH("rope_kernel<<<>>>");
}

}  // namespace qinfer::cuda
