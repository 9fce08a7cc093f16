// Loading rules, added-token rules (HF tokenizers' AddedVocabulary semantics), post-processing and
// errors, on variations of the small Qwen3.5-style tokenizer in tests/tokenizer/data/qwen35_mini.
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "core/error.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/split_regex.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_data.h"

namespace qinfer::tokenizer {
namespace {

using io::json;
using Ids = std::vector<int32_t>;

json mini_json() { return io::read_json_file(testing::tokenizer_data_dir() / "qwen35_mini" / "tokenizer.json"); }

Ids cat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const Ids& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

// The mini tokenizer with its added tokens replaced by one token, id 700, with these flags.
Tokenizer with_token(const std::string& content, json flags) {
  json file = mini_json();
  json token = {{"id", 700}, {"content", content}, {"special", true}, {"normalized", false}};
  token.update(flags);
  file["added_tokens"] = json::array({token});
  return Tokenizer::from_json(file, "test tokenizer.json");
}

TEST(TokenizerRules, MergesInPairFormEncodeLikeStringForm) {
  json file = mini_json();
  const Tokenizer strings = Tokenizer::from_json(file, "string merges");
  for (json& m : file["model"]["merges"]) {
    const std::string s = m.get<std::string>();
    m = json::array({s.substr(0, s.find(' ')), s.substr(s.find(' ') + 1)});
  }
  const Tokenizer pairs = Tokenizer::from_json(file, "pair merges");
  for (const json& line : testing::read_jsonl(testing::tokenizer_data_dir() / "qwen35_mini" / "strings.jsonl"))
    EXPECT_EQ(pairs.encode(line.get<std::string>()), strings.encode(line.get<std::string>()));
  EXPECT_EQ(pairs.encode("the cat sat on the mat").size(), 6u);  // merges were applied
}

TEST(TokenizerRules, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  json file = mini_json();
  file["model"]["vocab"]["zzq"] = 800;
  EXPECT_NE(Tokenizer::from_json(file, "t").encode("zzq"), (Ids{800}));
  file["model"]["ignore_merges"] = true;
  EXPECT_EQ(Tokenizer::from_json(file, "t").encode("zzq"), (Ids{800}));
}

TEST(TokenizerRules, NormalizerNullNfcAndSequence) {
  json file = mini_json();
  const Ids composed = Tokenizer::from_json(file, "t").encode("e\u0301");
  EXPECT_EQ(composed, Tokenizer::from_json(file, "t").encode("\u00e9"));
  file["normalizer"] = json::parse(R"({"type": "Sequence", "normalizers": [{"type": "NFC"}]})");
  EXPECT_EQ(Tokenizer::from_json(file, "t").encode("e\u0301"), composed);
  file["normalizer"] = nullptr;
  EXPECT_NE(Tokenizer::from_json(file, "t").encode("e\u0301"), composed);
  file["normalizer"] = json::parse(R"({"type": "NFKC"})");
  const std::string error = error_of([&] { Tokenizer::from_json(file, "dir/tokenizer.json"); });
  EXPECT_NE(error.find("dir/tokenizer.json: normalizer"), std::string::npos) << error;
  EXPECT_NE(error.find("NFKC"), std::string::npos) << error;
}

TEST(TokenizerRules, ByteLevelWithRegexSplitsLikeGpt2) {
  json file = mini_json();
  file["pre_tokenizer"] = json::parse(R"({"type": "ByteLevel", "add_prefix_space": false, "use_regex": true})");
  const Tokenizer tok = Tokenizer::from_json(file, "t");
  EXPECT_EQ(tok.encode("I'm here  now"),
            cat({tok.encode("I"), tok.encode("'m"), tok.encode(" here"), tok.encode(" "), tok.encode(" now")}));
}

TEST(TokenizerRules, SplitKeepsGapsAndSkipsEmptyMatches) {
  std::vector<std::string_view> pieces;
  SplitRegex("x*", "t").split("abxxc", pieces);  // as in HF, the stretch before each empty match is a piece
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"a", "b", "xx", "c"}));
  pieces.clear();
  SplitRegex("\\d", "t").split("é1ü22", pieces);
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"é", "1", "ü", "2", "2"}));
}

