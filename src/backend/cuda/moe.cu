// Mixture of experts: the router (softmax, top-k with ref's tie order, optional renormalisation)
// and the experts as three passes of per-token row dots (gate, up into silu(gate)·up, then the
// weighted down projection), one warp per output value, any weight format: decode-sized batches and
// recorded steps (prefill-sized batches go grouped by expert, moe_grouped.cu).
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

}  // namespace

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
