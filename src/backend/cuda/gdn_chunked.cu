// The gated delta rule in its chunked WY / UT-transform form (ref/gated_delta.cpp derives it), on the
// tensor cores. Per chunk of n ≤ 64 tokens with state S0 at its start and G_u = g_0 + … + g_u:
//   A[u,w] = β_u e^{G_u−G_w} (k_u·k_w) for w < u,   (I + A) W = β e^{G} K,   (I + A) U = β V,
//   δ = U − W S0ᵀ,   o_t = e^{G_t} S0 q_t + Σ_{u≤t} P[t,u] δ_u,   P[t,u] = e^{G_t−G_u} (q_t·k_u),
//   S_n = e^{G_{n−1}} S0 + Σ_u e^{G_{n−1}−G_u} δ_u k_uᵀ.
// chunk_prep_kernel computes every (chunk, value head)'s W, U, P and decays at once; chunk_scan_kernel
// then walks the chunks in order per (sequence, value head, 32 state rows), eight warps each holding a
// 16-row × Dk/4 slice of the state in registers (state rows evolve independently given W, K, Q, P; key
// slices meet in shared memory for W S0ᵀ and Q S0ᵀ). Products run as 3xTF32
// (hi·hi + hi·lo + lo·hi, f32 accumulation), as accurate as f32; the triangular solve is f32 FMAs.
#include "backend/cuda/common.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kC = static_cast<int>(kDeltaChunk);
static_assert(kC == 64, "the kernels tile a chunk as 4 × 16 rows and 8 × 8 columns");
constexpr int kPrepThreads = 256;
constexpr int kTokenTiles = kC / 8;
constexpr int kScanRowGroups = 2;  // 16 state rows each
constexpr int kScanKSplit = 4;     // key-column slices per row group
constexpr int kScanWarps = kScanRowGroups * kScanKSplit;
constexpr int kScanThreads = kScanWarps * kWarp;
constexpr int kRowsPerWarp = 16;
constexpr int kDvTile = kScanRowGroups * kRowsPerWarp;

// Key head dims are zero-padded to one of the compiled widths.
int padded_dk(int64_t Dk) { return Dk <= 32 ? 32 : Dk <= 64 ? 64 : 128; }

