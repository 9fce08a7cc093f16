// Incremental tool-call parsing: the same result whatever the chunking (every split point, byte by
// byte), names before arguments, several calls per turn, schema-typed XML values, and unreadable
// calls passed through as content.
#include "server/tool_calls.h"

#include <gtest/gtest.h>

#include <map>

#include "server/chat_output.h"

namespace qinfer::server {
namespace {

struct Call {
  std::string name, arguments;
  bool operator==(const Call&) const = default;
};

struct Result {
  std::string content;
  std::vector<Call> calls;
  bool operator==(const Result&) const = default;
};

std::ostream& operator<<(std::ostream& os, const Result& r) {
  os << "content=" << dump(json(r.content));
  for (const Call& c : r.calls) os << " call(" << c.name << ", " << c.arguments << ")";
  return os;
}

// Gathers deltas as a client would, checking the protocol: a call's first delta names it, indexes
// count up from 0.
class Gatherer {
 public:
  void add(const ParsedOutput& out) {
    result.content += out.content;
    for (const ToolCallDelta& d : out.calls) {
      if (!d.name.empty()) {
        ASSERT_EQ(d.index, static_cast<int>(result.calls.size())) << "calls must be numbered in order";
        result.calls.push_back({d.name, ""});
      }
      ASSERT_LT(d.index, static_cast<int>(result.calls.size())) << "arguments before the call's name";
      result.calls[d.index].arguments += d.arguments;
    }
  }
  Result result;
};

json weather_tools() {
  return json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
      "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"},
      "ratio": {"type": ["number", "null"]}, "tags": {"type": "array"}, "opts": {"type": "object"},
      "code": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {
      "zone": {"type": "string"}}}}}])");
}

Result parse_chunks(ToolCallFormat format, const std::vector<std::string>& chunks,
                    const json& tools = weather_tools()) {
  auto parser = make_tool_call_parser(format, tools);
  Gatherer g;
  for (const std::string& c : chunks) g.add(parser->push(c));
  g.add(parser->finish());
  return g.result;
}

// Parses `text` whole, then split at every byte, then byte by byte: all must agree with `expected`.
void expect_every_split(ToolCallFormat format, const std::string& text, const Result& expected) {
  EXPECT_EQ(parse_chunks(format, {text}), expected) << "whole";
  for (size_t cut = 1; cut < text.size(); ++cut)
    ASSERT_EQ(parse_chunks(format, {text.substr(0, cut), text.substr(cut)}), expected) << "split at " << cut;
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  EXPECT_EQ(parse_chunks(format, bytes), expected) << "byte by byte";
}

TEST(ToolCallFormat, DetectedFromTheTemplate) {
  EXPECT_EQ(detect_tool_call_format("... <tool_call>\\n{\"name\": ..."), ToolCallFormat::hermes);
  EXPECT_EQ(detect_tool_call_format("<tool_call>\\n<function=example_function_name>"), ToolCallFormat::xml);
  EXPECT_EQ(detect_tool_call_format("{% for m in messages %}{{ m.content }}{% endfor %}"), ToolCallFormat::none);
}

TEST(HermesToolCalls, OneCallAfterText) {
  expect_every_split(ToolCallFormat::hermes,
                     "Let me check.\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
                     "\"Paris\", \"days\": 3}}\n</tool_call>",
                     {"Let me check.", {{"get_weather", "{\"city\": \"Paris\", \"days\": 3}"}}});
}

TEST(HermesToolCalls, SeveralCallsAndTrickyStrings) {
  // Braces, escaped quotes and a fake end tag inside argument strings do not end the value.
  const std::string text =
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"{Par\\\"is}\", \"tags\": [\"a]\", "
      "{\"b\": 1}]}}\n</tool_call>\n<tool_call>\n{\"name\":\"get_time\",\"arguments\":{\"zone\":\"CET\"}}\n"
      "</tool_call>";
  expect_every_split(ToolCallFormat::hermes, text,
                     {"",
                      {{"get_weather", "{\"city\": \"{Par\\\"is}\", \"tags\": [\"a]\", {\"b\": 1}]}"},
                       {"get_time", "{\"zone\":\"CET\"}"}}});
}

