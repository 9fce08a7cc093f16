// Mixture of experts: the router (softmax, top-k with ref's tie order, optional renormalisation)
// and the experts as row dots, one warp per output row, any weight format, for decode-sized batches
// and recorded steps (prefill-sized batches go through GEMMs per expert, moe_grouped.cu):
// - per slot: three passes (gate, up into silu(gate)·up, then the weighted down projection), each
//   slot reading its expert's rows; for a few tokens, whose slots rarely share an expert;
// - grouped by expert: the slots sorted by expert on the device (moe_grouped.cu's sort, nothing read
//   back, so a recorded step holds it), their x rows gathered, then each warp reads one row of one
//   expert once for every slot routed there (a batch of 64 tokens × 8 of 128 experts reads each
//   expert once instead of about four times), and the combine sums each token's rows in slot order.
// Both take the same row dots in the same order, so they agree to the bit.
#include "backend/cuda/weights.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kRouteThreads = 256;
constexpr int kWarpsPerBlock = 8;

// One block per token. The arithmetic follows ref: f32 exp, double sum, f32 probabilities, top-k by
// probability with ties to the lower id and NaN last, f32 renormalisation in rank order.
__global__ void __launch_bounds__(kRouteThreads, 1)
    moe_route_kernel(const float* __restrict__ logits, int64_t T, int E, int k, bool renormalize,
                     int32_t* __restrict__ ids, float* __restrict__ weights) {
  allow_next_kernel();
  wait_for_previous_kernel();
  extern __shared__ float route_smem[];
  float* probs = route_smem;                                      // [E]
  float* chosen_p = probs + E;                                    // [k]
  int32_t* chosen_id = reinterpret_cast<int32_t*>(chosen_p + k);  // [k]
  __shared__ float max_scratch[kWarp];
  __shared__ double sum_scratch[kWarp];
  for (int64_t t = blockIdx.x; t < T; t += gridDim.x) {
    const float* lt = logits + t * E;
    float local_max = -INFINITY;
    for (int e = threadIdx.x; e < E; e += kRouteThreads) local_max = fmaxf(local_max, lt[e]);
    const float max_logit = block_max(local_max, max_scratch);
    double local_sum = 0.0;
    for (int e = threadIdx.x; e < E; e += kRouteThreads) {
      const float p = expf(lt[e] - max_logit);
      probs[e] = p;
      local_sum += p;
    }
    const double sum = block_sum(local_sum, sum_scratch);
    for (int e = threadIdx.x; e < E; e += kRouteThreads) probs[e] = static_cast<float>(probs[e] / sum);
    __syncthreads();
    // Each expert's rank among all: unique, so the first k ranks are the top k in order.
    for (int e = threadIdx.x; e < E; e += kRouteThreads) {
      const float key = isnan(probs[e]) ? -1.0f : probs[e];
      int rank = 0;
      for (int other = 0; other < E && rank < k; ++other) {
        const float other_key = isnan(probs[other]) ? -1.0f : probs[other];
        rank += other_key > key || (other_key == key && other < e);
      }
      if (rank < k) {
        chosen_id[rank] = e;
        chosen_p[rank] = probs[e];
      }
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float total = 0.0f;
      for (int j = 0; j < k; ++j) total += chosen_p[j];
      for (int j = 0; j < k; ++j) {
        ids[t * k + j] = chosen_id[j];
        weights[t * k + j] = renormalize ? chosen_p[j] / total : chosen_p[j];
      }
    }
    __syncthreads();
  }
}

enum class Stage { gate, up, down };

