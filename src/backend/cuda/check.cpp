#include "backend/cuda/check.h"

#include "core/error.h"

namespace qinfer::cuda {

void throw_cuda_error(cudaError_t status, const char* call, const char* file, int line) {
  // Clears the runtime's last-error slot so a caller that recovers does not see this error again.
  cudaGetLastError();
  fail("CUDA call {} failed at {}:{}: {} ({})", call, file, line, cudaGetErrorString(status),
       cudaGetErrorName(status));
}

void throw_error(const std::string& message) { throw Error(message); }

}  // namespace qinfer::cuda
