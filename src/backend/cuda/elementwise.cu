// Elementwise ops (grid-stride loops; each element is read and written by one thread, so outputs
// may alias inputs), the Gated DeltaNet gates, and the strided row copy behind copy_columns.
#include "backend/cuda/common.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kThreads = 256;

__global__ void silu_mul_kernel(const float* gate, const float* up, float* out, int64_t n) {
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n; i += int64_t{gridDim.x} * kThreads)
    out[i] = silu(gate[i]) * up[i];
}

__global__ void sigmoid_mul_kernel(float* x, const float* __restrict__ gate, int64_t n, int64_t width) {
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n; i += int64_t{gridDim.x} * kThreads)
    x[i] *= sigmoid(gate[width == 1 ? i : i / width]);
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n; i += int64_t{gridDim.x} * kThreads)
    x[i] += y[i];
}

// torch.nn.functional.softplus with beta 1, threshold 20.
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__global__ void gdn_gates_kernel(const float* __restrict__ a, const float* __restrict__ b,
                                 const float* __restrict__ A_log, const float* __restrict__ dt_bias, int64_t n,
                                 int64_t Hv, float* __restrict__ g, float* __restrict__ beta) {
  allow_next_kernel();
  wait_for_previous_kernel();
  for (int64_t i = blockIdx.x * int64_t{kThreads} + threadIdx.x; i < n; i += int64_t{gridDim.x} * kThreads) {
    const int64_t h = i % Hv;
    g[i] = -expf(A_log[h]) * softplus(a[i] + dt_bias[h]);
    beta[i] = sigmoid(b[i]);
  }
}

}  // namespace

void launch_silu_mul(const float* gate, const float* up, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_overlapped(silu_mul_kernel, grid_for(n, kThreads), kThreads, 0, stream, gate, up, out, n);
  QINFER_CUDA_CHECK_LAUNCH("silu_mul_kernel<<<>>>");
}

void launch_sigmoid_mul(float* x, const float* gate, int64_t n, int64_t width, cudaStream_t stream) {
  if (n == 0) return;
  launch_overlapped(sigmoid_mul_kernel, grid_for(n, kThreads), kThreads, 0, stream, x, gate, n, width);
  QINFER_CUDA_CHECK_LAUNCH("sigmoid_mul_kernel<<<>>>");
}

void launch_add(float* x, const float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  launch_overlapped(add_kernel, grid_for(n, kThreads), kThreads, 0, stream, x, y, n);
  QINFER_CUDA_CHECK_LAUNCH("add_kernel<<<>>>");
}

void launch_gdn_gates(const float* a, const float* b, const float* A_log, const float* dt_bias, int64_t T, int64_t Hv,
                      float* g, float* beta, cudaStream_t stream) {
  const int64_t n = T * Hv;
  if (n == 0) return;
  launch_overlapped(gdn_gates_kernel, grid_for(n, kThreads), kThreads, 0, stream, a, b, A_log, dt_bias, n, Hv, g, beta);
  QINFER_CUDA_CHECK_LAUNCH("gdn_gates_kernel<<<>>>");
}

void launch_copy_2d(const void* src, int64_t src_pitch, void* dst, int64_t dst_pitch, int64_t width, int64_t rows,
                    cudaStream_t stream) {
  if (width == 0 || rows == 0) return;
  QINFER_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_pitch), src, static_cast<size_t>(src_pitch),
                                      static_cast<size_t>(width), static_cast<size_t>(rows), cudaMemcpyDeviceToDevice,
                                      stream));
}

}  // namespace qinfer::cuda
