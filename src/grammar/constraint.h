#pragma once
// What a request constrains its output to (structured outputs), compiled once per distinct request
// into the masks its sequences share: JSON mode, a JSON Schema, a regular expression, a choice of
// strings, a GBNF grammar, or the tool calls a request allows, optionally after a reasoning block
// the grammar leaves free.
#include <nlohmann/json.hpp>

#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/mask.h"
#include "grammar/tool_calls.h"

namespace qinfer::grammar {

struct ConstraintSpec {
  enum class Kind { none, json_object, json_schema, regex, choice, grammar, tool_calls };
  Kind kind = Kind::none;
  nlohmann::ordered_json schema;     // json_schema
  bool strict = false;               // json_schema: OpenAI strict mode
  bool any_whitespace = false;       // json_*: pretty-printed JSON allowed (JsonSchemaOptions)
  std::string text;                  // regex pattern or GBNF grammar
  std::vector<std::string> choices;  // choice: the output is exactly one of them
  ToolCallSpec tool_calls;           // tool_calls
};

// Where a reasoning model's output starts: no reasoning (the grammar starts at once), a <think>
// block the model may write first (Qwen3), or inside a block the prompt opened (Qwen3.5). The
// block's text is free, except that it cannot contain "</think>" before its end.
enum class Reasoning { none, optional_block, open };

// The grammar of a spec (kind != none) after the reasoning the model may write first. Tool calls
// may also end an unclosed reasoning block: "<tool_call>" inside it starts the calls (models at
// times call a tool without closing their reasoning, and the reasoning splitter reads it so).
// Throws Error naming what is wrong with the spec.
Grammar constraint_grammar(const ConstraintSpec& spec, Reasoning reasoning);

// Compiled constraints over one vocabulary, the most recently used kept (a schema sent with every
// request of an application compiles once, and its mask tables fill once). Thread-safe.
class ConstraintCache {
 public:
  ConstraintCache(std::shared_ptr<const TokenTrie> trie, size_t capacity = 64);
  // The masks of `spec` after `reasoning`, allowing stop_ids where the grammar may end.
  std::shared_ptr<GrammarMasks> get(const ConstraintSpec& spec, Reasoning reasoning, const std::vector<int32_t>& stop_ids);
  size_t size() const;

 private:
  std::shared_ptr<const TokenTrie> trie_;
  size_t capacity_;
  mutable std::mutex mutex_;
  std::list<std::pair<std::string, std::shared_ptr<GrammarMasks>>> entries_;  // most recent first
  std::map<std::string, decltype(entries_)::iterator> index_;
};

}  // namespace qinfer::grammar
