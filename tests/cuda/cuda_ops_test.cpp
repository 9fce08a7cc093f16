// The cuda backend's own machinery, beyond the op harness's per-op comparisons: device memory and
// transfers, copy_columns, bad device-side indices surfacing at the next synchronization, greedy
// picks on the device, layouts that change between calls, and the chunked delta rule on long
// sequences with several state-row tiles.
#include <cuda_runtime.h>
#include <fmt/core.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <numeric>
#include <random>

#include "backend/cuda/cuda_ops.h"
#include "backend/sampling.h"
#include "cache/cache.h"
#include "cache/host_tier.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/thread_pool.h"
#include "quant/quant.h"

namespace qinfer::cuda {
namespace {

Tensor random_f32(std::mt19937& rng, std::vector<int64_t> shape, float stddev = 1.0f) {
  Tensor t = host_tensor(DType::f32, std::move(shape));
  std::normal_distribution<float> dist(0.0f, stddev);
  for (int64_t i = 0; i < t.numel(); ++i) t.ptr<float>()[i] = dist(rng);
  return t;
}

Tensor i32(std::vector<int64_t> shape, const std::vector<int32_t>& values) {
  Tensor t = host_tensor(DType::i32, std::move(shape));
  std::memcpy(t.data, values.data(), values.size() * sizeof(int32_t));
  return t;
}

double rel_rms(const Tensor& got, const Tensor& want) {
  double diff = 0, norm = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double g = got.ptr<float>()[i], w = want.ptr<float>()[i];
    diff += (g - w) * (g - w), norm += w * w;
  }
  return std::sqrt(diff / norm);
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.data);
  return {p, p + t.nbytes()};
}

SeqLayout layout_of(const std::vector<int32_t>& lens, std::vector<int32_t> slots) {
  SeqLayout layout;
  layout.cu_seqlens.push_back(0);
  for (int32_t len : lens) layout.cu_seqlens.push_back(layout.cu_seqlens.back() + len);
  layout.state_slot = std::move(slots);
  return layout;
}

TEST(CudaOps, AllocZeroFillsAndTransfersRoundTrip) {
  auto ops = make_cuda_ops(0, Precision::exact);
  EXPECT_EQ(ops->name(), "cuda");
  EXPECT_EQ(ops->device(), Device::cuda);
  Tensor zeros = ops->alloc(DType::f32, {3, 5});
  EXPECT_EQ(zeros.device, Device::cuda);
  const Tensor back = to_host(zeros);
  for (int64_t i = 0; i < back.numel(); ++i) EXPECT_EQ(back.ptr<float>()[i], 0.0f);
  EXPECT_EQ(ops->alloc(DType::f32, {0, 7}).numel(), 0);

  Tensor odd = host_tensor(DType::bf16, {7});
  for (int i = 0; i < 7; ++i) odd.ptr<uint16_t>()[i] = static_cast<uint16_t>(0x3F80 + 17 * i);
  EXPECT_EQ(bytes_of(to_host(to_device(*ops, odd))), bytes_of(odd));
  const Tensor ids = i32({2, 3}, {5, -1, 7, 0, 3, 2147483647});
  const Tensor ids_back = to_host(to_device(*ops, ids));
  EXPECT_EQ(ids_back.shape, ids.shape);
  EXPECT_EQ(ids_back.dtype, DType::i32);
  EXPECT_EQ(bytes_of(ids_back), bytes_of(ids));
  EXPECT_THROW(make_cuda_ops(1 << 20, Precision::exact), Error);
}

