#pragma once
// Direct GEMV kernels for MLX affine 4/8-bit rows on the cpu backend (quantized.cpp drives them):
// per group g, Σ x·(s·q + b) = s·Σ x·q + b·Σ x, so a row is dotted straight from its packed codes,
// never dequantized. Each instruction set prepares the activation row once per call in the layout
// its inner loop wants, then dots it with every weight row.
#include <cstdint>

#include "core/dtype.h"

namespace qinfer::cpu {

struct AffineShape {
  int64_t in = 0;  // row length, a whole number of the kernel's blocks of vector_lanes·32/bits codes
  int bits = 4;    // 4 or 8
  int group_size = 64;
  DType scale_dtype = DType::bf16;  // scales and biases: f32, bf16 or f16
};

// One packed weight row: codes (in·bits/32 words) and its in/group_size scales and biases.
struct AffineRow {
  const uint32_t* codes;
  const void* scales;
  const void* biases;
};

// dots[r] = Σ_j x[j] · (s_g·q_j + b_g) over rows[r], r < count ≤ kAffineRows, from the activation
// row as `prepare` left it. Rows are taken kAffineRows at a time so that the activation passes
// through L1 once for all of them, and so that rows from far apart in the weight make separate
// streams for the hardware prefetcher: one stream per core leaves DRAM idle while the core computes.
constexpr int kAffineRows = 4;
using AffineRowsDot = void (*)(const float* prepared, const AffineShape& shape, const AffineRow* rows, int count,
                               float* dots);

struct AffineKernel {
  int vector_lanes;  // 32-bit lanes of one vector of packed words: 8 (AVX2) or 16 (AVX-512)
  // `prepared` holds affine_prepared_floats(in, group_size) floats, 64-byte aligned.
  void (*prepare)(const float* x, const AffineShape& shape, float* prepared);
  AffineRowsDot (*rows_dot)(const AffineShape& shape);  // the inner loop for this bit width and scale type
};

// The activation in a kernel's own layout (at most `in` floats), then Σx of each group.
inline int64_t affine_prepared_floats(int64_t in, int group_size) { return in + in / group_size; }

// AVX2 + FMA + F16C: the activation as f32, permuted and pre-scaled so that each masked code
// converts straight to its product (quantized_avx2.cpp).
const AffineKernel& affine_kernel_avx2();
// AVX-512 F/BW/VL + VNNI: the activation split into three int8 parts per group, dotted with the
// unpacked codes by vpdpbusd (quantized_avx512.cpp).
const AffineKernel& affine_kernel_avx512_vnni();

}  // namespace qinfer::cpu
