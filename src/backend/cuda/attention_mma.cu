// Prefill attention on the tensor cores: causal paged GQA flash attention over the pool (f32 or bf16
// elements), in two precisions with f32 accumulation: TF32 mma.sync m16n8k8 (exact mode) and bf16
// m16n8k16 (fast mode).
//
// A block takes a tile of query rows of one sequence and kv head (rows = tokens × the group's query
// heads, as in attention.cu, so the group shares every key / value tile) and walks the keys in tiles
// of kKeys, loading tile t + 1 while it computes tile t. Each warp owns 16 query rows: its S tile and
// its output rows stay in registers (the FA2 split), the softmax is online in f32 (exp2: Q is
// pre-scaled by scale·log2(e)), causal tiles past a warp's last row are skipped.
//
// TF32: K / V tiles come in by cp.async as f32, operands are rounded (cvt.rna) where they enter an
// MMA, and P goes from the accumulator layout straight into the A operand (no shuffles) by reading
// the key dimension of P·V in a permuted order that V's B fragments follow.
// A bf16 pool's tiles are widened to f32 as they are loaded (plain loads: exact mode over a bf16
// cache is a rare pairing).
// bf16: Q, K and V are rounded to bf16 (RNE) as they are staged into shared memory, from where
// ldmatrix feeds the MMAs; P is rounded to bf16 for P·V; a bf16 pool's tiles go straight into the
// bf16 buffers by cp.async. This kernel's tiles are 128 query rows for every
// head_dim (8 warps), so at head_dim 256 they differ from the TF32 kernel's 64.
#include <cuda_bf16.h>

#include <limits>
#include <string>

#include "backend/cuda/common.cuh"

namespace qinfer::cuda {
namespace {

// Per head_dim: warps (16 query rows each), keys per tile, and whether the warp's Q fragments live in
// registers (head_dim ≤ 128) or are re-read from shared memory (256: registers go to the outputs).
template <int HD>
struct MmaConfig;
template <>
struct MmaConfig<64> {
  static constexpr int kWarps = 8, kKeys = 64;
  static constexpr bool kQInRegs = true;
};
template <>
struct MmaConfig<128> {
  static constexpr int kWarps = 8, kKeys = 64;
  static constexpr bool kQInRegs = true;
};
template <>
struct MmaConfig<256> {
  static constexpr int kWarps = 4, kKeys = 32;
  static constexpr bool kQInRegs = false;
};

template <int HD>
struct MmaShape {
  static constexpr int kWarps = MmaConfig<HD>::kWarps, kKeys = MmaConfig<HD>::kKeys;
  static constexpr bool kQInRegs = MmaConfig<HD>::kQInRegs;
  static constexpr int kThreads = kWarps * kWarp, kRows = kWarps * 16;
  // Pitches in floats. K and Q are read as float4 per lane (8-lane phases cover rows g, g+1): a pitch
  // ≡ 16 (mod 32) puts the two rows in opposite bank halves. V is read one float per lane at rows
  // 2·tig(+1), columns g: a pitch ≡ 4 (mod 32) spreads the 32 lanes over 32 banks.
  static constexpr int kKPitch = HD + 16, kVPitch = HD + 4, kQPitch = HD + 16;
  static constexpr int kStageFloats = kKeys * (kKPitch + kVPitch);
  static constexpr int kQFloats = kQInRegs ? 0 : kRows * kQPitch;
  static constexpr size_t kSharedBytes = sizeof(float) * (kQFloats + 2 * kStageFloats);
  static constexpr int kChunksPerRow = HD / 4;  // 16-byte cp.async chunks of one key row
  static_assert(kThreads % kChunksPerRow == 0, "each thread copies a fixed column of key rows");
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kKeys % kRowsPerPass == 0, "a key tile is whole copy passes");
};

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// d += a·b for one m16n8k8 TF32 tile. Fragments (g = lane / 4, t = lane % 4): a0 (g, t), a1 (g+8, t),
// a2 (g, t+4), a3 (g+8, t+4); b0 (k t, n g), b1 (k t+4, n g); c0/c1 (g, 2t/2t+1), c2/c3 (g+8, ...).
__device__ __forceinline__ void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// 16 bytes global → shared; bytes = 0 fills zeros without reading (keys past the tile's end).
__device__ __forceinline__ void cp_async16(float* dst, const float* src, int bytes) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(addr), "l"(src), "r"(bytes) : "memory");
}
// 8 bytes global → shared (bytes = 0: zeros).
__device__ __forceinline__ void cp_async8(void* dst, const void* src, int bytes) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(addr), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_one() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

