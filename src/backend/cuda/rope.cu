// Rotary embeddings in place, rotate-half pairing over the first rotary_dim features, MRoPE axes per
// frequency, optionally after an RMSNorm of each head (the q/k norms). The angle follows HF's f32
// arithmetic (the host computed inv_freq the same way), and cos and sin are scaled by the attention
// factor as HF scales them.
#include "backend/cuda/common.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarpsPerBlock = kThreads / kWarp;
constexpr int kMaxPassVecs = 8;  // features past rotary_dim each lane holds: up to 256 of them

// One launch's operands: heads of up to two tensors of one batch (q, then k) x[p] [T, heads[p],
// head_dim], each with its norm weight w[p] [head_dim] when normed; with a pool, the second tensor's
// rotated heads and v's are also written to the pool rows dst_rows[t] (kv_store's layout).
struct Heads {
  float* x[2];
  const float* w[2];
  int64_t heads[2];
  float eps;
  const int32_t* positions;
  int64_t T, head_dim, half;
  const float* v;            // [T, heads[1], head_dim] when storing
  const int32_t* dst_rows;   // [T]: pool row of each token
  KvPoolView pool;           // [rows, heads[1], head_dim] of K and of V; none (null) for no store
};

// One warp per (token, head), the head in registers: lane l holds the rotation pairs (x[i],
// x[i + half]) of frequencies i = l + 32k (k < kFreqs) and, when normed, the features past
// rotary_dim j = 2·half + l + 32k (k < kPass). Loads and stores are coalesced; every element is
// read and written by one lane. Pool: the KV pool's element type, void for no store.
template <bool kNorm, int kFreqs, int kPass, typename Pool>
__global__ void __launch_bounds__(kThreads) rope_kernel(const Heads h, const __grid_constant__ RopeTable table) {
  constexpr bool kStore = !std::is_void_v<Pool>;
  using Elem = std::conditional_t<kStore, Pool, float>;
  Elem* const pool_k = static_cast<Elem*>(h.pool.k);
  Elem* const pool_v = static_cast<Elem*>(h.pool.v);
  allow_next_kernel();
  wait_for_previous_kernel();
  const int lane = threadIdx.x % kWarp;
  const int64_t per_token = h.heads[0] + h.heads[1], rows = h.T * per_token, half = h.half;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp; row < rows;
       row += static_cast<int64_t>(gridDim.x) * kWarpsPerBlock) {
    const int64_t t = row / per_token, slot = row % per_token;
    const int p = slot < h.heads[0] ? 0 : 1;
    const int64_t head = p == 0 ? slot : slot - h.heads[0];
    float* xh = h.x[p] + (t * h.heads[p] + head) * h.head_dim;
    const float* __restrict__ w = h.w[p];
    // Where this head's key and value go in the pool (the second tensor's heads only).
    const bool store = kStore && p == 1;
    const int64_t pool_offset = store ? (static_cast<int64_t>(h.dst_rows[t]) * h.heads[1] + head) * h.head_dim : 0;
    // Every load of the row is issued before the first result is needed (a decode step runs this on
    // a few dozen heads: its time is its chain of memory round trips), v's included.
    constexpr int kValues = 2 * kFreqs + kPass;  // ≥ head_dim / 32
    float a[kFreqs], b[kFreqs], wa[kFreqs], wb[kFreqs], angle[kFreqs], pass[kPass > 0 ? kPass : 1];
    float values[kStore ? kValues : 1];
    if (store) {
      const float* vh = h.v + (t * h.heads[1] + head) * h.head_dim;
#pragma unroll
      for (int k = 0; k < kValues; ++k) {
        const int64_t j = lane + k * kWarp;
        values[k] = j < h.head_dim ? vh[j] : 0.0f;
      }
    }
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kFreqs; ++k) {
      const int i = lane + k * kWarp;
      a[k] = b[k] = angle[k] = wa[k] = wb[k] = 0.0f;
      if (i >= half) continue;
      a[k] = xh[i];
      b[k] = xh[i + half];
      if constexpr (kNorm) wa[k] = w[i], wb[k] = w[i + half];
      angle[k] = static_cast<float>(h.positions[table.axis[i] * h.T + t]) * table.inv_freq[i];
      sum = fmaf(a[k], a[k], sum);
      sum = fmaf(b[k], b[k], sum);
    }