// gate: act[tk, i] = gate_e(x_t)_i; up: act[tk, i] = silu(act[tk, i]) · up_e(x_t)_i (tk = t·k + j,
// e = ids[tk]); down: out[t, o] = Σ_j weights[t, j] · down_e(act[t·k + j])_o.
template <class Fmt, bool kVec, Stage kStage>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, 2)
    expert_kernel(const float* __restrict__ x, int64_t T, int64_t H, int64_t I, int64_t E, int64_t k,
                  const int32_t* __restrict__ ids, const float* __restrict__ weights, WeightView w, float* act,
                  float* __restrict__ out, DeviceStatus* status) {
  allow_next_kernel();
  wait_for_previous_kernel();
  const int lane = threadIdx.x % kWarp;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if constexpr (kStage == Stage::down) {
    if (item >= T * H) return;
    const int64_t t = item / H, o = item % H;
    float total = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = ids[t * k + j];
      if (e < 0 || e >= E) {
        if (lane == 0) report(status, kStatusExpertId, t * k + j, e, E);
        continue;
      }
      float acc[1] = {0.0f};
      Fmt::template row_dot<1, kVec>(w, e * H + o, act + (t * k + j) * I, I, 1, lane, acc);
      total += weights[t * k + j] * warp_sum(acc[0]);
    }
    if (lane == 0) out[item] = total;
  } else {
    if (item >= T * k * I) return;
    const int64_t tk = item / I, i = item % I;
    const int32_t e = ids[tk];
    if (e < 0 || e >= E) {
      if (lane == 0) {
        report(status, kStatusExpertId, tk, e, E);
        act[item] = 0.0f;
      }
      return;
    }
    float acc[1] = {0.0f};
    Fmt::template row_dot<1, kVec>(w, e * I + i, x + (tk / k) * H, H, 1, lane, acc);
    const float dot = warp_sum(acc[0]);
    if (lane == 0) act[item] = kStage == Stage::gate ? dot : silu(act[item]) * dot;
  }
}

template <Stage kStage>
void launch_stage(const float* x, int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, const int32_t* ids,
                  const float* weights, const WeightView& w, float* act, float* out, DeviceStatus* status,
                  cudaStream_t stream) {
  const int64_t items = kStage == Stage::down ? T * H : T * k * I;
  if (items == 0) return;
  const auto blocks = static_cast<unsigned>((items + kWarpsPerBlock - 1) / kWarpsPerBlock);
  const float* input = kStage == Stage::down ? act : x;
  const int64_t width = kStage == Stage::down ? I : H;
  const bool x_vec = aligned16(input) && width % 4 == 0;
  dispatch(w, [&](auto format) {
    using Fmt = decltype(format);
    if (x_vec && Fmt::vectorizable(w))
      launch_overlapped(expert_kernel<Fmt, true, kStage>, blocks, kWarpsPerBlock * kWarp, 0, stream, x, T, H, I, E, k, ids, weights,
                                                                                      w, act, out, status);
    else
      launch_overlapped(expert_kernel<Fmt, false, kStage>, blocks, kWarpsPerBlock * kWarp, 0, stream, x, T, H, I, E, k, ids, weights,
                                                                                       w, act, out, status);
  });
  QINFER_CUDA_CHECK_LAUNCH("expert_kernel<<<>>>");
}

// Slots one pass of the grouped kernels takes against each weight row (at most; fewer when their
// rows would not fit kGroupShared), and the weight rows one block reads against them: the staged
// activations cost count·width·4 bytes of L2 reads per block against 32 rows of weights.
constexpr int kGroupSlots = 8;
constexpr int kGroupRows = 32;
constexpr int64_t kGroupShared = 96 << 10;  // two blocks per SM, which the registers allow anyway

int group_slots(int64_t width) {
  return static_cast<int>(std::min<int64_t>(kGroupSlots, kGroupShared / (width * static_cast<int64_t>(sizeof(float)))));
}

