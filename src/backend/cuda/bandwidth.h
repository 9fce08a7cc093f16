#pragma once
// Timing device work with CUDA events, and the copy-bandwidth ceiling that kernels are measured against.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "backend/cuda/check.h"

namespace qinfer::cuda {

// Device-to-device copy bandwidth in GB/s (1e9 bytes/s), counting bytes read plus bytes written:
// the median of `iters` timed copies of `bytes` after a warm-up.
double measure_copy_bandwidth_gbs(size_t bytes = size_t{1} << 30, int iters = 20);

// Times `launch()` (which enqueues work on `stream`) between CUDA events: `warmup` untimed runs,
// then `iters` timed ones; returns the median in milliseconds.
template <typename Launch>
double median_time_ms(Launch&& launch, cudaStream_t stream = nullptr, int iters = 20, int warmup = 3) {
  for (int i = 0; i < warmup; ++i) launch();
  std::vector<cudaEvent_t> events(2 * static_cast<size_t>(std::max(iters, 1)));
  for (auto& event : events) QINFER_CUDA_CHECK(cudaEventCreate(&event));
  std::vector<float> times_ms(events.size() / 2);
  try {
    for (size_t i = 0; i < times_ms.size(); ++i) {
      QINFER_CUDA_CHECK(cudaEventRecord(events[2 * i], stream));
      launch();
      QINFER_CUDA_CHECK(cudaEventRecord(events[2 * i + 1], stream));
    }
    QINFER_CUDA_CHECK(cudaEventSynchronize(events.back()));
    for (size_t i = 0; i < times_ms.size(); ++i)
      QINFER_CUDA_CHECK(cudaEventElapsedTime(&times_ms[i], events[2 * i], events[2 * i + 1]));
  } catch (...) {
    for (auto event : events) cudaEventDestroy(event);
    throw;
  }
  for (auto event : events) cudaEventDestroy(event);
  std::sort(times_ms.begin(), times_ms.end());
  return times_ms[times_ms.size() / 2];
}

}  // namespace qinfer::cuda
