// AVX2 + FMA + F16C kernels. Compiled with -mavx2 -mfma -mf16c (src/backend/CMakeLists.txt) and only
// reached through best_kernels() after the runtime check, so nothing here may run at static-init time.
// No header templates or inline functions (fmt, <algorithm>) are used here: the linker may keep this
// file's AVX2 copy of such a function for the whole program, and a CPU without AVX2 would then fault.
#include <immintrin.h>

#include <math.h>
#include <cstring>

#include "backend/cpu/kernels.h"

namespace qinfer::cpu {
namespace {

// Eight weights at p[0..8) as f32: bf16 is the top half of an f32, f16 goes through F16C.
template <DType dt>
inline __m256 load8(const void* p) {
  if constexpr (dt == DType::f32) {
    return _mm256_loadu_ps(static_cast<const float*>(p));
  } else if constexpr (dt == DType::bf16) {
    const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  } else {
    return _mm256_cvtph_ps(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  }
}

template <DType dt>
inline float load1(const void* p, int64_t i) {
  if constexpr (dt == DType::f32) {
    return static_cast<const float*>(p)[i];
  } else if constexpr (dt == DType::bf16) {
    uint32_t u = static_cast<uint32_t>(static_cast<const uint16_t*>(p)[i]) << 16;
    float f;
    std::memcpy(&f, &u, sizeof f);
    return f;
  } else {
    return _cvtsh_ss(static_cast<const uint16_t*>(p)[i]);
  }
}

template <DType dt>
constexpr int64_t elem_bytes() {
  return dt == DType::f32 ? 4 : 2;
}

inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp(x) to ~1 ulp (Cody–Waite reduction, degree-6 polynomial). Inputs are clamped to
// [-87.3, 88]: results below 2^-126 become 2^-126 and above e^88 saturate, which no caller minds.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

inline __m256 sigmoid8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  return _mm256_div_ps(one, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

// --- gemm_nt -------------------------------------------------------------------------------------
// Register tile of MR rows of A × NR rows of B over kc: MR·NR accumulators, each B vector converted
// once and used MR times. Dot-product form (both operands contiguous along k), so every output
// ends in one horizontal sum, amortised over kc.
template <DType dt, int MR, int NR>
void tile(int64_t kc, const float* A, int64_t lda, const char* B, int64_t ldb, float* C, int64_t ldc, float alpha,
          bool overwrite) {
  constexpr int64_t eb = elem_bytes<dt>();
  __m256 acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    __m256 b[NR];
    for (int j = 0; j < NR; ++j) b[j] = load8<dt>(B + (j * ldb + k) * eb);
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_loadu_ps(A + i * lda + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = _mm256_fmadd_ps(a, b[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int j = 0; j < NR; ++j) {
      float s = hsum(acc[i][j]);
      for (int64_t t = k; t < kc; ++t) s += A[i * lda + t] * load1<dt>(B + j * ldb * eb, t);
      float& c = C[i * ldc + j];
      c = overwrite ? alpha * s : c + alpha * s;
    }
  }
}

// Decode GEMV (one row of A): eight B rows at a time, one accumulator each, so eight weight streams
// and eight FMA chains are in flight. The next eight rows (`next`, or null) are prefetched line by
// line alongside: rows of a few KiB are too short for the hardware prefetcher to ramp up on.
template <DType dt>
void gemv_tile8(int64_t K, const float* a, const char* B, int64_t ldb, const char* next, float* c, float alpha,
                bool overwrite) {
  constexpr int64_t eb = elem_bytes<dt>();
  __m256 acc[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= K; k += 8) {
    if (next != nullptr && ((k * eb) & 63) == 0) {
#pragma GCC unroll 8
      for (int j = 0; j < 8; ++j) _mm_prefetch(next + (j * ldb + k) * eb, _MM_HINT_T0);
    }
    const __m256 a0 = _mm256_loadu_ps(a + k);
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_fmadd_ps(a0, load8<dt>(B + (j * ldb + k) * eb), acc[j]);
  }
  alignas(32) float sums[8];
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) sums[j] = hsum(acc[j]);
  for (int j = 0; j < 8; ++j) {
    float s = sums[j];
    for (int64_t t = k; t < K; ++t) s += a[t] * load1<dt>(B + j * ldb * eb, t);
    c[j] = overwrite ? alpha * s : c[j] + alpha * s;
  }
}

// --- broadcast (outer-product) GEMM -----------------------------------------------------------
// C tile of MR rows × 16 columns: per k, two vectors of a k-major panel P (row stride ldp) and one
// broadcast of A per row; twelve accumulators and no horizontal sums, so short k costs nothing extra.
constexpr int kBR = 6;
constexpr int64_t kBC = 16;

template <int MR>
void bcast_tile(int64_t kc, const float* A, int64_t lda, const float* P, int64_t ldp, float* C, int64_t ldc, int64_t nc,
                float alpha, bool overwrite) {
  __m256 acc[MR][2];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    const __m256 b0 = _mm256_loadu_ps(P + k * ldp), b1 = _mm256_loadu_ps(P + k * ldp + 8);
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const __m256 a = _mm256_broadcast_ss(A + i * lda + k);
      acc[i][0] = _mm256_fmadd_ps(a, b0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(a, b1, acc[i][1]);
    }
  }
  // Through a local array (constant indices only), so the accumulators never live on the stack.
  alignas(32) float out[MR][kBC];
  const __m256 av = _mm256_set1_ps(alpha);
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) {
    _mm256_store_ps(out[i], _mm256_mul_ps(av, acc[i][0]));
    _mm256_store_ps(out[i] + 8, _mm256_mul_ps(av, acc[i][1]));
  }
  for (int i = 0; i < MR; ++i) {
    float* c = C + i * ldc;
    if (nc == kBC && overwrite) {
      _mm256_storeu_ps(c, _mm256_load_ps(out[i]));
      _mm256_storeu_ps(c + 8, _mm256_load_ps(out[i] + 8));
    } else if (nc == kBC) {
      _mm256_storeu_ps(c, _mm256_add_ps(_mm256_loadu_ps(c), _mm256_load_ps(out[i])));
      _mm256_storeu_ps(c + 8, _mm256_add_ps(_mm256_loadu_ps(c + 8), _mm256_load_ps(out[i] + 8)));
    } else {
      for (int64_t j = 0; j < nc; ++j) c[j] = overwrite ? out[i][j] : c[j] + out[i][j];
    }
  }
}

using BcastTileFn = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, int64_t, float, bool);
constexpr BcastTileFn kBcastTiles[kBR] = {bcast_tile<1>, bcast_tile<2>, bcast_tile<3>,
                                          bcast_tile<4>, bcast_tile<5>, bcast_tile<6>};

// All M rows of A against N columns held as k-major panels of 16 columns: panel p starts at
// panels + p·panel_stride and its rows are ldp apart.
void bcast_block(int64_t M, int64_t kc, const float* A, int64_t lda, const float* panels, int64_t panel_stride,
                 int64_t ldp, int64_t N, float* C, int64_t ldc, float alpha, bool overwrite) {
  for (int64_t m = 0; m < M; m += kBR) {
    const int mr = static_cast<int>(min64(kBR, M - m));
    for (int64_t n = 0; n < N; n += kBC)
      kBcastTiles[mr - 1](kc, A + m * lda, lda, panels + (n / kBC) * panel_stride, ldp, C + m * ldc + n, ldc,
                          min64(kBC, N - n), alpha, overwrite);
  }
}

inline void transpose8(__m256 r[8]) {
  const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
  const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
  const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
  const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
  const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
  const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
  const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
  const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
  r[0] = _mm256_permute2f128_ps(u0, u4, 0x20), r[1] = _mm256_permute2f128_ps(u1, u5, 0x20);
  r[2] = _mm256_permute2f128_ps(u2, u6, 0x20), r[3] = _mm256_permute2f128_ps(u3, u7, 0x20);
  r[4] = _mm256_permute2f128_ps(u0, u4, 0x31), r[5] = _mm256_permute2f128_ps(u1, u5, 0x31);
  r[6] = _mm256_permute2f128_ps(u2, u6, 0x31), r[7] = _mm256_permute2f128_ps(u3, u7, 0x31);
}

// panel[k][j] = B[j][k] (f32) for j < nc, k < kc; columns j ≥ nc are zero. B rows are ldb apart.
template <DType dt>
void pack_panel(const char* B, int64_t ldb, int64_t nc, int64_t kc, float* panel) {
  constexpr int64_t eb = elem_bytes<dt>();
  int64_t k = 0;
  for (; k + 8 <= kc; k += 8) {
    for (int64_t g = 0; g < kBC; g += 8) {
      __m256 r[8];
      for (int64_t j = 0; j < 8; ++j)
        r[j] = g + j < nc ? load8<dt>(B + ((g + j) * ldb + k) * eb) : _mm256_setzero_ps();
      transpose8(r);
      for (int64_t i = 0; i < 8; ++i) _mm256_store_ps(panel + (k + i) * kBC + g, r[i]);
    }
  }
  for (; k < kc; ++k)
    for (int64_t j = 0; j < kBC; ++j) panel[k * kBC + j] = j < nc ? load1<dt>(B + j * ldb * eb, k) : 0.0f;
}

// Blocks of the packed path (GotoBLAS order): a KC×NC block of B is converted to f32 panels once and
// stays in L2 while every 6-row tile of A (in L1) runs across its panels.
constexpr int64_t kPackKC = 256, kPackNC = 192;
alignas(64) thread_local float t_panels[kPackKC * kPackNC];

template <DType dt>
void gemm_nt_packed(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const char* B, int64_t ldb, float* C,
                    int64_t ldc, float alpha, bool accumulate) {
  constexpr int64_t eb = elem_bytes<dt>();
  float* panels = t_panels;
  for (int64_t n0 = 0; n0 < N; n0 += kPackNC) {
    const int64_t nb = min64(kPackNC, N - n0);
    for (int64_t k0 = 0; k0 < K; k0 += kPackKC) {
      const int64_t kc = min64(kPackKC, K - k0);
      for (int64_t p = 0; p < nb; p += kBC)
        pack_panel<dt>(B + ((n0 + p) * ldb + k0) * eb, ldb, min64(kBC, nb - p), kc, panels + p * kPackKC);
      bcast_block(M, kc, A + k0, lda, panels, kBC * kPackKC, kBC, nb, C + n0, ldc, alpha, k0 == 0 && !accumulate);
    }
  }
}

// --- dot-product GEMM (decode) ------------------------------------------------------------------
constexpr int kMR = 4, kNR = 3;
// k and m blocks: an NR×KC block of B stays in L1 while the MR-row tiles of an MB×KC block of A
// (in L2) pass over it, so B streams from memory once per MB rows of A. When all of A fits in L2
// there is no k blocking: B's rows then stream front to back, as the prefetcher likes.
constexpr int64_t kKC = 1024, kMB = 64, kWholeA = 1 << 16;
// From this many rows of A the packed broadcast path wins: B's conversion and transposition are
// paid once per M rows instead of once per MR.
constexpr int64_t kPackMinRows = 32;

template <DType dt>
void gemm_nt_impl(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const void* Bv, int64_t ldb, float* C,
                  int64_t ldc, float alpha, bool accumulate) {
  using Fn = void (*)(int64_t, const float*, int64_t, const char*, int64_t, float*, int64_t, float, bool);
  static constexpr Fn tiles[kMR][kNR] = {
      {tile<dt, 1, 1>, tile<dt, 1, 2>, tile<dt, 1, 3>},
      {tile<dt, 2, 1>, tile<dt, 2, 2>, tile<dt, 2, 3>},
      {tile<dt, 3, 1>, tile<dt, 3, 2>, tile<dt, 3, 3>},
      {tile<dt, 4, 1>, tile<dt, 4, 2>, tile<dt, 4, 3>},
  };
  constexpr int64_t eb = elem_bytes<dt>();
  const char* B = static_cast<const char*>(Bv);
  if (K == 0) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        if (!accumulate) C[m * ldc + n] = 0.0f;
    return;
  }
  if (M >= kPackMinRows) return gemm_nt_packed<dt>(M, N, K, A, lda, B, ldb, C, ldc, alpha, accumulate);
  if (M == 1) {  // one x row fits in L1 whatever K is: stream each weight row once, front to back
    int64_t n = 0;
    for (; n + 8 <= N; n += 8) {
      const char* next = n + 16 <= N ? B + (n + 8) * ldb * eb : nullptr;
      gemv_tile8<dt>(K, A, B + n * ldb * eb, ldb, next, C + n, alpha, !accumulate);
    }
    for (; n < N; n += kNR) {
      const int nr = static_cast<int>(min64(kNR, N - n));
      tiles[0][nr - 1](K, A, lda, B + n * ldb * eb, ldb, C + n, ldc, alpha, !accumulate);
    }
    return;
  }
  const int64_t block = M * K <= kWholeA ? K : kKC;
  for (int64_t k0 = 0; k0 < K; k0 += block) {
    const int64_t kc = min64(block, K - k0);
    const bool overwrite = k0 == 0 && !accumulate;
    for (int64_t m0 = 0; m0 < M; m0 += kMB) {
      const int64_t m1 = min64(M, m0 + kMB);
      for (int64_t n = 0; n < N; n += kNR) {
        const int nr = static_cast<int>(min64(kNR, N - n));
        for (int64_t m = m0; m < m1; m += kMR) {
          const int mr = static_cast<int>(min64(kMR, m1 - m));
          tiles[mr - 1][nr - 1](kc, A + m * lda + k0, lda, B + (n * ldb + k0) * eb, ldb, C + m * ldc + n, ldc, alpha,
                                overwrite);
        }
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

// B is already k-major: full 16-column panels are read in place; a ragged last panel is padded.
void gemm_nn(int64_t M, int64_t N, int64_t K, const float* A, int64_t lda, const float* B, int64_t ldb, float* C,
             int64_t ldc, float alpha, bool accumulate) {
  if (K == 0) {
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        if (!accumulate) C[m * ldc + n] = 0.0f;
    return;
  }
  float* pad = t_panels;
  const int64_t full = N / kBC * kBC;
  for (int64_t k0 = 0; k0 < K; k0 += kPackKC) {
    const int64_t kc = min64(kPackKC, K - k0);
    const bool overwrite = k0 == 0 && !accumulate;
    if (full > 0) bcast_block(M, kc, A + k0, lda, B + k0 * ldb, kBC, ldb, full, C, ldc, alpha, overwrite);
    if (full < N) {
      for (int64_t k = 0; k < kc; ++k)
        for (int64_t j = 0; j < kBC; ++j) pad[k * kBC + j] = full + j < N ? B[(k0 + k) * ldb + full + j] : 0.0f;
      bcast_block(M, kc, A + k0, lda, pad, 0, kBC, N - full, C + full, ldc, alpha, overwrite);
    }
  }
}

template <DType dt>
void to_f32_impl(const void* src, float* dst, int64_t n) {
  const char* s = static_cast<const char*>(src);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, load8<dt>(s + i * elem_bytes<dt>()));
  for (; i < n; ++i) dst[i] = load1<dt>(s, i);
}

void to_f32(DType dtype, const void* src, float* dst, int64_t n) {
  switch (dtype) {
    case DType::f32: std::memcpy(dst, src, n * sizeof(float)); return;
    case DType::bf16: return to_f32_impl<DType::bf16>(src, dst, n);
    case DType::f16: return to_f32_impl<DType::f16>(src, dst, n);
    default: unsupported_weight_dtype(dtype);
  }
}

// --- vector primitives ---------------------------------------------------------------------------

float dot(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float s = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

float sum_sq(const float* x, int64_t n) { return dot(x, x, n); }

float max_value(const float* x, int64_t n) {
  int64_t i = 0;
  float m = x[0];
  if (n >= 8) {
    __m256 v = _mm256_loadu_ps(x);
    for (i = 8; i + 8 <= n; i += 8) v = _mm256_max_ps(v, _mm256_loadu_ps(x + i));
    m = hmax(v);
  }
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

float exp_sub_sum(float* x, float shift, int64_t n) {
  const __m256 sh = _mm256_set1_ps(shift);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh));
    _mm256_storeu_ps(x + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float s = hsum(acc);
  for (; i < n; ++i) s += x[i] = expf(x[i] - shift);
  return s;
}

void axpy(float a, const float* x, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a * x[i];
}

void scale(float a, float* y, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(av, _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] *= a;
}

void mul_acc(const float* a, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += a[i] * x[i];
}

void scale_mul(const float* x, float s, const float* w, float* y, int64_t n) {
  const __m256 sv = _mm256_set1_ps(s);
  int64_t i = 0;
  if (w == nullptr) {
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_mul_ps(sv, _mm256_loadu_ps(x + i)));
    for (; i < n; ++i) y[i] = s * x[i];
    return;
  }
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_mul_ps(sv, _mm256_loadu_ps(x + i)), _mm256_loadu_ps(w + i)));
  for (; i < n; ++i) y[i] = s * x[i] * w[i];
}

void add(float* x, const float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) x[i] += y[i];
}

