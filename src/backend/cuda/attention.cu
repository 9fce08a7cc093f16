// Paged KV: storing a batch's keys / values, and causal GQA attention over the pool.
//
// The f32 CUDA-core kernel, flash-attention style, for small batches the other kernels do not take:
// a block takes a tile of up to 32 query rows of one sequence and kv head (rows = the sequence's
// tokens × the group's query heads, so GQA heads share every key / value tile they load), walks the
// keys in tiles of 32 through shared memory with an online softmax, and masks each row at its own
// causal limit. With few blocks the keys of a tile are split among `splits` blocks and a second
// kernel merges their partial results. Decode and verification batches (a few tokens per sequence)
// go to the flash-decoding kernel below, prefill to attention_mma.cu's tensor cores (see launch.h).
// Decode is bound by reading the pool, so f32 arithmetic costs nothing there. The pool holds f32 or
// bf16 (KvPoolView): every kernel is instantiated for both and widens the elements as they load.
#include <string>

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

template <typename E>
__global__ void __launch_bounds__(kThreads, 4)
    kv_store_kernel(const float* __restrict__ k, const float* __restrict__ v, const int32_t* __restrict__ dst_rows,
                    int64_t T, int64_t row_floats, E* __restrict__ pool_k, E* __restrict__ pool_v) {
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const int64_t dst = static_cast<int64_t>(dst_rows[t]) * row_floats, src = t * row_floats;
    for (int64_t i = threadIdx.x; i < row_floats; i += kThreads) {
      pool_k[dst + i] = to_kv<E>(k[src + i]);
      pool_v[dst + i] = to_kv<E>(v[src + i]);
    }
  }
}

