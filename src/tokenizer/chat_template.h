#pragma once
// Chat templates applied as transformers' apply_chat_template does, to OpenAI chat-completions
// request bodies. The template sees: messages, tools (None when absent), documents (None when
// absent), add_generation_prompt (default true), the special tokens of tokenizer_config.json
// (bos_token, eos_token, ...), the request's chat_template_kwargs (e.g. enable_thinking), and the
// functions raise_exception(msg) and strftime_now(fmt).
//
// Requests are normalized the way OpenAI-compatible servers (vLLM, llama.cpp) do before rendering,
// because OpenAI clients send shapes the Qwen templates cannot read as is:
//   - a message's content that is null or absent becomes "" (assistant turns that only call tools);
//   - tool_calls[].function.arguments given as a JSON string is parsed into its object.
#include <nlohmann/json.hpp>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/jinja/template.h"

namespace qinfer::tokenizer {

class ChatTemplate {
 public:
  // The template of a model directory: chat_template.jinja, else tokenizer_config.json's
  // "chat_template" (a string or a list of {name, template}), else chat_template.json. Special
  // tokens come from tokenizer_config.json when present.
  static ChatTemplate from_model_dir(const std::filesystem::path& dir);

  // One template; `origin` names it in error messages. `special_tokens` is tokenizer_config.json
  // (only its *_token fields are read).
  ChatTemplate(std::string_view source, std::string origin, const nlohmann::ordered_json& tokenizer_config = {});
  // Several named templates (a tokenizer_config "chat_template" list): "tool_use" is used when the
  // request has tools and it exists, otherwise "default".
  ChatTemplate(std::vector<std::pair<std::string, std::string>> named_sources, std::string origin,
               const nlohmann::ordered_json& tokenizer_config = {});

  // The prompt for an OpenAI chat-completions request body. Throws qinfer::Error naming the
  // request field for a malformed request, jinja::Error naming the template line for a template
  // that fails (ErrorKind::raised when the template called raise_exception, ErrorKind::limit when
  // it ran past `limits`).
  std::string render(const nlohmann::ordered_json& request, const jinja::Limits& limits = {}) const;

 private:
  std::vector<std::pair<std::string, jinja::Template>> templates_;
  jinja::Dict special_tokens_;
};

}  // namespace qinfer::tokenizer