__device__ __forceinline__ uint32_t to_tf32(float x) {
  uint32_t r;
  asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

// x ≈ hi + lo with both TF32: hi·hi + hi·lo + lo·hi misses only lo·lo (2⁻²² relative).
struct Split {
  uint32_t hi, lo;
};
__device__ __forceinline__ Split split(float x) {
  const uint32_t hi = to_tf32(x);
  return {hi, to_tf32(x - __uint_as_float(hi))};
}

// d += a·b for one m16n8k8 TF32 tile. Fragments (g = lane / 4, t = lane % 4): a0 (g, t), a1 (g+8, t),
// a2 (g, t+4), a3 (g+8, t+4); b0 (k t, n g), b1 (k t+4, n g); c0/c1 (g, 2t/2t+1), c2/c3 (g+8, ...).
__device__ __forceinline__ void mma_tf32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// The three products of 3xTF32: the small terms (lo·hi, hi·lo) first, then hi·hi.
enum class Pass { lo_hi, hi_lo, hi_hi };
template <Pass kPass>
__device__ __forceinline__ void mma_pass(float (&d)[4], const Split (&a)[4], Split b0, Split b1) {
  if constexpr (kPass == Pass::lo_hi)
    mma_tf32(d, a[0].lo, a[1].lo, a[2].lo, a[3].lo, b0.hi, b1.hi);
  else if constexpr (kPass == Pass::hi_lo)
    mma_tf32(d, a[0].hi, a[1].hi, a[2].hi, a[3].hi, b0.lo, b1.lo);
  else
    mma_tf32(d, a[0].hi, a[1].hi, a[2].hi, a[3].hi, b0.hi, b1.hi);
}

// d += a·b in 3xTF32.
__device__ __forceinline__ void mma3(float (&d)[4], const Split (&a)[4], Split b0, Split b1) {
  mma_pass<Pass::lo_hi>(d, a, b0, b1);
  mma_pass<Pass::hi_lo>(d, a, b0, b1);
  mma_pass<Pass::hi_hi>(d, a, b0, b1);
}

// One pass over a row of tiles d[i] += a·b[i]: MMAs issue in order, so the scan lines up independent
// ones back to back instead of waiting out each one's latency on its accumulator.
template <Pass kPass, int kN>
__device__ __forceinline__ void mma_row(float (&d)[kN][4], const Split (&a)[4], const Split (&b)[kN][2]) {
#pragma unroll
  for (int i = 0; i < kN; ++i) mma_pass<kPass>(d[i], a, b[i][0], b[i][1]);
}

// Global → shared copies; a dead one fills zeros without reading.
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool live) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(addr), "l"(src), "r"(live ? 16 : 0) : "memory");
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool live) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(addr), "l"(src), "r"(live ? 8 : 0) : "memory");
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool live) {
  const auto addr = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(addr), "l"(src), "r"(live ? 4 : 0) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Work memory, indexed by token like the inputs: W [T, Hv, kDk], P [T, Hv, kC] (row t of its chunk's
// P), decays [T, Hv] (e^{G_t}, e^{G_{n−1}−G_t}). U goes to `out`, which the scan overwrites with o.
struct Work {
  float* w;
  float* p;
  float2* decay;
};
Work work_at(float* base, int64_t T, int64_t Hv, int kDk) {
  float* p = base + T * Hv * kDk;
  return {base, p, reinterpret_cast<float2*>(p + T * Hv * kC)};
}

template <int kDk>
struct PrepShared {
  static constexpr int kPitch = kDk + 4;   // ≡ 4 (mod 32): fragment reads (row g, column t) hit 32 banks
  static constexpr int kAPitch = kC + 8;   // rows stay 16-byte aligned for the solve's float4 reads
  static constexpr size_t kBytes = kC * sizeof(double) + sizeof(float) * (2 * kC * kPitch + kC * kAPitch + 2 * kC);
};

// x_u = x_u − Σ_{w<u} A[u,w] x_w down one column of pitch Sh::kPitch, the column in registers.
template <typename Sh>
__device__ __forceinline__ void solve_column(float* col, const float* As) {
  float x[kC];
#pragma unroll
  for (int u = 0; u < kC; ++u) x[u] = col[u * Sh::kPitch];
#pragma unroll
  for (int u = 1; u < kC; ++u) {
    const float* a_row = As + u * Sh::kAPitch;
    float acc0 = x[u], acc1 = 0.0f;  // two chains for latency
#pragma unroll
    for (int w = 0; w < u; w += 4) {
      const float4 a4 = *reinterpret_cast<const float4*>(a_row + w);
      acc0 = fmaf(-a4.x, x[w], acc0);
      if (w + 1 < u) acc1 = fmaf(-a4.y, x[w + 1], acc1);
      if (w + 2 < u) acc0 = fmaf(-a4.z, x[w + 2], acc0);
      if (w + 3 < u) acc1 = fmaf(-a4.w, x[w + 3], acc1);
    }
    x[u] = acc0 + acc1;
  }
#pragma unroll
  for (int u = 0; u < kC; ++u) col[u * Sh::kPitch] = x[u];
}

// One block per (chunk, value head): A and P on the tensor cores, then W and U by forward
// substitution.
template <int kDk>
__global__ void __launch_bounds__(kPrepThreads, 2)
    chunk_prep_kernel(const float* __restrict__ q, const float* __restrict__ k, const float* __restrict__ v,
                      const float* __restrict__ g, const float* __restrict__ beta, SeqArrays L,
                      const int32_t* __restrict__ seqs, int64_t Hk, int64_t Hv, int Dk, int Dv, Work work,
                      float* __restrict__ u_out) {
  using Sh = PrepShared<kDk>;
  extern __shared__ float4 prep_smem[];  // 16-byte aligned for the solve's float4 reads
  double* G = reinterpret_cast<double*>(prep_smem);  // [kC] cumulative log decay
  float* Ks = reinterpret_cast<float*>(G + kC);   // [kC, kPitch]
  float* Qs = Ks + kC * Sh::kPitch;                // [kC, kPitch]
  float* As = Qs + kC * Sh::kPitch;                // [kC, kAPitch] A, zero on and above the diagonal
  float* b = As + kC * Sh::kAPitch;                // [kC] β
  float* bg = b + kC;                              // [kC] β e^{G}

  const int s = seqs[blockIdx.x];
  const int64_t first = L.cu_seqlens[s];
  const int len = L.cu_seqlens[s + 1] - L.cu_seqlens[s];
  const int c0 = static_cast<int>(blockIdx.z) * kC;
  if (c0 >= len) return;
  const int n = min(kC, len - c0);
  const int64_t h = blockIdx.y, kh = h / (Hv / Hk), t0 = first + c0;
  const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp, gq = lane / 4, tq = lane % 4;

  for (int idx = tid; idx < kC * kDk; idx += kPrepThreads) {
    const int u = idx / kDk, j = idx % kDk;
    const bool live = u < n && j < Dk;
    const int64_t src = ((t0 + u) * Hk + kh) * Dk + j;
    Ks[u * Sh::kPitch + j] = live ? k[src] : 0.0f;
    Qs[u * Sh::kPitch + j] = live ? q[src] : 0.0f;
  }
  if (warp == 0) {
    // Lane l holds tokens 2l, 2l+1; a scan in double: G_t − G_u of nearby tokens must not lose
    // digits to a large |G|. Tokens past n add nothing.
    const int u = 2 * lane;
    const double g0 = u < n ? g[(t0 + u) * Hv + h] : 0.0, g1 = u + 1 < n ? g[(t0 + u + 1) * Hv + h] : 0.0;
    double scan = g0 + g1;
#pragma unroll
    for (int offset = 1; offset < kWarp; offset *= 2) {
      const double below = __shfl_up_sync(0xFFFFFFFFu, scan, offset);
      if (lane >= offset) scan += below;
    }
    G[u] = scan - g1;
    G[u + 1] = scan;
    const float b0 = u < n ? beta[(t0 + u) * Hv + h] : 0.0f, b1 = u + 1 < n ? beta[(t0 + u + 1) * Hv + h] : 0.0f;
    b[u] = b0;
    b[u + 1] = b1;
    bg[u] = static_cast<float>(b0 * exp(scan - g1));
    bg[u + 1] = static_cast<float>(b1 * exp(scan));
  }
  __syncthreads();
  if (tid < n) {
    work.decay[(t0 + tid) * Hv + h] =
        make_float2(static_cast<float>(exp(G[tid])), static_cast<float>(exp(G[n - 1] - G[tid])));
  }

  // Warps 0-3: K Kᵀ → A; warps 4-7: Q Kᵀ → P; 16 rows each, tiles above the diagonal skipped.
  {
    const bool is_p = warp >= 4;
    const int m0 = (warp % 4) * 16;
    const float* X = is_p ? Qs : Ks;
    float acc[8][4] = {};
#pragma unroll 4
    for (int ks = 0; ks < kDk / 8; ++ks) {
      const float* xa = X + (m0 + gq) * Sh::kPitch + ks * 8 + tq;
      const Split a[4] = {split(xa[0]), split(xa[8 * Sh::kPitch]), split(xa[4]), split(xa[8 * Sh::kPitch + 4])};
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        if (nt * 8 > m0 + 15) continue;
        const float* kb = Ks + (nt * 8 + gq) * Sh::kPitch + ks * 8 + tq;
        mma3(acc[nt], a, split(kb[0]), split(kb[4]));
      }
    }
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = m0 + gq + (e / 2) * 8, col = nt * 8 + 2 * tq + e % 2;
        const float decay = expf(static_cast<float>(G[row] - G[col]));  // used only where col ≤ row
        if (is_p) {
          if (row < n) work.p[((t0 + row) * Hv + h) * kC + col] = col <= row ? decay * acc[nt][e] : 0.0f;
        } else {
          As[row * Sh::kAPitch + col] = col < row ? b[row] * decay * acc[nt][e] : 0.0f;
        }
      }
  }
  __syncthreads();

  // (I + A) X = B by forward substitution, one column per thread, in place in shared memory: first
  // B = β e^{G} K (→ W, zero past Dk) in Ks beside β V's first kDk columns (→ U) in Qs, then
  // further blocks of β V in Qs.
  for (int idx = tid; idx < kC * kDk; idx += kPrepThreads) {
    const int u = idx / kDk, j = idx % kDk;
    Ks[u * Sh::kPitch + j] *= bg[u];
  }
  for (int v0 = 0; v0 < Dv; v0 += kDk) {
    const int cols = min(kDk, Dv - v0);
    for (int idx = tid; idx < kC * kDk; idx += kPrepThreads) {
      const int u = idx / kDk, j = idx % kDk;
      Qs[u * Sh::kPitch + j] = u < n && j < cols ? b[u] * v[((t0 + u) * Hv + h) * Dv + v0 + j] : 0.0f;
    }
    __syncthreads();
    const bool first_block = v0 == 0;
    if (first_block && tid < kDk) solve_column<Sh>(Ks + tid, As);
    const int c = first_block ? tid - kDk : tid;
    if (c >= 0 && c < cols) solve_column<Sh>(Qs + c, As);
    __syncthreads();
    if (first_block)
      for (int idx = tid; idx < n * kDk; idx += kPrepThreads) {
        const int u = idx / kDk, j = idx % kDk;
        work.w[((t0 + u) * Hv + h) * kDk + j] = Ks[u * Sh::kPitch + j];
      }
    for (int idx = tid; idx < n * cols; idx += kPrepThreads) {
      const int u = idx / cols, j = idx % cols;
      u_out[((t0 + u) * Hv + h) * Dv + v0 + j] = Qs[u * Sh::kPitch + j];
    }
    __syncthreads();  // before the next block of β V overwrites Qs
  }
}

