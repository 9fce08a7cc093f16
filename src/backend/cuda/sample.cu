// Sampling on the device, by sampling.h's definition. Greedy rows: the argmax (NaN never wins, −0
// equals +0, the lowest id of the largest logit), one id per row back to the host. Other rows: the
// penalties, the argmax, the weights and the per-block masses are computed here with the host's
// arithmetic bit for bit (IEEE operations written out, no contraction), the candidates above the
// first threshold are compacted in id order, and pick_weighted's filters and draw run here too, so
// one id per row comes back; only a row whose candidates do not fit or whose threshold would be
// lowered is left to the host's pick_weighted.
#include <algorithm>
#include <climits>

#include "backend/cuda/common.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kThreads = 1024;
constexpr int kSampleBlock = static_cast<int>(kSamplingBlockIds);
constexpr int kWeighThreads = 256;

// sampling.cpp's canonicalize: NaN → −inf, −0 → +0.
__device__ __forceinline__ float canonical(float f) {
  const uint32_t b = __float_as_uint(f);
  return __uint_as_float((b & 0x7FFFFFFFu) > 0x7F800000u ? 0xFF800000u : b == 0x80000000u ? 0u : b);
}

// The integer with the order of the canonical float: sampling.cpp's order_key.
__device__ __forceinline__ int32_t order_key(float f) {
  const int32_t key = __float_as_int(canonical(f));
  return key ^ ((key >> 31) & 0x7FFFFFFF);
}

struct Best {
  int32_t key, id;
};

__device__ __forceinline__ Best better(Best a, Best b) {
  return b.key > a.key || (b.key == a.key && b.id < a.id) ? b : a;
}

// The best of a warp's lanes, in every lane.
__device__ __forceinline__ Best warp_best(Best best) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    best = better(best, Best{__shfl_xor_sync(0xFFFFFFFFu, best.key, offset), __shfl_xor_sync(0xFFFFFFFFu, best.id, offset)});
  return best;
}

// The best of a block's threads, in every thread (the warps' bests meet in shared memory).
__device__ Best block_best(Best best, Best* scratch) {
  best = warp_best(best);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  __syncthreads();
  if (lane == 0) scratch[warp] = best;
  __syncthreads();
  return warp_best(lane < static_cast<int>(blockDim.x) / kWarp ? scratch[lane] : Best{INT_MIN, INT_MAX});
}

// Block (p, s) takes part p of row s's vocabulary: one block per row would read a 152k-entry row at
// one SM's bandwidth (~20 µs on an H200). Parts' bests go to `parts`; better() is a total order, so
// the merge below gives the same id whatever the split.
__global__ void __launch_bounds__(kThreads) argmax_parts_kernel(const float* __restrict__ logits, int64_t V,
                                                                 int64_t part_len, Best* __restrict__ parts) {
  __shared__ Best scratch[kWarp];
  const int64_t s = blockIdx.y, begin = blockIdx.x * part_len, end = min(V, begin + part_len);
  const float* row = logits + s * V;
  Best best{INT_MIN, INT_MAX};
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x)
    best = better(best, Best{order_key(row[i]), static_cast<int32_t>(i)});
  best = block_best(best, scratch);
  if (threadIdx.x == 0) parts[s * gridDim.x + blockIdx.x] = best;  // gridDim.x = P
}

__global__ void __launch_bounds__(kWarp) argmax_merge_kernel(const Best* __restrict__ parts, int64_t S, int P,
                                                              int32_t* __restrict__ out) {
  for (int64_t s = blockIdx.x; s < S; s += gridDim.x) {
    Best best{INT_MIN, INT_MAX};
    for (int p = threadIdx.x; p < P; p += kWarp) best = better(best, parts[s * P + p]);
    best = warp_best(best);
    if (threadIdx.x == 0) out[s] = best.id;
  }
}

