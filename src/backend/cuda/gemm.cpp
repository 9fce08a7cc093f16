#include "backend/cuda/gemm.h"

#include <limits>

#include "backend/cuda/check.h"
#include "core/error.h"

namespace qinfer::cuda {
namespace {

// cuBLASLt's recommended workspace for Hopper; split-K and stream-K algorithms need it.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;

void check_lt(cublasStatus_t status, const char* call) {
  QINFER_CHECK(status == CUBLAS_STATUS_SUCCESS, "cuBLASLt call {} failed: {}", call, cublasGetStatusString(status));
}

}  // namespace

Bf16Gemm::Bf16Gemm() {
  check_lt(cublasLtCreate(&handle_), "cublasLtCreate");
  QINFER_CUDA_CHECK(cudaMalloc(&workspace_, kWorkspaceBytes));
}

Bf16Gemm::~Bf16Gemm() {
  for (auto& [key, p] : plans_) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
  }
  if (workspace_) cudaFree(workspace_);
  if (handle_) cublasLtDestroy(handle_);
}

const Bf16Gemm::Plan& Bf16Gemm::plan(int64_t T, int64_t out, int64_t in, int64_t ldy) {
  const auto key = std::make_tuple(T, out, in, ldy);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;
  // Column-major view of the row-major tensors: yᵀ (out × T, ld ldy) = W (in × out, ld in)ᵀ · xᵀ (in × T).
  Plan p;
  check_lt(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
  const cublasOperation_t transpose = CUBLAS_OP_T, none = CUBLAS_OP_N;
  check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &transpose, sizeof transpose),
           "cublasLtMatmulDescSetAttribute(TRANSA)");
  check_lt(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &none, sizeof none),
           "cublasLtMatmulDescSetAttribute(TRANSB)");
  check_lt(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, static_cast<uint64_t>(in), static_cast<uint64_t>(out), in),
           "cublasLtMatrixLayoutCreate(w)");
  check_lt(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, static_cast<uint64_t>(in), static_cast<uint64_t>(T), in),
           "cublasLtMatrixLayoutCreate(x)");
  check_lt(cublasLtMatrixLayoutCreate(&p.c, CUDA_R_32F, static_cast<uint64_t>(out), static_cast<uint64_t>(T), ldy),
           "cublasLtMatrixLayoutCreate(y)");
  cublasLtMatmulPreference_t preference = nullptr;
  check_lt(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate");
  const uint64_t workspace = kWorkspaceBytes;
  check_lt(cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                sizeof workspace),
           "cublasLtMatmulPreferenceSetAttribute");
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, preference, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
    fail("cuBLASLt has no bf16 GEMM for [{}, {}] x [{}, {}]ᵀ ({})", T, in, out, in, cublasGetStatusString(status));
  }
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void Bf16Gemm::run(const void* x, int64_t T, const void* w, int64_t out, int64_t in, float* y, int64_t ldy,
                   bool accumulate, cudaStream_t stream) {
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  QINFER_CHECK(T <= kIntMax && out <= kIntMax && in <= kIntMax && ldy <= kIntMax,
               "cuda linear: [{}, {}] x [{}, {}] is too large for cuBLASLt", T, in, out, in);
  const Plan& p = plan(T, out, in, ldy);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check_lt(cublasLtMatmul(handle_, p.op, &one, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace_,
                          kWorkspaceBytes, stream),
           "cublasLtMatmul");
}

}  // namespace qinfer::cuda
