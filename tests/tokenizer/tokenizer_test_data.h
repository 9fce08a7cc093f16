#pragma once
// Where the tokenizer tests find their data: committed inputs and reference ids under
// tests/tokenizer/data/, and the real Qwen3 tokenizer fetched by scripts/fetch-test-data.sh.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "io/json.h"
#include "tokenizer/tokenizer.h"

namespace qinfer::testing {

inline std::filesystem::path tokenizer_data_dir() {
  return std::filesystem::path(QINFER_TEST_DATA).parent_path() / "tokenizer" / "data";
}

// .deps/qwen3-tokenizer at the repository root, or $QINFER_QWEN3_TOKENIZER.
inline std::filesystem::path qwen3_tokenizer_dir() {
  if (const char* dir = std::getenv("QINFER_QWEN3_TOKENIZER")) return dir;
  return std::filesystem::path(QINFER_TEST_DATA).parent_path().parent_path() / ".deps" / "qwen3-tokenizer";
}

// The real Qwen3 tokenizer, loaded once per process; records a failure (never a skip) when the data
// has not been fetched.
inline const tokenizer::Tokenizer* qwen3_tokenizer() {
  static std::unique_ptr<tokenizer::Tokenizer> loaded;
  if (!loaded) {
    const auto dir = qwen3_tokenizer_dir();
    if (!std::filesystem::exists(dir / "tokenizer.json")) {
      ADD_FAILURE() << "the Qwen3 tokenizer is missing at " << dir.string()
                    << "; run scripts/fetch-test-data.sh (or set QINFER_QWEN3_TOKENIZER)";
      return nullptr;
    }
    loaded = std::make_unique<tokenizer::Tokenizer>(tokenizer::Tokenizer::load(dir));
  }
  return loaded.get();
}

// One JSON value per non-empty line.
inline std::vector<io::json> read_jsonl(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path.string();
  std::vector<io::json> out;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(io::json::parse(line));
  return out;
}

}  // namespace qinfer::testing
