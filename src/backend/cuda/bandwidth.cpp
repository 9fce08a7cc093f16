#include "backend/cuda/bandwidth.h"

#include "backend/cuda/buffer.h"

namespace qinfer::cuda {

double measure_copy_bandwidth_gbs(size_t bytes, int iters) {
  QINFER_CHECK(bytes > 0 && iters > 0, "copy bandwidth probe: needs bytes > 0 and iters > 0 (got {}, {})", bytes, iters);
  DeviceBuffer src(bytes), dst(bytes);
  // Non-zero data: zeros can take faster paths than real data.
  QINFER_CUDA_CHECK(cudaMemset(src.data(), 0x5A, bytes));
  cudaStream_t stream = nullptr;
  QINFER_CUDA_CHECK(cudaStreamCreate(&stream));
  double ms = 0;
  try {
    ms = median_time_ms(
        [&] { QINFER_CUDA_CHECK(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice, stream)); },
        stream, iters);
  } catch (...) {
    cudaStreamDestroy(stream);
    throw;
  }
  QINFER_CUDA_CHECK(cudaStreamDestroy(stream));
  return 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
}

}  // namespace qinfer::cuda
