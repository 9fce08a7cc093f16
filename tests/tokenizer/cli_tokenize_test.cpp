// `qinfer tokenize` on the small Qwen3.5-style tokenizer: encoding, decoding, and bad input lines.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "support/run_command.h"
#include "tokenizer_test_data.h"

namespace qinfer::tokenizer {
namespace {

using io::json;
using qinfer::testing::CommandResult;

const std::filesystem::path kMini = qinfer::testing::tokenizer_data_dir() / "qwen35_mini";

CommandResult tokenize(const std::string& args, const std::string& input) {
  const auto path =
      std::filesystem::temp_directory_path() / ("qinfer-tokenize-" + std::to_string(::getpid()) + ".in");
  std::ofstream(path, std::ios::binary) << input;
  const std::string command = std::string(QINFER_BINARY) + " tokenize " + args + " < " + path.string();
  CommandResult r = qinfer::testing::run_command(command);
  std::filesystem::remove(path);
  return r;
}

std::string lines_of(const std::vector<json>& rows, const char* key) {
  std::string out;
  for (const json& row : rows) out += row[key].dump() + "\n";
  return out;
}

class CliTokenize : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(std::filesystem::exists(QINFER_BINARY)) << QINFER_BINARY << " is missing: build the qinfer target";
  }
};

TEST_F(CliTokenize, EncodesAndDecodesLineByLine) {
  std::stringstream strings;
  strings << std::ifstream(kMini / "strings.jsonl").rdbuf();
  const auto ids = qinfer::testing::read_jsonl(kMini / "expected.jsonl");
  const auto texts = qinfer::testing::read_jsonl(kMini / "expected_hf.jsonl");

  const CommandResult encoded = tokenize("--model " + kMini.string(), strings.str());
  ASSERT_EQ(encoded.status, 0) << encoded.err;
  EXPECT_EQ(encoded.out, lines_of(ids, "ids"));

  const CommandResult decoded = tokenize("--model " + kMini.string() + " --decode", encoded.out);
  ASSERT_EQ(decoded.status, 0) << decoded.err;
  EXPECT_EQ(decoded.out, lines_of(texts, "decoded_skip_special"));
  const CommandResult kept = tokenize("--model " + kMini.string() + " --decode --special", encoded.out);
  ASSERT_EQ(kept.status, 0) << kept.err;
  EXPECT_EQ(kept.out, lines_of(texts, "decoded"));
}

TEST_F(CliTokenize, BadLinesStopWithTheLineNumber) {
  const std::string model = "--model " + kMini.string();
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      {model, "\"ok\"\nnot json\n", "stdin line 2: not valid JSON"},
      {model, "\"ok\"\n\"ok\"\n\"bad \xFF byte\"\n", "stdin line 3: not valid JSON"},  // ill-formed UTF-8
      {model, "\"\\ud800\"\n", "stdin line 1: not valid JSON"},                         // lone surrogate
      {model, "\n", "stdin line 1: not valid JSON"},
      {model, "[1, 2]\n", "stdin line 1: expected a JSON string, got array"},
      {model + " --decode", std::string(100000, '[') + "\n", "stdin line 1: nested deeper than 128 levels"},
      {model + " --decode", "[1, 2]\n[1, 99999]\n", "stdin line 2: 99999 is not a token id"},
      {model + " --decode", "[-1]\n", "stdin line 1: -1 is not a token id"},
      {model + " --decode", "\"text\"\n", "stdin line 1: expected a JSON array of token ids, got string"},
      {"--model /nonexistent", "\"x\"\n", "/nonexistent: no tokenizer.json"},
  };
  for (const auto& [args, input, message] : cases) {
    const CommandResult r = tokenize(args, input);
    EXPECT_EQ(r.status, 1) << input;
    EXPECT_NE(r.err.find(message), std::string::npos) << r.err;
  }
  EXPECT_EQ(tokenize(model, "\"ok\"\nnot json\n").out, "[78,74]\n");  // lines before the bad one were answered
}

}  // namespace
}  // namespace qinfer::tokenizer
