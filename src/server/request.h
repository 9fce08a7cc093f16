#pragma once
// OpenAI request bodies read into typed requests. Every check names the field it failed on
// ("messages[2].content: expected a string or an array of content parts") and throws ApiError 400;
// nothing here depends on the model except the sampling defaults handed in.
#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <string_view>
#include <vector>

#include "backend/sampling.h"
#include "grammar/constraint.h"
#include "server/api_error.h"

namespace qinfer::server {

// Limits on what one request may ask for (beyond these a request is refused, not trimmed).
struct RequestLimits {
  int32_t max_n = 16;     // choices per request
  int32_t max_stop = 16;  // stop strings
  int32_t max_top_logprobs = 20;
  int32_t max_prompts = 64;  // prompts in one /v1/completions request
};

// What both endpoints share.
struct GenerationRequest {
  std::string model;  // empty when the request named none
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  SamplingParams sampling;
  bool seeded = false;                // the request gave a seed
  std::optional<int64_t> max_tokens;  // max_tokens or max_completion_tokens
  int32_t n = 1;
  std::vector<std::string> stop;
  bool include_stop_str = false;        // vLLM's include_stop_str_in_output
  std::vector<int32_t> stop_token_ids;  // vLLM's: ids that end a choice besides the model's own
  int32_t min_tokens = 0;               // vLLM's: completion tokens before a choice may end
  // OpenAI's logit_bias: ids at -100 (banned) and at 100 (the only ones allowed); 0 changes nothing.
  std::vector<int32_t> banned_tokens, exclusive_tokens;
  // vLLM's: the tokenizer's special tokens around the prompt (default: off for chat, whose template
  // writes them; on for completions).
  std::optional<bool> add_special_tokens;
  int32_t top_logprobs = -1;  // -1: no logprobs
  // vLLM's: each prompt token's logprob, rank and this many alternatives (-1: none); computes the
  // prompt whole, past the prefix cache.
  int32_t prompt_logprobs = -1;
  bool ignore_eos = false;    // vLLM's extension: generate max_tokens whatever the model's end token
  // vLLM's extension: the response carries the prompt's token ids and each choice's generated ids
  // (a final stop id left out), streamed chunk by chunk as well.
  bool return_token_ids = false;
  // Structured outputs (response_format, structured_outputs, guided_*): kind none when free, and the
  // field the constraint came from (for errors about it).
  grammar::ConstraintSpec constraint;
  std::string constraint_field;
};

enum class ToolChoice { none, automatic, required, named };

struct ChatRequest : GenerationRequest {
  // The body the chat template renders: messages with text parts joined into strings, tools as
  // tool_choice leaves them (absent for "none", only the named one for a named choice) and the
  // template fields passed through (chat_template_kwargs, add_generation_prompt, ...).
  json template_request;
  json tools = json::array();  // the tools the model may call (empty when tool_choice is "none")
  ToolChoice tool_choice = ToolChoice::none;
  std::string tool_name;  // for ToolChoice::named
  bool parallel_tool_calls = true;  // false: at most one call in the turn
};

struct CompletionRequest : GenerationRequest {
  // One entry per prompt: text, or token ids when the client sent ids.
  struct Prompt {
    std::string text;
    std::vector<int32_t> ids;
    bool is_ids = false;
  };
  std::vector<Prompt> prompts;
  // The prompt's text before each choice's, and with logprobs its tokens' before the generated ones
  // (what lm-eval's loglikelihood reads). max_tokens 0 is allowed then: the prompt alone comes back.
  bool echo = false;
};

// The member `key` of an object, or null when it is absent or JSON null.
const json* member(const json& object, const char* key);
// 400 naming the first member of `object` (at JSON path `where`, "" at the top) that is not in `known`:
// "<field>: not supported by this server's <api>".
void refuse_unknown_members(const json& object, const std::set<std::string>& known, const std::string& where,
                            std::string_view api);

// Parses a request body: 400 for invalid JSON (with the position), invalid UTF-8 or a non-object.
json parse_body(std::string_view body);

ChatRequest parse_chat_request(const json& body, const SamplingParams& defaults, const RequestLimits& limits = {});
CompletionRequest parse_completion_request(const json& body, const SamplingParams& defaults,
                                           const RequestLimits& limits = {});

}  // namespace qinfer::server