// Expert blockIdx.y's slots, rows first .. first + n of `in` ([·, width]), through rows of its
// matrix w, per stage: gate: act[row, r] = gate_e(x)_r; up: act[row, r] = silu(act[row, r]) · up_e(x)_r;
// down: out_rows[row, r] = down_e(act)_r. The block stages up to `slots` of the rows in shared
// memory (an expert's rows are read by every block of it: from L2 once per block rather than once
// per warp), and each warp takes rows blockIdx.x · kGroupRows + warp, + kWarpsPerBlock, ….
template <class Fmt, bool kVec, Stage kStage>
__global__ void __launch_bounds__(kWarpsPerBlock* kWarp, 2)
    grouped_kernel(const float* __restrict__ in, int64_t width, int64_t rows_per_expert, int E, int slots,
                   const int32_t* __restrict__ meta, WeightView w, float* out) {
  extern __shared__ float4 staged4[];
  float* staged = reinterpret_cast<float*>(staged4);
  allow_next_kernel();
  wait_for_previous_kernel();
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp, e = static_cast<int>(blockIdx.y);
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kGroupRows;
  const int n = load_after_wait(meta + e), first = load_after_wait(meta + E + e);
  for (int s0 = 0; s0 < n; s0 += slots) {
    const int count = min(slots, n - s0);
    if (s0 > 0) __syncthreads();  // every warp is done with the previous slots
    const float* from = in + static_cast<int64_t>(first + s0) * width;
    const int64_t values = count * width;
    if (kVec) {
      for (int64_t i = threadIdx.x; i < values / 4; i += blockDim.x)
        staged4[i] = load_after_wait(reinterpret_cast<const float4*>(from) + i);
    } else {
      for (int64_t i = threadIdx.x; i < values; i += blockDim.x) staged[i] = load_after_wait(from + i);
    }
    __syncthreads();
    for (int64_t r = r0 + warp; r < min(r0 + kGroupRows, rows_per_expert); r += kWarpsPerBlock) {
      float acc[kGroupSlots] = {};
      Fmt::template row_dot<kGroupSlots, kVec, true>(w, e * rows_per_expert + r, staged, width, count, lane, acc);
#pragma unroll
      for (int t = 0; t < kGroupSlots; ++t) {
        if (t >= count) break;
        const float dot = warp_sum(acc[t]);
        float* y = out + static_cast<int64_t>(first + s0 + t) * rows_per_expert + r;
        if (lane == 0) *y = kStage == Stage::up ? silu(*y) * dot : dot;
      }
    }
  }
}

// rows[slot_row[s]] = x[s / k] (f32), one block per slot; bad slots (row −1) copy nothing.
__global__ void __launch_bounds__(256) grouped_gather_kernel(const float* __restrict__ x, int64_t H, int64_t k,
                                                             int64_t slots, const int32_t* __restrict__ slot_row,
                                                             float* __restrict__ rows) {
  for (int64_t s = blockIdx.x; s < slots; s += gridDim.x) {
    const int32_t row = slot_row[s];
    if (row < 0) continue;
    const float* from = x + (s / k) * H;
    float* to = rows + static_cast<int64_t>(row) * H;
    for (int64_t c = threadIdx.x; c < H; c += blockDim.x) to[c] = from[c];
  }
}

template <class Fmt, bool kVec, Stage kStage>
void launch_grouped(dim3 grid, size_t shared, cudaStream_t stream, const float* in, int64_t width,
                    int64_t rows_per_expert, int64_t E, int slots, const int32_t* meta, const WeightView& w,
                    float* out) {
  // Beyond 48 KiB a kernel must opt in (a per-device function attribute, cheap to set again).
  if (shared > 48 * 1024)
    QINFER_CUDA_CHECK(cudaFuncSetAttribute(grouped_kernel<Fmt, kVec, kStage>,
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shared)));
  launch_overlapped(grouped_kernel<Fmt, kVec, kStage>, grid, kWarpsPerBlock * kWarp, shared, stream, in, width,
                    rows_per_expert, static_cast<int>(E), slots, meta, w, out);
}

template <Stage kStage>
void grouped_pass(const float* in, int64_t width, int64_t rows_per_expert, int64_t E, const int32_t* meta,
                  const WeightView& w, float* out, cudaStream_t stream) {
  const bool vec = aligned16(in) && width % 4 == 0;
  const int slots = group_slots(width);
  const size_t shared = static_cast<size_t>(slots * width) * sizeof(float);
  const dim3 grid(static_cast<unsigned>((rows_per_expert + kGroupRows - 1) / kGroupRows), static_cast<unsigned>(E));
  dispatch(w, [&](auto format) {
    using Fmt = decltype(format);
    if (vec && Fmt::vectorizable(w))
      launch_grouped<Fmt, true, kStage>(grid, shared, stream, in, width, rows_per_expert, E, slots, meta, w, out);
    else
      launch_grouped<Fmt, false, kStage>(grid, shared, stream, in, width, rows_per_expert, E, slots, meta, w, out);
  });
  QINFER_CUDA_CHECK_LAUNCH("grouped_kernel<<<>>>");
}

