#include "grammar/constraint.h"

#include <fmt/format.h>

#include "grammar/gbnf.h"
#include "grammar/json_schema.h"
#include "grammar/regex.h"

namespace qinfer::grammar {
namespace {

constexpr std::string_view kOpen = "<think>", kClose = "</think>", kCallOpen = "<tool_call>";
constexpr int kMaxNewlinesAfterReasoning = 4;

std::string spec_key(const ConstraintSpec& spec, Reasoning reasoning, const std::vector<int32_t>& stop_ids) {
  std::string key = fmt::format("{}|{}|{}|{}|", static_cast<int>(spec.kind), static_cast<int>(reasoning), spec.strict,
                                spec.any_whitespace);
  for (int32_t id : stop_ids) key += fmt::format("{},", id);
  key += '|';
  switch (spec.kind) {
    case ConstraintSpec::Kind::json_schema: key += spec.schema.dump(); break;
    case ConstraintSpec::Kind::choice: key += nlohmann::ordered_json(spec.choices).dump(); break;
    case ConstraintSpec::Kind::tool_calls: {
      const ToolCallSpec& t = spec.tool_calls;
      nlohmann::ordered_json tools = nlohmann::ordered_json::array();
      for (const ToolSchema& tool : t.tools) tools.push_back({tool.name, tool.strict, tool.field, tool.parameters});
      key += fmt::format("{}|{}|{}|{}", static_cast<int>(t.syntax), t.required, t.parallel, tools.dump());
      break;
    }
    default: key += spec.text; break;
  }
  return key;
}

Grammar spec_grammar(const ConstraintSpec& spec, int32_t* calls_after_open) {
  const JsonSchemaOptions json_options{.any_whitespace = spec.any_whitespace, .strict = spec.strict};
  switch (spec.kind) {
    case ConstraintSpec::Kind::json_object: return json_object_grammar(json_options);
    case ConstraintSpec::Kind::json_schema: return json_schema_grammar(spec.schema, json_options);
    case ConstraintSpec::Kind::regex: return regex_grammar(spec.text);
    case ConstraintSpec::Kind::grammar: return parse_gbnf(spec.text);
    case ConstraintSpec::Kind::tool_calls: return tool_call_grammar(spec.tool_calls, calls_after_open);
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

// `body` after the reasoning the model may write first; `calls_after_open` >= 0: the rule of the
// tool calls after their "<tool_call>", which may also end the reasoning block.
Grammar with_reasoning(Grammar body, Reasoning reasoning, int32_t calls_after_open) {
  if (reasoning == Reasoning::none) return body;
  Grammar& g = body;
  const int32_t answer = g.root();
  const bool calls = calls_after_open >= 0;
  const std::vector<std::string> no_call = calls ? std::vector<std::string>{std::string(kCallOpen)} : std::vector<std::string>{};
  Sequence open;
  if (reasoning == Reasoning::optional_block) open = g.literal(kOpen);
  const int32_t root = g.add_rule(g.unique_name("root-with-reasoning"));
  Sequence closed = open;
  closed.push_back(g.text_until("reasoning", kClose, no_call, {}, /*may_stop=*/false));
  closed.push_back(g.repeat("reasoning-newlines", g.literal("\n"), 0, kMaxNewlinesAfterReasoning));
  closed.push_back(Grammar::rule(answer));
  g.add_alternative(root, std::move(closed));
  if (calls) {
    Sequence called = open;
    called.push_back(g.text_until("reasoning", kCallOpen, {std::string(kClose)}, {Grammar::rule(calls_after_open)},
                                  /*may_stop=*/false));
    g.add_alternative(root, std::move(called));
  }
  if (reasoning == Reasoning::optional_block) g.add_alternative(root, {Grammar::rule(answer)});
  g.set_root(root);
  return body;
}

}  // namespace

Grammar constraint_grammar(const ConstraintSpec& spec, Reasoning reasoning) {
  int32_t calls_after_open = -1;
  Grammar body = spec_grammar(spec, &calls_after_open);
  return with_reasoning(std::move(body), reasoning, calls_after_open);
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
  auto compiled = std::make_shared<const CompiledGrammar>(constraint_grammar(spec, reasoning));
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
