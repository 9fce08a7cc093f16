#include "grammar/regex.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "grammar/utf8_text.h"

namespace qinfer::grammar {
namespace {

// Groups nested past this are no pattern anyone writes, and parsing and compiling recurse per level.
constexpr int kMaxNesting = 200;
// A repeated sequence longer than this, copied more than once, goes into a rule of its own so that
// `(long literal){1000}` costs one element per copy.
constexpr int64_t kMaxInlineRepeat = 64;
// Patterns in messages are cut to this many bytes.
constexpr size_t kMaxQuoted = 60;

struct Node;
using NodePtr = std::shared_ptr<const Node>;

// The parsed pattern. Nodes are shared, never changed: the rewrite of nullable repetitions reuses them.
struct Node {
  enum class Kind : uint8_t { text, chars, concat, alternation, repeat };
  Kind kind;
  std::string text;                    // text: UTF-8 bytes
  std::vector<CodePointRange> ranges;  // chars: sorted, merged, not empty
  std::vector<NodePtr> children;       // concat (none: the empty string), alternation; repeat: the item
  int64_t min = 0, max = 0;            // repeat; max < 0: unbounded
  size_t offset = 0;                   // repeat: where its quantifier is, for messages
  bool nullable = false;               // matches the empty string
};

NodePtr make_text(std::string text) {
  return std::make_shared<const Node>(Node{.kind = Node::Kind::text, .text = std::move(text)});
}

NodePtr make_chars(std::vector<CodePointRange> ranges) {
  return std::make_shared<const Node>(Node{.kind = Node::Kind::chars, .ranges = std::move(ranges)});
}

NodePtr make_concat(std::vector<NodePtr> children) {
  if (children.size() == 1) return children[0];
  bool nullable = true;
  for (const NodePtr& c : children) nullable &= c->nullable;
  return std::make_shared<const Node>(
      Node{.kind = Node::Kind::concat, .children = std::move(children), .nullable = nullable});
}

NodePtr make_alternation(std::vector<NodePtr> children) {
  if (children.size() == 1) return children[0];
  bool nullable = false;
  for (const NodePtr& c : children) nullable |= c->nullable;
  return std::make_shared<const Node>(
      Node{.kind = Node::Kind::alternation, .children = std::move(children), .nullable = nullable});
}

NodePtr make_repeat(NodePtr item, int64_t min, int64_t max, size_t offset) {
  const bool nullable = min == 0 || item->nullable;
  return std::make_shared<const Node>(Node{.kind = Node::Kind::repeat,
                                           .children = {std::move(item)},
                                           .min = min,
                                           .max = max,
                                           .offset = offset,
                                           .nullable = nullable});
}

// The node's language without the empty string; null when nothing is left. Grammar::repeat needs
// an item that consumes a byte (a nullable one would be left-recursive), and X{m,n} with X nullable
// is the same language as (X without the empty string){0,n}.
NodePtr non_empty(const NodePtr& node) {
  if (!node->nullable) return node;
  switch (node->kind) {
    case Node::Kind::text:
    case Node::Kind::chars: return nullptr;  // only "" is nullable here
    case Node::Kind::alternation: {
      std::vector<NodePtr> kept;
      for (const NodePtr& c : node->children)
        if (NodePtr n = non_empty(c)) kept.push_back(std::move(n));
      return kept.empty() ? nullptr : make_alternation(std::move(kept));
    }
    case Node::Kind::concat: {
      // Every child is nullable: a non-empty match has a first child that matches something.
      std::vector<NodePtr> alternatives;
      const auto& c = node->children;
      for (size_t i = 0; i < c.size(); ++i) {
        NodePtr first = non_empty(c[i]);
        if (!first) continue;
        std::vector<NodePtr> rest{std::move(first)};
        rest.insert(rest.end(), c.begin() + static_cast<ptrdiff_t>(i) + 1, c.end());
        alternatives.push_back(make_concat(std::move(rest)));
      }
      return alternatives.empty() ? nullptr : make_alternation(std::move(alternatives));
    }
    case Node::Kind::repeat: {
      const NodePtr& item = node->children[0];
      NodePtr y = item->nullable ? non_empty(item) : item;
      if (!y || node->max == 0) return nullptr;
      return make_repeat(std::move(y), 1, node->max, node->offset);
    }
  }
  return nullptr;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_word(char c) { return is_digit(c) || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// JavaScript's classes (JSON Schema patterns are ECMA-262): ASCII digits and word characters, and
// the Unicode white space of \s.
const std::vector<CodePointRange> kDigits{{'0', '9'}};
const std::vector<CodePointRange> kWord{{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
const std::vector<CodePointRange> kSpace = utf8::normalize({{'\t', '\r'},
                                                            {' ', ' '},
                                                            {0xA0, 0xA0},
                                                            {0x1680, 0x1680},
                                                            {0x2000, 0x200A},
                                                            {0x2028, 0x2029},
                                                            {0x202F, 0x202F},
                                                            {0x205F, 0x205F},
                                                            {0x3000, 0x3000},
                                                            {0xFEFF, 0xFEFF}});

std::string quoted(std::string_view pattern) {
  if (pattern.size() <= kMaxQuoted) return std::string(pattern);
  size_t cut = kMaxQuoted;
  while (cut > 0 && (static_cast<uint8_t>(pattern[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  return std::string(pattern.substr(0, cut)) + "...";
}

[[noreturn]] void fail_at(std::string_view pattern, size_t offset, std::string_view message) {
  fail("regex '{}', offset {}: {}", quoted(pattern), offset, message);
}

// One code point or a class, as an escape or class member gives it.
struct Atom {
  bool is_set = false;
  uint32_t code_point = 0;
  std::vector<CodePointRange> set;
};

class Parser {
 public:
  explicit Parser(std::string_view pattern) : p_(pattern) {}

  NodePtr parse() {
    NodePtr node = parse_alternation(0);
    if (!at_end()) fail_here(pos_, "')' without a matching '('");
    return node;
  }

 private:
  bool at_end() const { return pos_ >= p_.size(); }
  bool at(char c) const { return pos_ < p_.size() && p_[pos_] == c; }
  bool at(std::string_view s) const { return p_.substr(pos_).starts_with(s); }
  [[noreturn]] void fail_here(size_t offset, std::string_view message) const { fail_at(p_, offset, message); }

  NodePtr parse_alternation(int depth) {
    std::vector<NodePtr> alternatives{parse_concat(depth)};
    while (at('|')) {
      ++pos_;
      alternatives.push_back(parse_concat(depth));
    }
    return make_alternation(std::move(alternatives));
  }

  NodePtr parse_concat(int depth) {
    std::vector<NodePtr> items;
    while (!at_end() && !at('|') && !at(')')) {
      const size_t start = pos_;
      // Anchors assert a position, which a grammar cannot: only where the whole-string match makes
      // them true anyway, at the start or end of the pattern or of one of its top-level alternatives.
      if (at('^') || at("\\A")) {
        pos_ += at('^') ? 1 : 2;
        if (depth > 0 || !items.empty())
          fail_here(start, fmt::format("anchor '{}' inside the pattern is not supported (only at its start)",
                                       p_.substr(start, pos_ - start)));
        continue;
      }
      if (at('$') || at("\\Z") || at("\\z")) {
        pos_ += at('$') ? 1 : 2;
        if (depth > 0 || !(at_end() || at('|')))
          fail_here(start, fmt::format("anchor '{}' inside the pattern is not supported (only at its end)",
                                       p_.substr(start, pos_ - start)));
        continue;
      }
      items.push_back(parse_quantified(parse_atom(depth)));
    }
    return make_concat(std::move(items));
  }

  NodePtr parse_quantified(NodePtr atom) {
    const size_t start = pos_;
    int64_t min = 0, max = 0;
    if (!parse_quantifier(min, max)) return atom;
    if (max >= 0 && max < min)
      fail_here(start,
                fmt::format("repetition '{}' has its maximum below its minimum", p_.substr(start, pos_ - start)));
    if (at('?')) {
      ++pos_;  // lazy: the same strings match, only the choice among matches differs
    } else if (at('+')) {
      fail_here(start, fmt::format("possessive quantifier '{}' is not supported", p_.substr(start, pos_ + 1 - start)));
    }
    const size_t next = pos_;
    int64_t more_min = 0, more_max = 0;
    if (parse_quantifier(more_min, more_max))
      fail_here(next, fmt::format("quantifier '{}' follows another quantifier; put the repeated part in a group",
                                  p_.substr(next, pos_ - next)));
    return make_repeat(std::move(atom), min, max, start);
  }

  bool parse_quantifier(int64_t& min, int64_t& max) {
    if (at('*') || at('+') || at('?')) {
      min = at('+') ? 1 : 0;
      max = at('?') ? 1 : -1;
      ++pos_;
      return true;
    }
    size_t end = 0;
    if (at('{') && bounds(pos_, min, max, end)) {
      pos_ = end;
      return true;
    }
    return false;
  }

  // {m} {m,} {m,n} {,n} starting at p_[open] == '{'; anything else is a literal '{', as in Python
  // and JavaScript.
  bool bounds(size_t open, int64_t& min, int64_t& max, size_t& end) const {
    size_t i = open + 1;
    const auto number = [&](int64_t& n) {
      const size_t first = i;
      for (n = 0; i < p_.size() && is_digit(p_[i]); ++i) {
        if (i - first >= 9) fail_here(open, "repetition count too large");
        n = n * 10 + (p_[i] - '0');
      }
      return i > first;
    };
    int64_t lo = 0, hi = 0;
    const bool has_lo = number(lo);
    if (i < p_.size() && p_[i] == '}') {
      if (!has_lo) return false;
      min = max = lo;
      end = i + 1;
      return true;
    }
    if (i >= p_.size() || p_[i] != ',') return false;
    ++i;
    const bool has_hi = number(hi);
    if (i >= p_.size() || p_[i] != '}' || (!has_lo && !has_hi)) return false;
    min = lo;
    max = has_hi ? hi : -1;
    end = i + 1;
    return true;
  }

  NodePtr parse_atom(int depth) {
    const size_t start = pos_;
    const char c = p_[pos_];
    switch (c) {
      case '(': return parse_group(depth);
      case '[': return parse_class();
      case '.': ++pos_; return make_chars({{0, '\n' - 1}, {'\n' + 1, utf8::kMaxCodePoint}});
      case '\\': {
        Atom a = parse_escape(false);
        return a.is_set ? make_chars(std::move(a.set)) : text_of(a.code_point);
      }
      case '*':
      case '+':
      case '?': fail_here(start, fmt::format("quantifier '{}' has nothing to repeat", c));
      case '{': {
        int64_t min = 0, max = 0;
        size_t end = 0;
        if (bounds(pos_, min, max, end))
          fail_here(start, fmt::format("quantifier '{}' has nothing to repeat", p_.substr(start, end - start)));
        ++pos_;
        return make_text("{");
      }
      default: return text_of(parse_code_point());
    }
  }

  static NodePtr text_of(uint32_t code_point) {
    std::string bytes;
    utf8::append(bytes, code_point);
    return make_text(std::move(bytes));
  }

  uint32_t parse_code_point() {
    const size_t start = pos_;
    const int64_t c = utf8::decode(p_, pos_);
    if (c < 0) fail_here(start, "invalid UTF-8 in the pattern");
    return static_cast<uint32_t>(c);
  }

  NodePtr parse_group(int depth) {
    const size_t open = pos_++;
    if (depth >= kMaxNesting) fail_here(open, fmt::format("groups nested more than {} deep", kMaxNesting));
    if (at('?')) {
      if (at("?:")) {
        pos_ += 2;
      } else if (at("?=") || at("?!")) {
        fail_here(open, fmt::format("lookahead '({}' is not supported: a grammar cannot look ahead",
                                    p_.substr(pos_, 2)));
      } else if (at("?<=") || at("?<!")) {
        fail_here(open, fmt::format("lookbehind '({}' is not supported: a grammar cannot look behind",
                                    p_.substr(pos_, 3)));
      } else if (at("?P=")) {
        fail_here(open, "backreference '(?P=' is not supported: a grammar cannot match repeated text");
      } else if (at("?P<") || at("?<")) {
        // A named group is a plain group here: nothing refers to its name.
        pos_ += at("?P<") ? 3 : 2;
        const size_t name = pos_;
        while (!at_end() && is_word(p_[pos_])) ++pos_;
        if (pos_ == name || is_digit(p_[name]) || !at('>')) fail_here(open, "bad group name (expected '(?<name>')");
        ++pos_;
      } else {
        fail_here(open, fmt::format("group '({}' is not supported (inline flags, comments, atomic groups and "
                                    "conditionals are not)",
                                    p_.substr(pos_, std::min<size_t>(2, p_.size() - pos_))));
      }
    }
    NodePtr inner = parse_alternation(depth + 1);
    if (!at(')')) fail_here(open, "unterminated group: no ')' closes this '('");
    ++pos_;
    return inner;
  }

  NodePtr parse_class() {
    const size_t open = pos_++;
    const bool negated = at('^');
    if (negated) ++pos_;
    std::vector<CodePointRange> set;
    // A ']' first is a member, as in Python (`[]a]`, `[^]a]`).
    for (bool first = true;; first = false) {
      if (at_end()) fail_here(open, "unterminated character class: no ']' closes this '['");
      if (at(']') && !first) {
        ++pos_;
        break;
      }
      const size_t member = pos_;
      Atom lo = parse_class_atom();
      if (lo.is_set) {
        set.insert(set.end(), lo.set.begin(), lo.set.end());
        continue;
      }
      uint32_t hi = lo.code_point;
      // A '-' first, last or after a class shorthand is a member.
      if (at('-') && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        Atom end = parse_class_atom();
        if (end.is_set)
          fail_here(member,
                    fmt::format("character range '{}' ends in a class shorthand", p_.substr(member, pos_ - member)));
        hi = end.code_point;
        if (hi < lo.code_point)
          fail_here(member, fmt::format("character range '{}' is reversed (its end comes before its start)",
                                        p_.substr(member, pos_ - member)));
      }
      set.emplace_back(lo.code_point, hi);
    }
    set = utf8::normalize(std::move(set));
    if (negated) set = utf8::complement(set);
    if (set.empty()) fail_here(open, "character class matches no character");
    return make_chars(std::move(set));
  }

  Atom parse_class_atom() {
    if (at('\\')) return parse_escape(true);
    return {.code_point = parse_code_point()};
  }

  Atom parse_escape(bool in_class) {
    const size_t start = pos_++;
    if (at_end()) fail_here(start, "the pattern ends in a lone '\\'");
    // An escaped non-ASCII character is itself.
    if (static_cast<uint8_t>(p_[pos_]) >= 0x80) return {.code_point = parse_code_point()};
    const char c = p_[pos_++];
    const auto set = [](std::vector<CodePointRange> ranges) { return Atom{.is_set = true, .set = std::move(ranges)}; };
    switch (c) {
      case 'd': return set(kDigits);
      case 'D': return set(utf8::complement(kDigits));
      case 'w': return set(kWord);
      case 'W': return set(utf8::complement(kWord));
      case 's': return set(kSpace);
      case 'S': return set(utf8::complement(kSpace));
      case 'n': return {.code_point = '\n'};
      case 't': return {.code_point = '\t'};
      case 'r': return {.code_point = '\r'};
      case 'f': return {.code_point = '\f'};
      case 'v': return {.code_point = '\v'};
      case '0':
        if (!at_end() && is_digit(p_[pos_])) fail_here(start, "octal escapes are not supported (use \\xHH)");
        return {.code_point = 0};
      case 'x': return {.code_point = parse_hex(start, 2)};
      case 'U': return {.code_point = parse_hex(start, 8)};
      case 'u': return {.code_point = parse_unicode_escape(start)};
      case 'b':
        if (in_class) return {.code_point = '\b'};  // backspace inside a class, as in Python and JavaScript
        fail_here(start, "word boundary '\\b' is not supported: a grammar cannot look at the neighbouring characters");
      case 'B':
        fail_here(start, "word boundary '\\B' is not supported: a grammar cannot look at the neighbouring characters");
      case 'k': fail_here(start, "backreference '\\k' is not supported: a grammar cannot match repeated text");
      case 'p':
      case 'P': fail_here(start, fmt::format("Unicode property escape '\\{}' is not supported", c));
      default: break;
    }
    if (c >= '1' && c <= '9')
      fail_here(start, fmt::format("backreference '\\{}' is not supported: a grammar cannot match repeated text", c));
    if (is_word(c)) fail_here(start, fmt::format("unsupported escape '\\{}'", c));
    return {.code_point = static_cast<uint8_t>(c)};  // an escaped metacharacter or punctuation is itself
  }

  // \uHHHH, a UTF-16 pair \uHHHH\uHHHH (JSON Schema patterns come from JavaScript), or \u{H...}.
  uint32_t parse_unicode_escape(size_t start) {
    if (at('{')) {
      ++pos_;
      uint32_t c = 0;
      int digits = 0;
      for (; !at_end() && hex_value(p_[pos_]) >= 0; ++pos_, ++digits) {
        c = c * 16 + static_cast<uint32_t>(hex_value(p_[pos_]));
        if (c > utf8::kMaxCodePoint) fail_here(start, "escape '\\u{...}' is past U+10FFFF");
      }
      if (digits == 0 || !at('}')) fail_here(start, "bad escape '\\u{': expected hex digits and '}'");
      ++pos_;
      if (utf8::is_surrogate(c))
        fail_here(start, fmt::format("escape '{}' is a lone UTF-16 surrogate", p_.substr(start, pos_ - start)));
      return c;
    }
    const uint32_t c = parse_hex(start, 4, true);
    if (c >= 0xD800 && c <= 0xDBFF && at("\\u")) {
      const size_t low_start = pos_;
      pos_ += 2;
      const uint32_t low = parse_hex(low_start, 4, true);
      if (low >= 0xDC00 && low <= 0xDFFF) return 0x10000 + ((c - 0xD800) << 10) + (low - 0xDC00);
      pos_ = low_start;
    }
    if (utf8::is_surrogate(c))
      fail_here(start, fmt::format("escape '{}' is a lone UTF-16 surrogate", p_.substr(start, pos_ - start)));
    return c;
  }

  uint32_t parse_hex(size_t start, int digits, bool surrogates_ok = false) {
    uint32_t c = 0;
    for (int i = 0; i < digits; ++i, ++pos_) {
      const int d = at_end() ? -1 : hex_value(p_[pos_]);
      if (d < 0) fail_here(start, fmt::format("bad escape '\\{}': expected {} hex digits", p_[start + 1], digits));
      c = c * 16 + static_cast<uint32_t>(d);
    }
    const std::string_view escape = p_.substr(start, pos_ - start);
    if (c > utf8::kMaxCodePoint) fail_here(start, fmt::format("escape '{}' is past U+10FFFF", escape));
    if (!surrogates_ok && utf8::is_surrogate(c))
      fail_here(start, fmt::format("escape '{}' is a lone UTF-16 surrogate", escape));
    return c;
  }

  std::string_view p_;
  size_t pos_ = 0;
};

class Compiler {
 public:
  Compiler(Grammar& g, std::string_view pattern) : g_(g), pattern_(pattern) {}

  Sequence compile(const NodePtr& node) {
    switch (node->kind) {
      case Node::Kind::text: return g_.literal(node->text);
      case Node::Kind::chars: return {chars(node->ranges)};
      case Node::Kind::concat: {
        Sequence out;
        for (const NodePtr& c : node->children) {
          Sequence part = compile(c);
          out.insert(out.end(), part.begin(), part.end());
        }
        return out;
      }
      case Node::Kind::alternation: {
        std::vector<Sequence> alternatives;
        for (const NodePtr& c : node->children) alternatives.push_back(compile(c));
        return {g_.choice(g_.unique_name("regex-group"), std::move(alternatives))};
      }
      case Node::Kind::repeat: return repeat(*node);
    }
    return {};
  }

 private:
  Element chars(const std::vector<CodePointRange>& ranges) {
    if (const auto it = classes_.find(ranges); it != classes_.end()) return it->second;
    const Element e = g_.utf8_class(ranges, false);
    classes_.emplace(ranges, e);
    return e;
  }

  Sequence repeat(const Node& node) {
    NodePtr item = node.children[0];
    int64_t min = node.min;
    if (item->nullable) {
      item = non_empty(item);
      min = 0;
    }
    if (!item || node.max == 0) return {};
    Sequence body = compile(item);
    if (min == 1 && node.max == 1) return body;
    const int64_t copies = std::max<int64_t>(min, 1) + (node.max < 0 ? 1 : node.max - min);
    if (body.size() > 1 && static_cast<int64_t>(body.size()) * copies > kMaxInlineRepeat)
      body = {g_.choice(g_.unique_name("regex-item"), {std::move(body)})};
    try {
      return {g_.repeat(g_.unique_name("regex-repeat"), std::move(body), min, node.max)};
    } catch (const Error& e) {
      std::string_view message = e.what();
      if (message.starts_with("grammar: ")) message.remove_prefix(9);
      fail_at(pattern_, node.offset, message);
    }
  }

  Grammar& g_;
  std::string_view pattern_;
  std::map<std::vector<CodePointRange>, Element> classes_;
};

}  // namespace

Element compile_regex(Grammar& g, std::string_view pattern) {
  const NodePtr node = Parser(pattern).parse();
  Sequence sequence = Compiler(g, pattern).compile(node);
  if (sequence.size() == 1) return sequence[0];
  return g.choice(g.unique_name("regex"), {std::move(sequence)});
}

Grammar regex_grammar(std::string_view pattern) {
  Grammar g;
  const int32_t root = g.add_rule("root");
  g.add_alternative(root, {compile_regex(g, pattern)});
  g.set_root(root);
  return g;
}

}  // namespace qinfer::grammar
