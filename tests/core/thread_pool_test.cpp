#include "core/thread_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace qinfer {
namespace {

// Covers [0, n) exactly once: every index is summed and counted.
void expect_covers(ThreadPool& pool, size_t n) {
  std::vector<std::atomic<int>> hits(n);
  std::atomic<uint64_t> sum{0};
  pool.parallel_for(n, [&](size_t begin, size_t end) {
    ASSERT_LT(begin, end);
    for (size_t i = begin; i < end; ++i) {
      hits[i]++;
      sum += i;
    }
  });
  for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i << " of " << n;
  EXPECT_EQ(sum.load(), n == 0 ? 0 : uint64_t{n} * (n - 1) / 2);
}

TEST(ThreadPool, CoversEveryIndexOnce) {
  ThreadPool pool(4);
  EXPECT_EQ(pool.size(), 4u);
  for (size_t n : {0, 1, 2, 3, 4, 5, 7, 100, 12345}) expect_covers(pool, n);
}

TEST(ThreadPool, SingleThreadPoolRunsInline) {
  ThreadPool pool(1);
  EXPECT_EQ(pool.size(), 1u);
  auto caller = std::this_thread::get_id();
  pool.parallel_for(10, [&](size_t begin, size_t end) {
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(begin, 0u);
    EXPECT_EQ(end, 10u);
  });
}

TEST(ThreadPool, UsesWorkersAndCaller) {
  ThreadPool pool(3);
  std::mutex mutex;
  std::set<std::thread::id> ids;
  std::atomic<int> arrived{0};
  pool.parallel_for(3, [&](size_t, size_t) {
    {
      std::lock_guard lock(mutex);
      ids.insert(std::this_thread::get_id());
    }
    // Each chunk waits for the others, so the three chunks must run on three threads at once.
    arrived++;
    while (arrived.load() < 3) std::this_thread::yield();
  });
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_TRUE(ids.count(std::this_thread::get_id()));
}

TEST(ThreadPool, RethrowsFirstExceptionAfterAllChunks) {
  ThreadPool pool(4);
  std::atomic<int> running{0};
  EXPECT_THROW(pool.parallel_for(8,
                                 [&](size_t begin, size_t) {
                                   running++;
                                   if (begin == 0) throw std::runtime_error("chunk 0 failed");
                                   std::this_thread::sleep_for(std::chrono::milliseconds(5));
                                   running--;
                                 }),
               std::runtime_error);
  EXPECT_EQ(running.load(), 1);  // only the failing chunk never decremented: none still running
  expect_covers(pool, 1000);     // the pool still works afterwards
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(4);
  std::atomic<uint64_t> total{0};
  pool.parallel_for(8, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i)
      pool.parallel_for(100, [&](size_t b, size_t e) { total += e - b; });
  });
  EXPECT_EQ(total.load(), 800u);
}

TEST(ThreadPool, ManySmallCallsLoseNoWakeups) {
  ThreadPool pool(3);
  uint64_t total = 0;
  for (int iteration = 0; iteration < 10'000; ++iteration) {
    std::atomic<uint64_t> sum{0};
    pool.parallel_for(iteration % 7, [&](size_t begin, size_t end) {
      for (size_t i = begin; i < end; ++i) sum += i + 1;
    });
    total += sum;
  }
  uint64_t expected = 0;
  for (int iteration = 0; iteration < 10'000; ++iteration) expected += uint64_t(iteration % 7) * (iteration % 7 + 1) / 2;
  EXPECT_EQ(total, expected);
}

TEST(ThreadPool, ConcurrentSubmittersFromOutside) {
  ThreadPool pool(3);
  std::atomic<uint64_t> total{0};
  std::vector<std::thread> submitters;
  for (int t = 0; t < 3; ++t)
    submitters.emplace_back([&] {
      for (int i = 0; i < 300; ++i) pool.parallel_for(10, [&](size_t b, size_t e) { total += e - b; });
    });
  for (auto& s : submitters) s.join();
  EXPECT_EQ(total.load(), 3u * 300 * 10);
}

TEST(ThreadPool, GlobalPoolIsUsable) {
  ThreadPool& pool = global_thread_pool();
  EXPECT_GE(pool.size(), 1u);
  EXPECT_EQ(&pool, &global_thread_pool());
  expect_covers(pool, 1000);
}

}  // namespace
}  // namespace qinfer
