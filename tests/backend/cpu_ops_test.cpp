// The cpu backend's own promises beyond matching ref (the op harness covers that): results that do
// not depend on the thread count, GDN algorithm choice, paging independence, and argument errors
// that name the op and tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "backend/cpu/cpu_ops.h"
#include "core/error.h"

namespace qinfer {
namespace {

Tensor random_tensor(std::vector<int64_t> shape, std::mt19937& rng, float stddev = 1.0f, DType dtype = DType::f32) {
  Tensor t = host_tensor(dtype, std::move(shape));
  std::normal_distribution<float> normal(0.0f, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float x = normal(rng);
    if (dtype == DType::f32) t.ptr<float>()[i] = x;
    if (dtype == DType::bf16) t.ptr<uint16_t>()[i] = f32_to_bf16(x);
  }
  return t;
}

Tensor copy(const Tensor& t) {
  Tensor c = host_tensor(t.dtype, t.shape);
  std::memcpy(c.data, t.data, t.nbytes());
  return c;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape == b.shape && std::memcmp(a.data, b.data, a.nbytes()) == 0;
}

double rel_rms(const Tensor& a, const Tensor& b) {
  double d = 0, n = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.ptr<float>()[i], y = b.ptr<float>()[i];
    d += (x - y) * (x - y), n += y * y;
  }
  return std::sqrt(d / n);
}

// Expects `fn` to throw qinfer::Error whose message contains every one of `parts`.
template <typename Fn>
void expect_error(Fn fn, std::initializer_list<const char*> parts) {
  try {
    fn();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    for (const char* part : parts) EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(CpuOps, UsesTheRuntimeSelectedKernels) {
  ThreadPool pool(1);
  auto ops = make_cpu_ops(pool);
  EXPECT_EQ(ops->name(), "cpu");
  EXPECT_EQ(ops->device(), Device::cpu);
}

TEST(CpuOps, LinearAndExpertsAreBitwiseIndependentOfThreads) {
  std::mt19937 rng(1);
  ThreadPool one(1), four(4);
  auto serial = make_cpu_ops(one), parallel = make_cpu_ops(four);
  for (int64_t T : {1, 5, 40}) {
    Tensor x = random_tensor({T, 300}, rng), w = random_tensor({517, 300}, rng, 0.1f, DType::bf16);
    Tensor y1 = host_tensor(DType::f32, {T, 517}), y4 = host_tensor(DType::f32, {T, 517});
    serial->linear(x, w, y1);
    parallel->linear(x, w, y4);
    EXPECT_TRUE(same_bits(y1, y4)) << "T=" << T;
  }
  const int64_t T = 9, H = 64, I = 40, E = 6, k = 2;
  Tensor x = random_tensor({T, H}, rng), gate = random_tensor({E, I, H}, rng, 0.2f),
         up = random_tensor({E, I, H}, rng, 0.2f), down = random_tensor({E, H, I}, rng, 0.2f);
  Tensor ids = host_tensor(DType::i32, {T, k}), weights = random_tensor({T, k}, rng);
  for (int64_t i = 0; i < T * k; ++i) ids.ptr<int32_t>()[i] = static_cast<int32_t>((i * 7 + i / k) % E);
  Tensor o1 = host_tensor(DType::f32, {T, H}), o4 = host_tensor(DType::f32, {T, H});
  serial->moe_experts(x, ids, weights, gate, up, down, o1);
  parallel->moe_experts(x, ids, weights, gate, up, down, o4);
  EXPECT_TRUE(same_bits(o1, o4));
}

// automatic is exactly recurrent up to 64 tokens and exactly chunked past it; both agree closely.
TEST(CpuOps, GatedDeltaRuleAlgorithmsAgreeAndAutomaticPicksByLength) {
  std::mt19937 rng(2);
  ThreadPool pool(2);
  auto ops = make_cpu_ops(pool);
  for (int32_t len : {64, 65, 300}) {
    const int64_t Hk = 2, Hv = 4, Dk = 32, Dv = 16;
    Tensor q = random_tensor({len, Hk, Dk}, rng, 0.1f), k = random_tensor({len, Hk, Dk}, rng, 0.15f);
    Tensor v = random_tensor({len, Hv, Dv}, rng), g = random_tensor({len, Hv}, rng, 0.3f);
    Tensor beta = random_tensor({len, Hv}, rng);
    for (int64_t i = 0; i < len * Hv; ++i) {
      g.ptr<float>()[i] = -std::abs(g.ptr<float>()[i]);
      beta.ptr<float>()[i] = 1.0f / (1.0f + std::exp(-beta.ptr<float>()[i]));
    }
    const SeqLayout layout{{0, len}, {1}};
    Tensor state0 = random_tensor({2, Hv, Dv, Dk}, rng, 0.1f);
    Tensor outs[3], states[3];
    const GdnAlgorithm algorithms[3] = {GdnAlgorithm::recurrent, GdnAlgorithm::chunked, GdnAlgorithm::automatic};
    for (int a = 0; a < 3; ++a) {
      states[a] = copy(state0), outs[a] = host_tensor(DType::f32, {len, Hv, Dv});
      ops->gated_delta_rule(q, k, v, g, beta, layout, states[a], outs[a], algorithms[a]);
    }
    EXPECT_LT(rel_rms(outs[1], outs[0]), 1e-5) << len;
    EXPECT_LT(rel_rms(states[1], states[0]), 1e-5) << len;
    const int expected = len > 64 ? 1 : 0;
    EXPECT_TRUE(same_bits(outs[2], outs[expected]) && same_bits(states[2], states[expected])) << len;
    // Slot 0 is not in the layout and stays as it was.
    EXPECT_EQ(std::memcmp(states[0].data, state0.data, state0.nbytes() / 2), 0);
  }
}

// The same logical cache laid out in pages of 5 or of 64 tokens gives the same attention.
TEST(CpuOps, AttentionDoesNotDependOnPaging) {
  std::mt19937 rng(3);
  ThreadPool pool(2);
  auto ops = make_cpu_ops(pool);
  const int64_t heads = 4, kv = 2, hd = 32, cached = 1500, T = 3;
  Tensor keys = random_tensor({cached + T, kv, hd}, rng), values = random_tensor({cached + T, kv, hd}, rng);
  Tensor q = random_tensor({T, heads, hd}, rng);
  Tensor outs[2];
  for (int p = 0; p < 2; ++p) {
    const int32_t bs = p == 0 ? 5 : 64;
    const int32_t blocks = static_cast<int32_t>((cached + T + bs - 1) / bs);
    AttentionLayout layout;
    layout.seqs = {{0, static_cast<int32_t>(T)}, {0}};
    layout.cached = {static_cast<int32_t>(cached)};
    layout.block_size = bs, layout.max_blocks = blocks;
    layout.block_table.resize(blocks);
    std::iota(layout.block_table.rbegin(), layout.block_table.rend(), 0);  // pages in reverse order
    KvPool pool_kv{host_tensor(DType::f32, {blocks, bs, kv, hd}), host_tensor(DType::f32, {blocks, bs, kv, hd})};
    // Store the cached prefix, then the batch's own keys through kv_store.
    AttentionLayout prefix = layout;
    prefix.seqs = {{0, static_cast<int32_t>(cached)}, {0}};
    prefix.cached = {0};
    ops->kv_store(keys.rows(0, cached), values.rows(0, cached), prefix, pool_kv);
    ops->kv_store(keys.rows(cached, cached + T), values.rows(cached, cached + T), layout, pool_kv);
    outs[p] = host_tensor(DType::f32, {T, heads, hd});
    ops->attention(q, pool_kv, layout, 0.2f, outs[p]);
  }
  EXPECT_LT(rel_rms(outs[0], outs[1]), 1e-6);
}

TEST(CpuOps, ConvWindowCarriesAcrossCalls) {
  // One call over 7 tokens equals 7 calls of one token each, for the outputs and the final window.
  std::mt19937 rng(4);
  ThreadPool pool(2);
  auto ops = make_cpu_ops(pool);
  const int64_t C = 19, K = 4, T = 7;
  Tensor x = random_tensor({T, C}, rng), w = random_tensor({C, K}, rng);
  Tensor state_a = random_tensor({1, K - 1, C}, rng), state_b = copy(state_a);
  Tensor out_a = host_tensor(DType::f32, {T, C}), out_b = host_tensor(DType::f32, {T, C});
  ops->conv1d_causal(x, w, SeqLayout{{0, static_cast<int32_t>(T)}, {0}}, state_a, out_a);
  for (int64_t t = 0; t < T; ++t) {
    Tensor o = out_b.rows(t, t + 1);
    ops->conv1d_causal(x.rows(t, t + 1), w, SeqLayout{{0, 1}, {0}}, state_b, o);
  }
  EXPECT_TRUE(same_bits(out_a, out_b));
  EXPECT_TRUE(same_bits(state_a, state_b));
}

TEST(CpuOps, BadArgumentsNameTheOpAndTensor) {
  ThreadPool pool(1);
  auto ops = make_cpu_ops(pool);
  Tensor x = host_tensor(DType::f32, {2, 8}), y = host_tensor(DType::f32, {2, 4});
  expect_error([&] { ops->linear(x, host_tensor(DType::f32, {4, 9}), y); }, {"linear", "w", "8"});
  expect_error([&] { ops->linear(x, host_tensor(DType::f8_e4m3, {4, 8}), y); }, {"linear", "w", "f8_e4m3"});
  expect_error([&] { ops->linear(x, host_tensor(DType::f32, {5, 8}), y); }, {"linear", "y", "[2, 5]"});
  Tensor ids = host_tensor(DType::i32, {1});
  ids.ptr<int32_t>()[0] = 7;
  Tensor emb = host_tensor(DType::f32, {1, 8});
  expect_error([&] { ops->embedding(ids, host_tensor(DType::bf16, {7, 8}), emb); }, {"embedding", "ids[0] = 7"});

  Tensor state = host_tensor(DType::f32, {2, 3, 8}), out = host_tensor(DType::f32, {2, 8});
  expect_error([&] { ops->conv1d_causal(x, host_tensor(DType::f32, {8, 4}), SeqLayout{{0, 1, 2}, {1, 1}}, state, out); },
               {"conv1d_causal", "slot 1", "two sequences"});
  expect_error([&] { ops->conv1d_causal(x, host_tensor(DType::f32, {8, 4}), SeqLayout{{0, 3}, {0}}, state, out); },
               {"conv1d_causal", "cu_seqlens", "3 tokens"});

  AttentionLayout layout;
  layout.seqs = {{0, 1}, {0}};
  layout.cached = {20};
  layout.block_size = 16, layout.max_blocks = 2;
  layout.block_table = {0, 5};
  KvPool kv{host_tensor(DType::f32, {2, 16, 1, 8}), host_tensor(DType::f32, {2, 16, 1, 8})};
  Tensor q = host_tensor(DType::f32, {1, 2, 8}), o = host_tensor(DType::f32, {1, 2, 8});
  expect_error([&] { ops->attention(q, kv, layout, 1.0f, o); }, {"attention", "block_table[0, 1] = 5"});
  layout.block_table = {0, 1};
  layout.cached = {40};
  expect_error([&] { ops->attention(q, kv, layout, 1.0f, o); }, {"attention", "position 40"});
  expect_error([&] { ops->attention(q, kv, layout, 1.0f, q); }, {"attention", "alias"});
}

}  // namespace
}  // namespace qinfer
