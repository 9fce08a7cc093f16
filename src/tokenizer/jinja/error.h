#pragma once
// Errors of the template engine. Each carries the template line it happened on, so a user can find
// the statement that failed; `raised` marks the template's own raise_exception() (a bad request,
// not a broken template: a server answers it with HTTP 400).
#include <fmt/format.h>

#include <string>

#include "core/error.h"

namespace qinfer::jinja {

enum class ErrorKind { syntax, undefined, type, value, security, raised, limit };

class Error : public qinfer::Error {
 public:
  Error(ErrorKind kind, std::string message, std::string source = {}, int line = 0)
      : qinfer::Error(format(source, line, message)), kind_(kind), message_(std::move(message)),
        source_(std::move(source)), line_(line) {}

  ErrorKind kind() const { return kind_; }
  // The message without the "source:line: " prefix.
  const std::string& message() const { return message_; }
  int line() const { return line_; }
  Error located(const std::string& source, int line) const { return Error(kind_, message_, source, line); }

 private:
  static std::string format(const std::string& source, int line, const std::string& message) {
    if (line <= 0) return message;
    return fmt::format("{}:{}: {}", source.empty() ? "template" : source, line, message);
  }

  ErrorKind kind_;
  std::string message_, source_;
  int line_;
};

template <typename... Args>
[[noreturn]] void raise(ErrorKind kind, fmt::format_string<Args...> format, Args&&... args) {
  throw Error(kind, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace qinfer::jinja
