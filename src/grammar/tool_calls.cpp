#include "grammar/tool_calls.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "grammar/json_schema.h"

namespace qinfer::grammar {
namespace {

using Json = nlohmann::ordered_json;

constexpr std::string_view kCallOpen = "<tool_call>";
// What ends an XML string value early for the parser, so the value's text cannot contain it.
const std::vector<std::string> kXmlValueTags = {"<parameter=", "</function>", "</tool_call>"};
constexpr std::string_view kXmlValueEnd = "</parameter>";

// A JSON pointer fragment naming a property ("#/properties/a~1b"), escaped as a URI fragment.
std::string property_pointer(std::string_view name) {
  std::string out = "#/properties/";
  for (char c : json_pointer_token(name)) out += c == '%' ? std::string("%25") : std::string(1, c);
  return out;
}

class ToolGrammar {
 public:
  explicit ToolGrammar(const ToolCallSpec& spec) : spec_(spec) {}

  Grammar build(int32_t* calls_after_open) {
    QINFER_CHECK(!spec_.tools.empty(), "tool calls: at least one tool is needed");
    const int32_t call = g_.add_rule("call");
    for (const ToolSchema& tool : spec_.tools)
      g_.add_alternative(call, spec_.syntax == ToolCallSyntax::hermes ? hermes_call(tool) : xml_call(tool));
    // After the first call's opening tag: the call, more calls, a newline the model may end with.
    Sequence calls{Grammar::rule(call)};
    if (spec_.parallel) {
      Sequence more = g_.literal("\n");
      const Sequence open = g_.literal(kCallOpen);
      more.insert(more.end(), open.begin(), open.end());
      more.push_back(Grammar::rule(call));
      calls.push_back(g_.repeat("more-calls", std::move(more), 0, -1));
    }
    calls.push_back(g_.optional("after-calls", g_.literal("\n")));
    const int32_t after_open = g_.add_rule("calls-after-open");
    g_.add_alternative(after_open, calls);
    if (calls_after_open) *calls_after_open = after_open;
    calls = {Grammar::rule(after_open)};
    const int32_t root = g_.add_rule("root");
    if (spec_.required) {
      Sequence all = g_.literal(kCallOpen);
      all.insert(all.end(), calls.begin(), calls.end());
      g_.add_alternative(root, std::move(all));
    } else {
      g_.add_alternative(root, {g_.text_until("content", kCallOpen, {}, calls, /*may_stop=*/true)});
    }
    g_.set_root(root);
    g_.validate();
    return std::move(g_);
  }

 private:
  JsonSchemaOptions json_options(const ToolSchema& tool) const { return {.any_whitespace = false, .strict = tool.strict}; }

  [[noreturn]] static void refuse(const ToolSchema& tool, std::string_view what) {
    fail("{}.function.parameters: {}", tool.field, what);
  }

  // A JSON value for the schema at `pointer` of the tool's parameters; a loose tool whose schema
  // the grammar cannot follow gets `fallback`.
  Element json_value(const ToolSchema& tool, const std::string& pointer, const Json& fallback) {
    try {
      return g_.embed(json_schema_grammar(tool.parameters, json_options(tool), pointer));
    } catch (const Error& e) {
      if (tool.strict) refuse(tool, e.what());
      JsonSchemaOptions loose = json_options(tool);
      loose.strict = false;
      return g_.embed(json_schema_grammar(fallback, loose));
    }
  }

  // After <tool_call>: {"name": "f", "arguments": ARGS}, closed.
  Sequence hermes_call(const ToolSchema& tool) {
    Sequence s = g_.literal("\n{\"name\": " + Json(tool.name).dump() + ", \"arguments\": ");
    if (tool.parameters.is_null()) {
      // No parameters declared: strict means none, loose any object.
      const Json none = tool.strict ? Json{{"type", "object"}, {"properties", Json::object()}, {"additionalProperties", false}}
                                    : Json{{"type", "object"}};
      s.push_back(g_.embed(json_schema_grammar(none, {.strict = false})));
    } else {
      s.push_back(json_value(tool, "#", Json{{"type", "object"}}));
    }
    const Sequence close = g_.literal("}\n</tool_call>");
    s.insert(s.end(), close.begin(), close.end());
    return s;
  }