template <typename E>
__global__ void __launch_bounds__(kThreads, 4)
    attention_kernel(const float* __restrict__ q, const E* __restrict__ pool_k, const E* __restrict__ pool_v,
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

  // With hd % 4 == 0 and an aligned pool every row starts aligned for 4 elements: one load per 4
  // features keeps several loads in flight per thread, where scalar loads chain their latencies.
  auto load_tile = [&](const E* __restrict__ pool, int kt, int nk) {
    if (hd % 4 == 0 && reinterpret_cast<uintptr_t>(pool) % (4 * sizeof(E)) == 0) {
      const int quads = hd / 4;
      for (int idx = tid; idx < nk * quads; idx += kThreads) {
        const int j = idx / quads, d = 4 * (idx % quads), p = kt + j;
        const int64_t pool_row = static_cast<int64_t>(blocks[p / L.block_size]) * L.block_size + p % L.block_size;
        const float4 v = load4_kv(pool + (pool_row * kv_heads + kvh) * hd + d);
        float* dst = KV + j * pitch + d;
        dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
      }
      return;
    }
    for (int idx = tid; idx < nk * hd; idx += kThreads) {
      const int j = idx / hd, d = idx % hd, p = kt + j;
      const int64_t pool_row = static_cast<int64_t>(blocks[p / L.block_size]) * L.block_size + p % L.block_size;
      KV[j * pitch + d] = from_kv(pool[(pool_row * kv_heads + kvh) * hd + d]);
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

// --- decode: flash-decoding with the keys across warps --------------------------------------------
// For batches of few query tokens per sequence. A block takes one (query tile, kv head, key split);
// its warps take the split's chunks of keys in turn. A warp's lanes lie across head_dim, so every
// lane loads, scores and accumulates its own features of a key and the tile's query rows stay in
// registers; a dot product is one butterfly of shuffles. Keys come in by cp.async, kStages chunks
// ahead, into a per-warp ring, as 16-byte copies spread over the warp: a __syncwarp per chunk, no
// block barrier.

constexpr int kDecodeWarps = 4;
constexpr int kDecodeThreads = kDecodeWarps * kWarp;
// A split takes at least this many keys of the most a sequence may hold (head_dim ≤ 128: four
// chunks of four keys per warp).
// Finer splits leave each warp a chunk or two, and the last block's merge of many splits costs
// more than they save (H200, Qwen3-8B 4-bit decode after 512 tokens, one call: 395 tok/s at 64
// keys, 388 at 16, 380 at 128).
constexpr int kDecodeMinSplitKeys = 64;

// Query rows a decode tile keeps in registers.
constexpr int decode_max_rows(int head_dim) { return head_dim <= 128 ? 8 : 4; }

// A warp works as kSub sub-warps of kLanes lanes, each taking its own keys of a chunk (one for f32
// pools; two for bf16 ones at up to 4 rows, whose keys are half the bytes: a dot product's butterfly
// of shuffles, the step's limit there, then serves twice the bytes and has a step fewer). A lane
// holds kVec features of each row as kPieces runs of kPiece elements (one 4- to 16-byte load each);
// a piece of a sub-warp spans kLanes · kPiece contiguous features. E: the pool's elements.
template <int HD, typename E = float, int R = 1>
struct DecodeShape {
  static constexpr int kSub = sizeof(E) == 2 && R <= 4 ? 2 : 1;
  static constexpr int kLanes = kWarp / kSub;
  static constexpr int kVec = HD / kLanes;
  static constexpr int kPiece = std::min(kVec, 16 / static_cast<int>(sizeof(E)));
  static constexpr int kPieces = kVec / kPiece;
  static constexpr int kChunk = HD <= 128 ? 4 : 2;  // keys per sub-warp per online-softmax step
  static constexpr int kWarpChunk = kSub * kChunk;  // keys per warp per step: stage rows 2j (K), 2j + 1 (V)
  // 12 KiB of keys and values in flight per warp; at most 8 stages (bf16 head_dim 64 at 8 rows: 8 KiB).
  static constexpr int kStages = std::min(8, (HD <= 64 ? 6 : 3) * 4 / (static_cast<int>(sizeof(E)) * kSub));
  static constexpr int kStageElems = kWarpChunk * 2 * HD;
  static constexpr int kRingElems = kStages * kStageElems;
  static __device__ __forceinline__ int piece_offset(int p, int sub_lane) { return (p * kLanes + sub_lane) * kPiece; }
};

// P (2, 4 or 8) floats, in 8- or 16-byte loads.
template <int P>
__device__ __forceinline__ void load_piece(const float* src, float* dst) {
  if constexpr (P == 8) {
    load_piece<4>(src, dst);
    load_piece<4>(src + 4, dst + 4);
  } else if constexpr (P == 4) {
    const float4 v = *reinterpret_cast<const float4*>(src);
    dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
  } else {
    const float2 v = *reinterpret_cast<const float2*>(src);
    dst[0] = v.x, dst[1] = v.y;
  }
}

// P (2, 4 or 8) bf16 from shared memory in one load, widened.
template <int P>
__device__ __forceinline__ void load_piece(const __nv_bfloat16* src, float* dst) {
  uint32_t bits[P / 2];
  if constexpr (P == 8) {
    const uint4 v = *reinterpret_cast<const uint4*>(src);
    bits[0] = v.x, bits[1] = v.y, bits[2] = v.z, bits[3] = v.w;
  } else if constexpr (P == 4) {
    const uint2 v = *reinterpret_cast<const uint2*>(src);
    bits[0] = v.x, bits[1] = v.y;
  } else {
    bits[0] = *reinterpret_cast<const uint32_t*>(src);
  }
#pragma unroll
  for (int i = 0; i < P / 2; ++i) {
    const float2 v = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&bits[i]));
    dst[2 * i] = v.x, dst[2 * i + 1] = v.y;
  }
}

// load_piece from global memory written by other blocks of the same launch: through L2, not L1.
template <int P>
__device__ __forceinline__ void load_piece_cg(const float* src, float* dst) {
  if constexpr (P == 4) {
    const float4 v = __ldcg(reinterpret_cast<const float4*>(src));
    dst[0] = v.x, dst[1] = v.y, dst[2] = v.z, dst[3] = v.w;
  } else {
    const float2 v = __ldcg(reinterpret_cast<const float2*>(src));
    dst[0] = v.x, dst[1] = v.y;
  }
}

template <int P>
__device__ __forceinline__ void store_piece(float* dst, const float* v) {
  if constexpr (P == 8) {
    store_piece<4>(dst, v);
    store_piece<4>(dst + 4, v + 4);
  } else if constexpr (P == 4) {
    *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
  } else {
    *reinterpret_cast<float2*>(dst) = make_float2(v[0], v[1]);
  }
}

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  const auto addr = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(addr), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

template <int HD, int R, typename E>
constexpr size_t decode_shared_bytes() {
  using S = DecodeShape<HD, E, R>;
  constexpr int kParts = kDecodeWarps * S::kSub;
  // The key rings, then (reusing them) the sub-warps' accumulators, maxima, sums and merge weights.
  return std::max(sizeof(E) * kDecodeWarps * S::kRingElems, sizeof(float) * (kParts * R * HD + 3 * kParts * R + R));
}

// Merges the splits of (token, head) th of a decode launch into out: lane i weighs splits i, i + 32, ...
template <int HD>
__device__ __noinline__ void combine_decode_row(const float* __restrict__ partial, int splits, int64_t slice, int64_t th,
                                   float* __restrict__ out) {
  using S = DecodeShape<HD>;
  constexpr int kPerLane = kAttentionDecodeMaxSplits / kWarp;
  const int lane = threadIdx.x % kWarp;
  const float* ml = partial + splits * slice * HD;
  float m[kPerLane], l[kPerLane], weight[kPerLane];
  float max_all = -INFINITY;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {  // (max, sum) pairs in one load each
    const int i = j * kWarp + lane;
    const float2 pair = i < splits ? __ldcg(reinterpret_cast<const float2*>(ml) + i * slice + th)
                                   : make_float2(-INFINITY, 0.0f);
    m[j] = pair.x, l[j] = pair.y;
    max_all = fmaxf(max_all, m[j]);
  }
  max_all = warp_max(max_all);  // finite: every row sees a key in some split
  float total = 0.0f;
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    weight[j] = m[j] == -INFINITY ? 0.0f : expf(m[j] - max_all);
    total += weight[j] * l[j];
  }
  total = warp_sum(total);
  float a[S::kVec] = {};
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int count = min(kWarp, splits - j * kWarp);
#pragma unroll 16
    for (int src = 0; src < count; ++src) {
      const float w = __shfl_sync(0xFFFFFFFFu, weight[j], src);
      const float* row = partial + ((j * kWarp + src) * slice + th) * HD;
      float v[S::kVec];
#pragma unroll
      for (int p = 0; p < S::kPieces; ++p) load_piece_cg<S::kPiece>(row + S::piece_offset(p, lane), v + p * S::kPiece);
#pragma unroll
      for (int e = 0; e < S::kVec; ++e) a[e] = fmaf(w, v[e], a[e]);
    }
  }
