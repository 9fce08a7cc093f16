#pragma once
// Levelled logging to stderr. The level comes from QINFER_LOG (trace|debug|info|warn|error|off)
// or from set_log_level(); messages below it cost one comparison.
#include <fmt/format.h>

#include <string_view>

namespace qinfer {

enum class LogLevel { trace, debug, info, warn, error, off };

LogLevel log_level();
void set_log_level(LogLevel level);
// Parses a level name; throws Error naming the bad value.
LogLevel parse_log_level(std::string_view name);
void log_write(LogLevel level, std::string_view message);

template <typename... Args>
void log(LogLevel level, fmt::format_string<Args...> format, Args&&... args) {
  if (level < log_level()) return;
  log_write(level, fmt::format(format, std::forward<Args>(args)...));
}

#define QINFER_LOG_FN(name)                                           \
  template <typename... Args>                                         \
  void log_##name(fmt::format_string<Args...> format, Args&&... args) { \
    log(LogLevel::name, format, std::forward<Args>(args)...);         \
  }
QINFER_LOG_FN(trace)
QINFER_LOG_FN(debug)
QINFER_LOG_FN(info)
QINFER_LOG_FN(warn)
QINFER_LOG_FN(error)
#undef QINFER_LOG_FN

}  // namespace qinfer
