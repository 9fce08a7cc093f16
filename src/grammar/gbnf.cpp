#include "grammar/gbnf.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "grammar/utf8_text.h"

namespace qinfer::grammar {
namespace {

// Parentheses and stacked repetitions past this are no grammar anyone writes, and the compiler
// recurses once per level.
constexpr int kMaxNesting = 200;
// A repeated sequence longer than this, copied more than once, goes into a rule of its own so that
// `"long literal"{1000}` costs one element per copy.
constexpr int64_t kMaxInlineRepeat = 64;

struct Item;
using Alternatives = std::vector<std::vector<Item>>;

// One symbol as written. Parsing keeps these until every rule name is known: a rule may be used
// before its definition, and the names generated for groups must not take a name defined later.
struct Item {
  enum class Kind : uint8_t { literal, chars, ref, group, repeat };
  Kind kind;
  size_t pos;                          // where it starts in the text (for a repeat, its operator)
  std::string text;                    // literal: its UTF-8 bytes; ref: the rule name
  std::vector<CodePointRange> ranges;  // chars; '.' is a negated class of nothing
  bool negated = false;
  std::shared_ptr<Alternatives> group;
  std::shared_ptr<Item> repeated;
  int64_t min = 0, max = 0;  // repeat; max < 0: unbounded
  int depth = 1;             // groups and repetitions nested in it, itself included
};

struct Definition {
  std::string name;
  size_t pos;
  Alternatives body;
};

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_';
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// "line 3, column 7": both from 1, the column in code points as an editor counts it.
std::string location(std::string_view text, size_t pos) {
  pos = std::min(pos, text.size());
  size_t line = 1, line_start = 0;
  for (size_t i = 0; i < pos; ++i)
    if (text[i] == '\n') ++line, line_start = i + 1;
  return fmt::format("line {}, column {}", line, utf8::count_code_points(text, line_start, pos) + 1);
}

// What the text has at pos, for "expected X, found Y".
std::string describe(std::string_view text, size_t pos) {
  if (pos >= text.size()) return "the end of the grammar";
  if (text[pos] == '\n' || text[pos] == '\r') return "the end of the line";
  size_t end = pos;
  if (static_cast<uint8_t>(text[pos]) < 0x20 || utf8::decode(text, end) < 0)
    return fmt::format("byte 0x{:02X}", static_cast<uint8_t>(text[pos]));
  return fmt::format("'{}'", text.substr(pos, end - pos));
}

[[noreturn]] void fail_at(std::string_view text, size_t pos, std::string_view message) {
  fail("gbnf: {}: {}", location(text, pos), message);
}

// Grammar's messages start with "grammar: "; ours put the position there instead.
std::string_view without_prefix(const Error& e) {
  std::string_view message = e.what();
  if (message.starts_with("grammar: ")) message.remove_prefix(9);
  return message;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  std::vector<Definition> parse() {
    std::vector<Definition> definitions;
    skip_space(true);
    while (!at_end()) definitions.push_back(parse_rule());
    return definitions;
  }

 private:
  bool at_end() const { return pos_ >= text_.size(); }
  bool at(char c) const { return pos_ < text_.size() && text_[pos_] == c; }
  bool at_line_end() const { return at('\n') || at('\r'); }
  [[noreturn]] void fail_here(size_t pos, std::string_view message) const { fail_at(text_, pos, message); }

  // Blanks and # comments; line breaks too where the rule goes on (after `::=` or `|`, in parentheses).
  void skip_space(bool newlines) {
    while (!at_end()) {
      const char c = text_[pos_];
      if (c == '#') {
        while (!at_end() && !at_line_end()) ++pos_;
      } else if (c == ' ' || c == '\t' || (newlines && (c == '\n' || c == '\r'))) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  std::string parse_name() {
    const size_t start = pos_;
    while (!at_end() && is_name_char(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  Definition parse_rule() {
    const size_t start = pos_;
    if (!is_name_char(text_[pos_])) {
      // The usual cause: a rule continued on the next line outside parentheses.
      const bool continues = std::string_view("|\"[(.*+?{").find(text_[pos_]) != std::string_view::npos;
      fail_here(pos_, fmt::format("expected a rule name, found {}{}", describe(text_, pos_),
                                  continues ? " (a rule ends at a line break unless it is inside parentheses)" : ""));
    }
    std::string name = parse_name();
    skip_space(false);
    if (text_.substr(pos_, 3) != "::=")
      fail_here(pos_, fmt::format("expected '::=' after the rule name '{}', found {}", name, describe(text_, pos_)));
    pos_ += 3;
    skip_space(true);
    Alternatives body = parse_alternatives(false, 0);
    if (at('\r')) {
      pos_ += text_.substr(pos_, 2) == "\r\n" ? 2 : 1;
    } else if (at('\n')) {
      ++pos_;
    } else if (at(')')) {
      fail_here(pos_, "')' without a matching '('");
    } else if (!at_end()) {
      fail_here(pos_,
                fmt::format("expected the end of rule '{}' (a line break), found {}", name, describe(text_, pos_)));
    }
    skip_space(true);
    return {std::move(name), start, std::move(body)};
  }

  Alternatives parse_alternatives(bool nested, int depth) {
    Alternatives alternatives;
    alternatives.push_back(parse_sequence(nested, depth));
    while (at('|')) {
      ++pos_;
      skip_space(true);
      alternatives.push_back(parse_sequence(nested, depth));
    }
    return alternatives;
  }

  std::vector<Item> parse_sequence(bool nested, int depth) {
    std::vector<Item> items;
    while (!at_end()) {
      const size_t start = pos_;
      const char c = text_[pos_];
      if (c == '"') {
        items.push_back(parse_literal());
      } else if (c == '[') {
        items.push_back(parse_class());
      } else if (c == '.') {
        ++pos_;
        items.push_back({.kind = Item::Kind::chars, .pos = start, .negated = true});
      } else if (is_name_char(c)) {
        items.push_back({.kind = Item::Kind::ref, .pos = start, .text = parse_name()});
      } else if (c == '(') {
        if (depth >= kMaxNesting) fail_here(start, fmt::format("groups nested more than {} deep", kMaxNesting));
        ++pos_;
        skip_space(true);
        auto group = std::make_shared<Alternatives>(parse_alternatives(true, depth + 1));
        if (!at(')'))
          fail_here(pos_, fmt::format("expected ')' to close the '(' at {}, found {}", location(text_, start),
                                      describe(text_, pos_)));
        ++pos_;
        int inner = 0;
        for (const auto& alternative : *group)
          for (const Item& item : alternative) inner = std::max(inner, item.depth);
        items.push_back({.kind = Item::Kind::group, .pos = start, .group = std::move(group), .depth = inner + 1});
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (items.empty()) fail_here(start, fmt::format("'{}' must follow something to repeat", c));
        int64_t min = 0, max = -1;
        if (c == '{') {
          std::tie(min, max) = parse_bounds(nested);
        } else {
          ++pos_;
          if (c == '+') min = 1;
          if (c == '?') max = 1;
        }
        Item& last = items.back();
        if (depth + last.depth >= kMaxNesting)
          fail_here(start, fmt::format("repetitions nested more than {} deep", kMaxNesting));
        const int item_depth = last.depth + 1;
        auto repeated = std::make_shared<Item>(std::move(last));
        last = {.kind = Item::Kind::repeat, .pos = start, .repeated = std::move(repeated), .min = min, .max = max,
                .depth = item_depth};
      } else {
        break;
      }
      skip_space(nested);
    }
    return items;
  }

  Item parse_literal() {
    const size_t open = pos_++;
    std::string bytes;
    while (!at('"')) {
      if (at_end() || at_line_end()) fail_here(open, "unterminated string literal (no closing '\"' on its line)");
      utf8::append(bytes, parse_char());
    }
    ++pos_;
    return {.kind = Item::Kind::literal, .pos = open, .text = std::move(bytes)};
  }

  Item parse_class() {
    const size_t open = pos_++;
    Item item{.kind = Item::Kind::chars, .pos = open};
    if (at('^')) item.negated = true, ++pos_;
    const auto check_open = [&] {
      if (at_end() || at_line_end()) fail_here(open, "unterminated character class (no closing ']' on its line)");
    };
    for (check_open(); !at(']'); check_open()) {
      const size_t first = pos_;
      const uint32_t lo = parse_char();
      uint32_t hi = lo;
      // As in llama.cpp, a '-' just before the closing ']' is itself a member.
      if (at('-') && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        check_open();
        hi = parse_char();
        if (hi < lo)
          fail_here(first, fmt::format("character range '{}' is reversed (its end comes before its start)",
                                       text_.substr(first, pos_ - first)));
      }
      item.ranges.emplace_back(lo, hi);
    }
    ++pos_;
    return item;
  }

  // One code point of a literal or class: a UTF-8 character, or one of llama.cpp's escapes.
  uint32_t parse_char() {
    const size_t start = pos_;
    if (!at('\\')) {
      const int64_t c = utf8::decode(text_, pos_);
      if (c < 0) fail_here(start, "invalid UTF-8 in the grammar text");
      return static_cast<uint32_t>(c);
    }
    ++pos_;
    if (at_end() || at_line_end()) fail_here(start, "bad escape: '\\' at the end of the line");
    const char e = text_[pos_++];
    switch (e) {
      case 'n': return '\n';
      case 't': return '\t';
      case 'r': return '\r';
      case '\\':
      case '"':
      case '[':
      case ']': return static_cast<uint8_t>(e);
      case 'x': return parse_hex(start, 2);
      case 'u': return parse_hex(start, 4);
      case 'U': return parse_hex(start, 8);
      default:
        fail_here(start, fmt::format("bad escape: '\\' followed by {} (escapes are \\n \\t \\r \\\\ \\\" \\[ \\] \\xHH "
                                     "\\uHHHH \\UHHHHHHHH)",
                                     describe(text_, start + 1)));
    }
  }

  uint32_t parse_hex(size_t start, int digits) {
    uint32_t c = 0;
    for (int i = 0; i < digits; ++i, ++pos_) {
      const int d = at_end() ? -1 : hex_value(text_[pos_]);
      if (d < 0)
        fail_here(start, fmt::format("bad escape: '\\{}' needs {} hex digits, found {}", text_[start + 1], digits,
                                     describe(text_, pos_)));
      c = c * 16 + static_cast<uint32_t>(d);
    }
    const std::string_view escape = text_.substr(start, pos_ - start);
    if (c > utf8::kMaxCodePoint) fail_here(start, fmt::format("bad escape: '{}' is past U+10FFFF", escape));
    if (utf8::is_surrogate(c))
      fail_here(start, fmt::format("bad escape: '{}' is a UTF-16 surrogate, not a character", escape));
    return c;
  }

  std::pair<int64_t, int64_t> parse_bounds(bool nested) {
    const size_t open = pos_++;
    skip_space(nested);
    const int64_t min = parse_count();
    skip_space(nested);
    int64_t max = min;
    if (at(',')) {
      ++pos_;
      skip_space(nested);
      max = pos_ < text_.size() && is_digit(text_[pos_]) ? parse_count() : -1;
      skip_space(nested);
    }
    if (!at('}'))
      fail_here(pos_, fmt::format("expected {} in the repetition '{{' at {}, found {}",
                                  max == min ? "',' or '}'" : "'}'", location(text_, open), describe(text_, pos_)));
    ++pos_;
    if (max >= 0 && max < min)
      fail_here(open, fmt::format("repetition {{{},{}}} has its maximum below its minimum", min, max));
    return {min, max};
  }

  int64_t parse_count() {
    const size_t start = pos_;
    if (at_end() || !is_digit(text_[pos_]))
      fail_here(pos_, fmt::format("expected a number in the repetition, found {}", describe(text_, pos_)));
    int64_t n = 0;
    for (; pos_ < text_.size() && is_digit(text_[pos_]); ++pos_) {
      n = n * 10 + (text_[pos_] - '0');
      if (n > 1'000'000'000) fail_here(start, "repetition count too large");
    }
    return n;
  }

  std::string_view text_;
  size_t pos_ = 0;
};

class Compiler {
 public:
  Compiler(std::string_view text, Grammar& grammar) : text_(text), g_(grammar) {}

  void compile(const std::vector<Definition>& definitions) {
    if (definitions.empty()) fail_at(text_, 0, "the grammar defines no rules (expected 'root ::= ...')");
    // Every defined name first, so that the names unique_name makes for groups avoid them.
    for (const Definition& d : definitions) {
      const auto [it, inserted] = ids_.emplace(d.name, static_cast<int32_t>(g_.rules().size()));
      if (!inserted)
        fail_at(text_, d.pos,
                fmt::format("rule '{}' is defined twice (first at {})", d.name, location(text_, origin_[it->second])));
      g_.add_rule(d.name);
      origin_.push_back(d.pos);
    }
    for (const Definition& d : definitions)
      for (const auto& alternative : d.body) g_.add_alternative(ids_.at(d.name), sequence(alternative, d.name));
    const auto root = ids_.find("root");
    if (root == ids_.end()) {
      std::string names;
      for (size_t i = 0; i < definitions.size() && i < 8; ++i) names += (i ? ", " : "") + definitions[i].name;
      if (definitions.size() > 8) names += ", ...";
      fail_at(text_, definitions[0].pos,
              fmt::format("no rule named 'root' (the rule the grammar starts at); the rules are {}", names));
    }
    g_.set_root(root->second);
    validate();
  }

 private:
  Sequence sequence(const std::vector<Item>& items, const std::string& rule) {
    Sequence out;
    for (const Item& item : items) {
      Sequence part = compile(item, rule);
      out.insert(out.end(), part.begin(), part.end());
    }
    return out;
  }

  Sequence compile(const Item& item, const std::string& rule) {
    Sequence out = compile_item(item, rule);
    // The rules this item made come from its position (nested items claimed theirs first).
    origin_.resize(g_.rules().size(), item.pos);
    return out;
  }

  Sequence compile_item(const Item& item, const std::string& rule) {
    switch (item.kind) {
      case Item::Kind::literal: return g_.literal(item.text);
      case Item::Kind::chars: return {chars(item)};
      case Item::Kind::ref: {
        const auto it = ids_.find(item.text);
        if (it == ids_.end()) fail_at(text_, item.pos, fmt::format("undefined rule '{}'", item.text));
        return {Grammar::rule(it->second)};
      }
      case Item::Kind::group: {
        // One alternative needs no rule of its own: its elements go inline.
        if (item.group->size() == 1) return sequence(item.group->front(), rule);
        std::vector<Sequence> alternatives;
        for (const auto& alternative : *item.group) alternatives.push_back(sequence(alternative, rule));
        return {g_.choice(g_.unique_name(rule + "-group"), std::move(alternatives))};
      }
      case Item::Kind::repeat: return repeat(item, rule);
    }
    fail_at(text_, item.pos, "unknown item");
  }

  Element chars(const Item& item) {
    std::pair key{utf8::normalize(item.ranges), item.negated};
    if (const auto it = classes_.find(key); it != classes_.end()) return it->second;
    try {
      const Element e = g_.utf8_class(key.first, key.second);
      classes_.emplace(std::move(key), e);
      return e;
    } catch (const Error& e) {
      fail_at(text_, item.pos, without_prefix(e));
    }
  }

  Sequence repeat(const Item& item, const std::string& rule) {
    Sequence body = compile(*item.repeated, rule);
    if (body.empty() || item.max == 0) return {};
    if (item.min == 1 && item.max == 1) return body;
    const int64_t copies = std::max<int64_t>(item.min, 1) + (item.max < 0 ? 1 : item.max - item.min);
    if (body.size() > 1 && static_cast<int64_t>(body.size()) * copies > kMaxInlineRepeat)
      body = {g_.choice(g_.unique_name(rule + "-item"), {std::move(body)})};
    const size_t first_new = g_.rules().size();
    Sequence out;
    try {
      out = {g_.repeat(g_.unique_name(rule + "-repeat"), body, item.min, item.max)};
    } catch (const Error& e) {
      fail_at(text_, item.pos, without_prefix(e));
    }
    if (item.max < 0)
      for (size_t id = first_new; id < g_.rules().size(); ++id) unbounded_[static_cast<int32_t>(id)] = body;
    return out;
  }

  // Whether every rule derives the empty string, to a fixpoint.
  std::vector<char> nullable_rules() const {
    std::vector<char> nullable(g_.rules().size(), 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t i = 0; i < nullable.size(); ++i)
        for (const Sequence& alt : g_.rules()[i].alternatives) {
          const bool empty = std::all_of(alt.begin(), alt.end(), [&](const Element& e) {
            return e.kind == Element::Kind::rule && nullable[e.index];
          });
          if (empty && !nullable[i]) nullable[i] = 1, changed = true;
        }
    }
    return nullable;
  }

  // Grammar::validate names the rule at fault first ('name'); every rule's origin in the text is known.
  void validate() {
    try {
      g_.validate();
    } catch (const Error& e) {
      const std::string_view message = without_prefix(e);
      constexpr size_t npos = std::string_view::npos;
      size_t pos = 0;
      int32_t id = -1;
      const size_t open = message.find('\'');
      const size_t close = open == npos ? open : message.find('\'', open + 1);
      if (close != npos) {
        const std::string_view name = message.substr(open + 1, close - open - 1);
        for (size_t i = 0; i < g_.rules().size() && id < 0; ++i)
          if (g_.rules()[i].name == name) id = static_cast<int32_t>(i);
        if (id >= 0) pos = origin_[id];
      }
      // An unbounded repetition of something that can match nothing is the usual left recursion, and
      // the rule names it would show are generated ones: say what is wrong in the text's own terms.
      if (const auto it = unbounded_.find(id); it != unbounded_.end() && message.find("left-recursive") != npos) {
        const std::vector<char> nullable = nullable_rules();
        if (std::all_of(it->second.begin(), it->second.end(), [&](const Element& e) {
              return e.kind == Element::Kind::rule && nullable[e.index];
            }))
          fail_at(text_, pos,
                  "this repetition repeats something that can match the empty string, so it would loop without "
                  "consuming a character; make the repeated part consume at least one");
      }
      fail_at(text_, pos, message);
    }
  }

  std::string_view text_;
  Grammar& g_;
  std::map<std::string, int32_t> ids_;  // defined rules
  std::vector<size_t> origin_;          // per rule id: where in the text it comes from
  std::map<std::pair<std::vector<CodePointRange>, bool>, Element> classes_;
  std::map<int32_t, Sequence> unbounded_;  // the rules of each unbounded repetition: its item
};

}  // namespace

Grammar parse_gbnf(std::string_view text) {
  const std::vector<Definition> definitions = Parser(text).parse();
  Grammar grammar;
  Compiler(text, grammar).compile(definitions);
  return grammar;
}

}  // namespace qinfer::grammar
