// A small hand-made Qwen3.5-style tokenizer (tests/tokenizer/data/qwen35_mini, written by
// tools/make_tokenizer_test_data.py): its split regex adds \p{M}, its merges use the legacy "a b" form,
// and it has lstrip/rstrip and normalized added tokens. Reference ids: @huggingface/tokenizers
// (expected.jsonl); reference text: HF tokenizers 0.23.2 in Rust (expected_hf.jsonl), whose ByteLevel
// decoder maps the added token "café" through the byte alphabet where the JS port copies it.
#include <gtest/gtest.h>

#include "tokenizer/split_regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer_test_data.h"

namespace qinfer::tokenizer {
namespace {

using io::json;
using testing::read_jsonl;
using testing::tokenizer_data_dir;

std::filesystem::path mini_dir() { return tokenizer_data_dir() / "qwen35_mini"; }

json mini_json() { return io::read_json_file(mini_dir() / "tokenizer.json"); }

const char* kQwen3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

TEST(Qwen35Mini, MatchesHfOnEveryString) {
  const Tokenizer tok = Tokenizer::load(mini_dir());
  const auto strings = read_jsonl(mini_dir() / "strings.jsonl");
  const auto expected_ids = read_jsonl(mini_dir() / "expected.jsonl");
  const auto expected_text = read_jsonl(mini_dir() / "expected_hf.jsonl");
  ASSERT_EQ(strings.size(), expected_ids.size());
  ASSERT_EQ(strings.size(), expected_text.size());
  ASSERT_GE(strings.size(), 36u);
  for (size_t i = 0; i < strings.size(); ++i) {
    const std::string text = strings[i].get<std::string>();
    const auto ids = expected_ids[i]["ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok.encode(text), ids) << "line " << i + 1 << " " << json(text).dump();
    EXPECT_EQ(expected_text[i]["ids"].get<std::vector<int32_t>>(), ids) << "the two references disagree";
    EXPECT_EQ(tok.decode(ids), expected_text[i]["decoded"].get<std::string>()) << json(text).dump();
    EXPECT_EQ(tok.decode(ids, true), expected_text[i]["decoded_skip_special"].get<std::string>()) << json(text).dump();
  }
}

// The split regex comes from tokenizer.json: the same file with Qwen3's regex (no \p{M}) splits
// letters from their combining marks, and gives other ids.
TEST(Qwen35Mini, SplitRegexIsReadFromTheFile) {
  json file = mini_json();
  const std::string pattern = file["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"].get<std::string>();
  EXPECT_NE(pattern.find("\\p{M}"), std::string::npos);

  const std::string text = "नमस्ते दुनिया";
  std::vector<std::string_view> qwen35, qwen3;
  SplitRegex(pattern, "qwen3.5").split(text, qwen35);
  SplitRegex(kQwen3Pattern, "qwen3").split(text, qwen3);
  EXPECT_EQ(qwen35, (std::vector<std::string_view>{"नमस्ते", " दुनिया"}));
  EXPECT_EQ(qwen3, (std::vector<std::string_view>{"नमस", "्त", "े", " द", "ुन", "िय", "ा"}));

  const Tokenizer with_marks = Tokenizer::from_json(file, "qwen35_mini");
  file["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = kQwen3Pattern;
  const Tokenizer without_marks = Tokenizer::from_json(file, "qwen35_mini with the Qwen3 regex");
  for (const char* s : {"नमस्ते", "क्षत्रिय", "עִבְרִית"})
    EXPECT_NE(with_marks.encode(s), without_marks.encode(s)) << s;
  EXPECT_EQ(with_marks.encode("hello world"), without_marks.encode("hello world"));
}

}  // namespace
}  // namespace qinfer::tokenizer
