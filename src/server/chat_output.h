#pragma once
// One chat choice's generated text turned into what a chat response carries: reasoning, content
// and tool-call deltas. Chains the reasoning splitter and the tool-call parser.
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "engine/reasoning.h"
#include "server/tool_calls.h"

namespace qinfer::server {

struct ChatDelta {
  std::string reasoning, content;
  std::vector<ToolCallDelta> calls;
  bool empty() const { return reasoning.empty() && content.empty() && calls.empty(); }
};

struct ChatOutputOptions {
  bool split_reasoning = false;                       // the template knows <think> blocks
  bool reasoning_open = false;                        // the prompt left one open
  bool reasoning_leading_only = false;                // only a block at the start (ReasoningSplitter)
  ToolCallFormat tool_format = ToolCallFormat::none;  // none: tool calls are not parsed
  json tools = json::array();
};

class ChatOutputParser {
 public:
  explicit ChatOutputParser(const ChatOutputOptions& options);
  ChatDelta push(std::string_view text);
  ChatDelta finish();
  int tool_calls() const { return tools_ ? tools_->calls() : 0; }

 private:
  void add_content(ChatDelta& out, ParsedOutput parsed);

  std::optional<engine::ReasoningSplitter> reasoning_;
  std::unique_ptr<ToolCallParser> tools_;
};

}  // namespace qinfer::server