TEST(CudaOps, CopyMovesRowViewsInEveryDirection) {
  auto ops = make_cuda_ops(0, Precision::exact);
  std::mt19937 rng(1);
  const Tensor host = random_f32(rng, {4, 6});
  Tensor device = to_device(*ops, host);
  // Host row into a device row view, device rows into host memory, device to device.
  const Tensor row = random_f32(rng, {1, 6});
  Tensor device_row = device.rows(2, 3);
  copy(*ops, row, device_row);
  Tensor two = host_tensor(DType::f32, {2, 6});
  copy(*ops, device.rows(1, 3), two);
  EXPECT_EQ(std::memcmp(two.ptr<float>(), host.ptr<float>() + 6, 6 * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(two.ptr<float>() + 6, row.ptr<float>(), 6 * sizeof(float)), 0);
  Tensor copied = ops->alloc(DType::f32, {24});
  copy(*ops, device.reshape({24}), copied);
  const Tensor all = to_host(copied);
  EXPECT_EQ(std::memcmp(all.ptr<float>() + 12, row.ptr<float>(), 6 * sizeof(float)), 0);
  Tensor wrong = ops->alloc(DType::f32, {5});
  EXPECT_THROW(copy(*ops, device, wrong), Error);
}

// The prefix cache's host tier: pinned host memory, and a block's K/V in every layer and a slot's
// state copied out and back into other rows, in one batch each way.
TEST(CudaOps, HostTierRoundTripsBlocksAndStatesThroughPinnedMemory) {
  auto ops = make_cuda_ops(0, Precision::exact);
  const Tensor pinned = ops->alloc_pinned(DType::f32, {3, 5});
  cudaPointerAttributes attributes{};
  ASSERT_EQ(cudaPointerGetAttributes(&attributes, pinned.data), cudaSuccess);
  EXPECT_EQ(attributes.type, cudaMemoryTypeHost);
  EXPECT_EQ(pinned.device, Device::cpu);

  CacheShape shape;
  shape.attention_layers = 2;
  shape.kv_heads = 2;
  shape.head_dim = 8;
  shape.linear_layers = 1;
  shape.conv_channels = 4;
  shape.conv_window = 3;
  shape.value_heads = 2;
  shape.value_head_dim = 4;
  shape.key_head_dim = 4;
  shape.kv_dtype = ops->kv_dtype();
  ModelCache cache(*ops, shape, 6, 4, 3);
  std::mt19937 rng(5);
  std::vector<Tensor> written;
  for (int64_t l = 0; l < 2; ++l)
    for (Tensor* pool : {&cache.kv(l).k, &cache.kv(l).v}) {
      Tensor values = random_f32(rng, {1, 4, 2, 8});
      if (pool->dtype == DType::bf16) {
        Tensor b = host_tensor(DType::bf16, values.shape);
        for (int64_t i = 0; i < values.numel(); ++i) b.ptr<uint16_t>()[i] = f32_to_bf16(values.ptr<float>()[i]);
        values = b;
      }
      Tensor rows = pool->rows(2, 3);
      copy(*ops, values, rows);
      written.push_back(values);
    }
  for (Tensor* state : {&cache.conv_state(0), &cache.delta_state(0)}) {
    std::vector<int64_t> one = state->shape;
    one[0] = 1;
    Tensor values = random_f32(rng, one);
    Tensor rows = state->rows(1, 2);
    copy(*ops, values, rows);
    written.push_back(values);
  }
  HostTier tier(cache, 3, 2);
  tier.save_block(2, 1);
  tier.save_state(1, 0);
  tier.run();
  tier.load_block(1, 4);
  tier.load_state(0, 2);
  tier.run();
  size_t k = 0;
  for (int64_t l = 0; l < 2; ++l)
    for (Tensor* pool : {&cache.kv(l).k, &cache.kv(l).v}) {
      const Tensor back = to_host(pool->rows(4, 5));
      EXPECT_EQ(std::memcmp(back.data, written[k].data, back.nbytes()), 0) << "layer " << l;
      ++k;
    }
  for (Tensor* state : {&cache.conv_state(0), &cache.delta_state(0)}) {
    const Tensor back = to_host(state->rows(2, 3));
    EXPECT_EQ(std::memcmp(back.data, written[k].data, back.nbytes()), 0) << "state " << k;
    ++k;
  }
  EXPECT_THROW(tier.save_block(6, 0), Error);
  EXPECT_THROW(tier.load_state(2, 0), Error);
}

TEST(CudaOps, CopyColumnsMatchesTheHostCopy) {
  auto ops = make_cuda_ops(0, Precision::exact);
  std::mt19937 rng(2);
  const Tensor src = random_f32(rng, {5, 9});
  Tensor want = random_f32(rng, {5, 4});
  Tensor dst = to_device(*ops, want);
  copy_columns(src, 3, want, 1, 3);
  copy_columns(*ops, to_device(*ops, src), 3, dst, 1, 3);
  EXPECT_EQ(bytes_of(to_host(dst)), bytes_of(want));
  Tensor too_narrow = ops->alloc(DType::f32, {5, 2});
  EXPECT_THROW(copy_columns(*ops, to_device(*ops, src), 3, too_narrow, 1, 3), Error);
}

TEST(CudaOps, DeviceOpsRejectHostTensors) {
  auto ops = make_cuda_ops(0, Precision::exact);
  std::mt19937 rng(3);
  const Tensor x = random_f32(rng, {2, 8});
  Tensor w = to_device(*ops, random_f32(rng, {3, 8}));
  Tensor y = ops->alloc(DType::f32, {2, 3});
  try {
    ops->linear(x, w, y);
    FAIL() << "a host x was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("host memory"), std::string::npos) << e.what();
  }
}

// Token ids live on the device, so a bad one is found by the kernel and reported at the next
// synchronization; the report is cleared once thrown.
TEST(CudaOps, BadDeviceIndicesThrowAtTheNextSynchronization) {
  auto ops = make_cuda_ops(0, Precision::exact);
  std::mt19937 rng(4);
  Tensor table = to_device(*ops, random_f32(rng, {4, 8}));
  Tensor out = ops->alloc(DType::f32, {2, 8});
  ops->embedding(to_device(*ops, i32({2}, {1, 7})), table, out);
  Tensor host = host_tensor(DType::f32, {2, 8});
  try {
    copy(*ops, out, host);
    FAIL() << "the bad id was not reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ids[1] = 7"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(copy(*ops, out, host));

  const int64_t T = 2, H = 8, I = 4, E = 3;
  Tensor gate = to_device(*ops, random_f32(rng, {E, I, H}));
  Tensor up = to_device(*ops, random_f32(rng, {E, I, H}));
  Tensor down = to_device(*ops, random_f32(rng, {E, H, I}));
  Tensor moe_out = ops->alloc(DType::f32, {T, H});
  ops->moe_experts(to_device(*ops, random_f32(rng, {T, H})), to_device(*ops, i32({T, 1}, {2, 3})),
                   to_device(*ops, random_f32(rng, {T, 1})), gate, up, down, moe_out);
  EXPECT_THROW(copy(*ops, moe_out, host), Error);
}

// An MLX affine [out, in] weight (bf16 scales and biases) quantized from normal(0, 0.5) values.
Weight affine_weight(std::mt19937& rng, int bits, int group, int64_t out, int64_t in) {
  const quant::Layout layout{quant::Mode::affine, bits, group};
  Weight w;
  w.layout = layout;
  w.codes = host_tensor(DType::u32, {out, quant::packed_words(in, bits)});
  w.scales = host_tensor(DType::bf16, {out, in / group});
  w.biases = host_tensor(DType::bf16, {out, in / group});
  std::normal_distribution<float> dist(0.0f, 0.5f);
  std::vector<float> row(in), scales(in / group), biases(in / group);
  for (int64_t r = 0; r < out; ++r) {
    for (float& v : row) v = dist(rng);
    quant::quantize_row(layout, row.data(), in, w.codes.ptr<uint32_t>() + r * quant::packed_words(in, bits),
                        scales.data(), biases.data(), nullptr);
    for (int64_t g = 0; g < in / group; ++g) {
      w.scales.ptr<uint16_t>()[r * (in / group) + g] = f32_to_bf16(scales[g]);
      w.biases.ptr<uint16_t>()[r * (in / group) + g] = f32_to_bf16(biases[g]);
    }
  }
  return w;
}

Weight weight_to_device(Ops& ops, const Weight& w) {
  Weight d = w;
  d.codes = to_device(ops, w.codes);
  d.scales = to_device(ops, w.scales);
  d.biases = to_device(ops, w.biases);
  return d;
}

// The fast precision's one-token affine GEMV reads x as 16-bit integers a chunk: within ~1e-5 of
// the exact kernel (which the op harness holds to the reference), where the harness's fast floor
// (1e-2) would let a misplaced digit or a wrong chunk scale pass. Chunks of mixed magnitudes, an
// all-zero x (y = 0 exactly), a NaN and an infinity (every output non-finite), both widths, every
// group size, a matrix large enough for several tasks a warp, the fused (gate, up) and a q/k/v-style batch.
TEST(CudaOps, FastAffineGemvIsWithinSixteenBitsOfExact) {
  auto exact = make_cuda_ops(0, Precision::exact), fast = make_cuda_ops(0, Precision::fast);
  std::mt19937 rng(11);
  struct Shape { int bits, group; int64_t in, out; };
  std::vector<Shape> shapes;
  // Rows whose bf16 scales are whole 16-byte units (4096) and are not (4224).
  for (const int64_t in : {4096, 4096 + 128})
    for (const int bits : {4, 8})
      for (const int group : {32, 64, 128}) shapes.push_back({bits, group, in, 301});
  shapes.push_back({4, 64, 4096, 10240});  // a grid of every SM, several tasks a warp
  shapes.push_back({4, 64, 12288, 4096});  // the MLP's down projection: slices of rows
  for (const auto [bits, group, in, out] : shapes) {
    const Weight w = affine_weight(rng, bits, group, out, in), up = affine_weight(rng, bits, group, out, in);
    const Weight small = affine_weight(rng, bits, group, 37, in);
    // x ~ normal(0, 1): each element within ~4e-5 of its chunk's largest, ~2e-5 of y. Mixed: a large
    // element every 37 (x 300) sets its chunks' step, so the others lose more (~2e-4 of y).
    const Tensor x = random_f32(rng, {1, in});
    Tensor mixed = host_tensor(DType::f32, {1, in});
    std::memcpy(mixed.data, x.data, x.nbytes());
    for (int64_t i = 0; i < in; i += 37) mixed.ptr<float>()[i] *= 300.0f;
    for (int64_t i = 5; i < in; i += 11) mixed.ptr<float>()[i] *= 1e-3f;
    const std::string what = fmt::format("{}-bit g{} {}x{}", bits, group, out, in);
    auto run = [&](Ops& ops, const Tensor& xh) {
      const Weight wd = weight_to_device(ops, w), ud = weight_to_device(ops, up), sd = weight_to_device(ops, small);
      const Tensor xd = to_device(ops, xh);
      Tensor y = ops.alloc(DType::f32, {1, out}), g = ops.alloc(DType::f32, {1, out});
      Tensor q = ops.alloc(DType::f32, {1, out}), k = ops.alloc(DType::f32, {1, out});
      Tensor v = ops.alloc(DType::f32, {1, 37});
      ops.linear(xd, wd, y);
      ops.linear_swiglu(xd, wd, ud, g);
      ops.linear_many(xd, {&wd, &sd, &ud}, {&q, &v, &k});  // a short matrix between two
      return std::vector<Tensor>{to_host(y), to_host(g), to_host(q), to_host(k), to_host(v)};
    };
    for (const auto& [input, tolerance] : {std::pair{&x, 1e-4}, std::pair{static_cast<const Tensor*>(&mixed), 6e-4}}) {
      const auto want = run(*exact, *input), got = run(*fast, *input);
      for (size_t i = 0; i < want.size(); ++i)
        EXPECT_LT(rel_rms(got[i], want[i]), tolerance) << what << " output " << i << (input == &x ? "" : " mixed");
    }
    Tensor zero = host_tensor(DType::f32, {1, in});
    std::fill_n(zero.ptr<float>(), in, 0.0f);
    for (const Tensor& y : run(*fast, zero))
      for (int64_t r = 0; r < y.numel(); ++r) ASSERT_EQ(y.ptr<float>()[r], 0.0f) << what;
    for (const float bad : {std::numeric_limits<float>::quiet_NaN(), INFINITY}) {
      Tensor xb = host_tensor(DType::f32, {1, in});
      std::memcpy(xb.data, x.data, x.nbytes());
      xb.ptr<float>()[in / 2 + 3] = bad;
      const auto y = run(*fast, xb);
      for (int64_t r = 0; r < out; ++r) ASSERT_FALSE(std::isfinite(y[0].ptr<float>()[r])) << what << " row " << r;
    }
  }
}

// The names of the kernels `run` enqueues on the ops' stream, from a graph captured from it (not run).
std::vector<std::string> kernels_enqueued(Ops& ops, const std::function<void()>& run) {
  cudaStream_t stream = stream_of(ops);
  EXPECT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), cudaSuccess);
  run();
  cudaGraph_t graph = nullptr;
  EXPECT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  size_t count = 0;
  EXPECT_EQ(cudaGraphGetNodes(graph, nullptr, &count), cudaSuccess);
  std::vector<cudaGraphNode_t> nodes(count);
  EXPECT_EQ(cudaGraphGetNodes(graph, nodes.data(), &count), cudaSuccess);
  std::vector<std::string> kernels;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType type{};
    EXPECT_EQ(cudaGraphNodeGetType(node, &type), cudaSuccess);
    if (type != cudaGraphNodeTypeKernel) continue;
    cudaKernelNodeParams params{};
    EXPECT_EQ(cudaGraphKernelNodeGetParams(node, &params), cudaSuccess);
    const char* name = nullptr;
    EXPECT_EQ(cudaFuncGetName(&name, params.func), cudaSuccess);
    kernels.push_back(name ? name : "?");
  }
  cudaGraphDestroy(graph);
  return kernels;
}

