// Gated DeltaNet on the device: the causal depthwise conv1d over each sequence's rolling window, and
// the recurrent (token by token) gated delta rule with the state held in registers.
#include "backend/cuda/common.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kThreads = 256;

// out[t, c] = silu(Σ_j w[c, j] · frame(t − K + 1 + j)), frames before the sequence's start from its
// slot's window. Reads only: the windows move on in the next kernel.
__global__ void conv1d_kernel(const float* __restrict__ x, const float* __restrict__ w, SeqArrays L, int64_t T,
                              int64_t C, int K, const float* __restrict__ conv_state, float* __restrict__ out) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int window = K - 1;
  for (int64_t idx = blockIdx.x * int64_t{kThreads} + threadIdx.x; idx < T * C; idx += int64_t{gridDim.x} * kThreads) {
    const int64_t t = idx / C, c = idx % C;
    const int s = L.token_seq[t];
    const int64_t first = L.cu_seqlens[s], i = t - first;
    const float* state = conv_state + static_cast<int64_t>(L.state_slot[s]) * window * C;
    float acc = 0.0f;
    for (int j = 0; j < K; ++j) {
      const int64_t frame = i - window + j;  // relative to the sequence's first token
      const float value = frame >= 0 ? x[(first + frame) * C + c] : state[(window + frame) * C + c];
      acc = fmaf(w[c * K + j], value, acc);
    }
    out[idx] = silu(acc);
  }
}

// Each (sequence, channel) keeps its last K − 1 frames of [old window | sequence], in its target slot.
// Frame i of the new window is frame len + i of that concatenation: in place, ascending i only reads
// frames not yet overwritten.
__global__ void conv1d_window_kernel(const float* __restrict__ x, SeqArrays L, int64_t C, int K, float* conv_state) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int window = K - 1;
  for (int64_t idx = blockIdx.x * int64_t{kThreads} + threadIdx.x; idx < L.num_seqs * C;
       idx += int64_t{gridDim.x} * kThreads) {
    const int64_t s = idx / C, c = idx % C;
    const int64_t first = L.cu_seqlens[s], len = L.cu_seqlens[s + 1] - first;
    const float* state = conv_state + static_cast<int64_t>(L.state_slot[s]) * window * C;
    float* target = conv_state + static_cast<int64_t>(L.state_to[s]) * window * C;
    const int32_t snapshot = L.snapshot_to[s];
    if (len == 0 && target == state && snapshot < 0) continue;
    if (snapshot >= 0) {  // before the target's frames move on (in place, they are the ones read)
      float* frames = conv_state + static_cast<int64_t>(snapshot) * window * C;
      for (int i = 0; i < window; ++i) {
        const int64_t src = L.snapshot_at[s] + i;
        frames[i * C + c] = src < window ? state[src * C + c] : x[(first + src - window) * C + c];
      }
    }
    for (int i = 0; i < window; ++i) {
      const int64_t src = len + i;
      target[i * C + c] = src < window ? state[src * C + c] : x[(first + src - window) * C + c];
    }
  }
}

constexpr int kDeltaWarps = 4;
constexpr int kDeltaRowsPerWarp = 4;
constexpr int kDeltaRowsPerBlock = kDeltaWarps * kDeltaRowsPerWarp;

// One block per (sequence, value head, run of 16 state rows), reading the state from the sequence's
// slot and leaving it in its target slot (and its snapshot slot, if any: the state after all its
// tokens). State row i (over Dk) is independent of the other rows given the token's k, q, v_i, g, β,
// so each warp owns 4 rows, each lane kPerLane of their columns, and every step is a pair of warp
// reductions per row:
//   S ← e^g S;  δ_i = β (v_i − S_i·k);  S_i ← S_i + δ_i k;  o_i = S_i·q.
template <int kPerLane>
__global__ void __launch_bounds__(kDeltaWarps* kWarp, 4)
    delta_recurrent_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                           const float* __restrict__ g, const float* __restrict__ beta, SeqArrays L,
                           const int32_t* __restrict__ seqs, int64_t Hk, int64_t Hv, int Dk, int Dv,
                           float* __restrict__ state, float* __restrict__ out) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int s = seqs[blockIdx.x];
  const int64_t h = blockIdx.y, kh = h / (Hv / Hk);
  const int row0 = (blockIdx.z * kDeltaWarps + warp) * kDeltaRowsPerWarp;
  if (row0 >= Dv) return;  // whole warps only; the kernel has no block barriers
  const float* S = state + (static_cast<int64_t>(L.state_slot[s]) * Hv + h) * Dv * Dk;
  float* S_to = state + (static_cast<int64_t>(L.state_to[s]) * Hv + h) * Dv * Dk;
  float* S_also = L.snapshot_to[s] < 0 ? nullptr : state + (static_cast<int64_t>(L.snapshot_to[s]) * Hv + h) * Dv * Dk;

  float st[kDeltaRowsPerWarp][kPerLane];
