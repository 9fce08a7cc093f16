// The ref conv1d and gated delta rule: hand-computed steps, varlen batches with state carried across
// calls, and the chunked (WY) form against the recurrent one.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>

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

Tensor random_f32(std::vector<int64_t> shape, std::mt19937& rng, float scale = 1.0f) {
  Tensor t = host_tensor(DType::f32, std::move(shape));
  std::normal_distribution<float> normal(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = normal(rng);
  return t;
}

Tensor copy_of(const Tensor& t) {
  Tensor c = host_tensor(t.dtype, t.shape);
  std::copy_n(static_cast<const char*>(t.data), t.nbytes(), static_cast<char*>(c.data));
  return c;
}

std::vector<float> values(const Tensor& t) { return {t.ptr<float>(), t.ptr<float>() + t.numel()}; }

double rel_rms(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double err = 0.0, ref = 0.0;
  for (size_t i = 0; i < got.size(); ++i)
    err += double(got[i] - want[i]) * (got[i] - want[i]), ref += double(want[i]) * want[i];
  return std::sqrt(err / std::max(ref, 1e-300));
}

SeqLayout seq_layout(const std::vector<int32_t>& lengths, const std::vector<int32_t>& slots) {
  SeqLayout l{.cu_seqlens = {0}, .state_slot = slots};
  for (int32_t n : lengths) l.cu_seqlens.push_back(l.cu_seqlens.back() + n);
  return l;
}

// Rows of a [T, ...] tensor gathered by sequence: `first[s]` tokens of sequence s if `head`, else the rest.
Tensor split_rows(const Tensor& t, const SeqLayout& whole, const std::vector<int32_t>& first, bool head) {
  std::vector<float> out;
  const int64_t row = t.numel() / std::max<int64_t>(t.dim(0), 1);
  for (int64_t s = 0; s < whole.num_seqs(); ++s) {
    const int64_t begin = whole.cu_seqlens[s] + (head ? 0 : first[s]);
    const int64_t end = head ? whole.cu_seqlens[s] + first[s] : whole.cu_seqlens[s + 1];
    out.insert(out.end(), t.ptr<float>() + begin * row, t.ptr<float>() + end * row);
  }
  std::vector<int64_t> shape = t.shape;
  shape[0] = static_cast<int64_t>(out.size()) / row;
  return f32_tensor(shape, out);
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

class RefGdn : public ::testing::Test {
 protected:
  std::unique_ptr<Ops> ops = make_ref_ops();
  std::mt19937 rng{777};
};

// ---- conv1d ------------------------------------------------------------------------------------

TEST_F(RefGdn, ConvHandComputedFromSlotState) {
  // C = 2, K = 3; slot 1 holds frames (1, 10), (2, 20); the sequence brings (3, 30), (4, 40).
  Tensor x = f32_tensor({2, 2}, {3, 30, 4, 40});
  Tensor w = f32_tensor({2, 3}, {1, 2, 3, 0, 0, 1});
  Tensor state = host_tensor(DType::f32, {2, 2, 2});
  std::copy_n(std::vector<float>{1, 10, 2, 20}.data(), 4, state.ptr<float>() + 4);
  Tensor out = ops->alloc(DType::f32, {2, 2});
  ops->conv1d_causal(x, w, seq_layout({2}, {1}), state, out);
  EXPECT_NEAR(out.ptr<float>()[0], silu(1 * 1 + 2 * 2 + 3 * 3), 1e-5);
  EXPECT_NEAR(out.ptr<float>()[1], silu(30), 1e-5);
  EXPECT_NEAR(out.ptr<float>()[2], silu(1 * 2 + 2 * 3 + 3 * 4), 1e-5);
  EXPECT_NEAR(out.ptr<float>()[3], silu(40), 1e-5);
  EXPECT_EQ(values(state), (std::vector<float>{0, 0, 0, 0, 3, 30, 4, 40}));  // slot 0 untouched

  // One token shifts the window by one frame: (2,20), (3,30) | (4,40) -> (3,30), (4,40).
  Tensor one = f32_tensor({1, 2}, {5, 50});
  Tensor out1 = ops->alloc(DType::f32, {1, 2});
  ops->conv1d_causal(one, w, seq_layout({1}, {1}), state, out1);
  EXPECT_NEAR(out1.ptr<float>()[0], silu(1 * 3 + 2 * 4 + 3 * 5), 1e-5);
  EXPECT_EQ(values(state), (std::vector<float>{0, 0, 0, 0, 4, 40, 5, 50}));
}

TEST_F(RefGdn, ConvVarlenStateCarriedAcrossCallsEqualsOneCall) {
  const int64_t C = 6, K = 4, slots = 4;
  const std::vector<int32_t> lengths = {9, 1, 5, 2}, first = {4, 0, 2, 1}, slot = {2, 0, 3, 1};
  const SeqLayout whole = seq_layout(lengths, slot);
  Tensor x = random_f32({whole.num_tokens(), C}, rng), w = random_f32({C, K}, rng);
  Tensor initial = random_f32({slots, K - 1, C}, rng);

  Tensor state_one = copy_of(initial), out_one = ops->alloc(DType::f32, {whole.num_tokens(), C});
  ops->conv1d_causal(x, w, whole, state_one, out_one);

  std::vector<int32_t> rest(lengths.size());
  for (size_t s = 0; s < lengths.size(); ++s) rest[s] = lengths[s] - first[s];
  Tensor x1 = split_rows(x, whole, first, true), x2 = split_rows(x, whole, first, false);
  Tensor state_two = copy_of(initial);
  Tensor out1 = ops->alloc(DType::f32, {x1.dim(0), C}), out2 = ops->alloc(DType::f32, {x2.dim(0), C});
  ops->conv1d_causal(x1, w, seq_layout(first, slot), state_two, out1);
  ops->conv1d_causal(x2, w, seq_layout(rest, slot), state_two, out2);

  EXPECT_EQ(values(state_two), values(state_one));
  EXPECT_EQ(values(split_rows(out_one, whole, first, true)), values(out1));
  EXPECT_EQ(values(split_rows(out_one, whole, first, false)), values(out2));
  EXPECT_NE(values(state_one), values(initial));
}

TEST_F(RefGdn, ConvRejectsBadLayouts) {
  Tensor x = ops->alloc(DType::f32, {3, 2}), out = ops->alloc(DType::f32, {3, 2});
  Tensor w = ops->alloc(DType::f32, {2, 4}), state = ops->alloc(DType::f32, {2, 3, 2});
  EXPECT_NO_THROW(ops->conv1d_causal(x, w, seq_layout({1, 2}, {1, 0}), state, out));
  EXPECT_THROW(ops->conv1d_causal(x, w, seq_layout({1, 2}, {1, 1}), state, out), Error);  // shared slot
  EXPECT_THROW(ops->conv1d_causal(x, w, seq_layout({1, 2}, {1, 2}), state, out), Error);  // slot out of range
  EXPECT_THROW(ops->conv1d_causal(x, w, seq_layout({1, 2}, {1}), state, out), Error);     // slots per sequence
  EXPECT_THROW(ops->conv1d_causal(x, w, seq_layout({1, 1}, {1, 0}), state, out), Error);  // tokens
  Tensor state_k3 = ops->alloc(DType::f32, {2, 2, 2});
  EXPECT_THROW(ops->conv1d_causal(x, w, seq_layout({3}, {0}), state_k3, out), Error);
  EXPECT_THROW(ops->conv1d_causal(x, w, seq_layout({3}, {0}), state, x), Error);  // out aliases x
}

// ---- gated delta rule --------------------------------------------------------------------------

struct GdnCase {
  SeqLayout layout;
  Tensor q, k, v, g, beta, state;
};

// Random inputs shaped like the model's: q, k l2-normed per head (q also scaled by Dk^-1/2), decays
// from mild to strong, beta in (0, 1), non-zero initial states in every slot.
GdnCase random_gdn(std::mt19937& rng, const std::vector<int32_t>& lengths, std::vector<int32_t> slots, int64_t Hk,
                   int64_t Hv, int64_t Dk, int64_t Dv) {
  GdnCase c;
  c.layout = seq_layout(lengths, slots);
  const int64_t T = c.layout.num_tokens(), num_slots = *std::max_element(slots.begin(), slots.end()) + 1;
  c.q = random_f32({T, Hk, Dk}, rng), c.k = random_f32({T, Hk, Dk}, rng), c.v = random_f32({T, Hv, Dv}, rng);
  for (Tensor* x : {&c.q, &c.k})
    for (int64_t r = 0; r < T * Hk; ++r) {
      float* head = x->ptr<float>() + r * Dk;
      const double norm = std::sqrt(std::inner_product(head, head + Dk, head, 0.0));
      const double scale = (x == &c.q ? 1.0 / std::sqrt(double(Dk)) : 1.0) / norm;
      for (int64_t j = 0; j < Dk; ++j) head[j] = static_cast<float>(head[j] * scale);
    }
  c.g = host_tensor(DType::f32, {T, Hv}), c.beta = host_tensor(DType::f32, {T, Hv});
  std::normal_distribution<float> normal(0.0f, 2.0f);
  for (int64_t i = 0; i < T * Hv; ++i) {
    const float rate = (i % Hv) % 2 ? 1.0f : 0.05f;  // alternate heads: strong and mild decay
    c.g.ptr<float>()[i] = -rate * std::log1p(std::exp(normal(rng)));
    c.beta.ptr<float>()[i] = 1.0f / (1.0f + std::exp(-normal(rng)));
  }
  c.state = random_f32({num_slots, Hv, Dv, Dk}, rng, 0.5f);
  return c;
}

struct GdnResult {
  Tensor out, state;
};

GdnResult run_gdn(Ops& ops, const GdnCase& c, GdnAlgorithm algorithm) {
  GdnResult r{ops.alloc(DType::f32, {c.q.dim(0), c.v.dim(1), c.v.dim(2)}), copy_of(c.state)};
  ops.gated_delta_rule(c.q, c.k, c.v, c.g, c.beta, c.layout, r.state, r.out, algorithm);
  return r;
}

TEST_F(RefGdn, RecurrentHandComputedScalarSteps) {
  // Dk = Dv = 1, S0 = 0.5. Step 1: g = ln 0.5, β = 0.5, k = 1, v = 2, q = 3: S = 0.25, δ = 0.875,
  // S = 1.125, o = 3.375. Step 2: g = 0, β = 1, k = 1, v = -1, q = 1: δ = -2.125, S = -1, o = -1.
  GdnCase c;
  c.layout = seq_layout({2}, {0});
  c.q = f32_tensor({2, 1, 1}, {3, 1}), c.k = f32_tensor({2, 1, 1}, {1, 1}), c.v = f32_tensor({2, 1, 1}, {2, -1});
  c.g = f32_tensor({2, 1}, {std::log(0.5f), 0}), c.beta = f32_tensor({2, 1}, {0.5f, 1});
  c.state = f32_tensor({1, 1, 1, 1}, {0.5f});
  for (GdnAlgorithm algorithm : {GdnAlgorithm::recurrent, GdnAlgorithm::chunked, GdnAlgorithm::automatic}) {
    GdnResult r = run_gdn(*ops, c, algorithm);
    EXPECT_NEAR(r.out.ptr<float>()[0], 3.375, 1e-6);
    EXPECT_NEAR(r.out.ptr<float>()[1], -1.0, 1e-6);
    EXPECT_NEAR(r.state.ptr<float>()[0], -1.0, 1e-6);
  }
}

TEST_F(RefGdn, ValueHeadReadsKeyHeadOfItsGroup) {
  // Hv/Hk = 2: value heads 0, 1 read key head 0 and 2, 3 read key head 1. Each value head must equal
  // a one-head run over its key head with its own inputs.
  const int64_t Hk = 2, Hv = 4, Dk = 8, Dv = 5, T = 9;
  const int64_t key_head_of[Hv] = {0, 0, 1, 1};
  GdnCase c = random_gdn(rng, {static_cast<int32_t>(T)}, {0}, Hk, Hv, Dk, Dv);
  GdnResult all = run_gdn(*ops, c, GdnAlgorithm::recurrent);
  for (int64_t h = 0; h < Hv; ++h) {
    const int64_t kh = key_head_of[h];
    GdnCase one;
    one.layout = c.layout;
    one.q = host_tensor(DType::f32, {T, 1, Dk}), one.k = host_tensor(DType::f32, {T, 1, Dk});
    one.v = host_tensor(DType::f32, {T, 1, Dv}), one.g = host_tensor(DType::f32, {T, 1});
    one.beta = host_tensor(DType::f32, {T, 1}), one.state = host_tensor(DType::f32, {1, 1, Dv, Dk});
    for (int64_t t = 0; t < T; ++t) {
      std::copy_n(c.q.ptr<float>() + (t * Hk + kh) * Dk, Dk, one.q.ptr<float>() + t * Dk);
      std::copy_n(c.k.ptr<float>() + (t * Hk + kh) * Dk, Dk, one.k.ptr<float>() + t * Dk);
      std::copy_n(c.v.ptr<float>() + (t * Hv + h) * Dv, Dv, one.v.ptr<float>() + t * Dv);
      one.g.ptr<float>()[t] = c.g.ptr<float>()[t * Hv + h];
      one.beta.ptr<float>()[t] = c.beta.ptr<float>()[t * Hv + h];
    }
    std::copy_n(c.state.ptr<float>() + h * Dv * Dk, Dv * Dk, one.state.ptr<float>());
    GdnResult head = run_gdn(*ops, one, GdnAlgorithm::recurrent);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < Dv; ++i)
        EXPECT_EQ(all.out.ptr<float>()[(t * Hv + h) * Dv + i], head.out.ptr<float>()[t * Dv + i]) << "head " << h;
    EXPECT_EQ(std::vector<float>(all.state.ptr<float>() + h * Dv * Dk, all.state.ptr<float>() + (h + 1) * Dv * Dk),
              values(head.state))
        << "head " << h;
  }
}

// Recurrent vs chunked on a varlen batch; returns the worse relative RMS of outputs and final states.
double recurrent_vs_chunked(Ops& ops, const GdnCase& c) {
  GdnResult rec = run_gdn(ops, c, GdnAlgorithm::recurrent), chunk = run_gdn(ops, c, GdnAlgorithm::chunked);
  const double out_err = rel_rms(values(chunk.out), values(rec.out));
  const double state_err = rel_rms(values(chunk.state), values(rec.state));
  std::printf("  recurrent vs chunked, %lld tokens: rel RMS out %.2e, state %.2e\n",
              static_cast<long long>(c.layout.num_tokens()), out_err, state_err);
  EXPECT_NE(values(rec.state), values(c.state));
  return std::max(out_err, state_err);
}

TEST_F(RefGdn, ChunkedAgreesWithRecurrentOnVarlenBatch) {
  // Lengths around the chunk size in one batch, slots in no particular order, Dk ≠ Dv, GQA 2.
  const std::vector<int32_t> lengths = {65, 1, 130, 7, 1000, 64, 63};
  const std::vector<int32_t> slots = {4, 7, 0, 2, 6, 1, 3};
  GdnCase c = random_gdn(rng, lengths, slots, 2, 4, 32, 16);
  EXPECT_LT(recurrent_vs_chunked(*ops, c), 1e-5);
  // Each length on its own too, so that one sequence's error cannot hide in another's magnitude.
  for (int32_t n : lengths) EXPECT_LT(recurrent_vs_chunked(*ops, random_gdn(rng, {n}, {1}, 2, 4, 32, 16)), 1e-5) << n;
}

TEST_F(RefGdn, ChunkedAgreesWithRecurrentOver4096Tokens) {
  GdnCase c = random_gdn(rng, {4096, 3}, {1, 0}, 1, 2, 16, 8);
  EXPECT_LT(recurrent_vs_chunked(*ops, c), 1e-5);
}

TEST_F(RefGdn, AutomaticIsChunkedOnlyForSequencesLongerThan64) {
  const std::vector<int32_t> lengths = {64, 65};
  GdnCase c = random_gdn(rng, lengths, {0, 1}, 1, 2, 8, 8);
  GdnResult rec = run_gdn(*ops, c, GdnAlgorithm::recurrent), chunk = run_gdn(*ops, c, GdnAlgorithm::chunked),
            autom = run_gdn(*ops, c, GdnAlgorithm::automatic);
  const int64_t row = 2 * 8, first = 64 * row, state = 2 * 8 * 8;
  const std::vector<float> a = values(autom.out), r = values(rec.out), k = values(chunk.out);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + first, r.begin()));
  EXPECT_TRUE(std::equal(a.begin() + first, a.end(), k.begin() + first));
  EXPECT_FALSE(std::equal(a.begin() + first, a.end(), r.begin() + first));  // the two forms differ in rounding
  const std::vector<float> as = values(autom.state), rs = values(rec.state), ks = values(chunk.state);
  EXPECT_TRUE(std::equal(as.begin(), as.begin() + state, rs.begin()));
  EXPECT_TRUE(std::equal(as.begin() + state, as.end(), ks.begin() + state));
}