// add_rms_norm_linear_many / _swiglu with the add and norm folded into the GEMV's blocks give the
// separate launches' residual bit for bit, and their normed x and products to the last bits (the
// fold sums Σx² in another order), at both precisions: 4-bit rows of 4096 and 8-bit of 2048 fold,
// 4-bit of 4224 (more chunks than pairs of threads) runs the two ops. Three steps each: the last
// block's count must be left at zero, or later steps would not store the residual. That the fold
// runs where it should is seen from the kernels each call enqueues: one, or the two ops' two.
TEST(CudaOps, NormFoldedIntoAffineGemvMatchesTheSeparateLaunches) {
  std::mt19937 rng(17);
  struct Shape { int bits; int64_t in; };
  for (const Precision precision : {Precision::exact, Precision::fast}) {
    auto ops = make_cuda_ops(0, precision);
    for (const auto [bits, in] : {Shape{4, 4096}, Shape{8, 2048}, Shape{4, 4224}}) {
      const std::string what =
          fmt::format("{}-bit in={} {}", bits, in, precision == Precision::fast ? "fast" : "exact");
      const Weight q = weight_to_device(*ops, affine_weight(rng, bits, 64, 301, in));
      const Weight k = weight_to_device(*ops, affine_weight(rng, bits, 64, 37, in));
      const Weight gate = weight_to_device(*ops, affine_weight(rng, bits, 64, 1000, in));
      const Weight up = weight_to_device(*ops, affine_weight(rng, bits, 64, 1000, in));
      const Tensor norm_w = to_device(*ops, random_f32(rng, {in}));
      const Tensor h0 = random_f32(rng, {1, in}, 3.0f);
      Tensor fused_h = to_device(*ops, h0), split_h = to_device(*ops, h0);
      auto alloc = [&](int64_t n) { return ops->alloc(DType::f32, {1, n}); };
      Tensor normed = alloc(in), yq = alloc(301), yk = alloc(37), act = alloc(1000);
      Tensor want_normed = alloc(in), want_q = alloc(301), want_k = alloc(37), want_act = alloc(1000);
      for (int step = 0; step < 6; ++step) {
        const Tensor delta = to_device(*ops, random_f32(rng, {1, in}));
        if (step % 2 == 0) {
          ops->add_rms_norm_linear_many(fused_h, delta, norm_w, 1e-6f, normed, {&q, &k}, {&yq, &yk});
          ops->add_rms_norm(split_h, delta, norm_w, 1e-6f, want_normed);
          ops->linear_many(want_normed, {&q, &k}, {&want_q, &want_k});
        } else {
          ops->add_rms_norm_linear_swiglu(fused_h, delta, norm_w, 1e-6f, normed, gate, up, act);
          ops->add_rms_norm(split_h, delta, norm_w, 1e-6f, want_normed);
          ops->linear_swiglu(want_normed, gate, up, want_act);
        }
        const Tensor got_h = to_host(fused_h), want_h = to_host(split_h);
        ASSERT_EQ(std::memcmp(got_h.data, want_h.data, got_h.nbytes()), 0) << what << " step " << step;
        EXPECT_LT(rel_rms(to_host(normed), to_host(want_normed)), 1e-6) << what << " step " << step;
        if (step % 2 == 0) {
          EXPECT_LT(rel_rms(to_host(yq), to_host(want_q)), 2e-5) << what << " step " << step;
          EXPECT_LT(rel_rms(to_host(yk), to_host(want_k)), 2e-5) << what << " step " << step;
        } else {
          EXPECT_LT(rel_rms(to_host(act), to_host(want_act)), 2e-5) << what << " step " << step;
        }
      }
      const Tensor delta = to_device(*ops, random_f32(rng, {1, in}));
      const int folded = in == 4224 ? 2 : 1;
      EXPECT_EQ(kernels_enqueued(*ops, [&] {
                  ops->add_rms_norm_linear_many(fused_h, delta, norm_w, 1e-6f, normed, {&q, &k}, {&yq, &yk});
                }).size(),
                folded)
          << what;
      EXPECT_EQ(kernels_enqueued(*ops, [&] {
                  ops->add_rms_norm_linear_swiglu(fused_h, delta, norm_w, 1e-6f, normed, gate, up, act);
                }).size(),
                folded)
          << what;
    }
  }
}

