#include "core/dtype.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/error.h"

namespace qinfer {
namespace {

// Independent description of each narrow float format, used by slow reference conversions.
struct Format {
  const char* name;
  int total_bits, man_bits, bias;
  bool ieee_specials;  // top exponent = inf/NaN (bf16, f16, e5m2)
  bool only_max_nan;   // S.1111.111 is NaN, no inf (e4m3)
  float (*decode)(uint32_t);
  uint32_t (*encode)(float);
};

const Format kFormats[] = {
    {"bf16", 16, 7, 127, true, false, [](uint32_t c) { return bf16_to_f32(uint16_t(c)); },
     [](float v) -> uint32_t { return f32_to_bf16(v); }},
    {"f16", 16, 10, 15, true, false, [](uint32_t c) { return f16_to_f32(uint16_t(c)); },
     [](float v) -> uint32_t { return f32_to_f16(v); }},
    {"e4m3", 8, 3, 7, false, true, [](uint32_t c) { return e4m3_to_f32(uint8_t(c)); },
     [](float v) -> uint32_t { return f32_to_e4m3(v); }},
    {"e5m2", 8, 2, 15, true, false, [](uint32_t c) { return e5m2_to_f32(uint8_t(c)); },
     [](float v) -> uint32_t { return f32_to_e5m2(v); }},
    {"e2m1", 4, 1, 1, false, false, [](uint32_t c) { return e2m1_to_f32(uint8_t(c)); },
     [](float v) -> uint32_t { return f32_to_e2m1(v); }},
};

uint32_t sign_bit(const Format& f) { return 1u << (f.total_bits - 1); }
uint32_t all_exponent(const Format& f) { return ((1u << (f.total_bits - 1 - f.man_bits)) - 1) << f.man_bits; }

bool is_nan_code(const Format& f, uint32_t code) {
  uint32_t mag = code & (sign_bit(f) - 1);
  if (f.ieee_specials) return (mag & all_exponent(f)) == all_exponent(f) && (mag & ((1u << f.man_bits) - 1));
  return f.only_max_nan && mag == sign_bit(f) - 1;
}

// Value of a code by the textbook formula, in double.
double reference_decode(const Format& f, uint32_t code) {
  uint32_t mag = code & (sign_bit(f) - 1);
  double sign = (code & sign_bit(f)) ? -1.0 : 1.0;
  if (is_nan_code(f, code)) return std::numeric_limits<double>::quiet_NaN();
  if (f.ieee_specials && (mag & all_exponent(f)) == all_exponent(f)) return sign * INFINITY;
  int e = static_cast<int>(mag >> f.man_bits), m = static_cast<int>(mag & ((1u << f.man_bits) - 1));
  if (e == 0) return sign * std::ldexp(m, 1 - f.bias - f.man_bits);
  return sign * std::ldexp((1 << f.man_bits) + m, e - f.bias - f.man_bits);
}

// Positive finite values in code order; IEEE formats get one pseudo-entry past the max (2^(emax+1),
// coded as inf) so that nearest-even onto this list reproduces IEEE overflow exactly.
std::vector<double> positive_grid(const Format& f) {
  std::vector<double> grid;
  for (uint32_t code = 0; code < sign_bit(f); ++code) {
    if (is_nan_code(f, code) || (f.ieee_specials && (code & all_exponent(f)) == all_exponent(f))) break;
    grid.push_back(reference_decode(f, code));
  }
  if (f.ieee_specials) grid.push_back(std::ldexp(1.0, static_cast<int>(all_exponent(f) >> f.man_bits) - f.bias));
  return grid;
}

// Nearest grid point, ties to the even code; saturating formats clamp first.
uint32_t reference_encode(const Format& f, const std::vector<double>& grid, float value) {
  uint32_t sign = std::signbit(value) ? sign_bit(f) : 0;
  double a = std::fabs(static_cast<double>(value));
  if (!f.ieee_specials) a = std::min(a, grid.back());
  if (a >= grid.back()) return sign | static_cast<uint32_t>(grid.size() - 1);
  size_t hi = std::upper_bound(grid.begin(), grid.end(), a) - grid.begin(), lo = hi - 1;
  if (a == grid[lo]) return sign | static_cast<uint32_t>(lo);
  double twice = 2 * a, sum = grid[lo] + grid[hi];  // exact: both small dyadic rationals
  if (twice < sum) return sign | static_cast<uint32_t>(lo);
  if (twice > sum) return sign | static_cast<uint32_t>(hi);
  return sign | static_cast<uint32_t>(lo % 2 == 0 ? lo : hi);
}

std::vector<float> sample_values(const Format& f, const std::vector<double>& grid, size_t random_count) {
  std::vector<float> values = {0.0f, -0.0f, INFINITY, -INFINITY, std::numeric_limits<float>::max(),
                               std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                               1e-30f, 1e30f};
  for (size_t i = 0; i + 1 < grid.size(); ++i) {
    double mid = (grid[i] + grid[i + 1]) / 2;
    float midf = static_cast<float>(mid);
    EXPECT_EQ(static_cast<double>(midf), mid) << f.name << ": halfway point not exact in f32";
    for (float v : {static_cast<float>(grid[i]), midf, std::nextafter(midf, 0.0f), std::nextafter(midf, INFINITY)})
      values.insert(values.end(), {v, -v});
  }
  std::mt19937 rng(1234);
  for (size_t i = 0; i < random_count; ++i) values.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  // Random mantissas at exponents around the format's range, where rounding is interesting.
  int lowest = 1 - f.bias - f.man_bits - 2, highest = static_cast<int>(std::log2(grid.back())) + 2;
  std::uniform_int_distribution<int> exponent(lowest, highest);
  for (size_t i = 0; i < random_count / 4; ++i)
    values.push_back(std::ldexp(1.0f + static_cast<float>(rng() >> 8) * 0x1p-24f, exponent(rng)) *
                     (rng() & 1 ? -1.0f : 1.0f));
  return values;
}

TEST(DType, DecodeEveryPatternMatchesFormula) {
  for (const auto& f : kFormats) {
    for (uint32_t code = 0; code < (1u << f.total_bits); ++code) {
      double expected = reference_decode(f, code);
      float got = f.decode(code);
      if (std::isnan(expected)) {
        EXPECT_TRUE(std::isnan(got)) << f.name << " code " << code;
        if (f.ieee_specials) {
          EXPECT_EQ(std::signbit(got), (code & sign_bit(f)) != 0) << f.name << " " << code;
        }
      } else {
        ASSERT_EQ(static_cast<double>(got), expected) << f.name << " code " << code;
        ASSERT_EQ(std::signbit(got), (code & sign_bit(f)) != 0) << f.name << " code " << code;
      }
    }
  }
}

TEST(DType, EveryPatternRoundTripsThroughF32) {
  for (const auto& f : kFormats) {
    for (uint32_t code = 0; code < (1u << f.total_bits); ++code) {
      uint32_t back = f.encode(f.decode(code));
      if (is_nan_code(f, code)) {
        EXPECT_TRUE(std::isnan(f.decode(back))) << f.name << " code " << code;
      } else {
        ASSERT_EQ(back, code) << f.name;
      }
    }
  }
}

TEST(DType, RoundingMatchesNearestEvenReference) {
  for (const auto& f : kFormats) {
    auto grid = positive_grid(f);
    size_t checked = 0;
    for (float v : sample_values(f, grid, f.total_bits == 16 ? 1'000'000 : 200'000)) {
      uint32_t got = f.encode(v);
      if (std::isnan(v)) {
        if (f.total_bits > 4) {
          EXPECT_TRUE(is_nan_code(f, got)) << f.name;
        }
        continue;
      }
      ASSERT_EQ(got, reference_encode(f, grid, v)) << f.name << " value " << v << " bits 0x" << std::hex
                                                   << std::bit_cast<uint32_t>(v);
      ++checked;
    }
    EXPECT_GT(checked, 100'000u) << f.name;
  }
}

TEST(DType, NaNRules) {
  float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(f32_to_bf16(-nan) & 0xFFC0, 0xFFC0);  // negative quiet NaN
  EXPECT_EQ(f32_to_bf16(std::bit_cast<float>(0x7F800001u)) & 0x7FC0, 0x7FC0);  // signalling -> quiet
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::bit_cast<float>(0x7F800001u)))));
  EXPECT_EQ(f32_to_e4m3(nan), 0x7F);
  EXPECT_EQ(f32_to_e4m3(-nan), 0xFF);
  EXPECT_EQ(f32_to_e5m2(nan), 0x7E);
  EXPECT_EQ(f32_to_e2m1(nan), 0x7);
  EXPECT_EQ(f32_to_e2m1(-nan), 0x7);
  EXPECT_EQ(f32_to_e8m0(nan), 0xFF);
}

