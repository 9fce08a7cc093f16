#pragma once
// The inner loops of the cpu backend as one table of functions per instruction set: `portable`
// (plain C++, any x86-64 or other CPU) and `avx2` (AVX2 + FMA + F16C, kernels_avx2.cpp). The ops
// (layout, threading, algorithm choice) are written once against this table; the table is picked
// once per backend from a runtime CPU check, so AVX2 code never runs on a CPU without it.
#include <cstdint>

#include "core/dtype.h"

namespace qinfer::cpu {

struct Kernels {
  const char* isa;

  // C[m,n] = alpha · Σ_k A[m,k]·B[n,k] (+ C[m,n] when accumulate). A f32; B f32|bf16|f16 (row
  // stride ldb elements): linear is y = x·wᵀ. Serial; callers split N (or M) across threads.
  void (*gemm_nt)(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const void* B, DType b_dtype,
                  int64_t ldb, float* C, int64_t ldc, float alpha, bool accumulate);
  // C[m,n] = alpha · Σ_k A[m,k]·B[k,n] (+ C[m,n] when accumulate), all f32: the small products of
  // the GDN chunk form.
  void (*gemm_nn)(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
                  int64_t ldc, float alpha, bool accumulate);
  void (*to_f32)(DType dtype, const void* src, float* dst, int64_t n);  // f32|bf16|f16

  float (*dot)(const float* a, const float* b, int64_t n);
  float (*sum_sq)(const float* x, int64_t n);
  float (*max)(const float* x, int64_t n);               // n ≥ 1
  float (*exp_sub_sum)(float* x, float shift, int64_t n);  // x = exp(x − shift); returns Σx
  void (*axpy)(float a, const float* x, float* y, int64_t n);         // y += a·x
  void (*scale)(float a, float* y, int64_t n);                        // y *= a
  void (*mul_acc)(const float* a, const float* x, float* y, int64_t n);  // y += a⊙x
  void (*scale_mul)(const float* x, float s, const float* w, float* y, int64_t n);  // y = s·x⊙w (w null: s·x)
  void (*add)(float* x, const float* y, int64_t n);                   // x += y
  void (*silu)(float* x, int64_t n);
  void (*silu_mul)(const float* gate, const float* up, float* out, int64_t n);  // out = silu(gate)·up
  void (*sigmoid_mul)(float* x, const float* gate, int64_t n);                 // x *= sigmoid(gate)
  // Rotate-half RoPE of one head: pairs (x[i], x[i+half]) turn by the angle whose cos/sin are given.
  void (*rope_rotate)(float* x, const float* cos, const float* sin, int64_t half);

  // out[j] = q · k[j·k_stride .. +d) for j < n_keys.
  void (*dots_strided)(const float* q, const float* k, int64_t n_keys, int64_t k_stride, int64_t d, float* out);
  // acc += Σ_j p[j] · v[j·v_stride .. +d).
  void (*axpys_strided)(const float* p, const float* v, int64_t n_keys, int64_t v_stride, int64_t d, float* acc);

  // One token of the gated delta rule on one head's state S [Dv, Dk]:
  // S = decay·S; δ = β(v − S·k); S += δ⊗k; o = S·q.
  void (*gdn_step)(float* S, int64_t Dv, int64_t Dk, const float* q, const float* k, const float* v, float decay,
                   float beta, float* o);
};

// Throws Error naming the dtype; kept out of line so kernels_avx2.cpp never instantiates fmt.
[[noreturn]] void unsupported_weight_dtype(DType dtype);

const Kernels& portable_kernels();
const Kernels& avx2_kernels();
bool cpu_has_avx2();    // AVX2 + FMA + F16C, checked at run time
bool cpu_has_avx512();  // AVX-512 F/BW/VL as well (used by the quantized GEMV)
// avx2_kernels() where the CPU has it, else portable_kernels().
const Kernels& best_kernels();

}  // namespace qinfer::cpu
