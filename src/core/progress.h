#pragma once
// A one-line progress bar on stderr for long work (loading, quantizing). It draws only when stderr
// is a terminal and QINFER_PROGRESS is not "0", so logs and pipes stay clean.
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>

namespace qinfer {

// "512 B", "1.5 KiB", "12.3 MiB", "2.0 GiB", ... (binary units, one decimal).
std::string format_bytes(uint64_t bytes);

class ProgressBar {
 public:
  enum class Unit { bytes, items };

  ProgressBar(std::string label, uint64_t total, Unit unit);
  // Draws on `sink` iff `interactive`; for tests and callers that decide for themselves.
  ProgressBar(std::string label, uint64_t total, Unit unit, std::FILE* sink, bool interactive);
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  // Thread-safe. Redraws at most ~10 times a second; a drawing thread never blocks other callers.
  void advance(uint64_t n = 1);
  // Draws the final line and ends it with a newline; later calls do nothing.
  void finish();

  // The line shown after `done` units in `elapsed_s` seconds, without "\r" or newline, e.g.
  // "loading  42% [########            ] 1.2 GiB/2.9 GiB 850.3 MiB/s ETA 0:02".
  std::string render(uint64_t done, double elapsed_s, bool finished = false) const;

 private:
  void draw(bool finished);

  std::string label_;
  uint64_t total_;
  Unit unit_;
  std::FILE* sink_;
  bool interactive_;
  std::chrono::steady_clock::time_point start_;
  std::atomic<uint64_t> done_{0};
  std::atomic<int64_t> next_draw_ns_{0};  // since start_
  std::mutex draw_mutex_;
  bool finished_ = false;
};

}  // namespace qinfer