template <int HD, typename E>
__global__ void __launch_bounds__(MmaShape<HD>::kThreads, 1)
    attention_mma_kernel(const float* __restrict__ q, const E* __restrict__ pool_k, const E* __restrict__ pool_v,
                         AttentionArrays L, int heads, int kv_heads, float q_scale, int block_shift,
                         float* __restrict__ out) {
  using S = MmaShape<HD>;
  constexpr int kKeys = S::kKeys, kNT = kKeys / 8, kHT = HD / 8, kKS = HD / 16;
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  float* Qs = smem;
  float* stages = smem + S::kQFloats;

  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp, g = lane / 4, tig = lane % 4;
  // Heaviest tiles (last rows, most keys) first so the causal tail does not straggle.
  const int tile = static_cast<int>(L.num_tiles - 1 - blockIdx.x / kv_heads), kvh = blockIdx.x % kv_heads;
  const int s = L.tiles[2 * tile], r0 = L.tiles[2 * tile + 1];
  const int group = heads / kv_heads;
  const int seq_begin = L.cu_seqlens[s], len = L.cu_seqlens[s + 1] - seq_begin;
  const int rows = min(S::kRows, len * group - r0);
  const int cached = L.cached[s];
  const int block_keys = cached + (r0 + rows - 1) / group + 1;
  const int key_tiles = (block_keys + kKeys - 1) / kKeys;
  const int32_t* blocks = L.block_table + static_cast<int64_t>(s) * L.max_blocks;
  const int bs = L.block_size;

  // Query row r of the tile is token (r0 + r) / group at head kvh·group + (r0 + r) % group.
  auto q_row = [&](int r) {
    const int row = r0 + r;
    return (static_cast<int64_t>(seq_begin + row / group) * heads + kvh * group + row % group) * HD;
  };

  // This thread's two rows (g and g + 8 of the warp's 16) and their causal limits; padding rows past
  // `rows` see every key of the block (zero Q, never stored) so they stay finite.
  const int wr = warp * 16;
  const bool warp_active = wr < rows;
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = wr + g + 8 * h;
    limit[h] = r < rows ? cached + (r0 + r) / group + 1 : block_keys;
  }
  const int warp_last = min(wr + 15, rows - 1);
  const int warp_keys = cached + (r0 + warp_last) / group + 1;  // past its last row's limit: skip
  const int warp_unmasked = cached + (r0 + wr) / group + 1;     // keys below every row's limit

  auto load_tile = [&](int kt, int stage) {
    float* Ks = stages + stage * S::kStageFloats;
    float* Vs = Ks + kKeys * S::kKPitch;
    const int col = (tid % S::kChunksPerRow) * 4;
#pragma unroll
    for (int j = tid / S::kChunksPerRow; j < kKeys; j += S::kRowsPerPass) {
      const int p = kt + j;
      const bool live = p < block_keys;
      int64_t src = 0;
      if (live) {
        const int page = block_shift >= 0 ? p >> block_shift : p / bs;
        const int slot = p - page * bs;
        src = ((static_cast<int64_t>(blocks[page]) * bs + slot) * kv_heads + kvh) * HD + col;
      }
      if constexpr (std::is_same_v<E, float>) {
        cp_async16(Ks + j * S::kKPitch + col, pool_k + src, live ? 16 : 0);
        cp_async16(Vs + j * S::kVPitch + col, pool_v + src, live ? 16 : 0);
      } else {
        const float4 zero{0.0f, 0.0f, 0.0f, 0.0f};
        *reinterpret_cast<float4*>(Ks + j * S::kKPitch + col) = live ? load4_kv(pool_k + src) : zero;
        *reinterpret_cast<float4*>(Vs + j * S::kVPitch + col) = live ? load4_kv(pool_v + src) : zero;
      }
    }
  };

  load_tile(0, 0);
  cp_async_commit();

  // Q, scaled and rounded once: in registers as this lane's A fragments, or in shared memory.
  uint32_t qf[S::kQInRegs ? kKS : 1][2][4];
  if constexpr (S::kQInRegs) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wr + g + 8 * h;
      const float* src = r < rows ? q + q_row(r) : nullptr;
#pragma unroll
      for (int ks = 0; ks < kKS; ++ks) {
        const float4 v = src ? *reinterpret_cast<const float4*>(src + 16 * ks + 4 * tig) : float4{0, 0, 0, 0};
        qf[ks][h][0] = to_tf32(v.x * q_scale);
        qf[ks][h][1] = to_tf32(v.y * q_scale);
        qf[ks][h][2] = to_tf32(v.z * q_scale);
        qf[ks][h][3] = to_tf32(v.w * q_scale);
      }
    }
  } else {
    for (int idx = tid; idx < S::kRows * (HD / 4); idx += S::kThreads) {
      const int r = idx / (HD / 4), c = (idx % (HD / 4)) * 4;
      float4 v{0, 0, 0, 0};
      if (r < rows) v = *reinterpret_cast<const float4*>(q + q_row(r) + c);
      float4 t;
      t.x = __uint_as_float(to_tf32(v.x * q_scale));
      t.y = __uint_as_float(to_tf32(v.y * q_scale));
      t.z = __uint_as_float(to_tf32(v.z * q_scale));
      t.w = __uint_as_float(to_tf32(v.w * q_scale));
      *reinterpret_cast<float4*>(Qs + r * S::kQPitch + c) = t;
    }
  }

  float o[kHT][4];
