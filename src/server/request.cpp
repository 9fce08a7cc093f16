#include "server/request.h"

#include <cmath>
#include <limits>
#include <set>

#include "io/json.h"

namespace qinfer::server {

const json* member(const json& object, const char* key) {
  auto it = object.find(key);
  return it == object.end() || it->is_null() ? nullptr : &*it;
}

void refuse_unknown_members(const json& object, const std::set<std::string>& known, const std::string& where,
                            std::string_view api) {
  for (const auto& item : object.items())
    if (!known.contains(item.key())) {
      const std::string field = where.empty() ? item.key() : where + "." + item.key();
      bad_request(field, "{}: not supported by this server's {}", field, api);
    }
}
namespace {

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "a boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "an integer";
    case json::value_t::number_float:
      return "a number";
    case json::value_t::string:
      return "a string";
    case json::value_t::array:
      return "an array";
    case json::value_t::object:
      return "an object";
    default:
      return "an unsupported value";
  }
}

// A field's value, or null when it is absent or JSON null (clients send null for "not given").
constexpr auto get = member;

std::string brief(const json& v) {
  std::string s = dump(v);
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

double number(const json& v, const std::string& path, double lo, double hi, bool lo_open = false) {
  if (!v.is_number()) bad_request(path, "{}: expected a number, got {}", path, type_name(v));
  const double x = v.get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo))
    bad_request(path, "{}: must be {} {} and at most {}, got {}", path, lo_open ? "above" : "at least", lo, hi,
                brief(v));
  return x;
}

int64_t integer(const json& v, const std::string& path, int64_t lo, int64_t hi) {
  int64_t x = 0;
  if (v.is_number_unsigned()) {
    if (v.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad_request(path, "{}: must be at most {}, got {}", path, hi, brief(v));
    x = static_cast<int64_t>(v.get<uint64_t>());
  } else if (v.is_number_integer()) {
    x = v.get<int64_t>();
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    // 16.0 is an integer to JavaScript clients; 1e30 and 1.5 are not integers we can take.
    if (!std::isfinite(d) || d != std::floor(d) || std::fabs(d) > 9.0e15)
      bad_request(path, "{}: expected an integer, got {}", path, brief(v));
    x = static_cast<int64_t>(d);
  } else {
    bad_request(path, "{}: expected an integer, got {}", path, type_name(v));
  }
  if (x < lo || x > hi) bad_request(path, "{}: must be between {} and {}, got {}", path, lo, hi, x);
  return x;
}

bool boolean(const json& v, const std::string& path) {
  if (!v.is_boolean()) bad_request(path, "{}: expected true or false, got {}", path, type_name(v));
  return v.get<bool>();
}

const std::string& string(const json& v, const std::string& path) {
  if (!v.is_string()) bad_request(path, "{}: expected a string, got {}", path, type_name(v));
  return v.get_ref<const std::string&>();
}

const json& object(const json& v, const std::string& path) {
  if (!v.is_object()) bad_request(path, "{}: expected an object, got {}", path, type_name(v));
  return v;
}

constexpr int64_t kInt32Max = std::numeric_limits<int32_t>::max();

// Fields the server cannot honour: refusing is better than silently ignoring them.
void refuse_unsupported(const json& body) {
  for (const char* key : {"guided_decoding_backend", "guided_whitespace_pattern"})
    if (get(body, key))
      bad_request(key, "{}: not supported (this server has one grammar engine, and JSON whitespace is bounded)", key);
  // Peer fields (vLLM's sampling parameters, OpenAI's request options) this server does not
  // implement: refused unless they hold their default, which changes nothing.
  struct Default {
    const char* key;
    json value;  // the value that asks for nothing (null: absent or null only)
    const char* why;
  };
  static const std::vector<Default> kUnimplemented = {
      {"use_beam_search", false, "beam search is not implemented"},
      {"length_penalty", 1.0, "length_penalty applies to beam search, which is not implemented"},
      {"allowed_token_ids", nullptr, "allowed_token_ids is not implemented; a guided_choice or grammar constrains output"},
      {"bad_words", nullptr, "bad_words is not implemented"},
      {"logits_processors", nullptr, "logits processors are not supported"},
      {"truncate_prompt_tokens", nullptr, "prompt truncation is not implemented: shorten the prompt"},
      {"skip_special_tokens", true, "special tokens are always left out of the text"},
      {"spaces_between_special_tokens", true, "special tokens are always left out of the text"},
      {"priority", 0, "request priorities are not implemented"},
      {"prediction", nullptr, "predicted outputs are not implemented"},
      {"audio", nullptr, "audio output is not supported"},
      {"web_search_options", nullptr, "web search is not supported"},
      {"reasoning_effort", nullptr, "Qwen models have no reasoning effort; send chat_template_kwargs.enable_thinking"},
      {"store", false, "stored completions are not supported"},
      {"metadata", nullptr, "metadata is kept only for stored completions, which are not supported"},
  };
  for (const Default& d : kUnimplemented) {
    const json* v = get(body, d.key);
    if (!v || (!d.value.is_null() && *v == d.value)) continue;
    if (d.value.is_null() && ((v->is_array() || v->is_object()) && v->empty())) continue;
    bad_request(d.key, "{}: not supported ({})", d.key, d.why);
  }
  if (const json* v = get(body, "modalities"); v && *v != json::array({"text"}))
    bad_request("modalities", "modalities: only [\"text\"] is supported");
  if (const json* v = get(body, "service_tier"); v && *v != "auto" && *v != "default")
    bad_request("service_tier", "service_tier: only \"auto\" or \"default\" (one tier here)");
  if (get(body, "functions") || get(body, "function_call"))
    bad_request(get(body, "functions") ? "functions" : "function_call",
                "functions / function_call are deprecated and not supported; use tools and tool_choice");
}

// A JSON Schema sent as an object, or (vLLM's guided_json) as a string holding one.
json schema_value(const json& v, const std::string& path) {
  if (v.is_object() || v.is_boolean()) return v;
  if (v.is_string()) {
    if (io::json_too_deep(v.get_ref<const std::string&>()))
      bad_request(path, "{}: nested deeper than {} levels", path, io::kMaxJsonDepth);
    try {
      return json::parse(v.get_ref<const std::string&>());
    } catch (const json::parse_error& e) {
      bad_request(path, "{}: the string is not JSON: {}", path, e.what());
    }
  }
  bad_request(path, "{}: expected a JSON Schema (an object), got {}", path, type_name(v));
}

std::vector<std::string> choice_list(const json& v, const std::string& path) {
  if (!v.is_array() || v.empty()) bad_request(path, "{}: expected a non-empty array of strings", path);
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    out.push_back(string(v[i], fmt::format("{}[{}]", path, i)));
    if (out.back().empty()) bad_request(path, "{}[{}]: a choice must not be empty", path, i);
  }
  return out;
}

