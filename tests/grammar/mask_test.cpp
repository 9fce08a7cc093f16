#include "grammar/mask.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>

#include "grammar/grammar.h"
#include "tokenizer/tokenizer_test_data.h"

namespace qinfer::grammar {
namespace {

// {"name": STRING, "tags": [STRING, ...]} with JSON strings (escapes included) and optional spaces.
Grammar small_json() {
  Grammar g;
  const Element ch = g.utf8_class({{0, 0x1F}, {'"', '"'}, {'\\', '\\'}}, true);
  Sequence escape = g.literal("\\");
  ByteSet escaped;
  for (char c : std::string("\"\\/bfnrt")) escaped.add(static_cast<uint8_t>(c));
  escape.push_back(g.bytes(escaped));
  const Element chars = g.repeat("chars", {g.choice("char", {{ch}, escape})}, 0, -1);
  Sequence string = g.literal("\"");
  string.push_back(chars);
  string.push_back(g.byte('"'));
  const Element str = g.choice("string", {string});
  const Element ws = g.optional("ws", g.literal(" "));
  const int32_t root = g.add_rule("root");
  Sequence s = g.literal("{\"name\":");
  s.push_back(ws);
  s.push_back(str);
  for (Element e : g.literal(",\"tags\":[")) s.push_back(e);
  Sequence more = g.literal(",");
  more.push_back(ws);
  more.push_back(str);
  Sequence items = {str, g.repeat("more", more, 0, -1)};
  s.push_back(g.optional("items", items));
  s.push_back(g.byte(']'));
  s.push_back(g.byte('}'));
  g.add_alternative(root, s);
  g.set_root(root);
  return g;
}

// Every token checked on its own by the matcher: what a mask must equal.
TokenBits brute_force(Matcher& m, const TokenTrie& trie, const std::vector<int32_t>& stops) {
  TokenBits bits((trie.vocab_size() + 31) / 32, 0);
  for (int32_t id : trie.tokens())
    if (m.accepts(trie.bytes(id))) set_bit(bits, id);
  if (m.accepting())
    for (int32_t id : stops) set_bit(bits, id);
  return bits;
}

std::vector<int32_t> allowed(const TokenBits& bits, int32_t vocab) {
  std::vector<int32_t> out;
  for (int32_t id = 0; id < vocab; ++id)
    if (test_bit(bits, id)) out.push_back(id);
  return out;
}

// A synthetic vocabulary: every string of one to three bytes over the grammar's interesting bytes, a
// few multi-byte characters and their halves, longer pieces, and one stop token (empty bytes).
std::vector<std::string> synthetic_vocab() {
  const std::string alphabet = "{}[]\":, \\nax";
  std::vector<std::string> vocab = {""};  // id 0: the stop token
  for (char a : alphabet) {
    vocab.push_back(std::string(1, a));
    for (char b : alphabet) {
      vocab.push_back(std::string{a, b});
      for (char c : alphabet) vocab.push_back(std::string{a, b, c});
    }
  }
  for (const char* s : {"é", "\xC3", "\xA9", "中", "\xE4\xB8", "\"name\":", "{\"name\": \"", "\",\"tags\":[\"", "\"]}",
                        "\\u00e9", "\x01", "\"\n", "ax\"]}", "t", "tags", "ags\":["})
    vocab.push_back(s);
  for (char c = 'b'; c <= 'z'; ++c)
    if (c != 'n' && c != 'x') vocab.push_back(std::string(1, c));  // so every literal can be spelled
  return vocab;
}

TEST(TokenTrie, HoldsEveryTokenOnceInPreOrder) {
  const std::vector<std::string> vocab = {"", "ab", "a", "abc", "b", "ab", "\xFF", "ba"};
  const TokenTrie trie(vocab, {false, false, false, false, false, false, false, true});
  std::vector<int32_t> ids = trie.tokens();
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2, 3, 4, 5, 6}));  // the empty and the excluded ones left out
  // The subtree of "a" holds exactly the tokens starting with "a".
  const auto& nodes = trie.nodes();
  const int32_t a = 1;
  ASSERT_EQ(nodes[a].byte, 'a');
  std::vector<int32_t> under_a(trie.tokens().begin() + nodes[a].tokens_begin, trie.tokens().begin() + trie.tokens_end(a));
  std::sort(under_a.begin(), under_a.end());
  EXPECT_EQ(under_a, (std::vector<int32_t>{1, 2, 3, 5}));
}

