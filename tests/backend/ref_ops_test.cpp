// The ref backend against hand-computed cases and independent formulas (complex rotation for RoPE,
// dense masked matrices for paged attention, composed linear/silu for the experts).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <numeric>
#include <random>
#include <set>

#include "backend/ops.h"
#include "core/error.h"

namespace qinfer {
namespace {

Tensor f32_tensor(std::vector<int64_t> shape, const std::vector<float>& values) {
  Tensor t = host_tensor(DType::f32, std::move(shape));
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel());
  std::copy(values.begin(), values.end(), t.ptr<float>());
  return t;
}

Tensor i32_tensor(std::vector<int64_t> shape, const std::vector<int32_t>& values) {
  Tensor t = host_tensor(DType::i32, std::move(shape));
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel());
  std::copy(values.begin(), values.end(), t.ptr<int32_t>());
  return t;
}

Tensor random_f32(std::vector<int64_t> shape, std::mt19937& rng, float scale = 1.0f) {
  Tensor t = host_tensor(DType::f32, std::move(shape));
  std::normal_distribution<float> normal(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = normal(rng);
  return t;
}

std::vector<float> values(const Tensor& t) { return {t.ptr<float>(), t.ptr<float>() + t.numel()}; }

// A random weight stored as `dtype`; `exact` receives the f32 values it holds.
Tensor random_weight(DType dtype, std::vector<int64_t> shape, std::mt19937& rng, std::vector<float>& exact) {
  Tensor t = host_tensor(dtype, std::move(shape));
  std::normal_distribution<float> normal(0.0f, 0.5f);
  exact.resize(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float x = normal(rng);
    if (dtype == DType::bf16) {
      t.ptr<uint16_t>()[i] = f32_to_bf16(x), exact[i] = bf16_to_f32(t.ptr<uint16_t>()[i]);
    } else if (dtype == DType::f16) {
      t.ptr<uint16_t>()[i] = f32_to_f16(x), exact[i] = f16_to_f32(t.ptr<uint16_t>()[i]);
    } else {
      t.ptr<float>()[i] = exact[i] = x;
    }
  }
  return t;
}

double rel_rms(const std::vector<float>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < got.size(); ++i) err += (got[i] - want[i]) * (got[i] - want[i]), ref += want[i] * want[i];
  return std::sqrt(err / std::max(ref, 1e-300));
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

constexpr DType kWeightDtypes[] = {DType::f32, DType::bf16, DType::f16};

class RefOps : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_ref_ops();
  std::mt19937 rng{20260901};
};

TEST_F(RefOps, NameDeviceAndZeroFilledAlloc) {
  EXPECT_EQ(ops->name(), "ref");
  EXPECT_EQ(ops->device(), Device::cpu);
  Tensor t = ops->alloc(DType::f32, {3, 5});
  EXPECT_EQ(t.shape, (std::vector<int64_t>{3, 5}));
  for (float x : values(t)) EXPECT_EQ(x, 0.0f);
  EXPECT_THROW(ops->alloc(DType::f32, {2, -1}), Error);
}

TEST_F(RefOps, EmbeddingGathersExactRowsOfEveryWeightDtype) {
  for (DType dtype : kWeightDtypes) {
    std::vector<float> exact;
    Tensor table = random_weight(dtype, {5, 3}, rng, exact);
    Tensor ids = i32_tensor({4}, {4, 0, 4, 2});
    Tensor out = ops->alloc(DType::f32, {4, 3});
    ops->embedding(ids, table, out);
    for (int t = 0; t < 4; ++t)
      for (int c = 0; c < 3; ++c) EXPECT_EQ(out.ptr<float>()[t * 3 + c], exact[ids.ptr<int32_t>()[t] * 3 + c]);
  }
  Tensor table = ops->alloc(DType::f32, {5, 3});
  Tensor out = ops->alloc(DType::f32, {1, 3});
  EXPECT_THROW(ops->embedding(i32_tensor({1}, {5}), table, out), Error);
  EXPECT_THROW(ops->embedding(i32_tensor({1}, {-1}), table, out), Error);
  Tensor wrong = ops->alloc(DType::f32, {1, 4});
  EXPECT_THROW(ops->embedding(i32_tensor({1}, {0}), table, wrong), Error);
}

TEST_F(RefOps, LinearHandComputed) {
  Tensor x = f32_tensor({2, 2}, {1, 2, 3, 4});
  Tensor w = f32_tensor({3, 2}, {1, 0, 0, 1, 1, 1});
  Tensor y = ops->alloc(DType::f32, {2, 3});
  ops->linear(x, w, y);
  EXPECT_EQ(values(y), (std::vector<float>{1, 2, 3, 3, 4, 7}));
}