// MLX affine experts of decode-sized batches run on the affine GEMV (two launches of it and the
// combine; the op harness holds them to the reference): its fast precision close to the exact one
// (1.2e-4 measured on an H200; a wrong chunk of x would be far off, where the harness's fast floor
// would let it pass); a bad expert id is reported at the next synchronization, naming the slot,
// and the ops go on working after it.
TEST(CudaOps, AffineExpertsRunOnTheAffineGemv) {
  auto exact = make_cuda_ops(0, Precision::exact), fast = make_cuda_ops(0, Precision::fast);
  std::mt19937 rng(12);
  struct Shape { int bits, group; int64_t T, H, I, E, k; };
  for (const Shape s : {Shape{4, 64, 1, 512, 256, 16, 4}, Shape{4, 64, 6, 512, 192, 32, 8}, Shape{8, 32, 2, 256, 128, 8, 3}}) {
    const std::string what = fmt::format("{}-bit g{} T={} H={} I={} E={} k={}", s.bits, s.group, s.T, s.H, s.I, s.E, s.k);
    auto experts = [&](int64_t rows, int64_t in) {  // [E, rows, in]
      Weight w = affine_weight(rng, s.bits, s.group, s.E * rows, in);
      w.codes.shape = {s.E, rows, w.codes.shape[1]};
      w.scales.shape = {s.E, rows, w.scales.shape[1]};
      w.biases.shape = {s.E, rows, w.biases.shape[1]};
      return w;
    };
    const Weight gate = experts(s.I, s.H), up = experts(s.I, s.H), down = experts(s.H, s.I);
    std::vector<int32_t> ids;
    for (int64_t t = 0; t < s.T; ++t)
      for (int64_t j = 0; j < s.k; ++j) ids.push_back(static_cast<int32_t>((t * 5 + j * 3) % s.E));
    const Tensor x = random_f32(rng, {s.T, s.H}), weights = random_f32(rng, {s.T, s.k});
    auto run = [&](Ops& ops, const std::vector<int32_t>& routing) {
      const Weight g = weight_to_device(ops, gate), u = weight_to_device(ops, up), d = weight_to_device(ops, down);
      const Tensor xd = to_device(ops, x), idd = to_device(ops, i32({s.T, s.k}, routing)), wd = to_device(ops, weights);
      Tensor out = ops.alloc(DType::f32, {s.T, s.H});
      const std::vector<std::string> kernels =
          kernels_enqueued(ops, [&] { ops.moe_experts(xd, idd, wd, g, u, d, out); });
      EXPECT_EQ(kernels.size(), 3u) << what;
      for (size_t i = 0; i < 2 && i < kernels.size(); ++i)
        EXPECT_NE(kernels[i].find("gemv_affine_kernel"), std::string::npos) << what << ": " << kernels[i];
      ops.moe_experts(xd, idd, wd, g, u, d, out);
      Tensor host = host_tensor(DType::f32, {s.T, s.H});
      copy(ops, out, host);  // throws for a reported id
      return host;
    };
    // Two GEMVs in a row, each reading its x rounded to 16 bits a chunk.
    EXPECT_LT(rel_rms(run(*fast, ids), run(*exact, ids)), 5e-4) << what;
    std::vector<int32_t> bad = ids;
    bad[s.k * s.T - 1] = static_cast<int32_t>(s.E + 2);
    try {
      run(*exact, bad);
      FAIL() << "the bad id was not reported: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(fmt::format("flat index {}) = {}", s.k * s.T - 1, s.E + 2)), std::string::npos)
          << e.what();
    }
    EXPECT_EQ(bytes_of(run(*exact, ids)), bytes_of(run(*exact, ids))) << what;
  }
}