// sampling.h's sampling_weight, operation for operation.
__device__ __forceinline__ float sampling_weight(float logit, float max_logit, float temperature) {
  const float x = __fdiv_rn(__fsub_rn(logit, max_logit), temperature);
  const uint32_t limit = __float_as_uint(-87.33654f), bits = __float_as_uint(x);
  const uint32_t keep = 0u - static_cast<uint32_t>(bits <= limit);
  const float xc = __uint_as_float(min(bits, limit));
  const float shifter = 12582912.0f;
  const float t = __fadd_rn(__fmul_rn(xc, 1.44269504088896341f), shifter);
  const float n = __fsub_rn(t, shifter);
  float r = __fsub_rn(xc, __fmul_rn(n, 0.693359375f));
  r = __fsub_rn(r, __fmul_rn(n, -2.12194440e-4f));
  float poly = 1.9875691500e-4f;
  poly = __fadd_rn(__fmul_rn(poly, r), 1.3981999507e-3f);
  poly = __fadd_rn(__fmul_rn(poly, r), 8.3334519073e-3f);
  poly = __fadd_rn(__fmul_rn(poly, r), 4.1665795894e-2f);
  poly = __fadd_rn(__fmul_rn(poly, r), 1.6666665459e-1f);
  poly = __fadd_rn(__fmul_rn(poly, r), 5.0000001201e-1f);
  poly = __fadd_rn(__fmul_rn(poly, __fmul_rn(r, r)), __fadd_rn(r, 1.0f));
  const uint32_t scale = (__float_as_uint(t) - __float_as_uint(shifter) + 127u) << 23;
  return __uint_as_float(__float_as_uint(__fmul_rn(poly, __uint_as_float(scale))) & keep);
}

// work = canonical(logits): grid (parts, rows).
__global__ void sampling_prepare_kernel(const float* __restrict__ logits, int64_t V, int64_t part_len,
                                        float* __restrict__ work) {
  const int64_t s = blockIdx.y, begin = blockIdx.x * part_len, end = min(V, begin + part_len);
  for (int64_t i = begin + threadIdx.x; i < end; i += blockDim.x) work[s * V + i] = canonical(logits[s * V + i]);
}

// Row s's penalties over its distinct history ids (sampling.cpp's apply_penalties over history_counts): one block a row.
__global__ void sampling_penalize_kernel(const float* __restrict__ logits, int64_t V, const DeviceSampleRow* rows,
                                         const int32_t* __restrict__ ids, const int32_t* __restrict__ counts,
                                         float* __restrict__ work) {
  const int64_t s = blockIdx.x;
  const DeviceSampleRow row = rows[s];
  for (int32_t k = row.penalties_begin + threadIdx.x; k < row.penalties_end; k += blockDim.x) {
    float l = logits[s * V + ids[k]];
    if (row.repetition != 1.0f) l = l > 0.0f ? __fdiv_rn(l, row.repetition) : __fmul_rn(l, row.repetition);
    l = __fsub_rn(l, __fadd_rn(row.presence, __fmul_rn(row.frequency, static_cast<float>(counts[k]))));
    work[s * V + ids[k]] = canonical(l);
  }
}

// row_max[s] = row s's largest logit, at its argmax (the host returns the argmax where it is
// infinite). Its own launch: the weighing overwrites the row in place, so a block that read the
// largest logit from the row could find the weight another block wrote there.
__global__ void sampling_max_kernel(const float* __restrict__ work, int64_t V, int64_t S, const int32_t* __restrict__ best,
                                    float* __restrict__ row_max) {
  const int64_t s = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (s < S) row_max[s] = work[s * V + best[s]];
}

// Block (b, s) turns ids [b·kSamplingBlock, ...) of a weighed row into weights (in place), their
// mass in sampling_block_sum's order, and how many reach the row's threshold.
__global__ void __launch_bounds__(kWeighThreads)
    sampling_weigh_kernel(float* __restrict__ work, int64_t V, const DeviceSampleRow* rows,
                          const float* __restrict__ row_max, double* __restrict__ masses,
                          int32_t* __restrict__ passing) {
  __shared__ float w[kSampleBlock];
  __shared__ double chains[4];
  __shared__ int passed;
  const int64_t s = blockIdx.y, b = blockIdx.x, nb = gridDim.x;
  const DeviceSampleRow row = rows[s];
  float* r = work + s * V;
  const float max_logit = row_max[s];
  if (row.temperature <= 0.0f || isinf(max_logit)) return;
  if (threadIdx.x == 0) passed = 0;
  __syncthreads();
  const int64_t begin = b * kSampleBlock;
  const int n = static_cast<int>(min(static_cast<int64_t>(kSampleBlock), V - begin));
  int mine = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = sampling_weight(r[begin + i], max_logit, row.temperature);
    r[begin + i] = v, w[i] = v;
    mine += v >= row.threshold;
  }
  atomicAdd(&passed, mine);
  __syncthreads();
  if (threadIdx.x < 4) {  // chain j: i + j for i = 0, 4, ...; the n % 4 tail goes to chain 0
    const int j = threadIdx.x;
    double sum = 0.0;
    int i = 0;
    for (; i + 4 <= n; i += 4) sum = __dadd_rn(sum, static_cast<double>(w[i + j]));
    if (j == 0)
      for (; i < n; ++i) sum = __dadd_rn(sum, static_cast<double>(w[i]));
    chains[j] = sum;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    masses[s * nb + b] = __dadd_rn(__dadd_rn(chains[0], chains[1]), __dadd_rn(chains[2], chains[3]));
    passing[s * nb + b] = passed;
  }
}

