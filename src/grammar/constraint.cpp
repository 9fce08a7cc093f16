#include "grammar/constraint.h"

#include <fmt/format.h>

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace qinfer::grammar {
namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>";
constexpr int kMaxNewlinesAfterReasoning = 4;

// Any bytes not containing `pattern`, then `pattern`: one rule per state of the pattern's
// Knuth–Morris–Pratt automaton (state i: the text so far ends with the first i bytes of it).
Element free_text_then(Grammar& g, std::string_view pattern) {
  const int n = static_cast<int>(pattern.size());
  std::vector<int> fail(n + 1, 0);
  for (int i = 1, k = 0; i < n; ++i) {
    while (k > 0 && pattern[i] != pattern[k]) k = fail[k];
    if (pattern[i] == pattern[k]) ++k;
    fail[i + 1] = k;
  }
  const auto next = [&](int state, uint8_t b) {
    while (state > 0 && static_cast<uint8_t>(pattern[state]) != b) state = fail[state];
    return static_cast<uint8_t>(pattern[state]) == b ? state + 1 : 0;
  };
  std::vector<int32_t> states(n);
  for (int i = 0; i < n; ++i) states[i] = g.add_rule(g.unique_name("reasoning"));
  for (int i = 0; i < n; ++i) {
    std::map<int, ByteSet> by_next;
    for (int b = 0; b < 256; ++b) by_next[next(i, static_cast<uint8_t>(b))].add(static_cast<uint8_t>(b));
    for (const auto& [to, set] : by_next) {
      if (to == n) {
        g.add_alternative(states[i], {g.bytes(set)});  // the pattern completes: the text ends here
      } else {
        g.add_alternative(states[i], {g.bytes(set), Grammar::rule(states[to])});
      }
    }
  }
  return Grammar::rule(states[0]);
}

std::string spec_key(const ConstraintSpec& spec, Reasoning reasoning, const std::vector<int32_t>& stop_ids) {
  std::string key = fmt::format("{}|{}|{}|{}|", static_cast<int>(spec.kind), static_cast<int>(reasoning), spec.strict,
                                spec.any_whitespace);
  for (int32_t id : stop_ids) key += fmt::format("{},", id);
  key += '|';
  switch (spec.kind) {
    case ConstraintSpec::Kind::json_schema: key += spec.schema.dump(); break;
    case ConstraintSpec::Kind::choice: key += nlohmann::ordered_json(spec.choices).dump(); break;
    default: key += spec.text; break;
  }
  return key;
}

}  // namespace

Grammar spec_grammar(const ConstraintSpec& spec) {
  const JsonSchemaOptions json_options{.any_whitespace = spec.any_whitespace, .strict = spec.strict};
  switch (spec.kind) {
    case ConstraintSpec::Kind::json_object: return json_object_grammar(json_options);
    case ConstraintSpec::Kind::json_schema: return json_schema_grammar(spec.schema, json_options);
    case ConstraintSpec::Kind::regex: return regex_grammar(spec.text);
    case ConstraintSpec::Kind::grammar: return parse_gbnf(spec.text);
    case ConstraintSpec::Kind::choice: {
      QINFER_CHECK(!spec.choices.empty(), "choice: at least one choice is needed");
      Grammar g;
      const int32_t root = g.add_rule("root");
      for (const std::string& c : spec.choices) {
        QINFER_CHECK(!c.empty(), "choice: the choices must not be empty strings");
        g.add_alternative(root, g.literal(c));
      }
      g.set_root(root);
      return g;
    }
    case ConstraintSpec::Kind::none: break;
  }
  fail("grammar: no constraint to compile");
}

Grammar with_reasoning(Grammar body, Reasoning reasoning) {
  if (reasoning == Reasoning::none) return body;
  Grammar& g = body;
  const int32_t answer = g.root();
  Sequence block;
  if (reasoning == Reasoning::optional_block) block = g.literal(kOpen);
  block.push_back(free_text_then(g, kClose));
  block.push_back(g.repeat("reasoning-newlines", g.literal("\n"), 0, kMaxNewlinesAfterReasoning));
  const int32_t root = g.add_rule(g.unique_name("root-with-reasoning"));
  Sequence after = block;
  after.push_back(Grammar::rule(answer));
  g.add_alternative(root, std::move(after));
  if (reasoning == Reasoning::optional_block) g.add_alternative(root, {Grammar::rule(answer)});
  g.set_root(root);
  return body;
}

ConstraintCache::ConstraintCache(std::shared_ptr<const TokenTrie> trie, size_t capacity)
    : trie_(std::move(trie)), capacity_(capacity) {}

std::shared_ptr<GrammarMasks> ConstraintCache::get(const ConstraintSpec& spec, Reasoning reasoning,
                                                   const std::vector<int32_t>& stop_ids) {
  const std::string key = spec_key(spec, reasoning, stop_ids);
  {
    std::lock_guard lock(mutex_);
    if (auto it = index_.find(key); it != index_.end()) {
      entries_.splice(entries_.begin(), entries_, it->second);
      return entries_.front().second;
    }
  }
  // Compiled outside the lock: a large schema does not hold up requests that hit the cache.
  auto compiled = std::make_shared<const CompiledGrammar>(with_reasoning(spec_grammar(spec), reasoning));
  auto masks = std::make_shared<GrammarMasks>(std::move(compiled), trie_, stop_ids);
  std::lock_guard lock(mutex_);
  if (auto it = index_.find(key); it != index_.end()) return it->second->second;  // compiled twice at once
  entries_.emplace_front(key, masks);
  index_[key] = entries_.begin();
  if (entries_.size() > capacity_) {
    index_.erase(entries_.back().first);
    entries_.pop_back();
  }
  return masks;
}

size_t ConstraintCache::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

}  // namespace qinfer::grammar
