#include "backend/cuda/gemm.h"

#include <limits>

#include "backend/cuda/check.h"
#include "core/error.h"

namespace qinfer::cuda {
namespace {

// cuBLASLt's recommended workspace for Hopper; split-K and stream-K algorithms need it.
constexpr size_t kWorkspaceBytes = size_t{32} << 20;
// Algorithms asked of the heuristic per shape, and timed (fastest()).
constexpr int kCandidates = 16;

// The token counts worth timing algorithms for: those that recur every step, the decode batch sizes
// the engine pads to (2^n and 3·2^n, engine::decode_buckets) up to where the GEMMs turn compute-bound
// and the heuristic's pick holds. Prefill chunks of any other length keep the heuristic's pick, so
// that a new prompt length costs no timing runs.
bool timed(int64_t T) {
  const auto power_of_two = [](int64_t n) { return n > 0 && (n & (n - 1)) == 0; };
  return T <= 1024 && (power_of_two(T) || (T % 3 == 0 && power_of_two(T / 3)));
}

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

const Bf16Gemm::Plan& Bf16Gemm::plan(const void* x, int64_t T, const void* w, int64_t out, int64_t in, int64_t ldy,
                                     cudaStream_t stream) {
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
  cublasLtMatmulHeuristicResult_t results[kCandidates]{};
  int found = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(handle_, p.op, p.a, p.b, p.c, p.c, preference, kCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(preference);
  if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.b);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
    fail("cuBLASLt has no bf16 GEMM for [{}, {}] x [{}, {}]ᵀ ({})", T, in, out, in, cublasGetStatusString(status));
  }
  p.algo = results[0].algo;
  // A stream being recorded cannot be timed: a shape first met there keeps the heuristic's pick.
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  QINFER_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture));
  if (found > 1 && timed(T) && capture == cudaStreamCaptureStatusNone) p.algo = fastest(p, results, found, x, T, w, out, ldy, stream);
  return plans_.emplace(key, p).first->second;
}

// The heuristic ranks algorithms by a model that misjudges the skinny GEMMs of decode batches (T of
// 9 to a few hundred): timing its candidates on the problem itself finds tile shapes and split-K
// settings that read the weights up to a third faster. Each candidate runs into scratch output
// (y may be accumulated into); the first (the heuristic's pick) wins unless another is faster.
cublasLtMatmulAlgo_t Bf16Gemm::fastest(const Plan& p, const cublasLtMatmulHeuristicResult_t* results, int found,
                                       const void* x, int64_t T, const void* w, int64_t out, int64_t ldy,
                                       cudaStream_t stream) {
  constexpr int kWarmup = 2, kTimed = 8;
  const size_t y_bytes = static_cast<size_t>(ldy * (T - 1) + out) * sizeof(float);
  void* y = nullptr;
  QINFER_CUDA_CHECK(cudaMallocAsync(&y, y_bytes, stream));
  cudaEvent_t start = nullptr, stop = nullptr;
  QINFER_CUDA_CHECK(cudaEventCreate(&start));
  QINFER_CUDA_CHECK(cudaEventCreate(&stop));
  const float one = 1.0f, zero = 0.0f;
  int best = 0;
  float best_ms = std::numeric_limits<float>::infinity();
  for (int i = 0; i < found; ++i) {
    const auto matmul = [&] {
      return cublasLtMatmul(handle_, p.op, &one, w, p.a, x, p.b, &zero, y, p.c, y, p.c, &results[i].algo, workspace_,
                            kWorkspaceBytes, stream);
    };
    bool ran = true;
    for (int r = 0; r < kWarmup && ran; ++r) ran = matmul() == CUBLAS_STATUS_SUCCESS;
    if (!ran) continue;  // a candidate the library lists but cannot launch here is passed over
    QINFER_CUDA_CHECK(cudaEventRecord(start, stream));
    for (int r = 0; r < kTimed; ++r) matmul();
    QINFER_CUDA_CHECK(cudaEventRecord(stop, stream));
    QINFER_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    QINFER_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (ms < best_ms) best = i, best_ms = ms;
  }
  QINFER_CUDA_CHECK(cudaFreeAsync(y, stream));
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return results[best].algo;
}

void Bf16Gemm::run(const void* x, int64_t T, const void* w, int64_t out, int64_t in, float* y, int64_t ldy,
                   bool accumulate, cudaStream_t stream) {
  constexpr int64_t kIntMax = std::numeric_limits<int32_t>::max();
  QINFER_CHECK(T <= kIntMax && out <= kIntMax && in <= kIntMax && ldy <= kIntMax,
               "cuda linear: [{}, {}] x [{}, {}] is too large for cuBLASLt", T, in, out, in);
  const Plan& p = plan(x, T, w, out, in, ldy, stream);
  const float one = 1.0f, beta = accumulate ? 1.0f : 0.0f;
  check_lt(cublasLtMatmul(handle_, p.op, &one, w, p.a, x, p.b, &beta, y, p.c, y, p.c, &p.algo, workspace_,
                          kWorkspaceBytes, stream),
           "cublasLtMatmul");
}

}  // namespace qinfer::cuda
