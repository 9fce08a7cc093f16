#pragma once
// The CUDA devices of this machine and their facts, for `qinfer devices` and for sizing kernels.
#include <cstdint>
#include <string>
#include <vector>

namespace qinfer::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  uint64_t total_memory_bytes = 0;
  uint64_t free_memory_bytes = 0;
  int sm_count = 0;
  int compute_major = 0;
  int compute_minor = 0;
  int l2_cache_bytes = 0;
  int memory_bus_width_bits = 0;
  int memory_clock_khz = 0;

  // Datasheet-style peak: double data rate x bus width. Measured copy bandwidth lands below it.
  double peak_memory_bandwidth_gbs() const {
    return 2.0 * memory_clock_khz * 1e3 * (memory_bus_width_bits / 8.0) / 1e9;
  }
};

// Every visible device; empty (no throw) when there is no driver or no GPU, so CPU-only machines
// running a CUDA build still work. Creates each device's primary context to read free memory.
std::vector<DeviceInfo> list_devices();

// Number of visible devices; 0 when there is no driver or no GPU.
int device_count();

}  // namespace qinfer::cuda
