// Streaming detokenization and U+FFFD replacement of ill-formed bytes.
#include <gtest/gtest.h>

#include "tokenizer/bpe.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer_test_data.h"

namespace qinfer::tokenizer {
namespace {

using Ids = std::vector<int32_t>;

const std::string kReplacement = "\xEF\xBF\xBD";

// Each maximal ill-formed subsequence becomes one U+FFFD (Python's errors='replace', WHATWG, HF).
TEST(Utf8, ReplacesMaximalSubpartsWithReplacementCharacter) {
  const std::string r = kReplacement;
  EXPECT_EQ(to_valid_utf8("plain é 😀"), "plain é 😀");
  EXPECT_EQ(to_valid_utf8("\xE2\x82" "A"), r + "A");          // a cut 3-byte sequence
  EXPECT_EQ(to_valid_utf8("x\xF0\x9F\x98"), "x" + r);         // cut at the end
  EXPECT_EQ(to_valid_utf8("\xC0\x80"), r + r);                // overlong lead byte
  EXPECT_EQ(to_valid_utf8("\xED\xA0\x80"), r + r + r);        // a surrogate
  EXPECT_EQ(to_valid_utf8("\xF4\x90\x80\x80"), r + r + r + r);  // above U+10FFFF
  EXPECT_EQ(to_valid_utf8("\x80\xBF" "a\xFF"), r + r + "a" + r);
  EXPECT_EQ(to_valid_utf8("\xE0\xA0"), r);
}

TEST(Utf8, NextCodePoint) {
  const std::string text = "aé€😀";
  std::vector<char32_t> cps;
  for (size_t i = 0; i < text.size();) cps.push_back(next_code_point(text, i));
  EXPECT_EQ(cps, (std::vector<char32_t>{U'a', U'é', U'€', U'😀'}));
}

const Tokenizer& mini() {
  static const Tokenizer tok = Tokenizer::load(testing::tokenizer_data_dir() / "qwen35_mini");
  return tok;
}

// The single-byte tokens of a string: every multi-byte character arrives split.
Ids byte_tokens(const std::string& bytes) {
  Ids ids;
  for (unsigned char b : bytes) {
    std::string name;
    append_utf8(name, byte_to_char(b));
    ids.push_back(*mini().token_to_id(name));
  }
  return ids;
}

TEST(StreamDecoder, HoldsBytesOfAnUnfinishedCharacter) {
  StreamDecoder stream(mini());
  std::vector<std::string> chunks;
  for (int32_t id : byte_tokens("a😀é")) chunks.push_back(stream.push(id));
  EXPECT_EQ(chunks, (std::vector<std::string>{"a", "", "", "", "😀", "", "é"}));
  EXPECT_EQ(stream.finish(), "");
}

TEST(StreamDecoder, FlushesIllFormedBytesLikeDecode) {
  StreamDecoder stream(mini());
  std::string joined;
  const Ids ids = byte_tokens("\xE2\x82" "A\xF0\x9F");
  for (int32_t id : ids) joined += stream.push(id);
  EXPECT_EQ(joined, kReplacement + "A");  // the cut sequence settles once 'A' arrives
  joined += stream.finish();              // the unfinished one at the end
  EXPECT_EQ(joined, kReplacement + "A" + kReplacement);
  EXPECT_EQ(joined, mini().decode(ids));
  EXPECT_EQ(stream.push(byte_tokens("b")[0]), "b");  // usable again after finish
}

TEST(StreamDecoder, SkipsSpecialTokensOnRequest) {
  const Ids ids = mini().encode("<|im_start|>user\nnaïve 😀<|im_end|>");
  for (bool skip : {false, true}) {
    StreamDecoder stream(mini(), skip);
    std::string joined;
    for (int32_t id : ids) joined += stream.push(id);
    joined += stream.finish();
    EXPECT_EQ(joined, mini().decode(ids, skip));
  }
}

// Every way of cutting a text into byte tokens decodes to the same text in valid chunks.
TEST(StreamDecoder, AnySplitOfMixedTextGivesValidChunks) {
  const std::string text = "ab 中文 😀👨‍👩‍👧 é\u0301 \xF0\x9F" "x";
  const Ids ids = byte_tokens(text);
  StreamDecoder stream(mini());
  std::string joined;
  for (int32_t id : ids) {
    const std::string chunk = stream.push(id);
    EXPECT_TRUE(is_valid_utf8(chunk));
    joined += chunk;
  }
  joined += stream.finish();
  EXPECT_EQ(joined, mini().decode(ids));
  EXPECT_EQ(joined, to_valid_utf8(text));
}

}  // namespace
}  // namespace qinfer::tokenizer
