#include "backend/cuda/device.h"

#include "backend/cuda/check.h"

namespace qinfer::cuda {

int device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // "no driver" / "no device" is an answer here, not an error to keep
    return 0;
  }
  return count;
}

std::vector<DeviceInfo> list_devices() {
  int count = device_count();
  std::vector<DeviceInfo> devices;
  if (count == 0) return devices;
  int previous = 0;
  QINFER_CUDA_CHECK(cudaGetDevice(&previous));
  for (int i = 0; i < count; ++i) {
    DeviceInfo info;
    info.index = i;
    cudaDeviceProp prop{};
    QINFER_CUDA_CHECK(cudaGetDeviceProperties(&prop, i));
    info.name = prop.name;
    info.sm_count = prop.multiProcessorCount;
    info.compute_major = prop.major;
    info.compute_minor = prop.minor;
    info.l2_cache_bytes = prop.l2CacheSize;
    info.memory_bus_width_bits = prop.memoryBusWidth;
    // CUDA 13 dropped the memory clock from cudaDeviceProp; the attribute remains.
    QINFER_CUDA_CHECK(cudaDeviceGetAttribute(&info.memory_clock_khz, cudaDevAttrMemoryClockRate, i));
    QINFER_CUDA_CHECK(cudaSetDevice(i));
    size_t free_bytes = 0, total_bytes = 0;
    QINFER_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total_bytes));
    info.free_memory_bytes = free_bytes;
    info.total_memory_bytes = total_bytes;
    devices.push_back(std::move(info));
  }
  QINFER_CUDA_CHECK(cudaSetDevice(previous));
  return devices;
}

}  // namespace qinfer::cuda
