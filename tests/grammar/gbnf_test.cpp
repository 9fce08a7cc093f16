// parse_gbnf: llama.cpp's example grammars, UTF-8 classes, repetition bounds, layout rules, and every
// error naming its line and column.
#include "grammar/gbnf.h"

#include <gtest/gtest.h>

#include <initializer_list>
#include <string>

#include "grammar/matcher.h"
#include "grammar_test_util.h"

namespace qinfer::grammar {
namespace {

using testing::matches;

// Whether parsing fails with a message holding every part.
::testing::AssertionResult fails_with(std::string_view text, std::initializer_list<std::string_view> parts) {
  return testing::fails_with([&] { parse_gbnf(text); }, text, parts);
}

TEST(Gbnf, Arithmetic) {
  const Grammar g = parse_gbnf(R"gbnf(
root  ::= (expr "=" ws term "\n")+
expr  ::= term ([-+*/] term)*
term  ::= ident | num | "(" ws expr ")" ws
ident ::= [a-z] [a-z0-9_]* ws
num   ::= [0-9]+ ws
ws    ::= [ \t\n]*
)gbnf");
  EXPECT_TRUE(matches(g, "1+2=3\n"));
  EXPECT_TRUE(matches(g, "x*(y+2)=14\n"));
  EXPECT_TRUE(matches(g, "a +b= c\n2/2=1\n"));
  EXPECT_TRUE(matches(g, "( total_2 -7 )*3=x\n"));
  EXPECT_FALSE(matches(g, "1+=2\n"));
  EXPECT_FALSE(matches(g, "1+2=3"));
  EXPECT_FALSE(matches(g, "=3\n"));
  EXPECT_FALSE(matches(g, "A=1\n"));
  EXPECT_FALSE(matches(g, "(1+2=3\n"));
  EXPECT_FALSE(matches(g, ""));
}

TEST(Gbnf, Json) {
  const Grammar g = parse_gbnf(R"(root   ::= object
value  ::= object | array | string | number | ("true" | "false" | "null") ws

object ::=
  "{" ws (
            string ":" ws value
    ("," ws string ":" ws value)*
  )? "}" ws

array  ::=
  "[" ws (
            value
    ("," ws value)*
  )? "]" ws

string ::=
  "\"" (
    [^"\\\x7F\x00-\x1F] |
    "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) # escapes
  )* "\"" ws

number ::= ("-"? ([0-9] | [1-9] [0-9]{0,15})) ("." [0-9]+)? ([eE] [-+]? [0-9] [1-9]{0,15})? ws

# Optional space: by convention, applied in this grammar after literal chars when allowed
ws ::= | " " | "\n" [ \t]{0,20}
)");
  EXPECT_TRUE(matches(g, "{}"));
  EXPECT_TRUE(matches(g, R"({"a": [1, 2.5, -3e21, true, null], "b": {"c": "d\n"}})"));
  EXPECT_TRUE(matches(g, R"({"k":"\u00e9\"\\"})"));
  EXPECT_TRUE(matches(g, "{\"é\": \"naïve ☃ 😀\"}"));
  EXPECT_TRUE(matches(g, "{\n  \"a\": []\n}"));
  EXPECT_FALSE(matches(g, R"({"a" 1})"));
  EXPECT_FALSE(matches(g, R"({"a": 01})"));
  EXPECT_FALSE(matches(g, R"({"a": [1,]})"));
  EXPECT_FALSE(matches(g, R"({"a": "\q"})"));
  EXPECT_FALSE(matches(g, R"({"a": "\u12"})"));
  EXPECT_FALSE(matches(g, "{\"a\": \"\x01\"}"));
  EXPECT_FALSE(matches(g, "[1]"));  // root is an object
  EXPECT_FALSE(matches(g, "{"));
}

TEST(Gbnf, List) {
  const Grammar g = parse_gbnf(R"(root ::= item+

# Excludes various line break characters
item ::= "- " [^\r\n\x0b\x0c\x85\u2028\u2029]+ "\n"
)");
  EXPECT_TRUE(matches(g, "- one\n- two\n"));
  EXPECT_TRUE(matches(g, "- héllo 🎉\n"));
  EXPECT_FALSE(matches(g, "- \n"));
  EXPECT_FALSE(matches(g, "- a"));
  EXPECT_FALSE(matches(g, ""));
  EXPECT_FALSE(matches(g, "- a\u2028b\n"));
  EXPECT_FALSE(matches(g, "- a\u0085b\n"));
  EXPECT_FALSE(matches(g, "- a\x0b" "b\n"));
  EXPECT_FALSE(matches(g, "* a\n"));
}

TEST(Gbnf, Chess) {
  const Grammar g = parse_gbnf(R"(
# Specifies chess moves as a list in algebraic notation, using PGN conventions

# Force first move to "1. ", then any 1-2 digit number after, relying on model to follow the pattern
root    ::= "1. " move " " move "\n" ([1-9] [0-9]? ". " move " " move "\n")+
move    ::= (pawn | nonpawn | castle) [+#]?

# piece type, optional file/rank, optional capture, dest file & rank
nonpawn ::= [NBKQR] [a-h]? [1-8]? "x"? [a-h] [1-8]

# optional file & capture, dest file & rank, optional promotion
pawn    ::= ([a-h] "x")? [a-h] [1-8] ("=" [NBKQR])?

castle  ::= "O-O" "-O"?
)");
  EXPECT_TRUE(matches(g, "1. e4 e5\n2. Nf3 Nc6\n3. Bb5 a6\n"));
  EXPECT_TRUE(matches(g, "1. O-O O-O-O\n12. exd8=Q# Kxd8+\n"));
  EXPECT_TRUE(matches(g, "1. d4 d5\n2. Nbd2 R1xa7\n"));
  EXPECT_FALSE(matches(g, "1. e4 e5\n"));
  EXPECT_FALSE(matches(g, "1. e9 e5\n2. e4 e5\n"));
  EXPECT_FALSE(matches(g, "1. e4 e5\n100. e4 e5\n"));
  EXPECT_FALSE(matches(g, "1. Pe4 e5\n2. e4 e5\n"));
  EXPECT_FALSE(matches(g, "2. e4 e5\n2. e4 e5\n"));
}

TEST(Gbnf, Japanese) {
  const Grammar g = parse_gbnf(R"(root        ::= jp-char+ ([ \t\n] jp-char+)*
jp-char     ::= hiragana | katakana | punctuation | cjk
hiragana    ::= [ぁ-ゟ]
katakana    ::= [ァ-ヿ]
punctuation ::= [、-〾]
cjk         ::= [一-鿿]
)");
  EXPECT_TRUE(matches(g, "ひらがな カタカナ"));
  EXPECT_TRUE(matches(g, "漢字、かな。"));
  EXPECT_FALSE(matches(g, "abc"));
  EXPECT_FALSE(matches(g, "ひらがなa"));
  EXPECT_FALSE(matches(g, "ひらがな "));
  EXPECT_FALSE(matches(g, "\xE4\xB8"));  // the first two of 一's three bytes
  EXPECT_FALSE(matches(g, "한국어"));
}

TEST(Gbnf, Utf8Classes) {
  const Grammar greek = parse_gbnf("root ::= [α-ω]+");
  EXPECT_TRUE(matches(greek, "αβγω"));
  EXPECT_FALSE(matches(greek, "Α"));  // capital alpha, U+0391
  EXPECT_FALSE(matches(greek, "αa"));

  const Grammar emoji = parse_gbnf(R"(root ::= [\U0001F600-\U0001F64F]+)");
  EXPECT_TRUE(matches(emoji, "😀🙏"));
  EXPECT_FALSE(matches(emoji, "😀x"));
  EXPECT_FALSE(matches(emoji, "🚀"));  // U+1F680
  EXPECT_FALSE(matches(emoji, "\xF0\x9F\x98"));

  // A negated class matches whole characters: never the lead byte of one and then something else.
  const Grammar negated = parse_gbnf(R"(root ::= [^a] "b")");
  EXPECT_TRUE(matches(negated, "éb"));
  EXPECT_TRUE(matches(negated, "😀b"));
  EXPECT_TRUE(matches(negated, "\nb"));
  EXPECT_FALSE(matches(negated, "ab"));
  EXPECT_FALSE(matches(negated, "\xC3" "b"));
  EXPECT_FALSE(matches(negated, "\xFF" "b"));
  EXPECT_FALSE(matches(negated, "\xED\xA0\x80" "b"));  // an encoded surrogate

  const Grammar mixed = parse_gbnf(R"(root ::= [a-cé\u4E00-\u4E01\x30]+)");
  EXPECT_TRUE(matches(mixed, "abcé一丁0"));
  EXPECT_FALSE(matches(mixed, "d"));
  EXPECT_FALSE(matches(mixed, "丂"));  // U+4E02
}

TEST(Gbnf, AnyCharacter) {
  const Grammar g = parse_gbnf("root ::= . . .");
  EXPECT_TRUE(matches(g, "abc"));
  EXPECT_TRUE(matches(g, "aé😀"));
  EXPECT_TRUE(matches(g, "\n\t "));
  EXPECT_FALSE(matches(g, "ab"));
  EXPECT_FALSE(matches(g, "abcd"));
  EXPECT_FALSE(matches(g, "\xFF\xFE\xFD"));
  EXPECT_FALSE(matches(g, "a\xC3\xA9"  "\xC3"));
}

TEST(Gbnf, LiteralEscapes) {
  const Grammar g = parse_gbnf(R"(root ::= "\x41\u00e9\U0001F600\t\n\r\\\"\[\]é")");
  EXPECT_TRUE(matches(g, "Aé😀\t\n\r\\\"[]é"));
  EXPECT_FALSE(matches(g, "Aé😀\t\n\r\\\"[]"));
  // \xHH names a code point, as in llama.cpp: \xe9 is é's two UTF-8 bytes, not the byte 0xE9.
  const Grammar latin1 = parse_gbnf(R"(root ::= "\xe9")");
  EXPECT_TRUE(matches(latin1, "é"));
  EXPECT_FALSE(matches(latin1, "\xE9"));
}

TEST(Gbnf, ClassMembers) {
  EXPECT_TRUE(matches(parse_gbnf(R"(root ::= [a-]+)"), "a-a"));
  EXPECT_FALSE(matches(parse_gbnf(R"(root ::= [a-]+)"), "b"));
  EXPECT_TRUE(matches(parse_gbnf(R"(root ::= [-a]+)"), "-a"));
  EXPECT_TRUE(matches(parse_gbnf(R"(root ::= [\]\[]+)"), "][]"));
  EXPECT_TRUE(matches(parse_gbnf(R"(root ::= [#"]+ # a comment after a class holding '#')"), "#\"#"));
  const Grammar control = parse_gbnf(R"(root ::= [\x00-\x1F]+)");
  EXPECT_TRUE(matches(control, std::string("\x00\x1F\n", 3)));
  EXPECT_FALSE(matches(control, " "));
  const Grammar not_quote = parse_gbnf(R"(root ::= "\"" [^"\\]* "\"")");
  EXPECT_TRUE(matches(not_quote, "\"it's fine\""));
  EXPECT_FALSE(matches(not_quote, R"("a"b")"));
  EXPECT_FALSE(matches(not_quote, R"("a\b")"));
}

TEST(Gbnf, RepetitionBounds) {
  const Grammar exact = parse_gbnf(R"(root ::= "a"{3})");
  EXPECT_FALSE(matches(exact, "aa"));
  EXPECT_TRUE(matches(exact, "aaa"));
  EXPECT_FALSE(matches(exact, "aaaa"));

  const Grammar range = parse_gbnf(R"(root ::= "a"{2,4})");
  EXPECT_FALSE(matches(range, "a"));
  EXPECT_TRUE(matches(range, "aa"));
  EXPECT_TRUE(matches(range, "aaa"));
  EXPECT_TRUE(matches(range, "aaaa"));
  EXPECT_FALSE(matches(range, "aaaaa"));

  const Grammar at_least = parse_gbnf(R"(root ::= "a"{2,})");
  EXPECT_FALSE(matches(at_least, "a"));
  EXPECT_TRUE(matches(at_least, "aa"));
  EXPECT_TRUE(matches(at_least, std::string(200, 'a')));

  const Grammar at_most = parse_gbnf(R"(root ::= "a"{0,2} "b")");
  EXPECT_TRUE(matches(at_most, "b"));
  EXPECT_TRUE(matches(at_most, "aab"));
  EXPECT_FALSE(matches(at_most, "aaab"));

  const Grammar spaced = parse_gbnf(R"(root ::= [0-9]{ 1 , 2 } "x" { 2 })");
  EXPECT_TRUE(matches(spaced, "7xx"));
  EXPECT_TRUE(matches(spaced, "42xx"));
  EXPECT_FALSE(matches(spaced, "123xx"));
  EXPECT_FALSE(matches(spaced, "7x"));

  // A repetition applies to the whole literal before it, as in llama.cpp.
  const Grammar literal = parse_gbnf(R"(root ::= "ab"{2} "c"+ "d"* "e"?)");
  EXPECT_TRUE(matches(literal, "ababc"));
  EXPECT_TRUE(matches(literal, "ababcccdde"));
  EXPECT_FALSE(matches(literal, "abbc"));
  EXPECT_FALSE(matches(literal, "abab"));
  EXPECT_FALSE(matches(literal, "ababcee"));

  const Grammar group = parse_gbnf(R"(root ::= ("x" | "yz"){1,3})");
  EXPECT_TRUE(matches(group, "x"));
  EXPECT_TRUE(matches(group, "yzxyz"));
  EXPECT_FALSE(matches(group, ""));
  EXPECT_FALSE(matches(group, "xxxx"));
  EXPECT_FALSE(matches(group, "y"));

  const Grammar large = parse_gbnf(R"(root ::= "ab"{500} [0-9]{1000})");
  std::string text;
  for (int i = 0; i < 500; ++i) text += "ab";
  EXPECT_TRUE(matches(large, text + std::string(1000, '5')));
  EXPECT_FALSE(matches(large, text + std::string(1001, '5')));
  EXPECT_FALSE(matches(large, text + std::string(999, '5')));
}

TEST(Gbnf, Layout) {
  // CRLF line ends, comments everywhere, newlines after ::= and |, inside parentheses, forward references.
  const Grammar g = parse_gbnf(
      "# header comment\r\n"
      "\r\n"
      "root ::= greeting   # trailing comment\r\n"
      "greeting ::=\r\n"
      "    \"hello\" | # after a bar\r\n"
      "    \"bye\" (\r\n"
      "      \" \" name_2\r\n"
      "      # inside parentheses\r\n"
      "    )?\r\n"
      "name_2 ::= my-Name\r\n"
      "my-Name ::= [A-Z] [a-z]*");
  EXPECT_TRUE(matches(g, "hello"));
  EXPECT_TRUE(matches(g, "bye"));
  EXPECT_TRUE(matches(g, "bye Ann"));
  EXPECT_FALSE(matches(g, "hello Ann"));
  EXPECT_FALSE(matches(g, "bye ann"));
}

TEST(Gbnf, EmptyAlternatives) {
  const Grammar g = parse_gbnf(R"(root ::= "a" | )");
  EXPECT_TRUE(matches(g, ""));
  EXPECT_TRUE(matches(g, "a"));
  EXPECT_FALSE(matches(g, "aa"));
  const Grammar group = parse_gbnf(R"(root ::= "x" () "" "y")");
  EXPECT_TRUE(matches(group, "xy"));
  EXPECT_FALSE(matches(group, "x"));
}

TEST(Gbnf, ErrorsNameThePosition) {
  EXPECT_TRUE(fails_with("root ::= foo\n", {"gbnf: line 1, column 10", "undefined rule 'foo'"}));
  EXPECT_TRUE(fails_with("root ::= a\na ::= \"x\" bar\n", {"line 2, column 11", "undefined rule 'bar'"}));
  EXPECT_TRUE(fails_with("root ::= \"abc\n", {"line 1, column 10", "unterminated string literal"}));
  EXPECT_TRUE(fails_with("root ::= \"abc", {"line 1, column 10", "unterminated string literal"}));
  EXPECT_TRUE(fails_with("root ::= [abc", {"line 1, column 10", "unterminated character class"}));
  EXPECT_TRUE(fails_with("root ::= [abc\n]", {"line 1, column 10", "unterminated character class"}));
  EXPECT_TRUE(fails_with(R"(root ::= "\q")", {"line 1, column 11", "bad escape", "'q'"}));
  EXPECT_TRUE(fails_with(R"(root ::= [\d])", {"line 1, column 11", "bad escape"}));
  EXPECT_TRUE(fails_with(R"(root ::= "\x4")", {"line 1, column 11", "bad escape", "2 hex digits"}));
  EXPECT_TRUE(fails_with(R"(root ::= "\uD800")", {"line 1, column 11", "surrogate"}));
  EXPECT_TRUE(fails_with(R"(root ::= "\U00110000")", {"line 1, column 11", "past U+10FFFF"}));
  EXPECT_TRUE(fails_with("root = \"a\"", {"line 1, column 6", "expected '::='", "'root'"}));
  EXPECT_TRUE(fails_with("\n\nexpr\n", {"line 3, column 5", "expected '::='"}));
  EXPECT_TRUE(fails_with("expr ::= \"a\"\nterm ::= expr", {"line 1, column 1", "no rule named 'root'", "expr, term"}));
  EXPECT_TRUE(fails_with("", {"line 1, column 1", "defines no rules"}));
  EXPECT_TRUE(fails_with("# only a comment\n\n", {"line 1, column 1", "defines no rules"}));
  EXPECT_TRUE(fails_with("root ::= expr\nexpr ::= expr \"+\" \"1\" | \"1\"\n",
                         {"line 2, column 1", "'expr' is left-recursive"}));
  EXPECT_TRUE(fails_with("root ::= \"a\" root", {"line 1, column 1", "'root' never ends"}));
  EXPECT_TRUE(fails_with("root ::= \"a\"\n  | \"b\"",
                         {"line 2, column 3", "expected a rule name, found '|'", "inside parentheses"}));
  EXPECT_TRUE(fails_with("root ::= (\"a\" \"b\"", {"line 1, column 18", "expected ')'", "line 1, column 10"}));
  EXPECT_TRUE(fails_with("root ::= \"a\")", {"line 1, column 13", "')' without a matching '('"}));
  EXPECT_TRUE(fails_with("root ::= *\"a\"", {"line 1, column 10", "'*' must follow something to repeat"}));
  EXPECT_TRUE(fails_with("root ::= \"a\"\nroot ::= \"b\"", {"line 2, column 1", "defined twice", "line 1, column 1"}));
  EXPECT_TRUE(fails_with(R"(root ::= "a"{3,2})", {"line 1, column 13", "maximum below its minimum"}));
  EXPECT_TRUE(fails_with(R"(root ::= "a"{x})", {"line 1, column 14", "expected a number"}));
  EXPECT_TRUE(fails_with(R"(root ::= "a"{2;})", {"line 1, column 15", "expected ',' or '}'"}));
  EXPECT_TRUE(fails_with(R"(root ::= "a"{20000})", {"line 1, column 13", "larger than"}));
  EXPECT_TRUE(fails_with(R"(root ::= [z-a])", {"line 1, column 11", "'z-a' is reversed"}));
  EXPECT_TRUE(fails_with(R"(root ::= [])", {"line 1, column 10", "matches no character"}));
  EXPECT_TRUE(fails_with("root ::= \"a\" ::= \"b\"", {"line 1, column 14", "expected the end of rule 'root'"}));
  EXPECT_TRUE(fails_with("root ::= \"\xFF\"", {"line 1, column 11", "invalid UTF-8"}));
  // A repetition of something that can match nothing would be left-recursive: the position is its operator.
  EXPECT_TRUE(fails_with("root ::= (\"a\"?)*", {"line 1, column 16", "can match the empty string"}));
  EXPECT_TRUE(fails_with("root ::= \"x\" ws+\nws ::= [ ]*", {"line 1, column 16", "can match the empty string"}));
  // Left recursion through a repetition that does consume is reported as such.
  EXPECT_TRUE(fails_with("root ::= (root \"a\")* \"b\"", {"line 1, column 1", "left-recursive"}));
  // Columns count characters, not bytes.
  EXPECT_TRUE(fails_with("root ::= \"é\" foo", {"line 1, column 14", "undefined rule 'foo'"}));
  EXPECT_TRUE(fails_with("root ::= " + std::string(300, '(') + "\"a\"" + std::string(300, ')'), {"nested more than"}));
}

}  // namespace
}  // namespace qinfer::grammar
