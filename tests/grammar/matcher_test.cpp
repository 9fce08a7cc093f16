#include "grammar/matcher.h"

#include <gtest/gtest.h>

#include <string>

#include "grammar/grammar.h"
#include "grammar_test_util.h"

namespace qinfer::grammar {
namespace {

using testing::matches;

// parens ::= "(" parens ")" parens | ε
Grammar balanced_parens() {
  Grammar g;
  const int32_t parens = g.add_rule("parens");
  g.add_alternative(parens, {g.byte('('), Grammar::rule(parens), g.byte(')'), Grammar::rule(parens)});
  g.add_alternative(parens, {});
  g.set_root(parens);
  return g;
}

TEST(Matcher, LiteralsAndAlternatives) {
  Grammar g;
  const int32_t root = g.add_rule("root");
  g.add_alternative(root, g.literal("yes"));
  g.add_alternative(root, g.literal("no"));
  g.add_alternative(root, g.literal("nope"));
  g.set_root(root);
  EXPECT_TRUE(matches(g, "yes"));
  EXPECT_TRUE(matches(g, "no"));
  EXPECT_TRUE(matches(g, "nope"));
  EXPECT_FALSE(matches(g, "ye"));
  EXPECT_FALSE(matches(g, "nop"));
  EXPECT_FALSE(matches(g, "yess"));
  EXPECT_FALSE(matches(g, ""));

  Matcher m(std::make_shared<CompiledGrammar>(g));
  EXPECT_TRUE(m.advance("no"));
  EXPECT_TRUE(m.accepting());
  EXPECT_TRUE(m.can_continue());  // "nope" goes on
  EXPECT_FALSE(m.advance("x"));   // refused, nothing consumed
  EXPECT_TRUE(m.accepting());
  EXPECT_TRUE(m.advance("pe"));
  EXPECT_TRUE(m.accepting());
  EXPECT_FALSE(m.can_continue());
}

TEST(Matcher, RecursionNestsWithoutLimit) {
  const Grammar g = balanced_parens();
  EXPECT_TRUE(matches(g, ""));
  EXPECT_TRUE(matches(g, "()()(())"));
  EXPECT_FALSE(matches(g, "(()"));
  EXPECT_FALSE(matches(g, "())"));
  // The frames are a graph, not the C++ stack: nesting 100,000 deep is memory, not a crash.
  const std::string deep = std::string(100000, '(') + std::string(100000, ')');
  EXPECT_TRUE(matches(g, deep));
  EXPECT_FALSE(matches(g, deep + ")"));
}

TEST(Matcher, AcceptsDoesNotConsume) {
  Matcher m(std::make_shared<CompiledGrammar>(balanced_parens()));
  EXPECT_TRUE(m.accepts("(()"));
  EXPECT_FALSE(m.accepts(")"));
  EXPECT_TRUE(m.accepting());
  EXPECT_TRUE(m.advance("(("));
  EXPECT_FALSE(m.accepting());
  const ByteSet next = m.next_bytes();
  EXPECT_TRUE(next.has('('));
  EXPECT_TRUE(next.has(')'));
  EXPECT_FALSE(next.has('x'));
}

TEST(Matcher, RepetitionBounds) {
  Grammar g;
  const int32_t root = g.add_rule("root");
  g.add_alternative(root, {g.repeat("digits", {g.bytes([] {
                                                ByteSet s;
                                                s.add_range('0', '9');
                                                return s;
                                              }())},
                                    2, 4),
                           g.byte(';')});
  g.set_root(root);
  EXPECT_FALSE(matches(g, "1;"));
  EXPECT_TRUE(matches(g, "12;"));
  EXPECT_TRUE(matches(g, "1234;"));
  EXPECT_FALSE(matches(g, "12345;"));

  Grammar star;
  const int32_t r = star.add_rule("root");
  star.add_alternative(r, {star.repeat("as", star.literal("ab"), 1, -1)});
  star.set_root(r);
  EXPECT_FALSE(matches(star, ""));
  EXPECT_TRUE(matches(star, "ab"));
  EXPECT_TRUE(matches(star, "ababab"));
  EXPECT_FALSE(matches(star, "aba"));
}

TEST(Matcher, Utf8ClassesMatchWholeCodePoints) {
  Grammar g;
  const int32_t root = g.add_rule("root");
  // Greek lower case, CJK unified ideographs, and the emoji block.
  g.add_alternative(root, {g.repeat("chars", {g.utf8_class({{0x3B1, 0x3C9}, {0x4E00, 0x9FFF}, {0x1F600, 0x1F64F}}, false)}, 1, -1)});
  g.set_root(root);
  EXPECT_TRUE(matches(g, "αβγ"));
  EXPECT_TRUE(matches(g, "中文ω"));
  EXPECT_TRUE(matches(g, "😀🙏"));
  EXPECT_FALSE(matches(g, "a"));
  EXPECT_FALSE(matches(g, "Ω"));                           // U+03A9, upper case
  EXPECT_FALSE(matches(g, std::string("\xCE", 1)));        // half of α
  EXPECT_FALSE(matches(g, "\xF0\x9F\x98"));               // three bytes of four

  Grammar not_ascii;
  const int32_t n = not_ascii.add_rule("root");
  not_ascii.add_alternative(n, {not_ascii.utf8_class({{0, 0x7F}}, true)});
  not_ascii.set_root(n);
  EXPECT_TRUE(matches(not_ascii, "é"));
  EXPECT_TRUE(matches(not_ascii, "\xF4\x8F\xBF\xBF"));     // U+10FFFF
  EXPECT_FALSE(matches(not_ascii, "e"));
  EXPECT_FALSE(matches(not_ascii, "\xED\xA0\x80"));        // a surrogate, not a scalar value
  EXPECT_FALSE(matches(not_ascii, "\xC0\x80"));            // an overlong NUL
}

TEST(Grammar, RefusesGrammarsThatCannotRun) {
  {
    Grammar g;
    const int32_t a = g.add_rule("expr");
    g.add_alternative(a, {Grammar::rule(a), g.byte('+'), g.byte('1')});
    g.add_alternative(a, {g.byte('1')});
    g.set_root(a);
    try {
      CompiledGrammar compiled(g);
      FAIL() << "left recursion accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'expr' is left-recursive"), std::string::npos) << e.what();
    }
  }
  {
    Grammar g;
    const int32_t a = g.add_rule("forever");
    g.add_alternative(a, {g.byte('x'), Grammar::rule(a)});
    g.set_root(a);
    EXPECT_THROW(CompiledGrammar{g}, Error);
  }
  {
    Grammar g;
    const int32_t a = g.add_rule("empty");
    g.set_root(a);
    EXPECT_THROW(CompiledGrammar{g}, Error);
  }
  {
    Grammar g;
    EXPECT_THROW(CompiledGrammar{g}, Error);  // no root
  }
}

}  // namespace
}  // namespace qinfer::grammar
