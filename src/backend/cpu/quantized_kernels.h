#pragma once
// Inner loops for MLX-quantized weights on the cpu backend (quantized.cpp drives them).
#include <cstdint>

namespace qinfer::cpu {

// Affine rows whose codes the AVX2 kernel reads directly: 4-bit with `in` a multiple of 64, 8-bit with
// `in` a multiple of 32, groups of at least 32.
bool affine_direct_supported(int bits, int group_size, int64_t in);

// The activation row in the order the kernel meets it. A block of 8 packed words holds 8 codes per
// 32-bit lane (4-bit) or 4 (8-bit); code i of lane l is element block·n + l·k + i (k codes per lane).
// lanes[block·n + i·8 + l] = x[that element] · 2^-(bits·i) for all but the top code, so that masking
// code i in place (value q·2^(bits·i)) and converting it to float needs no shift: the power of two
// cancels exactly. group_sums[g] = Σ x over group g (the bias term).
void prepare_affine_input(const float* x, int64_t in, int bits, int group_size, float* lanes, float* group_sums);

// Σ_j x[j] · (scale_g · q_j + bias_g) over one row, from prepare_affine_input's lanes and group sums;
// scales and biases are the row's groups as f32. AVX2 + FMA.
float affine_row_dot_avx2(const float* lanes, const float* group_sums, const uint32_t* codes, const float* scales,
                          const float* biases, int64_t in, int group_size, int bits);

}  // namespace qinfer::cpu
