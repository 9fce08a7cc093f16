#include "grammar/grammar.h"

#include <algorithm>
#include <functional>
#include <map>

#include "grammar/utf8_text.h"

namespace qinfer::grammar {
namespace {

using utf8::kMaxCodePoint;
constexpr uint32_t kSurrogateLo = 0xD800, kSurrogateHi = 0xDFFF;
// A bounded repetition becomes one rule per optional copy: past this the grammar would be larger
// than anything a request should make the server build.
constexpr int64_t kMaxBoundedRepeat = 10000;

int utf8_length(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

std::array<uint8_t, 4> utf8_encode(uint32_t c) {
  switch (utf8_length(c)) {
    case 1: return {static_cast<uint8_t>(c)};
    case 2: return {static_cast<uint8_t>(0xC0 | (c >> 6)), static_cast<uint8_t>(0x80 | (c & 0x3F))};
    case 3:
      return {static_cast<uint8_t>(0xE0 | (c >> 12)), static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F)),
              static_cast<uint8_t>(0x80 | (c & 0x3F))};
    default:
      return {static_cast<uint8_t>(0xF0 | (c >> 18)), static_cast<uint8_t>(0x80 | ((c >> 12) & 0x3F)),
              static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F)), static_cast<uint8_t>(0x80 | (c & 0x3F))};
  }
}

// Sorted, merged, surrogates and values past U+10FFFF removed.
std::vector<CodePointRange> normalize(std::vector<CodePointRange> ranges) {
  std::vector<CodePointRange> clipped;
  for (auto [lo, hi] : ranges) {
    if (lo > hi || lo > kMaxCodePoint) continue;
    hi = std::min(hi, kMaxCodePoint);
    if (hi < kSurrogateLo || lo > kSurrogateHi) {
      clipped.emplace_back(lo, hi);
      continue;
    }
    if (lo < kSurrogateLo) clipped.emplace_back(lo, kSurrogateLo - 1);
    if (hi > kSurrogateHi) clipped.emplace_back(kSurrogateHi + 1, hi);
  }
  return utf8::normalize(std::move(clipped));
}

std::vector<CodePointRange> complement(const std::vector<CodePointRange>& ranges) {
  return normalize(utf8::complement(ranges));
}

// Splits [lo, hi] (code points of one UTF-8 length) until every byte of the encoding ranges
// independently: then the sequences of byte ranges [enc(lo)[i], enc(hi)[i]] are exactly the range.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (uint32_t{1} << (6 * i)) - 1;  // the low i continuation bytes
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        utf8_sequences(lo, lo | m, out);
        utf8_sequences((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        utf8_sequences(lo, (hi & ~m) - 1, out);
        utf8_sequences(hi & ~m, hi, out);
        return;
      }
    }
  }
  const auto a = utf8_encode(lo), b = utf8_encode(hi);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out.push_back(std::move(seq));
}

}  // namespace

int32_t Grammar::add_rule(std::string name) {
  names_.insert(name);
  rules_.push_back(Rule{std::move(name), {}});
  return static_cast<int32_t>(rules_.size() - 1);
}

void Grammar::add_alternative(int32_t rule, Sequence alternative) {
  QINFER_CHECK(rule >= 0 && rule < static_cast<int32_t>(rules_.size()), "grammar: no rule {}", rule);
  rules_[rule].alternatives.push_back(std::move(alternative));
}

int32_t Grammar::add_byte_set(const ByteSet& set) {
  for (size_t i = 0; i < byte_sets_.size(); ++i)
    if (byte_sets_[i] == set) return static_cast<int32_t>(i);
  byte_sets_.push_back(set);
  return static_cast<int32_t>(byte_sets_.size() - 1);
}

Element Grammar::byte(uint8_t b) {
  ByteSet set;
  set.add(b);
  return bytes(set);
}

Sequence Grammar::literal(std::string_view text) {
  Sequence seq;
  for (char c : text) seq.push_back(byte(static_cast<uint8_t>(c)));
  return seq;
}

Element Grammar::utf8_class(std::vector<CodePointRange> ranges, bool negated) {
  std::vector<CodePointRange> set = normalize(std::move(ranges));
  if (negated) set = complement(set);
  QINFER_CHECK(!set.empty(), "grammar: a character class that matches no character");
  // Split at the UTF-8 length boundaries first, then into byte-range sequences.
  std::vector<std::vector<std::pair<uint8_t, uint8_t>>> sequences;
  for (auto [lo, hi] : set) {
    for (uint32_t edge : {0x7Fu, 0x7FFu, 0xFFFFu}) {
      if (lo <= edge && hi > edge) {
        utf8_sequences(lo, edge, sequences);
        lo = edge + 1;
      }
    }
    utf8_sequences(lo, hi, sequences);
  }
  std::vector<Sequence> alternatives;
  for (const auto& seq : sequences) {
    Sequence alt;
    for (auto [lo, hi] : seq) {
      ByteSet s;
      s.add_range(lo, hi);
      alt.push_back(bytes(s));
    }
    alternatives.push_back(std::move(alt));
  }
  // One-byte alternatives merge into one set: fewer positions for the matcher to follow.
  ByteSet single;
  std::vector<Sequence> merged;
  for (auto& alt : alternatives) {
    if (alt.size() == 1) {
      const ByteSet& s = byte_sets_[alt[0].index];
      for (int w = 0; w < 4; ++w) single.words[w] |= s.words[w];
    } else {
      merged.push_back(std::move(alt));
    }
  }
  if (!single.empty()) merged.insert(merged.begin(), Sequence{bytes(single)});
  if (merged.size() == 1 && merged[0].size() == 1) return merged[0][0];
  return choice(unique_name("char"), std::move(merged));
}