  // After <tool_call>: <function=f>, its parameters, closed.
  Sequence xml_call(const ToolSchema& tool) {
    Sequence s = g_.literal("\n<function=" + tool.name + ">\n");
    const Json& p = tool.parameters;
    const bool declared = p.is_object() && p.contains("properties") && p["properties"].is_object();
    bool plain = declared;  // properties the format can write one by one
    for (const char* key : {"$ref", "anyOf", "oneOf", "allOf", "patternProperties"})
      if (p.is_object() && p.contains(key)) plain = false;
    if (plain) {
      std::vector<std::string> required;
      if (p.contains("required") && p["required"].is_array())
        for (const Json& r : p["required"])
          if (r.is_string()) required.push_back(r.get<std::string>());
      for (const auto& [name, schema] : p["properties"].items()) {
        const Sequence param = xml_parameter(tool, name, schema);
        const bool is_required = tool.strict || std::find(required.begin(), required.end(), name) != required.end();
        if (is_required)
          s.insert(s.end(), param.begin(), param.end());
        else
          s.push_back(g_.optional("optional-parameter", param));
      }
    } else if (tool.strict && !p.is_null()) {
      refuse(tool, "the XML tool-call format writes parameters one by one: a strict tool needs an object schema with "
                   "\"properties\" and no \"$ref\", \"anyOf\", \"oneOf\", \"allOf\" or \"patternProperties\" at its top");
    } else if (!tool.strict) {
      // Parameters the schema does not describe: any names, raw text values (as the parser reads them).
      ByteSet name_byte;
      name_byte.add_range(0x21, 0xFF);
      Sequence param = g_.literal("<parameter=");
      param.push_back(g_.repeat("parameter-name", {g_.bytes(without(name_byte, '>'))}, 1, 64));
      const Sequence rest = g_.literal(">\n");
      param.insert(param.end(), rest.begin(), rest.end());
      param.push_back(raw_text());
      s.push_back(g_.repeat("parameters", param, 0, -1));
    }
    const Sequence close = g_.literal("</function>\n</tool_call>");
    s.insert(s.end(), close.begin(), close.end());
    return s;
  }

  Sequence xml_parameter(const ToolSchema& tool, const std::string& name, const Json& schema) {
    Sequence s = g_.literal("<parameter=" + name + ">\n");
    if (xml_parameter_type(&schema) != "string") {
      s.push_back(json_value(tool, property_pointer(name), Json(true)));
      const Sequence close = g_.literal("\n</parameter>\n");
      s.insert(s.end(), close.begin(), close.end());
      return s;
    }
    // Raw text: literals for enum / const, else any text without the format's tags.
    std::vector<std::string> values;
    bool listed = false;
    for (const char* key : {"enum", "const"}) {
      if (!schema.is_object() || !schema.contains(key)) continue;
      listed = true;
      const Json& v = schema[key];
      for (const Json& value : v.is_array() && std::string_view(key) == "enum" ? v : Json::array({v}))
        if (value.is_string() && !contains_tag(value.get<std::string>())) values.push_back(value.get<std::string>());
    }
    if (listed) {
      if (values.empty()) refuse(tool, fmt::format("the enum of parameter \"{}\" has no string the XML format can write", name));
      std::vector<Sequence> alternatives;
      for (const std::string& v : values) alternatives.push_back(g_.literal(v + "\n" + std::string(kXmlValueEnd) + "\n"));
      s.push_back(g_.choice("parameter-value", std::move(alternatives)));
      return s;
    }
    if (tool.strict && schema.is_object())
      for (const char* key : {"pattern", "format", "minLength", "maxLength"})
        if (schema.contains(key))
          refuse(tool, fmt::format("\"{}\" of parameter \"{}\" is not supported: the XML tool-call format writes "
                                   "strings as raw text",
                                   key, name));
    s.push_back(raw_text());
    return s;
  }

  // A raw text value up to and including </parameter>, then the newline after it.
  Element raw_text() {
    if (!raw_text_) {
      const int32_t r = g_.add_rule("raw-value");
      g_.add_alternative(r, {g_.text_until("raw-text", kXmlValueEnd, kXmlValueTags, g_.literal("\n"), false)});
      raw_text_ = Grammar::rule(r);
    }
    return *raw_text_;
  }

  static bool contains_tag(std::string_view v) {
    if (v.find(kXmlValueEnd) != std::string_view::npos) return true;
    for (const std::string& tag : kXmlValueTags)
      if (v.find(tag) != std::string_view::npos) return true;
    return false;
  }

  static ByteSet without(ByteSet set, char c) {
    set.words[static_cast<uint8_t>(c) >> 6] &= ~(uint64_t{1} << (static_cast<uint8_t>(c) & 63));
    return set;
  }

  const ToolCallSpec& spec_;
  Grammar g_;
  std::optional<Element> raw_text_;
};

}  // namespace

Grammar tool_call_grammar(const ToolCallSpec& spec, int32_t* calls_after_open) {
  return ToolGrammar(spec).build(calls_after_open);
}

std::string xml_parameter_type(const nlohmann::ordered_json* schema) {
  if (!schema) return "string";
  if (!schema->is_object() || !schema->contains("type")) return "";
  const Json& t = (*schema)["type"];
  if (t.is_string()) return t.get<std::string>();
  if (!t.is_array()) return "";
  std::vector<std::string> types;
  for (const Json& option : t)
    if (option.is_string()) types.push_back(option.get<std::string>());
  // Raw text whenever a string is allowed; one other type read as itself; several as any JSON.
  if (std::find(types.begin(), types.end(), "string") != types.end()) return "string";
  return types.size() == 1 ? types[0] : "";
}

}  // namespace qinfer::grammar
