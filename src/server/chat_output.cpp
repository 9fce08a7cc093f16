#include "server/chat_output.h"

namespace qinfer::server {

ChatOutputParser::ChatOutputParser(const ChatOutputOptions& options)
    : tools_(make_tool_call_parser(options.tool_format, options.tools)) {
  if (options.split_reasoning)
    reasoning_.emplace(options.reasoning_open, /*tool_call_ends_reasoning=*/tools_ != nullptr,
                       options.reasoning_leading_only);
}

void ChatOutputParser::add_content(ChatDelta& out, ParsedOutput parsed) {
  out.content += parsed.content;
  for (ToolCallDelta& d : parsed.calls) {
    if (!out.calls.empty() && out.calls.back().index == d.index)
      out.calls.back().arguments += d.arguments;
    else
      out.calls.push_back(std::move(d));
  }
}

ChatDelta ChatOutputParser::push(std::string_view text) {
  ChatDelta out;
  std::string content(text);
  if (reasoning_) {
    engine::ReasoningSplitter::Pieces pieces = reasoning_->push(text);
    out.reasoning += pieces.reasoning;
    content = std::move(pieces.content);
  }
  if (tools_)
    add_content(out, tools_->push(content));
  else
    out.content += content;
  return out;
}

ChatDelta ChatOutputParser::finish() {
  ChatDelta out = push("");
  std::string content;
  if (reasoning_) {
    engine::ReasoningSplitter::Pieces pieces = reasoning_->finish();
    out.reasoning += pieces.reasoning;
    content = std::move(pieces.content);
  }
  if (tools_) {
    add_content(out, tools_->push(content));
    add_content(out, tools_->finish());
  } else {
    out.content += content;
  }
  return out;
}

}  // namespace qinfer::server