#pragma unroll
  for (int r = 0; r < kDeltaRowsPerWarp; ++r)
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int i = row0 + r, j = lane + e * kWarp;
      st[r][e] = i < Dv && j < Dk ? S[static_cast<int64_t>(i) * Dk + j] : 0.0f;
    }

  const int begin = L.cu_seqlens[s], end = L.cu_seqlens[s + 1];
  for (int64_t t = begin; t < end; ++t) {
    const float* kt = k + (t * Hk + kh) * Dk;
    const float* qt = q + (t * Hk + kh) * Dk;
    float kr[kPerLane], qr[kPerLane];
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int j = lane + e * kWarp;
      kr[e] = j < Dk ? kt[j] : 0.0f;
      qr[e] = j < Dk ? qt[j] : 0.0f;
    }
    const float decay = expf(g[t * Hv + h]), b = beta[t * Hv + h];
    const float* vt = v + (t * Hv + h) * Dv;
    float* ot = out + (t * Hv + h) * Dv;
#pragma unroll
    for (int r = 0; r < kDeltaRowsPerWarp; ++r) {
      const int i = row0 + r;
      float kv = 0.0f;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        st[r][e] *= decay;
        kv = fmaf(st[r][e], kr[e], kv);
      }
      kv = warp_sum(kv);
      const float delta = b * ((i < Dv ? vt[i] : 0.0f) - kv);
      float o = 0.0f;
#pragma unroll
      for (int e = 0; e < kPerLane; ++e) {
        st[r][e] = fmaf(delta, kr[e], st[r][e]);
        o = fmaf(st[r][e], qr[e], o);
      }
      o = warp_sum(o);
      if (lane == 0 && i < Dv) ot[i] = o;
    }
  }

#pragma unroll
  for (int r = 0; r < kDeltaRowsPerWarp; ++r)
#pragma unroll
    for (int e = 0; e < kPerLane; ++e) {
      const int i = row0 + r, j = lane + e * kWarp;
      if (i < Dv && j < Dk) {
        S_to[static_cast<int64_t>(i) * Dk + j] = st[r][e];
        if (S_also) S_also[static_cast<int64_t>(i) * Dk + j] = st[r][e];
      }
    }
}

}  // namespace

void launch_conv1d_causal(const float* x, const float* w, const SeqArrays& layout, int64_t T, int64_t C, int64_t K,
                          float* conv_state, float* out, cudaStream_t stream) {
  if (C == 0) return;
  if (T > 0) {
    launch_overlapped(conv1d_kernel, grid_for(T * C, kThreads), kThreads, 0, stream, x, w, layout, T, C, static_cast<int>(K),
                                                                       conv_state, out);
    QINFER_CUDA_CHECK_LAUNCH("conv1d_kernel<<<>>>");
  }
  if (K > 1 && layout.num_seqs > 0) {
    launch_overlapped(conv1d_window_kernel, grid_for(layout.num_seqs * C, kThreads), kThreads, 0, stream, x, layout, C,
                                                                                           static_cast<int>(K), conv_state);
    QINFER_CUDA_CHECK_LAUNCH("conv1d_window_kernel<<<>>>");
  }
}

void launch_delta_rule_recurrent(const float* q, const float* k, const float* v, const float* g, const float* beta,
                                 const SeqArrays& layout, const int32_t* seqs, int64_t num_seqs, int64_t Hk, int64_t Hv,
                                 int64_t Dk, int64_t Dv, float* state, float* out, cudaStream_t stream) {
  if (num_seqs == 0 || Hv == 0 || Dv == 0) return;
  if (Dk > kDeltaMaxDk) throw_error("cuda gated_delta_rule: key head dim above 256");
  const dim3 grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>(Hv),
                  static_cast<unsigned>((Dv + kDeltaRowsPerBlock - 1) / kDeltaRowsPerBlock));
  auto launch = [&](auto kernel) {
    launch_overlapped(kernel, grid, kDeltaWarps * kWarp, 0, stream, q, k, v, g, beta, layout, seqs, Hk, Hv, static_cast<int>(Dk),
                                                     static_cast<int>(Dv), state, out);
  };
  if (Dk <= 32) launch(delta_recurrent_kernel<1>);
  else if (Dk <= 64) launch(delta_recurrent_kernel<2>);
  else if (Dk <= 128) launch(delta_recurrent_kernel<4>);
  else launch(delta_recurrent_kernel<8>);
  QINFER_CUDA_CHECK_LAUNCH("delta_recurrent_kernel<<<>>>");
}

}  // namespace qinfer::cuda