// Structured outputs: OpenAI's response_format, vLLM's structured_outputs and its older guided_*
// fields. One source per request; a second is refused rather than one of them silently dropped.
void parse_constraint(const json& body, GenerationRequest& r) {
  using Kind = grammar::ConstraintSpec::Kind;
  grammar::ConstraintSpec& c = r.constraint;
  const auto take = [&](const std::string& field, Kind kind) {
    if (c.kind != Kind::none)
      bad_request(field, "{}: only one structured-output constraint per request ({} is already given)", field,
                  r.constraint_field);
    c.kind = kind;
    r.constraint_field = field;
  };
  if (const json* v = get(body, "response_format")) {
    object(*v, "response_format");
    const json* type = get(*v, "type");
    const std::string t = type ? string(*type, "response_format.type") : "";
    if (t == "json_object") {
      take("response_format", Kind::json_object);
    } else if (t == "json_schema") {
      const json* spec = get(*v, "json_schema");
      if (!spec) bad_request("response_format.json_schema", "response_format.json_schema: required for type json_schema");
      object(*spec, "response_format.json_schema");
      const json* schema = get(*spec, "schema");
      if (!schema) bad_request("response_format.json_schema.schema", "response_format.json_schema.schema: required");
      take("response_format.json_schema.schema", Kind::json_schema);
      c.schema = schema_value(*schema, "response_format.json_schema.schema");
      if (const json* strict = get(*spec, "strict")) c.strict = boolean(*strict, "response_format.json_schema.strict");
    } else if (t != "text") {
      bad_request("response_format.type", "response_format.type: expected \"text\", \"json_object\" or \"json_schema\", got {}",
                  type ? dump(*type) : "nothing");
    }
  }
  const auto from = [&](const json& source, const std::string& prefix, const char* json_key, const char* regex_key,
                        const char* choice_key, const char* grammar_key) {
    if (const json* v = get(source, json_key)) {
      take(prefix + json_key, Kind::json_schema);
      c.schema = schema_value(*v, prefix + json_key);
    }
    if (const json* v = get(source, regex_key)) {
      take(prefix + regex_key, Kind::regex);
      c.text = string(*v, prefix + regex_key);
    }
    if (const json* v = get(source, choice_key)) {
      take(prefix + choice_key, Kind::choice);
      c.choices = choice_list(*v, prefix + choice_key);
    }
    if (const json* v = get(source, grammar_key)) {
      take(prefix + grammar_key, Kind::grammar);
      c.text = string(*v, prefix + grammar_key);
    }
  };
  from(body, "", "guided_json", "guided_regex", "guided_choice", "guided_grammar");
  if (const json* v = get(body, "structured_outputs")) {
    object(*v, "structured_outputs");
    for (const auto& [key, value] : v->items())
      if (key != "json" && key != "regex" && key != "choice" && key != "grammar" && key != "json_object" &&
          !value.is_null())
        bad_request("structured_outputs." + key, "structured_outputs.{}: not supported (json, regex, choice, grammar "
                    "and json_object are)", key);
    from(*v, "structured_outputs.", "json", "regex", "choice", "grammar");
    if (const json* j = get(*v, "json_object"); j && boolean(*j, "structured_outputs.json_object"))
      take("structured_outputs.json_object", Kind::json_object);
  }
}