#pragma unroll
  for (int e = 0; e < S::kVec; ++e) a[e] /= total;
#pragma unroll
  for (int p = 0; p < S::kPieces; ++p)
    store_piece<S::kPiece>(out + th * HD + S::piece_offset(p, lane), a + p * S::kPiece);
}

// Merges a decode launch's splits (where no arrival counters were given): a warp per (token, head).
template <int HD>
__global__ void __launch_bounds__(kDecodeThreads)
    decode_combine_kernel(const float* __restrict__ partial, int splits, int64_t slice, float* __restrict__ out) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int64_t th = static_cast<int64_t>(blockIdx.x) * kDecodeWarps + threadIdx.x / kWarp;
  if (th < slice) combine_decode_row<HD>(partial, splits, slice, th, out);
}

// Scores are kept in base 2: q comes pre-scaled by scale · log2(e). Rows past the tile's `rows`
// repeat its last row (their results are dropped), so every row has a key and a finite maximum.
template <int HD, int R, typename E>
__global__ void __launch_bounds__(kDecodeThreads)
    attention_decode_kernel(const float* __restrict__ q, const E* __restrict__ pool_k, const E* __restrict__ pool_v,
                            AttentionArrays L, int heads, int kv_heads, float scale_log2, int splits, int64_t T,
                            float* __restrict__ partial, int* __restrict__ arrivals, float* __restrict__ out) {
  using S = DecodeShape<HD, E, R>;
  constexpr int kVec = S::kVec, kPiece = S::kPiece, kPieces = S::kPieces, kChunk = S::kChunk;
  constexpr int kStages = S::kStages, kSub = S::kSub, kLanes = S::kLanes, kWarpChunk = S::kWarpChunk;
  constexpr int kParts = kDecodeWarps * kSub;            // sub-warps of the block, merged at the end
  constexpr int kChunksPerLookup = kWarp / kWarpChunk;  // chunks whose pool rows one lane-wide lookup finds
  constexpr unsigned kAll = 0xFFFFFFFFu;
  // The layout arrays come from host copies, which finish before any kernel of the chain starts,
  // and keys before `cached` from earlier steps: both are read before wait_for_previous_kernel(),
  // so the block table lookups and the first key loads overlap the previous kernel's tail. The
  // step's own keys (written by the previous kernel) and q are read after it.
  allow_next_kernel();
  extern __shared__ float4 decode_smem[];
  float* smem = reinterpret_cast<float*>(decode_smem);

  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int sub = lane / kLanes, sub_lane = lane % kLanes, part = warp * kSub + sub;
  const int s = L.tiles[2 * blockIdx.x], r0 = L.tiles[2 * blockIdx.x + 1];
  const int kvh = blockIdx.y, split = blockIdx.z;
  const int group = heads / kv_heads;
  const int seq_begin = L.cu_seqlens[s], len = L.cu_seqlens[s + 1] - seq_begin;
  const int rows = min(R, len * group - r0);
  const int cached = L.cached[s];

  // Query row r is token (r0 + r) / group of the sequence at head kvh·group + (r0 + r) % group.
  auto q_offset = [&](int r) {
    const int row = r0 + r;
    const int64_t t = seq_begin + row / group, h = static_cast<int64_t>(kvh) * group + row % group;
    return (t * heads + h) * HD;
  };
  int limit[R];  // keys row r sees (causal)
#pragma unroll
  for (int r = 0; r < R; ++r) limit[r] = cached + (r0 + min(r, rows - 1)) / group + 1;

  // The split's chunks of kWarpChunk keys; this warp's are c_begin + warp + i·kDecodeWarps, and
  // sub-warp `sub` takes keys sub·kChunk .. of each.
  const int tile_keys = limit[R - 1];
  const int chunks = (tile_keys + kWarpChunk - 1) / kWarpChunk;
  const int share = (chunks + splits - 1) / splits;
  const int c_begin = split * share, c_end = min(chunks, c_begin + share);
  const int n_chunks = c_begin + warp < c_end ? (c_end - c_begin - warp + kDecodeWarps - 1) / kDecodeWarps : 0;
  auto first_key = [&](int i) { return (c_begin + warp + i * kDecodeWarps) * kWarpChunk; };

  // Lane l finds the pool row of key l % kWarpChunk of the lookup's chunk l / kWarpChunk; keys past
  // the tile load its last key (in the table), and the causal mask drops them.
  const int32_t* blocks = L.block_table + static_cast<int64_t>(s) * L.max_blocks;
  auto lookup = [&](int first_chunk) {
    const int key = min(first_key(first_chunk + lane / kWarpChunk) + lane % kWarpChunk, tile_keys - 1);
    return blocks[key / L.block_size] * L.block_size + key % L.block_size;
  };
  E* ring = reinterpret_cast<E*>(decode_smem) + warp * S::kRingElems;
  int looked_up = -1, lane_row = 0;
  // A chunk lands as 16-byte copies spread evenly over the warp, whichever lanes compute on them
  // (bf16 rows in 8-byte pieces would halve the bytes per copy): stage rows 2n and 2n + 1 are key
  // n's K and V, HD elements each.
  constexpr int kCopyElems = 16 / static_cast<int>(sizeof(E));
  constexpr int kCopies = S::kStageElems / (kCopyElems * kWarp);
  static_assert(kCopies * kCopyElems * kWarp == S::kStageElems && HD % kCopyElems == 0);
  auto issue = [&](int i) {
    const int first = i - i % kChunksPerLookup;
    if (first != looked_up) lane_row = lookup(first), looked_up = first;
    E* stage = ring + (i % kStages) * S::kStageElems;
#pragma unroll
    for (int c = 0; c < kCopies; ++c) {
      const int e = (c * kWarp + lane) * kCopyElems;
      const int r = e / HD, d = e % HD;
      const int row = __shfl_sync(kAll, lane_row, (i % kChunksPerLookup) * kWarpChunk + r / 2);
      const E* pool = r % 2 == 0 ? pool_k : pool_v;
      cp_async16(stage + e, pool + (static_cast<int64_t>(row) * kv_heads + kvh) * HD + d);
    }
  };

  float m[R], l[R], acc[R][kVec];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY, l[r] = 0.0f;
#pragma unroll
    for (int e = 0; e < kVec; ++e) acc[r][e] = 0.0f;
  }
  // Every step commits a group (empty past the end) so that wait_group counts chunks. The first
  // chunks load before the wait when every key they touch (past-the-end lanes load the tile's last
  // key) is older than this step.
  const int first_chunks = min(n_chunks, kStages - 1);
  const bool early = first_chunks == 0 || min(first_key(first_chunks - 1) + kWarpChunk, tile_keys) <= cached;
  if (!early) wait_for_previous_kernel();
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < n_chunks) issue(i);
    cp_async_commit();
  }
  if (early) wait_for_previous_kernel();
  float qr[R][kVec];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float* src = q + q_offset(min(r, rows - 1));