// The ids of weights ≥ the row's threshold in ascending order (with the weights), the first
// kSampleCandidates of them: block (b, s) writes block b's after the earlier blocks' counts. Rows without filters skip.
__global__ void __launch_bounds__(kSampleBlock)
    sampling_compact_kernel(const float* __restrict__ work, int64_t V, const DeviceSampleRow* rows,
                            const float* __restrict__ row_max, const int32_t* __restrict__ passing,
                            int32_t* __restrict__ ids, float* __restrict__ weights) {
  __shared__ int warp_counts[kSampleBlock / kWarp];
  __shared__ int offset;
  const int64_t s = blockIdx.y, b = blockIdx.x, nb = gridDim.x;
  const DeviceSampleRow row = rows[s];
  if (!row.candidates || row.temperature <= 0.0f || isinf(row_max[s])) return;
  if (threadIdx.x == 0) {
    int o = 0;
    for (int64_t t = 0; t < b; ++t) o += passing[s * nb + t];
    offset = o;
  }
  const int64_t id = b * kSampleBlock + threadIdx.x;
  const float v = id < V ? work[s * V + id] : 0.0f;
  const bool keep = id < V && v >= row.threshold;
  const unsigned ballot = __ballot_sync(0xFFFFFFFFu, keep);
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  if (lane == 0) warp_counts[warp] = __popc(ballot);
  __syncthreads();
  if (!keep) return;
  int pos = offset + __popc(ballot & ((1u << lane) - 1u));
  for (int k = 0; k < warp; ++k) pos += warp_counts[k];
  if (pos < kSampleCandidates)
    ids[s * kSampleCandidates + pos] = static_cast<int32_t>(id), weights[s * kSampleCandidates + pos] = v;
}

// --- finishing a row on the device: sampling.cpp's pick_weighted, operation for operation --------

// A candidate's key in pick_weighted's filter order (weight descending, then id ascending) as an
// ascending integer: weights are positive floats (≥ the threshold), whose bits keep their order.
__device__ __forceinline__ uint64_t rank_key(int32_t id, float w) {
  return static_cast<uint64_t>(~__float_as_uint(w)) << 32 | static_cast<uint32_t>(id);
}
__device__ __forceinline__ float rank_weight(uint64_t key) { return __uint_as_float(~static_cast<uint32_t>(key >> 32)); }
// The draw's order (id ascending): the key of std::sort(kept) in pick_weighted.
__device__ __forceinline__ uint64_t id_key(int32_t id, float w) {
  return static_cast<uint64_t>(id) << 32 | __float_as_uint(w);
}
__device__ __forceinline__ float id_weight(uint64_t key) { return __uint_as_float(static_cast<uint32_t>(key)); }
constexpr uint64_t kNoKey = ~uint64_t{0};  // pads a sort: after every key

// Ascending bitonic sort of keys[0, n), n a power of two, by the whole block (barriers around it).
__device__ void block_sort(uint64_t* keys, int n) {
  __syncthreads();
  for (int k = 2; k <= n; k <<= 1)
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int partner = i ^ j;
        if (partner <= i) continue;
        const uint64_t a = keys[i], b = keys[partner];
        if ((a > b) == ((i & k) == 0)) keys[i] = b, keys[partner] = a;
      }
      __syncthreads();
    }
}

__device__ __forceinline__ int pow2_at_least(int n) {
  int p = 1;
  while (p < n) p <<= 1;
  return p;
}

// pick_weighted's total: the block masses summed in block order.
__device__ double row_total(const double* blocks, int nb) {
  double total = 0.0;
  for (int b = 0; b < nb; ++b) total = __dadd_rn(total, blocks[b]);
  return total;
}