#pragma unroll
  for (int n = 0; n < kHT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};  // row_sum: this lane's share

  for (int t = 0; t < key_tiles; ++t) {
    const int kt = t * kKeys;
    if (t + 1 < key_tiles) load_tile(kt + kKeys, (t + 1) & 1);
    cp_async_commit();  // possibly empty: keeps "all but the newest group" meaning tile t
    cp_async_wait_one();
    __syncthreads();  // tile t (and Q in shared memory) visible to every warp

    if (warp_active && kt < warp_keys) {
      const float* Ks = stages + (t & 1) * S::kStageFloats;
      const float* Vs = Ks + kKeys * S::kKPitch;

      // S = Q·Kᵀ. The hd dimension of each k16 step is read in the order lane t holds 4t..4t+3 of
      // both operands (A and B agree, so the sum is unchanged) to load float4s.
      float sc[kNT][4];
#pragma unroll
      for (int j = 0; j < kNT; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kKS; ++ks) {
        uint32_t a[2][4];
        if constexpr (S::kQInRegs) {
#pragma unroll
          for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 4; ++e) a[h][e] = qf[ks][h][e];
        } else {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float4 v = *reinterpret_cast<const float4*>(Qs + (wr + g + 8 * h) * S::kQPitch + 16 * ks + 4 * tig);
            a[h][0] = __float_as_uint(v.x), a[h][1] = __float_as_uint(v.y);
            a[h][2] = __float_as_uint(v.z), a[h][3] = __float_as_uint(v.w);
          }
        }
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
          const float4 kv = *reinterpret_cast<const float4*>(Ks + (8 * j + g) * S::kKPitch + 16 * ks + 4 * tig);
          mma_tf32(sc[j], a[0][0], a[1][0], a[0][1], a[1][1], to_tf32(kv.x), to_tf32(kv.y));
          mma_tf32(sc[j], a[0][2], a[1][2], a[0][3], a[1][3], to_tf32(kv.z), to_tf32(kv.w));
        }
      }

      // Online softmax (log2 units) of rows g (h = 0: sc[.][0..1]) and g + 8 (h = 1: sc[.][2..3]);
      // a row's keys sit in the 4 lanes of its quad.
      const bool masked = kt + kKeys > warp_unmasked;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& v = sc[j][2 * h + e];
            if (masked && kt + 8 * j + 2 * tig + e >= limit[h]) v = -INFINITY;
            tile_max = fmaxf(tile_max, v);
          }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFFu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFFu, tile_max, 2));
        const float new_max = fmaxf(row_max[h], tile_max);
        const float base = new_max == -INFINITY ? 0.0f : new_max;  // no key yet: keep the state
        const float rescale = exp2f(row_max[h] - base);
        row_max[h] = new_max;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& v = sc[j][2 * h + e];
            v = exp2f(v - base);
            sum += v;
          }
        row_sum[h] = row_sum[h] * rescale + sum;
#pragma unroll
        for (int n = 0; n < kHT; ++n) o[n][2 * h] *= rescale, o[n][2 * h + 1] *= rescale;
      }

      // O += P·V, one k8 step per 8 keys. P's accumulator layout holds keys 8j + 2t, 8j + 2t + 1 in
      // lane t: used as k positions t and t + 4 of the A fragment, with V's rows read to match.
#pragma unroll
      for (int j = 0; j < kNT; ++j) {
        const uint32_t a0 = to_tf32(sc[j][0]), a1 = to_tf32(sc[j][2]);
        const uint32_t a2 = to_tf32(sc[j][1]), a3 = to_tf32(sc[j][3]);
        const float* v0 = Vs + (8 * j + 2 * tig) * S::kVPitch + g;
        const float* v1 = v0 + S::kVPitch;
#pragma unroll
        for (int n = 0; n < kHT; ++n) mma_tf32(o[n], a0, a1, a2, a3, to_tf32(v0[8 * n]), to_tf32(v1[8 * n]));
      }
    }
    __syncthreads();  // every warp is done with stage t & 1 before tile t + 2 is copied into it
  }

  if (!warp_active) return;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = row_sum[h];
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
    const int r = wr + g + 8 * h;
    if (r >= rows) continue;
    const float inv = 1.0f / sum;
    float* dst = out + q_row(r) + 2 * tig;
