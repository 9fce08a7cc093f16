// Row norms: RMSNorm (optionally gated by silu(z), or after a residual add) and L2 norm. Rows whose
// length is a multiple of 4 (and up to kVecRowMax) are read once as float4s into registers: a warp
// per row when short (per-head norms, 64-512), a block per row when long (hidden states). Other
// rows take a general loop that reads the row twice. Every element is read and written by one
// thread, so y may alias x.
#include <cstdint>

#include "backend/cuda/common.cuh"

namespace qinfer::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kWarpRowMax = 1024;  // general loop: rows up to this long go one per warp
constexpr int64_t kMaxBlocks = 65535;
constexpr int kMaxWarpVecs = 4;   // float4s per lane of the warp path: rows up to 512
constexpr int kMaxBlockVecs = 8;  // float4s per thread of the block path: rows up to 8192
constexpr int64_t kVecRowMax = int64_t{4} * kThreads * kMaxBlockVecs;

enum class Norm { rms, rms_gated, l2, add_rms };

// One launch's operands. add_rms: x_out is x (updated to x + delta before the norm).
struct Rows {
  const float* x;
  float* x_out;
  const float* delta;
  const float* w;
  const float* z;
  float* y;
  float eps, scale;
  int64_t N, D;
};

// x[i] as the norm sees it; for add_rms the sum x + delta rounded to f32 and stored back.
template <Norm kNorm>
__device__ __forceinline__ float input(const Rows& r, int64_t i) {
  float v = r.x[i];
  if constexpr (kNorm == Norm::add_rms) {
    v += r.delta[i];
    r.x_out[i] = v;
  }
  return v;
}

template <Norm kNorm>
__device__ __forceinline__ float4 input4(const Rows& r, int64_t i4) {
  float4 v = reinterpret_cast<const float4*>(r.x)[i4];
  if constexpr (kNorm == Norm::add_rms) {
    const float4 d = reinterpret_cast<const float4*>(r.delta)[i4];
    v = make_float4(v.x + d.x, v.y + d.y, v.z + d.z, v.w + d.w);
    reinterpret_cast<float4*>(r.x_out)[i4] = v;
  }
  return v;
}

// 1 / rms (or 1 / L2 norm) from the row's Σx².
template <Norm kNorm>
__device__ __forceinline__ float norm_factor(const Rows& r, float sum) {
  if constexpr (kNorm == Norm::l2) return 1.0f / sqrtf(sum + r.eps);
  else return 1.0f / sqrtf(sum / static_cast<float>(r.D) + r.eps);
}

// One output element from the input value v (w, z: its weight and gate where the norm has them).
template <Norm kNorm>
__device__ __forceinline__ float output(const Rows& r, float v, float factor, float w, float z) {
  if constexpr (kNorm == Norm::l2) {
    return r.scale * (v * factor);
  } else {
    float o = v * factor * w;
    if constexpr (kNorm == Norm::rms_gated) o *= silu(z);
    return o;
  }
}

template <Norm kNorm>
__device__ __forceinline__ float4 output4(const Rows& r, float4 v, float factor, float4 w, float4 z) {
  return make_float4(output<kNorm>(r, v.x, factor, w.x, z.x), output<kNorm>(r, v.y, factor, w.y, z.y),
                     output<kNorm>(r, v.z, factor, w.z, z.z), output<kNorm>(r, v.w, factor, w.w, z.w));
}

// Rows of D = 4·D4 floats, kRowThreads threads (a warp, or the block) per row, each holding up to
// kVecs float4s of the row (with its weights and gates) in registers between the sum and the write.
template <Norm kNorm, int kRowThreads, int kVecs>
__global__ void __launch_bounds__(kThreads) norm_vec_kernel(const Rows r) {
  allow_next_kernel();
  wait_for_previous_kernel();
  __shared__ float scratch[kWarp];
  constexpr int kRowsPerBlock = kThreads / kRowThreads;
  constexpr bool kWeighted = kNorm != Norm::l2;
  const int rank = threadIdx.x % kRowThreads;
  const int64_t D4 = r.D / 4;
  // Every thread of a block runs the same number of iterations (block_sum has barriers); a warp's
  // threads share their row, so a whole warp is live or not.
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock; base < r.N;
       base += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t row = base + threadIdx.x / kRowThreads;
    const bool live = row < r.N;
    const int64_t row4 = (live ? row : 0) * D4;
    float4 v[kVecs], w[kVecs], z[kVecs];
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t i = rank + int64_t{k} * kRowThreads;
      v[k] = w[k] = z[k] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (!live || i >= D4) continue;
      v[k] = input4<kNorm>(r, row4 + i);
      if constexpr (kWeighted) w[k] = reinterpret_cast<const float4*>(r.w)[i];
      if constexpr (kNorm == Norm::rms_gated) z[k] = reinterpret_cast<const float4*>(r.z)[row4 + i];
      sum = fmaf(v[k].x, v[k].x, sum);
      sum = fmaf(v[k].y, v[k].y, sum);
      sum = fmaf(v[k].z, v[k].z, sum);
      sum = fmaf(v[k].w, v[k].w, sum);
    }
    if constexpr (kRowThreads == kWarp) sum = warp_sum(sum);
    else sum = block_sum(sum, scratch);
    if (!live) continue;
    const float factor = norm_factor<kNorm>(r, sum);