Element Grammar::choice(std::string name, std::vector<Sequence> alternatives) {
  const int32_t id = add_rule(std::move(name));
  for (auto& alt : alternatives) add_alternative(id, std::move(alt));
  return rule(id);
}

Element Grammar::repeat(std::string name, Sequence item, int64_t min, int64_t max) {
  QINFER_CHECK(min >= 0 && (max < 0 || max >= min), "grammar: repetition {{{},{}}} of '{}' is empty", min, max, name);
  QINFER_CHECK(min <= kMaxBoundedRepeat && (max < 0 || max - min <= kMaxBoundedRepeat),
               "grammar: repetition {{{},{}}} of '{}' is larger than {} copies", min, max, name, kMaxBoundedRepeat);
  Sequence body;
  for (int64_t i = 0; i < min; ++i) body.insert(body.end(), item.begin(), item.end());
  if (max < 0) {
    // tail ::= item tail | ε
    const int32_t tail = add_rule(unique_name(name + "-tail"));
    Sequence more = item;
    more.push_back(rule(tail));
    add_alternative(tail, std::move(more));
    add_alternative(tail, {});
    body.push_back(rule(tail));
  } else if (max > min) {
    // opt_1 ::= item | ε; opt_j ::= item opt_{j-1} | ε
    int32_t previous = -1;
    for (int64_t j = 1; j <= max - min; ++j) {
      const int32_t opt = add_rule(unique_name(name + "-opt"));
      Sequence more = item;
      if (previous >= 0) more.push_back(rule(previous));
      add_alternative(opt, std::move(more));
      add_alternative(opt, {});
      previous = opt;
    }
    body.push_back(rule(previous));
  }
  return choice(std::move(name), {std::move(body)});
}

// A counter per base keeps this constant time: a bounded repetition asks for one name per copy.
std::string Grammar::unique_name(std::string_view base) {
  std::string name(base);
  int& n = next_suffix_[name];
  while (names_.count(name)) name = std::string(base) + "-" + std::to_string(++n);
  names_.insert(name);
  return name;
}

Element Grammar::text_until(std::string_view name, std::string_view end, const std::vector<std::string>& forbidden,
                            const Sequence& after, bool may_stop) {
  QINFER_CHECK(!end.empty(), "grammar: text_until needs a non-empty end");
  // The trie of the patterns; match: -1 none, 0 `end` ends here, 1 a forbidden pattern does (it
  // wins where both do: the text cannot contain it, even as the end's suffix).
  enum : int8_t { kNone = -1, kEnd = 0, kForbidden = 1 };
  std::vector<std::array<int32_t, 256>> go(1);
  go[0].fill(-1);
  std::vector<int8_t> match{kNone};
  std::vector<int32_t> fail{0};
  auto insert = [&](std::string_view pattern, int8_t kind) {
    int32_t node = 0;
    for (char c : pattern) {
      const uint8_t b = static_cast<uint8_t>(c);
      if (go[node][b] < 0) {
        go[node][b] = static_cast<int32_t>(go.size());
        go.emplace_back().fill(-1);
        match.push_back(kNone);
        fail.push_back(0);
      }
      node = go[node][b];
    }
    match[node] = std::max(match[node], kind);
  };
  insert(end, kEnd);
  for (const std::string& f : forbidden) {
    QINFER_CHECK(!f.empty(), "grammar: text_until's forbidden patterns must not be empty");
    insert(f, kForbidden);
  }
  // Failure links breadth first, completing the transitions into a full automaton.
  std::vector<int32_t> queue;
  for (int b = 0; b < 256; ++b) {
    int32_t& next = go[0][b];
    if (next < 0) {
      next = 0;
    } else {
      fail[next] = 0;
      queue.push_back(next);
    }
  }
  for (size_t i = 0; i < queue.size(); ++i) {
    const int32_t u = queue[i];
    match[u] = std::max(match[u], match[fail[u]]);
    for (int b = 0; b < 256; ++b) {
      int32_t& next = go[u][b];
      if (next < 0) {
        next = go[fail[u]][b];
      } else {
        fail[next] = go[fail[u]][b];
        queue.push_back(next);
      }
    }
  }
  // A rule per state where no pattern has matched yet.
  std::vector<int32_t> state(go.size(), -1);
  for (size_t u = 0; u < go.size(); ++u)
    if (match[u] == kNone) state[u] = add_rule(unique_name(name));
  for (size_t u = 0; u < go.size(); ++u) {
    if (state[u] < 0) continue;
    std::map<int32_t, ByteSet> by_next;
    for (int b = 0; b < 256; ++b)
      if (match[go[u][b]] != kForbidden) by_next[go[u][b]].add(static_cast<uint8_t>(b));
    for (const auto& [to, set] : by_next) {
      Sequence alt{bytes(set)};
      if (match[to] == kEnd)
        alt.insert(alt.end(), after.begin(), after.end());
      else
        alt.push_back(rule(state[to]));
      add_alternative(state[u], std::move(alt));
    }
    if (may_stop) add_alternative(state[u], {});
  }
  return rule(state[0]);
}