float silu1(float x) { return x / (1.0f + expf(-x)); }

void silu(float* x, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    _mm256_storeu_ps(x + i, _mm256_mul_ps(v, sigmoid8(v)));
  }
  for (; i < n; ++i) x[i] = silu1(x[i]);
}

void silu_mul(const float* gate, const float* up, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_mul_ps(g, sigmoid8(g)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = silu1(gate[i]) * up[i];
}

void sigmoid_mul(float* x, const float* gate, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), sigmoid8(_mm256_loadu_ps(gate + i))));
  for (; i < n; ++i) x[i] *= 1.0f / (1.0f + expf(-gate[i]));
}

void rope_rotate(float* x, const float* cos, const float* sin, int64_t half) {
  int64_t i = 0;
  for (; i + 8 <= half; i += 8) {
    const __m256 a = _mm256_loadu_ps(x + i), b = _mm256_loadu_ps(x + half + i);
    const __m256 c = _mm256_loadu_ps(cos + i), s = _mm256_loadu_ps(sin + i);
    _mm256_storeu_ps(x + i, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
    _mm256_storeu_ps(x + half + i, _mm256_fmadd_ps(a, s, _mm256_mul_ps(b, c)));
  }
  for (; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = a * sin[i] + b * cos[i];
  }
}

// Four keys per pass share each load of q; two accumulators per key keep eight FMA chains in flight.
void dots_strided(const float* q, const float* k, int64_t n_keys, int64_t k_stride, int64_t d, float* out) {
  int64_t j = 0;
  for (; j + 4 <= n_keys; j += 4) {
    const float* kr[4] = {k + j * k_stride, k + (j + 1) * k_stride, k + (j + 2) * k_stride, k + (j + 3) * k_stride};
    __m256 s[4][2];
    for (int r = 0; r < 4; ++r) s[r][0] = s[r][1] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 16 <= d; i += 16) {
      const __m256 q0 = _mm256_loadu_ps(q + i), q1 = _mm256_loadu_ps(q + i + 8);
      for (int r = 0; r < 4; ++r) {
        s[r][0] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(kr[r] + i), s[r][0]);
        s[r][1] = _mm256_fmadd_ps(q1, _mm256_loadu_ps(kr[r] + i + 8), s[r][1]);
      }
    }
    for (; i + 8 <= d; i += 8) {
      const __m256 q0 = _mm256_loadu_ps(q + i);
      for (int r = 0; r < 4; ++r) s[r][0] = _mm256_fmadd_ps(q0, _mm256_loadu_ps(kr[r] + i), s[r][0]);
    }
    for (int r = 0; r < 4; ++r) {
      float v = hsum(_mm256_add_ps(s[r][0], s[r][1]));
      for (int64_t t = i; t < d; ++t) v += q[t] * kr[r][t];
      out[j + r] = v;
    }
  }
  for (; j < n_keys; ++j) out[j] = dot(q, k + j * k_stride, d);
}

