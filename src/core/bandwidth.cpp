#include "core/bandwidth.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "core/thread_pool.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace qinfer {
namespace {

// Sums words [begin, end): 256-bit loads where the CPU has AVX2, so the probe is limited by memory,
// not by load throughput (a scalar loop reads noticeably less than a vectorized kernel can).
#if defined(__x86_64__)
__attribute__((target("avx2"))) uint64_t sum_avx2(const uint64_t* p, size_t begin, size_t end) {
  __m256i a = _mm256_setzero_si256(), b = a, c = a, d = a;
  size_t i = begin;
  for (; i + 16 <= end; i += 16) {
    a = _mm256_add_epi64(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    b = _mm256_add_epi64(b, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
    c = _mm256_add_epi64(c, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 8)));
    d = _mm256_add_epi64(d, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 12)));
  }
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), _mm256_add_epi64(_mm256_add_epi64(a, b), _mm256_add_epi64(c, d)));
  uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < end; ++i) sum += p[i];
  return sum;
}
#endif

uint64_t sum_words(const uint64_t* p, size_t begin, size_t end) {
#if defined(__x86_64__)
  if (__builtin_cpu_supports("avx2")) return sum_avx2(p, begin, end);
#endif
  uint64_t a = 0, b = 0, c = 0, d = 0;
  size_t i = begin;
  for (; i + 4 <= end; i += 4) {
    a += p[i];
    b += p[i + 1];
    c += p[i + 2];
    d += p[i + 3];
  }
  for (; i < end; ++i) a += p[i];
  return a + b + c + d;
}

}  // namespace

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
    pool.parallel_for(words, [&](size_t begin, size_t end) { sink = sink + sum_words(buffer.get(), begin, end); });
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    rates.push_back(static_cast<double>(words * sizeof(uint64_t)) / seconds / 1e9);
  }
  std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
  return rates[rates.size() / 2];
}

}  // namespace qinfer