TEST_F(RefOps, LinearMatchesDoubleLoopForEveryWeightDtype) {
  const int T = 3, in = 37, out = 5;
  for (DType dtype : kWeightDtypes) {
    std::vector<float> w_exact;
    Tensor w = random_weight(dtype, {out, in}, rng, w_exact);
    Tensor x = random_f32({T, in}, rng);
    Tensor y = ops->alloc(DType::f32, {T, out});
    ops->linear(x, w, y);
    std::vector<double> want(T * out);
    for (int t = 0; t < T; ++t)
      for (int o = 0; o < out; ++o)
        for (int i = 0; i < in; ++i) want[t * out + o] += double(x.ptr<float>()[t * in + i]) * w_exact[o * in + i];
    EXPECT_LT(rel_rms(values(y), want), 1e-7) << name(dtype);
  }
}

TEST_F(RefOps, LinearRejectsBadArguments) {
  Tensor x = ops->alloc(DType::f32, {2, 4});
  Tensor y = ops->alloc(DType::f32, {2, 3});
  EXPECT_THROW(ops->linear(x, ops->alloc(DType::f32, {3, 5}), y), Error);  // in mismatch
  Tensor y_bad = ops->alloc(DType::f32, {2, 4});
  EXPECT_THROW(ops->linear(x, ops->alloc(DType::f32, {3, 4}), y_bad), Error);
  EXPECT_THROW(ops->linear(ops->alloc(DType::bf16, {2, 4}), ops->alloc(DType::f32, {3, 4}), y), Error);
  EXPECT_THROW(ops->linear(x, ops->alloc(DType::i32, {3, 4}), y), Error);
  Tensor square = ops->alloc(DType::f32, {4, 4});
  EXPECT_THROW(ops->linear(x, square, x), Error);  // y aliases x
  Tensor on_gpu = ops->alloc(DType::f32, {3, 4});
  on_gpu.device = Device::cuda;
  EXPECT_THROW(ops->linear(x, on_gpu, y), Error);
  Tensor no_storage = ops->alloc(DType::f32, {3, 4});
  no_storage.data = nullptr;
  EXPECT_THROW(ops->linear(x, no_storage, y), Error);
}

