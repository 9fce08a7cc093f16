#pragma once
// A chat stream as another API frames it. A chat session makes OpenAI chat chunks; for
// /v1/messages (Anthropic) and /v1/responses (OpenAI Responses) a StreamFormat turns them, in order,
// into that API's Server-Sent Events. One request, one choice.
#include <cstdint>
#include <string>

#include "server/api_error.h"

namespace qinfer::server {

class StreamFormat {
 public:
  virtual ~StreamFormat() = default;
  // The stream's first events, once the prompt is tokenized.
  virtual std::string open(int64_t prompt_tokens) = 0;
  // One chat.completion.chunk; the usage chunk (no choices) comes last, then close().
  virtual std::string chunk(const json& chat_chunk) = 0;
  virtual std::string close() = 0;
  // The stream ends with an error instead.
  virtual std::string error(const ApiError& e) = 0;
};

}  // namespace qinfer::server
