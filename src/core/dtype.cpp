#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace qinfer {
namespace {

// Rows in DType order; traits() relies on it.
constexpr DTypeTraits kTraits[] = {
    {DType::f64, "f64", "F64", 64, true},          {DType::f32, "f32", "F32", 32, true},
    {DType::f16, "f16", "F16", 16, true},          {DType::bf16, "bf16", "BF16", 16, true},
    {DType::f8_e4m3, "f8_e4m3", "F8_E4M3", 8, true}, {DType::f8_e5m2, "f8_e5m2", "F8_E5M2", 8, true},
    {DType::e8m0, "e8m0", "F8_E8M0", 8, true},     {DType::f4_e2m1, "f4_e2m1", "F4", 4, true},
    {DType::i64, "i64", "I64", 64, false},         {DType::i32, "i32", "I32", 32, false},
    {DType::i16, "i16", "I16", 16, false},         {DType::i8, "i8", "I8", 8, false},
    {DType::u64, "u64", "U64", 64, false},         {DType::u32, "u32", "U32", 32, false},
    {DType::u16, "u16", "U16", 16, false},         {DType::u8, "u8", "U8", 8, false},
    {DType::boolean, "bool", "BOOL", 8, false},
};
static_assert([] {
  for (size_t i = 0; i < std::size(kTraits); ++i)
    if (static_cast<size_t>(kTraits[i].dtype) != i) return false;
  return true;
}());

uint32_t f32_bits(float value) { return std::bit_cast<uint32_t>(value); }
float f32_from_bits(uint32_t bits) { return std::bit_cast<float>(bits); }

// Shifts right by `shift` bits rounding to nearest, ties to even.
uint32_t shift_right_rne(uint32_t value, int shift) {
  if (shift <= 0) return value;
  if (shift > 32) return 0;
  uint64_t v = value;
  uint64_t half = uint64_t{1} << (shift - 1);
  return static_cast<uint32_t>((v + half - 1 + ((v >> shift) & 1)) >> shift);
}

// Rounds a finite f32 magnitude (sign bit clear) to an IEEE-like format with `man_bits` mantissa bits
// and exponent `bias`. The result may be past the format's largest finite code: callers decide
// whether that means infinity or saturation. Rounding carries into the exponent field naturally.
uint32_t round_magnitude(uint32_t magnitude, int man_bits, int bias) {
  int exponent = static_cast<int>(magnitude >> 23);
  if (exponent - 127 + bias >= 1)  // normal in the target: rebias, then drop mantissa bits
    return shift_right_rne(magnitude - (static_cast<uint32_t>(127 - bias) << 23), 23 - man_bits);
  // Subnormal in the target: count in units of its smallest subnormal, 2^(1 - bias - man_bits).
  uint32_t significand = (magnitude & 0x7FFFFF) | (exponent ? 0x800000u : 0u);
  return shift_right_rne(significand, 151 - bias - man_bits - std::max(exponent, 1));
}

// Decodes a finite magnitude code of an IEEE-like format (no sign, no inf/NaN) exactly.
float decode_magnitude(uint32_t code, int man_bits, int bias) {
  uint32_t exponent = code >> man_bits, mantissa = code & ((1u << man_bits) - 1);
  if (exponent == 0) return std::ldexp(static_cast<float>(mantissa), 1 - bias - man_bits);
  return f32_from_bits(((exponent - bias + 127) << 23) | (mantissa << (23 - man_bits)));
}

float with_sign(float magnitude, bool negative) { return negative ? -magnitude : magnitude; }

template <typename T>
T load(const void* src, uint64_t i) {
  T value;
  std::memcpy(&value, static_cast<const unsigned char*>(src) + i * sizeof(T), sizeof(T));
  return value;
}

template <float (*decode)(uint8_t)>
const std::array<float, 256>& byte_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[i] = decode(static_cast<uint8_t>(i));
    return t;
  }();
  return table;
}

template <float (*decode)(uint8_t)>
void convert_bytes(const void* src, float* dst, uint64_t count) {
  const auto& table = byte_table<decode>();
  const auto* bytes = static_cast<const uint8_t*>(src);
  for (uint64_t i = 0; i < count; ++i) dst[i] = table[bytes[i]];
}

}  // namespace

