#include "server/anthropic.h"

#include <set>

#include "server/request.h"
#include "server/responses.h"

namespace qinfer::server {
namespace {

constexpr auto find = member;

// 400 for a member the API does not define or this server does not implement.
void check_keys(const json& object, const std::set<std::string>& known, const std::string& where) {
  refuse_unknown_members(object, known, where, "Messages API");
}

// A block's text, for content given as a string or as text blocks (system, tool_result).
std::string text_of(const json& content, const std::string& field) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_request(field, "{}: expected a string or an array of text blocks", field);
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& block = content[i];
    const std::string at = fmt::format("{}[{}]", field, i);
    if (!block.is_object() || !block.contains("type")) bad_request(at, "{}: expected a content block", at);
    if (block["type"] == "image" || block["type"] == "document")
      bad_request(at + ".type", "{}.type: {} input is not supported by this server", at, block["type"].get<std::string>());
    if (block["type"] != "text" || !block.contains("text") || !block["text"].is_string())
      bad_request(at, "{}: expected a text block {{\"type\": \"text\", \"text\": ...}}", at);
    out += block["text"].get<std::string>();
  }
  return out;
}

json convert_messages(const json& messages) {
  if (!messages.is_array() || messages.empty()) bad_request("messages", "messages: expected a non-empty array");
  json out = json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    const json& m = messages[i];
    const std::string at = fmt::format("messages[{}]", i);
    if (!m.is_object()) bad_request(at, "{}: expected an object", at);
    check_keys(m, {"role", "content"}, at);
    const json* role = find(m, "role");
    if (!role || (*role != "user" && *role != "assistant"))
      bad_request(at + ".role", "{}.role: expected \"user\" or \"assistant\"", at);
    const json* content = find(m, "content");
    if (!content) bad_request(at + ".content", "{}.content: required", at);
    if (content->is_string()) {
      out.push_back({{"role", *role}, {"content", *content}});
      continue;
    }
    if (!content->is_array()) bad_request(at + ".content", "{}.content: expected a string or an array of blocks", at);
    std::string text, thinking;
    json calls = json::array();
    for (size_t j = 0; j < content->size(); ++j) {
      const json& b = (*content)[j];
      const std::string bat = fmt::format("{}.content[{}]", at, j);
      if (!b.is_object() || !find(b, "type") || !b["type"].is_string())
        bad_request(bat, "{}: expected a content block with a \"type\"", bat);
      const std::string type = b["type"].get<std::string>();
      if (type == "text") {
        check_keys(b, {"type", "text", "cache_control", "citations"}, bat);
        if (!find(b, "text") || !b["text"].is_string()) bad_request(bat + ".text", "{}.text: expected a string", bat);
        if (const json* c = find(b, "citations"); c && !(c->is_array() && c->empty()))
          bad_request(bat + ".citations", "{}.citations: not supported by this server", bat);
        text += b["text"].get<std::string>();
      } else if (type == "thinking" && *role == "assistant") {
        check_keys(b, {"type", "thinking", "signature"}, bat);
        if (!find(b, "thinking") || !b["thinking"].is_string())
          bad_request(bat + ".thinking", "{}.thinking: expected a string", bat);
        thinking += b["thinking"].get<std::string>();
      } else if (type == "redacted_thinking" && *role == "assistant") {
        // Encrypted reasoning of another provider's model: nothing this model can read.
      } else if (type == "tool_use" && *role == "assistant") {
        check_keys(b, {"type", "id", "name", "input", "cache_control"}, bat);
        for (const char* key : {"id", "name"})
          if (!find(b, key) || !b[key].is_string()) bad_request(bat + "." + key, "{}.{}: expected a string", bat, key);
        if (!find(b, "input") || !b["input"].is_object())
          bad_request(bat + ".input", "{}.input: expected an object", bat);
        calls.push_back({{"id", b["id"]}, {"type", "function"},
                         {"function", {{"name", b["name"]}, {"arguments", dump(b["input"])}}}});
      } else if (type == "tool_result" && *role == "user") {
        check_keys(b, {"type", "tool_use_id", "content", "is_error", "cache_control"}, bat);
        if (!find(b, "tool_use_id") || !b["tool_use_id"].is_string())
          bad_request(bat + ".tool_use_id", "{}.tool_use_id: expected a string", bat);
        std::string result = find(b, "content") ? text_of(b["content"], bat + ".content") : "";
        if (const json* e = find(b, "is_error")) {
          if (!e->is_boolean()) bad_request(bat + ".is_error", "{}.is_error: expected a boolean", bat);
          // The chat templates have no field for it: the model reads it in the result.
          if (e->get<bool>()) result = "Error: " + result;
        }
        if (!text.empty()) {
          out.push_back({{"role", "user"}, {"content", text}});
          text.clear();
        }
        out.push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
      } else if (type == "image" || type == "document" || type == "search_result") {
        bad_request(bat + ".type", "{}.type: {} input is not supported by this server", bat, type);
      } else {
        bad_request(bat + ".type", "{}.type: \"{}\" is not a {} content block this server reads", bat, type,
                    role->get<std::string>());
      }
    }
    if (*role == "assistant") {
      json message = {{"role", "assistant"}, {"content", text}};
      if (!thinking.empty()) message["reasoning_content"] = thinking;
      if (!calls.empty()) message["tool_calls"] = calls;
      out.push_back(std::move(message));
    } else if (!text.empty() || out.empty() || out.back()["role"] != "tool") {
      out.push_back({{"role", "user"}, {"content", text}});
    }
  }
  return out;
}

