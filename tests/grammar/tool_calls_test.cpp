// Tool-call grammars: only declared tools, arguments their schemas accept, in the Hermes and XML
// forms the server's parser reads; "auto" text before calls; strict tools refused where the grammar
// cannot follow their schema. And the free-text automaton they and reasoning blocks are built on.
#include "grammar/tool_calls.h"

#include <gtest/gtest.h>

#include "grammar/constraint.h"
#include "grammar/json_schema.h"
#include "grammar_test_util.h"

namespace qinfer::grammar {
namespace {

using Json = nlohmann::ordered_json;
using testing::fails_with;
using testing::matches;

Grammar until(std::string_view end, const std::vector<std::string>& forbidden, bool may_stop) {
  Grammar g;
  const int32_t root = g.add_rule("root");
  g.add_alternative(root, {g.text_until("text", end, forbidden, g.literal("!"), may_stop)});
  g.set_root(root);
  return g;
}

TEST(TextUntil, EndsAtTheFirstEndAndNeverHoldsAForbiddenPattern) {
  const Grammar g = until("</p>", {"<q=", "</f>"}, false);
  EXPECT_TRUE(matches(g, "</p>!"));
  EXPECT_TRUE(matches(g, "a < b </ c <q </f </p>!"));
  EXPECT_TRUE(matches(g, "<</</p>!"));  // overlapping starts of the end
  EXPECT_FALSE(matches(g, "abc"));      // never ended
  EXPECT_FALSE(matches(g, "</p>"));     // the end is followed by what comes after
  EXPECT_FALSE(matches(g, "x</p>y</p>!"));
  EXPECT_FALSE(matches(g, "a<q=b</p>!"));
  EXPECT_FALSE(matches(g, "a</f></p>!"));
  const Grammar stop = until("</p>", {}, true);
  EXPECT_TRUE(matches(stop, ""));
  EXPECT_TRUE(matches(stop, "text with </ and </p"));
  EXPECT_TRUE(matches(stop, "text</p>!"));
  EXPECT_FALSE(matches(stop, "text</p>"));
}

TEST(TextUntil, AForbiddenSuffixOfTheEndWins) {
  // The end can never occur, so the text can never end: refused like any rule that never ends.
  EXPECT_TRUE(fails_with([] { matches(until("ab", {"b"}, false), "ab!"); }, "forbidden suffix", {"never ends"}));
  const Grammar stop = until("ab", {"b"}, true);
  EXPECT_TRUE(matches(stop, "xa"));
  EXPECT_FALSE(matches(stop, "ab!"));
  EXPECT_FALSE(matches(stop, "xb"));
}

const Json kWeather = Json::parse(R"({"type": "object", "properties": {
  "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7},
  "unit": {"enum": ["C", "F"]}, "mode": {"type": "string", "enum": ["fast", "exact"]}},
  "required": ["city"], "additionalProperties": false})");

ToolCallSpec spec(ToolCallSyntax syntax, bool required, bool parallel = true) {
  ToolCallSpec s;
  s.syntax = syntax;
  s.required = required;
  s.parallel = parallel;
  s.tools = {{"get_weather", kWeather, false, "tools[0]"}, {"now", Json(), false, "tools[1]"}};
  return s;
}