TEST_F(RefOps, RmsNormHandComputedAndInPlace) {
  Tensor x = f32_tensor({1, 2}, {3, 4});
  Tensor w = f32_tensor({2}, {1, 2});
  Tensor y = ops->alloc(DType::f32, {1, 2});
  ops->rms_norm(x, w, 0.0f, y);  // rms = sqrt(12.5)
  EXPECT_NEAR(y.ptr<float>()[0], 3 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(y.ptr<float>()[1], 8 / std::sqrt(12.5), 1e-6);

  const int N = 4, D = 19;
  Tensor xr = random_f32({N, D}, rng), wr = random_f32({D}, rng);
  std::vector<double> want(N * D);
  for (int r = 0; r < N; ++r) {
    double ss = 0;
    for (int i = 0; i < D; ++i) ss += double(xr.ptr<float>()[r * D + i]) * xr.ptr<float>()[r * D + i];
    for (int i = 0; i < D; ++i)
      want[r * D + i] = xr.ptr<float>()[r * D + i] / std::sqrt(ss / D + 1e-6) * wr.ptr<float>()[i];
  }
  ops->rms_norm(xr, wr, 1e-6f, xr);  // y may alias x
  EXPECT_LT(rel_rms(values(xr), want), 1e-6);
  EXPECT_THROW(ops->rms_norm(xr, ops->alloc(DType::f32, {D + 1}), 1e-6f, xr), Error);
}

TEST_F(RefOps, AddRmsNormUpdatesTheResidualAndNormsTheSum) {
  Tensor x = f32_tensor({1, 2}, {1, 2});
  Tensor delta = f32_tensor({1, 2}, {2, 2});
  Tensor w = f32_tensor({2}, {1, 2});
  Tensor y = ops->alloc(DType::f32, {1, 2});
  ops->add_rms_norm(x, delta, w, 0.0f, y);  // x = [3, 4]: rms = sqrt(12.5)
  EXPECT_EQ(values(x), (std::vector<float>{3, 4}));
  EXPECT_NEAR(y.ptr<float>()[0], 3 / std::sqrt(12.5), 1e-6);
  EXPECT_NEAR(y.ptr<float>()[1], 8 / std::sqrt(12.5), 1e-6);
  EXPECT_THROW(ops->add_rms_norm(x, delta, w, 1e-6f, x), Error);      // y aliases x
  EXPECT_THROW(ops->add_rms_norm(x, delta, w, 1e-6f, delta), Error);  // y aliases delta
  EXPECT_THROW(ops->add_rms_norm(x, delta, ops->alloc(DType::f32, {3}), 1e-6f, y), Error);
  EXPECT_THROW(ops->add_rms_norm(x, ops->alloc(DType::f32, {2, 2}), w, 1e-6f, y), Error);
}

TEST_F(RefOps, RmsNormGatedMatchesFormula) {
  const int N = 3, D = 16;
  Tensor x = random_f32({N, D}, rng), z = random_f32({N, D}, rng, 2.0f), w = random_f32({D}, rng);
  Tensor y = ops->alloc(DType::f32, {N, D});
  ops->rms_norm_gated(x, z, w, 1e-6f, y);
  std::vector<double> want(N * D);
  for (int r = 0; r < N; ++r) {
    double ss = 0;
    for (int i = 0; i < D; ++i) ss += double(x.ptr<float>()[r * D + i]) * x.ptr<float>()[r * D + i];
    for (int i = 0; i < D; ++i)
      want[r * D + i] =
          x.ptr<float>()[r * D + i] / std::sqrt(ss / D + 1e-6) * w.ptr<float>()[i] * silu(z.ptr<float>()[r * D + i]);
  }
  EXPECT_LT(rel_rms(values(y), want), 1e-6);
  EXPECT_THROW(ops->rms_norm_gated(x, ops->alloc(DType::f32, {N, D + 1}), w, 1e-6f, y), Error);
}

TEST_F(RefOps, L2NormHandComputed) {
  Tensor x = f32_tensor({2, 2}, {3, 4, 0, 0});
  ops->l2_norm(x, 1e-6f, 2.0f, x);
  EXPECT_NEAR(x.ptr<float>()[0], 1.2, 1e-6);
  EXPECT_NEAR(x.ptr<float>()[1], 1.6, 1e-6);
  EXPECT_EQ(x.ptr<float>()[2], 0.0f);  // eps keeps a zero row finite
  Tensor y_bad = ops->alloc(DType::f32, {3, 2});
  EXPECT_THROW(ops->l2_norm(x, 1e-6f, 1.0f, y_bad), Error);
}

// x_i + i·x_{i+d/2} rotated by e^{i·pos·θ^(−2i/d)}; features past rotary_dim pass through.
void expect_complex_rotation(const std::vector<float>& before, const Tensor& after, int64_t T, int64_t heads,
                             int64_t head_dim, int64_t d, double theta, const std::vector<std::vector<int>>& pos_of) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < heads; ++h) {
      const float* x0 = before.data() + (t * heads + h) * head_dim;
      const float* x1 = after.ptr<float>() + (t * heads + h) * head_dim;
      for (int64_t i = 0; i < d / 2; ++i) {
        const double angle = pos_of[t][i] * std::pow(theta, -2.0 * i / d);
        const std::complex<double> z = std::complex<double>(x0[i], x0[i + d / 2]) * std::polar(1.0, angle);
        EXPECT_NEAR(x1[i], z.real(), 2e-5) << "t " << t << " i " << i;
        EXPECT_NEAR(x1[i + d / 2], z.imag(), 2e-5) << "t " << t << " i " << i;
      }
      for (int64_t i = d; i < head_dim; ++i) EXPECT_EQ(x1[i], x0[i]);
    }
}

TEST_F(RefOps, RopeIsComplexRotationOfRotateHalfPairs) {
  const int64_t T = 5, heads = 2, head_dim = 10, d = 6;
  const std::vector<int32_t> pos = {0, 1, 7, 30, 99};
  Tensor positions = host_tensor(DType::i32, {3, T});
  for (int r = 0; r < 3; ++r) std::copy(pos.begin(), pos.end(), positions.ptr<int32_t>() + r * T);
  Tensor x = random_f32({T, heads, head_dim}, rng);
  const std::vector<float> before = values(x);
  ops->rope(x, positions, {.rotary_dim = d, .theta = 10000.0});
  std::vector<std::vector<int>> pos_of(T, std::vector<int>(d / 2));
  for (int64_t t = 0; t < T; ++t) std::fill(pos_of[t].begin(), pos_of[t].end(), pos[t]);
  expect_complex_rotation(before, x, T, heads, head_dim, d, 10000.0, pos_of);
}