#pragma unroll
    for (int k = 0; k < kPass; ++k) {
      const int64_t j = 2 * half + lane + k * kWarp;
      pass[k] = j < h.head_dim ? xh[j] : 0.0f;
      sum = fmaf(pass[k], pass[k], sum);
    }
    if constexpr (kNorm) {
      // rms_norm's arithmetic: x · (1 / rms) · w.
      const float inv_rms = 1.0f / sqrtf(warp_sum(sum) / static_cast<float>(h.head_dim) + h.eps);
#pragma unroll
      for (int k = 0; k < kFreqs; ++k) {
        const int i = lane + k * kWarp;
        if (i >= half) continue;
        a[k] = a[k] * inv_rms * wa[k];
        b[k] = b[k] * inv_rms * wb[k];
      }
#pragma unroll
      for (int k = 0; k < kPass; ++k) {
        const int64_t j = 2 * half + lane + k * kWarp;
        if (j >= h.head_dim) continue;
        const float value = pass[k] * inv_rms * w[j];
        xh[j] = value;
        if (store) pool_k[pool_offset + j] = to_kv<Elem>(value);
      }
    } else if (store) {
#pragma unroll
      for (int k = 0; k < kPass; ++k) {
        const int64_t j = 2 * half + lane + k * kWarp;
        if (j < h.head_dim) pool_k[pool_offset + j] = to_kv<Elem>(pass[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < kFreqs; ++k) {
      const int i = lane + k * kWarp;
      if (i >= half) continue;
      float s, c;
      sincosf(angle[k], &s, &c);
      s *= table.attention_factor, c *= table.attention_factor;
      const float lo = a[k] * c - b[k] * s, hi = b[k] * c + a[k] * s;
      xh[i] = lo;
      xh[i + half] = hi;
      if (store) {
        pool_k[pool_offset + i] = to_kv<Elem>(lo);
        pool_k[pool_offset + i + half] = to_kv<Elem>(hi);
      }
    }
    if constexpr (kStore) {
      if (store) {
#pragma unroll
        for (int k = 0; k < kValues; ++k) {
          const int64_t j = lane + k * kWarp;
          if (j < h.head_dim) pool_v[pool_offset + j] = to_kv<Elem>(values[k]);
        }
      }
    }
  }
}

template <bool kNorm, int kFreqs, int kPass>
void launch_heads(const Heads& h, const RopeTable& table, cudaStream_t stream) {
  const unsigned blocks = grid_for(h.T * (h.heads[0] + h.heads[1]), kWarpsPerBlock, 65535);
  if (!h.pool.k) launch_overlapped(rope_kernel<kNorm, kFreqs, kPass, void>, blocks, kThreads, 0, stream, h, table);
  else if (h.pool.bf16)
    launch_overlapped(rope_kernel<kNorm, kFreqs, kPass, __nv_bfloat16>, blocks, kThreads, 0, stream, h, table);
  else launch_overlapped(rope_kernel<kNorm, kFreqs, kPass, float>, blocks, kThreads, 0, stream, h, table);
  QINFER_CUDA_CHECK_LAUNCH("rope_kernel<<<>>>");
}

// kFreqs from half (at most kRopeMaxHalf: 8 per lane).
template <bool kNorm, int kPass>
void launch_freqs(const Heads& h, const RopeTable& table, cudaStream_t stream) {
  static_assert(kRopeMaxHalf == 8 * kWarp);
  if (h.half <= kWarp) launch_heads<kNorm, 1, kPass>(h, table, stream);
  else if (h.half <= 2 * kWarp) launch_heads<kNorm, 2, kPass>(h, table, stream);
  else if (h.half <= 4 * kWarp) launch_heads<kNorm, 4, kPass>(h, table, stream);
  else launch_heads<kNorm, 8, kPass>(h, table, stream);
}

// Normed heads (held in registers when they fit).
void launch_normed(const Heads& h, const RopeTable& table, cudaStream_t stream) {
  const int64_t pass = h.head_dim - 2 * h.half;
  if (pass == 0) launch_freqs<true, 0>(h, table, stream);
  else if (pass <= 2 * kWarp) launch_freqs<true, 2>(h, table, stream);
  else launch_freqs<true, kMaxPassVecs>(h, table, stream);
}

}  // namespace

void launch_rope(float* x, const int32_t* positions, int64_t T, int64_t heads, int64_t head_dim, int64_t half,
                 const RopeTable& table, cudaStream_t stream) {
  if (T == 0 || half == 0 || heads == 0) return;
  Heads h{};
  h.x[0] = x;
  h.heads[0] = heads;
  h.positions = positions;
  h.T = T, h.head_dim = head_dim, h.half = half;
  launch_freqs<false, 0>(h, table, stream);
}

void launch_rms_norm_rope(float* x, const float* w, float eps, const int32_t* positions, int64_t T, int64_t heads,
                          int64_t head_dim, int64_t half, const RopeTable& table, cudaStream_t stream) {
  if (T == 0 || heads == 0 || head_dim == 0) return;
  if (head_dim - 2 * half > kMaxPassVecs * kWarp) {
    // Heads too long to hold in registers: the norm over the rows of head_dim, then the rotation.
    launch_rms_norm(x, w, nullptr, eps, T * heads, head_dim, x, stream);
    return launch_rope(x, positions, T, heads, head_dim, half, table, stream);
  }
  Heads h{};
  h.x[0] = x;
  h.w[0] = w;
  h.heads[0] = heads;
  h.eps = eps;
  h.positions = positions;
  h.T = T, h.head_dim = head_dim, h.half = half;
  launch_normed(h, table, stream);
}

bool try_launch_rms_norm_rope_store(float* q, float* k, const float* v, const float* q_w, const float* k_w, float eps,
                                    const int32_t* positions, int64_t T, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, int64_t half, const RopeTable& table, const int32_t* dst_rows,
                                    const KvPoolView& pool, cudaStream_t stream) {
  if (head_dim - 2 * half > kMaxPassVecs * kWarp) return false;
  if (T == 0 || head_dim == 0) return true;
  Heads h{};
  h.x[0] = q, h.x[1] = k;
  h.w[0] = q_w, h.w[1] = k_w;
  h.heads[0] = heads, h.heads[1] = kv_heads;
  h.eps = eps;
  h.positions = positions;
  h.T = T, h.head_dim = head_dim, h.half = half;
  h.v = v, h.dst_rows = dst_rows, h.pool = pool;
  launch_normed(h, table, stream);
  return true;
}

}  // namespace qinfer::cuda