#pragma unroll
    for (int p = 0; p < kPieces; ++p) load_piece<kPiece>(src + S::piece_offset(p, sub_lane), qr[r] + p * kPiece);
#pragma unroll
    for (int e = 0; e < kVec; ++e) qr[r][e] *= scale_log2;
  }
  for (int i = 0; i < n_chunks; ++i) {
    __syncwarp();  // every lane's reads of the stage being refilled (chunk i − 1) are done
    if (i + kStages - 1 < n_chunks) issue(i + kStages - 1);
    cp_async_commit();
    cp_async_wait<kStages - 1>();
    __syncwarp();  // and every lane's copies of chunk i have landed
    // This sub-warp's keys of the chunk: stage rows of keys sub·kChunk + n.
    const E* stage = ring + (i % kStages) * S::kStageElems + sub * kChunk * 2 * HD;
    float score[kChunk][R];
#pragma unroll
    for (int n = 0; n < kChunk; ++n) {
      float k[kVec];
#pragma unroll
      for (int p = 0; p < kPieces; ++p)
        load_piece<kPiece>(stage + 2 * n * HD + S::piece_offset(p, sub_lane), k + p * kPiece);
#pragma unroll
      for (int r = 0; r < R; ++r) {
        float dot = 0.0f;
#pragma unroll
        for (int e = 0; e < kVec; ++e) dot = fmaf(qr[r][e], k[e], dot);
        score[n][r] = dot;
      }
    }
#pragma unroll
    for (int offset = kLanes / 2; offset > 0; offset /= 2)  // within the sub-warp
#pragma unroll
      for (int n = 0; n < kChunk; ++n)
#pragma unroll
        for (int r = 0; r < R; ++r) score[n][r] += __shfl_xor_sync(kAll, score[n][r], offset);

    // Online softmax; the base stays 0 while a row has seen no key, so e^(−inf − base) is 0, not NaN.
    const int key0 = first_key(i) + sub * kChunk;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      float chunk_max = -INFINITY;
#pragma unroll
      for (int n = 0; n < kChunk; ++n) {
        if (key0 + n >= limit[r]) score[n][r] = -INFINITY;
        chunk_max = fmaxf(chunk_max, score[n][r]);
      }
      const float new_max = fmaxf(m[r], chunk_max);
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      const float rescale = exp2f(m[r] - base);
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < kChunk; ++n) {
        score[n][r] = exp2f(score[n][r] - base);
        sum += score[n][r];
      }
      l[r] = l[r] * rescale + sum;
      m[r] = new_max;