TEST_F(RefOps, RopeInterleavedMropeTakesEachFrequencysAxis) {
  // section [2,2,1] over 6 frequencies: axes T,H,W,T,H,T (spec §10.3 by hand).
  const int64_t T = 2, heads = 1, head_dim = 12, d = 12;
  const int axis_of[6] = {0, 1, 2, 0, 1, 0};
  Tensor positions = i32_tensor({3, T}, {3, 40, 5, 17, 11, 2});
  Tensor x = random_f32({T, heads, head_dim}, rng);
  const std::vector<float> before = values(x);
  ops->rope(x, positions, {.rotary_dim = d, .theta = 500.0, .mrope_section = {2, 2, 1}});
  std::vector<std::vector<int>> pos_of(T, std::vector<int>(d / 2));
  for (int64_t t = 0; t < T; ++t)
    for (int i = 0; i < 6; ++i) pos_of[t][i] = positions.ptr<int32_t>()[axis_of[i] * T + t];
  expect_complex_rotation(before, x, T, heads, head_dim, d, 500.0, pos_of);
}

TEST_F(RefOps, RopeQwen35SectionsSplitFrequencies11_11_10) {
  // Only one axis has a non-zero position: exactly its frequencies rotate.
  const std::set<int> expected[3] = {{0, 3, 6, 9, 12, 15, 18, 21, 24, 27, 30},
                                     {1, 4, 7, 10, 13, 16, 19, 22, 25, 28, 31},
                                     {2, 5, 8, 11, 14, 17, 20, 23, 26, 29}};
  for (int axis = 0; axis < 3; ++axis) {
    Tensor positions = host_tensor(DType::i32, {3, 1});
    positions.ptr<int32_t>()[axis] = 1000;
    Tensor x = host_tensor(DType::f32, {1, 1, 256});
    std::fill_n(x.ptr<float>(), 256, 1.0f);
    ops->rope(x, positions, {.rotary_dim = 64, .theta = 1e7, .mrope_section = {11, 11, 10}});
    std::set<int> rotated;
    for (int i = 0; i < 32; ++i)
      if (x.ptr<float>()[i] != 1.0f) rotated.insert(i);
    EXPECT_EQ(rotated, expected[axis]) << "axis " << axis;
  }
}

TEST_F(RefOps, RmsNormRopeNormsEachHeadThenRotatesIt) {
  const int64_t T = 3, heads = 2, head_dim = 10, d = 6;
  const std::vector<int32_t> pos = {0, 5, 41};
  Tensor positions = host_tensor(DType::i32, {3, T});
  for (int r = 0; r < 3; ++r) std::copy(pos.begin(), pos.end(), positions.ptr<int32_t>() + r * T);
  Tensor x = random_f32({T, heads, head_dim}, rng, 3.0f), w = random_f32({head_dim}, rng);
  std::vector<float> normed = values(x);
  for (int64_t r = 0; r < T * heads; ++r) {
    float* v = normed.data() + r * head_dim;
    double ss = 0;
    for (int64_t i = 0; i < head_dim; ++i) ss += double(v[i]) * v[i];
    const float inv_rms = static_cast<float>(1.0 / std::sqrt(ss / head_dim + 1e-6f));  // rms_norm's f32 rounding
    for (int64_t i = 0; i < head_dim; ++i) v[i] = v[i] * inv_rms * w.ptr<float>()[i];
  }
  ops->rms_norm_rope(x, w, 1e-6f, positions, {.rotary_dim = d, .theta = 10000.0});
  std::vector<std::vector<int>> pos_of(T, std::vector<int>(d / 2));
  for (int64_t t = 0; t < T; ++t) std::fill(pos_of[t].begin(), pos_of[t].end(), pos[t]);
  expect_complex_rotation(normed, x, T, heads, head_dim, d, 10000.0, pos_of);
  EXPECT_THROW(ops->rms_norm_rope(x, ops->alloc(DType::f32, {head_dim + 1}), 1e-6f, positions, {.rotary_dim = d}),
               Error);
  EXPECT_THROW(ops->rms_norm_rope(x, w, 1e-6f, ops->alloc(DType::i32, {3, T + 1}), {.rotary_dim = d}), Error);
}

TEST_F(RefOps, RopeRejectsBadArguments) {
  Tensor x = ops->alloc(DType::f32, {2, 1, 8});
  Tensor positions = ops->alloc(DType::i32, {3, 2});
  EXPECT_THROW(ops->rope(x, positions, {.rotary_dim = 5}), Error);
  EXPECT_THROW(ops->rope(x, positions, {.rotary_dim = 10}), Error);
  EXPECT_THROW(ops->rope(x, positions, {.rotary_dim = 0}), Error);
  EXPECT_THROW(ops->rope(x, positions, {.rotary_dim = 8, .mrope_section = {2, 2}}), Error);
  Tensor one_row = ops->alloc(DType::i32, {1, 2});
  EXPECT_THROW(ops->rope(x, one_row, {.rotary_dim = 8}), Error);
}

