#pragma once
// An error a client receives as an OpenAI-style body: {"error": {"message", "type", "param", "code"}}.
// Every refusal of the server is one of these, with a message that names the field and what is wrong.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace qinfer::server {

using json = nlohmann::ordered_json;

struct ApiError : std::runtime_error {
  ApiError(int status, std::string type, std::string code, std::string param, const std::string& message)
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        code(std::move(code)),
        param(std::move(param)) {}

  int status;
  std::string type;       // "invalid_request_error", "authentication_error", ...
  std::string code;       // "" is sent as null
  std::string param;      // "" is sent as null
  int retry_after_s = 0;  // Retry-After header when > 0 (429)

  json body() const;
};

// 400 invalid_request_error naming `param` (the field path, e.g. "messages[2].content").
template <typename... Args>
[[noreturn]] void bad_request(const std::string& param, fmt::format_string<Args...> format, Args&&... args) {
  throw ApiError(400, "invalid_request_error", "", param, fmt::format(format, std::forward<Args>(args)...));
}

// Serializes for the wire: never throws on invalid UTF-8 (replaced by U+FFFD).
std::string dump(const json& value);

}  // namespace qinfer::server