TEST(DType, SaturationAndOverflow) {
  EXPECT_EQ(f32_to_e4m3(449.0f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(1e10f), 0x7E);
  EXPECT_EQ(f32_to_e4m3(-INFINITY), 0xFE);
  EXPECT_EQ(f32_to_e5m2(61439.0f), 0x7B);
  EXPECT_EQ(f32_to_e5m2(61440.0f), 0x7C);  // halfway to 2^16 rounds to even = inf
  EXPECT_EQ(f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(f32_to_e2m1(100.0f), 0x7);
  EXPECT_EQ(f32_to_e2m1(-INFINITY), 0xF);
  EXPECT_EQ(f32_to_e2m1(5.0f), 0x6);   // tie between 4 (code 6) and 6 (code 7) -> even
  EXPECT_EQ(f32_to_e2m1(0.25f), 0x0);  // tie between 0 and 0.5 -> 0
  EXPECT_EQ(f32_to_e2m1(-0.75f), 0xA);
}

TEST(DType, KnownValues) {
  EXPECT_EQ(bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(f16_to_f32(0x0001), 0x1p-24f);
  EXPECT_EQ(f16_to_f32(0x7C00), INFINITY);
  EXPECT_EQ(e4m3_to_f32(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_f32(0x08), 0x1p-6f);
  EXPECT_EQ(e4m3_to_f32(0x01), 0x1p-9f);
  EXPECT_TRUE(std::isnan(e4m3_to_f32(0xFF)));
  EXPECT_EQ(e4m3_to_f32(0x78), 256.0f);  // exponent 15 is finite in the fn variant
  EXPECT_EQ(e5m2_to_f32(0x7B), 57344.0f);
  EXPECT_EQ(e5m2_to_f32(0x7C), INFINITY);
  EXPECT_EQ(e5m2_to_f32(0x01), 0x1p-16f);
  EXPECT_EQ(e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(e8m0_to_f32(0), 0x1p-127f);
  EXPECT_EQ(e8m0_to_f32(254), 0x1p127f);
  EXPECT_EQ(e2m1_to_f32(0x7), 6.0f);
  EXPECT_EQ(e2m1_to_f32(0xF), -6.0f);
  EXPECT_EQ(e2m1_to_f32(0x1), 0.5f);
  EXPECT_EQ(e2m1_to_f32(0x5), 3.0f);
}

TEST(DType, E8M0EveryPatternAndRounding) {
  for (int code = 0; code < 255; ++code) {
    ASSERT_EQ(static_cast<double>(e8m0_to_f32(uint8_t(code))), std::ldexp(1.0, code - 127));
    ASSERT_EQ(f32_to_e8m0(e8m0_to_f32(uint8_t(code))), code);
  }
  EXPECT_TRUE(std::isnan(e8m0_to_f32(0xFF)));
  EXPECT_EQ(f32_to_e8m0(INFINITY), 0xFF);
  EXPECT_EQ(f32_to_e8m0(0.0f), 0);
  EXPECT_EQ(f32_to_e8m0(-4.0f), 0);
  EXPECT_EQ(f32_to_e8m0(-INFINITY), 0xFF);
  EXPECT_EQ(f32_to_e8m0(std::numeric_limits<float>::max()), 254);
  EXPECT_EQ(f32_to_e8m0(std::numeric_limits<float>::denorm_min()), 0);

  std::vector<float> values;
  for (int k = -150; k < 128; ++k) {
    float boundary = static_cast<float>(std::ldexp(std::sqrt(2.0), k));
    values.insert(values.end(), {boundary, std::nextafter(boundary, 0.0f), std::nextafter(boundary, INFINITY)});
  }
  std::mt19937 rng(7);
  for (int i = 0; i < 200'000; ++i) values.push_back(std::fabs(std::bit_cast<float>(static_cast<uint32_t>(rng()))));
  for (float v : values) {
    if (!std::isfinite(v) || v == 0) continue;
    long double k = std::round(std::log2(static_cast<long double>(v)));
    int expected = std::clamp(127 + static_cast<int>(k), 0, 254);
    ASSERT_EQ(f32_to_e8m0(v), expected) << "value " << v;
  }
}

TEST(DType, ConvertBuffers) {
  std::vector<float> out(4);
  const uint16_t bf16[] = {0x3F80, 0xC000, 0x0000};
  convert_to_f32(DType::bf16, bf16, out.data(), 3);
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -2.0f);
  const uint16_t f16[] = {0x3C00, 0x0001};
  convert_to_f32(DType::f16, f16, out.data(), 2);
  EXPECT_EQ(out[1], 0x1p-24f);
  const double f64[] = {0.1, -3.0};
  convert_to_f32(DType::f64, f64, out.data(), 2);
  EXPECT_EQ(out[0], 0.1f);
  EXPECT_EQ(out[1], -3.0f);
  const float f32[] = {1.5f, -0.0f};
  convert_to_f32(DType::f32, f32, out.data(), 2);
  EXPECT_EQ(out[0], 1.5f);
  EXPECT_TRUE(std::signbit(out[1]));

  std::vector<uint8_t> bytes(256);
  for (int i = 0; i < 256; ++i) bytes[i] = uint8_t(i);
  std::vector<float> wide(256);
  for (auto [dtype, decode] : {std::pair{DType::f8_e4m3, &e4m3_to_f32}, std::pair{DType::f8_e5m2, &e5m2_to_f32},
                               std::pair{DType::e8m0, &e8m0_to_f32}}) {
    convert_to_f32(dtype, bytes.data(), wide.data(), 256);
    for (int i = 0; i < 256; ++i) {
      float expected = decode(uint8_t(i));
      if (std::isnan(expected)) {
        EXPECT_TRUE(std::isnan(wide[i]));
      } else {
        ASSERT_EQ(wide[i], expected) << name(dtype) << " " << i;
      }
    }
  }

  const uint8_t fp4[] = {0x21, 0xF7};  // low nibble first: 0.5, 1, 6, -6
  convert_to_f32(DType::f4_e2m1, fp4, out.data(), 3);  // odd count stops mid-byte
  out[3] = 42;
  EXPECT_EQ(out, (std::vector<float>{0.5f, 1.0f, 6.0f, 42.0f}));
  convert_to_f32(DType::f4_e2m1, fp4, out.data(), 4);
  EXPECT_EQ(out[3], -6.0f);

  EXPECT_THROW(convert_to_f32(DType::i32, bytes.data(), wide.data(), 1), Error);
}

TEST(DType, SafetensorsNamesAndTraits) {
  const char* spellings[] = {"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0", "F4", "I64",
                             "I32", "I16", "I8",  "U64", "U32",     "U16",     "U8",      "BOOL"};
  for (size_t i = 0; i < std::size(spellings); ++i) {
    auto dtype = dtype_from_safetensors(spellings[i]);
    ASSERT_TRUE(dtype.has_value()) << spellings[i];
    EXPECT_EQ(static_cast<size_t>(*dtype), i);
    EXPECT_EQ(traits(*dtype).safetensors, spellings[i]);
    EXPECT_EQ(traits(*dtype).is_float, i < 8) << spellings[i];
  }
  EXPECT_FALSE(dtype_from_safetensors("bf16").has_value());
  EXPECT_FALSE(dtype_from_safetensors("F8").has_value());
  EXPECT_FALSE(dtype_from_safetensors("").has_value());
  EXPECT_EQ(name(DType::bf16), "bf16");
  EXPECT_EQ(bits(DType::f4_e2m1), 4);
  EXPECT_EQ(bits(DType::boolean), 8);
  EXPECT_EQ(bits(DType::u64), 64);
  EXPECT_THROW(traits(static_cast<DType>(200)), Error);
}

TEST(DType, StorageBytes) {
  EXPECT_EQ(storage_bytes(DType::f32, 0), 0u);
  EXPECT_EQ(storage_bytes(DType::bf16, 3), 6u);
  EXPECT_EQ(storage_bytes(DType::f64, 2), 16u);
  EXPECT_EQ(storage_bytes(DType::f4_e2m1, 3), 2u);
  EXPECT_EQ(storage_bytes(DType::f4_e2m1, 4), 2u);
  EXPECT_EQ(storage_bytes(DType::f4_e2m1, 1), 1u);
  EXPECT_EQ(storage_bytes(DType::boolean, 5), 5u);
  EXPECT_EQ(storage_bytes(DType::f8_e4m3, uint64_t{1} << 40), uint64_t{1} << 40);
}

// The load-time weight scan: exactly the patterns that decode to NaN or infinity, at any position
// (across its 4096-element blocks) and any alignment (safetensors data need not be aligned).
TEST(DType, FirstNonFiniteMatchesTheDecodedValue) {
  for (DType dtype : {DType::f16, DType::bf16, DType::f8_e4m3, DType::f8_e5m2, DType::e8m0}) {
    const uint32_t patterns = 1u << bits(dtype);
    for (uint32_t p = 0; p < patterns; ++p) {
      float value = 0;
      convert_to_f32(dtype, &p, &value, 1);  // little-endian: the low bytes hold the pattern
      EXPECT_EQ(first_non_finite(dtype, &p, 1).has_value(), !std::isfinite(value)) << name(dtype) << " " << p;
    }
  }
  for (float v : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                  -std::numeric_limits<float>::infinity()})
    EXPECT_EQ(first_non_finite(DType::f32, &v, 1), 0u);
  for (float v : {0.0f, -0.0f, 1e38f, -3.0f, std::numeric_limits<float>::denorm_min()})
    EXPECT_EQ(first_non_finite(DType::f32, &v, 1), std::nullopt);
  const double d[2] = {1e308, -std::numeric_limits<double>::infinity()};
  EXPECT_EQ(first_non_finite(DType::f64, d, 2), 1u);
  const int32_t ints[1] = {-1};  // all ones, but integers have no NaN
  EXPECT_EQ(first_non_finite(DType::i32, ints, 1), std::nullopt);

  std::vector<uint16_t> bf16(10000, 0x3F80);  // 1.0
  std::vector<char> unaligned(bf16.size() * 2 + 1);
  for (size_t at : {size_t{0}, size_t{4095}, size_t{4096}, size_t{9999}}) {
    std::fill(bf16.begin(), bf16.end(), 0x3F80);
    bf16[at] = 0xFF80;  // -inf
    bf16[std::min<size_t>(at + 1, 9999)] = 0x7FC0;
    EXPECT_EQ(first_non_finite(DType::bf16, bf16.data(), bf16.size()), at);
    std::memcpy(unaligned.data() + 1, bf16.data(), bf16.size() * 2);
    EXPECT_EQ(first_non_finite(DType::bf16, unaligned.data() + 1, bf16.size()), at);
  }
  EXPECT_EQ(first_non_finite(DType::bf16, bf16.data(), 9999), std::nullopt);  // the last element is past count
}

}  // namespace
}  // namespace qinfer
