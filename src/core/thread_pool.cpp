#include "core/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <exception>
#include <string>

#include "core/log.h"

namespace qinfer {
namespace {

// True on pool workers and on a caller while it runs chunks: nested parallel_for runs inline there.
thread_local bool t_in_parallel_for = false;

size_t hardware_threads() { return std::max(1u, std::thread::hardware_concurrency()); }

}  // namespace

struct ThreadPool::Job {
  Job(const std::function<void(size_t, size_t)>& body, size_t n, size_t chunks) : body(&body), n(n), chunks(chunks) {}
  const std::function<void(size_t, size_t)>* body;
  size_t n, chunks;
  std::atomic<size_t> next_chunk{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::exception_ptr error;
};

ThreadPool::ThreadPool(size_t threads) {
  if (threads == 0) threads = hardware_threads();
  workers_.reserve(threads - 1);
  for (size_t i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::run_chunks(Job& job) {
  for (size_t chunk; !job.failed.load() && (chunk = job.next_chunk.fetch_add(1)) < job.chunks;) {
    // Even split: the first n % chunks chunks get one extra element.
    size_t base = job.n / job.chunks, extra = job.n % job.chunks;
    size_t begin = chunk * base + std::min(chunk, extra);
    size_t end = begin + base + (chunk < extra ? 1 : 0);
    try {
      (*job.body)(begin, end);
    } catch (...) {
      std::lock_guard lock(job.error_mutex);
      if (!job.error) job.error = std::current_exception();
      job.failed = true;
    }
  }
}

namespace {

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// How long an idle worker spins before it sleeps: longer than the gap between two ops of a decode
// step, short enough that an idle process stops using the CPU at once.
constexpr auto kSpin = std::chrono::microseconds(100);

}  // namespace

void ThreadPool::worker_loop() {
  t_in_parallel_for = true;
  size_t seen = 0;  // the generation at construction: a job submitted before this thread ran is still seen
  while (true) {
    size_t now = generation_.load();
    const auto deadline = std::chrono::steady_clock::now() + kSpin;
    for (int i = 0; now == seen && !stop_.load(std::memory_order_relaxed); ++i) {
      cpu_relax();
      now = generation_.load();
      if ((i & 63) == 63 && std::chrono::steady_clock::now() > deadline) break;
    }
    if (now == seen) {
      std::unique_lock lock(mutex_);
      ++sleepers_;  // before the predicate reads generation_: a submitter either sees us or we see it
      wake_.wait(lock, [&] { return stop_.load() || generation_.load() != seen; });
      --sleepers_;
      now = generation_.load();
    }
    if (stop_.load()) return;
    seen = now;
    // Registered as busy before reading job_: the submitter clears job_ and then waits for busy == 0,
    // so a job read here is still alive until this worker leaves it.
    ++busy_workers_;
    if (Job* job = job_.load()) run_chunks(*job);
    --busy_workers_;
  }
}

void ThreadPool::parallel_for(size_t n, const std::function<void(size_t, size_t)>& body) {
  if (n == 0) return;
  if (t_in_parallel_for || workers_.empty() || n == 1) return body(0, n);

  std::lock_guard submit(submit_mutex_);
  Job job(body, n, std::min(n, size()));
  job_ = &job;
  ++generation_;
  if (sleepers_.load() > 0) {
    std::lock_guard lock(mutex_);
    wake_.notify_all();
  }

  t_in_parallel_for = true;
  run_chunks(job);
  t_in_parallel_for = false;
  // Every chunk is claimed once the caller's loop ends; unpublish the job, then wait for workers
  // still inside it (they finish their last chunk).
  job_ = nullptr;
  for (int i = 0; busy_workers_.load() != 0; ++i) {
    if (i < 4096) cpu_relax();
    else std::this_thread::yield();
  }
  if (job.error) std::rethrow_exception(job.error);
}

ThreadPool& global_thread_pool() {
  static ThreadPool pool([] {
    const char* env = std::getenv("QINFER_THREADS");
    if (env == nullptr || *env == '\0') return hardware_threads();
    char* end = nullptr;
    unsigned long threads = std::strtoul(env, &end, 10);
    if (*end != '\0' || threads == 0 || threads > 4096) {
      log_warn("ignoring QINFER_THREADS={} (expected a thread count from 1 to 4096)", env);
      return hardware_threads();
    }
    return static_cast<size_t>(threads);
  }());
  return pool;
}

}  // namespace qinfer