void parse_common(const json& body, const SamplingParams& defaults, const RequestLimits& limits, GenerationRequest& r) {
  if (const json* v = get(body, "model")) r.model = string(*v, "model");
  if (const json* v = get(body, "stream")) r.stream = boolean(*v, "stream");
  if (const json* v = get(body, "stream_options")) {
    object(*v, "stream_options");
    if (!r.stream) bad_request("stream_options", "stream_options: only allowed when stream is true");
    if (const json* u = get(*v, "include_usage")) r.include_usage = boolean(*u, "stream_options.include_usage");
  }
  SamplingParams& s = r.sampling;
  s = defaults;
  if (const json* v = get(body, "temperature")) s.temperature = static_cast<float>(number(*v, "temperature", 0, 2));
  if (const json* v = get(body, "top_p")) s.top_p = static_cast<float>(number(*v, "top_p", 0, 1, true));
  if (const json* v = get(body, "top_k")) {
    const int64_t k = integer(*v, "top_k", -1, kInt32Max);
    s.top_k = k < 0 ? 0 : static_cast<int32_t>(k);  // -1 is vLLM's "off"
  }
  if (const json* v = get(body, "min_p")) s.min_p = static_cast<float>(number(*v, "min_p", 0, 1));
  if (const json* v = get(body, "presence_penalty"))
    s.presence_penalty = static_cast<float>(number(*v, "presence_penalty", -2, 2));
  if (const json* v = get(body, "frequency_penalty"))
    s.frequency_penalty = static_cast<float>(number(*v, "frequency_penalty", -2, 2));
  if (const json* v = get(body, "repetition_penalty"))
    s.repetition_penalty = static_cast<float>(number(*v, "repetition_penalty", 0, 100, true));
  if (const json* v = get(body, "seed")) {
    // OpenAI seeds are signed 64-bit; the sampler takes the same bits as unsigned.
    if (v->is_number_unsigned())
      s.seed = v->get<uint64_t>();
    else
      s.seed = static_cast<uint64_t>(
          integer(*v, "seed", std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max()));
    r.seeded = true;
  }
  if (const json* v = get(body, "n")) r.n = static_cast<int32_t>(integer(*v, "n", 1, limits.max_n));
  // max_completion_tokens is the newer name; when both are sent it wins, as in OpenAI's API.
  for (const char* key : {"max_tokens", "max_completion_tokens"})
    if (const json* v = get(body, key)) r.max_tokens = integer(*v, key, 0, kInt32Max);  // 0: echo only
  if (const json* v = get(body, "prompt_logprobs"))
    r.prompt_logprobs = static_cast<int32_t>(integer(*v, "prompt_logprobs", 0, limits.max_top_logprobs));
  if (const json* v = get(body, "stop")) {
    if (v->is_string()) {
      r.stop.push_back(v->get<std::string>());
    } else if (v->is_array()) {
      if (static_cast<int64_t>(v->size()) > limits.max_stop)
        bad_request("stop", "stop: at most {} stop strings, got {}", limits.max_stop, v->size());
      for (size_t i = 0; i < v->size(); ++i) r.stop.push_back(string((*v)[i], fmt::format("stop[{}]", i)));
    } else {
      bad_request("stop", "stop: expected a string or an array of strings, got {}", type_name(*v));
    }
    for (const std::string& s : r.stop)
      if (s.empty()) bad_request("stop", "stop: stop strings must not be empty");
  }
  if (const json* v = get(body, "include_stop_str_in_output"))
    r.include_stop_str = boolean(*v, "include_stop_str_in_output");
  if (const json* v = get(body, "stop_token_ids"); v && !v->is_null()) {
    if (!v->is_array()) bad_request("stop_token_ids", "stop_token_ids: expected an array of token ids, got {}", type_name(*v));
    if (static_cast<int64_t>(v->size()) > limits.max_stop)
      bad_request("stop_token_ids", "stop_token_ids: at most {} ids, got {}", limits.max_stop, v->size());
    for (size_t i = 0; i < v->size(); ++i)
      r.stop_token_ids.push_back(
          static_cast<int32_t>(integer((*v)[i], fmt::format("stop_token_ids[{}]", i), 0, kInt32Max)));
  }
  if (const json* v = get(body, "add_special_tokens")) r.add_special_tokens = boolean(*v, "add_special_tokens");
  if (const json* v = get(body, "min_tokens")) r.min_tokens = static_cast<int32_t>(integer(*v, "min_tokens", 0, kInt32Max));
  if (const json* v = get(body, "logit_bias")) {
    if (!v->is_object()) bad_request("logit_bias", "logit_bias: expected an object of token id -> bias");
    for (const auto& [key, bias] : v->items()) {
      const std::string field = "logit_bias." + key;
      if (key.empty() || key.size() > 10 || key.find_first_not_of("0123456789") != std::string::npos)
        bad_request(field, "{}: the key must be a token id", field);
      const double b = number(bias, field, -100, 100);
      // -100 and 100 are exact (a ban, the only ids allowed); a bias in between would shift the
      // distribution, which the sampler here does not do, so it is refused rather than approximated.
      const int32_t id = static_cast<int32_t>(std::stoll(key));
      if (b == -100)
        r.banned_tokens.push_back(id);
      else if (b == 100)
        r.exclusive_tokens.push_back(id);
      else if (b != 0)
        bad_request(field, "{}: only -100 (never sample it) and 100 (sample only such ids) are supported, got {}", field, b);
    }
  }
  if (const json* v = get(body, "user")) string(*v, "user");
  if (const json* v = get(body, "ignore_eos")) r.ignore_eos = boolean(*v, "ignore_eos");
  if (const json* v = get(body, "return_token_ids")) r.return_token_ids = boolean(*v, "return_token_ids");
  refuse_unsupported(body);
  parse_constraint(body, r);
}

