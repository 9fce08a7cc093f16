#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "core/error.h"

namespace qinfer {
namespace {

constexpr std::string_view kNames[] = {"trace", "debug", "info", "warn", "error", "off"};

LogLevel initial_level() {
  const char* env = std::getenv("QINFER_LOG");
  if (env == nullptr || *env == '\0') return LogLevel::info;
  try {
    return parse_log_level(env);
  } catch (const Error&) {
    std::fprintf(stderr, "qinfer: ignoring QINFER_LOG=%s (expected trace|debug|info|warn|error|off)\n", env);
    return LogLevel::info;
  }
}

std::atomic<LogLevel>& level_ref() {
  static std::atomic<LogLevel> level{initial_level()};
  return level;
}

}  // namespace

LogLevel log_level() { return level_ref().load(std::memory_order_relaxed); }
void set_log_level(LogLevel level) { level_ref().store(level, std::memory_order_relaxed); }

LogLevel parse_log_level(std::string_view name) {
  for (size_t i = 0; i < std::size(kNames); ++i)
    if (kNames[i] == name) return static_cast<LogLevel>(i);
  fail("unknown log level '{}' (expected trace|debug|info|warn|error|off)", name);
}

void log_write(LogLevel level, std::string_view message) {
  // One lock so lines from worker threads never interleave.
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  fmt::print(stderr, "[{}] {}\n", kNames[static_cast<int>(level)], message);
}

}  // namespace qinfer
