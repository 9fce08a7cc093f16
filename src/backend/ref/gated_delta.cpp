#include "backend/ref/gated_delta.h"
#include "backend/ref/dot.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace qinfer::ref {

void delta_rule_recurrent(const DeltaHead& h, float* S) {
  std::vector<float> delta(h.dv);
  for (int64_t t = 0; t < h.len; ++t) {
    const float* q = h.q + t * h.dk;
    const float* k = h.k + t * h.dk;
    const float* v = h.v + t * h.dv;
    const float decay = std::exp(h.g[t]);
    for (int64_t e = 0; e < h.dv * h.dk; ++e) S[e] *= decay;
    for (int64_t i = 0; i < h.dv; ++i) delta[i] = h.beta[t] * (v[i] - static_cast<float>(dot(S + i * h.dk, k, h.dk)));
    for (int64_t i = 0; i < h.dv; ++i)
      for (int64_t j = 0; j < h.dk; ++j) S[i * h.dk + j] += delta[i] * k[j];
    for (int64_t i = 0; i < h.dv; ++i) h.out[t * h.dv + i] = static_cast<float>(dot(S + i * h.dk, q, h.dk));
  }
}

// Within a chunk (tokens u = 0..n-1, state S0 at its start, G_u = g_0 + … + g_u), unrolling the
// recurrence gives S_t = e^{G_t} S0 + Σ_{u≤t} e^{G_t−G_u} δ_u k_uᵀ with the written values
//   δ_u = β_u v_u − β_u e^{G_u} S0 k_u − Σ_{w<u} A[u,w] δ_w,   A[u,w] = β_u e^{G_u−G_w} (k_u·k_w).
// So (I + A) δ = βv − βe^{G} K S0ᵀ: a unit lower-triangular system. With T = (I + A)⁻¹ (forward
// substitution, the "UT transform"), U = T·(βv) and W = T·(βe^{G}k) give δ = U − W S0ᵀ, and then
//   o_t = e^{G_t} S0 q_t + Σ_{u≤t} e^{G_t−G_u} (q_t·k_u) δ_u,
//   S_n = e^{G_{n−1}} S0 + Σ_u e^{G_{n−1}−G_u} δ_u k_uᵀ.
// (HF torch_chunk_gated_delta_rule names: T = attn, W = k_cumdecay, U = value, δ = v_new.)
// Every exponent is G_later − G_earlier ≤ 0 for g ≤ 0, so nothing overflows.
void delta_rule_chunked(const DeltaHead& h, float* S, int64_t chunk) {
  const int64_t dk = h.dk, dv = h.dv;
  std::vector<double> G(chunk), decay_to_end(chunk);
  std::vector<float> A(chunk * chunk), T(chunk * chunk), U(chunk * dv), W(chunk * dk), delta(chunk * dv),
      bk(chunk * dk), bv(chunk * dv), P(chunk * chunk), S0(dv * dk);
  for (int64_t c0 = 0; c0 < h.len; c0 += chunk) {
    const int64_t n = std::min(chunk, h.len - c0);
    const float* q = h.q + c0 * dk;
    const float* k = h.k + c0 * dk;
    const float* v = h.v + c0 * dv;
    const float* beta = h.beta + c0;
    float* out = h.out + c0 * dv;

    // Cumulative log decay in double: G_t − G_u of nearby tokens must not lose digits to a large |G|.
    double cumulative = 0.0;
    for (int64_t u = 0; u < n; ++u) G[u] = cumulative += h.g[c0 + u];

    for (int64_t u = 0; u < n; ++u)
      for (int64_t w = 0; w < u; ++w)
        A[u * chunk + w] = static_cast<float>(beta[u] * std::exp(G[u] - G[w]) * dot(k + u * dk, k + w * dk, dk));

    // T = (I + A)⁻¹: T[i,i] = 1, T[i,j] = −Σ_{j≤m<i} A[i,m] T[m,j] for j < i.
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < i; ++j) {
        double s = 0.0;
        for (int64_t m = j; m < i; ++m) s += static_cast<double>(A[i * chunk + m]) * T[m * chunk + j];
        T[i * chunk + j] = static_cast<float>(-s);
      }
      T[i * chunk + i] = 1.0f;
    }

    for (int64_t u = 0; u < n; ++u) {
      for (int64_t i = 0; i < dv; ++i) bv[u * dv + i] = beta[u] * v[u * dv + i];
      const double scale = beta[u] * std::exp(G[u]);
      for (int64_t j = 0; j < dk; ++j) bk[u * dk + j] = static_cast<float>(scale * k[u * dk + j]);
    }
    for (int64_t u = 0; u < n; ++u) {
      for (int64_t i = 0; i < dv; ++i) {
        double s = 0.0;
        for (int64_t w = 0; w <= u; ++w) s += static_cast<double>(T[u * chunk + w]) * bv[w * dv + i];
        U[u * dv + i] = static_cast<float>(s);
      }
      for (int64_t j = 0; j < dk; ++j) {
        double s = 0.0;
        for (int64_t w = 0; w <= u; ++w) s += static_cast<double>(T[u * chunk + w]) * bk[w * dk + j];
        W[u * dk + j] = static_cast<float>(s);
      }
    }

    std::copy(S, S + dv * dk, S0.begin());
    for (int64_t u = 0; u < n; ++u)
      for (int64_t i = 0; i < dv; ++i)
        delta[u * dv + i] = U[u * dv + i] - static_cast<float>(dot(W.data() + u * dk, S0.data() + i * dk, dk));

    // Intra-chunk attention P[t,u] = e^{G_t−G_u} (q_t·k_u), u ≤ t.
    for (int64_t t = 0; t < n; ++t)
      for (int64_t u = 0; u <= t; ++u)
        P[t * chunk + u] = static_cast<float>(std::exp(G[t] - G[u]) * dot(q + t * dk, k + u * dk, dk));
    for (int64_t t = 0; t < n; ++t) {
      const double state_scale = std::exp(G[t]);
      for (int64_t i = 0; i < dv; ++i) {
        double s = state_scale * dot(S0.data() + i * dk, q + t * dk, dk);
        for (int64_t u = 0; u <= t; ++u) s += static_cast<double>(P[t * chunk + u]) * delta[u * dv + i];
        out[t * dv + i] = static_cast<float>(s);
      }
    }

    // The state once per chunk, after all of the chunk's outputs have read S0.
    for (int64_t u = 0; u < n; ++u) decay_to_end[u] = std::exp(G[n - 1] - G[u]);
    const double chunk_decay = std::exp(G[n - 1]);
    for (int64_t i = 0; i < dv; ++i) {
      for (int64_t j = 0; j < dk; ++j) {
        double s = chunk_decay * S0[i * dk + j];
        for (int64_t u = 0; u < n; ++u) s += decay_to_end[u] * delta[u * dv + i] * k[u * dk + j];
        S[i * dk + j] = static_cast<float>(s);
      }
    }
  }
}

}  // namespace qinfer::ref