// One call over whole sequences vs two calls with the state carried between them.
void expect_split_equals_whole(Ops& ops, std::mt19937& rng, GdnAlgorithm algorithm, const std::vector<int32_t>& first,
                               double tolerance) {
  const std::vector<int32_t> lengths = {200, 70, 5, 128}, slots = {3, 0, 2, 1};
  GdnCase c = random_gdn(rng, lengths, slots, 2, 4, 16, 12);
  GdnResult whole = run_gdn(ops, c, algorithm);
  std::vector<int32_t> rest(lengths.size());
  for (size_t s = 0; s < lengths.size(); ++s) rest[s] = lengths[s] - first[s];
  GdnCase part = c;
  GdnResult parts[2];
  for (int i = 0; i < 2; ++i) {
    for (auto [x, y] :
         {std::pair{&part.q, &c.q}, {&part.k, &c.k}, {&part.v, &c.v}, {&part.g, &c.g}, {&part.beta, &c.beta}})
      *x = split_rows(*y, c.layout, first, i == 0);
    part.layout = seq_layout(i == 0 ? first : rest, slots);
    parts[i] = run_gdn(ops, part, algorithm);
    part.state = parts[i].state;
  }
  EXPECT_LE(rel_rms(values(parts[1].state), values(whole.state)), tolerance);
  EXPECT_LE(rel_rms(values(parts[0].out), values(split_rows(whole.out, c.layout, first, true))), tolerance);
  EXPECT_LE(rel_rms(values(parts[1].out), values(split_rows(whole.out, c.layout, first, false))), tolerance);
}

