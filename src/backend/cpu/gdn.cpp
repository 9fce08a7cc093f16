// Gated DeltaNet: the causal depthwise conv1d with its rolling window, and the gated delta rule in
// its two algorithms (qwen-spec §6): token by token, or in chunks of 64 through the WY form, whose
// matrix products go through the gemm kernel instead of streaming the state once per token.
#include <algorithm>
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_ops.h"

namespace qinfer::cpu {

void conv1d_causal(const Context& ctx, const Tensor& x, const Tensor& w, const SeqLayout& layout, Tensor& conv_state,
                   Tensor& out) {
  check_f32("conv1d_causal", "x", x, 2);
  const int64_t T = x.dim(0), C = x.dim(1);
  check_f32("conv1d_causal", "w", w, 2);
  QINFER_CHECK(w.dim(0) == C && w.dim(1) >= 1, "cpu conv1d_causal: w must be [{}, K ≥ 1], got [{}, {}]", C, w.dim(0),
               w.dim(1));
  const int64_t K = w.dim(1), window = K - 1;
  check_f32("conv1d_causal", "conv_state", conv_state, 3);
  check_shape("conv1d_causal", "conv_state", conv_state, {conv_state.dim(0), window, C});
  check_f32("conv1d_causal", "out", out, 2);
  check_shape("conv1d_causal", "out", out, {T, C});
  QINFER_CHECK(out.data != x.data || out.numel() == 0, "cpu conv1d_causal: out must not alias x");
  check_layout("conv1d_causal", layout, T, conv_state.dim(0));
  const auto& cu = layout.cu_seqlens;

  // Taps as rows [K, C], so each tap is one vector multiply-add across the channels.
  std::vector<float> taps(K * C);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < K; ++j) taps[j * C + c] = w.ptr<float>()[c * K + j];
  std::vector<int32_t> seq_of(T);
  for (int64_t s = 0; s < layout.num_seqs(); ++s) std::fill(seq_of.begin() + cu[s], seq_of.begin() + cu[s + 1], s);

  // Outputs first (they read the old windows), then the windows move on.
  ctx.parallel(T, 8192 / std::max<int64_t>(C * K, 1), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t s = seq_of[t], i = t - cu[s];
      const float* state = conv_state.ptr<float>() + layout.state_slot[s] * window * C;
      float* o = out.ptr<float>() + t * C;
      std::fill_n(o, C, 0.0f);
      for (int64_t j = 0; j < K; ++j) {
        const int64_t frame = i - window + j;  // input frame j taps, relative to the sequence start
        const float* src = frame >= 0 ? x.ptr<float>() + (cu[s] + frame) * C : state + (window + frame) * C;
        ctx.k.mul_acc(taps.data() + j * C, src, o, C);
      }
      ctx.k.silu(o, C);
    }
  });
  if (window == 0) return;
  std::vector<float> frames(window * C);
  for (int64_t s = 0; s < layout.num_seqs(); ++s) {
    const int64_t len = cu[s + 1] - cu[s];
    if (len == 0) continue;
    float* state = conv_state.ptr<float>() + layout.state_slot[s] * window * C;
    const int64_t keep = std::max<int64_t>(0, window - len);  // old frames still inside the window
    std::copy_n(state + (window - keep) * C, keep * C, frames.begin());
    std::copy_n(x.ptr<float>() + (cu[s + 1] - (window - keep)) * C, (window - keep) * C, frames.begin() + keep * C);
    std::copy(frames.begin(), frames.end(), state);
  }
}