template <int kDk>
struct ScanShared {
  static constexpr int kWPitch = kDk + 8;   // ≡ 8 (mod 32): float2 reads (row g, columns 2t, 2t+1) conflict-free
  static constexpr int kKPitch = kDk + 4;   // ≡ 4 (mod 32): reads (row 2t or 2t+1, column g) conflict-free
  static constexpr int kPPitch = kC + 8;
  static constexpr int kUPitch = kDvTile + 4;
  // Accumulator tiles kept as one float4 per lane: the partial W S0ᵀ and Q S0ᵀ of every (key slice,
  // row group, token tile), and δ of every (row group, token tile).
  static constexpr int kPartialTiles = kScanKSplit * kScanRowGroups * 2 * kTokenTiles;
  static constexpr int kDeltaTiles = kScanRowGroups * kTokenTiles;
  static constexpr size_t kBytes = sizeof(float4) * kWarp * (kPartialTiles + kDeltaTiles) +
                                   sizeof(float) * (2 * kC * kWPitch + kC * kKPitch + kC * kPPitch + kC * kUPitch + 2 * kC);
};

// Rows [0, n) × columns [0, cols) of a [kC, kCols] tile from global rows src + r·ld into shared rows of
// `pitch`, zeros elsewhere; whole 16-byte pieces when `vec` (cols and every row start aligned).
template <int kCols>
__device__ __forceinline__ void load_tile(float* dst, int pitch, const float* src, int64_t ld, int n, int cols,
                                          bool vec) {
  if (vec) {
    constexpr int kPieces = kCols / 4;
#pragma unroll 4
    for (int idx = threadIdx.x; idx < kC * kPieces; idx += kScanThreads) {
      const int r = idx / kPieces, c = idx % kPieces * 4;
      const bool live = r < n && c < cols;
      cp_async16(dst + r * pitch + c, live ? src + r * ld + c : src, live);
    }
  } else {
    for (int idx = threadIdx.x; idx < kC * kCols; idx += kScanThreads) {
      const int r = idx / kCols, c = idx % kCols;
      const bool live = r < n && c < cols;
      cp_async4(dst + r * pitch + c, live ? src + r * ld + c : src, live);
    }
  }
}

