// Paged KV: storing a batch's keys / values, and causal GQA attention over the pool.
//
// The f32 CUDA-core kernel, flash-attention style, for decode and small batches: a block takes a
// tile of up to 32 query rows of one sequence and kv head (rows = the sequence's tokens × the group's
// query heads, so GQA heads share every key / value tile they load), walks the keys in tiles of 32
// through shared memory with an online softmax, and masks each row at its own causal limit. For
// decode-sized batches the keys of a tile are split among `splits` blocks (flash-decoding) and a
// second kernel merges their partial results. Decode is bound by reading the pool, so f32
// arithmetic costs nothing there; prefill goes to attention_mma.cu's tensor cores (see launch.h).
#include "backend/cuda/common.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kRows = kAttentionTileRows;
constexpr int kKeyTile = kWarp;  // the softmax gives each key of a tile one lane
constexpr int kScorePitch = kKeyTile + 1;

// Shared memory, in floats: Q tile, K/V tile (padded rows: conflict-free column walks), scores,
// accumulators, and per-row max / sum / rescale.
int64_t shared_floats(int64_t head_dim) {
  const int64_t pitch = head_dim + 1;
  return kRows * pitch + kKeyTile * pitch + kRows * kScorePitch + kRows * head_dim + 3 * kRows;
}

__global__ void __launch_bounds__(kThreads, 4)
    kv_store_kernel(const float* __restrict__ k, const float* __restrict__ v, const int32_t* __restrict__ dst_rows,
                    int64_t T, int64_t row_floats, float* __restrict__ pool_k, float* __restrict__ pool_v) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int64_t dst = static_cast<int64_t>(dst_rows[t]) * row_floats, src = t * row_floats;
    for (int64_t i = threadIdx.x; i < row_floats; i += kThreads) {
      pool_k[dst + i] = k[src + i];
      pool_v[dst + i] = v[src + i];
    }
  }
}

