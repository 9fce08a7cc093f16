// compile_regex / regex_grammar: the patterns JSON Schema and guided_regex users write, matched in
// full through the Matcher, and the constructs a grammar cannot express refused with their offset.
#include "grammar/regex.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

#include "grammar/matcher.h"
#include "grammar_test_util.h"

namespace qinfer::grammar {
namespace {

using testing::matches;

// Checks every string against the pattern: `accepted` must match in full, `rejected` must not.
::testing::AssertionResult language(std::string_view pattern, std::initializer_list<std::string_view> accepted,
                                  std::initializer_list<std::string_view> rejected) {
  const Grammar g = regex_grammar(pattern);
  for (std::string_view s : accepted)
    if (!matches(g, s)) return ::testing::AssertionFailure() << "/" << pattern << "/ rejects \"" << s << "\"";
  for (std::string_view s : rejected)
    if (matches(g, s)) return ::testing::AssertionFailure() << "/" << pattern << "/ accepts \"" << s << "\"";
  return ::testing::AssertionSuccess();
}

::testing::AssertionResult fails_with(std::string_view pattern, std::initializer_list<std::string_view> parts) {
  return testing::fails_with([&] { regex_grammar(pattern); }, fmt::format("/{}/", pattern), parts);
}

TEST(Regex, Dates) {
  EXPECT_TRUE(language(R"(\d{4}-\d{2}-\d{2})", {"2024-01-31", "0000-00-00"},
                       {"2024-1-31", "20240-01-31", "2024-01-311", "2024/01/31", "", "２０２４-01-31"}));
  EXPECT_TRUE(language(R"(^(19|20)\d\d-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])$)", {"1999-12-31", "2024-02-01"},
                       {"2024-13-01", "2024-00-10", "2024-01-32", "1899-01-01"}));
}

TEST(Regex, PhoneNumbers) {
  EXPECT_TRUE(language(R"(^\(?\d{3}\)?[-. ]?\d{3}[-. ]?\d{4}$)", {"(555) 123-4567", "555.123.4567", "5551234567"},
                       {"555-1234", "(555) 123-45678", "abc-def-ghij", "555--123-4567"}));
  EXPECT_TRUE(
      language(R"(\+?[1-9]\d{1,14})", {"+14155552671", "442071838750", "12"}, {"+0123", "1", "+1234567890123456"}));
}

TEST(Regex, Emails) {
  EXPECT_TRUE(language(R"([A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,})",
                       {"john.doe+x@mail.example.com", "a_b%c@d-e.org", "x@y.co"},
                       {"john@com", "@x.com", "a@b.c", "a b@c.de", "a@b.de "}));
}

TEST(Regex, Alternation) {
  EXPECT_TRUE(language("cat|dog|bird", {"cat", "dog", "bird"}, {"catdog", "", "ca", "birds"}));
  EXPECT_TRUE(language("a(b|)c", {"abc", "ac"}, {"abbc", "a", "bc"}));
  EXPECT_TRUE(language("(yes|no)|maybe", {"yes", "no", "maybe"}, {"yesno", "may"}));
  EXPECT_TRUE(language("|x", {"", "x"}, {"xx"}));
}

TEST(Regex, NestedGroups) {
  EXPECT_TRUE(language("((ab)+c)*d", {"d", "abcd", "ababcabcd"}, {"abd", "acd", "abc", "cd"}));
  EXPECT_TRUE(language(R"((?:x|y)(?P<num>\d+)(?<tail>z)?)", {"x12", "y3z"}, {"xz", "x", "z12"}));
  EXPECT_TRUE(language(R"(((a|b)(c|(d|e)f))+)", {"ac", "bdfaef", "acbc"}, {"ad", "abc", ""}));
}

TEST(Regex, Classes) {
  EXPECT_TRUE(language(R"([\d\s_-]+)", {"12 _-\t3", "\u00a0"}, {"a", "12a", ""}));
  EXPECT_TRUE(language(R"([^\d])", {"a", "é", "\n"}, {"1", "ab", ""}));
  EXPECT_TRUE(language(R"([\w.]+)", {"file_name.txt", "A9"}, {"a-b", "é"}));
  EXPECT_TRUE(language(R"([\]\\\-]+)", {"]\\-"}, {"a", "["}));
  EXPECT_TRUE(language(R"([]a]+)", {"]a]"}, {"b"}));  // ']' first is a member
  EXPECT_TRUE(language(R"([\x41-\x43]+)", {"ABC"}, {"D", "@"}));
  EXPECT_TRUE(language(R"([\u00e0-\u00ff]+)", {"àéÿ"}, {"a", "Ā"}));
  EXPECT_TRUE(language(R"([^\W])", {"a", "_", "7"}, {"-", " ", "é"}));  // the same as \w
  EXPECT_TRUE(language(R"([\D]+)", {"abc", "é"}, {"a1"}));
  EXPECT_TRUE(language(R"([a-c\d]-[+*/])", {"b-*", "5-/"}, {"d-*", "b-a"}));
  EXPECT_TRUE(language(R"([\d-z]+)", {"1-z", "z"}, {"a"}));  // '-' after a shorthand is a member
  EXPECT_TRUE(language(R"([\b])", {"\b"}, {"b"}));  // backspace inside a class
  EXPECT_TRUE(language(R"([α-ω]{2})", {"αω"}, {"α", "αβγ", "ΑΒ"}));
  EXPECT_TRUE(language(R"([^a-z]+)", {"ABC", "日本", "😀"}, {"aB", "\xC3", "\xE6\x97"}));
  EXPECT_TRUE(language(R"([😀-🙏]+)", {"😀🙏"}, {"🚀"}));
}

TEST(Regex, ShorthandClasses) {
  EXPECT_TRUE(language(R"(\d+)", {"0123456789"}, {"", "a", "٣"}));  // ASCII digits only, as in JavaScript
  EXPECT_TRUE(language(R"(\D)", {"a", "é"}, {"5"}));
  EXPECT_TRUE(language(R"(\w+)", {"snake_Case9"}, {"kebab-case", "é"}));
  EXPECT_TRUE(language(R"(\W)", {"-", "é", " "}, {"a", "_"}));
  EXPECT_TRUE(language(R"(\s+)", {" \t\n\r\f\v", "\u00a0\u3000\u2028\ufeff"}, {"a", "\u200b"}));
  EXPECT_TRUE(language(R"(\S+)", {"abc", "é"}, {" ", "a b", "\u3000"}));
}

TEST(Regex, Dot) {
  EXPECT_TRUE(language("a.c", {"abc", "aéc", "a😀c", "a\rc"}, {"a\nc", "ac", "a\xC3" "c", "abbc"}));
  EXPECT_TRUE(language(".*", {"", "anything at all é", "\t"}, {"two\nlines"}));
}

TEST(Regex, Quantifiers) {
  EXPECT_TRUE(language("a{3}", {"aaa"}, {"aa", "aaaa"}));
  EXPECT_TRUE(language("a{2,4}", {"aa", "aaa", "aaaa"}, {"a", "aaaaa"}));
  EXPECT_TRUE(language("a{2,}", {"aa", "aaaaaaaaaa"}, {"a", ""}));
  EXPECT_TRUE(language("a{,2}", {"", "a", "aa"}, {"aaa"}));  // Python's {,n}
  EXPECT_TRUE(language("a{0}b", {"b"}, {"ab"}));
  EXPECT_TRUE(language("(ab){2}", {"abab"}, {"ab", "ababab", "aabb"}));
  EXPECT_TRUE(language("ab*c+d?", {"ac", "abbcccd", "acd"}, {"abd", "abcdd"}));
  EXPECT_TRUE(language("a+?b", {"ab", "aaab"}, {"b"}));  // lazy: the same strings
  EXPECT_TRUE(language("a{2,3}?", {"aa", "aaa"}, {"a", "aaaa"}));
  EXPECT_TRUE(language("x*?y??z+?", {"z", "xxyzz"}, {"yy"}));
  EXPECT_TRUE(language("é+", {"é", "ééé"}, {"", "\xC3\xA9\xA9"}));  // a quantifier repeats the whole character
  EXPECT_TRUE(language(R"(\d{1000})", {std::string(1000, '7')}, {std::string(999, '7'), std::string(1001, '7')}));
  EXPECT_TRUE(language("(abcdefghij){50,60}", {[] {
                         std::string s;
                         for (int i = 0; i < 55; ++i) s += "abcdefghij";
                         return s;
                       }()},
                       {"abcdefghij"}));
}

TEST(Regex, NullableRepetitions) {
  // An item that can match nothing, repeated: the same language, without the left recursion.
  EXPECT_TRUE(language("(a?)*", {"", "a", "aaaa"}, {"b"}));
  EXPECT_TRUE(language("(a*b?)*", {"", "a", "abab", "bb", "aab"}, {"c", "ac"}));
  EXPECT_TRUE(language("(|a)+", {"", "aaa"}, {"b"}));
  EXPECT_TRUE(language("(a*)*b", {"b", "aaab"}, {"a", "ba"}));
  EXPECT_TRUE(language("()*x", {"x"}, {"", "xx"}));
  EXPECT_TRUE(language("(a?){2,3}", {"", "a", "aa", "aaa"}, {"aaaa"}));
  EXPECT_TRUE(language("(a?b?){2}c", {"c", "abc", "ababc", "bac", "aac"}, {"abababc", "aaac"}));
  EXPECT_TRUE(language(R"((\s*,?\s*\w*)+)", {"", "a, b ,c", ",,"}, {"a;b"}));
}

TEST(Regex, LiteralBraces) {
  // A '{' that does not start a quantifier is itself, as in Python and JavaScript.
  EXPECT_TRUE(language("a{b}", {"a{b}"}, {"ab"}));
  EXPECT_TRUE(language("x{,}", {"x{,}"}, {"x"}));
  EXPECT_TRUE(language(R"({"k": \d})", {R"({"k": 5})"}, {R"({"k": })"}));
}

TEST(Regex, Escapes) {
  EXPECT_TRUE(language(R"(\.\*\+\?\(\)\[\]\{\}\|\^\$\\\/\-\,\#\ \")", {R"(.*+?()[]{}|^$\/-,# ")"}, {"a"}));
  EXPECT_TRUE(language(R"(\t\n\r\f\v\0)", {std::string("\t\n\r\f\v\0", 6)}, {"tnrfv0"}));
  EXPECT_TRUE(language(R"(\x41\u00e9\u{1F600}\U0001F64F)", {"Aé😀🙏"}, {"A"}));
  EXPECT_TRUE(language(R"(\uD83D\uDE00)", {"😀"}, {"\xED\xA0\xBD\xED\xB8\x80"}));  // a UTF-16 pair
  EXPECT_TRUE(language(R"([\uD83D\uDE00-\uD83D\uDE4F]+)", {"😀🙏"}, {"🚀"}));
  EXPECT_TRUE(language("\\é", {"é"}, {"e"}));
}

TEST(Regex, Unicode) {
  EXPECT_TRUE(language("héllo wörld", {"héllo wörld"}, {"hello world", "héllo"}));
  EXPECT_TRUE(language("日本(語|人)", {"日本語", "日本人"}, {"日本", "日本語人"}));
  EXPECT_TRUE(language("(😀|🙏)+", {"😀🙏😀"}, {"\xF0\x9F\x98"}));
}

TEST(Regex, Anchors) {
  EXPECT_TRUE(language("^abc$", {"abc"}, {"abcd", "xabc"}));
  EXPECT_TRUE(language("^a|^b$", {"a", "b"}, {"ab"}));
  EXPECT_TRUE(language(R"(\Aabc\Z)", {"abc"}, {"ab"}));
  EXPECT_TRUE(language("^$", {""}, {"a"}));
  EXPECT_TRUE(language("", {""}, {"a"}));
}

TEST(Regex, IntoAnExistingGrammar) {
  // Patterns compile into a grammar other rules are in (JSON Schema's "pattern"), with unique names.
  Grammar g;
  const int32_t root = g.add_rule("root");
  Sequence body = g.literal("id:");
  body.push_back(compile_regex(g, R"([a-f0-9]{4}(-[a-f0-9]{4})*)"));
  body.push_back(g.byte(';'));
  body.push_back(compile_regex(g, "(x|y)+"));
  body.push_back(compile_regex(g, "z"));
  g.add_alternative(root, body);
  g.set_root(root);
  EXPECT_TRUE(matches(g, "id:abcd-0123;xyxz"));
  EXPECT_TRUE(matches(g, "id:ffff;yz"));
  EXPECT_FALSE(matches(g, "id:abc;xz"));
  EXPECT_FALSE(matches(g, "id:abcd;z"));
  std::vector<std::string> names;
  for (const Rule& r : g.rules()) names.push_back(r.name);
  std::sort(names.begin(), names.end());
  EXPECT_EQ(std::adjacent_find(names.begin(), names.end()), names.end());
}

TEST(Regex, Refusals) {
  EXPECT_TRUE(fails_with(R"((a)\1)", {"offset 3", "backreference '\\1'"}));
  EXPECT_TRUE(fails_with(R"((?<n>a)\k<n>)", {"offset 7", "backreference '\\k'"}));
  EXPECT_TRUE(fails_with("(?P<n>a)(?P=n)", {"offset 8", "backreference '(?P='"}));
  EXPECT_TRUE(fails_with("a(?=b)", {"offset 1", "lookahead '(?='"}));
  EXPECT_TRUE(fails_with("a(?!b)", {"offset 1", "lookahead '(?!'"}));
  EXPECT_TRUE(fails_with("(?<=a)b", {"offset 0", "lookbehind '(?<='"}));
  EXPECT_TRUE(fails_with("(?<!a)b", {"offset 0", "lookbehind '(?<!'"}));
  EXPECT_TRUE(fails_with(R"(\bword\b)", {"offset 0", "word boundary '\\b'"}));
  EXPECT_TRUE(fails_with(R"(a\B)", {"offset 1", "word boundary '\\B'"}));
  EXPECT_TRUE(fails_with("a^b", {"offset 1", "anchor '^'"}));
  EXPECT_TRUE(fails_with("a$b", {"offset 1", "anchor '$'"}));
  EXPECT_TRUE(fails_with("(^a)", {"offset 1", "anchor '^'"}));
  EXPECT_TRUE(fails_with("(a$)", {"offset 2", "anchor '$'"}));
  EXPECT_TRUE(fails_with("^*a", {"offset 1", "nothing to repeat"}));
  EXPECT_TRUE(fails_with("*a", {"offset 0", "'*' has nothing to repeat"}));
  EXPECT_TRUE(fails_with("a|+", {"offset 2", "'+' has nothing to repeat"}));
  EXPECT_TRUE(fails_with("({2})", {"offset 1", "'{2}' has nothing to repeat"}));
  EXPECT_TRUE(fails_with("a*+", {"offset 1", "possessive quantifier '*+'"}));
  EXPECT_TRUE(fails_with("a**", {"offset 2", "follows another quantifier"}));
  EXPECT_TRUE(fails_with("a{2}{3}", {"offset 4", "follows another quantifier"}));
  EXPECT_TRUE(fails_with("(ab", {"offset 0", "unterminated group"}));
  EXPECT_TRUE(fails_with("x(a(b)", {"offset 1", "unterminated group"}));
  EXPECT_TRUE(fails_with("[ab", {"offset 0", "unterminated character class"}));
  EXPECT_TRUE(fails_with("ab)", {"offset 2", "')' without a matching '('"}));
  EXPECT_TRUE(fails_with("[z-a]", {"offset 1", "'z-a' is reversed"}));
  EXPECT_TRUE(fails_with(R"([a-\d])", {"offset 1", "ends in a class shorthand"}));
  EXPECT_TRUE(fails_with(R"(\q)", {"offset 0", "unsupported escape '\\q'"}));
  EXPECT_TRUE(fails_with(R"(\p{L})", {"offset 0", "Unicode property escape '\\p'"}));
  EXPECT_TRUE(fails_with("(?i)abc", {"offset 0", "group '(?i'", "inline flags"}));
  EXPECT_TRUE(fails_with("(?<1a>x)", {"offset 0", "bad group name"}));
  EXPECT_TRUE(fails_with("a{3,2}", {"offset 1", "maximum below its minimum"}));
  EXPECT_TRUE(fails_with("a{20000}", {"offset 1", "larger than"}));
  EXPECT_TRUE(fails_with("a{12345678901}", {"offset 1", "too large"}));
  EXPECT_TRUE(fails_with("ab\\", {"offset 2", "lone '\\'"}));
  EXPECT_TRUE(fails_with("a\xFF", {"offset 1", "invalid UTF-8"}));
  EXPECT_TRUE(fails_with(R"(x\uD800)", {"offset 1", "lone UTF-16 surrogate"}));
  EXPECT_TRUE(fails_with(R"(\x4g)", {"offset 0", "2 hex digits"}));
  EXPECT_TRUE(fails_with(R"(\01)", {"offset 0", "octal"}));
  EXPECT_TRUE(fails_with(R"([^\x00-\u{10FFFF}])", {"offset 0", "matches no character"}));
  EXPECT_TRUE(fails_with(std::string(300, '(') + std::string(300, ')'), {"nested more than"}));
  // The message quotes the pattern, cut short when long.
  EXPECT_TRUE(fails_with(std::string(100, 'a') + "(?=b)", {"regex 'aaaa", "...', offset 100"}));
}

}  // namespace
}  // namespace qinfer::grammar
