#pragma once
// Internals of the cpu backend shared by its op files: the context every op runs with, argument
// checks, and the ops too large to live in cpu_ops.cpp. Not part of the backend interface (ops.h).
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>

#include "backend/cpu/kernels.h"
#include "backend/ops.h"
#include "core/error.h"
#include "core/thread_pool.h"

namespace qinfer::cpu {

struct Context {
  ThreadPool& pool;
  const Kernels& k;

  // body(begin, end) over [0, n) across the pool, or inline when n ≤ serial_below (threads cost ~µs).
  void parallel(int64_t n, int64_t serial_below, const std::function<void(int64_t, int64_t)>& body) const;
};

// Argument checks; `op` and `arg` name the call and the tensor in the message.
void check_tensor(std::string_view op, std::string_view arg, const Tensor& t, int rank);
void check_f32(std::string_view op, std::string_view arg, const Tensor& t, int rank);
void check_weight(std::string_view op, std::string_view arg, const Tensor& t, int rank);  // f32|bf16|f16
void check_shape(std::string_view op, std::string_view arg, const Tensor& t, const std::vector<int64_t>& shape);
// pool.k and pool.v: rank 4, one dtype, f32 or bf16.
void check_kv_pool(std::string_view op, const KvPool& pool);

// C[M, N] = A[M, K] · B[N, K]ᵀ over the pool: N is split across threads; large M goes through a packed
// f32 GEMM (OpenBLAS where built with it) on weight blocks converted once per call.
void gemm(const Context& ctx, int64_t M, int64_t N, int64_t K, const float* A, const void* B, DType b_dtype, float* C);
// One thread's share of gemm: rows [n0, n1) of B and columns [n0, n1) of C (ldc = C's row stride).
void gemm_rows(const Context& ctx, int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, const void* B,
               DType b_dtype, float* C, int64_t ldc);

void moe_experts(const Context& ctx, const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate,
                 const Tensor& up, const Tensor& down, Tensor& out);
// MLX-quantized weights (quantized.cpp).
void check_quantized(std::string_view op, std::string_view arg, const Weight& w, int rank);
void linear_quantized(const Context& ctx, const Tensor& x, const Weight& w, Tensor& y);
void moe_experts_quantized(const Context& ctx, const Tensor& x, const Tensor& ids, const Tensor& weights,
                           const Weight& gate, const Weight& up, const Weight& down, Tensor& out);
void attention(const Context& ctx, const Tensor& q, const KvPool& pool, const AttentionLayout& layout, float scale,
               Tensor& out);
void conv1d_causal(const Context& ctx, const Tensor& x, const Tensor& w, const SeqLayout& layout, Tensor& conv_state,
                   Tensor& out);
void gated_delta_rule(const Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                      const Tensor& beta, const SeqLayout& layout, Tensor& state, Tensor& out,
                      GdnAlgorithm algorithm);
// Checks cu_seqlens (monotone from 0 to `tokens`) and, when `slots` ≥ 0, state slots in range and distinct.
void check_layout(std::string_view op, const SeqLayout& layout, int64_t tokens, int64_t slots);

}  // namespace qinfer::cpu

namespace qinfer {
// The cpu backend on a given kernel table (tests run the portable table on AVX2 machines too).
std::unique_ptr<Ops> make_cpu_ops(ThreadPool& pool, const cpu::Kernels& kernels);
}  // namespace qinfer
