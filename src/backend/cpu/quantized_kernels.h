#pragma once
// Inner loops for MLX-quantized weights on the cpu backend (quantized.cpp drives them).
#include <cstdint>

namespace qinfer::cpu {

// Σ_j x[j] · (scale_g · q_j + bias_g) over one row of an affine 4- or 8-bit matrix; scales and biases
// are the row's groups as f32, x_group_sums the per-group sums of x. AVX2 + FMA.
float affine_row_dot_avx2(const float* x, const float* x_group_sums, const uint32_t* codes, const float* scales,
                          const float* biases, int64_t in, int group_size, int bits);

}  // namespace qinfer::cpu