TEST_F(RefOps, ElementwiseOpsMatchFormulasAndAlias) {
  Tensor gate = f32_tensor({2, 2}, {-1, 0, 2, 30});
  Tensor up = f32_tensor({2, 2}, {2, 5, -1, 1});
  Tensor out = ops->alloc(DType::f32, {2, 2});
  ops->silu_mul(gate, up, out);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out.ptr<float>()[i], silu(gate.ptr<float>()[i]) * up.ptr<float>()[i], 1e-6);
  ops->silu_mul(gate, up, up);  // out aliases up
  EXPECT_EQ(values(up), values(out));

  Tensor x = f32_tensor({2, 2}, {1, 2, 3, 4});
  ops->sigmoid_mul(x, f32_tensor({2, 2}, {0, 0, 100, -100}));
  EXPECT_EQ(values(x), (std::vector<float>{0.5f, 1.0f, 3.0f, 0.0f}));
  Tensor rows = f32_tensor({2, 3}, {1, 2, 3, 4, 5, 6});
  ops->sigmoid_mul(rows, f32_tensor({2, 1}, {0, 100}));  // one gate per row
  EXPECT_EQ(values(rows), (std::vector<float>{0.5f, 1.0f, 1.5f, 4, 5, 6}));

  Tensor a = f32_tensor({3}, {1, 2, 3});
  ops->add(a, f32_tensor({3}, {10, 20, 30}));
  EXPECT_EQ(values(a), (std::vector<float>{11, 22, 33}));

  EXPECT_THROW(ops->silu_mul(gate, ops->alloc(DType::f32, {4}), out), Error);
  EXPECT_THROW(ops->sigmoid_mul(x, ops->alloc(DType::f32, {2, 3})), Error);
  EXPECT_THROW(ops->sigmoid_mul(x, ops->alloc(DType::f32, {1, 1})), Error);
  EXPECT_THROW(ops->add(a, ops->alloc(DType::f32, {3, 1})), Error);
}

// A paged attention batch: per sequence, `cached` earlier tokens and `fresh` new ones.
struct PagedCase {
  int64_t heads = 4, kv_heads = 2, head_dim = 8, block_size = 4, num_blocks = 24, max_blocks = 6;
  std::vector<int32_t> cached, fresh;
  std::vector<int32_t> block_table;
  AttentionLayout layout(const std::vector<int32_t>& cached_now, const std::vector<int32_t>& lengths) const {
    AttentionLayout l;
    l.seqs.cu_seqlens = {0};
    for (int32_t n : lengths) l.seqs.cu_seqlens.push_back(l.seqs.cu_seqlens.back() + n);
    l.cached = cached_now;
    l.block_table = block_table;
    l.max_blocks = static_cast<int32_t>(max_blocks);
    l.block_size = static_cast<int32_t>(block_size);
    return l;
  }
};

