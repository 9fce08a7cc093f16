#include "server/responses_api.h"

#include <chrono>
#include <set>
#include <utility>

#include "server/request.h"
#include "server/responses.h"

namespace qinfer::server {
namespace {

constexpr auto find = member;

// 400 for a member the API does not define or this server does not implement.
void check_keys(const json& object, const std::set<std::string>& known, const std::string& where) {
  refuse_unknown_members(object, known, where, "Responses API");
}

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Text of content given as a string or as parts (input_text, output_text, summary_text, reasoning_text).
std::string text_of(const json& content, const std::string& field) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array()) bad_request(field, "{}: expected a string or an array of content parts", field);
  std::string out;
  for (size_t i = 0; i < content.size(); ++i) {
    const json& part = content[i];
    const std::string at = fmt::format("{}[{}]", field, i);
    const json* type = part.is_object() ? find(part, "type") : nullptr;
    if (!type || !type->is_string()) bad_request(at, "{}: expected a content part with a \"type\"", at);
    static const std::set<std::string> texts = {"input_text", "output_text", "summary_text", "reasoning_text", "text"};
    if (!texts.contains(type->get<std::string>()))
      bad_request(at + ".type", "{}.type: {} is not supported by this server", at, type->get<std::string>());
    if (!find(part, "text") || !part["text"].is_string()) bad_request(at + ".text", "{}.text: expected a string", at);
    out += part["text"].get<std::string>();
  }
  return out;
}

