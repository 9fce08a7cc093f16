#pragma once
// Typed, path-aware reads from JSON documents. Every error names the document and the field path
// ("config.json: text_config.hidden_size: expected an integer, got \"abc\"").
#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace qinfer::io {

using json = nlohmann::json;

// Arrays and objects nested deeper than this are refused before parsing: nlohmann's copy, dump and
// comparison recurse once per level, and a value 100,000 deep overflows the stack.
inline constexpr int kMaxJsonDepth = 128;

// Where `text` nests deeper than `max_depth` (a top-level object's members are at depth 1): the key
// of the top-level member it happens under ("" outside one); nullopt when it does not. A linear scan
// that needs no valid JSON: run it before parsing.
std::optional<std::string> json_too_deep(std::string_view text, int max_depth = kMaxJsonDepth);

// Parses a whole JSON file of a model folder (read_model_file: a regular file of bounded size);
// errors name the file and the parse position (or the depth).
json read_json_file(const std::filesystem::path& path);

// A view of one JSON object at a path inside a named document.
class JsonObject {
 public:
  JsonObject(const json& object, std::string label, std::string path = "");
  const json& raw() const { return *object_; }
  bool has(std::string_view key) const;  // present and not null
  std::string where(std::string_view key) const;  // "label: path.key"

  std::optional<int64_t> int_opt(std::string_view key) const;
  std::optional<double> number_opt(std::string_view key) const;
  std::optional<bool> bool_opt(std::string_view key) const;
  std::optional<std::string> string_opt(std::string_view key) const;
  std::optional<std::vector<int64_t>> ints_opt(std::string_view key) const;
  std::optional<std::vector<std::string>> strings_opt(std::string_view key) const;
  std::optional<JsonObject> object_opt(std::string_view key) const;

  int64_t int_or(std::string_view key, int64_t fallback) const { return int_opt(key).value_or(fallback); }
  double number_or(std::string_view key, double fallback) const { return number_opt(key).value_or(fallback); }
  bool bool_or(std::string_view key, bool fallback) const { return bool_opt(key).value_or(fallback); }

 private:
  const json* object_;
  std::string label_;
  std::string path_;
};

}  // namespace qinfer::io
