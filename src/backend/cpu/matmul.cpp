// linear and moe_experts: y = x·wᵀ split over the output rows (weight rows) across the pool, so every
// thread streams its own contiguous slice of the weights once per call.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace qinfer::cpu {

void gemm_rows(const Context& ctx, int64_t M, int64_t n0, int64_t n1, int64_t K, const float* A, const void* B,
               DType b_dtype, float* C, int64_t ldc) {
  const auto* rows = static_cast<const char*>(B) + storage_bytes(b_dtype, static_cast<uint64_t>(n0 * K));
  ctx.k.gemm_nt(M, n1 - n0, K, A, K, rows, b_dtype, K, C + n0, ldc, 1.0f, false);
}

void gemm(const Context& ctx, int64_t M, int64_t N, int64_t K, const float* A, const void* B, DType b_dtype,
          float* C) {
  if (M == 0 || N == 0) return;
  // Below ~64k multiply-adds a thread hand-off costs more than it saves.
  const int64_t serial_below = M * K >= (1 << 16) ? 0 : ((1 << 16) + M * K - 1) / std::max<int64_t>(M * K, 1);
  ctx.parallel(N, serial_below, [&](int64_t n0, int64_t n1) { gemm_rows(ctx, M, n0, n1, K, A, B, b_dtype, C, N); });
}

namespace {

// A piece of one expert's weight matrix: rows [r0, r1) of `which` (gate 0 / up 1 / down 2).
struct Segment {
  int32_t expert, which;
  int64_t r0, r1;
};

// Splits each active expert's rows into pieces of about equal cost (weight rows × tokens, plus the
// streaming of the rows themselves), so an even split of the list by count balances the threads.
std::vector<Segment> make_segments(const std::vector<int32_t>& experts, const std::vector<int64_t>& count,
                                   int64_t rows, int num_matrices, int which0, size_t threads) {
  double total = 0.0;
  for (int32_t e : experts) total += static_cast<double>(rows) * num_matrices * (4.0 + count[e]);
  const double target = std::max(1.0, total / static_cast<double>(threads * 4));
  std::vector<Segment> segments;
  for (int32_t e : experts) {
    const double row_cost = 4.0 + count[e];
    const int64_t piece = std::clamp<int64_t>(static_cast<int64_t>(target / row_cost), 16, std::max<int64_t>(rows, 1));
    for (int which = which0; which < which0 + num_matrices; ++which)
      for (int64_t r0 = 0; r0 < rows; r0 += piece) segments.push_back({e, which, r0, std::min(rows, r0 + piece)});
  }
  return segments;
}

// One block of tokens: x [T, H], ids / weights [T, k], out [T, H] as raw rows.
void moe_block(const Context& ctx, int64_t T, int64_t k, int64_t H, int64_t I, int64_t E, const float* x,
               const int32_t* id, const float* weights, const Tensor* matrices[3], float* out) {
  // Rows of the grouped batch: expert e owns [offset[e], offset[e] + count[e]).
  const int64_t R = T * k;
  std::vector<int64_t> count(E, 0), offset(E + 1, 0), row_of(R);
  std::vector<int32_t> token_of(R), experts;
  for (int64_t i = 0; i < R; ++i) ++count[id[i]];
  for (int64_t e = 0; e < E; ++e) {
    offset[e + 1] = offset[e] + count[e];
    if (count[e] > 0) experts.push_back(static_cast<int32_t>(e));
  }
  std::vector<int64_t> fill(offset.begin(), offset.end() - 1);
  for (int64_t i = 0; i < R; ++i) {
    row_of[i] = fill[id[i]]++;
    token_of[row_of[i]] = static_cast<int32_t>(i / k);
  }

  // Scratch reused across calls (the workers below see it through these pointers, not by name).
  thread_local std::vector<float> scratch;
  scratch.resize(R * (2 * H + 2 * I));
  float* xg = scratch.data();   // [R, H]: each row's token
  float* act = xg + R * H;      // [R, I]: gate projections, then silu(gate)·up
  float* up_out = act + R * I;  // [R, I]
  float* yd = up_out + R * I;   // [R, H]: each row's expert output
  ctx.parallel(R, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) std::copy_n(x + token_of[r] * H, H, xg + r * H);
  });

  auto run = [&](const std::vector<Segment>& segments) {
    ctx.parallel(static_cast<int64_t>(segments.size()), 1, [&](int64_t s0, int64_t s1) {
      for (int64_t s = s0; s < s1; ++s) {
        const Segment& seg = segments[s];
        const Tensor& w = *matrices[seg.which];
        const int64_t rows = seg.which == 2 ? H : I, cols = seg.which == 2 ? I : H;
        const auto* base = w.ptr<char>() + storage_bytes(w.dtype, static_cast<uint64_t>(seg.expert * rows * cols));
        const int64_t row0 = offset[seg.expert], n = count[seg.expert];
        if (seg.which == 2) {
          gemm_rows(ctx, n, seg.r0, seg.r1, I, act + row0 * I, base, w.dtype, yd + row0 * H, H);
        } else {
          float* dst = seg.which == 0 ? act : up_out;
          gemm_rows(ctx, n, seg.r0, seg.r1, H, xg + row0 * H, base, w.dtype, dst + row0 * I, I);
        }
      }
    });
  };
  run(make_segments(experts, count, I, 2, 0, ctx.pool.size()));
  ctx.parallel(R, 4096 / std::max<int64_t>(I, 1), [&](int64_t r0, int64_t r1) {
    ctx.k.silu_mul(act + r0 * I, up_out + r0 * I, act + r0 * I, (r1 - r0) * I);
  });
  run(make_segments(experts, count, H, 1, 2, ctx.pool.size()));

  ctx.parallel(T, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* o = out + t * H;
      std::fill_n(o, H, 0.0f);
      for (int64_t j = 0; j < k; ++j) ctx.k.axpy(weights[t * k + j], yd + row_of[t * k + j] * H, o, H);
    }
  });
}

}  // namespace