// pick_weighted's draw over the whole vocabulary (no filter): over the block masses, then over the
// chosen block's weights, which the whole block stages in shared memory for thread 0's walk.
__device__ void pick_unfiltered(const float* row, int64_t V, const double* blocks, int nb, double u, int32_t best,
                                int32_t* pick) {
  __shared__ float w[kSampleBlock];
  __shared__ int chosen;
  __shared__ double before, target;
  if (threadIdx.x == 0) {
    target = __dmul_rn(u, row_total(blocks, nb));
    double cum = 0.0;
    int b = 0;
    while (b + 1 < nb && __dadd_rn(cum, blocks[b]) <= target) cum = __dadd_rn(cum, blocks[b++]);
    chosen = b, before = cum;
  }
  __syncthreads();
  const int64_t begin = static_cast<int64_t>(chosen) * kSampleBlock;
  const int n = static_cast<int>(min(static_cast<int64_t>(kSampleBlock), V - begin));
  for (int i = threadIdx.x; i < n; i += blockDim.x) w[i] = row[begin + i];
  __syncthreads();
  if (threadIdx.x != 0) return;
  double cum = before;
  int32_t last = best;  // pick_weighted's fallback where rounding leaves the target unreached
  for (int i = 0; i < n; ++i) {
    if (w[i] == 0.0f) continue;
    cum = __dadd_rn(cum, static_cast<double>(w[i])), last = static_cast<int32_t>(begin + i);
    if (target < cum) break;
  }
  *pick = last;
}

// How many of the candidates (in filter order, keys[0, passed)) top_k, top_p and min_p keep.
__device__ int kept_count(const DeviceSampleRow& row, const uint64_t* keys, int passed, double total, int64_t V) {
  int n = static_cast<int>(min(row.top_k > 0 ? static_cast<int64_t>(row.top_k) : V, static_cast<int64_t>(passed)));
  if (row.top_p < 1.0f) {
    double target = __dmul_rn(static_cast<double>(row.top_p), total);
    if (row.top_k > 0) {  // measured against the top k's mass
      double n_mass = 0.0;
      for (int i = 0; i < n; ++i) n_mass = __dadd_rn(n_mass, static_cast<double>(rank_weight(keys[i])));
      target = __dmul_rn(static_cast<double>(row.top_p), n_mass);
    }
    double cum = 0.0;
    int i = 0;
    while (i < n) {
      cum = __dadd_rn(cum, static_cast<double>(rank_weight(keys[i++])));
      if (cum >= target) break;
    }
    n = i;
  }
  if (row.min_p > 0.0f) {
    const float cut = __fmul_rn(row.min_p, rank_weight(keys[0]));
    int i = 1;
    while (i < n && rank_weight(keys[i]) >= cut) ++i;
    n = i;
  }
  return n;
}

// The draw over the kept candidates, keys[0, n) in id order.
__device__ int32_t draw_kept(const uint64_t* keys, int n, double u, int32_t best) {
  double mass = 0.0;
  for (int i = 0; i < n; ++i) mass = __dadd_rn(mass, static_cast<double>(id_weight(keys[i])));
  const double target = __dmul_rn(u, mass);
  double cum = 0.0;
  int32_t last = best;
  for (int i = 0; i < n; ++i) {
    const float w = id_weight(keys[i]);
    if (w == 0.0f) continue;
    cum = __dadd_rn(cum, static_cast<double>(w)), last = static_cast<int32_t>(keys[i] >> 32);
    if (target < cum) break;
  }
  return last;
}