// Sampling on the device gives sample_rows' ids for every setting: the greedy rule (NaN never wins,
// ties go to the lowest id, −0 equals +0), penalties, a plain temperature draw, top-k / top-p /
// min-p from the compacted candidates, and rows the host finishes (more than the compaction holds
// pass the threshold, or the threshold is lowered). A vocabulary of 152k is split
// over blocks: there the tie sits in different parts of the row, the lower id in the later-merged one.
TEST(CudaOps, SamplingMatchesTheHostDefinition) {
  auto ops = make_cuda_ops(0, Precision::exact);
  std::mt19937 rng(5);
  for (const int64_t V : {int64_t{3000}, int64_t{151936}}) {
    const int64_t S = 6;
    Tensor logits = random_f32(rng, {S, V}, 3.0f);
    float* l = logits.ptr<float>();
    l[10] = l[V - 20] = 50.0f;                                 // row 0: a tie at the top
    l[V + 5] = std::numeric_limits<float>::quiet_NaN();        // row 1: NaN never wins
    l[V + V / 2] = 40.0f;
    for (int64_t i = 0; i < V; ++i) l[2 * V + i] = -0.0f;      // row 2: all zeros of both signs
    l[2 * V + V - 7] = 0.0f;
    for (int64_t i = 0; i < V; ++i) l[3 * V + i] = -INFINITY;  // row 3: all −inf
    // Row 5: one clear best over a mass of weights just under the first threshold (top_p lowers it).
    for (int64_t i = 0; i < V; ++i) l[5 * V + i] = -9.0f;
    l[5 * V + 7] = 0.0f;
    const Tensor device = to_device(*ops, logits);
    std::vector<std::vector<int32_t>> history(S);
    const std::vector<uint64_t> step = {0, 1, 2, 3, 4, 5};
    history[4] = {1, 2, 3, 2, static_cast<int32_t>(V - 1), static_cast<int32_t>(V), -1};
    for (const SamplingParams params :
         {SamplingParams{}, SamplingParams{.temperature = 0.8f, .top_k = 40, .seed = 9},
          SamplingParams{.repetition_penalty = 1.5f}, SamplingParams{.temperature = 1.0f, .seed = 3},
          SamplingParams{.temperature = 0.7f, .top_p = 0.9f, .seed = 4},
          SamplingParams{.temperature = 0.6f, .top_k = 20, .top_p = 0.95f, .seed = 5},
          SamplingParams{.temperature = 1.0f, .min_p = 0.1f, .seed = 6},
          SamplingParams{.temperature = 0.9f, .top_p = 0.8f, .repetition_penalty = 1.3f, .presence_penalty = 0.5f,
                         .frequency_penalty = 0.3f, .seed = 7},
          SamplingParams{.temperature = 30.0f, .top_p = 0.5f, .seed = 8}}) {
      std::vector<SamplingParams> all(S, params);
      std::vector<int32_t> want, got;
      sample_rows(logits, all, history, step, want);
      ops->sample(device, all, history, step, got);
      EXPECT_EQ(got, want) << "vocabulary " << V << ", temperature " << params.temperature;
      if (params.temperature <= 0.0f && params.repetition_penalty == 1.0f) {
        EXPECT_EQ(got[0], 10);
        EXPECT_EQ(got[2], 0);
        EXPECT_EQ(got[3], 0);
      }
    }
  }
}

