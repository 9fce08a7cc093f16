#pragma once
// A context-free grammar over bytes: what every constraint (JSON Schema, JSON mode, regular
// expressions, choices, GBNF text) compiles to, and what the matcher runs as a pushdown automaton.
// Bytes, not code points, because tokens are byte strings and a byte-level BPE token may end inside a
// UTF-8 sequence: code-point classes are compiled to UTF-8 byte sequences (utf8_class).
#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "core/error.h"

namespace qinfer::grammar {

// A set of byte values: one step of the automaton matches one byte in it.
struct ByteSet {
  std::array<uint64_t, 4> words{};
  bool has(uint8_t b) const { return (words[b >> 6] >> (b & 63)) & 1; }
  void add(uint8_t b) { words[b >> 6] |= uint64_t{1} << (b & 63); }
  void add_range(uint8_t lo, uint8_t hi) {
    for (int b = lo; b <= hi; ++b) add(static_cast<uint8_t>(b));
  }
  bool empty() const { return (words[0] | words[1] | words[2] | words[3]) == 0; }
  bool operator==(const ByteSet&) const = default;
};

// One symbol of an alternative: a byte out of a set, or a rule.
struct Element {
  enum class Kind : uint8_t { bytes, rule };
  Kind kind;
  int32_t index;  // into Grammar::byte_sets() or Grammar::rules()
  bool operator==(const Element&) const = default;
};

using Sequence = std::vector<Element>;  // one alternative; empty matches the empty string

struct Rule {
  std::string name;
  std::vector<Sequence> alternatives;
};

// A code-point range [lo, hi], both inclusive.
using CodePointRange = std::pair<uint32_t, uint32_t>;

class Grammar {
 public:
  // A new rule with no alternatives yet (add them with add_alternative). Names are for messages and
  // GBNF references; they need not be unique (unique_name makes one that is).
  int32_t add_rule(std::string name);
  void add_alternative(int32_t rule, Sequence alternative);
  // The id of an equal set when one exists, so that equal classes share one id.
  int32_t add_byte_set(const ByteSet& set);

  // Element builders.
  Element bytes(const ByteSet& set) { return {Element::Kind::bytes, add_byte_set(set)}; }
  Element byte(uint8_t b);
  static Element rule(int32_t id) { return {Element::Kind::rule, id}; }
  // The elements matching exactly these bytes.
  Sequence literal(std::string_view text);
  // A rule matching one UTF-8 encoded code point in `ranges` (or, negated, one not in them: any
  // valid scalar value U+0000..U+10FFFF outside the ranges, surrogates excluded).
  Element utf8_class(std::vector<CodePointRange> ranges, bool negated);
  // A rule of the alternatives given.
  Element choice(std::string name, std::vector<Sequence> alternatives);
  // Repetitions of `item`: at least min, at most max (max < 0: unbounded). Right-recursive rules, so
  // the matcher's stacks grow with the count only where the repetition is unbounded.
  Element repeat(std::string name, Sequence item, int64_t min, int64_t max);
  Element optional(std::string name, Sequence item) { return repeat(std::move(name), std::move(item), 0, 1); }
  // Free text: any bytes in which none of `forbidden` occurs, up to and including the first
  // occurrence of `end`, then `after`; with `may_stop`, the text may also end anywhere before
  // that. One rule per state of the patterns' Aho–Corasick automaton.
  Element text_until(std::string_view name, std::string_view end, const std::vector<std::string>& forbidden,
                     const Sequence& after, bool may_stop);
  // The rules of `other` copied into this grammar; the element of its root.
  Element embed(const Grammar& other);

  std::string unique_name(std::string_view base);

  int32_t root() const { return root_; }
  void set_root(int32_t rule) { root_ = rule; }
  const std::vector<Rule>& rules() const { return rules_; }
  const std::vector<ByteSet>& byte_sets() const { return byte_sets_; }

  // Throws Error when the grammar cannot run: no root, a rule with no alternatives, an
  // empty byte set, or left recursion (a rule reaching itself before consuming a byte, which a
  // top-down matcher would expand forever).
  void validate() const;

 private:
  std::vector<Rule> rules_;
  std::vector<ByteSet> byte_sets_;
  std::unordered_set<std::string> names_;            // every name given, for unique_name
  std::unordered_map<std::string, int> next_suffix_;  // per base: the next suffix to try
  int32_t root_ = -1;
};

}  // namespace qinfer::grammar