json convert_tools(const json& tools) {
  if (!tools.is_array()) bad_request("tools", "tools: expected an array");
  json out = json::array();
  for (size_t i = 0; i < tools.size(); ++i) {
    const json& t = tools[i];
    const std::string at = fmt::format("tools[{}]", i);
    if (!t.is_object()) bad_request(at, "{}: expected an object", at);
    if (const json* type = find(t, "type"); type && *type != "custom")
      bad_request(at + ".type", "{}.type: server tools ({}) are not supported; declare a client tool with name and "
                  "input_schema", at, dump(*type));
    check_keys(t, {"type", "name", "description", "input_schema", "cache_control"}, at);
    if (!find(t, "name") || !t["name"].is_string()) bad_request(at + ".name", "{}.name: expected a string", at);
    if (!find(t, "input_schema") || !t["input_schema"].is_object())
      bad_request(at + ".input_schema", "{}.input_schema: expected a JSON Schema object", at);
    json function = {{"name", t["name"]}, {"parameters", t["input_schema"]}};
    if (const json* d = find(t, "description")) function["description"] = *d;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

std::string error_type(int status) {
  switch (status) {
    case 400: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 413: return "request_too_large";
    case 429: return "rate_limit_error";
    case 503: return "overloaded_error";
    default: return status < 500 ? "invalid_request_error" : "api_error";
  }
}

std::string stop_reason(const std::string& finish, const json& stop_string) {
  if (finish == "length") return "max_tokens";
  if (finish == "tool_calls") return "tool_use";
  return stop_string.is_string() ? "stop_sequence" : "end_turn";
}

// Anthropic's usage of a usage_json object: input_tokens leaves out what the prefix cache supplied.
json anthropic_usage(const json& u) {
  const int64_t cached = cached_tokens(u);
  return {{"input_tokens", u.value("prompt_tokens", int64_t{0}) - cached},
          {"output_tokens", u.value("completion_tokens", int64_t{0})},
          {"cache_read_input_tokens", cached},
          {"cache_creation_input_tokens", 0}};
}

std::string event(const char* name, const json& data) { return fmt::format("event: {}\ndata: {}\n\n", name, dump(data)); }

class AnthropicStream final : public StreamFormat {
 public:
  explicit AnthropicStream(std::string model) : model_(std::move(model)), id_(random_id("msg_")) {}

  std::string open(int64_t prompt_tokens) override {
    json message = {{"id", id_},          {"type", "message"},      {"role", "assistant"},
                    {"model", model_},    {"content", json::array()}, {"stop_reason", nullptr},
                    {"stop_sequence", nullptr},
                    {"usage", {{"input_tokens", prompt_tokens}, {"output_tokens", 0}}}};
    return event("message_start", {{"type", "message_start"}, {"message", std::move(message)}}) +
           event("ping", {{"type", "ping"}});
  }

  std::string chunk(const json& c) override {
    std::string out;
    if (c["choices"].empty()) {  // the usage chunk
      usage_ = c["usage"];
      return out;
    }
    const json& choice = c["choices"][0];
    const json& delta = choice["delta"];
    if (const json* r = find(delta, "reasoning_content"); r && !r->get<std::string>().empty()) {
      out += ensure_block("thinking", {{"type", "thinking"}, {"thinking", ""}, {"signature", ""}});
      out += delta_event({{"type", "thinking_delta"}, {"thinking", *r}});
    }
    if (const json* t = find(delta, "content"); t && t->is_string() && !t->get<std::string>().empty()) {
      out += ensure_block("text", {{"type", "text"}, {"text", ""}});
      out += delta_event({{"type", "text_delta"}, {"text", *t}});
    }
    if (const json* calls = find(delta, "tool_calls"))
      for (const json& call : *calls) {
        if (const json* id = find(call, "id")) {
          out += close_block();
          out += start_block("tool_use", {{"type", "tool_use"}, {"id", *id}, {"name", call["function"]["name"]},
                                          {"input", json::object()}});
        }
        if (const json* f = find(call, "function"); f && find(*f, "arguments") && !(*f)["arguments"].get<std::string>().empty())
          out += delta_event({{"type", "input_json_delta"}, {"partial_json", (*f)["arguments"]}});
      }
    if (const json* f = find(choice, "finish_reason")) {
      stop_reason_ = stop_reason(f->get<std::string>(), choice.value("stop_reason", json(nullptr)));
      stop_sequence_ = choice.value("stop_reason", json(nullptr));
    }
    return out;
  }

  std::string close() override {
    std::string out = close_block();
    out += event("message_delta", {{"type", "message_delta"},
                                   {"delta", {{"stop_reason", stop_reason_}, {"stop_sequence", stop_sequence_}}},
                                   {"usage", anthropic_usage(usage_)}});
    out += event("message_stop", {{"type", "message_stop"}});
    return out;
  }

  std::string error(const ApiError& e) override {
    std::string out = close_block();
    return out + event("error", anthropic_error_body(e));
  }

 private:
  std::string ensure_block(const char* kind, json block) {
    if (open_ == kind) return "";
    std::string out = close_block();  // before the start: the two change the block index in turn
    return out + start_block(kind, std::move(block));
  }
  std::string start_block(const char* kind, json block) {
    open_ = kind;
    return event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", std::move(block)}});
  }
  std::string delta_event(json delta) {
    return event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", std::move(delta)}});
  }
  std::string close_block() {
    if (open_.empty()) return "";
    open_.clear();
    return event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_++}});
  }

  std::string model_, id_;
  std::string open_;  // the kind of the open content block, "" when none
  int index_ = 0;
  json usage_ = json::object();
  std::string stop_reason_ = "end_turn";
  json stop_sequence_ = nullptr;
};

}  // namespace