// The text of a message's content: a string, or text parts joined by newlines (what vLLM sends a
// template that reads content as a string; Qwen3's template would drop a list silently).
std::string content_text(const json& content, const std::string& path) {
  if (content.is_string()) return content.get<std::string>();
  if (!content.is_array())
    bad_request(path, "{}: expected a string or an array of content parts, got {}", path, type_name(content));
  std::string text;
  for (size_t j = 0; j < content.size(); ++j) {
    const std::string part_path = fmt::format("{}[{}]", path, j);
    const json& part = object(content[j], part_path);
    const json* type = get(part, "type");
    if (!type) bad_request(part_path + ".type", "{}.type: required", part_path);
    const std::string& t = string(*type, part_path + ".type");
    if (t != "text")
      bad_request(part_path + ".type", "{}.type: content parts of type \"{}\" are not supported (text only)", part_path,
                  t);
    const json* value = get(part, "text");
    if (!value) bad_request(part_path + ".text", "{}.text: required", part_path);
    if (j > 0) text += '\n';
    text += string(*value, part_path + ".text");
  }
  return text;
}

json parse_tool_calls(const json& calls, const std::string& path) {
  if (!calls.is_array()) bad_request(path, "{}: expected an array, got {}", path, type_name(calls));
  json out = json::array();
  for (size_t k = 0; k < calls.size(); ++k) {
    const std::string p = fmt::format("{}[{}]", path, k);
    const json& call = object(calls[k], p);
    json c = json::object();
    if (const json* id = get(call, "id")) c["id"] = string(*id, p + ".id");
    c["type"] = "function";
    const json* function = get(call, "function");
    if (!function) bad_request(p + ".function", "{}.function: required", p);
    object(*function, p + ".function");
    const json* name = get(*function, "name");
    if (!name) bad_request(p + ".function.name", "{}.function.name: required", p);
    json f = {{"name", string(*name, p + ".function.name")}};
    const json* arguments = get(*function, "arguments");
    if (arguments && !arguments->is_string() && !arguments->is_object())
      bad_request(p + ".function.arguments", "{}.function.arguments: expected a JSON string or an object, got {}", p,
                  type_name(*arguments));
    if (arguments && arguments->is_string()) {
      if (io::json_too_deep(arguments->get_ref<const std::string&>()))
        bad_request(p + ".function.arguments", "{}.function.arguments: nested deeper than {} levels", p,
                    io::kMaxJsonDepth);
      const json parsed = json::parse(arguments->get<std::string>(), nullptr, false);
      if (parsed.is_discarded() || !parsed.is_object())
        bad_request(p + ".function.arguments", "{}.function.arguments: not a JSON object", p);
    }
    f["arguments"] = arguments ? *arguments : json::object();
    c["function"] = std::move(f);
    out.push_back(std::move(c));
  }
  return out;
}