// Sixty-four features of acc stay in eight registers (eight FMA chains) while every key's value row
// is added in.
void axpys_strided(const float* p, const float* v, int64_t n_keys, int64_t v_stride, int64_t d, float* acc) {
  int64_t i = 0;
  for (; i + 64 <= d; i += 64) {
    __m256 a[8];
    for (int r = 0; r < 8; ++r) a[r] = _mm256_loadu_ps(acc + i + 8 * r);
    for (int64_t j = 0; j < n_keys; ++j) {
      const __m256 pj = _mm256_set1_ps(p[j]);
      const float* vj = v + j * v_stride + i;
      for (int r = 0; r < 8; ++r) a[r] = _mm256_fmadd_ps(pj, _mm256_loadu_ps(vj + 8 * r), a[r]);
    }
    for (int r = 0; r < 8; ++r) _mm256_storeu_ps(acc + i + 8 * r, a[r]);
  }
  for (; i + 8 <= d; i += 8) {
    __m256 a0 = _mm256_loadu_ps(acc + i);
    for (int64_t j = 0; j < n_keys; ++j) a0 = _mm256_fmadd_ps(_mm256_set1_ps(p[j]), _mm256_loadu_ps(v + j * v_stride + i), a0);
    _mm256_storeu_ps(acc + i, a0);
  }
  for (; i < d; ++i)
    for (int64_t j = 0; j < n_keys; ++j) acc[i] += p[j] * v[j * v_stride + i];
}

