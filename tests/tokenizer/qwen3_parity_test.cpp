// The real Qwen3 tokenizer against reference ids from HF's tokenizers (JS port, tools/tokenizer_reference.mjs)
// on tests/tokenizer/data/strings.jsonl. HF tokenizers 0.23.2 (Rust) and transformers' Qwen2Tokenizer
// give the same ids and text for every string (tools/tokenizer_reference_hf.py, run on the GPU machine).
//
// No string may differ. PCRE2 10.42's Unicode 14 tables do not know letters added in Unicode 15 and 16
// (the file has some: CJK Ext H, Kawi, Nag Mundari, U+088F, U+0C5C, U+1C89): their splits can differ
// from HF's, yet no merge spans the differing boundary, so the ids agree.
#include <gtest/gtest.h>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_data.h"

namespace qinfer::tokenizer {
namespace {

using io::json;
using testing::qwen3_tokenizer;
using testing::read_jsonl;
using testing::tokenizer_data_dir;

struct Case {
  std::string text;
  std::vector<int32_t> ids;
  std::string decoded, decoded_skip_special;
};

std::vector<Case> load_cases() {
  const auto strings = read_jsonl(tokenizer_data_dir() / "strings.jsonl");
  const auto expected = read_jsonl(tokenizer_data_dir() / "qwen3_expected.jsonl");
  EXPECT_EQ(strings.size(), expected.size()) << "regenerate qwen3_expected.jsonl with tools/tokenizer_reference.mjs";
  std::vector<Case> cases;
  for (size_t i = 0; i < std::min(strings.size(), expected.size()); ++i)
    cases.push_back({strings[i].get<std::string>(), expected[i]["ids"].get<std::vector<int32_t>>(),
                     expected[i]["decoded"].get<std::string>(),
                     expected[i]["decoded_skip_special"].get<std::string>()});
  return cases;
}

TEST(Qwen3Parity, EncodesEveryStringLikeHf) {
  const Tokenizer* tok = qwen3_tokenizer();
  ASSERT_NE(tok, nullptr);
  const auto cases = load_cases();
  ASSERT_GE(cases.size(), 300u);
  int mismatches = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    const auto ids = tok->encode(cases[i].text);
    if (ids == cases[i].ids) continue;
    ++mismatches;
    ADD_FAILURE() << "line " << i + 1 << " " << json(cases[i].text).dump() << "\n  qinfer: " << json(ids).dump()
                  << "\n  HF:     " << json(cases[i].ids).dump();
  }
  EXPECT_EQ(mismatches, 0);
}

// Decoding the reference ids, decode(encode(s)) (which gives back the NFC form of s, as HF's decode of
// its own ids shows), and streaming the reference ids one by one. One test, one load of the tokenizer.
TEST(Qwen3Parity, DecodesAndStreamsLikeHf) {
  const Tokenizer* tok = qwen3_tokenizer();
  ASSERT_NE(tok, nullptr);
  int strings_with_split_characters = 0;
  for (const Case& c : load_cases()) {
    EXPECT_EQ(tok->decode(c.ids), c.decoded) << json(c.text).dump();
    EXPECT_EQ(tok->decode(c.ids, /*skip_special_tokens=*/true), c.decoded_skip_special) << json(c.text).dump();
    EXPECT_EQ(tok->decode(tok->encode(c.text)), c.decoded) << json(c.text).dump();

    StreamDecoder stream(*tok);
    std::string joined;
    bool split = false;
    for (int32_t id : c.ids) {
      const std::string chunk = stream.push(id);
      EXPECT_TRUE(is_valid_utf8(chunk)) << json(c.text).dump();
      split |= !is_valid_utf8(tok->token_bytes(id));
      joined += chunk;
    }
    joined += stream.finish();
    EXPECT_EQ(joined, c.decoded) << json(c.text).dump();
    strings_with_split_characters += split;
  }
  EXPECT_GE(strings_with_split_characters, 50);  // emoji, CJK, astral letters: tokens ending mid-character
}

TEST(Qwen3, SpecialTokensAndConfig) {
  const Tokenizer* tok = qwen3_tokenizer();
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->vocab_size(), 151669);
  const std::vector<std::pair<std::string, int32_t>> ids = {
      {"<|endoftext|>", 151643}, {"<|im_start|>", 151644}, {"<|im_end|>", 151645}, {"<|vision_pad|>", 151654},
      {"<tool_call>", 151657},   {"</tool_call>", 151658},  {"<think>", 151667},   {"</think>", 151668}};
  for (const auto& [content, id] : ids) EXPECT_EQ(tok->token_to_id(content), id) << content;
  EXPECT_TRUE(tok->is_special(151645));
  EXPECT_FALSE(tok->is_special(151667));  // <think> is an added token but not special: decode keeps it
  EXPECT_EQ(tok->token_to_id("Ġthe"), 279);
  EXPECT_EQ(tok->encode("Hello world"), (std::vector<int32_t>{9707, 1879}));
  EXPECT_EQ(tok->encode("Hello world", /*add_special_tokens=*/false), tok->encode("Hello world"));  // no BOS
  const TokenizerConfig& config = tok->config();
  EXPECT_EQ(config.eos_token, "<|im_end|>");
  EXPECT_EQ(config.pad_token, "<|endoftext|>");
  EXPECT_EQ(config.bos_token, "");
  EXPECT_NE(config.chat_template.find("<|im_start|>"), std::string::npos);
}

}  // namespace
}  // namespace qinfer::tokenizer
