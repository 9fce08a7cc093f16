#pragma once
// Decoding of stored weight formats into f32 on the device, bit-exact with qinfer::convert_to_f32
// (core/dtype.h). Weights are converted once at load time, so the kernels aim for copy bandwidth.
// This header declares only the host launcher and can be included from plain C++.
#include <cuda_runtime_api.h>

#include <cstdint>

#include "core/dtype.h"

namespace qinfer::cuda {

// Converts `count` elements of `dtype` at device address `d_src` into f32 at `d_dst`, on `stream`
// (asynchronous). Handles bf16, f16, f8_e4m3, f8_e5m2, e8m0, f4_e2m1 (two per byte, low nibble
// first) and f32 (a copy). Any alignment works; 16-byte-aligned outputs take the vectorised path.
// Throws Error for other dtypes.
void convert_to_f32(DType dtype, const void* d_src, float* d_dst, uint64_t count, cudaStream_t stream);

}  // namespace qinfer::cuda
