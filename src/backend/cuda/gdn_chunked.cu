// The gated delta rule in its chunked WY / UT-transform form (ref/gated_delta.cpp derives it). Per
// chunk of n ≤ 64 tokens with state S0 at its start and G_u = g_0 + … + g_u:
//   A[u,w] = β_u e^{G_u−G_w} (k_u·k_w) for w < u,   T = (I + A)⁻¹ (forward substitution),
//   δ = T · R,  R[w] = β_w (v_w − e^{G_w} S0 k_w)   (= U − W S0ᵀ of ref, by linearity),
//   o_t = e^{G_t} S0 q_t + Σ_{u≤t} e^{G_t−G_u} (q_t·k_u) δ_u,
//   S_n = e^{G_{n−1}} S0 + Σ_u e^{G_{n−1}−G_u} δ_u k_uᵀ.
// Every quantity is independent across state rows (the value dim) except A and T, so a block takes
// one (sequence, value head, run of 32 state rows) and recomputes A and T itself; its state rows,
// the chunk's keys and queries, R / δ and A / T / P live in shared memory.
#include "backend/cuda/common.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kC = static_cast<int>(kDeltaChunk);
constexpr int kDvTile = 32;
constexpr int kPerThread = kC * kDvTile / kThreads;  // δ entries each thread holds between phases
static_assert(kThreads >= kC, "the triangular solve gives each column of T one thread");

struct Layout {
  int pk, pr, pm;  // row pitches (odd: column walks across rows hit distinct banks)
  int64_t floats;  // after the kC doubles of G
};

__host__ __device__ inline Layout layout_for(int Dk) {
  Layout l{Dk + 1, kDvTile + 1, kC + 1, 0};
  l.floats = int64_t{kDvTile} * l.pk + 2 * int64_t{kC} * l.pk + int64_t{kC} * l.pr + int64_t{kC} * l.pm + 3 * kC;
  return l;
}

