// TextStream: the text side of generation shared by engine::generate and the scheduler.
#include <gtest/gtest.h>

#include "engine/generate.h"
#include "engine/model_runner.h"
#include "engine/text_stream.h"
#include "engine_support.h"

namespace qinfer::engine {
namespace {

using testing::test_tokenizer;

struct Pushed {
  std::vector<std::string> chunks;  // one per token
  bool stopped = false;
  std::string joined() const {
    std::string s;
    for (const auto& c : chunks) s += c;
    return s;
  }
};

Pushed push_all(TextStream& stream, std::string_view text) {
  Pushed p;
  for (int32_t id : test_tokenizer().encode(text)) {
    p.chunks.push_back(stream.push(id));
    if ((p.stopped = stream.stopped())) break;
  }
  return p;
}

TEST(TextStream, StopsBeforeTheEarliestMatch) {
  TextStream stream(test_tokenizer(), {"rld", "o w"});
  const Pushed p = push_all(stream, "hello world and more");
  EXPECT_TRUE(p.stopped);
  EXPECT_EQ(p.joined(), "hell");
}

TEST(TextStream, HoldsBackWhatMayBeginAStopString) {
  TextStream stream(test_tokenizer(), {"world!"});
  const Pushed p = push_all(stream, "hello world");
  EXPECT_FALSE(p.stopped);
  EXPECT_EQ(p.joined(), "hello ");  // "world" may still become "world!"
  EXPECT_EQ(stream.finish(), "world");
}

TEST(TextStream, WaitsForWholeCharacters) {
  const tokenizer::Tokenizer& tok = test_tokenizer();
  // Byte-level tokens for the two bytes of "é" (0xC3 0xA9 map to "Ã" and "©").
  const auto lead = tok.token_to_id("Ã"), trail = tok.token_to_id("©");
  ASSERT_TRUE(lead && trail);
  TextStream stream(tok, {});
  EXPECT_EQ(stream.push(*lead), "");
  EXPECT_EQ(stream.push(*trail), "é");
  EXPECT_EQ(stream.push(*lead), "");
  EXPECT_EQ(stream.finish(), "\xEF\xBF\xBD") << "an unfinished character ends as U+FFFD";
}

TEST(TextStream, HeldBack) {
  EXPECT_EQ(held_back("abc", {"cd"}), 1u);
  EXPECT_EQ(held_back("abc", {"bcd", "cx"}), 2u);
  EXPECT_EQ(held_back("abc", {"abc"}), 0u) << "a whole match is not a proper prefix";
  EXPECT_EQ(held_back("abc", {"x"}), 0u);
}


// Padding rows past the tokenizer's vocabulary (a checkpoint's vocab_size rounded up) are never
// sampled: sampling sees only the tokenizer's columns.
TEST(TextLogits, DropsColumnsPastTheTokenizerVocabulary) {
  const tokenizer::Tokenizer& tok = test_tokenizer();
  const int64_t text = tok.vocab_size();
  std::unique_ptr<Ops> ops = make_ref_ops();
  Tensor wide = host_tensor(DType::f32, {2, text + 44});
  for (int64_t i = 0; i < wide.numel(); ++i) wide.ptr<float>()[i] = static_cast<float>(i % 977);
  wide.ptr<float>()[text + 3] = 1e9f;  // the largest logit sits in the padding
  const Tensor narrow = text_logits(*ops, wide, tok.vocab_size());
  ASSERT_EQ(narrow.shape, (std::vector<int64_t>{2, text}));
  for (int64_t r = 0; r < 2; ++r)
    for (int64_t c = 0; c < text; ++c) EXPECT_EQ(narrow.ptr<float>()[r * text + c], wide.ptr<float>()[r * (text + 44) + c]);
  std::vector<int32_t> next;
  ops->sample(narrow, {SamplingParams{}, SamplingParams{}}, {{}, {}}, {0, 0}, next);
  for (int32_t id : next) EXPECT_LT(id, text);
  Tensor exact = host_tensor(DType::f32, {1, text});
  EXPECT_EQ(text_logits(*ops, exact, tok.vocab_size()).data, exact.data);
}

}  // namespace
}  // namespace qinfer::engine