__global__ void __launch_bounds__(kThreads, 4)
    attention_kernel(const float* __restrict__ q, const float* __restrict__ pool_k, const float* __restrict__ pool_v,
                     AttentionArrays L, int64_t heads, int64_t kv_heads, int head_dim, float scale, int splits,
                     int64_t T, float* __restrict__ partial, float* __restrict__ out) {
  extern __shared__ float smem[];
  const int hd = head_dim, pitch = hd + 1;
  float* Qs = smem;
  float* KV = Qs + kRows * pitch;
  float* S = KV + kKeyTile * pitch;
  float* acc = S + kRows * kScorePitch;
  float* row_max = acc + kRows * hd;
  float* row_sum = row_max + kRows;
  float* row_scale = row_sum + kRows;

  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
  const int s = L.tiles[2 * blockIdx.x], r0 = L.tiles[2 * blockIdx.x + 1];
  const int kvh = blockIdx.y, split = blockIdx.z;
  const int group = static_cast<int>(heads / kv_heads);
  const int seq_begin = L.cu_seqlens[s], len = L.cu_seqlens[s + 1] - seq_begin;
  const int rows = min(kRows, len * group - r0);
  const int cached = L.cached[s];
  // Keys of the tile: up to its last row's causal limit; this block's share in whole key tiles.
  const int tile_keys = cached + (r0 + rows - 1) / group + 1;
  const int key_tiles = (tile_keys + kKeyTile - 1) / kKeyTile;
  const int share = (key_tiles + splits - 1) / splits * kKeyTile;
  const int k_begin = split * share, k_end = min(tile_keys, k_begin + share);
  const int32_t* blocks = L.block_table + static_cast<int64_t>(s) * L.max_blocks;

  // Query row r is token (r0 + r) / group of the sequence at head kvh·group + (r0 + r) % group.
  auto q_offset = [&](int r) {
    const int row = r0 + r;
    const int64_t t = seq_begin + row / group, h = static_cast<int64_t>(kvh) * group + row % group;
    return (t * heads + h) * hd;
  };
  for (int idx = tid; idx < rows * hd; idx += kThreads) {
    const int r = idx / hd, d = idx % hd;
    Qs[r * pitch + d] = q[q_offset(r) + d];
    acc[idx] = 0.0f;
  }
  for (int r = tid; r < kRows; r += kThreads) row_max[r] = -INFINITY, row_sum[r] = 0.0f;

  // With hd % 4 == 0 and an aligned pool every row starts 16-byte aligned: one float4 per 4
  // features keeps several loads in flight per thread, where scalar loads chain their latencies.
  auto load_tile = [&](const float* __restrict__ pool, int kt, int nk) {
    if (hd % 4 == 0 && reinterpret_cast<uintptr_t>(pool) % 16 == 0) {
      const int quads = hd / 4;
      for (int idx = tid; idx < nk * quads; idx += kThreads) {
        const int j = idx / quads, d = 4 * (idx % quads), p = kt + j;
        const int64_t pool_row = static_cast<int64_t>(blocks[p / L.block_size]) * L.block_size + p % L.block_size;
        const float4 v = __ldg(reinterpret_cast<const float4*>(pool + (pool_row * kv_heads + kvh) * hd + d));
        float* dst = KV + j * pitch + d;
        dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
      }
      return;
    }
    for (int idx = tid; idx < nk * hd; idx += kThreads) {
      const int j = idx / hd, d = idx % hd, p = kt + j;
      const int64_t pool_row = static_cast<int64_t>(blocks[p / L.block_size]) * L.block_size + p % L.block_size;
      KV[j * pitch + d] = pool[(pool_row * kv_heads + kvh) * hd + d];
    }
  };

  for (int kt = k_begin; kt < k_end; kt += kKeyTile) {
    const int nk = min(kKeyTile, k_end - kt);
    __syncthreads();  // the previous tile's V reads are done
    load_tile(pool_k, kt, nk);
    __syncthreads();
    for (int idx = tid; idx < rows * kKeyTile; idx += kThreads) {
      const int r = idx / kKeyTile, j = idx % kKeyTile;
      const int n_keys = cached + (r0 + r) / group + 1;
      float score = -INFINITY;
      if (j < nk && kt + j < n_keys) {
        const float* qr = Qs + r * pitch;
        const float* kr = KV + j * pitch;
        float dot = 0.0f;
        for (int d = 0; d < hd; ++d) dot = fmaf(qr[d], kr[d], dot);
        score = scale * dot;
      }
      S[r * kScorePitch + j] = score;
    }
    __syncthreads();
    // Online softmax, one warp per row; a row with no key in this tile keeps its state.
    for (int r = warp; r < rows; r += kThreads / kWarp) {
      const float score = S[r * kScorePitch + lane];
      const float old_max = row_max[r], new_max = fmaxf(old_max, warp_max(score));
      const bool none = new_max == -INFINITY;
      const float p = none ? 0.0f : expf(score - new_max);
      S[r * kScorePitch + lane] = p;
      const float sum = warp_sum(p);
      if (lane == 0) {
        const float rescale = none ? 1.0f : expf(old_max - new_max);
        row_scale[r] = rescale;
        row_sum[r] = row_sum[r] * rescale + sum;
        row_max[r] = new_max;
      }
    }
    load_tile(pool_v, kt, nk);
    __syncthreads();
    for (int idx = tid; idx < rows * hd; idx += kThreads) {
      const int r = idx / hd, d = idx % hd;
      const float* pr = S + r * kScorePitch;
      float a = acc[idx] * row_scale[r];
      for (int j = 0; j < nk; ++j) a = fmaf(pr[j], KV[j * pitch + d], a);
      acc[idx] = a;
    }
  }
  __syncthreads();

  if (splits == 1) {
    for (int idx = tid; idx < rows * hd; idx += kThreads) {
      const int r = idx / hd, d = idx % hd;
      out[q_offset(r) + d] = acc[idx] / row_sum[r];
    }
    return;
  }
  // Partial results: un-normalised accumulators [splits, T, heads, hd], then (max, sum) pairs.
  const int64_t slice = T * heads;
  float* part_acc = partial + split * slice * hd;
  float* part_ml = partial + splits * slice * hd + 2 * split * slice;
  for (int idx = tid; idx < rows * hd; idx += kThreads) {
    const int r = idx / hd, d = idx % hd;
    part_acc[q_offset(r) + d] = acc[idx];
  }
  for (int r = tid; r < rows; r += kThreads) {
    const int64_t th = q_offset(r) / hd;
    part_ml[2 * th] = row_max[r];
    part_ml[2 * th + 1] = row_sum[r];
  }
}

