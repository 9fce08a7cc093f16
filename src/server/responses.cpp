#include "server/responses.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <random>

#include "tokenizer/utf8.h"

namespace qinfer::server {
namespace {

// -inf (a token the model rules out) has no JSON spelling; OpenAI-compatible servers send -9999.
double finite_logprob(float lp) { return std::isfinite(lp) ? lp : -9999.0; }

json token_entry(const tokenizer::Tokenizer& tokenizer, int32_t id, float logprob) {
  const std::string_view bytes = tokenizer.token_bytes(id);
  json b = json::array();
  for (unsigned char c : bytes) b.push_back(static_cast<int>(c));
  return {{"token", tokenizer::to_valid_utf8(bytes)}, {"logprob", finite_logprob(logprob)}, {"bytes", std::move(b)}};
}

}  // namespace

std::string sse_event(const json& payload) { return "data: " + dump(payload) + "\n\n"; }

std::string random_id(std::string_view prefix) {
  static std::mutex mutex;
  static std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  std::string id(prefix);
  std::lock_guard lock(mutex);
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % (sizeof kAlphabet - 1)];
  return id;
}

json usage_json(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

int64_t cached_tokens(const json& usage) {
  const auto details = usage.find("prompt_tokens_details");
  return details == usage.end() ? 0 : details->value("cached_tokens", int64_t{0});
}

json chat_chunk(const ResponseHeader& h, int index, json delta, const std::string& finish_reason, json logprobs) {
  json choice = {{"index", index},
                 {"delta", std::move(delta)},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
  return {{"id", h.id},
          {"object", "chat.completion.chunk"},
          {"created", h.created},
          {"model", h.model},
          {"system_fingerprint", h.fingerprint},
          {"choices", json::array({std::move(choice)})}};
}

json usage_chunk(const ResponseHeader& h, std::string_view object, const Usage& usage) {
  return {{"id", h.id},
          {"object", object},
          {"created", h.created},
          {"model", h.model},
          {"system_fingerprint", h.fingerprint},
          {"choices", json::array()},
          {"usage", usage_json(usage)}};
}

json chat_delta_json(const ChatDelta& delta, std::vector<std::string>& ids) {
  json d = json::object();
  if (!delta.reasoning.empty()) d["reasoning_content"] = delta.reasoning;
  if (!delta.content.empty()) d["content"] = delta.content;
  if (!delta.calls.empty()) {
    json calls = json::array();
    for (const ToolCallDelta& c : delta.calls) {
      json call = {{"index", c.index}};
      json function = json::object();
      if (!c.name.empty()) {
        if (static_cast<int>(ids.size()) <= c.index) ids.resize(c.index + 1);
        ids[c.index] = random_id("call_");
        call["id"] = ids[c.index];
        call["type"] = "function";
        function["name"] = c.name;
      }
      function["arguments"] = c.arguments;
      call["function"] = std::move(function);
      calls.push_back(std::move(call));
    }
    d["tool_calls"] = std::move(calls);
  }
  return d;
}

json completion_chunk(const ResponseHeader& h, int index, const std::string& text, const std::string& finish_reason,
                      json logprobs) {
  json choice = {{"index", index},
                 {"text", text},
                 {"logprobs", std::move(logprobs)},
                 {"finish_reason", finish_reason.empty() ? json(nullptr) : json(finish_reason)}};
  return {{"id", h.id},
          {"object", "text_completion"},
          {"created", h.created},
          {"model", h.model},
          {"system_fingerprint", h.fingerprint},
          {"choices", json::array({std::move(choice)})}};
}

json chat_logprob_entries(const tokenizer::Tokenizer& tokenizer, const std::vector<engine::TokenLogprob>& logprobs) {
  json entries = json::array();
  for (const engine::TokenLogprob& lp : logprobs) {
    json entry = token_entry(tokenizer, lp.token, lp.logprob);
    json top = json::array();
    for (const auto& [id, value] : lp.top) top.push_back(token_entry(tokenizer, id, value));
    entry["top_logprobs"] = std::move(top);
    entries.push_back(std::move(entry));
  }
  return entries;
}

json empty_completion_logprobs() {
  return {{"tokens", json::array()},
          {"token_logprobs", json::array()},
          {"top_logprobs", json::array()},
          {"text_offset", json::array()}};
}

void append_completion_logprobs(json& out, const tokenizer::Tokenizer& tokenizer,
                                const std::vector<engine::TokenLogprob>& logprobs, int64_t& offset) {
  for (const engine::TokenLogprob& lp : logprobs) {
    const std::string text = tokenizer::to_valid_utf8(tokenizer.token_bytes(lp.token));
    out["tokens"].push_back(text);
    out["token_logprobs"].push_back(finite_logprob(lp.logprob));
    json top = json::object();
    for (const auto& [id, value] : lp.top)
      top[tokenizer::to_valid_utf8(tokenizer.token_bytes(id))] = finite_logprob(value);
    out["top_logprobs"].push_back(std::move(top));
    out["text_offset"].push_back(offset);
    offset += static_cast<int64_t>(text.size());
  }
}

void append_prompt_completion_logprobs(json& out, const tokenizer::Tokenizer& tokenizer, int32_t first_token,
                                       const std::vector<engine::TokenLogprob>& prompt_logprobs, int32_t top,
                                       int64_t& offset) {
  const std::string first = tokenizer::to_valid_utf8(tokenizer.token_bytes(first_token));
  out["tokens"].push_back(first);
  out["token_logprobs"].push_back(nullptr);
  out["top_logprobs"].push_back(nullptr);
  out["text_offset"].push_back(offset);
  offset += static_cast<int64_t>(first.size());
  std::vector<engine::TokenLogprob> trimmed = prompt_logprobs;
  for (engine::TokenLogprob& lp : trimmed) lp.top.resize(std::min(lp.top.size(), static_cast<size_t>(std::max(top, 0))));
  append_completion_logprobs(out, tokenizer, trimmed, offset);
}

json vllm_prompt_logprobs(const tokenizer::Tokenizer& tokenizer, const std::vector<engine::TokenLogprob>& prompt_logprobs,
                          int32_t top) {
  json out = json::array({nullptr});
  for (const engine::TokenLogprob& lp : prompt_logprobs) {
    json entry = json::object();
    auto put = [&](int32_t id, float logprob, int32_t rank) {
      entry[std::to_string(id)] = {{"logprob", finite_logprob(logprob)},
                                   {"rank", rank},
                                   {"decoded_token", tokenizer::to_valid_utf8(tokenizer.token_bytes(id))}};
    };
    put(lp.token, lp.logprob, lp.rank);
    for (size_t k = 0; k < lp.top.size() && k < static_cast<size_t>(std::max(top, 0)); ++k)
      if (lp.top[k].first != lp.token) put(lp.top[k].first, lp.top[k].second, static_cast<int32_t>(k + 1));
    out.push_back(std::move(entry));
  }
  return out;
}

}  // namespace qinfer::server