#pragma unroll
      for (int e = 0; e < kVec; ++e) acc[r][e] *= rescale;
    }
#pragma unroll
    for (int n = 0; n < kChunk; ++n) {
      float v[kVec];
#pragma unroll
      for (int p = 0; p < kPieces; ++p)
        load_piece<kPiece>(stage + (2 * n + 1) * HD + S::piece_offset(p, sub_lane), v + p * kPiece);
#pragma unroll
      for (int r = 0; r < R; ++r)
#pragma unroll
        for (int e = 0; e < kVec; ++e) acc[r][e] = fmaf(score[n][r], v[e], acc[r][e]);
    }
  }
  cp_async_wait<0>();

  // Merge the sub-warps: weights 2^(m_w − max) (0 for one that saw no key of the row).
  __syncthreads();  // every warp is done with its ring
  float* acc_s = smem;                          // [parts, R, HD]
  float* m_s = acc_s + kParts * R * HD;         // [parts, R]
  float* l_s = m_s + kParts * R;                // [parts, R]
  float* weight_s = l_s + kParts * R;           // [parts, R]
  float* sum_s = weight_s + kParts * R;         // [R]
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (sub_lane == 0) m_s[part * R + r] = m[r], l_s[part * R + r] = l[r];
#pragma unroll
    for (int p = 0; p < kPieces; ++p)
      store_piece<kPiece>(acc_s + (part * R + r) * HD + S::piece_offset(p, sub_lane), acc[r] + p * kPiece);
  }
  __syncthreads();
  const int tid = threadIdx.x;
  if (tid < R) {
    float max_all = -INFINITY;
    for (int w = 0; w < kParts; ++w) max_all = fmaxf(max_all, m_s[w * R + tid]);
    float sum = 0.0f;
    for (int w = 0; w < kParts; ++w) {
      const float weight = max_all == -INFINITY ? 0.0f : exp2f(m_s[w * R + tid] - max_all);
      weight_s[w * R + tid] = weight;
      sum += weight * l_s[w * R + tid];
    }
    sum_s[tid] = sum;
    m_s[tid] = max_all;  // warp 0's slot, read by no one else now
  }
  __syncthreads();
  auto merged = [&](int r, int d) {
    float a = 0.0f;
#pragma unroll
    for (int w = 0; w < kParts; ++w) a = fmaf(weight_s[w * R + r], acc_s[(w * R + r) * HD + d], a);
    return a;
  };
  if (splits == 1) {
    for (int idx = tid; idx < rows * HD; idx += kDecodeThreads) {
      const int r = idx / HD, d = idx % HD;
      out[q_offset(r) + d] = merged(r, d) / sum_s[r];
    }
    return;
  }
  // Partial results as launch_attention's: accumulators [splits, T, heads, hd], then (max, sum)
  // pairs with the max in natural-log units; a split without keys leaves (−inf, 0) and zeros.
  const int64_t slice = T * heads;
  float* part_acc = partial + split * slice * HD;
  float* part_ml = partial + splits * slice * HD + 2 * split * slice;
  for (int idx = tid; idx < rows * HD; idx += kDecodeThreads) {
    const int r = idx / HD, d = idx % HD;
    part_acc[q_offset(r) + d] = merged(r, d);
  }
  for (int r = tid; r < rows; r += kDecodeThreads) {
    const int64_t th = q_offset(r) / HD;
    part_ml[2 * th] = m_s[r] * 0.69314718f;  // ln 2: base-2 max to natural log
    part_ml[2 * th + 1] = sum_s[r];
  }
  if (arrivals == nullptr) return;  // decode_combine_kernel merges
  // The last of the tile's splits to finish merges them (no second launch in the step's chain):
  // every block publishes its partials before it counts itself, the last one reads them after.
  __shared__ int last;
  __threadfence();
  __syncthreads();
  int* count = arrivals + static_cast<int64_t>(blockIdx.x) * gridDim.y + blockIdx.y;
  if (tid == 0) last = atomicAdd(count, 1) == splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  for (int r = warp; r < rows; r += kDecodeWarps) combine_decode_row<HD>(partial, splits, slice, q_offset(r) / HD, out);
  if (tid == 0) *count = 0;  // ready for the next launch (and replay) that uses it
}

