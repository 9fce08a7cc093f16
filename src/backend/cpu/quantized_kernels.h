#pragma once
// Inner loops for MLX-quantized weights on the cpu backend (quantized.cpp drives them).
#include <cstdint>

namespace qinfer::cpu {

// Affine rows whose codes a kernel of `vector_lanes` 32-bit lanes (8: AVX2, 16: AVX-512) reads
// directly: 4- or 8-bit, groups of at least 32, `in` a whole number of blocks (vector_lanes words).
bool affine_direct_supported(int bits, int group_size, int64_t in, int vector_lanes);

// The activation row in the order the kernel meets it. A block of `vector_lanes` packed words holds
// k = 32/bits codes per lane; code i of lane l is element block_start + l·k + i.
// lanes[block_start + i·vector_lanes + l] = x[that element] · 2^-(bits·i) for all but the top code,
// so that masking code i in place (value q·2^(bits·i)) and converting it to float needs no shift: the
// power of two cancels exactly. group_sums[g] = Σ x over group g (the bias term).
void prepare_affine_input(const float* x, int64_t in, int bits, int group_size, int vector_lanes, float* lanes,
                          float* group_sums);

// Σ_j x[j] · (scale_g · q_j + bias_g) over one row, from prepare_affine_input's lanes and group sums;
// scales and biases are the row's groups as f32. AVX2 + FMA, vector_lanes 8.
float affine_row_dot_avx2(const float* lanes, const float* group_sums, const uint32_t* codes, const float* scales,
                          const float* biases, int64_t in, int group_size, int bits);
// The same with AVX-512, vector_lanes 16; `scales` must be readable 16 floats past its last group.
float affine_row_dot_avx512(const float* lanes, const float* group_sums, const uint32_t* codes, const float* scales,
                            const float* biases, int64_t in, int group_size, int bits);

}  // namespace qinfer::cpu