// Merges the splits of one (token, head): weights e^(m_i − max) per split.
__global__ void __launch_bounds__(kThreads, 4)
    combine_kernel(const float* __restrict__ partial, int splits, int64_t T, int64_t heads, int head_dim,
                   float* __restrict__ out) {
  const int64_t slice = T * heads;
  const float* ml = partial + splits * slice * head_dim;
  for (int64_t th = blockIdx.x; th < slice; th += gridDim.x) {
    float max_all = -INFINITY;
    for (int i = 0; i < splits; ++i) max_all = fmaxf(max_all, ml[2 * (i * slice + th)]);
    float total = 0.0f;
    for (int i = 0; i < splits; ++i) {
      const float m = ml[2 * (i * slice + th)];
      if (m != -INFINITY) total += expf(m - max_all) * ml[2 * (i * slice + th) + 1];
    }
    for (int d = threadIdx.x; d < head_dim; d += kThreads) {
      float sum = 0.0f;
      for (int i = 0; i < splits; ++i) {
        const float m = ml[2 * (i * slice + th)];
        if (m != -INFINITY) sum += expf(m - max_all) * partial[(i * slice + th) * head_dim + d];
      }
      out[th * head_dim + d] = sum / total;
    }
  }
}

}  // namespace

void launch_kv_store(const float* k, const float* v, const int32_t* dst_rows, int64_t T, int64_t row_floats,
                     float* pool_k, float* pool_v, cudaStream_t stream) {
  if (T == 0 || row_floats == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(T, 65535));
  kv_store_kernel<<<blocks, kThreads, 0, stream>>>(k, v, dst_rows, T, row_floats, pool_k, pool_v);
  QINFER_CUDA_CHECK_LAUNCH("kv_store_kernel<<<>>>");
}

size_t attention_shared_bytes(int64_t head_dim) { return static_cast<size_t>(shared_floats(head_dim)) * sizeof(float); }

size_t attention_max_shared_bytes(int device) {
  int bytes = 0;
  QINFER_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  return static_cast<size_t>(bytes);
}

int64_t attention_partial_floats(int64_t splits, int64_t T, int64_t heads, int64_t head_dim) {
  return splits * T * heads * (head_dim + 2);
}

void launch_attention(const float* q, const float* pool_k, const float* pool_v, const AttentionArrays& layout,
                      int64_t T, int64_t heads, int64_t kv_heads, int64_t head_dim, float scale, int splits,
                      float* partial, float* out, cudaStream_t stream) {
  if (T == 0 || layout.num_tiles == 0 || heads == 0 || head_dim == 0) return;
  const size_t bytes = attention_shared_bytes(head_dim);
  // Beyond 48 KiB a kernel must opt in (a per-device function attribute, cheap to set again).
  if (bytes > 48 * 1024)
    QINFER_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
  const dim3 grid(static_cast<unsigned>(layout.num_tiles), static_cast<unsigned>(kv_heads),
                  static_cast<unsigned>(splits));
  attention_kernel<<<grid, kThreads, bytes, stream>>>(q, pool_k, pool_v, layout, heads, kv_heads,
                                                      static_cast<int>(head_dim), scale, splits, T, partial, out);
  QINFER_CUDA_CHECK_LAUNCH("attention_kernel<<<>>>");
  if (splits > 1) {
    const auto blocks = static_cast<unsigned>(std::min<int64_t>(T * heads, 65535));
    combine_kernel<<<blocks, kThreads, 0, stream>>>(partial, splits, T, heads, static_cast<int>(head_dim), out);
    QINFER_CUDA_CHECK_LAUNCH("combine_kernel<<<>>>");
  }
}

}  // namespace qinfer::cuda
