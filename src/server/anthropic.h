#pragma once
// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) over the chat pipeline,
// as llama-server and vLLM serve it for clients such as Claude Code and @anthropic-ai/sdk: a request
// becomes a chat-completions body, the chat answer becomes a message, and a chat stream becomes
// message_start / content_block_* / message_delta / message_stop events.
#include <memory>
#include <string>

#include "server/api_error.h"
#include "server/stream_format.h"

namespace qinfer::server {

// The chat-completions body of a Messages request. 400 naming the field (messages[1].content[0].type,
// tools[2].type, ...) for what the API does not define or this server does not implement.
// `count_only`: for count_tokens, where max_tokens is not required.
json anthropic_chat_body(const json& body, bool count_only = false);

// The message of a chat.completion (one choice).
json anthropic_message(const json& completion);

// The error body Anthropic's clients read: {"type": "error", "error": {"type", "message"}}.
json anthropic_error_body(const ApiError& e);

std::unique_ptr<StreamFormat> anthropic_stream(const std::string& model);

}  // namespace qinfer::server