json anthropic_chat_body(const json& body, bool count_only) {
  check_keys(body, {"model", "messages", "system", "max_tokens", "stop_sequences", "stream", "temperature", "top_p",
                    "top_k", "tools", "tool_choice", "thinking", "metadata", "service_tier"},
             "");
  json chat = json::object();
  if (const json* m = find(body, "model")) chat["model"] = *m;
  json messages = json::array();
  if (const json* s = find(body, "system")) messages.push_back({{"role", "system"}, {"content", text_of(*s, "system")}});
  const json* given = find(body, "messages");
  if (!given) bad_request("messages", "messages: required");
  for (json& m : convert_messages(*given)) messages.push_back(std::move(m));
  chat["messages"] = std::move(messages);
  const json* max_tokens = find(body, "max_tokens");
  if (!max_tokens && !count_only) bad_request("max_tokens", "max_tokens: required");
  if (max_tokens) {
    if (!max_tokens->is_number_integer() || max_tokens->get<int64_t>() < 1)
      bad_request("max_tokens", "max_tokens: expected an integer of at least 1");
    chat["max_tokens"] = *max_tokens;
  }
  for (const char* key : {"temperature", "top_p", "top_k", "stream"})
    if (const json* v = find(body, key)) chat[key] = *v;
  if (const json* s = find(body, "stop_sequences")) chat["stop"] = *s;
  if (const json* tools = find(body, "tools")) chat["tools"] = convert_tools(*tools);
  if (const json* choice = find(body, "tool_choice")) {
    if (!choice->is_object() || !find(*choice, "type"))
      bad_request("tool_choice", "tool_choice: expected {{\"type\": \"auto\" | \"any\" | \"tool\" | \"none\"}}");
    check_keys(*choice, {"type", "name", "disable_parallel_tool_use"}, "tool_choice");
    const json& type = (*choice)["type"];
    if (type == "auto") {
      chat["tool_choice"] = "auto";
    } else if (type == "any") {
      chat["tool_choice"] = "required";
    } else if (type == "none") {
      chat["tool_choice"] = "none";
    } else if (type == "tool") {
      if (!find(*choice, "name") || !(*choice)["name"].is_string())
        bad_request("tool_choice.name", "tool_choice.name: required for {{\"type\": \"tool\"}}");
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*choice)["name"]}}}};
    } else {
      bad_request("tool_choice.type", "tool_choice.type: expected \"auto\", \"any\", \"tool\" or \"none\"");
    }
    if (const json* d = find(*choice, "disable_parallel_tool_use")) {
      if (!d->is_boolean()) bad_request("tool_choice.disable_parallel_tool_use", "tool_choice.disable_parallel_tool_use: expected a boolean");
      chat["parallel_tool_calls"] = !d->get<bool>();
    }
  }
  if (const json* t = find(body, "thinking")) {
    if (!t->is_object() || !find(*t, "type")) bad_request("thinking", "thinking: expected {{\"type\": \"enabled\" | \"disabled\"}}");
    if ((*t)["type"] == "disabled") {
      chat["chat_template_kwargs"] = {{"enable_thinking", false}};
    } else if ((*t)["type"] == "enabled") {
      // Qwen models think until they are done; a budget would cut their reasoning short, which is not done here.
      bad_request("thinking.budget_tokens", "thinking.budget_tokens: a thinking budget is not enforced by this server; "
                  "leave thinking out (the model thinks as its template decides) or send {{\"type\": \"disabled\"}}");
    } else {
      bad_request("thinking.type", "thinking.type: expected \"enabled\" or \"disabled\"");
    }
  }
  if (const json* m = find(body, "metadata")) {
    if (!m->is_object()) bad_request("metadata", "metadata: expected an object");
    check_keys(*m, {"user_id"}, "metadata");
    if (const json* u = find(*m, "user_id")) chat["user"] = *u;
  }
  if (const json* tier = find(body, "service_tier"); tier && *tier != "auto" && *tier != "standard_only")
    bad_request("service_tier", "service_tier: only \"auto\" or \"standard_only\" (one tier here)");
  // Which stop sequence ended a turn is part of the answer (stop_sequence).
  return chat;
}