#pragma unroll
    for (int n = 0; n < kHT; ++n)
      *reinterpret_cast<float2*>(dst + 8 * n) = float2{o[n][2 * h] * inv, o[n][2 * h + 1] * inv};
  }
}

// bf16 mode: 8 warps of 16 query rows for every head_dim (128-row tiles). Per head_dim: keys per tile,
// and whether a warp's Q fragments live in registers (head_dim ≤ 128) or are re-read from shared
// memory (256, whose 128 output registers per thread leave no room).
template <int HD>
struct Bf16Config;
template <>
struct Bf16Config<64> {
  static constexpr int kKeys = 64;
  static constexpr bool kQInRegs = true;
};
template <>
struct Bf16Config<128> {
  static constexpr int kKeys = 64;
  static constexpr bool kQInRegs = true;
};
template <>
struct Bf16Config<256> {
  static constexpr int kKeys = 32;
  static constexpr bool kQInRegs = false;
};

template <int HD>
struct Bf16Shape {
  static constexpr int kWarps = 8, kKeys = Bf16Config<HD>::kKeys;
  static constexpr bool kQInRegs = Bf16Config<HD>::kQInRegs;
  static constexpr int kThreads = kWarps * kWarp, kRows = kWarps * 16;
  // Pitch in bf16: rows 16 bytes apart mod 128 put the 8 row addresses of an ldmatrix in distinct
  // bank groups; the 8-byte stores of a warp (one or two whole rows) stay conflict-free too.
  static constexpr int kPitch = HD + 8;
  static constexpr int kTileElems = kKeys * kPitch;  // one bf16 K or V tile
  static constexpr int kQElems = kQInRegs ? 0 : kRows * kPitch;
  static constexpr int kStageFloats = 2 * kKeys * HD;  // one f32 K and V tile, as cp.async lands it
  static constexpr size_t kSharedBytes = sizeof(float) * kStageFloats + sizeof(__nv_bfloat16) * (4 * kTileElems + kQElems);
  static constexpr int kChunksPerRow = HD / 4;  // float4 chunks of one key row
  static_assert(kThreads % kChunksPerRow == 0, "each thread stages a fixed column of key rows");
  static constexpr int kRowsPerPass = kThreads / kChunksPerRow;
  static_assert(kKeys % kRowsPerPass == 0, "a key tile is whole staging passes");
  static constexpr int kChunks = kKeys / kRowsPerPass;  // per thread, tile and tensor
};

// Two floats to bf16 (RNE), packed as an MMA operand register: lo in bits 0-15.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  uint32_t r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// d += a·b for one m16n8k16 bf16 tile (g = lane / 4, t = lane % 4; each register holds 2 k-adjacent
// values): a0 (g, 2t), a1 (g+8, 2t), a2 (g, 2t+8), a3 (g+8, 2t+8); b0 (k 2t, n g), b1 (k 2t+8, n g);
// c as in mma_tf32.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Four 8×8 b16 matrices from shared memory: lanes 8i..8i+7 address the rows of matrix i, which lands
// in r[i] (lane l: row l/4, columns 2(l%4), +1; with .trans: rows 2(l%4), +1 of column l/4).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __nv_bfloat16* row) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __nv_bfloat16* row) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

