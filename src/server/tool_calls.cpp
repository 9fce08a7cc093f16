#include "server/tool_calls.h"

#include <algorithm>
#include <cctype>

#include "engine/text_stream.h"
#include "grammar/tool_calls.h"
#include "server/text_scan.h"

namespace qinfer::server {
namespace {

constexpr std::string_view kCallOpen = "<tool_call>", kCallClose = "</tool_call>";

std::string_view trim(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

// What `literal` does at text[pos..]: 1 it is there (pos moves past it), 0 the text so far is a
// prefix of it (wait), -1 something else is there.
int expect(std::string_view text, size_t& pos, std::string_view literal) {
  const std::string_view rest = text.substr(pos);
  if (rest.size() < literal.size()) return literal.starts_with(rest) ? 0 : -1;
  if (!rest.starts_with(literal)) return -1;
  pos += literal.size();
  return 1;
}

void skip_space(std::string_view text, size_t& pos) {
  while (pos < text.size() && is_space(text[pos])) ++pos;
}

// End of the JSON string starting at text[pos] == '"' (index of the closing quote), or npos.
size_t json_string_end(std::string_view text, size_t pos) {
  for (size_t i = pos + 1; i < text.size(); ++i) {
    if (text[i] == '\\')
      ++i;
    else if (text[i] == '"')
      return i;
  }
  return std::string_view::npos;
}

// Hermes: a JSON object per call. The name and the start of "arguments" are read as they arrive;
// the arguments value is then streamed verbatim up to its closing bracket.
class HermesParser final : public ToolCallParser {
  enum class State {
    open,
    name_key,
    name_colon,
    name_value,
    after_name,
    args_key,
    args_colon,
    args_start,
    args_stream,
    args_string,
    done,
    unreadable
  };

  void scan(ParsedOutput& out, bool) override {
    const std::string_view s = body_;
    while (true) {
      int r = 1;
      switch (state_) {
        case State::open:
          skip_space(s, pos_);
          if ((r = expect(s, pos_, "{")) > 0) state_ = State::name_key;
          break;
        case State::name_key:
          skip_space(s, pos_);
          if ((r = expect(s, pos_, "\"name\"")) > 0) state_ = State::name_colon;
          break;
        case State::name_colon:
        case State::args_colon:
          skip_space(s, pos_);
          if ((r = expect(s, pos_, ":")) > 0)
            state_ = state_ == State::name_colon ? State::name_value : State::args_start;
          break;
        case State::name_value: {
          skip_space(s, pos_);
          if (pos_ == s.size()) return;
          if (s[pos_] != '"') {
            r = -1;
            break;
          }
          const size_t end = json_string_end(s, pos_);
          if (end == std::string_view::npos) return;
          const json name = json::parse(s.substr(pos_, end + 1 - pos_), nullptr, false);
          if (!name.is_string()) {
            r = -1;
            break;
          }
          pos_ = end + 1;
          start_call(out, name.get<std::string>());
          state_ = State::after_name;
          break;
        }
        case State::after_name:
          skip_space(s, pos_);
          if (pos_ == s.size()) return;
          if (s[pos_] == ',')
            ++pos_, state_ = State::args_key;
          else
            r = -1;  // no arguments key next: read them from the whole object at the end
          break;
        case State::args_key: {
          skip_space(s, pos_);
          r = expect(s, pos_, "\"arguments\"");
          if (r < 0) r = expect(s, pos_, "\"parameters\"");
          if (r > 0) state_ = State::args_colon;
          break;
        }
        case State::args_start:
          skip_space(s, pos_);
          if (pos_ == s.size()) return;
          if (s[pos_] == '{' || s[pos_] == '[')
            state_ = State::args_stream;
          else if (s[pos_] == '"')
            state_ = State::args_string;
          else
            r = -1;
          break;
        case State::args_stream: {
          const size_t begin = pos_;
          for (; pos_ < s.size() && state_ == State::args_stream; ++pos_) {
            const char c = s[pos_];
            if (in_string_) {
              if (escaped_)
                escaped_ = false;
              else if (c == '\\')
                escaped_ = true;
              else if (c == '"')
                in_string_ = false;
            } else if (c == '"') {
              in_string_ = true;
            } else if (c == '{' || c == '[') {
              ++depth_;
            } else if ((c == '}' || c == ']') && --depth_ == 0) {
              state_ = State::done;
            }
          }
          if (pos_ > begin) emit_arguments(out, s.substr(begin, pos_ - begin)), streamed_ = true;
          if (state_ == State::args_stream) return;
          break;
        }
        case State::args_string: {
          const size_t end = json_string_end(s, pos_);
          if (end == std::string_view::npos) return;
          const json text = json::parse(s.substr(pos_, end + 1 - pos_), nullptr, false);
          pos_ = end + 1;
          if (!text.is_string()) {
            r = -1;
            break;
          }
          emit_arguments(out, text.get<std::string>());
          streamed_ = true;
          state_ = State::done;
          break;
        }
        case State::done:
        case State::unreadable:
          pos_ = s.size();
          return;
      }
      if (r == 0) return;
      if (r < 0) state_ = State::unreadable;
    }
  }

  bool close(ParsedOutput& out, bool) override {
    if (streamed_) return true;  // a truncated arguments value stays as the model wrote it
    // Not streamed: read the call as one JSON object (keys in another order, arguments as a string).
    const json call = json::parse(trim(body_), nullptr, false);
    const bool readable = call.is_object() && call.contains("name") && call["name"].is_string();
    if (!started_) {
      if (!readable) return false;
      start_call(out, call["name"].get<std::string>());
    }
    if (!readable) return true;  // cut off after the name: no arguments are made up
    std::string arguments = "{}";  // a whole call that names no arguments takes none
    for (const char* key : {"arguments", "parameters"})
      if (auto it = call.find(key); it != call.end())
        arguments = it->is_string() ? it->get<std::string>() : dump(*it);
    emit_arguments(out, arguments);
    return true;
  }

  void reset() override {
    state_ = State::open;
    depth_ = 0;
    in_string_ = escaped_ = streamed_ = false;
  }

  State state_ = State::open;
  int depth_ = 0;
  bool in_string_ = false, escaped_ = false, streamed_ = false;
};

// XML: <function=NAME> then <parameter=P>VALUE</parameter> blocks. String values stream as they
// arrive; other types wait for their end and go out converted.
class XmlParser final : public ToolCallParser {
 public:
  explicit XmlParser(json tools) : tools_(std::move(tools)) {}

 private:
  enum class State { open, function_name, body, parameter_name, value, done, unreadable };

  void scan(ParsedOutput& out, bool) override {
    const std::string_view s = body_;
    while (true) {
      switch (state_) {
        case State::open: {
          skip_space(s, pos_);
          const int r = expect(s, pos_, "<function=");
          if (r == 0) return;
          state_ = r > 0 ? State::function_name : State::unreadable;
          break;
        }
        case State::function_name: {
          const size_t gt = s.find('>', pos_);
          if (gt == std::string_view::npos) {
            if (s.find('\n', pos_) != std::string_view::npos)
              state_ = State::unreadable;
            else
              return;
            break;
          }
          const std::string name(trim(s.substr(pos_, gt - pos_)));
          pos_ = gt + 1;
          if (name.empty()) {
            state_ = State::unreadable;
            break;
          }
          start_call(out, name);
          properties_ = nullptr;
          for (const json& tool : tools_)
            if (tool.is_object() && tool.contains("function") && tool["function"].is_object() &&
                tool["function"].value("name", "") == name) {
              const json& f = tool["function"];
              if (f.contains("parameters") && f["parameters"].is_object() && f["parameters"].contains("properties") &&
                  f["parameters"]["properties"].is_object())
                properties_ = &f["parameters"]["properties"];
            }
          state_ = State::body;
          break;
        }
        case State::body: {
          skip_space(s, pos_);
          if (pos_ == s.size()) return;
          if (const int r = expect(s, pos_, "<parameter="); r != -1) {
            if (r == 0) return;
            state_ = State::parameter_name;
            break;
          }
          if (const int r = expect(s, pos_, "</function>"); r != -1) {
            if (r == 0) return;
            close_arguments(out);
            state_ = State::done;
            break;
          }
          // Stray text between parameters: skip to the next tag.
          const size_t lt = s.find('<', pos_ + 1);
          pos_ = lt == std::string_view::npos ? s.size() : lt;
          break;
        }
        case State::parameter_name: {
          const size_t gt = s.find('>', pos_);
          if (gt == std::string_view::npos) return;
          parameter_ = std::string(trim(s.substr(pos_, gt - pos_)));
          pos_ = gt + 1;
          type_ = grammar::xml_parameter_type(parameter_schema(parameter_));
          first_newline_ = true;
          if (type_ == "string") {
            std::string prefix = arguments_open_ ? ", \"" : "{\"";
            append_json_escaped(prefix, parameter_);
            prefix += "\": \"";
            emit_arguments(out, prefix);
            arguments_open_ = true;
          }
          state_ = State::value;
          break;
        }
        case State::value: {
          if (first_newline_) {
            if (pos_ == s.size()) return;
            if (s[pos_] == '\n') ++pos_;
            first_newline_ = false;
          }
          // The value ends at </parameter>; a missing one is tolerated before the next tag.
          size_t end = std::string_view::npos, skip = 0;
          for (std::string_view tag :
               {std::string_view("</parameter>"), std::string_view("<parameter="), std::string_view("</function>")}) {
            const size_t at = s.find(tag, pos_);
            if (at < end) end = at, skip = tag == "</parameter>" ? tag.size() : 0;
          }
          if (end == std::string_view::npos) {
            if (type_ != "string") return;  // converted once complete
            const std::string_view rest = s.substr(pos_);
            const size_t hold = engine::held_back(
                rest,
                {"\n</parameter>", "</parameter>", "\n<parameter=", "<parameter=", "\n</function>", "</function>"});
            std::string fragment;
            append_json_escaped(fragment, rest.substr(0, rest.size() - hold));
            if (!fragment.empty()) emit_arguments(out, fragment);
            pos_ += rest.size() - hold;
            return;
          }
          finish_value(out, s.substr(pos_, end - pos_));
          pos_ = end + skip;
          state_ = State::body;
          break;
        }
        case State::done:
        case State::unreadable:
          pos_ = s.size();
          return;
      }
    }
  }

  // `rest`: the value text not yet emitted (all of it for non-strings).
  void finish_value(ParsedOutput& out, std::string_view rest) {
    if (!rest.empty() && rest.back() == '\n') rest.remove_suffix(1);
    if (type_ == "string") {
      std::string fragment;
      append_json_escaped(fragment, rest);
      emit_arguments(out, fragment + "\"");
      return;
    }
    std::string fragment = arguments_open_ ? ", \"" : "{\"";
    append_json_escaped(fragment, parameter_);
    fragment += "\": ";
    fragment += convert(rest);
    emit_arguments(out, fragment);
    arguments_open_ = true;
  }

  void close_arguments(ParsedOutput& out) {
    emit_arguments(out, arguments_open_ ? "}" : "{}");
    arguments_open_ = false;
  }

  bool close(ParsedOutput& out, bool closed) override {
    if (!started_) return false;
    if (!closed) {
      // Cut off: a string value so far stays as written (unterminated); nothing else is added.
      if (state_ == State::value && type_ == "string") {
        std::string_view rest = std::string_view(body_).substr(pos_);
        if (first_newline_ && !rest.empty() && rest.front() == '\n') rest.remove_prefix(1);
        std::string fragment;
        append_json_escaped(fragment, rest);
        emit_arguments(out, fragment);
      }
      return true;
    }
    if (state_ == State::value) finish_value(out, std::string_view(body_).substr(pos_));
    if (state_ != State::done) close_arguments(out);
    return true;
  }

  void reset() override {
    state_ = State::open;
    arguments_open_ = false;
    properties_ = nullptr;
  }

  // The schema of a parameter (nullptr: the tool does not declare it).
  const json* parameter_schema(const std::string& name) const {
    if (!properties_ || !properties_->contains(name)) return nullptr;
    return &(*properties_)[name];
  }

  // A non-string value as JSON text: parsed when it is valid JSON of a fitting kind, else a string.
  std::string convert(std::string_view text) const {
    std::string value(text);
    if (type_ == "boolean") {
      std::string lower = value;
      std::transform(lower.begin(), lower.end(), lower.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      if (lower == "true" || lower == "false") return lower;
    }
    const json parsed = json::parse(value, nullptr, false);
    if (!parsed.is_discarded()) {
      const bool fits = type_.empty() || (type_ == "integer" && parsed.is_number_integer()) ||
                        (type_ == "number" && parsed.is_number()) || (type_ == "object" && parsed.is_object()) ||
                        (type_ == "array" && parsed.is_array()) || (type_ == "null" && parsed.is_null()) ||
                        (type_ == "boolean" && parsed.is_boolean());
      if (fits) return dump(parsed);
    }
    std::string quoted = "\"";
    append_json_escaped(quoted, value);
    return quoted + "\"";
  }

  json tools_;
  const json* properties_ = nullptr;
  State state_ = State::open;
  std::string parameter_, type_;
  bool first_newline_ = false;
  bool arguments_open_ = false;
};

}  // namespace

ToolCallFormat detect_tool_call_format(std::string_view chat_template) {
  if (chat_template.find("<function=") != std::string_view::npos) return ToolCallFormat::xml;
  if (chat_template.find("<tool_call>") != std::string_view::npos) return ToolCallFormat::hermes;
  return ToolCallFormat::none;
}

ParsedOutput ToolCallParser::push(std::string_view text) {
  pending_ += text;
  ParsedOutput out;
  while (true) {
    if (!in_call_) {
      const size_t at = pending_.find(kCallOpen);
      if (at != std::string::npos) {
        emit_content(out, std::string_view(pending_).substr(0, at), true);
        pending_.erase(0, at + kCallOpen.size());
        in_call_ = true;
        continue;
      }
      const size_t hold = engine::held_back(pending_, {kCallOpen});
      emit_content(out, std::string_view(pending_).substr(0, pending_.size() - hold), false);
      pending_.erase(0, pending_.size() - hold);
      return out;
    }
    const size_t end = pending_.find(kCallClose);
    if (end != std::string::npos) {
      body_ += std::string_view(pending_).substr(0, end);
      pending_.erase(0, end + kCallClose.size());
      scan(out, true);
      end_call(out, true);
      continue;
    }
    const size_t hold = engine::held_back(pending_, {kCallClose});
    body_ += std::string_view(pending_).substr(0, pending_.size() - hold);
    pending_.erase(0, pending_.size() - hold);
    scan(out, false);
    return out;
  }
}

ParsedOutput ToolCallParser::finish() {
  ParsedOutput out;
  if (in_call_) {
    body_ += pending_;
    pending_.clear();
    scan(out, true);
    end_call(out, false);
  } else {
    emit_content(out, pending_, false);
    pending_.clear();
  }
  if (calls_ == 0) out.content += held_space_;
  held_space_.clear();
  return out;
}

void ToolCallParser::start_call(ParsedOutput& out, std::string name) {
  started_ = true;
  out.calls.push_back({calls_++, std::move(name), ""});
}

void ToolCallParser::emit_arguments(ParsedOutput& out, std::string_view fragment) {
  if (fragment.empty()) return;
  if (out.calls.empty() || out.calls.back().index != calls_ - 1) out.calls.push_back({calls_ - 1, "", ""});
  out.calls.back().arguments += fragment;
}

void ToolCallParser::emit_content(ParsedOutput& out, std::string_view text, bool before_call) {
  if (strip_leading_) {
    while (!text.empty() && is_space(text.front())) text.remove_prefix(1);
    if (!text.empty()) strip_leading_ = false;
  }
  // Whitespace is held until it is known whether text or a call follows it.
  size_t end = text.size();
  while (end > 0 && is_space(text[end - 1])) --end;
  if (end > 0) {
    out.content += held_space_;
    held_space_.clear();
    out.content += text.substr(0, end);
  }
  held_space_ += text.substr(end);
  if (before_call) held_space_.clear();
}

void ToolCallParser::end_call(ParsedOutput& out, bool closed) {
  if (!close(out, closed)) {
    // Not a call we can read: the text goes out as it was written.
    std::string raw = std::string(kCallOpen) + body_;
    if (closed) raw += kCallClose;
    held_space_.clear();
    out.content += raw;
  } else {
    strip_leading_ = true;
  }
  in_call_ = false;
  started_ = false;
  body_.clear();
  pos_ = 0;
  reset();
}

std::unique_ptr<ToolCallParser> make_tool_call_parser(ToolCallFormat format, const json& tools) {
  switch (format) {
    case ToolCallFormat::hermes:
      return std::make_unique<HermesParser>();
    case ToolCallFormat::xml:
      return std::make_unique<XmlParser>(tools);
    case ToolCallFormat::none:
      break;
  }
  return nullptr;
}

}  // namespace qinfer::server
