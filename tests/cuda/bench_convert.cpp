// Benchmark, not a test: GB/s (bytes read + written) of each device conversion to f32 over
// 2^27 elements (512 MiB of f32 out), against the device-to-device copy bandwidth measured alongside.
#include <fmt/format.h>

#include <cstdint>
#include <vector>

#include "backend/cuda/bandwidth.h"
#include "backend/cuda/buffer.h"
#include "backend/cuda/convert.cuh"
#include "backend/cuda/device.h"

using namespace qinfer;
using namespace qinfer::cuda;

namespace {

// Random bytes: real weights, not zeros, decide the timing (fast xorshift keeps set-up short).
std::vector<uint8_t> random_bytes(size_t count) {
  std::vector<uint8_t> bytes(count);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < count; i += 8) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    for (size_t k = 0; k < 8 && i + k < count; ++k) bytes[i + k] = static_cast<uint8_t>(state >> (8 * k));
  }
  return bytes;
}

}  // namespace

int main() {
  auto devices = list_devices();
  if (devices.empty()) {
    fmt::print("no CUDA device found\n");
    return 1;
  }
  fmt::print("device: {} ({} SMs, peak {:.0f} GB/s)\n", devices[0].name, devices[0].sm_count,
             devices[0].peak_memory_bandwidth_gbs());
  const double copy_gbs = measure_copy_bandwidth_gbs(size_t{1} << 30, 20);
  fmt::print("copy bandwidth: {:.0f} GB/s (1 GiB device-to-device, read + write, median of 20)\n", copy_gbs);

  const uint64_t count = uint64_t{1} << 27;
  DeviceBuffer src(storage_bytes(DType::f32, count) + 16), dst(count * sizeof(float));
  // Conversions mostly write (f32 out is 2-8x the input): the write-only rate is their other ceiling.
  const double memset_ms = median_time_ms([&] { QINFER_CUDA_CHECK(cudaMemsetAsync(dst.data(), 0x5A, dst.size())); });
  fmt::print("write-only bandwidth: {:.0f} GB/s (512 MiB memset, median of 20)\n\n", dst.size() / (memset_ms * 1e-3) / 1e9);

  auto host = random_bytes(storage_bytes(DType::f32, count));
  src.upload(host.data(), host.size());

  struct Case {
    DType dtype;
    size_t src_offset;  // bytes; an offset off the unit alignment forces the element-by-element path
    const char* label;
  };
  const Case cases[] = {
      {DType::bf16, 0, "bf16"},       {DType::f16, 0, "f16"},         {DType::f8_e4m3, 0, "f8_e4m3"},
      {DType::f8_e5m2, 0, "f8_e5m2"}, {DType::e8m0, 0, "e8m0"},       {DType::f4_e2m1, 0, "f4_e2m1"},
      {DType::f32, 0, "f32 (copy)"},  {DType::bf16, 2, "bf16, input off 8-byte alignment (scalar path)"},
  };
  fmt::print("{:<48} {:>9} {:>9} {:>9} {:>9} {:>7}\n", "conversion", "in MiB", "out MiB", "ms", "GB/s", "of copy");
  for (const auto& c : cases) {
    const uint64_t in_bytes = storage_bytes(c.dtype, count), out_bytes = count * sizeof(float);
    const void* in = static_cast<const uint8_t*>(src.data()) + c.src_offset;
    const double ms = median_time_ms([&] { convert_to_f32(c.dtype, in, dst.as<float>(), count, nullptr); }, nullptr, 20);
    const double gbs = static_cast<double>(in_bytes + out_bytes) / (ms * 1e-3) / 1e9;
    fmt::print("{:<48} {:>9.0f} {:>9.0f} {:>9.3f} {:>9.0f} {:>6.1f}%\n", c.label, in_bytes / 1048576.0,
               out_bytes / 1048576.0, ms, gbs, 100 * gbs / copy_gbs);
  }
  return 0;
}