template <int HD, typename E>
__global__ void __launch_bounds__(Bf16Shape<HD>::kThreads, 1)
    attention_bf16_kernel(const float* __restrict__ q, const E* __restrict__ pool_k, const E* __restrict__ pool_v,
                          AttentionArrays L, int heads, int kv_heads, float q_scale, int block_shift, int splits,
                          int64_t T, float* __restrict__ partial, float* __restrict__ out) {
  using S = Bf16Shape<HD>;
  constexpr int kKeys = S::kKeys, kNT = kKeys / 8, kKS = HD / 16, kHT = HD / 8, kP = S::kPitch;
  constexpr bool kF32Pool = std::is_same_v<E, float>;
  extern __shared__ float4 smem4[];
  float* staging = reinterpret_cast<float*>(smem4);  // [2][kKeys][HD] f32: K, V (an f32 pool's only)
  __nv_bfloat16* Kb = reinterpret_cast<__nv_bfloat16*>(staging + (kF32Pool ? S::kStageFloats : 0));  // [2][kKeys][kP]
  __nv_bfloat16* Vb = Kb + 2 * S::kTileElems;                                        // [2][kKeys][kP]
  __nv_bfloat16* Qs = Vb + 2 * S::kTileElems;                                        // [kRows][kP]

  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp, g = lane / 4, tig = lane % 4;
  // One kv head's tiles after another, so the blocks in flight share its keys in L2; within it the
  // heaviest tiles (last rows, most keys) first so the causal tail does not straggle.
  const int num_tiles = static_cast<int>(L.num_tiles), block = static_cast<int>(blockIdx.x);
  const int kvh = block / num_tiles, tile = num_tiles - 1 - block % num_tiles;
  const int s = L.tiles[2 * tile], r0 = L.tiles[2 * tile + 1];
  const int group = heads / kv_heads;
  const int seq_begin = L.cu_seqlens[s], len = L.cu_seqlens[s + 1] - seq_begin;
  const int rows = min(S::kRows, len * group - r0);
  const int cached = L.cached[s];
  const int block_keys = cached + (r0 + rows - 1) / group + 1;
  // This block's key split (blockIdx.y of gridDim.y): an equal share of the tile's key tiles, which
  // for the tiles of few keys may be none (it then leaves an empty partial result).
  const int all_tiles = (block_keys + kKeys - 1) / kKeys, split = static_cast<int>(blockIdx.y);
  const int per_split = (all_tiles + splits - 1) / splits;
  const int first_tile = min(all_tiles, split * per_split), key_tiles = min(all_tiles, first_tile + per_split);
  const int32_t* blocks = L.block_table + static_cast<int64_t>(s) * L.max_blocks;
  const int bs = L.block_size;

  // Query row r of the tile is token (r0 + r) / group at head kvh·group + (r0 + r) % group.
  auto q_row = [&](int r) {
    const int row = r0 + r;
    return (static_cast<int64_t>(seq_begin + row / group) * heads + kvh * group + row % group) * HD;
  };

  // This thread's two rows (g and g + 8 of the warp's 16) and their causal limits; padding rows past
  // `rows` see every key of the block (zero Q, never stored) so they stay finite.
  const int wr = warp * 16;
  const bool warp_active = wr < rows;
  int limit[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = wr + g + 8 * h;
    limit[h] = r < rows ? cached + (r0 + r) / group + 1 : block_keys;
  }
  const int warp_last = min(wr + 15, rows - 1);
  const int warp_keys = cached + (r0 + warp_last) / group + 1;  // past its last row's limit: skip
  const int warp_unmasked = cached + (r0 + wr) / group + 1;     // keys below every row's limit

  // While tile t is computed, tile t + 1 lands by cp.async in the f32 staging area and is then rounded
  // into the bf16 buffer tile t - 1 freed (a bf16 pool's lands in that buffer directly); the
  // block-table reads for tile t + 2 are in flight. This thread's chunks of 4 features are key rows
  // chunk_row + i·kRowsPerPass at column chunk_col, of K and V alike, and it rounds only what it
  // copied itself, so staging needs no barrier of its own.
  const int chunk_row = tid / S::kChunksPerRow, chunk_col = (tid % S::kChunksPerRow) * 4;
  int pool_row[S::kChunks];  // of the next tile to stage; -1 past the block's keys (zero-filled)
  auto find_rows = [&](int kt) {
#pragma unroll
    for (int i = 0; i < S::kChunks; ++i) {
      const int p = kt + chunk_row + i * S::kRowsPerPass;
      const int page = block_shift >= 0 ? p >> block_shift : p / bs;
      pool_row[i] = p < block_keys ? __ldg(blocks + page) * bs + (p - page * bs) : -1;
    }
  };
  auto stage_begin = [&](int buffer) {
#pragma unroll
    for (int i = 0; i < S::kChunks; ++i) {
      const int j = chunk_row + i * S::kRowsPerPass;
      const bool live = pool_row[i] >= 0;
      const int64_t src = live ? (static_cast<int64_t>(pool_row[i]) * kv_heads + kvh) * HD + chunk_col : 0;
      if constexpr (kF32Pool) {
        cp_async16(staging + j * HD + chunk_col, pool_k + src, live ? 16 : 0);
        cp_async16(staging + (kKeys + j) * HD + chunk_col, pool_v + src, live ? 16 : 0);
      } else {
        const int dst = buffer * S::kTileElems + j * kP + chunk_col;
        cp_async8(Kb + dst, pool_k + src, live ? 8 : 0);
        cp_async8(Vb + dst, pool_v + src, live ? 8 : 0);
      }
    }
    cp_async_commit();
  };
  auto stage_end = [&](int buffer) {
    cp_async_wait_all();
    if constexpr (kF32Pool) {
#pragma unroll
      for (int i = 0; i < S::kChunks; ++i) {
        const int j = chunk_row + i * S::kRowsPerPass;
        const float4 k = *reinterpret_cast<const float4*>(staging + j * HD + chunk_col);
        const float4 v = *reinterpret_cast<const float4*>(staging + (kKeys + j) * HD + chunk_col);
        const int dst = buffer * S::kTileElems + j * kP + chunk_col;
        *reinterpret_cast<uint2*>(Kb + dst) = uint2{pack_bf16(k.x, k.y), pack_bf16(k.z, k.w)};
        *reinterpret_cast<uint2*>(Vb + dst) = uint2{pack_bf16(v.x, v.y), pack_bf16(v.z, v.w)};
      }
    }
  };

  if (first_tile < key_tiles) {
    find_rows(first_tile * kKeys);
    stage_begin(first_tile & 1);
  }
  // Q, scaled and rounded once: in registers as this lane's A fragments, or in shared memory.
  uint32_t qa[S::kQInRegs ? kKS : 1][4];
  if constexpr (S::kQInRegs) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wr + g + 8 * h;
      const float* src = r < rows ? q + q_row(r) : nullptr;
#pragma unroll
      for (int ks = 0; ks < kKS; ++ks)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const float2 v = src ? *reinterpret_cast<const float2*>(src + 16 * ks + 8 * half + 2 * tig) : float2{0, 0};
          qa[ks][h + 2 * half] = pack_bf16(v.x * q_scale, v.y * q_scale);
        }
    }
  } else {
    for (int idx = tid; idx < S::kRows * (HD / 4); idx += S::kThreads) {
      const int r = idx / (HD / 4), c = (idx % (HD / 4)) * 4;
      float4 v{0, 0, 0, 0};
      if (r < rows) v = *reinterpret_cast<const float4*>(q + q_row(r) + c);
      *reinterpret_cast<uint2*>(Qs + r * kP + c) =
          uint2{pack_bf16(v.x * q_scale, v.y * q_scale), pack_bf16(v.z * q_scale, v.w * q_scale)};
    }
  }
  if (first_tile < key_tiles) stage_end(first_tile & 1);
  if (first_tile + 1 < key_tiles) find_rows((first_tile + 1) * kKeys);
  __syncthreads();  // the first tile (and Q in shared memory) visible to every warp

  float o[kHT][4];
