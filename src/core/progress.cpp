#include "core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <utility>

namespace qinfer {
namespace {

constexpr int64_t kRedrawIntervalNs = 100'000'000;
constexpr int kBarWidth = 20;

bool stderr_is_interactive() {
  const char* env = std::getenv("QINFER_PROGRESS");
  if (env != nullptr && std::strcmp(env, "0") == 0) return false;
  return isatty(fileno(stderr)) == 1;
}

std::string format_duration(double seconds) {
  auto s = static_cast<uint64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  return fmt::format("{}:{:02}", s / 60, s % 60);
}

}  // namespace

std::string format_bytes(uint64_t bytes) {
  if (bytes < 1024) return fmt::format("{} B", bytes);
  constexpr const char* kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes) / 1024;
  size_t unit = 0;
  // Move up before the value would print as "1024.0".
  while (value >= 1023.95 && unit + 1 < std::size(kUnits)) {
    value /= 1024;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

ProgressBar::ProgressBar(std::string label, uint64_t total, Unit unit)
    : ProgressBar(std::move(label), total, unit, stderr, stderr_is_interactive()) {}

ProgressBar::ProgressBar(std::string label, uint64_t total, Unit unit, std::FILE* sink, bool interactive)
    : label_(std::move(label)),
      total_(total),
      unit_(unit),
      sink_(sink),
      interactive_(interactive),
      start_(std::chrono::steady_clock::now()),
      next_draw_ns_(kRedrawIntervalNs) {}

ProgressBar::~ProgressBar() { finish(); }

void ProgressBar::advance(uint64_t n) {
  done_.fetch_add(n, std::memory_order_relaxed);
  if (!interactive_) return;
  int64_t now_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start_).count();
  int64_t due = next_draw_ns_.load(std::memory_order_relaxed);
  // Exactly one thread wins the slot; the others go back to work instead of waiting on the sink.
  if (now_ns < due || !next_draw_ns_.compare_exchange_strong(due, now_ns + kRedrawIntervalNs)) return;
  std::unique_lock lock(draw_mutex_, std::try_to_lock);
  if (lock.owns_lock() && !finished_) draw(false);
}

void ProgressBar::finish() {
  std::lock_guard lock(draw_mutex_);
  if (finished_) return;
  finished_ = true;
  if (interactive_) draw(true);
}

void ProgressBar::draw(bool finished) {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string line = render(done_.load(std::memory_order_relaxed), elapsed, finished);
  // "\x1b[K" clears what a longer previous line left behind.
  fmt::print(sink_, "\r{}\x1b[K{}", line, finished ? "\n" : "");
  std::fflush(sink_);
}

std::string ProgressBar::render(uint64_t done, double elapsed_s, bool finished) const {
  double fraction = total_ == 0 ? 1.0 : std::min(1.0, static_cast<double>(done) / static_cast<double>(total_));
  int filled = static_cast<int>(fraction * kBarWidth);
  double rate = elapsed_s > 0 ? static_cast<double>(done) / elapsed_s : 0.0;
  bool bytes = unit_ == Unit::bytes;
  std::string amounts = bytes ? fmt::format("{}/{}", format_bytes(done), format_bytes(total_))
                              : fmt::format("{}/{}", done, total_);
  std::string speed = bytes ? format_bytes(static_cast<uint64_t>(rate)) + "/s" : fmt::format("{:.1f} it/s", rate);
  std::string timing;
  if (finished) timing = "in " + format_duration(elapsed_s);
  else if (rate > 0 && done <= total_) timing = "ETA " + format_duration(static_cast<double>(total_ - done) / rate);
  else timing = "ETA --:--";
  return fmt::format("{} {:3}% [{}{}] {} {} {}", label_, static_cast<int>(fraction * 100), std::string(filled, '#'),
                     std::string(kBarWidth - filled, ' '), amounts, speed, timing);
}

}  // namespace qinfer
