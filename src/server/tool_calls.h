#pragma once
// Incremental tool-call parsers for the formats Qwen models write, fed answer text chunk by chunk
// (tags may be split anywhere, several calls may follow each other). They turn each call into
// OpenAI tool-call deltas as soon as its pieces are known: the name once it is complete, then the
// arguments JSON text in fragments. Text outside calls passes through as content.
//   Hermes (Qwen3, Qwen3-Next): <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   XML (Qwen3.5, Qwen3-Coder): <tool_call>\n<function=f>\n<parameter=p>\nvalue\n</parameter>\n
//                               </function>\n</tool_call>; values are converted by the tool's
//                               JSON schema type (strings stay strings).
// A call that cannot be read is passed through as content, never dropped.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "server/api_error.h"

namespace qinfer::server {

enum class ToolCallFormat { none, hermes, xml };

// The format a chat template teaches its model, read from the template text.
ToolCallFormat detect_tool_call_format(std::string_view chat_template);

struct ToolCallDelta {
  int index = 0;          // which call of the turn (0, 1, ...)
  std::string name;       // set in the first delta of a call
  std::string arguments;  // the next fragment of the arguments JSON text
};

struct ParsedOutput {
  std::string content;
  std::vector<ToolCallDelta> calls;
};

class ToolCallParser {
 public:
  virtual ~ToolCallParser() = default;
  ParsedOutput push(std::string_view text);
  ParsedOutput finish();
  int calls() const { return calls_; }

 protected:
  // The call body so far (text after <tool_call>); `complete` when its end was seen. Consume from
  // pos_ and report what became known.
  virtual void scan(ParsedOutput& out, bool complete) = 0;
  // Completes the current call's arguments when its end tag arrived (`closed`); an output that
  // ended inside a call (max_tokens, a stop string) keeps the arguments as written, none invented.
  // Returns false when the call never got a name, so its text goes out as content.
  virtual bool close(ParsedOutput& out, bool closed) = 0;
  virtual void reset() = 0;

  void start_call(ParsedOutput& out, std::string name);
  void emit_arguments(ParsedOutput& out, std::string_view fragment);

  std::string body_;  // the current call's text after <tool_call>
  size_t pos_ = 0;    // how much of body_ has been read
  bool started_ = false;

 private:
  void emit_content(ParsedOutput& out, std::string_view text, bool before_call);
  void end_call(ParsedOutput& out, bool closed);

  bool in_call_ = false;
  int calls_ = 0;
  std::string pending_;
  std::string held_space_;      // whitespace that precedes either a call (dropped) or more text
  bool strip_leading_ = false;  // right after a call, whitespace is layout
};

// Parser for `format` (nullptr for ToolCallFormat::none). `tools` is the request's tools array
// (the XML form needs the parameter types).
std::unique_ptr<ToolCallParser> make_tool_call_parser(ToolCallFormat format, const json& tools);

}  // namespace qinfer::server
