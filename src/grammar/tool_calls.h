#pragma once
// The tool-call syntax Qwen chat templates teach, as a grammar: a constrained model can call only
// the declared tools, with arguments their parameter schemas accept, in the form the server's
// tool-call parser reads.
//   Hermes (Qwen3, Qwen3-Next): <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   XML (Qwen3.5 / 3.6):        <tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n
//                               </function>\n</tool_call>
// Hermes arguments are JSON compiled from the parameters schema (json_schema.h). XML parameters are
// the schema's properties in declared order, each required one present; a string parameter is raw
// text (its enum / const as literals) that cannot contain the format's tags, any other one the JSON
// its schema admits. Calls follow each other separated by a newline.
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "grammar/grammar.h"

namespace qinfer::grammar {

enum class ToolCallSyntax { hermes, xml };

struct ToolSchema {
  std::string name;
  nlohmann::ordered_json parameters;  // the function's parameters schema; null when it has none
  // OpenAI strict mode: objects without additionalProperties allow no others, and a schema the
  // grammar cannot follow exactly is an error rather than a looser grammar for the arguments.
  bool strict = false;
  std::string field;  // where the request declared it ("tools[2]"), for errors
};

struct ToolCallSpec {
  ToolCallSyntax syntax = ToolCallSyntax::hermes;
  std::vector<ToolSchema> tools;
  bool required = false;  // false ("auto"): text, then optionally calls; true: calls only
  bool parallel = true;   // false: at most one call
};

// Throws Error naming the tool's field for a strict schema the grammar cannot follow.
// `calls_after_open`: set to the rule of the calls after the first "<tool_call>" (what the
// reasoning block may lead into).
Grammar tool_call_grammar(const ToolCallSpec& spec, int32_t* calls_after_open = nullptr);

// How the XML format's parameter with this schema is written (nullptr: a parameter the schema does
// not declare): "string" for raw text, else the JSON Schema type its value is read as ("" when the
// schema names none). The grammar and the parser agree through this.
std::string xml_parameter_type(const nlohmann::ordered_json* schema);

}  // namespace qinfer::grammar