// \s means White_Space, as in HF's Oniguruma: U+0085 is a space, U+180E and U+FEFF are not.
TEST(TokenizerRules, WhitespaceIsUnicodeWhiteSpace) {
  std::vector<std::string_view> pieces;
  SplitRegex("\\s+", "t").split("a\u180eb\u0085c\ufeffd", pieces);
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"a\u180eb", "\u0085", "c\ufeffd"}));
  pieces.clear();
  SplitRegex("[^\\s]+", "t").split("a b", pieces);
  EXPECT_EQ(pieces, (std::vector<std::string_view>{"a", " ", "b"}));
  EXPECT_EQ(oniguruma_to_pcre2(R"(\\s \Q\s\E \S)", "t"), R"(\\s \Q\s\E \P{White_Space})");
  const std::string error = error_of([] { SplitRegex("\\w+", "tokenizer.json: pre_tokenizer.pattern.Regex"); });
  EXPECT_NE(error.find("pre_tokenizer.pattern.Regex: `\\w`"), std::string::npos) << error;
}

TEST(TokenizerRules, LongWhitespaceRunsEncodeAndRoundTrip) {
  const Tokenizer tok = Tokenizer::from_json(mini_json(), "t");
  const std::string text = "a" + std::string(200000, ' ') + "b\n" + std::string(100000, '\n') + "\t";
  EXPECT_EQ(tok.decode(tok.encode(text)), text);
}

// Random code points from every plane, with added tokens (none that strip whitespace) and pieces of
// them: decoding gives back the NFC text.
TEST(TokenizerRules, RandomTextRoundTrips) {
  const Tokenizer tok = Tokenizer::from_json(mini_json(), "t");
  std::mt19937 rng(5);
  const std::vector<std::string> pieces = {"<|im_end|>", "<think>", " ", "\n", "\r\n", "'s", "e\u0301", "<|im_"};
  for (int n = 0; n < 2000; ++n) {
    std::string text;
    const int length = static_cast<int>(rng() % 24);
    for (int k = 0; k < length; ++k) {
      const uint32_t kind = rng() % 8;
      if (kind == 0) {
        text += pieces[rng() % pieces.size()];
      } else {
        const char32_t limit = kind < 4 ? 0x80 : kind < 6 ? 0x3000 : kind < 7 ? 0x10000 : 0x110000;
        char32_t c = rng() % limit;
        if (c >= 0xD800 && c <= 0xDFFF) c = U'x';
        append_utf8(text, c);
      }
    }
    EXPECT_EQ(tok.decode(tok.encode(text)), nfc(text)) << json(text).dump();
  }
}

TEST(TokenizerRules, SingleWordTokensNeedWordBoundaries) {
  const Tokenizer tok = with_token("<mask>", {{"single_word", true}});
  EXPECT_EQ(tok.encode("<mask> My name <mask> A<mask> <mask>ony <mask>"),
            cat({{700}, tok.encode(" My name "), {700}, tok.encode(" A<mask> <mask>ony "), {700}}));
  // Punctuation is not a word character; a combining mark is.
  EXPECT_EQ(tok.encode("<mask>, <mask>- \u25cc\u0330<mask>"),
            cat({{700}, tok.encode(", "), {700}, tok.encode("- \u25cc\u0330<mask>")}));
}

TEST(TokenizerRules, LstripAndRstripTakeUnicodeWhiteSpace) {
  const Tokenizer tok = with_token("<mask>", {{"lstrip", true}, {"rstrip", true}, {"single_word", true}});
  EXPECT_EQ(tok.encode("Hi <mask> there\t<mask>\t<mask>\u2000"),
            cat({tok.encode("Hi"), {700}, tok.encode("there"), {700}, {700}}));
  EXPECT_EQ(tok.encode("a\u180e<mask>\u3000\n b"), cat({tok.encode("a\u180e"), {700}, tok.encode("b")}));
  const Tokenizer left_only = with_token("<mask>", {{"lstrip", true}});
  EXPECT_EQ(left_only.encode("x  <mask>  y"), cat({left_only.encode("x"), {700}, left_only.encode("  y")}));
}