// Chat messages of the input items.
json convert_input(const json& input) {
  json out = json::array();
  if (input.is_string()) {
    out.push_back({{"role", "user"}, {"content", input}});
    return out;
  }
  if (!input.is_array()) bad_request("input", "input: expected a string or an array of items");
  std::string reasoning;  // a reasoning item's text, for the assistant message after it
  for (size_t i = 0; i < input.size(); ++i) {
    const json& item = input[i];
    const std::string at = fmt::format("input[{}]", i);
    if (!item.is_object()) bad_request(at, "{}: expected an object", at);
    const json* type_field = find(item, "type");
    const std::string type = type_field && type_field->is_string() ? type_field->get<std::string>() : "message";
    if (type == "message") {
      check_keys(item, {"type", "role", "content", "id", "status"}, at);
      const json* role = find(item, "role");
      static const std::set<std::string> roles = {"user", "system", "developer", "assistant"};
      if (!role || !role->is_string() || !roles.contains(role->get<std::string>()))
        bad_request(at + ".role", "{}.role: expected \"user\", \"system\", \"developer\" or \"assistant\"", at);
      if (!find(item, "content")) bad_request(at + ".content", "{}.content: required", at);
      const std::string text = text_of(item["content"], at + ".content");
      if (*role == "assistant") {
        json m = {{"role", "assistant"}, {"content", text}};
        if (!reasoning.empty()) m["reasoning_content"] = std::exchange(reasoning, {});
        out.push_back(std::move(m));
      } else {
        out.push_back({{"role", *role}, {"content", text}});
      }
    } else if (type == "function_call") {
      check_keys(item, {"type", "call_id", "name", "arguments", "id", "status"}, at);
      for (const char* key : {"call_id", "name", "arguments"})
        if (!find(item, key) || !item[key].is_string()) bad_request(at + "." + key, "{}.{}: expected a string", at, key);
      // Calls of one turn follow each other (and the turn's text): they join its assistant message.
      if (out.empty() || out.back()["role"] != "assistant" || !reasoning.empty()) {
        out.push_back({{"role", "assistant"}, {"content", ""}});
        if (!reasoning.empty()) out.back()["reasoning_content"] = std::exchange(reasoning, {});
      }
      json& m = out.back();
      if (!m.contains("tool_calls")) m["tool_calls"] = json::array();
      m["tool_calls"].push_back({{"id", item["call_id"]}, {"type", "function"},
                                 {"function", {{"name", item["name"]}, {"arguments", item["arguments"]}}}});
    } else if (type == "function_call_output") {
      check_keys(item, {"type", "call_id", "output", "id", "status"}, at);
      if (!find(item, "call_id") || !item["call_id"].is_string())
        bad_request(at + ".call_id", "{}.call_id: expected a string", at);
      if (!find(item, "output")) bad_request(at + ".output", "{}.output: required", at);
      out.push_back({{"role", "tool"}, {"tool_call_id", item["call_id"]}, {"content", text_of(item["output"], at + ".output")}});
    } else if (type == "reasoning") {
      check_keys(item, {"type", "id", "summary", "content", "encrypted_content", "status"}, at);
      if (find(item, "encrypted_content"))
        bad_request(at + ".encrypted_content", "{}.encrypted_content: encrypted reasoning is not read here", at);
      if (const json* c = find(item, "content")) reasoning += text_of(*c, at + ".content");
      else if (const json* s = find(item, "summary")) reasoning += text_of(*s, at + ".summary");
    } else {
      bad_request(at + ".type", "{}.type: \"{}\" items are not supported by this server", at, type);
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
    if (!t.is_object() || !find(t, "type")) bad_request(at, "{}: expected a tool with a \"type\"", at);
    if (t["type"] != "function")
      bad_request(at + ".type", "{}.type: {} tools are not supported here; declare function tools", at, dump(t["type"]));
    check_keys(t, {"type", "name", "description", "parameters", "strict"}, at);
    if (!find(t, "name") || !t["name"].is_string()) bad_request(at + ".name", "{}.name: expected a string", at);
    json function = {{"name", t["name"]}};
    for (const char* key : {"description", "parameters", "strict"})
      if (const json* v = find(t, key)) function[key] = *v;
    out.push_back({{"type", "function"}, {"function", std::move(function)}});
  }
  return out;
}

json usage_object(const json& u) {
  const int64_t cached = cached_tokens(u);
  const int64_t input = u.value("prompt_tokens", int64_t{0}), output = u.value("completion_tokens", int64_t{0});
  return {{"input_tokens", input},
          {"input_tokens_details", {{"cached_tokens", cached}}},
          {"output_tokens", output},
          {"output_tokens_details", {{"reasoning_tokens", 0}}},
          {"total_tokens", input + output}};
}

// The response object around its output items.
json response_object(const ResponsesRequest& r, const std::string& status, json output, const json& usage,
                     const std::string& model, bool truncated) {
  json out = {{"id", r.id},
              {"object", "response"},
              {"created_at", unix_now()},
              {"status", status},
              {"error", nullptr},
              {"incomplete_details", truncated ? json{{"reason", "max_output_tokens"}} : json(nullptr)},
              {"model", model},
              {"output", std::move(output)},
              {"usage", usage.is_null() ? json(nullptr) : usage_object(usage)}};
  for (const auto& item : r.echo.items()) out[item.key()] = item.value();
  return out;
}

std::string event(json data, int& sequence) {
  data["sequence_number"] = sequence++;
  const std::string type = data["type"].get<std::string>();
  return fmt::format("event: {}\ndata: {}\n\n", type, dump(data));
}

class ResponsesStream final : public StreamFormat {
 public:
  ResponsesStream(ResponsesRequest r, ResponseStore& store) : request_(std::move(r)), store_(store) {}

  std::string open(int64_t) override {
    const json response = response_object(request_, "in_progress", json::array(), nullptr,
                                          request_.chat.value("model", ""), false);
    std::string out = event({{"type", "response.created"}, {"response", response}}, sequence_);
    return out + event({{"type", "response.in_progress"}, {"response", response}}, sequence_);
  }

  std::string chunk(const json& c) override {
    std::string out;
    if (c["choices"].empty()) {
      usage_ = c["usage"];
      return out;
    }
    model_ = c.value("model", "");
    const json& choice = c["choices"][0];
    const json& delta = choice["delta"];
    if (const json* r = find(delta, "reasoning_content"); r && !r->get<std::string>().empty()) {
      out += ensure("reasoning");
      text_ += r->get<std::string>();
      out += event({{"type", "response.reasoning_text.delta"}, {"item_id", item_["id"]}, {"output_index", index()},
                    {"content_index", 0}, {"delta", *r}},
                   sequence_);
    }
    if (const json* t = find(delta, "content"); t && t->is_string() && !t->get<std::string>().empty()) {
      out += ensure("message");
      text_ += t->get<std::string>();
      out += event({{"type", "response.output_text.delta"}, {"item_id", item_["id"]}, {"output_index", index()},
                    {"content_index", 0}, {"delta", *t}, {"logprobs", json::array()}},
                   sequence_);
    }
    if (const json* calls = find(delta, "tool_calls"))
      for (const json& call : *calls) {
        if (const json* id = find(call, "id")) {
          out += close_item();
          item_ = {{"type", "function_call"}, {"id", random_id("fc_")}, {"call_id", *id},
                   {"name", call["function"]["name"]}, {"arguments", ""}, {"status", "in_progress"}};
          out += event({{"type", "response.output_item.added"}, {"output_index", index()}, {"item", item_}}, sequence_);
        }
        if (const json* f = find(call, "function"); f && find(*f, "arguments") && !item_.is_null()) {
          const std::string piece = (*f)["arguments"].get<std::string>();
          if (piece.empty()) continue;
          text_ += piece;
          out += event({{"type", "response.function_call_arguments.delta"}, {"item_id", item_["id"]},
                        {"output_index", index()}, {"delta", piece}},
                       sequence_);
        }
      }
    if (const json* f = find(choice, "finish_reason")) finish_ = f->get<std::string>();
    return out;
  }

  std::string close() override {
    std::string out = close_item();
    const bool truncated = finish_ == "length";
    const json response = response_object(request_, truncated ? "incomplete" : "completed", output_, usage_,
                                          model_.empty() ? request_.chat.value("model", "") : model_, truncated);
    store_.keep(request_, response, message_);
    out += event({{"type", truncated ? "response.incomplete" : "response.completed"}, {"response", response}}, sequence_);
    return out;
  }

  std::string error(const ApiError& e) override {
    std::string out = close_item();
    return out + event({{"type", "error"}, {"code", e.code.empty() ? json(e.type) : json(e.code)}, {"message", e.what()},
                        {"param", e.param.empty() ? json(nullptr) : json(e.param)}},
                       sequence_);
  }

 private:
  int index() const { return static_cast<int>(output_.size()); }

  std::string ensure(const char* kind) {
    if (!item_.is_null() && item_["type"] == kind) return "";
    std::string out = close_item();
    if (std::string_view(kind) == "reasoning") {
      item_ = {{"type", "reasoning"}, {"id", random_id("rs_")}, {"summary", json::array()}, {"content", json::array()}};
      out += event({{"type", "response.output_item.added"}, {"output_index", index()}, {"item", item_}}, sequence_);
      out += event({{"type", "response.content_part.added"}, {"item_id", item_["id"]}, {"output_index", index()},
                    {"content_index", 0}, {"part", {{"type", "reasoning_text"}, {"text", ""}}}},
                   sequence_);
    } else {
      item_ = {{"type", "message"}, {"id", random_id("msg_")}, {"status", "in_progress"}, {"role", "assistant"},
               {"content", json::array()}};
      out += event({{"type", "response.output_item.added"}, {"output_index", index()}, {"item", item_}}, sequence_);
      out += event({{"type", "response.content_part.added"}, {"item_id", item_["id"]}, {"output_index", index()},
                    {"content_index", 0},
                    {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}, {"logprobs", json::array()}}}},
                   sequence_);
    }
    return out;
  }

  std::string close_item() {
    if (item_.is_null()) return "";
    std::string out;
    const std::string type = item_["type"].get<std::string>();
    const std::string text = std::exchange(text_, {});
    if (type == "reasoning") {
      const json part = {{"type", "reasoning_text"}, {"text", text}};
      out += event({{"type", "response.reasoning_text.done"}, {"item_id", item_["id"]}, {"output_index", index()},
                    {"content_index", 0}, {"text", text}},
                   sequence_);
      out += event({{"type", "response.content_part.done"}, {"item_id", item_["id"]}, {"output_index", index()},
                    {"content_index", 0}, {"part", part}},
                   sequence_);
      item_["content"] = json::array({part});
      message_["reasoning_content"] = message_.value("reasoning_content", "") + text;
    } else if (type == "message") {
      const json part = {{"type", "output_text"}, {"text", text}, {"annotations", json::array()}, {"logprobs", json::array()}};
      out += event({{"type", "response.output_text.done"}, {"item_id", item_["id"]}, {"output_index", index()},
                    {"content_index", 0}, {"text", text}, {"logprobs", json::array()}},
                   sequence_);
      out += event({{"type", "response.content_part.done"}, {"item_id", item_["id"]}, {"output_index", index()},
                    {"content_index", 0}, {"part", part}},
                   sequence_);
      item_["content"] = json::array({part});
      item_["status"] = "completed";
      message_["content"] = message_.value("content", "") + text;
    } else {
      item_["arguments"] = text;
      item_["status"] = "completed";
      out += event({{"type", "response.function_call_arguments.done"}, {"item_id", item_["id"]},
                    {"output_index", index()}, {"arguments", text}},
                   sequence_);
      if (!message_.contains("tool_calls")) message_["tool_calls"] = json::array();
      message_["tool_calls"].push_back({{"id", item_["call_id"]}, {"type", "function"},
                                        {"function", {{"name", item_["name"]}, {"arguments", text}}}});
    }
    out += event({{"type", "response.output_item.done"}, {"output_index", index()}, {"item", item_}}, sequence_);
    output_.push_back(std::exchange(item_, nullptr));
    return out;
  }

  ResponsesRequest request_;
  ResponseStore& store_;
  int sequence_ = 0;
  json item_ = nullptr;  // the output item being streamed
  std::string text_;     // its text (or arguments) so far
  json output_ = json::array();
  json message_ = {{"role", "assistant"}, {"content", ""}};
  json usage_ = nullptr;
  std::string finish_, model_;
};

}  // namespace