template <int HD, int R, typename E>
void launch_decode(const float* q, const E* pool_k, const E* pool_v, const AttentionArrays& layout, int64_t T,
                   int64_t heads, int64_t kv_heads, float scale, int splits, float* partial, int* arrivals, float* out,
                   cudaStream_t stream) {
  constexpr size_t bytes = decode_shared_bytes<HD, R, E>();
  auto kernel = attention_decode_kernel<HD, R, E>;
  // The default limit on dynamic shared memory is 48 KiB less the kernel's static shared memory (the
  // merge's flag), which the rings may already fill: always raise it to what the launch uses.
  QINFER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)));
  const dim3 grid(static_cast<unsigned>(layout.num_tiles), static_cast<unsigned>(kv_heads),
                  static_cast<unsigned>(splits));
  const float scale_log2 = scale * 1.44269504f;  // log2(e)
  launch_overlapped(kernel, grid, kDecodeThreads, bytes, stream, q, pool_k, pool_v, layout, static_cast<int>(heads),
                    static_cast<int>(kv_heads), scale_log2, splits, T, partial, splits > 1 ? arrivals : nullptr, out);
  QINFER_CUDA_CHECK_LAUNCH("attention_decode_kernel<<<>>>");
  if (splits > 1 && arrivals == nullptr) {
    const int64_t slice = T * heads;
    const auto blocks = static_cast<unsigned>((slice + kDecodeWarps - 1) / kDecodeWarps);
    launch_overlapped(decode_combine_kernel<HD>, blocks, kDecodeThreads, 0, stream, partial, splits, slice, out);
    QINFER_CUDA_CHECK_LAUNCH("decode_combine_kernel<<<>>>");
  }
}