__global__ void __launch_bounds__(kThreads, 1)
    delta_chunked_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                         const float* __restrict__ g, const float* __restrict__ beta, SeqArrays L,
                         const int32_t* __restrict__ seqs, int64_t Hk, int64_t Hv, int Dk, int Dv,
                         float* __restrict__ state, float* __restrict__ out) {
  extern __shared__ double chunk_smem[];
  const Layout lay = layout_for(Dk);
  const int pk = lay.pk, pr = lay.pr, pm = lay.pm;
  double* G = chunk_smem;                               // [kC] cumulative log decay
  float* S = reinterpret_cast<float*>(G + kC);         // [kDvTile, pk] this block's state rows
  float* K = S + kDvTile * pk;                          // [kC, pk]
  float* Q = K + kC * pk;                               // [kC, pk]
  float* R = Q + kC * pk;                               // [kC, pr]: v, then R, then δ
  float* M = R + kC * pr;                               // [kC, pm]: I + A, then T, then P
  float* b = M + kC * pm;                               // [kC] β
  float* eG = b + kC;                                   // [kC] e^{G_u}
  float* to_end = eG + kC;                              // [kC] e^{G_{n−1} − G_u}

  const int tid = threadIdx.x;
  const int s = seqs[blockIdx.x];
  const int64_t h = blockIdx.y, kh = h / (Hv / Hk);
  const int i0 = blockIdx.z * kDvTile, dvt = min(kDvTile, Dv - i0);
  float* Sg = state + (static_cast<int64_t>(L.state_slot[s]) * Hv + h) * Dv * Dk;
  for (int idx = tid; idx < dvt * Dk; idx += kThreads) {
    const int i = idx / Dk, j = idx % Dk;
    S[i * pk + j] = Sg[static_cast<int64_t>(i0 + i) * Dk + j];
  }

  const int64_t first = L.cu_seqlens[s];
  const int len = L.cu_seqlens[s + 1] - L.cu_seqlens[s];
  for (int c0 = 0; c0 < len; c0 += kC) {
    const int n = min(kC, len - c0);
    const int64_t t0 = first + c0;  // the chunk's first token in the batch
    __syncthreads();  // the previous chunk is done with K, Q, R, M
    for (int idx = tid; idx < n * Dk; idx += kThreads) {
      const int u = idx / Dk, j = idx % Dk;
      const int64_t src = ((t0 + u) * Hk + kh) * Dk + j;
      K[u * pk + j] = k[src];
      Q[u * pk + j] = q[src];
    }
    for (int idx = tid; idx < n * dvt; idx += kThreads) {
      const int u = idx / dvt, i = idx % dvt;
      R[u * pr + i] = v[((t0 + u) * Hv + h) * Dv + i0 + i];
    }
    for (int u = tid; u < n; u += kThreads) b[u] = beta[(t0 + u) * Hv + h];
    if (tid == 0) {
      // In double: G_t − G_u of nearby tokens must not lose digits to a large |G|.
      double cumulative = 0.0;
      for (int u = 0; u < n; ++u) G[u] = cumulative += g[(t0 + u) * Hv + h];
    }
    __syncthreads();

    for (int u = tid; u < n; u += kThreads) {
      eG[u] = static_cast<float>(exp(G[u]));
      to_end[u] = static_cast<float>(exp(G[n - 1] - G[u]));
    }
    // I + A, lower triangle.
    for (int idx = tid; idx < n * n; idx += kThreads) {
      const int u = idx / n, w = idx % n;
      float a = w == u ? 1.0f : 0.0f;
      if (w < u) {
        float dot = 0.0f;
        for (int j = 0; j < Dk; ++j) dot = fmaf(K[u * pk + j], K[w * pk + j], dot);
        a = static_cast<float>(static_cast<double>(b[u]) * exp(G[u] - G[w]) * dot);
      }
      M[u * pm + w] = a;
    }
    __syncthreads();

    // T = (I + A)⁻¹ in place, row by row: T[i,j] = −Σ_{j≤m<i} A[i,m] T[m,j] (T[j,j] = 1 on the
    // diagonal, rows above i already T, row i still A until its new values are written).
    for (int i = 1; i < n; ++i) {
      double sum = 0.0;
      if (tid < i)
        for (int m = tid; m < i; ++m) sum += static_cast<double>(M[i * pm + m]) * M[m * pm + tid];
      __syncthreads();
      if (tid < i) M[i * pm + tid] = static_cast<float>(-sum);
      __syncthreads();
    }

    // R[w, i] = β_w v_w,i − β_w e^{G_w} (S0 k_w)_i, each entry in place.
    for (int idx = tid; idx < n * dvt; idx += kThreads) {
      const int w = idx / dvt, i = idx % dvt;
      float dot = 0.0f;
      for (int j = 0; j < Dk; ++j) dot = fmaf(K[w * pk + j], S[i * pk + j], dot);
      R[w * pr + i] = b[w] * R[w * pr + i] - b[w] * eG[w] * dot;
    }
    __syncthreads();

    // δ = T · R, through registers: row u of δ reads rows w ≤ u of R.
    float delta[kPerThread];
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const int idx = tid + r * kThreads;
      delta[r] = 0.0f;
      if (idx < n * dvt) {
        const int u = idx / dvt, i = idx % dvt;
        float acc = 0.0f;
        for (int w = 0; w <= u; ++w) acc = fmaf(M[u * pm + w], R[w * pr + i], acc);
        delta[r] = acc;
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kPerThread; ++r) {
      const int idx = tid + r * kThreads;
      if (idx < n * dvt) R[(idx / dvt) * pr + idx % dvt] = delta[r];
    }
    // P[t, u] = e^{G_t−G_u} (q_t·k_u), u ≤ t (T is no longer needed).
    for (int idx = tid; idx < n * n; idx += kThreads) {
      const int t = idx / n, u = idx % n;
      float p = 0.0f;
      if (u <= t) {
        float dot = 0.0f;
        for (int j = 0; j < Dk; ++j) dot = fmaf(Q[t * pk + j], K[u * pk + j], dot);
        p = static_cast<float>(exp(G[t] - G[u]) * dot);
      }
      M[t * pm + u] = p;
    }
    __syncthreads();

    for (int idx = tid; idx < n * dvt; idx += kThreads) {
      const int t = idx / dvt, i = idx % dvt;
      float from_state = 0.0f;
      for (int j = 0; j < Dk; ++j) from_state = fmaf(S[i * pk + j], Q[t * pk + j], from_state);
      float o = eG[t] * from_state;
      for (int u = 0; u <= t; ++u) o = fmaf(M[t * pm + u], R[u * pr + i], o);
      out[((t0 + t) * Hv + h) * Dv + i0 + i] = o;
    }
    __syncthreads();  // every output has read S0

    const float chunk_decay = eG[n - 1];
    for (int idx = tid; idx < dvt * Dk; idx += kThreads) {
      const int i = idx / Dk, j = idx % Dk;
      float acc = chunk_decay * S[i * pk + j];
      for (int u = 0; u < n; ++u) acc = fmaf(to_end[u] * R[u * pr + i], K[u * pk + j], acc);
      S[i * pk + j] = acc;
    }
  }
  __syncthreads();
  for (int idx = tid; idx < dvt * Dk; idx += kThreads) {
    const int i = idx / Dk, j = idx % Dk;
    Sg[static_cast<int64_t>(i0 + i) * Dk + j] = S[i * pk + j];
  }
}

}  // namespace

size_t delta_chunked_shared_bytes(int64_t Dk, int64_t /*Dv*/) {
  return kC * sizeof(double) + static_cast<size_t>(layout_for(static_cast<int>(Dk)).floats) * sizeof(float);
}

void launch_delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                               const SeqArrays& layout, const int32_t* seqs, int64_t num_seqs, int64_t Hk, int64_t Hv,
                               int64_t Dk, int64_t Dv, float* state, float* out, cudaStream_t stream) {
  if (num_seqs == 0 || Hv == 0 || Dv == 0) return;
  const size_t bytes = delta_chunked_shared_bytes(Dk, Dv);
  if (bytes > 48 * 1024)
    QINFER_CUDA_CHECK(
        cudaFuncSetAttribute(delta_chunked_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  const dim3 grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>(Hv),
                  static_cast<unsigned>((Dv + kDvTile - 1) / kDvTile));
  delta_chunked_kernel<<<grid, kThreads, bytes, stream>>>(q, k, v, g, beta, layout, seqs, Hk, Hv, static_cast<int>(Dk),
                                                          static_cast<int>(Dv), state, out);
  QINFER_CUDA_CHECK_LAUNCH("delta_chunked_kernel<<<>>>");
}

}  // namespace qinfer::cuda