TEST(HermesToolCallGrammar, DeclaredNamesAndSchemaValidArguments) {
  const Grammar g = tool_call_grammar(spec(ToolCallSyntax::hermes, /*required=*/true));
  const std::string paris =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>";
  EXPECT_TRUE(matches(g, paris));
  EXPECT_TRUE(matches(g, paris + "\n"));
  EXPECT_TRUE(matches(g, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_TRUE(matches(g, paris + "\n" + paris));  // parallel calls
  EXPECT_FALSE(matches(g, ""));                    // required: at least one call
  EXPECT_FALSE(matches(g, "Sure. " + paris));       // required: no text
  EXPECT_FALSE(matches(g, "<tool_call>\n{\"name\": \"name\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(matches(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(matches(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"days\": 9}}\n"
                          "</tool_call>"));
  EXPECT_FALSE(matches(g, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"P\", \"x\": 1}}\n"
                          "</tool_call>"));
  const Grammar one = tool_call_grammar(spec(ToolCallSyntax::hermes, true, /*parallel=*/false));
  EXPECT_TRUE(matches(one, paris));
  EXPECT_FALSE(matches(one, paris + "\n" + paris));
}

TEST(HermesToolCallGrammar, AutoAllowsTextOrTextThenCalls) {
  const Grammar g = tool_call_grammar(spec(ToolCallSyntax::hermes, /*required=*/false));
  EXPECT_TRUE(matches(g, ""));
  EXPECT_TRUE(matches(g, "It is sunny; no <tool_ call needed."));
  EXPECT_TRUE(matches(g, "Let me look.\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(matches(g, "Let me look.\n<tool_call>\n{\"name\": \"later\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(matches(g, "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>\nMore text."));
}

TEST(XmlToolCallGrammar, ParametersInOrderRawStringsAndJsonValues) {
  const Grammar g = tool_call_grammar(spec(ToolCallSyntax::xml, /*required=*/true));
  const std::string head = "<tool_call>\n<function=get_weather>\n";
  const std::string tail = "</function>\n</tool_call>";
  auto param = [](std::string_view name, std::string_view value) {
    return "<parameter=" + std::string(name) + ">\n" + std::string(value) + "\n</parameter>\n";
  };
  EXPECT_TRUE(matches(g, head + param("city", "New \"York\"\nline two < three") + tail));
  EXPECT_TRUE(matches(g, head + param("city", "Oslo") + param("days", "7") + param("unit", "\"F\"") +
                             param("mode", "exact") + tail));
  EXPECT_TRUE(matches(g, "<tool_call>\n<function=now>\n" + tail));
  EXPECT_FALSE(matches(g, head + tail));                                      // city is required
  EXPECT_FALSE(matches(g, head + param("days", "3") + param("city", "Oslo") + tail));  // declared order
  EXPECT_FALSE(matches(g, head + param("city", "Oslo") + param("days", "8") + tail));
  EXPECT_FALSE(matches(g, head + param("city", "Oslo") + param("unit", "K") + tail));
  EXPECT_FALSE(matches(g, head + param("city", "Oslo") + param("mode", "slow") + tail));
  EXPECT_FALSE(matches(g, head + param("city", "a <parameter=days> b") + tail));  // a tag inside a string
  EXPECT_FALSE(matches(g, head + param("city", "a </function> b") + tail));
  EXPECT_FALSE(matches(g, head + param("city", "Oslo") + param("wind", "5") + tail));
  EXPECT_FALSE(matches(g, "<tool_call>\n<function=get_time>\n" + tail));
}

TEST(XmlToolCallGrammar, LooseToolsWithoutPropertiesTakeAnyParameters) {
  ToolCallSpec s = spec(ToolCallSyntax::xml, true);
  s.tools = {{"run", Json(), false, "tools[0]"}};
  const Grammar g = tool_call_grammar(s);
  EXPECT_TRUE(matches(g, "<tool_call>\n<function=run>\n<parameter=cmd>\nls -l\n</parameter>\n</function>\n</tool_call>"));
  s.tools[0].strict = true;
  const Grammar strict = tool_call_grammar(s);
  EXPECT_TRUE(matches(strict, "<tool_call>\n<function=run>\n</function>\n</tool_call>"));
  EXPECT_FALSE(
      matches(strict, "<tool_call>\n<function=run>\n<parameter=cmd>\nls\n</parameter>\n</function>\n</tool_call>"));
}

TEST(ToolCallGrammar, StrictToolsTheGrammarCannotFollowAreRefusedByField) {
  ToolCallSpec s = spec(ToolCallSyntax::hermes, true);
  s.tools = {{"f", Json::parse(R"({"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": true}}})"),
              true, "tools[3]"}};
  EXPECT_TRUE(fails_with([&] { tool_call_grammar(s); }, "strict uniqueItems",
                         {"tools[3].function.parameters", "uniqueItems", "/properties/tags"}));
  // Loose: the names are still constrained, the arguments are any object.
  s.tools[0].strict = false;
  const Grammar loose = tool_call_grammar(s);
  EXPECT_TRUE(matches(loose, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"tags\": [1, 1]}}\n</tool_call>"));
  EXPECT_FALSE(matches(loose, "<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>"));

  ToolCallSpec x = spec(ToolCallSyntax::xml, true);
  x.tools = {{"f", Json::parse(R"({"type": "object", "properties": {"id": {"type": "string", "pattern": "^a+$"}}})"),
              true, "tools[0]"}};
  EXPECT_TRUE(fails_with([&] { tool_call_grammar(x); }, "xml pattern", {"tools[0].function.parameters", "pattern", "id"}));
  x.tools[0].parameters = Json::parse(R"({"anyOf": [{"type": "object"}]})");
  EXPECT_TRUE(fails_with([&] { tool_call_grammar(x); }, "xml anyOf", {"tools[0]", "properties"}));
}

// Reasoning stays free before the calls, and a call may also end a block the model never closed.
TEST(ToolCallGrammar, ReasoningBeforeCallsAndCallsThatEndIt) {
  ConstraintSpec c;
  c.kind = ConstraintSpec::Kind::tool_calls;
  c.tool_calls = spec(ToolCallSyntax::hermes, /*required=*/true);
  const std::string call = "<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  const Grammar open = constraint_grammar(c, Reasoning::open);
  EXPECT_TRUE(matches(open, "I should check the time.\n</think>\n\n" + call));
  EXPECT_TRUE(matches(open, "I should check the time.\n" + call));  // the call ends the reasoning
  EXPECT_FALSE(matches(open, "Thinking.\n</think>\n\nIt is noon."));
  EXPECT_FALSE(matches(open, "Thinking.\n<tool_call>\n{\"name\": \"later\", \"arguments\": {}}\n</tool_call>"));
  EXPECT_FALSE(matches(open, "a </think> b " + call));  // text between the close and the call
  const Grammar optional = constraint_grammar(c, Reasoning::optional_block);
  EXPECT_TRUE(matches(optional, call));
  EXPECT_TRUE(matches(optional, "<think>\nHm.\n</think>\n\n" + call));
  EXPECT_TRUE(matches(optional, "<think>\nHm. " + call));
  // Other constraints keep "<tool_call>" as reasoning text.
  ConstraintSpec json;
  json.kind = ConstraintSpec::Kind::json_object;
  EXPECT_TRUE(matches(constraint_grammar(json, Reasoning::open), "a <tool_call> b</think>\n{}"));
}

TEST(ToolCallGrammar, XmlParameterTypesAgreeWithTheParser) {
  EXPECT_EQ(xml_parameter_type(nullptr), "string");
  EXPECT_EQ(xml_parameter_type(&kWeather["properties"]["city"]), "string");
  EXPECT_EQ(xml_parameter_type(&kWeather["properties"]["days"]), "integer");
  EXPECT_EQ(xml_parameter_type(&kWeather["properties"]["unit"]), "");
  const Json nullable_string = Json::parse(R"({"type": ["null", "string"]})");
  const Json nullable_int = Json::parse(R"({"type": ["integer", "null"]})");
  const Json one = Json::parse(R"({"type": ["boolean"]})");
  EXPECT_EQ(xml_parameter_type(&nullable_string), "string");
  EXPECT_EQ(xml_parameter_type(&nullable_int), "");
  EXPECT_EQ(xml_parameter_type(&one), "boolean");
}

}  // namespace
}  // namespace qinfer::grammar