TEST(TokenizerRules, NormalizedTokensMatchTheNormalizedText) {
  // U+212B ANGSTROM SIGN normalizes to U+00C5.
  const Tokenizer raw = with_token("\u212b", {{"normalized", false}});
  EXPECT_EQ(raw.encode("x\u212b"), cat({raw.encode("x"), {700}}));
  EXPECT_NE(raw.encode("x\u00c5"), cat({raw.encode("x"), {700}}));
  const Tokenizer normalized = with_token("\u212b", {{"normalized", true}});
  EXPECT_EQ(normalized.encode("x\u00c5"), cat({normalized.encode("x"), {700}}));
  EXPECT_EQ(normalized.encode("x\u212b"), cat({normalized.encode("x"), {700}}));
  EXPECT_EQ(normalized.encode("xA\u030a"), cat({normalized.encode("x"), {700}}));
}

TEST(TokenizerRules, LongestLeftmostAddedTokenWins) {
  json file = mini_json();
  file["added_tokens"] = json::parse(R"([
    {"id": 700, "content": "<a>", "special": true}, {"id": 701, "content": "<a><b>", "special": true},
    {"id": 702, "content": "b><c", "special": true}])");
  const Tokenizer tok = Tokenizer::from_json(file, "t");
  EXPECT_EQ(tok.encode("<a><b><c"), cat({{701}, tok.encode("<c")}));
  EXPECT_EQ(tok.encode("<a>b><c"), (Ids{700, 702}));
}

TEST(TokenizerRules, TemplatePostProcessorAddsSpecialTokens) {
  json file = mini_json();
  file["post_processor"] = json::parse(R"({"type": "Sequence", "processors": [
    {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
    {"type": "TemplateProcessing",
     "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                {"SpecialToken": {"id": "<|endoftext|>", "type_id": 0}}],
     "pair": [],
     "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [657], "tokens": ["<|im_start|>"]},
                        "<|endoftext|>": {"id": "<|endoftext|>", "ids": [656], "tokens": ["<|endoftext|>"]}}}]})");
  const Tokenizer tok = Tokenizer::from_json(file, "t");
  EXPECT_EQ(tok.encode("hi", true), cat({{657}, tok.encode("hi", false), {656}}));
  EXPECT_EQ(tok.encode("", true), (Ids{657, 656}));
  EXPECT_EQ(tok.encode("", false), Ids{});
}

TEST(TokenizerRules, DecodeSkipsSpecialTokensAndChecksIds) {
  const Tokenizer tok = Tokenizer::from_json(mini_json(), "t");
  const Ids ids = tok.encode("<|im_start|>user\nhi<think></think><|im_end|>");
  EXPECT_EQ(tok.decode(ids), "<|im_start|>user\nhi<think></think><|im_end|>");
  EXPECT_EQ(tok.decode(ids, true), "user\nhi<think></think>");  // <think> is not special
  EXPECT_NE(error_of([&] { tok.decode(Ids{tok.vocab_size()}); }).find("out of range"), std::string::npos);
  EXPECT_NE(error_of([&] { tok.decode(Ids{-1}); }).find("out of range"), std::string::npos);
}

TEST(TokenizerRules, RejectsInvalidUtf8Text) {
  const Tokenizer tok = Tokenizer::from_json(mini_json(), "t");
  const std::string error = error_of([&] { tok.encode("ab\xC3(x"); });
  EXPECT_NE(error.find("not valid UTF-8 (at byte 2 of 5)"), std::string::npos) << error;
}