// Where a filtered row without penalties is finished: on the device, or on the host where more than
// 4096 weights reach the first threshold or LeadingCandidates would lower it (in plain double
// sums: this only checks that a batch holds each kind of row; sample_rows is the reference).
enum class Finish { device, overflow, lowered };
Finish where_finished(const float* logits, int64_t V, const SamplingParams& p) {
  float max = -INFINITY;
  for (int64_t i = 0; i < V; ++i)
    if (!std::isnan(logits[i])) max = std::max(max, logits[i]);
  int64_t passed = 0;
  double mass = 0.0, total = 0.0;
  for (int64_t i = 0; i < V; ++i) {
    const float w = std::isnan(logits[i]) ? 0.0f : sampling_weight(logits[i], max, p.temperature);
    total += w;
    if (w >= sampling_threshold(p)) ++passed, mass += w;
  }
  if (passed > 4096) return Finish::overflow;
  const bool top_k = p.top_k > 0 && p.top_k < V;
  const bool enough = passed >= (top_k ? p.top_k : 1) && (top_k || p.top_p >= 1.0f || mass >= p.top_p * total);
  return enough ? Finish::device : Finish::lowered;
}

// Batches of 256 rows finished on the device, against sample_rows row by row: every kind of row
// (flat, spread and peaked logits, one spike, all equal, a cliff just under the first threshold,
// masked to a few ids, all −inf, a +inf, NaNs and a tie) under every setting (greedy with and
// without penalties, plain temperatures, top-k, top-p with and without top-k, min-p, combinations,
// penalties over histories), with fresh seeds and steps each round. Among them: filtered rows the
// device finishes, rows with more than 4096 candidates, and rows whose threshold must be lowered
// (both finished on the host); the test checks each occurs.
TEST(CudaOps, SampledBatchesMatchTheHostDefinitionRowByRow) {
  auto ops = make_cuda_ops(0, Precision::exact);
  std::mt19937 rng(11);
  const std::vector<SamplingParams> settings = {
      SamplingParams{},
      SamplingParams{.repetition_penalty = 1.4f},
      SamplingParams{.temperature = 0.3f},
      SamplingParams{.temperature = 0.7f},
      SamplingParams{.temperature = 1.0f},
      SamplingParams{.temperature = 1.6f},
      SamplingParams{.temperature = 30.0f},
      SamplingParams{.temperature = 0.8f, .top_k = 1},
      SamplingParams{.temperature = 0.8f, .top_k = 40},
      SamplingParams{.temperature = 1.2f, .top_k = 400},
      SamplingParams{.temperature = 1.0f, .top_k = 5000},     // more than the device holds
      SamplingParams{.temperature = 1.0f, .top_k = 1 << 30},  // ≥ the vocabulary: off
      SamplingParams{.temperature = 0.7f, .top_p = 0.9f},
      SamplingParams{.temperature = 1.0f, .top_p = 0.5f},
      SamplingParams{.temperature = 1.0f, .top_p = 0.99f},
      SamplingParams{.temperature = 1.0f, .top_p = 0.9995f},  // lowered by a cliff even in 7 tokens
      SamplingParams{.temperature = 0.6f, .top_k = 20, .top_p = 0.95f},
      SamplingParams{.temperature = 1.0f, .top_k = 100, .top_p = 0.3f},
      SamplingParams{.temperature = 1.0f, .min_p = 0.05f},
      SamplingParams{.temperature = 0.9f, .min_p = 0.2f},
      SamplingParams{.temperature = 1.0f, .min_p = 1e-5f},  // a first threshold below 1/4096
      SamplingParams{.temperature = 0.8f, .top_k = 50, .top_p = 0.9f, .min_p = 0.1f},
      SamplingParams{.temperature = 0.9f, .top_p = 0.8f, .repetition_penalty = 1.3f, .presence_penalty = 0.5f,
                     .frequency_penalty = 0.3f},
      SamplingParams{.temperature = 1.0f, .repetition_penalty = 0.8f, .frequency_penalty = 1.0f},
      SamplingParams{.temperature = 0.7f, .top_k = 30, .presence_penalty = 2.0f},
  };
  enum Kind { flat, spread, peaked, spike, equal, cliff, masked, minus_inf, plus_inf, nan_and_tie, kinds };
  const int64_t S = 256;
  for (const int64_t V : {int64_t{7}, int64_t{5003}, int64_t{151936}}) {
    int64_t finished[3] = {0, 0, 0};  // by Finish
    for (int round = 0; round < 4; ++round) {
      Tensor logits = host_tensor(DType::f32, {S, V});
      std::vector<SamplingParams> params(S);
      std::vector<std::vector<int32_t>> history(S);
      std::vector<uint64_t> step(S);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      std::uniform_int_distribution<int64_t> any_id(0, V - 1);
      for (int64_t s = 0; s < S; ++s) {
        float* l = logits.ptr<float>() + s * V;
        const int kind = static_cast<int>(s % kinds);
        const float sigma = kind == spread ? 4.0f : kind == peaked || kind == nan_and_tie ? 2.0f : 1.0f;
        for (int64_t i = 0; i < V; ++i) l[i] = sigma * normal(rng);
        if (kind == peaked)
          for (int j = 0; j < 8; ++j) l[any_id(rng)] = 12.0f + normal(rng);
        if (kind == spike) l[any_id(rng)] = 30.0f;
        if (kind == equal) std::fill(l, l + V, 0.5f);
        if (kind == cliff) std::fill(l, l + V, -9.0f), l[any_id(rng)] = 0.0f;  // e^-9 < 1/4096
        if (kind == masked || kind == minus_inf) std::fill(l, l + V, -INFINITY);
        if (kind == masked)
          for (int j = 0; j < 6; ++j) l[any_id(rng)] = normal(rng);
        if (kind == plus_inf) l[any_id(rng)] = INFINITY;
        if (kind == nan_and_tie) {
          for (int j = 0; j < 20; ++j) l[any_id(rng)] = std::numeric_limits<float>::quiet_NaN();
          l[V - 1] = l[V / 3] = 9.0f;
        }
        SamplingParams& p = params[s];
        p = settings[static_cast<size_t>(s / kinds + round * 11) % settings.size()];
        p.seed = rng();
        step[s] = rng() % 100000;
        const int length = static_cast<int>(rng() % 40);
        for (int j = 0; j < length; ++j) history[s].push_back(static_cast<int32_t>(any_id(rng)) + (j % 9 == 0 ? 2 : 0));
        const bool filtered = p.temperature > 0.0f && ((p.top_k > 0 && p.top_k < V) || p.top_p < 1.0f || p.min_p > 0.0f);
        if (!filtered || has_penalties(p) || kind == minus_inf || kind == plus_inf) continue;
        ++finished[static_cast<int>(where_finished(l, V, p))];
      }
      const Tensor device = to_device(*ops, logits);
      std::vector<int32_t> want, got;
      sample_rows(logits, params, history, step, want);
      ops->sample(device, params, history, step, got);
      ASSERT_EQ(got.size(), want.size());
      int wrong = 0;
      for (int64_t s = 0; s < S; ++s)
        if (got[s] != want[s] && ++wrong <= 8)
          ADD_FAILURE() << "vocabulary " << V << ", round " << round << ", row " << s << " (kind " << s % kinds
                        << ", temperature " << params[s].temperature << ", top_k " << params[s].top_k << ", top_p "
                        << params[s].top_p << ", min_p " << params[s].min_p << "): got " << got[s] << ", want "
                        << want[s];
      EXPECT_EQ(wrong, 0) << "vocabulary " << V << ", round " << round;
    }
    EXPECT_GT(finished[static_cast<int>(Finish::device)], 0) << "vocabulary " << V;
    EXPECT_GT(finished[static_cast<int>(Finish::lowered)], 0) << "vocabulary " << V;
    if (V > 4096) {
      EXPECT_GT(finished[static_cast<int>(Finish::overflow)], 0) << "vocabulary " << V;
    }
  }
}