json anthropic_message(const json& completion) {
  const json& choice = completion["choices"][0];
  const json& message = choice["message"];
  json content = json::array();
  if (const json* r = find(message, "reasoning_content"); r && !r->get<std::string>().empty())
    content.push_back({{"type", "thinking"}, {"thinking", *r}, {"signature", ""}});
  if (const json* t = find(message, "content"); t && t->is_string() && !t->get<std::string>().empty())
    content.push_back({{"type", "text"}, {"text", *t}});
  if (const json* calls = find(message, "tool_calls"))
    for (const json& call : *calls) {
      json input = json::parse(call["function"]["arguments"].get<std::string>(), nullptr, false);
      if (!input.is_object()) input = json::object();  // the grammar makes them objects; a cut-off one is not
      content.push_back({{"type", "tool_use"}, {"id", call["id"]}, {"name", call["function"]["name"]}, {"input", input}});
    }
  const json stop_string = choice.value("stop_reason", json(nullptr));
  return {{"id", random_id("msg_")},
          {"type", "message"},
          {"role", "assistant"},
          {"model", completion["model"]},
          {"content", std::move(content)},
          {"stop_reason", stop_reason(choice["finish_reason"].get<std::string>(), stop_string)},
          {"stop_sequence", stop_string},
          {"usage", anthropic_usage(completion["usage"])}};
}

json anthropic_error_body(const ApiError& e) {
  return {{"type", "error"}, {"error", {{"type", error_type(e.status)}, {"message", e.what()}}}};
}

std::unique_ptr<StreamFormat> anthropic_stream(const std::string& model) { return std::make_unique<AnthropicStream>(model); }

}  // namespace qinfer::server
