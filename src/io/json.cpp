#include "io/json.h"

#include <cmath>
#include <cstdint>

#include "core/error.h"
#include "io/file.h"

namespace qinfer::io {
namespace {

std::string describe(const json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text;
}

}  // namespace

std::optional<std::string> json_too_deep(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false, expect_key = false, capturing = false;
  std::string key;
  for (const char c : text) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = capturing = false;
        continue;
      }
      if (capturing && key.size() < 256) key += c;
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        capturing = depth == 1 && expect_key;
        if (capturing) key.clear();
        break;
      case '{':
      case '[':
        if (++depth > max_depth) return depth == 1 ? std::string() : key;
        if (depth == 1) expect_key = c == '{';
        break;
      case '}':
      case ']':
        --depth;
        break;
      case ',':
        if (depth == 1) expect_key = true;
        break;
      case ':':
        if (depth == 1) expect_key = false;
        break;
      default:
        break;
    }
  }
  return std::nullopt;
}

json read_json_file(const std::filesystem::path& path) {
  const std::string text = read_model_file(path);
  if (const auto key = json_too_deep(text))
    fail("{}: {}nested deeper than {} levels", path.string(), key->empty() ? "" : *key + ": ", kMaxJsonDepth);
  try {
    return json::parse(text);
  } catch (const json::parse_error& e) {
    fail("{}: malformed JSON at byte {}: {}", path.string(), e.byte, e.what());
  } catch (const json::exception& e) {  // a number too large for a double (1e999)
    fail("{}: malformed JSON: {}", path.string(), e.what());
  }
}

JsonObject::JsonObject(const json& object, std::string label, std::string path)
    : object_(&object), label_(std::move(label)), path_(std::move(path)) {
  QINFER_CHECK(object.is_object(), "{}: {}expected a JSON object, got {}", label_,
               path_.empty() ? "" : path_ + ": ", describe(object));
}

bool JsonObject::has(std::string_view key) const {
  auto it = object_->find(key);
  return it != object_->end() && !it->is_null();
}

std::string JsonObject::where(std::string_view key) const {
  return path_.empty() ? fmt::format("{}: {}", label_, key) : fmt::format("{}: {}.{}", label_, path_, key);
}

std::optional<int64_t> JsonObject::int_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const json& v = object_->at(std::string(key));
  if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
    fail("{}: {} is out of the range of a 64-bit integer", where(key), describe(v));
  if (v.is_number_integer()) return v.get<int64_t>();
  // Some writers emit integral floats ("4.0"); accept them only when exact and in range (casting
  // one outside int64 is undefined).
  if (v.is_number_float()) {
    const double d = v.get<double>();
    if (std::isfinite(d) && std::trunc(d) == d && std::abs(d) < 0x1p63) return static_cast<int64_t>(d);
  }
  fail("{}: expected an integer, got {}", where(key), describe(v));
}

std::optional<double> JsonObject::number_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const json& v = object_->at(std::string(key));
  QINFER_CHECK(v.is_number(), "{}: expected a number, got {}", where(key), describe(v));
  // A literal like 1e999 parses to infinity.
  QINFER_CHECK(std::isfinite(v.get<double>()), "{}: expected a finite number, got {}", where(key), describe(v));
  return v.get<double>();
}

std::optional<bool> JsonObject::bool_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const json& v = object_->at(std::string(key));
  QINFER_CHECK(v.is_boolean(), "{}: expected true or false, got {}", where(key), describe(v));
  return v.get<bool>();
}

std::optional<std::string> JsonObject::string_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const json& v = object_->at(std::string(key));
  QINFER_CHECK(v.is_string(), "{}: expected a string, got {}", where(key), describe(v));
  return v.get<std::string>();
}

std::optional<std::vector<int64_t>> JsonObject::ints_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const json& v = object_->at(std::string(key));
  QINFER_CHECK(v.is_array(), "{}: expected an array of integers, got {}", where(key), describe(v));
  std::vector<int64_t> out;
  for (const json& item : v) {
    QINFER_CHECK(item.is_number_integer() &&
                     !(item.is_number_unsigned() && item.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)),
                 "{}: expected an array of integers, got element {}", where(key), describe(item));
    out.push_back(item.get<int64_t>());
  }
  return out;
}

std::optional<std::vector<std::string>> JsonObject::strings_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const json& v = object_->at(std::string(key));
  QINFER_CHECK(v.is_array(), "{}: expected an array of strings, got {}", where(key), describe(v));
  std::vector<std::string> out;
  for (const json& item : v) {
    QINFER_CHECK(item.is_string(), "{}: expected an array of strings, got element {}", where(key), describe(item));
    out.push_back(item.get<std::string>());
  }
  return out;
}

std::optional<JsonObject> JsonObject::object_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  const json& v = object_->at(std::string(key));
  QINFER_CHECK(v.is_object(), "{}: expected an object, got {}", where(key), describe(v));
  return JsonObject(v, label_, path_.empty() ? std::string(key) : path_ + "." + std::string(key));
}

}  // namespace qinfer::io