// Two passes over each state row (it stays in L1 between them): S·k first, then the decayed
// rank-1 update fused with the output dot product, four accumulators per pass.
void gdn_step(float* S, int64_t Dv, int64_t Dk, const float* q, const float* k, const float* v, float decay, float beta,
              float* o) {
  const __m256 dv = _mm256_set1_ps(decay);
  for (int64_t i = 0; i < Dv; ++i) {
    float* row = S + i * Dk;
    const float delta = beta * (v[i] - decay * dot(row, k, Dk));
    const __m256 dl = _mm256_set1_ps(delta);
    __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
    int64_t j = 0;
    for (; j + 32 <= Dk; j += 32) {
      for (int r = 0; r < 4; ++r) {
        const int64_t at = j + 8 * r;
        const __m256 x = _mm256_fmadd_ps(dl, _mm256_loadu_ps(k + at), _mm256_mul_ps(dv, _mm256_loadu_ps(row + at)));
        _mm256_storeu_ps(row + at, x);
        acc[r] = _mm256_fmadd_ps(x, _mm256_loadu_ps(q + at), acc[r]);
      }
    }
    for (; j + 8 <= Dk; j += 8) {
      const __m256 x = _mm256_fmadd_ps(dl, _mm256_loadu_ps(k + j), _mm256_mul_ps(dv, _mm256_loadu_ps(row + j)));
      _mm256_storeu_ps(row + j, x);
      acc[0] = _mm256_fmadd_ps(x, _mm256_loadu_ps(q + j), acc[0]);
    }
    float s = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (; j < Dk; ++j) {
      row[j] = decay * row[j] + delta * k[j];
      s += row[j] * q[j];
    }
    o[i] = s;
  }
}

}  // namespace

const Kernels& avx2_kernels() {
  static const Kernels kernels{
      .isa = "avx2",
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

}  // namespace qinfer::cpu
