// Device conversions to f32 against the CPU's qinfer::convert_to_f32, bit for bit, over every bit
// pattern of each narrow type, odd counts, unaligned pointers and a large random buffer.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "backend/cuda/buffer.h"
#include "backend/cuda/convert.cuh"
#include "core/dtype.h"
#include "core/error.h"

namespace qinfer {
// Names the dtype in gtest's parameter printouts.
void PrintTo(DType dtype, std::ostream* out) { *out << name(dtype); }
}  // namespace qinfer

namespace qinfer::cuda {
namespace {

constexpr uint32_t kPoison = 0xDEADBEEFu;  // no decoder can produce these low mantissa bits
constexpr size_t kGuardFloats = 8;

uint32_t bits_of(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

// Every bit pattern once: 65536 for 16-bit types, 256 for 8-bit, and for fp4 every byte, so each of
// the 16 codes appears in both nibble positions (512 elements).
std::vector<uint8_t> all_patterns(DType dtype) {
  std::vector<uint8_t> bytes;
  if (bits(dtype) == 16) {
    for (uint32_t code = 0; code < 65536; ++code) {
      bytes.push_back(static_cast<uint8_t>(code & 0xFF));
      bytes.push_back(static_cast<uint8_t>(code >> 8));
    }
  } else {
    for (uint32_t code = 0; code < 256; ++code) bytes.push_back(static_cast<uint8_t>(code));
  }
  return bytes;
}

uint64_t element_count(DType dtype, size_t byte_count) { return byte_count * 8 / bits(dtype); }

// Converts `count` elements of `bytes` on the device, with the input placed `src_offset` bytes and
// the output `dst_offset` floats past an allocation's (256-byte aligned) start, and compares with
// the CPU. Also checks that no float outside the output range was written.
void expect_matches_cpu(DType dtype, const std::vector<uint8_t>& bytes, uint64_t count, size_t src_offset,
                        size_t dst_offset) {
  SCOPED_TRACE(fmt::format("{}: count {}, src offset {} B, dst offset {} floats", name(dtype), count, src_offset,
                           dst_offset));
  const size_t src_bytes = storage_bytes(dtype, count);
  ASSERT_LE(src_bytes, bytes.size());
  DeviceBuffer src(src_offset + src_bytes + 16);
  src.upload(bytes.data(), src_bytes, src_offset);

  const size_t dst_floats = dst_offset + count + kGuardFloats;
  std::vector<uint32_t> poison(dst_floats, kPoison);
  DeviceBuffer dst(dst_floats * sizeof(float));
  dst.upload(poison.data(), poison.size() * sizeof(uint32_t));

  convert_to_f32(dtype, static_cast<const uint8_t*>(src.data()) + src_offset, dst.as<float>() + dst_offset, count,
                 nullptr);
  QINFER_CUDA_CHECK(cudaDeviceSynchronize());
  auto got = dst.download<uint32_t>();

  std::vector<float> expected(count);
  qinfer::convert_to_f32(dtype, bytes.data(), expected.data(), count);

  int reported = 0;
  uint64_t mismatches = 0;
  for (uint64_t i = 0; i < count; ++i) {
    uint32_t got_bits = got[dst_offset + i], want_bits = bits_of(expected[i]);
    float got_value;
    std::memcpy(&got_value, &got_bits, sizeof got_value);
    bool same = got_bits == want_bits || (std::isnan(got_value) && std::isnan(expected[i]));
    if (!same) {
      ++mismatches;
      if (reported++ < 8)
        ADD_FAILURE() << fmt::format("element {}: device {:#010x} ({}), cpu {:#010x} ({})", i, got_bits, got_value,
                                     want_bits, expected[i]);
    }
  }
  EXPECT_EQ(mismatches, 0u);
  for (size_t i = 0; i < dst_offset; ++i) EXPECT_EQ(got[i], kPoison) << "wrote before the output at float " << i;
  for (size_t i = dst_offset + count; i < dst_floats; ++i)
    EXPECT_EQ(got[i], kPoison) << "wrote past the output at float " << i;
}

class DeviceConvert : public ::testing::TestWithParam<DType> {};

TEST_P(DeviceConvert, EveryBitPattern) {
  auto bytes = all_patterns(GetParam());
  expect_matches_cpu(GetParam(), bytes, element_count(GetParam(), bytes.size()), 0, 0);
}

TEST_P(DeviceConvert, OddCountsAndShortTails) {
  auto bytes = all_patterns(GetParam());
  for (uint64_t count : {1, 2, 3, 4, 5, 7, 9, 15, 17, 31, 33, 63, 127, 255})
    expect_matches_cpu(GetParam(), bytes, count, 0, 0);
}

TEST_P(DeviceConvert, UnalignedPointers) {
  const DType dtype = GetParam();
  auto bytes = all_patterns(dtype);
  const uint64_t count = element_count(dtype, bytes.size()) - 5;  // odd: leaves a tail
  const size_t step = bits(dtype) == 16 ? 2 : 1;                  // 16-bit inputs need 2-byte alignment
  for (size_t src_offset : {step, 2 * step, 3 * step, 4 * step, 7 * step})
    for (size_t dst_offset : {0, 1, 2, 3}) expect_matches_cpu(dtype, bytes, count, src_offset, dst_offset);
}

// Large enough for every block to loop several times, on the vectorised path (aligned, and with a
// peeled head) and on the element-by-element path (input off its unit alignment).
TEST_P(DeviceConvert, LargeRandomBuffer) {
  const DType dtype = GetParam();
  const uint64_t count = (uint64_t{3} << 20) + 5;
  std::vector<uint8_t> bytes(storage_bytes(dtype, count));
  std::mt19937_64 rng(1234 + static_cast<int>(dtype));
  for (auto& byte : bytes) byte = static_cast<uint8_t>(rng());
  const size_t step = bits(dtype) == 16 ? 2 : 1;
  expect_matches_cpu(dtype, bytes, count, 0, 0);
  // A peeled head brings both pointers onto units: 3 elements for a 1-float offset; fp4 needs an
  // even head (whole bytes), so 2 elements for a 2-float offset.
  if (dtype == DType::f4_e2m1)
    expect_matches_cpu(dtype, bytes, count - 3, 1, 2);
  else
    expect_matches_cpu(dtype, bytes, count - 3, 8 - 3 * step, 1);
  expect_matches_cpu(dtype, bytes, count - 3, step, 0);  // input never unit-aligned
}

INSTANTIATE_TEST_SUITE_P(NarrowTypes, DeviceConvert,
                         ::testing::Values(DType::bf16, DType::f16, DType::f8_e4m3, DType::f8_e5m2, DType::e8m0,
                                           DType::f4_e2m1),
                         [](const auto& info) { return std::string(name(info.param)); });

TEST(DeviceConvert, F32IsACopy) {
  std::vector<float> values = {1.5f, -0.0f, 3.25e-40f, 65504.0f, -7.0f};
  DeviceBuffer src(values.size() * sizeof(float)), dst(values.size() * sizeof(float));
  src.upload(std::span<const float>(values));
  convert_to_f32(DType::f32, src.data(), dst.as<float>(), values.size(), nullptr);
  QINFER_CUDA_CHECK(cudaDeviceSynchronize());
  auto got = dst.download<float>();
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(bits_of(got[i]), bits_of(values[i]));
}

TEST(DeviceConvert, IntegerTypesAreRejected) {
  DeviceBuffer src(64), dst(64);
  EXPECT_THROW(convert_to_f32(DType::i32, src.data(), dst.as<float>(), 4, nullptr), Error);
}

TEST(DeviceConvert, MisalignedOutputIsRejected) {
  DeviceBuffer src(64), dst(64);
  auto* misaligned = reinterpret_cast<float*>(static_cast<uint8_t*>(dst.data()) + 2);
  EXPECT_THROW(convert_to_f32(DType::bf16, src.data(), misaligned, 4, nullptr), Error);
}

}  // namespace
}  // namespace qinfer::cuda