json parse_messages(const json& body) {
  const json* messages = get(body, "messages");
  if (!messages) bad_request("messages", "messages: required");
  if (!messages->is_array())
    bad_request("messages", "messages: expected an array of messages, got {}", type_name(*messages));
  if (messages->empty()) bad_request("messages", "messages: must contain at least one message");
  static const std::set<std::string> roles = {"system", "developer", "user", "assistant", "tool"};
  json out = json::array();
  for (size_t i = 0; i < messages->size(); ++i) {
    const std::string path = fmt::format("messages[{}]", i);
    const json& m = object((*messages)[i], path);
    const json* role_value = get(m, "role");
    if (!role_value) bad_request(path + ".role", "{}.role: required", path);
    std::string role = string(*role_value, path + ".role");
    if (!roles.contains(role))
      bad_request(path + ".role", "{}.role: expected one of system, developer, user, assistant, tool; got \"{}\"", path,
                  role);
    if (role == "developer") role = "system";  // OpenAI's newer name; Qwen templates know "system"
    json message = {{"role", role}};
    const json* content = get(m, "content");
    const json* tool_calls = get(m, "tool_calls");
    if (!content && role != "assistant")
      bad_request(path + ".content", "{}.content: required for a {} message", path, role);
    message["content"] = content ? content_text(*content, path + ".content") : std::string();
    if (const json* name = get(m, "name")) message["name"] = string(*name, path + ".name");
    if (role == "assistant") {
      if (tool_calls) message["tool_calls"] = parse_tool_calls(*tool_calls, path + ".tool_calls");
      if (const json* r = get(m, "reasoning_content"))
        message["reasoning_content"] = string(*r, path + ".reasoning_content");
    } else if (tool_calls) {
      bad_request(path + ".tool_calls", "{}.tool_calls: only assistant messages carry tool calls", path);
    }
    if (role == "tool")
      if (const json* id = get(m, "tool_call_id")) message["tool_call_id"] = string(*id, path + ".tool_call_id");
    out.push_back(std::move(message));
  }
  return out;
}

bool valid_tool_name(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  for (char c : name)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
  return true;
}