// Ints of the sort's work, slot rows and counts, rounded up so that the float rows after them
// start 16-byte aligned.
int64_t grouped_ints(int64_t slots, int64_t E) { return (moe_sort_work_ints(slots, E) + slots + 2 * E + 1 + 3) / 4 * 4; }

}  // namespace

bool moe_groups_by_expert(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k) {
  return T >= 2 && 2 * T * k >= E && group_slots(std::max(H, I)) >= 1;
}

size_t moe_grouped_rows_bytes(int64_t T, int64_t H, int64_t I, int64_t E, int64_t k) {
  return static_cast<size_t>(grouped_ints(T * k, E) + T * k * (H + I)) * sizeof(float);
}

void launch_moe_experts_grouped(const float* x, int64_t T, int64_t H, int64_t I, int64_t E, int64_t k,
                                const int32_t* ids, const float* weights, const WeightView& gate, const WeightView& up,
                                const WeightView& down, void* work, float* out, DeviceStatus* status,
                                cudaStream_t stream) {
  const int64_t slots = T * k;
  if (slots == 0 || H == 0) return;
  int32_t* sort_work = static_cast<int32_t*>(work);
  int32_t* slot_row = sort_work + moe_sort_work_ints(slots, E);
  int32_t* meta = slot_row + slots;
  float* rows = reinterpret_cast<float*>(sort_work + grouped_ints(slots, E));
  float* act = rows + slots * H;
  launch_moe_sort(ids, slots, 0, E, 1, sort_work, slot_row, meta, status, stream);
  grouped_gather_kernel<<<static_cast<unsigned>(std::min<int64_t>(slots, 65535)), 256, 0, stream>>>(x, H, k, slots, slot_row, rows);
  QINFER_CUDA_CHECK_LAUNCH("grouped_gather_kernel<<<>>>");
  grouped_pass<Stage::gate>(rows, H, I, E, meta, gate, act, stream);
  grouped_pass<Stage::up>(rows, H, I, E, meta, up, act, stream);
  // The down rows reuse the gathered x rows' memory: the up pass was their last reader.
  grouped_pass<Stage::down>(act, I, H, E, meta, down, rows, stream);
  launch_moe_combine(rows, slot_row, weights, T, k, H, out, stream);
}

void launch_moe_route(const float* logits, int64_t T, int64_t E, int64_t k, bool renormalize, int32_t* ids,
                      float* weights, cudaStream_t stream) {
  if (T == 0) return;
  const size_t bytes = static_cast<size_t>(E + 2 * k) * sizeof(float);
  if (bytes > 48 * 1024)
    QINFER_CUDA_CHECK(cudaFuncSetAttribute(moe_route_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
  const auto blocks = static_cast<unsigned>(std::min<int64_t>(T, 65535));
  launch_overlapped(moe_route_kernel, blocks, kRouteThreads, bytes, stream, logits, T, static_cast<int>(E), static_cast<int>(k),
                                                             renormalize, ids, weights);
  QINFER_CUDA_CHECK_LAUNCH("moe_route_kernel<<<>>>");
}

void launch_moe_experts(const float* x, int64_t T, int64_t H, int64_t I, int64_t E, int64_t k, const int32_t* ids,
                        const float* weights, const WeightView& gate, const WeightView& up, const WeightView& down,
                        float* act, float* out, DeviceStatus* status, cudaStream_t stream) {
  launch_stage<Stage::gate>(x, T, H, I, E, k, ids, weights, gate, act, out, status, stream);
  launch_stage<Stage::up>(x, T, H, I, E, k, ids, weights, up, act, out, status, stream);
  launch_stage<Stage::down>(x, T, H, I, E, k, ids, weights, down, act, out, status, stream);
}

}  // namespace qinfer::cuda
