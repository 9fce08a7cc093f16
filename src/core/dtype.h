#pragma once
// Element types qinfer reads and computes with, and exact conversions between them and f32.
// Conversions to f32 are exact for every bit pattern (f64 excepted); conversions from f32 round to
// nearest even, matching PyTorch / ml_dtypes, with the overflow and NaN rules noted per function.
#include <cstdint>
#include <optional>
#include <string_view>

namespace qinfer {

enum class DType : uint8_t {
  f64, f32, f16, bf16,
  f8_e4m3,  // OCP E4M3 "fn": no infinities, NaN = S.1111.111, max 448
  f8_e5m2,  // OCP E5M2: IEEE-style, with infinities
  e8m0,     // unsigned power-of-two scale 2^(e-127); 0xFF is NaN (MX block scales)
  f4_e2m1,  // OCP FP4: codes 0..7 = {0, .5, 1, 1.5, 2, 3, 4, 6}, bit 3 = sign; two per byte
  i64, i32, i16, i8, u64, u32, u16, u8, boolean,
};

struct DTypeTraits {
  DType dtype;
  std::string_view name;         // qinfer's name, e.g. "bf16"
  std::string_view safetensors;  // safetensors header spelling, e.g. "BF16"
  uint8_t bits;                  // storage bits per element
  bool is_float;
};

const DTypeTraits& traits(DType dtype);
inline std::string_view name(DType dtype) { return traits(dtype).name; }
inline uint8_t bits(DType dtype) { return traits(dtype).bits; }
// Looks up a safetensors dtype string ("F32", "BF16", "F8_E4M3", "F8_E8M0", "F4", ...).
std::optional<DType> dtype_from_safetensors(std::string_view name);
// Bytes needed for `count` elements (sub-byte types pack two per byte, rounding up).
uint64_t storage_bytes(DType dtype, uint64_t count);

// --- scalar conversions ------------------------------------------------------------------------
// NaN results keep the input's sign and are quiet, except where noted.
float bf16_to_f32(uint16_t bits);
uint16_t f32_to_bf16(float value);   // RNE; overflow -> inf
float f16_to_f32(uint16_t bits);
uint16_t f32_to_f16(float value);    // RNE; overflow -> inf; subnormals exact
float e4m3_to_f32(uint8_t bits);
// RNE; finite overflow and +-inf saturate to +-448 (like CUDA's cvt .satfinite, unlike ml_dtypes and
// PyTorch, which give NaN): quantizers clamp anyway and a NaN weight is never wanted. NaN -> 0x7F/0xFF.
uint8_t f32_to_e4m3(float value);
float e5m2_to_f32(uint8_t bits);
uint8_t f32_to_e5m2(float value);    // RNE; overflow -> inf; NaN -> 0x7E/0xFE
float e8m0_to_f32(uint8_t bits);     // 2^(bits-127); 0xFF -> NaN
// 127 + round(log2(value)) clamped to [0, 254] (MLX mx scales); zero/negative -> 0; NaN/inf -> 0xFF.
uint8_t f32_to_e8m0(float value);
float e2m1_to_f32(uint8_t code);     // low 4 bits used
// RNE onto the E2M1 grid (ties to the even code); saturates to +-6. E2M1 has no NaN, so NaN -> +6:
// the largest code makes a bad input loud rather than silently zero.
uint8_t f32_to_e2m1(float value);

// Index of the first NaN or infinity among `count` elements stored as `dtype` at `data`; nullopt when
// all are finite or the type has no such values (integers, E2M1). One pass at memory speed: it runs
// over every weight byte at load.
std::optional<uint64_t> first_non_finite(DType dtype, const void* data, uint64_t count);

// Converts `count` elements stored as `dtype` at `src` into f32. Sub-byte types read the low
// nibble first. Throws Error for integer/boolean types.
void convert_to_f32(DType dtype, const void* src, float* dst, uint64_t count);

}  // namespace qinfer