namespace {

constexpr int64_t kChunk = 64;

struct HeadView {
  const float *q, *k, *v, *g, *beta;  // token 0 of the sequence, at this head
  int64_t q_stride, v_stride, gate_stride;  // elements between consecutive tokens
  float* out;
  int64_t dk, dv;
};

void recurrent(const Context& ctx, const HeadView& h, int64_t len, float* S) {
  for (int64_t t = 0; t < len; ++t)
    ctx.k.gdn_step(S, h.dv, h.dk, h.q + t * h.q_stride, h.k + t * h.q_stride, h.v + t * h.v_stride,
                   std::exp(h.g[t * h.gate_stride]), h.beta[t * h.gate_stride], h.out + t * h.v_stride);
}

// The chunk form of ref/gated_delta.cpp (derivation there). Per chunk of n tokens with state S0 and
// cumulative log decay G (in double: nearby G_t − G_u must not lose digits to a large |G|):
//   A[t,u] = β_t e^{G_t−G_u} (k_t·k_u) for u < t;  (I + A)·[U | W] = [βv | βe^{G}k]  (forward substitution)
//   δ = U − W·S0ᵀ;  o_t = e^{G_t}·S0·q_t + Σ_{u≤t} e^{G_t−G_u} (q_t·k_u) δ_u;
//   S = e^{G_{n−1}}·S0 + Σ_u e^{G_{n−1}−G_u} δ_u k_uᵀ.
void chunked(const Context& ctx, const HeadView& h, int64_t len, float* S) {
  const int64_t dk = h.dk, dv = h.dv;
  thread_local std::vector<float> buf;
  buf.resize(2 * kChunk * kChunk + kChunk * (2 * dv + 3 * dk) + 2 * kChunk);
  float* KK = buf.data();             // [n, n] k_t·k_u, later A
  float* QK = KK + kChunk * kChunk;   // [n, n] q_t·k_u
  float* U = QK + kChunk * kChunk;    // [n, dv] βv solved, then δ
  float* W = U + kChunk * dv;         // [n, dk] βe^{G}k solved
  float* Ut = W + kChunk * dk;        // [dv, n] δᵀ
  float* Kt = Ut + kChunk * dv;       // [dk, n] (e^{G_{n−1}−G_u} k_u)ᵀ
  float* Kc = Kt + kChunk * dk;       // [n, dk] this chunk's keys, contiguous
  float* decay = Kc + kChunk * dk;    // [n] e^{G_t}
  double G[kChunk];
  for (int64_t c0 = 0; c0 < len; c0 += kChunk) {
    const int64_t n = std::min(kChunk, len - c0);
    const float* q = h.q + c0 * h.q_stride;
    const float* v = h.v + c0 * h.v_stride;
    float* out = h.out + c0 * h.v_stride;
    const float* beta = h.beta + c0 * h.gate_stride;
    double cumulative = 0.0;
    for (int64_t t = 0; t < n; ++t) {
      G[t] = cumulative += h.g[(c0 + t) * h.gate_stride];
      decay[t] = static_cast<float>(std::exp(G[t]));
      std::copy_n(h.k + (c0 + t) * h.q_stride, dk, Kc + t * dk);
    }

    ctx.k.gemm_nt(n, n, dk, Kc, dk, Kc, DType::f32, dk, KK, n, 1.0f, false);
    ctx.k.gemm_nt(n, n, dk, q, h.q_stride, Kc, DType::f32, dk, QK, n, 1.0f, false);
    for (int64_t t = 0; t < n; ++t) {
      float* u = U + t * dv;
      float* wt = W + t * dk;
      ctx.k.scale_mul(v + t * h.v_stride, beta[t * h.gate_stride], nullptr, u, dv);
      ctx.k.scale_mul(Kc + t * dk, beta[t * h.gate_stride] * decay[t], nullptr, wt, dk);
      for (int64_t s = 0; s < t; ++s) {
        const float a = static_cast<float>(beta[t * h.gate_stride] * std::exp(G[t] - G[s]) * KK[t * n + s]);
        ctx.k.axpy(-a, U + s * dv, u, dv);
        ctx.k.axpy(-a, W + s * dk, wt, dk);
      }
    }
    ctx.k.gemm_nt(n, dv, dk, W, dk, S, DType::f32, dk, U, dv, -1.0f, true);  // δ = U − W·S0ᵀ

    // Outputs: e^{G_t}·S0·q_t, then the causal intra-chunk part.
    ctx.k.gemm_nt(n, dv, dk, q, h.q_stride, S, DType::f32, dk, out, h.v_stride, 1.0f, false);
    for (int64_t t = 0; t < n; ++t) {
      float* o = out + t * h.v_stride;
      ctx.k.scale(decay[t], o, dv);
      for (int64_t s = 0; s <= t; ++s)
        ctx.k.axpy(static_cast<float>(std::exp(G[t] - G[s]) * QK[t * n + s]), U + s * dv, o, dv);
    }

    // State, after every output of the chunk has read S0.
    for (int64_t s = 0; s < n; ++s) {
      const float f = static_cast<float>(std::exp(G[n - 1] - G[s]));
      for (int64_t i = 0; i < dv; ++i) Ut[i * n + s] = U[s * dv + i];
      for (int64_t j = 0; j < dk; ++j) Kt[j * n + s] = f * Kc[s * dk + j];
    }
    ctx.k.scale(decay[n - 1], S, dv * dk);
    ctx.k.gemm_nt(dv, dk, n, Ut, n, Kt, DType::f32, n, S, dk, 1.0f, true);
  }
}

}  // namespace

