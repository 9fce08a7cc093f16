#pragma once
// The one error type of qinfer. Messages name the thing (file, tensor, config field, request field)
// and what is wrong with it, so a user can act on them without a debugger.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace qinfer {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// Checks an invariant of the input (not of the program): throws Error with the formatted message.
#define QINFER_CHECK(cond, ...)              \
  do {                                       \
    if (!(cond)) ::qinfer::fail(__VA_ARGS__); \
  } while (0)

}  // namespace qinfer