ResponseStore::ResponseStore(size_t max_responses, size_t max_bytes) : max_responses_(max_responses), max_bytes_(max_bytes) {}

void ResponseStore::touch(Entry& e, const std::string& id) {
  order_.erase(e.order);
  order_.push_front(id);
  e.order = order_.begin();
}

void ResponseStore::put(const std::string& id, json response, json conversation) {
  std::lock_guard lock(mutex_);
  const size_t bytes = dump(response).size() + dump(conversation).size();
  if (bytes > max_bytes_) return;  // larger than the whole store: kept nowhere
  if (auto it = entries_.find(id); it != entries_.end()) {
    bytes_ -= it->second.bytes;
    order_.erase(it->second.order);
    entries_.erase(it);
  }
  order_.push_front(id);
  entries_[id] = {std::move(response), std::move(conversation), bytes, order_.begin()};
  bytes_ += bytes;
  while (entries_.size() > max_responses_ || bytes_ > max_bytes_) {
    const std::string oldest = order_.back();
    order_.pop_back();
    bytes_ -= entries_[oldest].bytes;
    entries_.erase(oldest);
  }
}

void ResponseStore::keep(const ResponsesRequest& r, const json& response, const json& message) {
  if (!r.store) return;
  json conversation = r.conversation;
  conversation.push_back(message);
  put(r.id, response, std::move(conversation));
}

