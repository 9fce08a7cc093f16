#include <gtest/gtest.h>
#include <fmt/format.h>

#include "backend/cuda/bandwidth.h"
#include "backend/cuda/device.h"

namespace qinfer::cuda {
namespace {

TEST(Devices, ListsEveryVisibleGpuWithSaneFacts) {
  auto devices = list_devices();
  ASSERT_FALSE(devices.empty()) << "no CUDA device found: these tests need a GPU";
  EXPECT_EQ(static_cast<int>(devices.size()), device_count());
  for (const auto& device : devices) {
    fmt::print("GPU {}: {}, cc {}.{}, {} SMs, L2 {} MiB, {:.1f} GiB ({:.1f} free), {}-bit bus at {} MHz, peak {:.0f} GB/s\n",
               device.index, device.name, device.compute_major, device.compute_minor, device.sm_count,
               device.l2_cache_bytes >> 20, device.total_memory_bytes / 1073741824.0,
               device.free_memory_bytes / 1073741824.0, device.memory_bus_width_bits, device.memory_clock_khz / 1000,
               device.peak_memory_bandwidth_gbs());
    EXPECT_FALSE(device.name.empty());
    EXPECT_GT(device.sm_count, 0);
    EXPECT_GE(device.compute_major, 5);
    EXPECT_GT(device.l2_cache_bytes, 0);
    EXPECT_GT(device.free_memory_bytes, 0u);
    EXPECT_LE(device.free_memory_bytes, device.total_memory_bytes);
    EXPECT_GT(device.peak_memory_bandwidth_gbs(), 100.0);
    // The H200 this project targets: Hopper, 132 SMs, ~141 GB.
    if (device.name.find("H200") != std::string::npos) {
      EXPECT_EQ(device.compute_major, 9);
      EXPECT_EQ(device.sm_count, 132);
      EXPECT_GT(device.total_memory_bytes, uint64_t{130} << 30);
    }
  }
}

TEST(Devices, CopyBandwidthIsPlausible) {
  auto devices = list_devices();
  ASSERT_FALSE(devices.empty());
  const double gbs = measure_copy_bandwidth_gbs(size_t{1} << 30, 10);
  const double peak = devices[0].peak_memory_bandwidth_gbs();
  fmt::print("copy bandwidth on {}: {:.0f} GB/s ({:.0f}% of the {:.0f} GB/s peak)\n", devices[0].name, gbs,
             100 * gbs / peak, peak);
  // A mistimed probe lands far outside these; a healthy one sits at 70-95% of the peak.
  EXPECT_GT(gbs, 0.3 * peak);
  EXPECT_LT(gbs, 1.05 * peak);
  if (devices[0].name.find("H200") != std::string::npos) {
    EXPECT_GT(gbs, 1000.0);
  }
}

TEST(Devices, MedianTimerMeasuresDeviceWork) {
  // A 256 MiB memset takes tens of microseconds on any recent GPU; an empty region takes ~nothing.
  void* data = nullptr;
  const size_t bytes = size_t{256} << 20;
  QINFER_CUDA_CHECK(cudaMalloc(&data, bytes));
  double busy = median_time_ms([&] { QINFER_CUDA_CHECK(cudaMemsetAsync(data, 1, bytes, nullptr)); });
  double idle = median_time_ms([] {});
  QINFER_CUDA_CHECK(cudaFree(data));
  EXPECT_GT(busy, 0.0);
  EXPECT_GT(busy, 5 * idle);
}

}  // namespace
}  // namespace qinfer::cuda