TEST(TokenizerRules, ErrorsNameTheFileAndField) {
  const auto error_with = [](const char* pointer, json value) {
    json file = mini_json();
    file[json::json_pointer(pointer)] = std::move(value);
    return error_of([&] { Tokenizer::from_json(file, "m/tokenizer.json"); });
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {error_with("/model/merges/3", "Ġ zzzz"),
       "m/tokenizer.json: model.merges[3]: \"zzzz\" is not in the vocabulary"},
      {error_with("/model/merges/4", "abc"), "m/tokenizer.json: model.merges[4]: expected \"left right\""},
      {error_with("/model/byte_fallback", true), "m/tokenizer.json: model.byte_fallback"},
      {error_with("/model/type", "WordPiece"), "m/tokenizer.json: model.type: \"WordPiece\" is not supported"},
      {error_with("/pre_tokenizer/pretokenizers/0/behavior", "Removed"),
       "m/tokenizer.json: pre_tokenizer.pretokenizers[0].behavior: \"Removed\""},
      {error_with("/pre_tokenizer/pretokenizers/0/pattern/Regex", "(ab"),
       "m/tokenizer.json: pre_tokenizer.pretokenizers[0].pattern.Regex: cannot compile"},
      {error_with("/pre_tokenizer/pretokenizers/1/add_prefix_space", true),
       "pre_tokenizer.pretokenizers[1].add_prefix_space"},
      {error_with("/pre_tokenizer", nullptr), "m/tokenizer.json: pre_tokenizer: is null"},
      {error_with("/decoder/type", "WordPiece"), "m/tokenizer.json: decoder: type \"WordPiece\""},
      {error_with("/post_processor/type", "BertProcessing"), "m/tokenizer.json: post_processor: post-processor type"},
      {error_with("/added_tokens/0/content", 5), "m/tokenizer.json: added_tokens[0].content: expected a string"},
  };
  for (const auto& [error, expected] : cases) EXPECT_NE(error.find(expected), std::string::npos) << error;

  json file = mini_json();
  file["model"]["vocab"].erase("Ā");  // the character for byte 0x00
  const std::string missing = error_of([&] { Tokenizer::from_json(file, "m/tokenizer.json"); });
  EXPECT_NE(missing.find("model.vocab: has no token for byte 0x00"), std::string::npos) << missing;
}

class TokenizerFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string test = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = std::filesystem::temp_directory_path() / ("qinfer-tok-" + std::to_string(::getpid()) + "-" + test);
    std::filesystem::create_directories(dir_);
    write("tokenizer.json", mini_json().dump());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void write(const std::string& name, const std::string& text) {
    std::ofstream(dir_ / name, std::ios::binary) << text;
  }
  std::filesystem::path dir_;
};

TEST_F(TokenizerFolder, ReadsTheConfig) {
  write("tokenizer_config.json", R"({
    "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}],
    "eos_token": {"content": "<|im_end|>", "lstrip": false}, "pad_token": "<|endoftext|>", "bos_token": null,
    "additional_special_tokens": ["<think>"],
    "added_tokens_decoder": {"659": {"content": "<think>", "special": false},
                             "700": {"content": "<extra>", "special": true, "normalized": false}}})");
  const Tokenizer tok = Tokenizer::load(dir_);
  EXPECT_EQ(tok.config().chat_template, "D");
  EXPECT_EQ(tok.config().eos_token, "<|im_end|>");
  EXPECT_EQ(tok.config().pad_token, "<|endoftext|>");
  EXPECT_EQ(tok.config().bos_token, "");
  EXPECT_TRUE(tok.is_special(659));  // listed in additional_special_tokens
  EXPECT_EQ(tok.token_to_id("<extra>"), 700);
  EXPECT_EQ(tok.vocab_size(), 701);
  EXPECT_EQ(tok.encode("a<extra>"), cat({tok.encode("a"), {700}}));
  EXPECT_EQ(tok.decode(Ids{700, 659}, true), "");

  write("chat_template.jinja", "{{ messages }}");
  EXPECT_EQ(Tokenizer::load(dir_).config().chat_template, "{{ messages }}");
}

TEST_F(TokenizerFolder, ConfigMayNotContradictTokenizerJson) {
  write("tokenizer_config.json", R"({"added_tokens_decoder": {"656": {"content": "<|other|>"}}})");
  const std::string error = error_of([&] { Tokenizer::load(dir_); });
  EXPECT_NE(error.find("tokenizer_config.json: added_tokens_decoder[\"656\"]: content \"<|other|>\" differs"),
            std::string::npos)
      << error;
  std::filesystem::remove(dir_ / "tokenizer.json");
  EXPECT_NE(error_of([&] { Tokenizer::load(dir_); }).find("no tokenizer.json"), std::string::npos);
}

}  // namespace
}  // namespace qinfer::tokenizer