const DTypeTraits& traits(DType dtype) {
  auto index = static_cast<size_t>(dtype);
  QINFER_CHECK(index < std::size(kTraits), "invalid DType value {}", index);
  return kTraits[index];
}

std::optional<DType> dtype_from_safetensors(std::string_view name) {
  for (const auto& row : kTraits)
    if (row.safetensors == name) return row.dtype;
  return std::nullopt;
}

uint64_t storage_bytes(DType dtype, uint64_t count) { return (count * bits(dtype) + 7) / 8; }

float bf16_to_f32(uint16_t bits) { return f32_from_bits(uint32_t{bits} << 16); }

uint16_t f32_to_bf16(float value) {
  uint32_t b = f32_bits(value);
  if (std::isnan(value)) return static_cast<uint16_t>((b >> 16) | 0x0040);  // keep sign, force quiet
  return static_cast<uint16_t>(((b >> 16) & 0x8000) | round_magnitude(b & 0x7FFFFFFF, 7, 127));
}

float f16_to_f32(uint16_t bits) {
  bool negative = bits & 0x8000;
  uint32_t magnitude = bits & 0x7FFF;
  if (magnitude >= 0x7C00)  // inf / NaN: widen the payload
    return f32_from_bits((negative ? 0x80000000u : 0u) | 0x7F800000u | ((magnitude & 0x3FF) << 13));
  return with_sign(decode_magnitude(magnitude, 10, 15), negative);
}

uint16_t f32_to_f16(float value) {
  uint32_t b = f32_bits(value);
  uint16_t sign = static_cast<uint16_t>((b >> 16) & 0x8000);
  if (std::isnan(value)) return sign | 0x7E00 | static_cast<uint16_t>((b >> 13) & 0x3FF);
  if (std::isinf(value)) return sign | 0x7C00;
  return sign | static_cast<uint16_t>(std::min(round_magnitude(b & 0x7FFFFFFF, 10, 15), 0x7C00u));
}

float e4m3_to_f32(uint8_t bits) {
  if ((bits & 0x7F) == 0x7F) return std::numeric_limits<float>::quiet_NaN();
  return with_sign(decode_magnitude(bits & 0x7F, 3, 7), bits & 0x80);
}

uint8_t f32_to_e4m3(float value) {
  uint32_t b = f32_bits(value);
  uint8_t sign = static_cast<uint8_t>((b >> 24) & 0x80);
  if (std::isnan(value)) return sign | 0x7F;
  if (std::isinf(value)) return sign | 0x7E;
  return sign | static_cast<uint8_t>(std::min(round_magnitude(b & 0x7FFFFFFF, 3, 7), 0x7Eu));
}

float e5m2_to_f32(uint8_t bits) {
  bool negative = bits & 0x80;
  uint32_t magnitude = bits & 0x7F;
  if (magnitude == 0x7C) return with_sign(std::numeric_limits<float>::infinity(), negative);
  if (magnitude > 0x7C) return with_sign(std::numeric_limits<float>::quiet_NaN(), negative);
  return with_sign(decode_magnitude(magnitude, 2, 15), negative);
}

uint8_t f32_to_e5m2(float value) {
  uint32_t b = f32_bits(value);
  uint8_t sign = static_cast<uint8_t>((b >> 24) & 0x80);
  if (std::isnan(value)) return sign | 0x7E;
  if (std::isinf(value)) return sign | 0x7C;
  return sign | static_cast<uint8_t>(std::min(round_magnitude(b & 0x7FFFFFFF, 2, 15), 0x7Cu));
}

float e8m0_to_f32(uint8_t bits) {
  if (bits == 0xFF) return std::numeric_limits<float>::quiet_NaN();
  return f32_from_bits(bits == 0 ? 0x00400000u : uint32_t{bits} << 23);  // 2^-127 is subnormal in f32
}

uint8_t f32_to_e8m0(float value) {
  if (!std::isfinite(value)) return 0xFF;
  if (!(value > 0)) return 0;
  int exponent;
  double mantissa = 2 * std::frexp(static_cast<double>(value), &exponent);  // value = m * 2^(e-1), m in [1, 2)
  // log2(m) rounds up iff m >= sqrt(2), i.e. m^2 >= 2 (exact in double; never a tie).
  int log2_rounded = exponent - 1 + (mantissa * mantissa >= 2 ? 1 : 0);
  return static_cast<uint8_t>(std::clamp(127 + log2_rounded, 0, 254));
}