std::optional<json> ResponseStore::response(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  touch(it->second, id);
  return it->second.response;
}

std::optional<json> ResponseStore::conversation(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return std::nullopt;
  touch(it->second, id);
  return it->second.conversation;
}

bool ResponseStore::erase(const std::string& id) {
  std::lock_guard lock(mutex_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  bytes_ -= it->second.bytes;
  order_.erase(it->second.order);
  entries_.erase(it);
  return true;
}

ResponsesRequest responses_request(const json& body, ResponseStore& store) {
  check_keys(body, {"model", "input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "max_output_tokens",
                    "temperature", "top_p", "stream", "store", "previous_response_id", "metadata", "user", "text",
                    "reasoning", "truncation", "service_tier", "safety_identifier", "prompt_cache_key", "include",
                    "background", "max_tool_calls", "top_logprobs", "stream_options"},
             "");
  ResponsesRequest r;
  r.id = random_id("resp_");
  json& chat = r.chat;
  chat = json::object();
  json echo = {{"instructions", nullptr}, {"max_output_tokens", nullptr}, {"metadata", json::object()},
               {"parallel_tool_calls", true}, {"previous_response_id", nullptr}, {"reasoning", {{"effort", nullptr}, {"summary", nullptr}}},
               {"store", true}, {"temperature", 1.0}, {"text", {{"format", {{"type", "text"}}}}},
               {"tool_choice", "auto"}, {"tools", json::array()}, {"top_p", 1.0}, {"truncation", "disabled"}, {"user", nullptr}};
  if (const json* m = find(body, "model")) chat["model"] = *m;
  // Defaults that change nothing are accepted; what would change the answer is refused.
  if (const json* b = find(body, "background"); b && *b != false) bad_request("background", "background: responses run in the foreground here");
  if (const json* t = find(body, "truncation"); t && *t != "disabled")
    bad_request("truncation", "truncation: only \"disabled\" (a conversation longer than the context is refused)");
  if (const json* inc = find(body, "include"); inc && !(inc->is_array() && inc->empty()))
    bad_request("include", "include: no extra output data is available here");
  if (find(body, "max_tool_calls")) bad_request("max_tool_calls", "max_tool_calls: not supported; use parallel_tool_calls");
  if (const json* n = find(body, "top_logprobs"); n && *n != 0) bad_request("top_logprobs", "top_logprobs: not supported on /v1/responses; use /v1/chat/completions");
  if (const json* so = find(body, "stream_options"); so && !(so->is_object() && so->value("include_obfuscation", false) == false))
    bad_request("stream_options", "stream_options: only include_obfuscation false");
  if (const json* tier = find(body, "service_tier"); tier && *tier != "auto" && *tier != "default")
    bad_request("service_tier", "service_tier: only \"auto\" or \"default\" (one tier here)");
  for (const char* key : {"user", "safety_identifier", "prompt_cache_key"})
    if (const json* v = find(body, key); v && !v->is_string()) bad_request(key, "{}: expected a string", key);
  if (const json* u = find(body, "user")) chat["user"] = *u, echo["user"] = *u;

  json conversation = json::array();
  if (const json* prev = find(body, "previous_response_id")) {
    if (!prev->is_string()) bad_request("previous_response_id", "previous_response_id: expected a string");
    std::optional<json> earlier = store.conversation(prev->get<std::string>());
    if (!earlier)
      throw ApiError(404, "invalid_request_error", "previous_response_not_found", "previous_response_id",
                     fmt::format("Previous response with id '{}' not found.", prev->get<std::string>()));
    conversation = std::move(*earlier);
    echo["previous_response_id"] = *prev;
  }
  const json* input = find(body, "input");
  if (!input) bad_request("input", "input: required");
  for (json& m : convert_input(*input)) conversation.push_back(std::move(m));
  r.conversation = conversation;
  json messages = json::array();
  if (const json* ins = find(body, "instructions")) {
    if (!ins->is_string()) bad_request("instructions", "instructions: expected a string");
    messages.push_back({{"role", "system"}, {"content", *ins}});
    echo["instructions"] = *ins;
  }
  for (const json& m : conversation) messages.push_back(m);
  chat["messages"] = std::move(messages);

  if (const json* n = find(body, "max_output_tokens")) {
    if (!n->is_number_integer() || n->get<int64_t>() < 1)
      bad_request("max_output_tokens", "max_output_tokens: expected an integer of at least 1");
    chat["max_tokens"] = *n;
    echo["max_output_tokens"] = *n;
  }
  for (const char* key : {"temperature", "top_p"})
    if (const json* v = find(body, key)) chat[key] = *v, echo[key] = *v;
  if (const json* s = find(body, "stream")) {
    if (!s->is_boolean()) bad_request("stream", "stream: expected a boolean");
    chat["stream"] = *s;
    r.stream = s->get<bool>();
  }
  if (const json* s = find(body, "store")) {
    if (!s->is_boolean()) bad_request("store", "store: expected a boolean");
    r.store = s->get<bool>();
    echo["store"] = *s;
  }
  if (const json* m = find(body, "metadata")) {
    if (!m->is_object() || m->size() > 16) bad_request("metadata", "metadata: expected an object of at most 16 keys");
    for (const auto& kv : m->items())
      if (!kv.value().is_string()) bad_request("metadata." + kv.key(), "metadata.{}: expected a string", kv.key());
    echo["metadata"] = *m;
  }
  if (const json* tools = find(body, "tools")) {
    chat["tools"] = convert_tools(*tools);
    echo["tools"] = *tools;
  }
  if (const json* choice = find(body, "tool_choice")) {
    if (choice->is_string()) {
      chat["tool_choice"] = *choice;
    } else if (choice->is_object() && find(*choice, "type") && (*choice)["type"] == "function" && find(*choice, "name")) {
      chat["tool_choice"] = {{"type", "function"}, {"function", {{"name", (*choice)["name"]}}}};
    } else {
      bad_request("tool_choice", "tool_choice: expected \"auto\", \"none\", \"required\" or {{\"type\": \"function\", \"name\": ...}}");
    }
    echo["tool_choice"] = *choice;
  }
  if (const json* p = find(body, "parallel_tool_calls")) chat["parallel_tool_calls"] = *p, echo["parallel_tool_calls"] = *p;
  if (const json* text = find(body, "text")) {
    if (!text->is_object()) bad_request("text", "text: expected an object");
    check_keys(*text, {"format", "verbosity"}, "text");
    if (const json* v = find(*text, "verbosity"); v && *v != "medium")
      bad_request("text.verbosity", "text.verbosity: only \"medium\" (the model has no verbosity setting)");
    if (const json* f = find(*text, "format")) {
      if (!f->is_object() || !find(*f, "type")) bad_request("text.format", "text.format: expected an object with a \"type\"");
      if ((*f)["type"] == "json_schema") {
        json schema = {{"name", f->value("name", "response")}};
        if (const json* s = find(*f, "schema")) schema["schema"] = *s;
        if (const json* s = find(*f, "strict")) schema["strict"] = *s;
        if (const json* d = find(*f, "description")) schema["description"] = *d;
        chat["response_format"] = {{"type", "json_schema"}, {"json_schema", std::move(schema)}};
      } else if ((*f)["type"] == "json_object") {
        chat["response_format"] = {{"type", "json_object"}};
      } else if ((*f)["type"] != "text") {
        bad_request("text.format.type", "text.format.type: expected \"text\", \"json_object\" or \"json_schema\"");
      }
      echo["text"] = {{"format", *f}};
    }
  }
  if (const json* reasoning = find(body, "reasoning")) {
    if (!reasoning->is_object()) bad_request("reasoning", "reasoning: expected an object");
    check_keys(*reasoning, {"effort", "summary", "generate_summary"}, "reasoning");
    if (find(*reasoning, "summary")) bad_request("reasoning.summary", "reasoning.summary: reasoning is returned whole, not summarized");
    if (const json* e = find(*reasoning, "effort")) {
      // Qwen models reason fully or not at all (enable_thinking): the efforts in between have no meaning.
      if (*e == "none" || *e == "minimal")
        chat["chat_template_kwargs"] = {{"enable_thinking", false}};
      else if (*e == "high")
        chat["chat_template_kwargs"] = {{"enable_thinking", true}};
      else
        bad_request("reasoning.effort", "reasoning.effort: \"none\" or \"minimal\" (no reasoning) or \"high\" (full "
                    "reasoning); the model has nothing in between");
      echo["reasoning"]["effort"] = *e;
    }
  }
  r.echo = std::move(echo);
  return r;
}

json assistant_message(const json& completion) {
  const json& m = completion["choices"][0]["message"];
  json out = {{"role", "assistant"}, {"content", m["content"].is_string() ? m["content"] : json("")}};
  if (const json* r = find(m, "reasoning_content")) out["reasoning_content"] = *r;
  if (const json* calls = find(m, "tool_calls")) out["tool_calls"] = *calls;
  return out;
}

json responses_object(const ResponsesRequest& r, const json& completion) {
  const json& choice = completion["choices"][0];
  const json& m = choice["message"];
  json output = json::array();
  if (const json* reasoning = find(m, "reasoning_content"); reasoning && !reasoning->get<std::string>().empty())
    output.push_back({{"type", "reasoning"}, {"id", random_id("rs_")}, {"summary", json::array()},
                      {"content", json::array({{{"type", "reasoning_text"}, {"text", *reasoning}}})}});
  const json* calls = find(m, "tool_calls");
  if (const json* t = find(m, "content"); (t && t->is_string() && !t->get<std::string>().empty()) || !calls)
    output.push_back({{"type", "message"}, {"id", random_id("msg_")}, {"status", "completed"}, {"role", "assistant"},
                      {"content", json::array({{{"type", "output_text"}, {"text", t && t->is_string() ? *t : json("")},
                                                {"annotations", json::array()}, {"logprobs", json::array()}}})}});
  if (calls)
    for (const json& call : *calls)
      output.push_back({{"type", "function_call"}, {"id", random_id("fc_")}, {"call_id", call["id"]},
                        {"name", call["function"]["name"]}, {"arguments", call["function"]["arguments"]},
                        {"status", "completed"}});
  const bool truncated = choice["finish_reason"] == "length";
  return response_object(r, truncated ? "incomplete" : "completed", std::move(output), completion["usage"],
                         completion.value("model", ""), truncated);
}

std::unique_ptr<StreamFormat> responses_stream(ResponsesRequest r, ResponseStore& store) {
  return std::make_unique<ResponsesStream>(std::move(r), store);
}

}  // namespace qinfer::server