__device__ __forceinline__ void add4(float (&acc)[4], float4 x) {
  acc[0] += x.x;
  acc[1] += x.y;
  acc[2] += x.z;
  acc[3] += x.w;
}

// One block per (sequence, value head, kDvTile state rows); warp w owns rows 16 (w % 2) .. +15 of the
// tile and key columns [kDk/4 · (w / 2), +kDk/4): eight warps per block keep all four schedulers of an
// SM busy on the sequential pass. W S0ᵀ and Q S0ᵀ are summed over the four key slices in shared
// memory; each warp then owns two token tiles of δ and o (one early, one late: the same share of the
// triangular P for every warp). Accumulator layouts double as operand layouts: within each 8-wide k
// step, MMA k slot t stands for column 2t and slot t+4 for column 2t+1, so a state or δ tile (c0..c3)
// is an A fragment (c0, c2, c1, c3) as it is, and B fragments read the matching columns. Copies for the
// next chunk overlap compute: W and Q load during steps 2-4, K, P, U and the decays during step 1.
template <int kDk>
__global__ void __launch_bounds__(kScanThreads, 1)
    chunk_scan_kernel(const float* __restrict__ q, const float* __restrict__ k, SeqArrays L,
                      const int32_t* __restrict__ seqs, int64_t Hk, int64_t Hv, int Dk, int Dv, bool vec, Work work,
                      float* __restrict__ state, float* __restrict__ out) {
  using Sh = ScanShared<kDk>;
  constexpr int kSlice = kDk / kScanKSplit;  // key columns per warp
  constexpr int kSteps = kSlice / 8;         // 8-column tiles of the warp's state rows
  static_assert(kSteps >= 1 && 2 * kScanKSplit == kTokenTiles, "each warp owns two token tiles");
  extern __shared__ float4 scan_smem[];
  float4* partial = scan_smem;                                      // [kPartialTiles][kWarp]
  float4* delta_s = partial + Sh::kPartialTiles * kWarp;            // [kDeltaTiles][kWarp]
  float* Ws = reinterpret_cast<float*>(delta_s + Sh::kDeltaTiles * kWarp);  // [kC, kWPitch]
  float* Qs = Ws + kC * Sh::kWPitch;                                // [kC, kWPitch]
  float* Ks = Qs + kC * Sh::kWPitch;                                // [kC, kKPitch]
  float* Ps = Ks + kC * Sh::kKPitch;                                // [kC, kPPitch]
  float* Us = Ps + kC * Sh::kPPitch;                                // [kC, kUPitch]: U of the tile's rows
  float2* Ds = reinterpret_cast<float2*>(Us + kC * Sh::kUPitch);    // [kC] decays

  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, gq = lane / 4, tq = lane % 4;
  const int rg = warp % kScanRowGroups, kq = warp / kScanRowGroups;
  const int r0 = rg * kRowsPerWarp, k0 = kq * kSlice;
  const int own_tiles[2] = {kq, kTokenTiles - 1 - kq};
  const auto partial_at = [&](int slice, int which, int nt) {
    return partial + (((slice * kScanRowGroups + rg) * 2 + which) * kTokenTiles + nt) * kWarp + lane;
  };
  const auto delta_at = [&](int nt) { return delta_s + (rg * kTokenTiles + nt) * kWarp + lane; };

  const int s = seqs[blockIdx.x];
  const int64_t h = blockIdx.y, kh = h / (Hv / Hk);
  const int i0 = blockIdx.z * kDvTile, dvt = min(kDvTile, Dv - i0);
  const float* Sg = state + (static_cast<int64_t>(L.state_slot[s]) * Hv + h) * Dv * Dk;
  float* Sg_to = state + (static_cast<int64_t>(L.state_to[s]) * Hv + h) * Dv * Dk;
  float* Sg_also =
      L.snapshot_to[s] < 0 ? nullptr : state + (static_cast<int64_t>(L.snapshot_to[s]) * Hv + h) * Dv * Dk;

  // S[j][e]: row i0 + r0 + gq (+8 for e ≥ 2), column k0 + 8j + 2tq + e % 2; zero past Dv and Dk.
  float S[kSteps][4];
#pragma unroll
  for (int j = 0; j < kSteps; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = i0 + r0 + gq + (e / 2) * 8, col = k0 + 8 * j + 2 * tq + e % 2;
      S[j][e] = row < Dv && col < Dk ? Sg[static_cast<int64_t>(row) * Dk + col] : 0.0f;
    }

  const int64_t first = L.cu_seqlens[s];
  const int len = L.cu_seqlens[s + 1] - L.cu_seqlens[s];
  auto load_wq = [&](int c0) {
    const int64_t t0 = first + c0;
    const int n = min(kC, len - c0);
    load_tile<kDk>(Ws, Sh::kWPitch, work.w + (t0 * Hv + h) * kDk, Hv * kDk, n, kDk, true);
    load_tile<kDk>(Qs, Sh::kWPitch, q + (t0 * Hk + kh) * Dk, Hk * Dk, n, Dk, vec);
  };
  auto load_rest = [&](int c0) {
    const int64_t t0 = first + c0;
    const int n = min(kC, len - c0);
    load_tile<kDk>(Ks, Sh::kKPitch, k + (t0 * Hk + kh) * Dk, Hk * Dk, n, Dk, vec);
    load_tile<kC>(Ps, Sh::kPPitch, work.p + (t0 * Hv + h) * kC, Hv * kC, n, kC, true);
    load_tile<kDvTile>(Us, Sh::kUPitch, out + (t0 * Hv + h) * Dv + i0, Hv * Dv, n, dvt, vec);
    for (int u = threadIdx.x; u < kC; u += kScanThreads)
      cp_async8(Ds + u, work.decay + (t0 + (u < n ? u : 0)) * Hv + h, u < n);
  };
  load_wq(0);
  cp_async_commit();
  load_rest(0);
  cp_async_commit();

  for (int c0 = 0; c0 < len; c0 += kC) {
    const int n = min(kC, len - c0);
    const int64_t t0 = first + c0;
    cp_async_wait<1>();  // this chunk's W and Q
    __syncthreads();

    // 1. The warp's key slice of (W S0ᵀ)ᵀ and (Q S0ᵀ)ᵀ: [16 rows, 64 tokens] each, to shared memory.
    {
      float wd[kTokenTiles][4] = {}, o[kTokenTiles][4] = {};
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        const Split a[4] = {split(S[ks][0]), split(S[ks][2]), split(S[ks][1]), split(S[ks][3])};
        Split bw[kTokenTiles][2], bq[kTokenTiles][2];
#pragma unroll
        for (int nt = 0; nt < kTokenTiles; ++nt) {
          const int at = (nt * 8 + gq) * Sh::kWPitch + k0 + ks * 8 + 2 * tq;
          const float2 w2 = *reinterpret_cast<const float2*>(Ws + at);
          const float2 q2 = *reinterpret_cast<const float2*>(Qs + at);
          bw[nt][0] = split(w2.x);
          bw[nt][1] = split(w2.y);
          bq[nt][0] = split(q2.x);
          bq[nt][1] = split(q2.y);
        }
        mma_row<Pass::lo_hi>(wd, a, bw);
        mma_row<Pass::lo_hi>(o, a, bq);
        mma_row<Pass::hi_lo>(wd, a, bw);
        mma_row<Pass::hi_lo>(o, a, bq);
        mma_row<Pass::hi_hi>(wd, a, bw);
        mma_row<Pass::hi_hi>(o, a, bq);
      }
#pragma unroll
      for (int nt = 0; nt < kTokenTiles; ++nt) {
        *partial_at(kq, 0, nt) = make_float4(wd[nt][0], wd[nt][1], wd[nt][2], wd[nt][3]);
        *partial_at(kq, 1, nt) = make_float4(o[nt][0], o[nt][1], o[nt][2], o[nt][3]);
      }
    }
    cp_async_wait<0>();  // K, P, U and the decays
    __syncthreads();     // and every warp is done with W and Q, its partial sums stored
    if (c0 + kC < len) load_wq(c0 + kC);
    cp_async_commit();

    // 2. For the warp's two token tiles: δ = U − W S0ᵀ (zero for tokens past n), shared with the row
    // group; the state's part of o decays by e^{G_t}.
    float od[2][4];
#pragma unroll
    for (int m = 0; m < 2; ++m) {
      const int nt = own_tiles[m];
      float wsum[4] = {}, osum[4] = {};
#pragma unroll
      for (int slice = 0; slice < kScanKSplit; ++slice) {
        add4(wsum, *partial_at(slice, 0, nt));
        add4(osum, *partial_at(slice, 1, nt));
      }
      float d[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int u = nt * 8 + 2 * tq + e % 2, row = r0 + gq + (e / 2) * 8;
        d[e] = u < n ? Us[u * Sh::kUPitch + row] - wsum[e] : 0.0f;
        od[m][e] = osum[e] * Ds[u].x;
      }
      *delta_at(nt) = make_float4(d[0], d[1], d[2], d[3]);
    }
    __syncthreads();  // the row group's δ complete
    float delta[kTokenTiles][4];
#pragma unroll
    for (int ks = 0; ks < kTokenTiles; ++ks) {
      const float4 d4 = *delta_at(ks);
      delta[ks][0] = d4.x;
      delta[ks][1] = d4.y;
      delta[ks][2] = d4.z;
      delta[ks][3] = d4.w;
    }

    // 3. o += δ Pᵀ over the token tiles at or below the diagonal (P is zero above it), then out (where
    // U was). The small terms go to their own accumulators: more independent MMAs in flight.
    float o_small[2][4] = {};
#pragma unroll
    for (int ks = 0; ks < kTokenTiles; ++ks) {
      const Split a[4] = {split(delta[ks][0]), split(delta[ks][2]), split(delta[ks][1]), split(delta[ks][3])};
      const bool live[2] = {ks <= own_tiles[0], ks <= own_tiles[1]};
      Split bp[2][2] = {};
#pragma unroll
      for (int m = 0; m < 2; ++m) {
        if (!live[m]) continue;
        const float2 p2 = *reinterpret_cast<const float2*>(Ps + (own_tiles[m] * 8 + gq) * Sh::kPPitch + ks * 8 + 2 * tq);
        bp[m][0] = split(p2.x);
        bp[m][1] = split(p2.y);
      }
#pragma unroll
      for (int m = 0; m < 2; ++m)
        if (live[m]) mma_pass<Pass::lo_hi>(o_small[m], a, bp[m][0], bp[m][1]);
#pragma unroll
      for (int m = 0; m < 2; ++m)
        if (live[m]) mma_pass<Pass::hi_hi>(od[m], a, bp[m][0], bp[m][1]);
#pragma unroll
      for (int m = 0; m < 2; ++m)
        if (live[m]) mma_pass<Pass::hi_lo>(o_small[m], a, bp[m][0], bp[m][1]);
    }
#pragma unroll
    for (int m = 0; m < 2; ++m)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = own_tiles[m] * 8 + 2 * tq + e % 2, row = i0 + r0 + gq + (e / 2) * 8;
        if (t < n && row < Dv) out[((t0 + t) * Hv + h) * Dv + row] = od[m][e] + o_small[m][e];
      }

    // 4. S = e^{G_{n−1}} S0 + (δ · e^{G_{n−1}−G})ᵀ K on the warp's key slice, small terms apart as in 3.
    const float chunk_decay = Ds[n - 1].x;
    float S_small[kSteps][4] = {};
