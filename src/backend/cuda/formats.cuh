#pragma once
// Device decoders of every stored element format, bit-exact with core/dtype.h's host conversions:
// one struct per format, the code in the low kBits of a uint32. Shared by the load-time conversions
// (convert.cu) and the weight readers of the kernels (weights.cuh). Subnormal codes decode through
// a multiply, so the including target must keep denormals (-ftz=false).
#include <cstdint>

namespace qinfer::cuda::format {

__device__ __forceinline__ float from_bits(uint32_t bits) { return __uint_as_float(bits); }

// A sign-less minifloat code with kMant mantissa bits and exponent bias kBias. Placed at the top of
// an f32 mantissa and scaled by 2^(127 - kBias), it decodes exactly: normal codes land on normal
// f32 exponents, subnormal codes start as f32 denormals that the multiply keeps (-ftz=false).
template <int kMant, int kBias>
__device__ __forceinline__ uint32_t minifloat_magnitude_bits(uint32_t magnitude) {
  constexpr uint32_t kScaleBits = uint32_t{127 + 127 - kBias} << 23;
  return __float_as_uint(from_bits(magnitude << (23 - kMant)) * from_bits(kScaleBits));
}

constexpr uint32_t kQuietNaN = 0x7FC00000u;  // what the CPU's std::numeric_limits<float>::quiet_NaN() is
constexpr uint32_t kInf = 0x7F800000u;

struct Bf16 {
  static constexpr int kBits = 16;
  __device__ static float decode(uint32_t code) { return from_bits(code << 16); }
};

struct F16 {
  static constexpr int kBits = 16;
  __device__ static float decode(uint32_t code) {
    uint32_t sign = (code & 0x8000u) << 16, magnitude = code & 0x7FFFu;
    if (magnitude >= 0x7C00u) return from_bits(sign | kInf | ((magnitude & 0x3FFu) << 13));  // keeps NaN payloads
    return from_bits(sign | minifloat_magnitude_bits<10, 15>(magnitude));
  }
};

struct E4M3 {
  static constexpr int kBits = 8;
  __device__ static float decode(uint32_t code) {
    uint32_t sign = (code & 0x80u) << 24, magnitude = code & 0x7Fu;
    if (magnitude == 0x7Fu) return from_bits(kQuietNaN);  // the only NaN; no infinities
    return from_bits(sign | minifloat_magnitude_bits<3, 7>(magnitude));
  }
};

struct E5M2 {
  static constexpr int kBits = 8;
  __device__ static float decode(uint32_t code) {
    uint32_t sign = (code & 0x80u) << 24, magnitude = code & 0x7Fu;
    if (magnitude >= 0x7Cu) return from_bits(sign | (magnitude == 0x7Cu ? kInf : kQuietNaN));
    return from_bits(sign | minifloat_magnitude_bits<2, 15>(magnitude));
  }
};

struct E8M0 {
  static constexpr int kBits = 8;
  __device__ static float decode(uint32_t code) {
    if (code == 0xFFu) return from_bits(kQuietNaN);
    return from_bits(code == 0 ? 0x00400000u : code << 23);  // 2^-127 is an f32 denormal
  }
};

struct E2M1 {
  static constexpr int kBits = 4;
  __device__ static float decode(uint32_t code) {
    return from_bits(((code & 0x8u) << 28) | minifloat_magnitude_bits<1, 1>(code & 0x7u));
  }
};

}  // namespace qinfer::cuda::format
