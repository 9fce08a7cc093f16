#include "core/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/thread_pool.h"

namespace qinfer {

double measure_read_bandwidth_gbs(ThreadPool& pool, size_t bytes, int repeats) {
  const size_t words = bytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buffer(new uint64_t[words]);
  // Touch every page from the threads that will read it, so first-touch placement matches the reads.
  pool.parallel_for(words, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) buffer[i] = i;
  });
  std::vector<double> rates;
  volatile uint64_t sink = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    pool.parallel_for(words, [&](size_t begin, size_t end) {
      // Four independent sums keep several loads in flight per core.
      uint64_t a = 0, b = 0, c = 0, d = 0;
      size_t i = begin;
      for (; i + 4 <= end; i += 4) {
        a += buffer[i];
        b += buffer[i + 1];
        c += buffer[i + 2];
        d += buffer[i + 3];
      }
      for (; i < end; ++i) a += buffer[i];
      sink = sink + a + b + c + d;
    });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(static_cast<double>(words * sizeof(uint64_t)) / seconds / 1e9);
  }
  std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
  return rates[rates.size() / 2];
}

}  // namespace qinfer