TEST_F(RefOps, PagedAttentionMatchesDenseMaskedSoftmax) {
  PagedCase c;
  c.cached = {0, 5, 17};
  c.fresh = {4, 1, 6};
  c.block_table.resize(3 * c.max_blocks);
  std::iota(c.block_table.begin(), c.block_table.end(), 0);
  std::shuffle(c.block_table.begin(), c.block_table.end(), rng);  // physical order unrelated to logical
  const int64_t S = 3, row = c.kv_heads * c.head_dim;
  KvPool pool{ops->alloc(DType::f32, {c.num_blocks, c.block_size, c.kv_heads, c.head_dim}),
              ops->alloc(DType::f32, {c.num_blocks, c.block_size, c.kv_heads, c.head_dim})};

  // Earlier tokens first (one kv_store, as a prefill would), then the batch under test.
  const int64_t T0 = std::accumulate(c.cached.begin(), c.cached.end(), 0);
  Tensor k0 = random_f32({T0, c.kv_heads, c.head_dim}, rng), v0 = random_f32({T0, c.kv_heads, c.head_dim}, rng);
  ops->kv_store(k0, v0, c.layout({0, 0, 0}, c.cached), pool);
  const AttentionLayout layout = c.layout(c.cached, c.fresh);
  const int64_t T = layout.seqs.num_tokens();
  Tensor k = random_f32({T, c.kv_heads, c.head_dim}, rng), v = random_f32({T, c.kv_heads, c.head_dim}, rng);
  Tensor q = random_f32({T, c.heads, c.head_dim}, rng);
  ops->kv_store(k, v, layout, pool);
  Tensor out = ops->alloc(DType::f32, {T, c.heads, c.head_dim});
  const float scale = 1.0f / std::sqrt(float(c.head_dim));
  ops->attention(q, pool, layout, scale, out);

  // Dense: per sequence and head, P = softmax(Q Kᵀ·scale + causal mask), O = P V, K/V from the inputs.
  std::vector<double> want(T * c.heads * c.head_dim);
  int64_t prev = 0;
  for (int64_t s = 0; s < S; ++s) {
    const int64_t n = c.cached[s] + c.fresh[s], first = layout.seqs.cu_seqlens[s];
    auto key = [&](const Tensor& early, const Tensor& late, int64_t p) {
      return p < c.cached[s] ? early.ptr<float>() + (prev + p) * row
                             : late.ptr<float>() + (first + p - c.cached[s]) * row;
    };
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t kvh = h / (c.heads / c.kv_heads);
      for (int64_t i = 0; i < c.fresh[s]; ++i) {
        std::vector<double> logits(n, -INFINITY);
        for (int64_t p = 0; p <= c.cached[s] + i; ++p) {
          double dot = 0;
          for (int64_t e = 0; e < c.head_dim; ++e)
            dot += double(q.ptr<float>()[((first + i) * c.heads + h) * c.head_dim + e]) *
                   key(k0, k, p)[kvh * c.head_dim + e];
          logits[p] = dot * scale;
        }
        const double m = *std::max_element(logits.begin(), logits.end());
        double z = 0;
        for (double& l : logits) z += l = std::exp(l - m);
        for (int64_t p = 0; p < n; ++p)
          for (int64_t e = 0; e < c.head_dim; ++e)
            want[((first + i) * c.heads + h) * c.head_dim + e] += logits[p] / z * key(v0, v, p)[kvh * c.head_dim + e];
      }
    }
    prev += c.cached[s];
  }
  EXPECT_LT(rel_rms(values(out), want), 1e-6);
}

TEST_F(RefOps, PagedAttentionRejectsBadLayouts) {
  PagedCase c;
  c.block_table = {3, 1};
  c.max_blocks = 2;
  c.num_blocks = 4;
  KvPool pool{ops->alloc(DType::f32, {c.num_blocks, c.block_size, c.kv_heads, c.head_dim}),
              ops->alloc(DType::f32, {c.num_blocks, c.block_size, c.kv_heads, c.head_dim})};
  Tensor k = ops->alloc(DType::f32, {2, c.kv_heads, c.head_dim});
  Tensor q = ops->alloc(DType::f32, {2, c.heads, c.head_dim});
  Tensor out = ops->alloc(DType::f32, {2, c.heads, c.head_dim});
  EXPECT_NO_THROW(ops->kv_store(k, k, c.layout({6}, {2}), pool));         // positions 6, 7: block 1
  EXPECT_THROW(ops->kv_store(k, k, c.layout({7}, {2}), pool), Error);     // position 8 needs a third block
  EXPECT_THROW(ops->kv_store(k, k, c.layout({0}, {3}), pool), Error);     // cu_seqlens ≠ batch
  EXPECT_THROW(ops->kv_store(k, k, c.layout({0, 0}, {2}), pool), Error);  // cached per sequence
  c.block_table = {3, 4};
  EXPECT_THROW(ops->kv_store(k, k, c.layout({6}, {2}), pool), Error);  // physical block 4 of 4
  c.block_table = {3, 1};
  EXPECT_NO_THROW(ops->attention(q, pool, c.layout({6}, {2}), 1.0f, out));
  Tensor q3 = ops->alloc(DType::f32, {2, 3, c.head_dim});
  Tensor out3 = ops->alloc(DType::f32, {2, 3, c.head_dim});
  EXPECT_THROW(ops->attention(q3, pool, c.layout({6}, {2}), 1.0f, out3), Error);  // 3 heads over 2 kv heads
  EXPECT_THROW(ops->attention(q, pool, c.layout({6}, {2}), 1.0f, q), Error);      // out aliases q
}

