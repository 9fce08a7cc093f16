// The cpu kernel tables (portable and AVX2) against plain double-precision loops, on sizes that hit
// every vector tail, register tile edge and cache block boundary.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "backend/cpu/kernels.h"
#include "core/error.h"

namespace qinfer::cpu {
namespace {

std::vector<const Kernels*> tables() {
  std::vector<const Kernels*> t = {&portable_kernels()};
  if (cpu_has_avx2()) t.push_back(&avx2_kernels());
  return t;
}

std::vector<float> random_vector(size_t n, std::mt19937& rng, float stddev = 1.0f) {
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// Weights stored as `dtype`, and the exact f32 values they hold.
std::vector<uint16_t> to_half(DType dtype, std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    bits[i] = dtype == DType::bf16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
    values[i] = dtype == DType::bf16 ? bf16_to_f32(bits[i]) : f16_to_f32(bits[i]);
  }
  return bits;
}

double max_rel_error(const std::vector<float>& got, const std::vector<double>& want) {
  double scale = 1e-30, err = 0.0;
  for (size_t i = 0; i < want.size(); ++i) scale = std::max(scale, std::abs(want[i]));
  for (size_t i = 0; i < want.size(); ++i) err = std::max(err, std::abs(got[i] - want[i]));
  return err / scale;
}

TEST(CpuKernels, BestIsAvx2ExactlyWhenTheCpuHasIt) {
  EXPECT_STREQ(best_kernels().isa, cpu_has_avx2() ? "avx2" : "portable");
}

TEST(CpuKernels, GemmNtMatchesDoubleLoopsForEveryDtypeAndEdge) {
  std::mt19937 rng(1);
  struct Shape { int64_t M, N, K; };
  const Shape shapes[] = {{1, 1, 1},    {1, 9, 7},    {1, 17, 1025}, {2, 3, 8},     {3, 5, 33},  {5, 8, 257},
                          {8, 19, 64},  {31, 7, 100}, {32, 16, 16},  {33, 33, 300}, {70, 40, 9}, {6, 200, 1030},
                          {20, 9, 4000}};  // the last: k-blocked dot path (M·K past what stays in L2)
  for (const Kernels* k : tables()) {
    for (DType dt : {DType::f32, DType::bf16, DType::f16}) {
      for (const Shape s : shapes) {
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(testing::Message() << k->isa << " " << name(dt) << " M=" << s.M << " N=" << s.N << " K=" << s.K
                                          << " accumulate=" << accumulate);
          const int64_t lda = s.K + 3, ldc = s.N + 2;  // strides past the row ends
          std::vector<float> A = random_vector(s.M * lda, rng), B = random_vector(s.N * s.K, rng);
          std::vector<uint16_t> half;
          if (dt != DType::f32) half = to_half(dt, B);
          std::vector<float> C = random_vector(s.M * ldc, rng);
          std::vector<double> want(C.begin(), C.end());
          const float alpha = -0.75f;
          for (int64_t m = 0; m < s.M; ++m)
            for (int64_t n = 0; n < s.N; ++n) {
              double sum = 0.0;
              for (int64_t i = 0; i < s.K; ++i) sum += double(A[m * lda + i]) * B[n * s.K + i];
              want[m * ldc + n] = alpha * sum + (accumulate ? want[m * ldc + n] : 0.0);
            }
          const void* b = dt == DType::f32 ? static_cast<const void*>(B.data()) : half.data();
          k->gemm_nt(s.M, s.N, s.K, A.data(), lda, b, dt, s.K, C.data(), ldc, alpha, accumulate);
          // Columns past N stay untouched.
          for (int64_t m = 0; m < s.M; ++m)
            for (int64_t n = s.N; n < ldc; ++n) want[m * ldc + n] = C[m * ldc + n];
          EXPECT_LT(max_rel_error(C, want), 2e-6);
        }
      }
    }
  }
}

TEST(CpuKernels, GemmNnMatchesDoubleLoops) {
  std::mt19937 rng(2);
  struct Shape { int64_t M, N, K; };
  for (const Kernels* k : tables()) {
    for (const Shape s : {Shape{1, 1, 1}, Shape{64, 128, 64}, Shape{7, 17, 300}, Shape{13, 33, 5}, Shape{128, 9, 64}}) {
      for (bool accumulate : {false, true}) {
        SCOPED_TRACE(testing::Message() << k->isa << " M=" << s.M << " N=" << s.N << " K=" << s.K);
        const int64_t ldb = s.N + 1, ldc = s.N + 4;
        std::vector<float> A = random_vector(s.M * s.K, rng), B = random_vector(s.K * ldb, rng);
        std::vector<float> C = random_vector(s.M * ldc, rng);
        std::vector<double> want(C.begin(), C.end());
        for (int64_t m = 0; m < s.M; ++m)
          for (int64_t n = 0; n < s.N; ++n) {
            double sum = 0.0;
            for (int64_t i = 0; i < s.K; ++i) sum += double(A[m * s.K + i]) * B[i * ldb + n];
            want[m * ldc + n] = 2.0 * sum + (accumulate ? want[m * ldc + n] : 0.0);
          }
        k->gemm_nn(s.M, s.N, s.K, A.data(), s.K, B.data(), ldb, C.data(), ldc, 2.0f, accumulate);
        EXPECT_LT(max_rel_error(C, want), 2e-6);
      }
    }
  }
}

TEST(CpuKernels, VectorPrimitivesMatchScalarFormulas) {
  std::mt19937 rng(3);
  for (const Kernels* k : tables()) {
    for (int64_t n : {1, 7, 8, 9, 31, 33, 64, 65, 257}) {
      SCOPED_TRACE(testing::Message() << k->isa << " n=" << n);
      std::vector<float> a = random_vector(n, rng, 3.0f), b = random_vector(n, rng), w = random_vector(n, rng);
      double dot = 0.0, sq = 0.0;
      for (int64_t i = 0; i < n; ++i) dot += double(a[i]) * b[i], sq += double(a[i]) * a[i];
      EXPECT_NEAR(k->dot(a.data(), b.data(), n), dot, 1e-5 * (std::abs(dot) + n));
      EXPECT_NEAR(k->sum_sq(a.data(), n), sq, 1e-6 * sq);
      EXPECT_EQ(k->max(a.data(), n), *std::max_element(a.begin(), a.end()));

      std::vector<float> y = b;
      k->axpy(0.5f, a.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(y[i], b[i] + 0.5f * a[i]);
      y = b;
      k->mul_acc(w.data(), a.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], b[i] + w[i] * a[i], 1e-6 * (1 + std::abs(y[i])));
      k->scale_mul(a.data(), 2.0f, w.data(), y.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_FLOAT_EQ(y[i], 2.0f * a[i] * w[i]);
      y = b;
      k->add(y.data(), a.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(y[i], b[i] + a[i]);

      std::vector<float> e = a;
      const float shift = 1.5f;
      double sum = 0.0;
      for (float x : a) sum += std::exp(double(x) - shift);
      EXPECT_NEAR(k->exp_sub_sum(e.data(), shift, n), sum, 1e-6 * sum);
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(e[i], std::exp(double(a[i] - shift)), 3e-7 * e[i]);

      std::vector<float> out(n);
      k->silu_mul(a.data(), b.data(), out.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(out[i], a[i] / (1 + std::exp(-double(a[i]))) * b[i], 1e-6 * (1 + std::abs(out[i])));
      y = b;
      k->sigmoid_mul(y.data(), a.data(), n);
      for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(y[i], b[i] / (1 + std::exp(-double(a[i]))), 1e-6 * (1 + std::abs(y[i])));

      const int64_t half = (n + 1) / 2;
      std::vector<float> x = random_vector(2 * half, rng), c = random_vector(half, rng), s = random_vector(half, rng);
      std::vector<float> r = x;
      k->rope_rotate(r.data(), c.data(), s.data(), half);
      for (int64_t i = 0; i < half; ++i) {
        EXPECT_NEAR(r[i], x[i] * c[i] - x[i + half] * s[i], 1e-5);
        EXPECT_NEAR(r[i + half], x[i] * s[i] + x[i + half] * c[i], 1e-5);
      }
    }
  }
}

// exp is clamped at the ends of the f32 range, never inf or NaN; silu and sigmoid keep their limits.
TEST(CpuKernels, ActivationsStayFiniteAtExtremes) {
  for (const Kernels* k : tables()) {
    SCOPED_TRACE(k->isa);
    std::vector<float> x = {-1000, -100, -88, -20, 0, 20, 88, 100, 1000, -1000, -100, -88, -20, 0, 20, 88, 100};
    const int64_t n = static_cast<int64_t>(x.size());
    std::vector<float> s = x;
    k->silu(s.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_TRUE(std::isfinite(s[i])) << x[i];
      const double want = x[i] / (1.0 + std::exp(-double(x[i])));
      EXPECT_NEAR(s[i], want, 1e-6 * std::abs(want) + 1e-30) << x[i];
    }
    std::vector<float> g(n, 1.0f);
    k->sigmoid_mul(g.data(), x.data(), n);
    for (int64_t i = 0; i < n; ++i) EXPECT_NEAR(g[i], 1.0 / (1.0 + std::exp(-double(x[i]))), 1e-7) << x[i];
    // Softmax use: after subtracting the maximum every input is ≤ 0 and every output in [0, 1].
    std::vector<float> e = x;
    const float sum = k->exp_sub_sum(e.data(), 1000.0f, n);
    for (int64_t i = 0; i < n; ++i) EXPECT_TRUE(e[i] >= 0.0f && e[i] <= 1.0f && (x[i] < 1000 || e[i] == 1.0f)) << x[i];
    EXPECT_FLOAT_EQ(sum, 1.0f);
  }
}

TEST(CpuKernels, StridedDotsAndWeightedSums) {
  std::mt19937 rng(4);
  for (const Kernels* k : tables()) {
    for (int64_t d : {1, 20, 64, 72, 256}) {
      for (int64_t keys : {1, 3, 4, 16, 17}) {
        SCOPED_TRACE(testing::Message() << k->isa << " d=" << d << " keys=" << keys);
        const int64_t stride = 3 * d + 5;
        std::vector<float> q = random_vector(d, rng), kv = random_vector(keys * stride, rng), p = random_vector(keys, rng);
        std::vector<float> dots(keys), acc = random_vector(d, rng);
        std::vector<double> want_acc(acc.begin(), acc.end());
        k->dots_strided(q.data(), kv.data(), keys, stride, d, dots.data());
        k->axpys_strided(p.data(), kv.data(), keys, stride, d, acc.data());
        for (int64_t j = 0; j < keys; ++j) {
          double sum = 0.0;
          for (int64_t i = 0; i < d; ++i) sum += double(q[i]) * kv[j * stride + i], want_acc[i] += double(p[j]) * kv[j * stride + i];
          EXPECT_NEAR(dots[j], sum, 1e-5 * (1 + std::abs(sum)));
        }
        EXPECT_LT(max_rel_error(acc, want_acc), 1e-6);
      }
    }
  }
}

TEST(CpuKernels, GdnStepIsTheDeltaRule) {
  std::mt19937 rng(5);
  for (const Kernels* k : tables()) {
    for (auto [dv, dk] : {std::pair<int64_t, int64_t>{1, 1}, {9, 17}, {128, 128}, {16, 40}}) {
      SCOPED_TRACE(testing::Message() << k->isa << " dv=" << dv << " dk=" << dk);
      std::vector<float> S = random_vector(dv * dk, rng), q = random_vector(dk, rng), key = random_vector(dk, rng),
                         v = random_vector(dv, rng), o(dv);
      const float decay = 0.8f, beta = 0.6f;
      std::vector<double> want(S.begin(), S.end()), want_o(dv);
      for (int64_t i = 0; i < dv; ++i) {
        double m = 0.0;
        for (int64_t j = 0; j < dk; ++j) m += decay * want[i * dk + j] * key[j];
        const double delta = beta * (v[i] - m);
        for (int64_t j = 0; j < dk; ++j) want[i * dk + j] = decay * want[i * dk + j] + delta * key[j];
        for (int64_t j = 0; j < dk; ++j) want_o[i] += want[i * dk + j] * q[j];
      }
      k->gdn_step(S.data(), dv, dk, q.data(), key.data(), v.data(), decay, beta, o.data());
      EXPECT_LT(max_rel_error(S, want), 1e-6);
      EXPECT_LT(max_rel_error(o, want_o), 1e-5);
    }
  }
}

TEST(CpuKernels, ToF32ConvertsExactly) {
  std::mt19937 rng(6);
  for (const Kernels* k : tables()) {
    for (DType dt : {DType::bf16, DType::f16}) {
      std::vector<float> values = random_vector(37, rng, 100.0f);
      std::vector<uint16_t> bits = to_half(dt, values);
      std::vector<float> out(values.size());
      k->to_f32(dt, bits.data(), out.data(), static_cast<int64_t>(out.size()));
      EXPECT_EQ(out, values) << k->isa << " " << name(dt);
    }
    EXPECT_THROW(k->to_f32(DType::f8_e4m3, nullptr, nullptr, 0), Error);
  }
}

}  // namespace
}  // namespace qinfer::cpu