#pragma unroll
  for (int n = 0; n < kHT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
  float row_max[2] = {-INFINITY, -INFINITY}, row_sum[2] = {0.0f, 0.0f};  // row_sum: this lane's share
  const int mat = lane / 8, mat_row = lane % 8;  // the ldmatrix matrix and row this lane addresses

  for (int t = first_tile; t < key_tiles; ++t) {
    const int kt = t * kKeys;
    if (t + 1 < key_tiles) stage_begin((t + 1) & 1);  // staging / buffer (t + 1) & 1 free since the barrier
    if (t + 2 < key_tiles) find_rows(kt + 2 * kKeys);

    if (warp_active && kt < warp_keys) {
      const __nv_bfloat16* Ks = Kb + (t & 1) * S::kTileElems;
      const __nv_bfloat16* Vs = Vb + (t & 1) * S::kTileElems;

      // S = Q·Kᵀ: K's rows are keys, so plain ldmatrix gives B fragments of key blocks 2jj and 2jj + 1.
      float sc[kNT][4];
#pragma unroll
      for (int j = 0; j < kNT; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < kKS; ++ks) {
        uint32_t a[4];
        if constexpr (S::kQInRegs) {
#pragma unroll
          for (int e = 0; e < 4; ++e) a[e] = qa[ks][e];
        } else {
          ldmatrix_x4(a, Qs + (wr + 8 * (mat % 2) + mat_row) * kP + 16 * ks + 8 * (mat / 2));
        }
#pragma unroll
        for (int jj = 0; jj < kNT / 2; ++jj) {
          uint32_t b[4];
          ldmatrix_x4(b, Ks + (16 * jj + 8 * (mat / 2) + mat_row) * kP + 16 * ks + 8 * (mat % 2));
          mma_bf16(sc[2 * jj], a, b[0], b[1]);
          mma_bf16(sc[2 * jj + 1], a, b[2], b[3]);
        }
      }

      // Online softmax (log2 units) of rows g (h = 0: sc[.][0..1]) and g + 8 (h = 1: sc[.][2..3]);
      // a row's keys sit in the 4 lanes of its quad.
      const bool masked = kt + kKeys > warp_unmasked;
      float rescale[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float tile_max = -INFINITY;
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& v = sc[j][2 * h + e];
            if (masked && kt + 8 * j + 2 * tig + e >= limit[h]) v = -INFINITY;
            tile_max = fmaxf(tile_max, v);
          }
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFFu, tile_max, 1));
        tile_max = fmaxf(tile_max, __shfl_xor_sync(0xFFFFFFFFu, tile_max, 2));
        const float new_max = fmaxf(row_max[h], tile_max);
        const float base = new_max == -INFINITY ? 0.0f : new_max;  // no key yet: keep the state
        rescale[h] = exp2f(row_max[h] - base);
        row_max[h] = new_max;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            float& v = sc[j][2 * h + e];
            v = exp2f(v - base);
            sum += v;
          }
        row_sum[h] = row_sum[h] * rescale[h] + sum;
      }
      // Once the running maxima settle (most tiles of a long row) every factor is 1: skip the pass.
      if (__any_sync(0xFFFFFFFFu, rescale[0] != 1.0f || rescale[1] != 1.0f)) {
#pragma unroll
        for (int n = 0; n < kHT; ++n) {
          o[n][0] *= rescale[0], o[n][1] *= rescale[0];
          o[n][2] *= rescale[1], o[n][3] *= rescale[1];
        }
      }

      // O += P·V, one k16 step per 16 keys: the accumulators of key blocks 2kk, 2kk + 1 are the A
      // fragment as they stand; V's rows are keys, so ldmatrix.trans gives its B fragments.