TEST_F(RefOps, MoeRouteHandComputedWithTies) {
  Tensor logits = f32_tensor({2, 4}, {1, 3, 2, 3, 0, 0, 0, 0});
  Tensor ids = ops->alloc(DType::i32, {2, 2});
  Tensor weights = ops->alloc(DType::f32, {2, 2});
  ops->moe_route(logits, false, ids, weights);
  const double z = std::exp(1) + 2 * std::exp(3) + std::exp(2);
  EXPECT_EQ(std::vector<int32_t>(ids.ptr<int32_t>(), ids.ptr<int32_t>() + 4), (std::vector<int32_t>{1, 3, 0, 1}));
  EXPECT_NEAR(weights.ptr<float>()[0], std::exp(3) / z, 1e-7);
  EXPECT_NEAR(weights.ptr<float>()[1], std::exp(3) / z, 1e-7);
  EXPECT_NEAR(weights.ptr<float>()[2], 0.25, 1e-7);
  ops->moe_route(logits, true, ids, weights);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(weights.ptr<float>()[i], 0.5, 1e-7);
  Tensor w3 = ops->alloc(DType::f32, {2, 3});
  EXPECT_THROW(ops->moe_route(logits, true, ids, w3), Error);
  // Many equal probabilities (more than a small-range sort keeps stable by accident).
  Tensor flat = ops->alloc(DType::f32, {1, 40});
  flat.ptr<float>()[37] = 1.0f;
  Tensor ids4 = ops->alloc(DType::i32, {1, 4}), w4 = ops->alloc(DType::f32, {1, 4});
  ops->moe_route(flat, false, ids4, w4);
  EXPECT_EQ(std::vector<int32_t>(ids4.ptr<int32_t>(), ids4.ptr<int32_t>() + 4), (std::vector<int32_t>{37, 0, 1, 2}));
  Tensor too_many = ops->alloc(DType::i32, {2, 5});
  Tensor w5 = ops->alloc(DType::f32, {2, 5});
  EXPECT_THROW(ops->moe_route(logits, true, too_many, w5), Error);
}

TEST_F(RefOps, MoeRouteRandomMatchesSortedSoftmax) {
  const int T = 6, E = 9, K = 3;
  Tensor logits = random_f32({T, E}, rng, 2.0f);
  Tensor ids = ops->alloc(DType::i32, {T, K});
  Tensor weights = ops->alloc(DType::f32, {T, K});
  ops->moe_route(logits, true, ids, weights);
  for (int t = 0; t < T; ++t) {
    std::vector<std::pair<double, int>> p;
    for (int e = 0; e < E; ++e) p.emplace_back(std::exp(double(logits.ptr<float>()[t * E + e])), e);
    std::sort(p.begin(), p.end(), [](auto a, auto b) { return a.first > b.first; });
    const double top = p[0].first + p[1].first + p[2].first;
    for (int j = 0; j < K; ++j) {
      EXPECT_EQ(ids.ptr<int32_t>()[t * K + j], p[j].second);
      EXPECT_NEAR(weights.ptr<float>()[t * K + j], p[j].first / top, 1e-6);
    }
  }
}

// Expert e's [rows, cols] matrix inside a stacked [E, rows, cols] weight (a view).
Tensor expert_view(const Tensor& w, int64_t e) {
  Tensor v = w;
  v.shape = {w.dim(1), w.dim(2)};
  v.data = static_cast<char*>(w.data) + storage_bytes(w.dtype, e * w.dim(1) * w.dim(2));
  v.owner.reset();
  return v;
}

TEST_F(RefOps, MoeExpertsMatchComposedLinearAndSiluPerExpert) {
  const int64_t T = 5, H = 12, I = 7, E = 4, K = 2;
  for (DType dtype : kWeightDtypes) {
    std::vector<float> unused;
    Tensor gate = random_weight(dtype, {E, I, H}, rng, unused), up = random_weight(dtype, {E, I, H}, rng, unused),
           down = random_weight(dtype, {E, H, I}, rng, unused);
    Tensor x = random_f32({T, H}, rng);
    Tensor ids = i32_tensor({T, K}, {0, 3, 3, 1, 2, 0, 1, 2, 3, 0});
    Tensor weights = f32_tensor({T, K}, {0.7f, 0.3f, 0.5f, 0.5f, 0.9f, 0.1f, 0.2f, 0.8f, 1.0f, 0.25f});
    Tensor out = ops->alloc(DType::f32, {T, H});
    ops->moe_experts(x, ids, weights, gate, up, down, out);

    std::vector<double> want(T * H);
    for (int64_t e = 0; e < E; ++e) {
      Tensor g = ops->alloc(DType::f32, {T, I}), u = ops->alloc(DType::f32, {T, I}), y = ops->alloc(DType::f32, {T, H});
      ops->linear(x, expert_view(gate, e), g);
      ops->linear(x, expert_view(up, e), u);
      ops->silu_mul(g, u, g);
      ops->linear(g, expert_view(down, e), y);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t j = 0; j < K; ++j)
          if (ids.ptr<int32_t>()[t * K + j] == e)
            for (int64_t o = 0; o < H; ++o)
              want[t * H + o] += weights.ptr<float>()[t * K + j] * y.ptr<float>()[t * H + o];
    }
    EXPECT_LT(rel_rms(values(out), want), 1e-6) << name(dtype);
  }
  Tensor x = ops->alloc(DType::f32, {1, H}), out = ops->alloc(DType::f32, {1, H});
  Tensor gate = ops->alloc(DType::f32, {E, I, H}), down = ops->alloc(DType::f32, {E, H, I});
  Tensor w = f32_tensor({1, 1}, {1});
  EXPECT_THROW(ops->moe_experts(x, i32_tensor({1, 1}, {4}), w, gate, gate, down, out), Error);
  EXPECT_THROW(ops->moe_experts(x, i32_tensor({1, 1}, {0}), w, gate, gate, gate, out), Error);  // down shape
}