void parse_tools(const json& body, ChatRequest& r) {
  json tools = json::array();
  std::set<std::string> names;
  if (const json* v = get(body, "tools")) {
    if (!v->is_array()) bad_request("tools", "tools: expected an array, got {}", type_name(*v));
    for (size_t i = 0; i < v->size(); ++i) {
      const std::string path = fmt::format("tools[{}]", i);
      const json& tool = object((*v)[i], path);
      if (const json* type = get(tool, "type"); type && string(*type, path + ".type") != "function")
        bad_request(path + ".type", "{}.type: only \"function\" tools are supported, got \"{}\"", path,
                    type->get<std::string>());
      const json* function = get(tool, "function");
      if (!function) bad_request(path + ".function", "{}.function: required", path);
      object(*function, path + ".function");
      const json* name = get(*function, "name");
      if (!name) bad_request(path + ".function.name", "{}.function.name: required", path);
      const std::string& n = string(*name, path + ".function.name");
      if (!valid_tool_name(n))
        bad_request(path + ".function.name",
                    "{}.function.name: 1 to 64 letters, digits, underscores, dots or dashes, got \"{}\"", path, n);
      if (!names.insert(n).second)
        bad_request(path + ".function.name", "{}.function.name: \"{}\" is defined twice", path, n);
      if (const json* d = get(*function, "description")) string(*d, path + ".function.description");
      if (const json* p = get(*function, "parameters")) object(*p, path + ".function.parameters");
      if (const json* strict = get(*function, "strict"); strict && !strict->is_null())
        boolean(*strict, path + ".function.strict");
      json t = tool;
      t["type"] = "function";
      tools.push_back(std::move(t));
    }
  }
  r.tool_choice = tools.empty() ? ToolChoice::none : ToolChoice::automatic;
  if (const json* v = get(body, "tool_choice")) {
    if (v->is_string()) {
      const std::string& c = v->get_ref<const std::string&>();
      if (c == "none")
        r.tool_choice = ToolChoice::none;
      else if (c == "auto")
        r.tool_choice = tools.empty() ? ToolChoice::none : ToolChoice::automatic;
      else if (c == "required")
        r.tool_choice = ToolChoice::required;
      else
        bad_request("tool_choice", "tool_choice: expected \"none\", \"auto\", \"required\" or a named tool, got \"{}\"",
                    c);
    } else if (v->is_object()) {
      const json* function = get(*v, "function");
      if (const json* type = get(*v, "type"); type && string(*type, "tool_choice.type") != "function")
        bad_request("tool_choice.type", "tool_choice.type: expected \"function\"");
      if (!function) bad_request("tool_choice.function", "tool_choice.function: required");
      const json* name = get(object(*function, "tool_choice.function"), "name");
      if (!name) bad_request("tool_choice.function.name", "tool_choice.function.name: required");
      r.tool_name = string(*name, "tool_choice.function.name");
      if (!names.contains(r.tool_name))
        bad_request("tool_choice.function.name", "tool_choice.function.name: no tool named \"{}\" in tools",
                    r.tool_name);
      r.tool_choice = ToolChoice::named;
    } else {
      bad_request("tool_choice", "tool_choice: expected a string or an object, got {}", type_name(*v));
    }
  }
  if (r.tool_choice == ToolChoice::required && tools.empty())
    bad_request("tool_choice", "tool_choice: \"required\" needs at least one tool in tools");
  if (const json* v = get(body, "parallel_tool_calls"); v && !v->is_null())
    r.parallel_tool_calls = boolean(*v, "parallel_tool_calls");
  if (r.tool_choice != ToolChoice::none) r.tools = std::move(tools);
}

}  // namespace

json parse_body(std::string_view body) {
  if (body.empty()) bad_request("", "the request body is empty; expected a JSON object");
  if (const auto key = io::json_too_deep(body))
    bad_request(*key, "{}nested deeper than {} levels", key->empty() ? "the request body is " : *key + ": ",
                io::kMaxJsonDepth);
  json value;
  try {
    value = json::parse(body);          // rejects ill-formed UTF-8 inside strings
  } catch (const json::exception& e) {  // parse_error, or out_of_range for numbers like 1e400
    std::string what = e.what();
    if (const size_t at = what.find("] "); at != std::string::npos) what = what.substr(at + 2);
    bad_request("", "the request body is not valid JSON: {}", what);
  }
  if (!value.is_object()) bad_request("", "the request body must be a JSON object, got {}", type_name(value));
  return value;
}