#pragma unroll
    for (int k = 0; k < kVecs; ++k) {
      const int64_t i = rank + int64_t{k} * kRowThreads;
      if (i < D4) reinterpret_cast<float4*>(r.y)[row4 + i] = output4<kNorm>(r, v[k], factor, w[k], z[k]);
    }
  }
}

// Any D: a strided loop for the sum, then a second pass over the row for the output (rereading x,
// which for add_rms this thread has just updated: x_out is x).
template <Norm kNorm, int kRowThreads>
__global__ void __launch_bounds__(kThreads) norm_kernel(const Rows r) {
  allow_next_kernel();
  wait_for_previous_kernel();
  __shared__ float scratch[kWarp];
  constexpr int kRowsPerBlock = kThreads / kRowThreads;
  const int rank = threadIdx.x % kRowThreads;
  for (int64_t base = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock; base < r.N;
       base += static_cast<int64_t>(gridDim.x) * kRowsPerBlock) {
    const int64_t row = base + threadIdx.x / kRowThreads;
    const bool live = row < r.N;
    const int64_t offset = (live ? row : 0) * r.D;
    float sum = 0.0f;
    if (live) {
      for (int64_t i = rank; i < r.D; i += kRowThreads) {
        const float v = input<kNorm>(r, offset + i);
        sum = fmaf(v, v, sum);
      }
    }
    if constexpr (kRowThreads == kWarp) sum = warp_sum(sum);
    else sum = block_sum(sum, scratch);
    if (!live) continue;
    const float factor = norm_factor<kNorm>(r, sum);
    for (int64_t i = rank; i < r.D; i += kRowThreads) {
      const float w = kNorm == Norm::l2 ? 0.0f : r.w[i];
      const float z = kNorm == Norm::rms_gated ? r.z[offset + i] : 0.0f;
      r.y[offset + i] = output<kNorm>(r, r.x[offset + i], factor, w, z);
    }
  }
}

unsigned blocks_for(int64_t N, int rows_per_block) {
  return static_cast<unsigned>(std::min((N + rows_per_block - 1) / rows_per_block, kMaxBlocks));
}

template <Norm kNorm, int kRowThreads, int kVecs>
void launch_vec(const Rows& r, cudaStream_t stream) {
  launch_overlapped(norm_vec_kernel<kNorm, kRowThreads, kVecs>, blocks_for(r.N, kThreads / kRowThreads), kThreads, 0, stream, r);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

template <Norm kNorm>
void launch(const Rows& r, cudaStream_t stream) {
  if (r.N == 0 || r.D == 0) return;
  const bool vec = r.D % 4 == 0 && r.D <= kVecRowMax && aligned16(r.x) && aligned16(r.x_out) &&
                   aligned16(r.delta) && aligned16(r.w) && aligned16(r.z) && aligned16(r.y);
  const int64_t D4 = r.D / 4;
  if (vec && D4 <= kWarp * kMaxWarpVecs) {
    if (D4 <= kWarp) launch_vec<kNorm, kWarp, 1>(r, stream);
    else if (D4 <= 2 * kWarp) launch_vec<kNorm, kWarp, 2>(r, stream);
    else launch_vec<kNorm, kWarp, 4>(r, stream);
  } else if (vec) {
    if (D4 <= kThreads) launch_vec<kNorm, kThreads, 1>(r, stream);
    else if (D4 <= 2 * kThreads) launch_vec<kNorm, kThreads, 2>(r, stream);
    else if (D4 <= 4 * kThreads) launch_vec<kNorm, kThreads, 4>(r, stream);
    else launch_vec<kNorm, kThreads, kMaxBlockVecs>(r, stream);
  } else if (r.D <= kWarpRowMax) {
    launch_overlapped(norm_kernel<kNorm, kWarp>, blocks_for(r.N, kThreads / kWarp), kThreads, 0, stream, r);
  } else {
    launch_overlapped(norm_kernel<kNorm, kThreads>, blocks_for(r.N, 1), kThreads, 0, stream, r);
  }
  QINFER_CUDA_CHECK_LAUNCH("norm_kernel<<<>>>");
}

}  // namespace

void launch_rms_norm(const float* x, const float* w, const float* z, float eps, int64_t N, int64_t D, float* y,
                     cudaStream_t stream) {
  const Rows r{x, nullptr, nullptr, w, z, y, eps, 1.0f, N, D};
  if (z) launch<Norm::rms_gated>(r, stream);
  else launch<Norm::rms>(r, stream);
}

void launch_add_rms_norm(float* x, const float* delta, const float* w, float eps, int64_t N, int64_t D, float* y,
                         cudaStream_t stream) {
  launch<Norm::add_rms>(Rows{x, x, delta, w, nullptr, y, eps, 1.0f, N, D}, stream);
}

void launch_l2_norm(const float* x, float eps, float scale, int64_t N, int64_t D, float* y, cudaStream_t stream) {
  launch<Norm::l2>(Rows{x, nullptr, nullptr, nullptr, nullptr, y, eps, scale, N, D}, stream);
}

}  // namespace qinfer::cuda