// The batch layout is uploaded once and reused while it stays the same: a different layout of
// the same size in the next call must still be seen.
TEST(CudaOps, AttentionSeesALayoutThatChangedBetweenCalls) {
  auto ops = make_cuda_ops(0, Precision::exact);
  auto ref = make_ref_ops();
  std::mt19937 rng(6);
  const int64_t heads = 4, kv_heads = 2, hd = 32, blocks = 12;
  const int32_t bs = 4;
  KvPool pool{random_f32(rng, {blocks, bs, kv_heads, hd}), random_f32(rng, {blocks, bs, kv_heads, hd})};
  KvPool device_pool{to_device(*ops, pool.k), to_device(*ops, pool.v)};
  for (const std::vector<int32_t>& table : {std::vector<int32_t>{0, 1, 2, 3, 4, 5}, std::vector<int32_t>{11, 3, 7, 9, 1, 6}}) {
    AttentionLayout layout;
    layout.seqs = layout_of({2, 3}, {});
    layout.cached = {5, 6};
    layout.block_table = table;
    layout.max_blocks = 3;
    layout.block_size = bs;
    const Tensor q = random_f32(rng, {5, heads, hd});
    Tensor want = host_tensor(DType::f32, {5, heads, hd});
    ref->attention(q, pool, layout, 0.2f, want);
    Tensor got = ops->alloc(DType::f32, {5, heads, hd});
    ops->attention(to_device(*ops, q), device_pool, layout, 0.2f, got);
    EXPECT_LE(rel_rms(to_host(got), want), 1e-5);
  }
}