TEST(HermesToolCalls, PlainTextPassesThroughUntouched) {
  expect_every_split(ToolCallFormat::hermes, "Hello <b>world</b> <tool_ x\n\n",
                     {"Hello <b>world</b> <tool_ x\n\n", {}});
}

TEST(HermesToolCalls, ArgumentsFirstOrAsAStringAreReadAtTheEnd) {
  expect_every_split(ToolCallFormat::hermes,
                     "<tool_call>\n{\"arguments\": {\"zone\": \"UTC\"}, \"name\": \"get_time\"}\n</tool_call>",
                     {"", {{"get_time", "{\"zone\":\"UTC\"}"}}});
  expect_every_split(
      ToolCallFormat::hermes,
      "<tool_call>\n{\"name\": \"get_time\", \"arguments\": \"{\\\"zone\\\": \\\"UTC\\\"}\"}\n</tool_call>",
      {"", {{"get_time", "{\"zone\": \"UTC\"}"}}});
  expect_every_split(ToolCallFormat::hermes, "<tool_call>\n{\"name\": \"get_time\"}\n</tool_call>",
                     {"", {{"get_time", "{}"}}});
}

TEST(HermesToolCalls, UnreadableCallIsContentNotLost) {
  expect_every_split(ToolCallFormat::hermes, "A<tool_call>\nnot json at all\n</tool_call>B",
                     {"A<tool_call>\nnot json at all\n</tool_call>B", {}});
  // Cut off inside the call: what was written is still returned.
  expect_every_split(ToolCallFormat::hermes, "<tool_call>\n{\"nam", {"<tool_call>\n{\"nam", {}});
  expect_every_split(ToolCallFormat::hermes, "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1",
                     {"", {{"f", "{\"a\": 1"}}});
}

TEST(HermesToolCalls, NameArrivesBeforeTheCallEnds) {
  auto parser = make_tool_call_parser(ToolCallFormat::hermes, weather_tools());
  ParsedOutput a = parser->push("<tool_call>\n{\"name\": \"get_weather\", \"argu");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  ParsedOutput b = parser->push("ments\": {\"city\": \"Pa");
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_EQ(b.calls[0].name, "");
  EXPECT_EQ(b.calls[0].arguments, "{\"city\": \"Pa");
  EXPECT_EQ(parser->calls(), 1);
}

TEST(XmlToolCalls, ValuesTypedByTheSchema) {
  const std::string text =
      "I will look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew \"York\"\n</parameter>\n"
      "<parameter=days>\n3\n</parameter>\n<parameter=metric>\nTrue\n</parameter>\n<parameter=ratio>\n0.5\n"
      "</parameter>\n<parameter=tags>\n[\"a\", 1]\n</parameter>\n<parameter=opts>\n{\"x\": null}\n</parameter>\n"
      "<parameter=code>\nif a < b:\n    print(\"</param\")\n\n</parameter>\n</function>\n</tool_call>";
  expect_every_split(
      ToolCallFormat::xml, text,
      {"I will look.",
       {{"get_weather",
         "{\"city\": \"New \\\"York\\\"\", \"days\": 3, \"metric\": true, \"ratio\": 0.5, \"tags\": "
         "[\"a\",1], \"opts\": {\"x\":null}, \"code\": \"if a < b:\\n    print(\\\"</param\\\")\\n\"}"}}});
}

TEST(XmlToolCalls, BadValuesStayStringsAndUnknownParametersAreStrings) {
  expect_every_split(ToolCallFormat::xml,
                     "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n<parameter=extra>\n"
                     "42\n</parameter>\n</function>\n</tool_call>",
                     {"", {{"get_weather", "{\"days\": \"three\", \"extra\": \"42\"}"}}});
}

TEST(XmlToolCalls, SeveralCallsNoParametersAndMissingEndTags) {
  expect_every_split(ToolCallFormat::xml,
                     "<tool_call>\n<function=get_time>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n"
                     "<parameter=zone>\nUTC\n<parameter=other>\nx\n</function>\n</tool_call>\nDone.",
                     {"Done.", {{"get_time", "{}"}, {"get_time", "{\"zone\": \"UTC\", \"other\": \"x\"}"}}});
}