#pragma unroll
      for (int kk = 0; kk < kNT / 2; ++kk) {
        const uint32_t a[4] = {pack_bf16(sc[2 * kk][0], sc[2 * kk][1]), pack_bf16(sc[2 * kk][2], sc[2 * kk][3]),
                               pack_bf16(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                               pack_bf16(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
        for (int nn = 0; nn < kHT / 2; ++nn) {
          uint32_t b[4];
          ldmatrix_x4_trans(b, Vs + (16 * kk + 8 * (mat % 2) + mat_row) * kP + 8 * (2 * nn + mat / 2));
          mma_bf16(o[2 * nn], a, b[0], b[1]);
          mma_bf16(o[2 * nn + 1], a, b[2], b[3]);
        }
      }
    }
    if (t + 1 < key_tiles) stage_end((t + 1) & 1);  // last read by tile t - 1, before the previous barrier
    __syncthreads();  // tile t + 1 complete, and every warp done with tile t before t + 2 replaces it
  }

  if (!warp_active) return;
  // Split: the un-normalised accumulators [splits, T, heads, HD], then (max, sum) pairs, the maxima
  // in natural-log units as launch_attention_combine merges them.
  const int64_t slice = T * heads;
  float* part_acc = partial + split * slice * HD;
  float* part_ml = partial + splits * slice * HD + 2 * split * slice;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = row_sum[h];
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 1);
    sum += __shfl_xor_sync(0xFFFFFFFFu, sum, 2);
    const int r = wr + g + 8 * h;
    if (r >= rows) continue;
    const int64_t at = q_row(r);
    if (splits > 1) {
      float* dst = part_acc + at + 2 * tig;
#pragma unroll
      for (int n = 0; n < kHT; ++n) *reinterpret_cast<float2*>(dst + 8 * n) = float2{o[n][2 * h], o[n][2 * h + 1]};
      if (tig == 0) {
        part_ml[2 * (at / HD)] = row_max[h] * 0.6931471805599453f;  // log2 → natural units
        part_ml[2 * (at / HD) + 1] = sum;
      }
      continue;
    }
    const float inv = 1.0f / sum;
    float* dst = out + at + 2 * tig;
#pragma unroll
    for (int n = 0; n < kHT; ++n)
      *reinterpret_cast<float2*>(dst + 8 * n) = float2{o[n][2 * h] * inv, o[n][2 * h + 1] * inv};
  }
}