template <int HD, typename E>
void launch_decode_rows(const float* q, const E* pool_k, const E* pool_v, const AttentionArrays& layout, int64_t T,
                        int64_t heads, int64_t kv_heads, int64_t tile_rows, float scale, int splits, float* partial,
                        int* arrivals, float* out, cudaStream_t stream) {
  static_assert(decode_max_rows(HD) == 4 || decode_max_rows(HD) == 8);
  switch (tile_rows) {
    case 1: return launch_decode<HD, 1, E>(q, pool_k, pool_v, layout, T, heads, kv_heads, scale, splits, partial, arrivals, out, stream);
    case 2: return launch_decode<HD, 2, E>(q, pool_k, pool_v, layout, T, heads, kv_heads, scale, splits, partial, arrivals, out, stream);
    case 4: return launch_decode<HD, 4, E>(q, pool_k, pool_v, layout, T, heads, kv_heads, scale, splits, partial, arrivals, out, stream);
    case 8:
      if constexpr (decode_max_rows(HD) == 8)
        return launch_decode<HD, 8, E>(q, pool_k, pool_v, layout, T, heads, kv_heads, scale, splits, partial, arrivals, out, stream);
      [[fallthrough]];
    default:
      throw_error("attention_decode: " + std::to_string(tile_rows) + " rows per tile at head_dim " +
                  std::to_string(HD) + " (see attention_decode_tile_rows)");
  }
}

}  // namespace

