// Plain C++ kernels: the fallback for CPUs without AVX2/FMA/F16C, written so the compiler can still
// vectorise them with the baseline instruction set (several independent accumulators, no aliasing).
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "core/error.h"

namespace qinfer::cpu {
namespace {

float bf16_value(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

template <DType dt>
float load_weight(const void* base, int64_t i) {
  if constexpr (dt == DType::f32) {
    return static_cast<const float*>(base)[i];
  } else if constexpr (dt == DType::bf16) {
    return bf16_value(static_cast<const uint16_t*>(base)[i]);
  } else {
    return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
  }
}

// Rows of B converted to f32 in blocks, then plain dot products: f16 decoding is the expensive
// part, so each B row is converted once per call and reused by every row of A.
template <DType dt>
void gemm_nt_impl(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const void* B, int64_t ldb, float* C,
                  int64_t ldc, float alpha, bool accumulate) {
  const size_t elem = dt == DType::f32 ? 4 : 2;
  float row_buf[512];
  for (int64_t n = 0; n < N; ++n) {
    const char* b_row = static_cast<const char*>(B) + n * ldb * elem;
    for (int64_t m = 0; m < M; ++m)
      if (!accumulate) C[m * ldc + n] = 0.0f;
    for (int64_t k0 = 0; k0 < K; k0 += 512) {
      const int64_t kc = std::min<int64_t>(512, K - k0);
      const float* b;
      if constexpr (dt == DType::f32) {
        b = reinterpret_cast<const float*>(b_row) + k0;
      } else {
        for (int64_t k = 0; k < kc; ++k) row_buf[k] = load_weight<dt>(b_row, k0 + k);
        b = row_buf;
      }
      for (int64_t m = 0; m < M; ++m) {
        const float* a = A + m * lda + k0;
        float s[4] = {0, 0, 0, 0};
        int64_t k = 0;
        for (; k + 4 <= kc; k += 4)
          for (int j = 0; j < 4; ++j) s[j] += a[k + j] * b[k + j];
        for (; k < kc; ++k) s[0] += a[k] * b[k];
        C[m * ldc + n] += alpha * ((s[0] + s[1]) + (s[2] + s[3]));
      }
    }
  }
}

void gemm_nt(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const void* B, DType b_dtype, int64_t ldb,
             float* C, int64_t ldc, float alpha, bool accumulate) {
  switch (b_dtype) {
    case DType::f32: return gemm_nt_impl<DType::f32>(M, N, K, A, lda, B, ldb, C, ldc, alpha, accumulate);
    case DType::bf16: return gemm_nt_impl<DType::bf16>(M, N, K, A, lda, B, ldb, C, ldc, alpha, accumulate);
    case DType::f16: return gemm_nt_impl<DType::f16>(M, N, K, A, lda, B, ldb, C, ldc, alpha, accumulate);
    default: unsupported_weight_dtype(b_dtype);
  }
}

void gemm_nn(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
             int64_t ldc, float alpha, bool accumulate) {
  for (int64_t m = 0; m < M; ++m) {
    float* c = C + m * ldc;
    if (!accumulate) std::fill_n(c, N, 0.0f);
    for (int64_t k = 0; k < K; ++k) {
      const float a = alpha * A[m * lda + k];
      const float* b = B + k * ldb;
      for (int64_t n = 0; n < N; ++n) c[n] += a * b[n];
    }
  }
}

void to_f32(DType dtype, const void* src, float* dst, int64_t n) {
  switch (dtype) {
    case DType::f32: std::memcpy(dst, src, n * sizeof(float)); return;
    case DType::bf16:
      for (int64_t i = 0; i < n; ++i) dst[i] = load_weight<DType::bf16>(src, i);
      return;
    case DType::f16:
      for (int64_t i = 0; i < n; ++i) dst[i] = load_weight<DType::f16>(src, i);
      return;
    default: unsupported_weight_dtype(dtype);
  }
}

float dot(const float* a, const float* b, int64_t n) {
  float s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) s[j] += a[i + j] * b[i + j];
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

float sum_sq(const float* x, int64_t n) { return dot(x, x, n); }

float max_value(const float* x, int64_t n) {
  float m = x[0];
  for (int64_t i = 1; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

float exp_sub_sum(float* x, float shift, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += x[i] = std::exp(x[i] - shift);
  return s;
}

void axpy(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void scale(float a, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

void mul_acc(const float* a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a[i] * x[i];
}

void scale_mul(const float* x, float s, const float* w, float* y, int64_t n) {
  if (w == nullptr) {
    for (int64_t i = 0; i < n; ++i) y[i] = s * x[i];
  } else {
    for (int64_t i = 0; i < n; ++i) y[i] = s * x[i] * w[i];
  }
}

void add(float* x, const float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] += y[i];
}

float silu_value(float x) { return x / (1.0f + std::exp(-x)); }

void silu(float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = silu_value(x[i]);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = silu_value(gate[i]) * up[i];
}

void sigmoid_mul(float* x, const float* gate, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
}

void rope_rotate(float* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = a * sin[i] + b * cos[i];
  }
}

void dots_strided(const float* q, const float* k, int64_t n_keys, int64_t k_stride, int64_t d, float* out) {
  for (int64_t j = 0; j < n_keys; ++j) out[j] = dot(q, k + j * k_stride, d);
}

void axpys_strided(const float* p, const float* v, int64_t n_keys, int64_t v_stride, int64_t d, float* acc) {
  for (int64_t j = 0; j < n_keys; ++j) axpy(p[j], v + j * v_stride, acc, d);
}

void gdn_step(float* S, int64_t Dv, int64_t Dk, const float* q, const float* k, const float* v, float decay, float beta,
              float* o) {
  for (int64_t i = 0; i < Dv; ++i) {
    float* row = S + i * Dk;
    const float delta = beta * (v[i] - decay * dot(row, k, Dk));
    for (int64_t j = 0; j < Dk; ++j) row[j] = decay * row[j] + delta * k[j];
    o[i] = dot(row, q, Dk);
  }
}

}  // namespace

void unsupported_weight_dtype(DType dtype) {
  fail("cpu backend: weight dtype {} is not supported (expected f32, bf16 or f16)", name(dtype));
}

const Kernels& portable_kernels() {
  static const Kernels kernels{
      .isa = "portable",
      .gemm_nt = gemm_nt,
      .gemm_nn = gemm_nn,
      .to_f32 = to_f32,
      .dot = dot,
      .sum_sq = sum_sq,
      .max = max_value,
      .exp_sub_sum = exp_sub_sum,
      .axpy = axpy,
      .scale = scale,
      .mul_acc = mul_acc,
      .scale_mul = scale_mul,
      .add = add,
      .silu = silu,
      .silu_mul = silu_mul,
      .sigmoid_mul = sigmoid_mul,
      .rope_rotate = rope_rotate,
      .dots_strided = dots_strided,
      .axpys_strided = axpys_strided,
      .gdn_step = gdn_step,
  };
  return kernels;
}

bool cpu_has_avx2() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // F16C straight from CPUID (leaf 1, ECX bit 29): clang 14's __builtin_cpu_supports does not know it.
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__) || defined(__i386__)
  return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl");
#else
  return false;
#endif
}

const Kernels& best_kernels() { return cpu_has_avx2() ? avx2_kernels() : portable_kernels(); }

}  // namespace qinfer::cpu
