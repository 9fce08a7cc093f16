#include "tokenizer/chat_template.h"

#include <ctime>

#include "core/error.h"
#include "io/file.h"
#include "io/json.h"
#include "tokenizer/jinja/pystr.h"
#include "tokenizer/utf8.h"

namespace qinfer::tokenizer {
namespace {

using ordered_json = nlohmann::ordered_json;

std::string json_type(const ordered_json& j) { return j.type_name(); }

ordered_json read_json(const std::filesystem::path& path) {
  const std::string text = io::read_model_file(path);
  if (io::json_too_deep(text)) fail("{}: nested deeper than {} levels", path.string(), io::kMaxJsonDepth);
  try {
    return ordered_json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", path.string(), e.what());
  }
}

// transformers' special_tokens_map: each *_token as its text (AddedToken objects carry "content").
jinja::Dict special_tokens_of(const ordered_json& config) {
  jinja::Dict out;
  if (!config.is_object()) return out;
  auto text_of = [](const ordered_json& t) -> std::optional<std::string> {
    if (t.is_string()) return t.get<std::string>();
    if (t.is_object() && t.contains("content") && t["content"].is_string()) return t["content"].get<std::string>();
    return std::nullopt;
  };
  for (const char* key : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"}) {
    if (!config.contains(key)) continue;
    if (auto text = text_of(config[key])) out.set(jinja::Value(key), jinja::Value(*text));
  }
  if (config.contains("additional_special_tokens") && config["additional_special_tokens"].is_array()) {
    jinja::ValueList tokens;
    for (const auto& t : config["additional_special_tokens"])
      if (auto text = text_of(t)) tokens.emplace_back(*text);
    out.set(jinja::Value("additional_special_tokens"), jinja::Value(std::move(tokens)));
  }
  return out;
}

jinja::Template compile(std::string_view source, const std::string& origin) {
  QINFER_CHECK(is_valid_utf8(source), "{}: the chat template is not valid UTF-8", origin);
  return jinja::Template(source, origin);
}

jinja::Value function(std::string name, std::function<jinja::Value(jinja::CallArgs&)> call) {
  return jinja::Value(std::make_shared<jinja::Function>(jinja::Function{std::move(name), std::move(call)}));
}

jinja::Value raise_exception_function() {
  return function("raise_exception", [](jinja::CallArgs& args) -> jinja::Value {
    const std::string message = args.positional.empty() ? "" : jinja::to_str(args.positional[0]);
    throw jinja::Error(jinja::ErrorKind::raised, message);
  });
}

jinja::Value strftime_now_function() {
  return function("strftime_now", [](jinja::CallArgs& args) -> jinja::Value {
    if (args.positional.size() != 1 || !args.positional[0].is_string())
      jinja::raise(jinja::ErrorKind::type, "strftime_now() takes one format string");
    const std::string& format = args.positional[0].as_string();
    const std::time_t now = std::time(nullptr);
    std::tm local{};
    localtime_r(&now, &local);
    std::string out(64 + format.size() * 4, '\0');
    const size_t n = std::strftime(out.data(), out.size(), format.c_str(), &local);
    out.resize(n);
    return jinja::Value(std::move(out));
  });
}

// The request as the template will see it, with the normalizations in the header's comment.
ordered_json normalized_messages(const ordered_json& request) {
  QINFER_CHECK(request.contains("messages"), "request: missing \"messages\"");
  const ordered_json& messages = request["messages"];
  QINFER_CHECK(messages.is_array(), "request: messages: expected an array, got {}", json_type(messages));
  QINFER_CHECK(!messages.empty(), "request: messages: must not be empty");
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < messages.size(); ++i) {
    ordered_json m = messages[i];
    QINFER_CHECK(m.is_object(), "request: messages[{}]: expected an object, got {}", i, json_type(m));
    QINFER_CHECK(m.contains("role") && m["role"].is_string(), "request: messages[{}].role: expected a string, got {}",
                 i, m.contains("role") ? json_type(m["role"]) : "nothing");
    if (!m.contains("content") || m["content"].is_null()) m["content"] = "";
    const ordered_json& content = m["content"];
    QINFER_CHECK(content.is_string() || content.is_array(),
                 "request: messages[{}].content: expected a string or an array of content parts, got {}", i,
                 json_type(content));
    if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
      for (size_t k = 0; k < m["tool_calls"].size(); ++k) {
        ordered_json& call = m["tool_calls"][k];
        if (!call.is_object() || !call.contains("function") || !call["function"].is_object()) continue;
        ordered_json& function = call["function"];
        if (!function.contains("arguments") || !function["arguments"].is_string()) continue;
        const std::string text = function["arguments"].get<std::string>();
        if (io::json_too_deep(text))
          fail("request: messages[{}].tool_calls[{}].function.arguments: nested deeper than {} levels", i, k,
               io::kMaxJsonDepth);
        try {
          function["arguments"] = text.empty() ? ordered_json::object() : ordered_json::parse(text);
        } catch (const nlohmann::json::exception& e) {
          fail("request: messages[{}].tool_calls[{}].function.arguments: not valid JSON: {}", i, k, e.what());
        }
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

bool bool_field(const ordered_json& request, const char* key, bool fallback) {
  if (!request.contains(key) || request[key].is_null()) return fallback;
  QINFER_CHECK(request[key].is_boolean(), "request: {}: expected true or false, got {}", key, json_type(request[key]));
  return request[key].get<bool>();
}

// transformers' continue_final_message: cut the prompt right after the last message's text, so
// generation continues it instead of starting a new turn (same steps as apply_chat_template).
std::string cut_after_final_message(const std::string& prompt, const ordered_json& last) {
  std::string final_text;
  const ordered_json& content = last["content"];
  if (content.is_string()) {
    final_text = content.get<std::string>();
  } else {
    bool found = false;
    for (auto it = content.rbegin(); it != content.rend() && !found; ++it) {
      if (it->is_object() && it->contains("text") && (*it)["text"].is_string()) {
        final_text = (*it)["text"].get<std::string>();
        found = true;
      }
    }
    QINFER_CHECK(found, "request: continue_final_message is set but the final message has no text to continue");
  }
  const std::string stripped = jinja::py::strip(final_text, std::nullopt, true, true);
  const std::string lstripped = jinja::py::strip(final_text, std::nullopt, true, false);
  const size_t at = prompt.rfind(stripped);
  QINFER_CHECK(at != std::string::npos,
               "request: continue_final_message is set but the final message does not appear in the rendered "
               "prompt (the chat template changes it)");
  if (prompt.compare(at, lstripped.size(), final_text) == 0) return prompt.substr(0, at + lstripped.size());
  return prompt.substr(0, at + stripped.size());
}

}  // namespace

ChatTemplate::ChatTemplate(std::string_view source, std::string origin, const ordered_json& tokenizer_config)
    : special_tokens_(special_tokens_of(tokenizer_config)) {
  templates_.emplace_back("default", compile(source, origin));
}

ChatTemplate::ChatTemplate(std::vector<std::pair<std::string, std::string>> named_sources, std::string origin,
                           const ordered_json& tokenizer_config)
    : special_tokens_(special_tokens_of(tokenizer_config)) {
  QINFER_CHECK(!named_sources.empty(), "{}: no chat templates", origin);
  for (auto& [name, source] : named_sources)
    templates_.emplace_back(name, compile(source, fmt::format("{} (template '{}')", origin, name)));
}

ChatTemplate ChatTemplate::from_model_dir(const std::filesystem::path& dir) {
  const auto config_path = dir / "tokenizer_config.json";
  ordered_json config = std::filesystem::exists(config_path) ? read_json(config_path) : ordered_json::object();
  const auto jinja_path = dir / "chat_template.jinja";
  // Origins name files inside the model folder: render errors reach clients, which need no server paths.
  if (std::filesystem::exists(jinja_path))
    return ChatTemplate(io::read_model_file(jinja_path), "chat_template.jinja", config);
  if (config.contains("chat_template")) {
    const ordered_json& t = config["chat_template"];
    const std::string origin = "tokenizer_config.json[chat_template]";
    if (t.is_string()) return ChatTemplate(t.get<std::string>(), origin, config);
    QINFER_CHECK(t.is_array(), "{}: expected a string or a list of {{name, template}}, got {}", origin, json_type(t));
    std::vector<std::pair<std::string, std::string>> named;
    for (const auto& item : t) {
      QINFER_CHECK(item.is_object() && item.contains("name") && item["name"].is_string() && item.contains("template") &&
                       item["template"].is_string(),
                   "{}: every entry needs a string \"name\" and \"template\"", origin);
      named.emplace_back(item["name"].get<std::string>(), item["template"].get<std::string>());
    }
    return ChatTemplate(std::move(named), origin, config);
  }
  const auto processor_path = dir / "chat_template.json";
  if (std::filesystem::exists(processor_path)) {
    const ordered_json processor = read_json(processor_path);
    QINFER_CHECK(processor.contains("chat_template") && processor["chat_template"].is_string(),
                 "{}: missing a string \"chat_template\"", processor_path.string());
    return ChatTemplate(processor["chat_template"].get<std::string>(), "chat_template.json", config);
  }
  fail("{}: no chat template (looked for chat_template.jinja, \"chat_template\" in tokenizer_config.json, and "
       "chat_template.json)",
       dir.string());
}

std::string ChatTemplate::render(const ordered_json& request, const jinja::Limits& limits) const {
  QINFER_CHECK(request.is_object(), "request: expected a JSON object, got {}", json_type(request));
  const ordered_json messages = normalized_messages(request);
  const bool has_tools = request.contains("tools") && !request["tools"].is_null();
  if (has_tools)
    QINFER_CHECK(request["tools"].is_array(), "request: tools: expected an array, got {}", json_type(request["tools"]));
  const bool continue_final = bool_field(request, "continue_final_message", false);
  const bool add_generation_prompt = bool_field(request, "add_generation_prompt", true);
  QINFER_CHECK(!(continue_final && add_generation_prompt),
               "request: continue_final_message and add_generation_prompt cannot both be true (set "
               "add_generation_prompt to false to continue the final message)");

  jinja::Dict context;
  context.set("raise_exception", raise_exception_function());
  context.set("strftime_now", strftime_now_function());
  for (const auto& [k, v] : special_tokens_.entries()) context.set(k, v);
  if (request.contains("chat_template_kwargs") && !request["chat_template_kwargs"].is_null()) {
    const ordered_json& kwargs = request["chat_template_kwargs"];
    QINFER_CHECK(kwargs.is_object(), "request: chat_template_kwargs: expected an object, got {}", json_type(kwargs));
    for (const auto& [key, value] : kwargs.items()) {
      QINFER_CHECK(key != "messages" && key != "tools" && key != "documents" && key != "add_generation_prompt",
                   "request: chat_template_kwargs.{}: set it as a top-level request field instead", key);
      context.set(jinja::Value(key), jinja::Value::from_json(value));
    }
  }
  context.set("messages", jinja::Value::from_json(messages));
  context.set("tools", has_tools ? jinja::Value::from_json(request["tools"]) : jinja::Value(nullptr));
  context.set("documents", request.contains("documents") ? jinja::Value::from_json(request["documents"])
                                                          : jinja::Value(nullptr));
  context.set("add_generation_prompt", add_generation_prompt);

  const jinja::Template* chosen = templates_.size() == 1 ? &templates_[0].second : nullptr;
  for (const char* wanted : {"tool_use", "default"}) {
    if (chosen || (!has_tools && std::string_view(wanted) == "tool_use")) continue;
    for (const auto& [name, t] : templates_)
      if (name == wanted) chosen = &t;
  }
  if (!chosen) {
    std::string names;
    for (const auto& [name, t] : templates_) names += (names.empty() ? "" : ", ") + name;
    fail("no 'default' chat template among the named templates ({})", names);
  }
  std::string prompt = chosen->render(context, limits);
  if (continue_final) prompt = cut_after_final_message(prompt, messages.back());
  return prompt;
}

}  // namespace qinfer::tokenizer
