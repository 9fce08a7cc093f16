#pragma once
// Shared by the jinja tests: where the test data lives and how to read it.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace qinfer::testing {

inline std::filesystem::path jinja_data_dir() {
  return std::filesystem::path(QINFER_TEST_DATA).parent_path() / "jinja" / "data";
}

inline std::string read_file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// Null when the file is missing or broken: test parameter lists are built at discovery time,
// where an exception would take down the whole binary instead of failing one test.
inline nlohmann::ordered_json read_ordered_json(const std::filesystem::path& path) {
  return nlohmann::ordered_json::parse(read_file_bytes(path), nullptr, false);
}

}  // namespace qinfer::testing