TEST_F(RefOps, GdnGatesHandComputedWithSoftplusThreshold) {
  const float A_log1 = std::log(2.0f);
  Tensor a = f32_tensor({2, 2}, {0, 19, 100, -1});
  Tensor b = f32_tensor({2, 2}, {0, 2, -3, 50});
  Tensor A_log = f32_tensor({2}, {0, A_log1});
  Tensor dt_bias = f32_tensor({2}, {0, 1});
  Tensor g = ops->alloc(DType::f32, {2, 2}), beta = ops->alloc(DType::f32, {2, 2});
  ops->gdn_gates(a, b, A_log, dt_bias, g, beta);
  EXPECT_NEAR(g.ptr<float>()[0], -std::log(2.0), 1e-6);
  EXPECT_NEAR(g.ptr<float>()[1], -2 * std::log1p(std::exp(20.0)), 1e-4);
  EXPECT_EQ(g.ptr<float>()[2], -100.0f);  // above the threshold softplus(x) = x (exp would overflow)
  EXPECT_NEAR(g.ptr<float>()[3], -2 * std::log(2.0), 1e-6);
  EXPECT_NEAR(beta.ptr<float>()[0], 0.5, 1e-7);
  EXPECT_NEAR(beta.ptr<float>()[1], 1 / (1 + std::exp(-2.0)), 1e-7);
  EXPECT_NEAR(beta.ptr<float>()[2], 1 / (1 + std::exp(3.0)), 1e-7);
  EXPECT_EQ(beta.ptr<float>()[3], 1.0f);
  EXPECT_THROW(ops->gdn_gates(a, b, f32_tensor({1}, {0}), dt_bias, g, beta), Error);
}

TEST_F(RefOps, SampleUsesTheSharedSamplingRules) {
  Tensor logits = f32_tensor({2, 3}, {0, 2, 1, 5, 5, 1});
  std::vector<int32_t> out;
  ops->sample(logits, {SamplingParams{}, SamplingParams{}}, {{}, {}}, {0, 0}, out);
  EXPECT_EQ(out, (std::vector<int32_t>{1, 0}));  // greedy, lowest id on ties
  EXPECT_THROW(ops->sample(logits, {SamplingParams{}}, {{}}, {0}, out), Error);
}

}  // namespace
}  // namespace qinfer

namespace qinfer {
namespace {

std::string layout_error(const SeqLayout& layout, int64_t tokens, int64_t slots) {
  try {
    check_seq_layout("test op", layout, tokens, slots);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A sequence may write its state to another slot than it reads (leaving a checkpoint behind), but no
// slot is read or written by two sequences of one batch, and every target is a slot of the state.
TEST(SeqLayout, TargetSlotsAreCheckedLikeTheSlotsRead) {
  SeqLayout layout{.cu_seqlens = {0, 2, 3}, .state_slot = {0, 1}, .state_to = {}};
  EXPECT_EQ(layout_error(layout, 3, 4), "");
  EXPECT_EQ(layout.target_slot(1), 1) << "no targets: in place";
  layout.state_to = {2, 1};
  EXPECT_EQ(layout_error(layout, 3, 4), "");
  EXPECT_EQ(layout.target_slot(0), 2);
  layout.state_to = {1, 3};
  EXPECT_NE(layout_error(layout, 3, 4).find("test op: state slot 1 is used by two sequences"), std::string::npos);
  layout.state_to = {3, 3};
  EXPECT_NE(layout_error(layout, 3, 4).find("state slot 3 is used by two sequences"), std::string::npos);
  layout.state_to = {4, 1};
  EXPECT_NE(layout_error(layout, 3, 4).find("state slot 4 is outside the 4 slots"), std::string::npos);
  layout.state_to = {2};
  EXPECT_NE(layout_error(layout, 3, 4).find("layout.state_to has 1 entries for 2 sequences"), std::string::npos);
  EXPECT_EQ(layout_error(layout, 3, -1), "") << "an op without state checks no slots";
}

}  // namespace
}  // namespace qinfer