TEST(GrammarMasks, EqualCheckingEveryTokenAlongRandomWalks) {
  const auto vocab = synthetic_vocab();
  auto trie = std::make_shared<const TokenTrie>(vocab, std::vector<bool>{});
  auto compiled = std::make_shared<const CompiledGrammar>(small_json());
  auto masks = std::make_shared<GrammarMasks>(compiled, trie, std::vector<int32_t>{0});
  std::mt19937 rng(7);
  int finished = 0;
  for (int walk = 0; walk < 16; ++walk) {
    TokenConstraint constraint(masks);
    Matcher reference(compiled);
    std::string text;
    for (int step = 0; step < 48 && !constraint.finished(); ++step) {
      const TokenBits& mask = constraint.mask();
      const TokenBits want = brute_force(reference, *trie, {0});
      ASSERT_EQ(allowed(mask, trie->vocab_size()), allowed(want, trie->vocab_size())) << "walk " << walk << " step " << step;
      const std::vector<int32_t> choices = allowed(mask, trie->vocab_size());
      ASSERT_FALSE(choices.empty()) << "walk " << walk << " step " << step << " after '" << text << "'";
      // Lean towards the stop token late in a walk, so walks finish too.
      const int32_t id = step > 30 && test_bit(mask, 0) ? 0 : choices[rng() % choices.size()];
      ASSERT_TRUE(constraint.accept(id));
      if (id != 0) {
        ASSERT_TRUE(reference.advance(trie->bytes(id)));
      }
      text += trie->bytes(id);
    }
    finished += constraint.finished();
  }
  EXPECT_GT(finished, 0);
}

TEST(TokenConstraint, RefusesWhatTheGrammarDoesNot) {
  const auto vocab = synthetic_vocab();
  auto trie = std::make_shared<const TokenTrie>(vocab, std::vector<bool>{});
  auto masks = std::make_shared<GrammarMasks>(std::make_shared<const CompiledGrammar>(small_json()), trie,
                                              std::vector<int32_t>{0});
  TokenConstraint c(masks);
  const auto id_of = [&](std::string_view s) {
    return static_cast<int32_t>(std::find(vocab.begin(), vocab.end(), s) - vocab.begin());
  };
  EXPECT_FALSE(c.accept(0));  // a stop before the object is complete
  EXPECT_FALSE(c.accept(id_of("x")));
  EXPECT_TRUE(c.accept(id_of("{\"name\": \"")));
  EXPECT_TRUE(c.accept(id_of("é")));
  EXPECT_FALSE(c.accept(id_of("\x01")));  // a control character inside a string
  EXPECT_TRUE(c.accept(id_of("\",\"tags\":[\"")));
  EXPECT_TRUE(c.accept(id_of("ax\"]}")));
  EXPECT_TRUE(c.must_stop());
  EXPECT_TRUE(test_bit(c.mask(), 0));
  EXPECT_TRUE(c.accept(0));
  EXPECT_TRUE(c.finished());
}

// The real Qwen3 vocabulary: masks equal the brute force at a few points of a JSON object, and the
// per-token time of a generation (cold tables, then warm) is printed for the record.
TEST(GrammarMasks, Qwen3VocabularyMatchesBruteForce) {
  const tokenizer::Tokenizer* tok = testing::qwen3_tokenizer();
  ASSERT_NE(tok, nullptr);
  auto trie = TokenTrie::from_tokenizer(*tok);
  const int32_t stop = *tok->token_to_id("<|im_end|>");
  auto compiled = std::make_shared<const CompiledGrammar>(small_json());
  auto masks = std::make_shared<GrammarMasks>(compiled, trie, std::vector<int32_t>{stop});
  const std::string text = "{\"name\": \"caf\xC3\xA9 \\\"one\\\"\",\"tags\":[\"a\", \"b\"]}";
  const std::vector<int32_t> ids = tok->encode(text, false);
  using Clock = std::chrono::steady_clock;
  std::vector<double> cold, warm;
  for (int pass = 0; pass < 2; ++pass) {
    TokenConstraint c(masks);
    Matcher reference(compiled);
    for (size_t i = 0; i <= ids.size(); ++i) {
      const auto t0 = Clock::now();
      const TokenBits& mask = c.mask();
      (pass == 0 ? cold : warm).push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      if (pass == 0 && i % 12 == 0) {
        const TokenBits want = brute_force(reference, *trie, {stop});
        ASSERT_EQ(allowed(mask, trie->vocab_size()), allowed(want, trie->vocab_size())) << "after " << i << " tokens";
      }
      const int32_t id = i < ids.size() ? ids[i] : stop;
      ASSERT_TRUE(test_bit(mask, id)) << "token " << i << " (" << id << ") masked out";
      ASSERT_TRUE(c.accept(id));
      if (i < ids.size()) {
        ASSERT_TRUE(reference.advance(trie->bytes(id)));
      }
    }
    EXPECT_TRUE(c.finished());
  }
  std::sort(cold.begin(), cold.end());
  std::sort(warm.begin(), warm.end());
  std::printf("mask over %d tokens: cold median %.1f us (max %.1f), warm median %.1f us\n", trie->vocab_size(),
              cold[cold.size() / 2], cold.back(), warm[warm.size() / 2]);
}

}  // namespace
}  // namespace qinfer::grammar