#pragma unroll
    for (int j = 0; j < kSteps; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) S[j][e] *= chunk_decay;
#pragma unroll
    for (int ks = 0; ks < kTokenTiles; ++ks) {
      const float e0 = Ds[ks * 8 + 2 * tq].y, e1 = Ds[ks * 8 + 2 * tq + 1].y;
      const Split a[4] = {split(delta[ks][0] * e0), split(delta[ks][2] * e0), split(delta[ks][1] * e1),
                          split(delta[ks][3] * e1)};
      const float* kb = Ks + (ks * 8 + 2 * tq) * Sh::kKPitch + k0 + gq;
      Split bk[kSteps][2];
#pragma unroll
      for (int j = 0; j < kSteps; ++j) {
        bk[j][0] = split(kb[8 * j]);
        bk[j][1] = split(kb[Sh::kKPitch + 8 * j]);
      }
      mma_row<Pass::lo_hi>(S_small, a, bk);
      mma_row<Pass::hi_hi>(S, a, bk);
      mma_row<Pass::hi_lo>(S_small, a, bk);
    }
#pragma unroll
    for (int j = 0; j < kSteps; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) S[j][e] += S_small[j][e];
    __syncthreads();  // every warp is done with K, P, U, the decays and δ
    if (c0 + kC < len) load_rest(c0 + kC);
    cp_async_commit();
  }