TEST_F(RefGdn, SplittingASequenceAcrossCallsEqualsOneCall) {
  // Recurrent: the same arithmetic in the same order, so bit-identical.
  expect_split_equals_whole(*ops, rng, GdnAlgorithm::recurrent, {130, 1, 0, 64}, 0.0);
  // Chunked: splits off chunk boundaries regroup the sums (tolerance); the 64 | 64 split keeps them.
  expect_split_equals_whole(*ops, rng, GdnAlgorithm::chunked, {130, 1, 0, 64}, 1e-5);
  expect_split_equals_whole(*ops, rng, GdnAlgorithm::chunked, {64, 64, 5, 64}, 0.0);
}

TEST_F(RefGdn, RejectsBadArguments) {
  GdnCase c = random_gdn(rng, {3, 2}, {0, 1}, 2, 4, 4, 3);
  Tensor out = ops->alloc(DType::f32, {5, 4, 3});
  EXPECT_NO_THROW(ops->gated_delta_rule(c.q, c.k, c.v, c.g, c.beta, c.layout, c.state, out, GdnAlgorithm::automatic));
  Tensor v3 = ops->alloc(DType::f32, {5, 3, 3}), g3 = ops->alloc(DType::f32, {5, 3}),
         s3 = ops->alloc(DType::f32, {2, 3, 3, 4});
  Tensor out3 = ops->alloc(DType::f32, {5, 3, 3});
  EXPECT_THROW(ops->gated_delta_rule(c.q, c.k, v3, g3, g3, c.layout, s3, out3, GdnAlgorithm::recurrent), Error);
  Tensor wrong_state = ops->alloc(DType::f32, {2, 4, 4, 3});  // [Dk, Dv] instead of [Dv, Dk]
  EXPECT_THROW(ops->gated_delta_rule(c.q, c.k, c.v, c.g, c.beta, c.layout, wrong_state, out, GdnAlgorithm::recurrent),
               Error);
  EXPECT_THROW(ops->gated_delta_rule(c.q, c.k, c.v, c.g, c.beta, seq_layout({3, 2}, {1, 1}), c.state, out,
                                     GdnAlgorithm::chunked),
               Error);
  EXPECT_THROW(ops->gated_delta_rule(c.q, c.k, c.v, c.g, c.beta, seq_layout({3, 3}, {0, 1}), c.state, out,
                                     GdnAlgorithm::chunked),
               Error);
  Tensor k_short = ops->alloc(DType::f32, {4, 2, 4});
  EXPECT_THROW(ops->gated_delta_rule(c.q, k_short, c.v, c.g, c.beta, c.layout, c.state, out, GdnAlgorithm::recurrent),
               Error);
  Tensor v_alias = copy_of(c.v);
  EXPECT_THROW(
      ops->gated_delta_rule(c.q, c.k, v_alias, c.g, c.beta, c.layout, c.state, v_alias, GdnAlgorithm::recurrent),
      Error);
}

}  // namespace
}  // namespace qinfer
