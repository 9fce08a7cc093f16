// Activation layout shared by the AVX2 and AVX-512 affine GEMV kernels (see quantized_kernels.h).
#include <cmath>

#include "backend/cpu/quantized_kernels.h"

namespace qinfer::cpu {

bool affine_direct_supported(int bits, int group_size, int64_t in, int vector_lanes) {
  const int64_t block = static_cast<int64_t>(vector_lanes) * (32 / (bits > 0 ? bits : 32));
  return (bits == 4 || bits == 8) && group_size >= 32 && in % block == 0 && in % group_size == 0;
}

void prepare_affine_input(const float* x, int64_t in, int bits, int group_size, int vector_lanes, float* lanes,
                          float* group_sums) {
  const int per_lane = 32 / bits;
  const int64_t block = static_cast<int64_t>(vector_lanes) * per_lane;
  for (int64_t b = 0; b < in; b += block)
    for (int i = 0; i < per_lane; ++i) {
      const float factor = i + 1 == per_lane ? 1.0f : std::ldexp(1.0f, -bits * i);
      for (int l = 0; l < vector_lanes; ++l) lanes[b + i * vector_lanes + l] = x[b + l * per_lane + i] * factor;
    }
  for (int64_t g = 0; g < in / group_size; ++g) {
    float s = 0;
    for (int j = 0; j < group_size; ++j) s += x[g * group_size + j];
    group_sums[g] = s;
  }
}

}  // namespace qinfer::cpu
