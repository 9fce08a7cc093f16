#pragma once
// Error checking for CUDA runtime calls: a failed call throws qinfer::Error naming the call,
// where it was made and the runtime's description of the error.
#include <cuda_runtime_api.h>

#include <string>

namespace qinfer::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line);

// Throws qinfer::Error with `message`. For .cu files: nvcc cannot compile fmt (core/error.h).
[[noreturn]] void throw_error(const std::string& message);

inline void check_status(cudaError_t status, const char* call, const char* file, int line) {
  if (status != cudaSuccess) throw_cuda_error(status, call, file, line);
}

}  // namespace qinfer::cuda

#define QINFER_CUDA_CHECK(call) ::qinfer::cuda::check_status((call), #call, __FILE__, __LINE__)
// After a kernel launch: launch-configuration errors surface only through cudaGetLastError.
#define QINFER_CUDA_CHECK_LAUNCH(what) \
  ::qinfer::cuda::check_status(cudaGetLastError(), what, __FILE__, __LINE__)