void launch_kv_store(const float* k, const float* v, const int32_t* dst_rows, int64_t T, int64_t row_floats,
                     const KvPoolView& pool, cudaStream_t stream) {
  if (T == 0 || row_floats == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(T, 65535));
  with_kv_type(pool, [&](auto e) {
    using E = decltype(e);
    kv_store_kernel<<<blocks, kThreads, 0, stream>>>(k, v, dst_rows, T, row_floats, static_cast<E*>(pool.k),
                                                     static_cast<E*>(pool.v));
  });
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

void launch_attention(const float* q, const KvPoolView& pool, const AttentionArrays& layout,
                      int64_t T, int64_t heads, int64_t kv_heads, int64_t head_dim, float scale, int splits,
                      float* partial, float* out, cudaStream_t stream) {
  if (T == 0 || layout.num_tiles == 0 || heads == 0 || head_dim == 0) return;
  const size_t bytes = attention_shared_bytes(head_dim);
  const dim3 grid(static_cast<unsigned>(layout.num_tiles), static_cast<unsigned>(kv_heads),
                  static_cast<unsigned>(splits));
  with_kv_type(pool, [&](auto e) {
    using E = decltype(e);
    // Beyond 48 KiB a kernel must opt in (a per-device function attribute, cheap to set again).
    if (bytes > 48 * 1024)
      QINFER_CUDA_CHECK(cudaFuncSetAttribute(attention_kernel<E>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             static_cast<int>(bytes)));
    attention_kernel<E><<<grid, kThreads, bytes, stream>>>(q, static_cast<const E*>(pool.k),
                                                           static_cast<const E*>(pool.v), layout, heads, kv_heads,
                                                           static_cast<int>(head_dim), scale, splits, T, partial, out);
  });
  QINFER_CUDA_CHECK_LAUNCH("attention_kernel<<<>>>");
  if (splits > 1) launch_attention_combine(partial, splits, T, heads, head_dim, out, stream);
}

void launch_attention_combine(const float* partial, int splits, int64_t T, int64_t heads, int64_t head_dim,
                              float* out, cudaStream_t stream) {
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(T * heads, 65535));
  combine_kernel<<<blocks, kThreads, 0, stream>>>(partial, splits, T, heads, static_cast<int>(head_dim), out);
  QINFER_CUDA_CHECK_LAUNCH("combine_kernel<<<>>>");
}

int64_t attention_decode_tile_rows(int64_t head_dim, int64_t max_rows) {
  int64_t limit = 0;
  switch (head_dim) {
    case 64: limit = decode_max_rows(64); break;
    case 128: limit = decode_max_rows(128); break;
    case 256: limit = decode_max_rows(256); break;
    default: return 0;
  }
  int64_t rows = 1;
  while (rows < max_rows && rows < limit) rows *= 2;
  return rows;
}

int attention_decode_splits(int64_t blocks, int64_t max_keys, int sm_count) {
  // Two blocks per SM keep enough loads in flight; each split gets kDecodeMinSplitKeys or more.
  const int64_t for_blocks = (2 * int64_t{sm_count} + blocks - 1) / blocks;
  const int64_t for_keys = max_keys / kDecodeMinSplitKeys;
  return static_cast<int>(std::clamp<int64_t>(std::min(for_blocks, for_keys), 1, kAttentionDecodeMaxSplits));
}

void launch_attention_decode(const float* q, const KvPoolView& pool, const AttentionArrays& layout, int64_t T,
                             int64_t heads, int64_t kv_heads, int64_t head_dim, int64_t tile_rows, float scale,
                             int splits, float* partial, int* arrivals, float* out, cudaStream_t stream) {
  if (T == 0 || layout.num_tiles == 0 || heads == 0) return;
  with_kv_type(pool, [&](auto e) {
    using E = decltype(e);
    const auto* k = static_cast<const E*>(pool.k);
    const auto* v = static_cast<const E*>(pool.v);
    switch (head_dim) {
      case 64:
        return launch_decode_rows<64>(q, k, v, layout, T, heads, kv_heads, tile_rows, scale, splits, partial,
                                      arrivals, out, stream);
      case 128:
        return launch_decode_rows<128>(q, k, v, layout, T, heads, kv_heads, tile_rows, scale, splits, partial,
                                       arrivals, out, stream);
      case 256:
        return launch_decode_rows<256>(q, k, v, layout, T, heads, kv_heads, tile_rows, scale, splits, partial,
                                       arrivals, out, stream);
      default: throw_error("attention_decode: head_dim " + std::to_string(head_dim) + " has no decode kernel");
    }
  });
}

}  // namespace qinfer::cuda