#pragma unroll
  for (int j = 0; j < kSteps; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = i0 + r0 + gq + (e / 2) * 8, col = k0 + 8 * j + 2 * tq + e % 2;
      if (row < Dv && col < Dk) {
        Sg_to[static_cast<int64_t>(row) * Dk + col] = S[j][e];
        if (Sg_also) Sg_also[static_cast<int64_t>(row) * Dk + col] = S[j][e];
      }
    }
}

template <int kDk>
void launch_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                    const SeqArrays& layout, const int32_t* seqs, int64_t num_seqs, int64_t max_len, int64_t T,
                    int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, float* work_base, float* state, float* out,
                    cudaStream_t stream) {
  const Work work = work_at(work_base, T, Hv, kDk);
  const int dk = static_cast<int>(Dk), dv = static_cast<int>(Dv);
  const int64_t chunks = (max_len + kC - 1) / kC;
  if (chunks > 65535) throw_error("cuda gated_delta_rule: a chunked sequence is longer than 65535 chunks of 64");

  QINFER_CUDA_CHECK(cudaFuncSetAttribute(chunk_prep_kernel<kDk>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(PrepShared<kDk>::kBytes)));
  const dim3 prep_grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>(Hv), static_cast<unsigned>(chunks));
  chunk_prep_kernel<kDk><<<prep_grid, kPrepThreads, PrepShared<kDk>::kBytes, stream>>>(
      q, k, v, g, beta, layout, seqs, Hk, Hv, dk, dv, work, out);
  QINFER_CUDA_CHECK_LAUNCH("chunk_prep_kernel<<<>>>");

  // 16-byte copies need every row start of q, k and out aligned.
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = Dk % 4 == 0 && Dv % 4 == 0 && aligned(q) && aligned(k) && aligned(out);
  QINFER_CUDA_CHECK(cudaFuncSetAttribute(chunk_scan_kernel<kDk>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         static_cast<int>(ScanShared<kDk>::kBytes)));
  const dim3 scan_grid(static_cast<unsigned>(num_seqs), static_cast<unsigned>(Hv),
                       static_cast<unsigned>((Dv + kDvTile - 1) / kDvTile));
  chunk_scan_kernel<kDk><<<scan_grid, kScanThreads, ScanShared<kDk>::kBytes, stream>>>(
      q, k, layout, seqs, Hk, Hv, dk, dv, vec, work, state, out);
  QINFER_CUDA_CHECK_LAUNCH("chunk_scan_kernel<<<>>>");
}

}  // namespace

