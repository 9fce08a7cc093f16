#pragma once
// qinfer's Jinja2 interpreter for chat templates. It follows Python Jinja2 3.1 as transformers
// configures it (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, a tojson
// that is json.dumps): same output bytes, same scoping, same Python formatting of values.
//
//   jinja::Template t(source, "chat_template.jinja");
//   jinja::Dict context;
//   context.set("messages", jinja::Value::from_json(request["messages"]));
//   std::string prompt = t.render(context);
//
// Errors are jinja::Error (a qinfer::Error) whose message starts with "NAME:LINE: ".
#include <memory>
#include <string>
#include <string_view>

#include "tokenizer/jinja/error.h"
#include "tokenizer/jinja/limits.h"
#include "tokenizer/jinja/value.h"

namespace qinfer::jinja {

class Template {
 public:
  // Parses `source`; `name` prefixes error messages. Throws Error(syntax).
  explicit Template(std::string_view source, std::string name = "template");
  ~Template();
  Template(Template&&) noexcept;
  Template& operator=(Template&&) noexcept;

  // Renders with `context` as the template's variables (range, namespace and dict are built in).
  // Each call has its own state and `limits`, so one Template may render on several threads at
  // once. Namespaces in `context` that the template assigns to are emptied when the render ends.
  // Throws Error(limit) when the render takes more steps or memory than `limits` allow.
  std::string render(const Dict& context, const Limits& limits = {}) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qinfer::jinja