// A filtered row from its candidates (ascending ids, as compacted), when they are all there and
// LeadingCandidates would stop at the first threshold; else ~best, for the host to finish.
__device__ void pick_filtered(const DeviceSampleRow& row, int64_t V, const double* blocks, int nb, const int32_t* passing,
                              const int32_t* ids, const float* weights, int32_t best, uint64_t* keys, int32_t* pick) {
  __shared__ int passed, kept;
  __shared__ double total;
  if (threadIdx.x == 0) {
    int64_t count = 0;
    for (int b = 0; b < nb; ++b) count += passing[b];
    const int64_t needed = row.top_k > 0 ? row.top_k : 1;  // LeadingCandidates' count
    passed = count <= kSampleCandidates && count >= needed ? static_cast<int>(count) : -1;
    total = row_total(blocks, nb);
  }
  __syncthreads();
  const int n = passed;
  if (n < 0) {
    if (threadIdx.x == 0) *pick = ~best;
    return;
  }
  const int padded = pow2_at_least(n);
  for (int i = threadIdx.x; i < padded; i += blockDim.x) keys[i] = i < n ? rank_key(ids[i], weights[i]) : kNoKey;
  __syncthreads();
  if (threadIdx.x == 0) {
    // LeadingCandidates' mass test, over the candidates in id order (only top_p without top_k asks one).
    const double p_mass = row.top_p < 1.0f && row.top_k == 0 ? __dmul_rn(static_cast<double>(row.top_p), total) : 0.0;
    double sum = 0.0;
    if (p_mass > 0.0)
      for (int i = 0; i < n; ++i) sum = __dadd_rn(sum, static_cast<double>(rank_weight(keys[i])));
    if (!(sum >= p_mass)) passed = -1, *pick = ~best;
  }
  __syncthreads();
  if (passed < 0) return;
  block_sort(keys, padded);
  if (threadIdx.x == 0) kept = kept_count(row, keys, n, total, V);
  __syncthreads();
  const int k = kept;
  for (int i = threadIdx.x; i < padded; i += blockDim.x)
    keys[i] = i < k ? id_key(static_cast<int32_t>(keys[i]), rank_weight(keys[i])) : kNoKey;
  block_sort(keys, pow2_at_least(k));
  if (threadIdx.x == 0) *pick = draw_kept(keys, k, row.uniform, best);
}

// Block s: row s's pick (sample_row after the weighing): the argmax where greedy or the largest
// logit is infinite, else pick_unfiltered / pick_filtered.
__global__ void __launch_bounds__(kThreads)
    sampling_pick_kernel(int64_t V, int nb, const DeviceSampleRow* rows, const SamplingBuffers buf, int32_t* picks) {
  __shared__ uint64_t keys[kSampleCandidates];
  const int64_t s = blockIdx.x;
  const DeviceSampleRow row = rows[s];
  const int32_t best = buf.best[s];
  if (row.temperature <= 0.0f || isinf(buf.row_max[s])) {
    if (threadIdx.x == 0) picks[s] = best;
    return;
  }
  const double* blocks = buf.masses + s * nb;
  if (!row.candidates) return pick_unfiltered(buf.work + s * V, V, blocks, nb, row.uniform, best, picks + s);
  pick_filtered(row, V, blocks, nb, buf.passing + s * nb, buf.candidate_ids + s * kSampleCandidates,
                buf.candidate_weights + s * kSampleCandidates, best, keys, picks + s);
}

// Parts of a row: about 8 loads a thread, at most kMaxParts.
constexpr int kMaxParts = 64;
constexpr int64_t kMaxGridY = 65535;
int argmax_parts(int64_t V) {
  return static_cast<int>(std::clamp<int64_t>((V + 8 * kThreads - 1) / (8 * kThreads), 1, kMaxParts));
}

}  // namespace

size_t argmax_scratch_bytes(int64_t S, int64_t V) {
  return static_cast<size_t>(std::max<int64_t>(S, 0)) * argmax_parts(V) * sizeof(Best);
}

namespace {

// One thread per logit of a masked row; grid y walks the rows.
__global__ void mask_logits_kernel(float* logits, int64_t V, const int32_t* rows, const uint32_t* allowed, int64_t words) {
  const int64_t v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (v >= V) return;
  const int64_t r = blockIdx.y;
  if (!((allowed[r * words + (v >> 5)] >> (v & 31)) & 1u)) logits[rows[r] * V + v] = __uint_as_float(0xFF800000u);  // −inf
}

}  // namespace

void launch_mask_logits(float* logits, int64_t V, const int32_t* rows, int64_t R, const uint32_t* allowed,
                        cudaStream_t stream) {
  if (R == 0 || V == 0) return;
  const int64_t words = (V + 31) / 32;
  for (int64_t r0 = 0; r0 < R; r0 += kMaxGridY) {
    const int64_t n = std::min(R - r0, kMaxGridY);
    mask_logits_kernel<<<dim3(static_cast<unsigned>((V + kThreads - 1) / kThreads), static_cast<unsigned>(n)), kThreads,
                         0, stream>>>(logits, V, rows + r0, allowed + r0 * words, words);
    QINFER_CUDA_CHECK_LAUNCH("mask_logits_kernel<<<>>>");
  }
}

