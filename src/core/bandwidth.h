#pragma once
// Host memory-bandwidth probe: the yardstick CPU benchmarks report their GB/s against, measured in
// the same process right before them.
#include <cstddef>

namespace qinfer {

class ThreadPool;

// Reads a `bytes`-sized buffer with every thread of the pool and returns the median read bandwidth
// over `repeats` passes, in GB/s (1e9 bytes per second).
double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes = size_t{1} << 30, int repeats = 7);

}  // namespace qinfer
