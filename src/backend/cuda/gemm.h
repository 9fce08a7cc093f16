#pragma once
// Prefill-sized linear layers on the tensor cores: y (f32) = x · wᵀ with both operands in bf16 and
// f32 accumulation, through cuBLASLt. One algorithm is chosen per problem shape (the heuristic's
// first) and kept, so that a shape seen again costs one call.
#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <tuple>

namespace qinfer::cuda {

class Bf16Gemm {
 public:
  Bf16Gemm();
  ~Bf16Gemm();
  Bf16Gemm(const Bf16Gemm&) = delete;
  Bf16Gemm& operator=(const Bf16Gemm&) = delete;

  // y f32 [T, out] (row stride ldy) = x bf16 [T, in] · w bf16 [out, in]ᵀ (+ y when accumulate), all
  // device pointers.
  void run(const void* x, int64_t T, const void* w, int64_t out, int64_t in, float* y, int64_t ldy, bool accumulate,
           cudaStream_t stream);

 private:
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  const Plan& plan(int64_t T, int64_t out, int64_t in, int64_t ldy);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, int64_t, int64_t>, Plan> plans_;
};

}  // namespace qinfer::cuda