void gated_delta_rule(const Context& ctx, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                      const Tensor& beta, const SeqLayout& layout, Tensor& state, Tensor& out,
                      GdnAlgorithm algorithm) {
  constexpr std::string_view op = "gated_delta_rule";
  check_f32(op, "q", q, 3);
  const int64_t T = q.dim(0), Hk = q.dim(1), Dk = q.dim(2);
  check_f32(op, "k", k, 3);
  check_shape(op, "k", k, q.shape);
  check_f32(op, "v", v, 3);
  QINFER_CHECK(v.dim(0) == T, "cpu {}: v has {} tokens, q has {}", op, v.dim(0), T);
  const int64_t Hv = v.dim(1), Dv = v.dim(2);
  QINFER_CHECK(Hk > 0 && Hv % Hk == 0, "cpu {}: {} value heads are not a multiple of {} key heads", op, Hv, Hk);
  check_f32(op, "g", g, 2);
  check_shape(op, "g", g, {T, Hv});
  check_f32(op, "beta", beta, 2);
  check_shape(op, "beta", beta, {T, Hv});
  check_f32(op, "state", state, 4);
  check_shape(op, "state", state, {state.dim(0), Hv, Dv, Dk});
  check_f32(op, "out", out, 3);
  check_shape(op, "out", out, {T, Hv, Dv});
  for (const Tensor* input : {&q, &k, &v})
    QINFER_CHECK(out.data != input->data || out.numel() == 0, "cpu {}: out must not alias q, k or v", op);
  check_layout(op, layout, T, state.dim(0));
  const auto& cu = layout.cu_seqlens;
  const int64_t S = layout.num_seqs(), ratio = Hv / Hk;

  ctx.parallel(S * Hv, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t s = i / Hv, h = i % Hv, len = cu[s + 1] - cu[s], t0 = cu[s];
      const HeadView view{q.ptr<float>() + (t0 * Hk + h / ratio) * Dk,
                          k.ptr<float>() + (t0 * Hk + h / ratio) * Dk,
                          v.ptr<float>() + (t0 * Hv + h) * Dv,
                          g.ptr<float>() + t0 * Hv + h,
                          beta.ptr<float>() + t0 * Hv + h,
                          Hk * Dk,
                          Hv * Dv,
                          Hv,
                          out.ptr<float>() + (t0 * Hv + h) * Dv,
                          Dk,
                          Dv};
      float* St = state.ptr<float>() + (layout.state_slot[s] * Hv + h) * Dv * Dk;
      const bool use_chunks =
          algorithm == GdnAlgorithm::chunked || (algorithm == GdnAlgorithm::automatic && len > kChunk);
      if (use_chunks) {
        chunked(ctx, view, len, St);
      } else {
        recurrent(ctx, view, len, St);
      }
    }
  });
}

}  // namespace qinfer::cpu