TEST(XmlToolCalls, UnreadableCallIsContent) {
  expect_every_split(ToolCallFormat::xml, "<tool_call>\n{\"name\": \"x\"}\n</tool_call>",
                     {"<tool_call>\n{\"name\": \"x\"}\n</tool_call>", {}});
}

TEST(XmlToolCalls, StringValuesStreamBeforeTheParameterEnds) {
  auto parser = make_tool_call_parser(ToolCallFormat::xml, weather_tools());
  ParsedOutput a = parser->push("<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Fra");
  ASSERT_EQ(a.calls.size(), 1u);
  EXPECT_EQ(a.calls[0].name, "get_weather");
  EXPECT_EQ(a.calls[0].arguments, "{\"city\": \"San Fra");
  ParsedOutput b = parser->push("ncisco\n</para");
  ASSERT_EQ(b.calls.size(), 1u);
  EXPECT_EQ(b.calls[0].arguments, "ncisco");  // the newline may still be the value's layout
}

// An output cut off inside a call (max_tokens, a stop string) keeps the arguments the model wrote:
// nothing closes them, no value is made up.
TEST(ToolCalls, CutOffCallsKeepOnlyWhatWasWritten) {
  expect_every_split(ToolCallFormat::xml, "<tool_call>\n<function=get_time>\n<parameter=zone>\nEur",
                     {"", {{"get_time", "{\"zone\": \"Eur"}}});
  expect_every_split(ToolCallFormat::xml, "<tool_call>\n<function=get_time>\n", {"", {{"get_time", ""}}});
  expect_every_split(ToolCallFormat::xml,
                     "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n1",
                     {"", {{"get_weather", "{\"city\": \"Oslo\""}}});
  expect_every_split(ToolCallFormat::hermes, "<tool_call>\n{\"name\": \"get_time\", \"argu",
                     {"", {{"get_time", ""}}});
  expect_every_split(ToolCallFormat::hermes, "<tool_call>\n{\"arguments\": {}, \"name\": \"get_time\"",
                     {"<tool_call>\n{\"arguments\": {}, \"name\": \"get_time\"", {}});
}

// Reasoning then tool calls through the chat output parser, split at every byte.
TEST(ChatOutput, ReasoningThenToolCallAtEverySplit) {
  const std::string text =
      "<think>\nThe user wants weather.\n</think>\n\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Oslo\"}}\n</tool_call>";
  ChatOutputOptions options;
  options.split_reasoning = true;
  options.tool_format = ToolCallFormat::hermes;
  options.tools = weather_tools();
  auto run = [&](const std::vector<std::string>& chunks) {
    ChatOutputParser parser(options);
    std::string reasoning, content, name, arguments;
    auto add = [&](const ChatDelta& d) {
      reasoning += d.reasoning;
      content += d.content;
      for (const ToolCallDelta& c : d.calls) name += c.name, arguments += c.arguments;
    };
    for (const std::string& c : chunks) add(parser.push(c));
    add(parser.finish());
    EXPECT_EQ(parser.tool_calls(), 1);
    return std::vector<std::string>{reasoning, content, name, arguments};
  };
  const std::vector<std::string> expected = {"The user wants weather.", "", "get_weather", "{\"city\": \"Oslo\"}"};
  EXPECT_EQ(run({text}), expected);
  for (size_t cut = 1; cut < text.size(); ++cut)
    ASSERT_EQ(run({text.substr(0, cut), text.substr(cut)}), expected) << "split at " << cut;
}

TEST(ChatOutput, ToolCallInsideUnclosedReasoningEndsIt) {
  ChatOutputOptions options;
  options.split_reasoning = true;
  options.reasoning_open = true;  // Qwen3.5: the prompt opened <think>
  options.tool_format = ToolCallFormat::xml;
  options.tools = weather_tools();
  ChatOutputParser parser(options);
  ChatDelta d = parser.push("Need the time.\n<tool_call>\n<function=get_time>\n</function>\n</tool_call>");
  ChatDelta end = parser.finish();
  EXPECT_EQ(d.reasoning + end.reasoning, "Need the time.");
  ASSERT_EQ(d.calls.size(), 1u);
  EXPECT_EQ(d.calls[0].name, "get_time");
  EXPECT_EQ(d.calls[0].arguments + (end.calls.empty() ? "" : end.calls[0].arguments), "{}");
}

}  // namespace
}  // namespace qinfer::server