size_t delta_chunked_shared_bytes(int64_t Dk) {
  const int padded = padded_dk(Dk);
  return padded == 32   ? std::max(PrepShared<32>::kBytes, ScanShared<32>::kBytes)
         : padded == 64 ? std::max(PrepShared<64>::kBytes, ScanShared<64>::kBytes)
                        : std::max(PrepShared<128>::kBytes, ScanShared<128>::kBytes);
}

int64_t delta_chunked_work_floats(int64_t T, int64_t Hv, int64_t Dk) {
  return T * Hv * (padded_dk(Dk) + kC + 2);
}

void launch_delta_rule_chunked(const float* q, const float* k, const float* v, const float* g, const float* beta,
                               const SeqArrays& layout, const int32_t* seqs, int64_t num_seqs, int64_t max_len,
                               int64_t T, int64_t Hk, int64_t Hv, int64_t Dk, int64_t Dv, float* work, float* state,
                               float* out, cudaStream_t stream) {
  if (num_seqs == 0 || max_len == 0 || Hv == 0 || Dv == 0) return;
  if (Dk > kDeltaChunkedMaxDk) throw_error("cuda gated_delta_rule: the chunked kernels take key head dims up to 128");
  const int padded = padded_dk(Dk);
  if (padded == 32)
    launch_chunked<32>(q, k, v, g, beta, layout, seqs, num_seqs, max_len, T, Hk, Hv, Dk, Dv, work, state, out, stream);
  else if (padded == 64)
    launch_chunked<64>(q, k, v, g, beta, layout, seqs, num_seqs, max_len, T, Hk, Hv, Dk, Dv, work, state, out, stream);
  else
    launch_chunked<128>(q, k, v, g, beta, layout, seqs, num_seqs, max_len, T, Hk, Hv, Dk, Dv, work, state, out, stream);
}

}  // namespace qinfer::cuda
