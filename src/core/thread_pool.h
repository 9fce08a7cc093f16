#pragma once
// A fixed pool of worker threads for data-parallel loops on the CPU (loading, quantizing, CPU ops).
// A decode step is hundreds of short parallel loops, so idle workers spin briefly before sleeping:
// waking a sleeping thread costs microseconds per loop, more than a small loop itself.
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace qinfer {

class ThreadPool {
 public:
  // `threads` counts the calling thread, so ThreadPool(1) starts no workers. 0 means hardware threads.
  explicit ThreadPool(size_t threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Calls body(begin, end) over contiguous chunks covering [0, n), at most one chunk per thread; the
  // caller runs chunks too. Returns when all chunks are done, rethrowing the first exception (chunks
  // not yet started when it was thrown are skipped). A call from inside a body runs inline, serially.
  void parallel_for(size_t n, const std::function<void(size_t begin, size_t end)>& body);
  size_t size() const { return workers_.size() + 1; }

 private:
  struct Job;
  void worker_loop();
  static void run_chunks(Job& job);

  std::mutex submit_mutex_;  // one job at a time when several outside threads submit
  std::mutex mutex_;         // guards sleeping on wake_
  std::condition_variable wake_;
  std::atomic<Job*> job_{nullptr};
  std::atomic<size_t> generation_{0};  // bumped per job so a worker never misses or repeats one
  std::atomic<size_t> busy_workers_{0};  // workers that may hold job_; the job outlives them
  std::atomic<size_t> sleepers_{0};
  std::atomic<bool> stop_{false};
  std::vector<std::thread> workers_;
};

// The process-wide pool: QINFER_THREADS threads if set, else the hardware thread count.
ThreadPool& global_thread_pool();

}  // namespace qinfer