float e2m1_to_f32(uint8_t code) { return with_sign(decode_magnitude(code & 0x7, 1, 1), code & 0x8); }

uint8_t f32_to_e2m1(float value) {
  if (std::isnan(value)) return 0x7;
  uint32_t b = f32_bits(value);
  uint8_t sign = static_cast<uint8_t>((b >> 28) & 0x8);
  if (std::isinf(value)) return sign | 0x7;
  return sign | static_cast<uint8_t>(std::min(round_magnitude(b & 0x7FFFFFFF, 1, 1), 0x7u));
}

namespace {

// Elements whose bits under `mask` are all ones (an all-ones exponent: inf or NaN; for E4M3 the NaN
// code). A block holds one iff the largest masked element equals the mask: a max reduction, which
// vectorizes (a compare-and-or loop does not), runs at memcpy speed; only a hit looks for the index.
template <typename T>
std::optional<uint64_t> first_all_ones(const void* data, uint64_t count, T mask) {
  constexpr uint64_t kBlock = 4096;
  const char* bytes = static_cast<const char*>(data);  // memcpy loads: safetensors data need not be aligned
  for (uint64_t begin = 0; begin < count; begin += kBlock) {
    const uint64_t end = std::min(count, begin + kBlock);
    T largest = 0;
    for (uint64_t i = begin; i < end; ++i) {
      T word;
      std::memcpy(&word, bytes + i * sizeof(T), sizeof(T));
      largest = std::max<T>(largest, static_cast<T>(word & mask));
    }
    if (largest != mask) continue;
    for (uint64_t i = begin; i < end; ++i) {
      T word;
      std::memcpy(&word, bytes + i * sizeof(T), sizeof(T));
      if (static_cast<T>(word & mask) == mask) return i;
    }
  }
  return std::nullopt;
}

}  // namespace

std::optional<uint64_t> first_non_finite(DType dtype, const void* data, uint64_t count) {
  switch (dtype) {
    case DType::f64: return first_all_ones<uint64_t>(data, count, 0x7FF0000000000000ull);
    case DType::f32: return first_all_ones<uint32_t>(data, count, 0x7F800000u);
    case DType::f16: return first_all_ones<uint16_t>(data, count, 0x7C00);
    case DType::bf16: return first_all_ones<uint16_t>(data, count, 0x7F80);
    case DType::f8_e4m3: return first_all_ones<uint8_t>(data, count, 0x7F);
    case DType::f8_e5m2: return first_all_ones<uint8_t>(data, count, 0x7C);
    case DType::e8m0: return first_all_ones<uint8_t>(data, count, 0xFF);
    default: return std::nullopt;
  }
}

void convert_to_f32(DType dtype, const void* src, float* dst, uint64_t count) {
  if (count == 0) return;  // empty tensors may have no storage at all
  switch (dtype) {
    case DType::f64:
      for (uint64_t i = 0; i < count; ++i) dst[i] = static_cast<float>(load<double>(src, i));
      return;
    case DType::f32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::f16:
      for (uint64_t i = 0; i < count; ++i) dst[i] = f16_to_f32(load<uint16_t>(src, i));
      return;
    case DType::bf16:
      for (uint64_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(load<uint16_t>(src, i));
      return;
    case DType::f8_e4m3: return convert_bytes<e4m3_to_f32>(src, dst, count);
    case DType::f8_e5m2: return convert_bytes<e5m2_to_f32>(src, dst, count);
    case DType::e8m0: return convert_bytes<e8m0_to_f32>(src, dst, count);
    case DType::f4_e2m1: {
      const auto* bytes = static_cast<const uint8_t*>(src);
      for (uint64_t i = 0; i < count; ++i) dst[i] = e2m1_to_f32(bytes[i / 2] >> (4 * (i % 2)));
      return;
    }
    default:
      fail("convert_to_f32: {} is not a floating-point dtype", name(dtype));
  }
}

}  // namespace qinfer