void launch_argmax_rows(const float* logits, int64_t S, int64_t V, int32_t* out, void* scratch, cudaStream_t stream) {
  if (S == 0) return;
  if (V <= 0 || V > INT_MAX) throw_error("cuda argmax: the vocabulary must have 1 .. 2^31 - 1 entries");
  const int P = argmax_parts(V);
  const int64_t part_len = (V + P - 1) / P;
  auto* parts = static_cast<Best*>(scratch);
  for (int64_t s0 = 0; s0 < S; s0 += kMaxGridY) {  // rows are grid y
    const int64_t rows = std::min(S - s0, kMaxGridY);
    argmax_parts_kernel<<<dim3(static_cast<unsigned>(P), static_cast<unsigned>(rows)), kThreads, 0, stream>>>(
        logits + s0 * V, V, part_len, parts + s0 * P);
    QINFER_CUDA_CHECK_LAUNCH("argmax_parts_kernel<<<>>>");
  }
  argmax_merge_kernel<<<static_cast<unsigned>(std::min(S, kMaxGridY)), kWarp, 0, stream>>>(parts, S, P, out);
  QINFER_CUDA_CHECK_LAUNCH("argmax_merge_kernel<<<>>>");
}

void launch_sampling_weigh(const float* logits, int64_t S, int64_t V, const DeviceSampleRow* rows,
                           const int32_t* penalty_ids, const int32_t* penalty_counts, const SamplingBuffers& buf,
                           cudaStream_t stream) {
  if (S == 0) return;
  if (V <= 0 || V > INT_MAX) throw_error("cuda sampling: the vocabulary must have 1 .. 2^31 - 1 entries");
  if (S > kMaxGridY) throw_error("cuda sampling: at most 65535 rows per call");
  const int P = argmax_parts(V);
  const int64_t part_len = (V + P - 1) / P;
  const auto rows_y = static_cast<unsigned>(S);
  sampling_prepare_kernel<<<dim3(static_cast<unsigned>(P), rows_y), kThreads, 0, stream>>>(logits, V, part_len, buf.work);
  QINFER_CUDA_CHECK_LAUNCH("sampling_prepare_kernel<<<>>>");
  sampling_penalize_kernel<<<rows_y, 256, 0, stream>>>(logits, V, rows, penalty_ids, penalty_counts, buf.work);
  QINFER_CUDA_CHECK_LAUNCH("sampling_penalize_kernel<<<>>>");
  launch_argmax_rows(buf.work, S, V, buf.best, buf.argmax_scratch, stream);
  sampling_max_kernel<<<static_cast<unsigned>((S + 255) / 256), 256, 0, stream>>>(buf.work, V, S, buf.best, buf.row_max);
  QINFER_CUDA_CHECK_LAUNCH("sampling_max_kernel<<<>>>");
  const auto blocks = static_cast<unsigned>((V + kSampleBlock - 1) / kSampleBlock);
  sampling_weigh_kernel<<<dim3(blocks, rows_y), kWeighThreads, 0, stream>>>(buf.work, V, rows, buf.row_max,
                                                                           buf.masses, buf.passing);
  QINFER_CUDA_CHECK_LAUNCH("sampling_weigh_kernel<<<>>>");
  sampling_compact_kernel<<<dim3(blocks, rows_y), kSampleBlock, 0, stream>>>(
      buf.work, V, rows, buf.row_max, buf.passing, buf.candidate_ids, buf.candidate_weights);
  QINFER_CUDA_CHECK_LAUNCH("sampling_compact_kernel<<<>>>");
}

void launch_sampling_pick(int64_t S, int64_t V, const DeviceSampleRow* rows, const SamplingBuffers& buf, int32_t* picks,
                          cudaStream_t stream) {
  if (S == 0) return;
  const auto nb = static_cast<int>((V + kSampleBlock - 1) / kSampleBlock);
  sampling_pick_kernel<<<static_cast<unsigned>(S), kThreads, 0, stream>>>(V, nb, rows, buf, picks);
  QINFER_CUDA_CHECK_LAUNCH("sampling_pick_kernel<<<>>>");
}

}  // namespace qinfer::cuda
