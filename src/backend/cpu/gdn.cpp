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
    const float* state = conv_state.ptr<float>() + layout.state_slot[s] * window * C;
    float* target = conv_state.ptr<float>() + layout.target_slot(s) * window * C;
    const int32_t snapshot = layout.snapshot_slot(s);
    if (len == 0 && target == state && snapshot < 0) continue;
    // The last K−1 frames of [old window | the sequence's first n frames] into `to`.
    auto window_after = [&](int64_t n, float* to) {
      const int64_t keep = std::max<int64_t>(0, window - n);  // old frames still inside the window
      std::copy_n(state + (window - keep) * C, keep * C, frames.begin());
      std::copy_n(x.ptr<float>() + (cu[s] + n - (window - keep)) * C, (window - keep) * C, frames.begin() + keep * C);
      std::copy(frames.begin(), frames.end(), to);
    };
    if (snapshot >= 0) window_after(layout.snapshot_tokens(s), conv_state.ptr<float>() + snapshot * window * C);
    window_after(len, target);
  }
}

namespace {

constexpr int64_t kChunk = 64;

struct HeadView {
  const float *q, *k, *v, *g, *beta;  // token 0 of the sequence, at this head
  int64_t q_stride, v_stride, gate_stride;  // elements between consecutive tokens
  float* out;
  int64_t dk, dv;

  // The view from token n on.
  HeadView from(int64_t n) const {
    HeadView h = *this;
    h.q += n * q_stride;
    h.k += n * q_stride;
    h.v += n * v_stride;
    h.out += n * v_stride;
    h.g += n * gate_stride;
    h.beta += n * gate_stride;
    return h;
  }
};

void recurrent(const Context& ctx, const HeadView& h, int64_t len, float* S) {
  for (int64_t t = 0; t < len; ++t)
    ctx.k.gdn_step(S, h.dv, h.dk, h.q + t * h.q_stride, h.k + t * h.q_stride, h.v + t * h.v_stride,
                   std::exp(h.g[t * h.gate_stride]), h.beta[t * h.gate_stride], h.out + t * h.v_stride);
}

void transpose(const float* src, int64_t rows, int64_t cols, int64_t ld_src, float* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * ld_src + c];
}