// Tokens are grouped by expert (each (token, slot) pair becomes one row of its expert's batch), every
// expert runs as a small GEMM over its rows, and each token then sums its k rows in slot order, so
// the result does not depend on the threading. Long batches go in blocks of tokens that keep the
// grouped rows' scratch under ~256 MiB.
void moe_experts(const Context& ctx, const Tensor& x, const Tensor& ids, const Tensor& weights, const Tensor& gate,
                 const Tensor& up, const Tensor& down, Tensor& out) {
  check_f32("moe_experts", "x", x, 2);
  const int64_t T = x.dim(0), H = x.dim(1);
  check_tensor("moe_experts", "ids", ids, 2);
  QINFER_CHECK(ids.dtype == DType::i32 && ids.dim(0) == T, "cpu moe_experts: ids must be i32 [{}, k]", T);
  const int64_t k = ids.dim(1);
  check_f32("moe_experts", "weights", weights, 2);
  check_shape("moe_experts", "weights", weights, {T, k});
  check_weight("moe_experts", "gate", gate, 3);
  const int64_t E = gate.dim(0), I = gate.dim(1);
  check_shape("moe_experts", "gate", gate, {E, I, H});
  check_weight("moe_experts", "up", up, 3);
  check_shape("moe_experts", "up", up, {E, I, H});
  check_weight("moe_experts", "down", down, 3);
  check_shape("moe_experts", "down", down, {E, H, I});
  check_f32("moe_experts", "out", out, 2);
  check_shape("moe_experts", "out", out, {T, H});
  QINFER_CHECK(out.data != x.data || out.numel() == 0, "cpu moe_experts: out must not alias x");
  const int32_t* id = ids.ptr<int32_t>();
  for (int64_t i = 0; i < T * k; ++i)
    QINFER_CHECK(id[i] >= 0 && id[i] < E, "cpu moe_experts: ids[{}, {}] = {} is outside the {} experts", i / k, i % k,
                 id[i], E);
  if (T == 0 || k == 0) {
    std::fill_n(out.ptr<float>(), out.numel(), 0.0f);
    return;
  }
  const Tensor* matrices[3] = {&gate, &up, &down};
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 26) / (k * (2 * H + 2 * I)));
  for (int64_t t0 = 0; t0 < T; t0 += block) {
    const int64_t n = std::min(block, T - t0);
    moe_block(ctx, n, k, H, I, E, x.ptr<float>() + t0 * H, id + t0 * k, weights.ptr<float>() + t0 * k, matrices,
              out.ptr<float>() + t0 * H);
  }
}

}  // namespace qinfer::cpu