ChatRequest parse_chat_request(const json& body, const SamplingParams& defaults, const RequestLimits& limits) {
  ChatRequest r;
  const json messages = parse_messages(body);
  parse_common(body, defaults, limits, r);
  if (const json* v = get(body, "logprobs"); v && boolean(*v, "logprobs")) r.top_logprobs = 0;
  if (const json* v = get(body, "top_logprobs")) {
    const int64_t k = integer(*v, "top_logprobs", 0, limits.max_top_logprobs);
    if (r.top_logprobs < 0) bad_request("top_logprobs", "top_logprobs: needs logprobs set to true");
    r.top_logprobs = static_cast<int32_t>(k);
  }
  if (r.max_tokens == 0)
    bad_request(get(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens",
                "max_tokens: must be at least 1");
  if (const json* v = get(body, "echo"); v && boolean(*v, "echo"))
    bad_request("echo", "echo: not supported on chat completions (continue_final_message with the last assistant "
                "message continues it; its text is not repeated)");
  parse_tools(body, r);
  json& t = r.template_request;
  t = json::object();
  t["messages"] = messages;
  if (!r.tools.empty()) t["tools"] = r.tools;
  // Fields the chat template engine reads (and checks) itself.
  for (const char* key : {"documents", "add_generation_prompt", "continue_final_message", "chat_template_kwargs"})
    if (const json* v = get(body, key)) t[key] = *v;
  if (const json* v = get(body, "chat_template_kwargs")) object(*v, "chat_template_kwargs");
  return r;
}

CompletionRequest parse_completion_request(const json& body, const SamplingParams& defaults,
                                           const RequestLimits& limits) {
  CompletionRequest r;
  const json* prompt = get(body, "prompt");
  if (!prompt) bad_request("prompt", "prompt: required");
  auto ids = [](const json& array, const std::string& path) {
    std::vector<int32_t> out;
    for (size_t i = 0; i < array.size(); ++i)
      out.push_back(static_cast<int32_t>(integer(array[i], fmt::format("{}[{}]", path, i), 0, kInt32Max)));
    if (out.empty()) bad_request(path, "{}: must not be empty", path);
    return out;
  };
  if (prompt->is_string()) {
    r.prompts.push_back({prompt->get<std::string>(), {}, false});
  } else if (prompt->is_array() && !prompt->empty() && (*prompt)[0].is_number()) {
    r.prompts.push_back({{}, ids(*prompt, "prompt"), true});
  } else if (prompt->is_array() && !prompt->empty()) {
    if (static_cast<int64_t>(prompt->size()) > limits.max_prompts)
      bad_request("prompt", "prompt: at most {} prompts in one request, got {}", limits.max_prompts, prompt->size());
    for (size_t i = 0; i < prompt->size(); ++i) {
      const json& p = (*prompt)[i];
      const std::string path = fmt::format("prompt[{}]", i);
      if (p.is_string())
        r.prompts.push_back({p.get<std::string>(), {}, false});
      else if (p.is_array())
        r.prompts.push_back({{}, ids(p, path), true});
      else
        bad_request(path, "{}: expected a string or an array of token ids, got {}", path, type_name(p));
    }
  } else {
    bad_request("prompt", "prompt: expected a non-empty string, array of strings or array of token ids, got {}",
                prompt->is_array() ? "an empty array" : type_name(*prompt));
  }
  for (size_t i = 0; i < r.prompts.size(); ++i)
    if (!r.prompts[i].is_ids && r.prompts[i].text.empty())
      bad_request("prompt", "prompt{}: must not be empty", r.prompts.size() > 1 ? fmt::format("[{}]", i) : "");
  parse_common(body, defaults, limits, r);
  if (const json* v = get(body, "logprobs"))
    r.top_logprobs = static_cast<int32_t>(integer(*v, "logprobs", 0, limits.max_top_logprobs));
  if (const json* v = get(body, "echo")) r.echo = boolean(*v, "echo");
  if (r.max_tokens == 0 && !r.echo) bad_request("max_tokens", "max_tokens: must be at least 1 (0 only with echo)");
  if (const json* v = get(body, "suffix"); v && !string(*v, "suffix").empty())
    bad_request("suffix", "suffix is not supported by this server");
  if (const json* v = get(body, "best_of"); v && integer(*v, "best_of", 1, limits.max_n) != r.n)
    bad_request("best_of", "best_of is not supported by this server (only best_of = n)");
  if (static_cast<int64_t>(r.prompts.size()) * r.n > limits.max_n * 4)
    bad_request("n", "n: {} prompts x n = {} choices is more than this server allows ({})", r.prompts.size(),
                r.prompts.size() * r.n, limits.max_n * 4);
  return r;
}

json ApiError::body() const {
  return {{"error",
           {{"message", what()},
            {"type", type},
            {"param", param.empty() ? json(nullptr) : json(param)},
            {"code", code.empty() ? json(nullptr) : json(code)}}}};
}

std::string dump(const json& value) { return value.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace qinfer::server