Element Grammar::embed(const Grammar& other) {
  QINFER_CHECK(other.root_ >= 0, "grammar: embedding a grammar without a root");
  std::vector<int32_t> sets(other.byte_sets_.size());
  for (size_t i = 0; i < sets.size(); ++i) sets[i] = add_byte_set(other.byte_sets_[i]);
  const int32_t base = static_cast<int32_t>(rules_.size());
  for (const Rule& r : other.rules_) add_rule(r.name);
  for (size_t i = 0; i < other.rules_.size(); ++i)
    for (const Sequence& alt : other.rules_[i].alternatives) {
      Sequence copy = alt;
      for (Element& e : copy) e.index = e.kind == Element::Kind::bytes ? sets[e.index] : base + e.index;
      add_alternative(base + static_cast<int32_t>(i), std::move(copy));
    }
  return rule(base + other.root_);
}

void Grammar::validate() const {
  const int32_t n = static_cast<int32_t>(rules_.size());
  QINFER_CHECK(root_ >= 0 && root_ < n, "grammar: no root rule");
  for (const Rule& r : rules_) {
    QINFER_CHECK(!r.alternatives.empty(), "grammar: rule '{}' has no alternatives", r.name);
    for (const Sequence& alt : r.alternatives)
      for (const Element& e : alt) {
        if (e.kind == Element::Kind::rule)
          QINFER_CHECK(e.index >= 0 && e.index < n, "grammar: rule '{}' refers to rule {}, which does not exist", r.name,
                       e.index);
        else
          QINFER_CHECK(e.index >= 0 && e.index < static_cast<int32_t>(byte_sets_.size()) && !byte_sets_[e.index].empty(),
                       "grammar: rule '{}' has a character class that matches nothing", r.name);
      }
  }
  // Nullable (derives the empty string) and productive (derives some finite string), to a fixpoint.
  std::vector<char> nullable(n, 0), productive(n, 0);
  for (bool changed = true; changed;) {
    changed = false;
    for (int32_t i = 0; i < n; ++i) {
      for (const Sequence& alt : rules_[i].alternatives) {
        bool all_nullable = true, all_productive = true;
        for (const Element& e : alt) {
          const bool is_rule = e.kind == Element::Kind::rule;
          all_nullable &= is_rule && nullable[e.index];
          all_productive &= !is_rule || productive[e.index];
        }
        if (all_nullable && !nullable[i]) nullable[i] = 1, changed = true;
        if (all_productive && !productive[i]) productive[i] = 1, changed = true;
      }
    }
  }
  for (int32_t i = 0; i < n; ++i)
    QINFER_CHECK(productive[i], "grammar: rule '{}' never ends (every alternative needs itself again)", rules_[i].name);
  // Left recursion: rule i can start with rule j when j appears after only nullable elements.
  std::vector<std::vector<int32_t>> starts(n);
  for (int32_t i = 0; i < n; ++i)
    for (const Sequence& alt : rules_[i].alternatives)
      for (const Element& e : alt) {
        if (e.kind != Element::Kind::rule) break;
        starts[i].push_back(e.index);
        if (!nullable[e.index]) break;
      }
  std::vector<char> state(n, 0);  // 0 unvisited, 1 on the path, 2 done
  std::vector<int32_t> path;
  std::function<void(int32_t)> visit = [&](int32_t i) {
    state[i] = 1;
    path.push_back(i);
    for (int32_t j : starts[i]) {
      if (state[j] == 1) {
        std::string cycle;
        for (auto it = std::find(path.begin(), path.end(), j); it != path.end(); ++it) cycle += rules_[*it].name + " -> ";
        fail("grammar: rule '{}' is left-recursive ({}{}); rewrite it to consume a character first", rules_[j].name,
             cycle, rules_[j].name);
      }
      if (state[j] == 0) visit(j);
    }
    path.pop_back();
    state[i] = 2;
  };
  for (int32_t i = 0; i < n; ++i)
    if (state[i] == 0) visit(i);
}

}  // namespace qinfer::grammar