// The chunk form of ref/gated_delta.cpp (derivation there). Per chunk of n tokens with state S0 and
// cumulative log decay G (in double: nearby G_t − G_u must not lose digits to a large |G|):
//   A[t,u] = β_t e^{G_t−G_u} (k_t·k_u) for u < t;  T = (I + A)⁻¹;  U = T·(βv);  W = T·(βe^{G}k)
//   δ = U − W·S0ᵀ;  o_t = e^{G_t}·S0·q_t + Σ_{u≤t} e^{G_t−G_u} (q_t·k_u) δ_u;
//   S = e^{G_{n−1}}·S0 + Σ_u e^{G_{n−1}−G_u} δ_u k_uᵀ.
// The state is held transposed (Sᵀ [Dk, Dv]) across the sequence so that every product above is a
// plain row-major matrix product for the broadcast GEMM kernel.
void chunked(const Context& ctx, const HeadView& h, int64_t len, float* S) {
  const int64_t dk = h.dk, dv = h.dv, C = kChunk;
  thread_local std::vector<float> buf;
  buf.resize(dk * dv + 4 * C * C + C * (3 * dv + 4 * dk) + C);
  float* St = buf.data();    // [dk, dv]
  float* KK = St + dk * dv;  // [n, n] k_t·k_u
  float* QK = KK + C * C;    // [n, n] q_t·k_u, then the masked decayed P
  float* Tm = QK + C * C;    // [n, n] (I + A)⁻¹
  float* E = Tm + C * C;     // [n, n] e^{G_t−G_u} for u ≤ t
  float* Bv = E + C * C;     // [n, dv] βv
  float* U = Bv + C * dv;    // [n, dv] T·βv, then δ
  float* Wm = U + C * dv;    // [n, dk] T·βe^{G}k
  float* Bk = Wm + C * dk;   // [n, dk] βe^{G}k
  float* Kc = Bk + C * dk;   // [n, dk] the chunk's keys, contiguous
  float* Kt = Kc + C * dk;   // [dk, n] keys transposed, later scaled by e^{G_{n−1}−G_u}
  float* decay = Kt + C * dk;  // [n] e^{G_t}
  double G[kChunk];
  transpose(S, dv, dk, dk, St);
  for (int64_t c0 = 0; c0 < len; c0 += C) {
    const int64_t n = std::min(C, len - c0);
    const float* q = h.q + c0 * h.q_stride;
    float* out = h.out + c0 * h.v_stride;
    double cumulative = 0.0;
    for (int64_t t = 0; t < n; ++t) {
      G[t] = cumulative += h.g[(c0 + t) * h.gate_stride];
      decay[t] = static_cast<float>(std::exp(G[t]));
      const float beta = h.beta[(c0 + t) * h.gate_stride];
      std::copy_n(h.k + (c0 + t) * h.q_stride, dk, Kc + t * dk);
      ctx.k.scale_mul(Kc + t * dk, beta * decay[t], nullptr, Bk + t * dk, dk);
      ctx.k.scale_mul(h.v + (c0 + t) * h.v_stride, beta, nullptr, Bv + t * dv, dv);
      float* e = E + t * n;  // row t: e^{G_t−G_u}, u ≤ t, through the vector exp
      for (int64_t u = 0; u <= t; ++u) e[u] = static_cast<float>(G[t] - G[u]);
      ctx.k.exp_sub_sum(e, 0.0f, t + 1);
    }
    transpose(Kc, n, dk, dk, Kt);
    ctx.k.gemm_nn(n, n, dk, Kc, dk, Kt, n, KK, n, 1.0f, false);
    ctx.k.gemm_nn(n, n, dk, q, h.q_stride, Kt, n, QK, n, 1.0f, false);

    // T = (I + A)⁻¹ by rows: T[t,:] = e_t − Σ_{u<t} A[t,u]·T[u,:] (T[u,:] is zero past u).
    for (int64_t t = 0; t < n; ++t) {
      float* row = Tm + t * n;
      std::fill_n(row, n, 0.0f);
      const float beta = h.beta[(c0 + t) * h.gate_stride];
      for (int64_t u = 0; u < t; ++u) ctx.k.axpy(-beta * E[t * n + u] * KK[t * n + u], Tm + u * n, row, u + 1);
      row[t] = 1.0f;
    }
    ctx.k.gemm_nn(n, dv, n, Tm, n, Bv, dv, U, dv, 1.0f, false);
    ctx.k.gemm_nn(n, dk, n, Tm, n, Bk, dk, Wm, dk, 1.0f, false);
    ctx.k.gemm_nn(n, dv, dk, Wm, dk, St, dv, U, dv, -1.0f, true);  // δ = U − W·S0ᵀ

    // Outputs: e^{G_t}·S0·q_t plus the causal intra-chunk part P·δ.
    ctx.k.gemm_nn(n, dv, dk, q, h.q_stride, St, dv, out, h.v_stride, 1.0f, false);
    for (int64_t t = 0; t < n; ++t) {
      ctx.k.scale(decay[t], out + t * h.v_stride, dv);
      float* p = QK + t * n;
      for (int64_t u = 0; u < n; ++u) p[u] = u <= t ? p[u] * E[t * n + u] : 0.0f;
    }
    ctx.k.gemm_nn(n, dv, n, QK, n, U, dv, out, h.v_stride, 1.0f, true);

    // State, after every output of the chunk has read S0: Sᵀ = e^{G_{n−1}}·S0ᵀ + (e^{G_{n−1}−G}·K)ᵀ·δ.
    for (int64_t j = 0; j < dk; ++j)
      for (int64_t u = 0; u < n; ++u) Kt[j * n + u] *= E[(n - 1) * n + u];
    ctx.k.scale(decay[n - 1], St, dk * dv);
    ctx.k.gemm_nn(dk, dv, n, Kt, n, U, dv, St, dv, 1.0f, true);
  }
  transpose(St, dk, dv, dv, S);
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
      // The rule runs on the target slot's copy of the state it starts from.
      const float* S0 = state.ptr<float>() + (layout.state_slot[s] * Hv + h) * Dv * Dk;
      float* St = state.ptr<float>() + (layout.target_slot(s) * Hv + h) * Dv * Dk;
      if (St != S0) std::copy_n(S0, Dv * Dk, St);
      const bool use_chunks =
          algorithm == GdnAlgorithm::chunked || (algorithm == GdnAlgorithm::automatic && len > kChunk);
      auto rule = [&](const HeadView& part, int64_t n) {
        if (use_chunks) chunked(ctx, part, n, St);
        else recurrent(ctx, part, n, St);
      };
      if (const int32_t snapshot = layout.snapshot_slot(s); snapshot >= 0) {
        // The tokens before the snapshot, the state as it is then, the rest.
        const int64_t at = layout.snapshot_tokens(s);
        rule(view, at);
        std::copy_n(St, Dv * Dk, state.ptr<float>() + (snapshot * Hv + h) * Dv * Dk);
        rule(view.from(at), len - at);
      } else {
        rule(view, len);
      }
    }
  });
}

}  // namespace qinfer::cpu