template <int HD, bool kBf16, typename E>
void launch_mma(const float* q, const E* pool_k, const E* pool_v, const AttentionArrays& layout, int64_t T,
                int64_t heads, int64_t kv_heads, float scale, int splits, float* partial, float* out,
                cudaStream_t stream) {
  const void* kernel = kBf16 ? reinterpret_cast<const void*>(attention_bf16_kernel<HD, E>)
                             : reinterpret_cast<const void*>(attention_mma_kernel<HD, E>);
  const int threads = kBf16 ? Bf16Shape<HD>::kThreads : MmaShape<HD>::kThreads;
  // The bf16 kernel over a bf16 pool has no f32 staging area.
  const size_t staging = kBf16 && !std::is_same_v<E, float> ? sizeof(float) * Bf16Shape<HD>::kStageFloats : 0;
  const size_t shared = (kBf16 ? Bf16Shape<HD>::kSharedBytes : MmaShape<HD>::kSharedBytes) - staging;
  // Beyond 48 KiB a kernel must opt in (a per-device function attribute, cheap to set again).
  QINFER_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  const int bs = layout.block_size;
  const int block_shift = (bs & (bs - 1)) == 0 ? __builtin_ctz(static_cast<unsigned>(bs)) : -1;
  const int64_t blocks = layout.num_tiles * kv_heads;
  if (blocks > std::numeric_limits<int32_t>::max())
    throw_error("attention_mma: the batch has more query tiles x kv heads than a grid holds");
  const float q_scale = scale * 1.4426950408889634f;  // log2(e): the softmax runs in exp2
  if constexpr (kBf16) {
    const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(splits));
    attention_bf16_kernel<HD, E><<<grid, threads, shared, stream>>>(q, pool_k, pool_v, layout, static_cast<int>(heads),
                                                                    static_cast<int>(kv_heads), q_scale, block_shift,
                                                                    splits, T, partial, out);
    QINFER_CUDA_CHECK_LAUNCH("attention_bf16_kernel<<<>>>");
    if (splits > 1) launch_attention_combine(partial, splits, T, heads, HD, out, stream);
  } else {
    attention_mma_kernel<HD, E><<<static_cast<unsigned>(blocks), threads, shared, stream>>>(
        q, pool_k, pool_v, layout, static_cast<int>(heads), static_cast<int>(kv_heads), q_scale, block_shift, out);
    QINFER_CUDA_CHECK_LAUNCH("attention_mma_kernel<<<>>>");
  }
}

template <int HD>
void launch_precision(const float* q, const KvPoolView& pool, const AttentionArrays& layout, int64_t T, int64_t heads,
                      int64_t kv_heads, float scale, bool bf16, int splits, float* partial, float* out,
                      cudaStream_t stream) {
  with_kv_type(pool, [&](auto e) {
    using E = decltype(e);
    const auto* k = static_cast<const E*>(pool.k);
    const auto* v = static_cast<const E*>(pool.v);
    if (bf16) launch_mma<HD, true>(q, k, v, layout, T, heads, kv_heads, scale, splits, partial, out, stream);
    else launch_mma<HD, false>(q, k, v, layout, T, heads, kv_heads, scale, 1, nullptr, out, stream);
  });
}

}  // namespace

int64_t attention_mma_tile_rows(int64_t head_dim, bool bf16) {
  switch (head_dim) {
    case 64: return bf16 ? Bf16Shape<64>::kRows : MmaShape<64>::kRows;
    case 128: return bf16 ? Bf16Shape<128>::kRows : MmaShape<128>::kRows;
    case 256: return bf16 ? Bf16Shape<256>::kRows : MmaShape<256>::kRows;
    default: return 0;
  }
}

size_t attention_mma_shared_bytes(int64_t head_dim, bool bf16) {
  switch (head_dim) {
    case 64: return bf16 ? Bf16Shape<64>::kSharedBytes : MmaShape<64>::kSharedBytes;
    case 128: return bf16 ? Bf16Shape<128>::kSharedBytes : MmaShape<128>::kSharedBytes;
    case 256: return bf16 ? Bf16Shape<256>::kSharedBytes : MmaShape<256>::kSharedBytes;
    default: return 0;
  }
}

int attention_mma_splits(int64_t blocks, int64_t max_keys, int sm_count) {
  // One block per SM (the kernel's shared memory): split until the grid covers the SMs, each split
  // keeping at least kMinKeys keys so the merge stays small beside the work.
  constexpr int64_t kMinKeys = 256, kMaxSplits = 16;
  if (blocks <= 0 || blocks >= sm_count) return 1;
  const int64_t wanted = (sm_count + blocks - 1) / blocks;
  return static_cast<int>(std::max<int64_t>(1, std::min({wanted, max_keys / kMinKeys, kMaxSplits})));
}

void launch_attention_mma(const float* q, const KvPoolView& pool, const AttentionArrays& layout, int64_t T,
                          int64_t heads, int64_t kv_heads, int64_t head_dim, float scale, bool bf16, int splits,
                          float* partial, float* out, cudaStream_t stream) {
  if (layout.num_tiles == 0 || heads == 0) return;
  if (!bf16 || partial == nullptr) splits = 1;
  switch (head_dim) {
    case 64: return launch_precision<64>(q, pool, layout, T, heads, kv_heads, scale, bf16, splits, partial, out, stream);
    case 128: return launch_precision<128>(q, pool, layout, T, heads, kv_heads, scale, bf16, splits, partial, out, stream);
    case 256: return launch_precision<256>(q, pool, layout, T, heads, kv_heads, scale, bf16, splits, partial, out, stream);
    default: throw_error("attention_mma: head_dim " + std::to_string(head_dim) + " has no tensor-core kernel");
  }
}

}  // namespace qinfer::cuda
