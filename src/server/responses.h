#pragma once
// The JSON the server sends: chat and text completions (whole and as stream chunks), usage,
// logprobs, and Server-Sent Events framing.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/engine.h"
#include "server/api_error.h"
#include "server/chat_output.h"
#include "tokenizer/tokenizer.h"

namespace qinfer::server {

// One SSE event carrying `payload` (a JSON document on one line).
std::string sse_event(const json& payload);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// "chatcmpl-…", "cmpl-…", "call_…": a prefix and 24 random letters and digits.
std::string random_id(std::string_view prefix);

struct ResponseHeader {
  std::string id;
  int64_t created = 0;  // Unix seconds
  std::string model;
  std::string fingerprint;  // system_fingerprint: the served model and engine configuration
};

struct Usage {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
};
json usage_json(const Usage& usage);
// The cached prompt tokens of a usage_json object (0 when it has none).
int64_t cached_tokens(const json& usage);

// A chat.completion.chunk with one choice: `delta` is {role?, content?, reasoning_content?,
// tool_calls?}; finish_reason and logprobs are null when empty.
json chat_chunk(const ResponseHeader& h, int index, json delta, const std::string& finish_reason,
                json logprobs = nullptr);
// The final chunk of a stream with stream_options.include_usage: no choices, the usage.
json usage_chunk(const ResponseHeader& h, std::string_view object, const Usage& usage);
// The delta of a chat chunk; `ids` names the calls by index (new calls get their id here).
json chat_delta_json(const ChatDelta& delta, std::vector<std::string>& ids);
json completion_chunk(const ResponseHeader& h, int index, const std::string& text, const std::string& finish_reason,
                      json logprobs = nullptr);

// Logprobs of generated tokens. Chat: entries of {"content": [...]} ({token, logprob, bytes,
// top_logprobs}); completions: the legacy {tokens, token_logprobs, top_logprobs, text_offset}
// columns, appended to `out` so a response can gather them across deltas (text_offset counts from
// `offset`, which is advanced).
json chat_logprob_entries(const tokenizer::Tokenizer& tokenizer, const std::vector<engine::TokenLogprob>& logprobs);
void append_completion_logprobs(json& out, const tokenizer::Tokenizer& tokenizer,
                                const std::vector<engine::TokenLogprob>& logprobs, int64_t& offset);
json empty_completion_logprobs();
// An echoed prompt's columns, appended to `out` before the generated tokens': its first token has no
// logprob (null, as its top_logprobs), the others engine::Event::prompt_logprobs with `top` of their
// alternatives each.
void append_prompt_completion_logprobs(json& out, const tokenizer::Tokenizer& tokenizer, int32_t first_token,
                                       const std::vector<engine::TokenLogprob>& prompt_logprobs, int32_t top,
                                       int64_t& offset);
// vLLM's prompt_logprobs: null for the first prompt token, then per token an object of
// "<id>": {logprob, rank, decoded_token} for the token itself and its alternatives.
json vllm_prompt_logprobs(const tokenizer::Tokenizer& tokenizer, const std::vector<engine::TokenLogprob>& prompt_logprobs,
                          int32_t top);

}  // namespace qinfer::server