// Long sequences through both delta-rule kernels, with 128-wide heads (four tiles of state rows
// in the chunked kernel) and chunks that end mid-sequence: each agrees with ref's same algorithm.
TEST(CudaOps, DeltaRuleKernelsAgreeOnLongSequences) {
  auto ops = make_cuda_ops(0, Precision::exact);
  auto ref = make_ref_ops();
  std::mt19937 rng(7);
  const int64_t Hk = 2, Hv = 4, Dk = 128, Dv = 128, slots = 4;
  const SeqLayout layout = layout_of({200, 65, 1}, {2, 0, 3});
  const int64_t T = layout.num_tokens();
  Tensor q = random_f32(rng, {T, Hk, Dk}), k = random_f32(rng, {T, Hk, Dk});
  for (Tensor* t : {&q, &k}) {
    for (int64_t row = 0; row < T * Hk; ++row) {
      float* p = t->ptr<float>() + row * Dk;
      double norm = 0;
      for (int64_t i = 0; i < Dk; ++i) norm += double(p[i]) * p[i];
      const double scale = (t == &q ? 1.0 / std::sqrt(double(Dk)) : 1.0) / std::sqrt(norm);
      for (int64_t i = 0; i < Dk; ++i) p[i] = static_cast<float>(p[i] * scale);
    }
  }
  const Tensor v = random_f32(rng, {T, Hv, Dv});
  Tensor g = host_tensor(DType::f32, {T, Hv}), beta = host_tensor(DType::f32, {T, Hv});
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int64_t i = 0; i < T * Hv; ++i) g.ptr<float>()[i] = -3.0f * unit(rng) * unit(rng), beta.ptr<float>()[i] = unit(rng);
  const Tensor state0 = random_f32(rng, {slots, Hv, Dv, Dk}, 0.2f);
  for (GdnAlgorithm algorithm : {GdnAlgorithm::recurrent, GdnAlgorithm::chunked, GdnAlgorithm::automatic}) {
    Tensor want_state = host_tensor(DType::f32, state0.shape);
    std::memcpy(want_state.data, state0.data, state0.nbytes());
    Tensor want = host_tensor(DType::f32, {T, Hv, Dv});
    ref->gated_delta_rule(q, k, v, g, beta, layout, want_state, want, algorithm);
    Tensor state = to_device(*ops, state0);
    Tensor out = ops->alloc(DType::f32, {T, Hv, Dv});
    ops->gated_delta_rule(to_device(*ops, q), to_device(*ops, k), to_device(*ops, v), to_device(*ops, g),
                          to_device(*ops, beta), layout, state, out, algorithm);
    EXPECT_LE(rel_rms(to_host(out), want), 1e-5) << static_cast<int>(algorithm);
    EXPECT_LE(rel_rms(to_host(state), want_state), 1e-5) << static_cast<int>(algorithm);
  }
}

// The device stopwatch: zero when the step ran nothing on the device, positive and below the host's
// wall time around a step that did, armed afresh by every begin.
TEST(CudaOps, DeviceTimingSpansTheStepsWorkOnly) {
  auto ops = make_cuda_ops(0, Precision::exact);
  ops->begin_device_timing();
  EXPECT_EQ(ops->end_device_timing(), 0.0);
  Tensor x = ops->alloc(DType::f32, {4096, 4096});
  Tensor w = ops->alloc(DType::f32, {4096, 4096});
  Tensor y = ops->alloc(DType::f32, {4096, 4096});
  const auto start = std::chrono::steady_clock::now();
  ops->begin_device_timing();
  ops->linear(x, w, y);
  (void)to_host(*ops, y.rows(0, 1));
  const std::optional<double> device = ops->end_device_timing();
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_TRUE(device.has_value());
  EXPECT_GT(*device, 0.0);
  EXPECT_LE(*device, wall);
  EXPECT_EQ(make_cpu_ops(global_thread_pool())->end_device_timing(), std::nullopt);
}

// The caches live on the device: a zeroed slot holds zeros, and a snapshot taken there restores the
// same values into another slot.
TEST(CudaOps, CacheSlotsZeroAndSnapshotOnTheDevice) {
  auto ops = make_cuda_ops(0, Precision::exact);
  std::mt19937 rng(8);
  CacheShape shape;
  shape.attention_layers = 1, shape.kv_heads = 1, shape.head_dim = 8;
  shape.linear_layers = 2, shape.conv_channels = 5, shape.conv_window = 3;
  shape.value_heads = 2, shape.value_head_dim = 4, shape.key_head_dim = 3;
  ModelCache cache(*ops, shape, 4, 4, 2);
  EXPECT_EQ(cache.kv(0).k.device, Device::cuda);
  const int32_t slot = 0;
  Tensor conv_rows = cache.conv_state(1).rows(slot, slot + 1), delta_rows = cache.delta_state(0).rows(slot, slot + 1);
  const Tensor conv = random_f32(rng, conv_rows.shape), delta = random_f32(rng, delta_rows.shape);
  copy(*ops, conv, conv_rows);
  copy(*ops, delta, delta_rows);
  const ModelCache::StateSnapshot snapshot = cache.snapshot(slot);
  ASSERT_EQ(snapshot.conv.size(), 2u);
  EXPECT_EQ(std::memcmp(snapshot.conv[1].data(), conv.data, conv.nbytes()), 0);
  EXPECT_EQ(std::memcmp(snapshot.delta[0].data(), delta.data, delta.nbytes()), 0);
  cache.zero_slot(slot);
  const Tensor zeroed = to_host(cache.conv_state(1).rows(slot, slot + 1));
  for (int64_t i = 0; i < zeroed.numel(); ++i) EXPECT_EQ(zeroed.ptr<float>()[i], 0.0f);
  const int32_t other = 1;
  cache.restore(other, snapshot);
  EXPECT_EQ(bytes_of(to_host(cache.delta_state(0).rows(other, other + 1))), bytes_of(delta));
}

}  // namespace
}  // namespace qinfer::cuda
