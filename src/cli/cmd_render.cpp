// `qinfer render --model DIR < request.json`: the exact prompt an OpenAI chat-completions request
// renders to through the model's chat template, printed without an added newline.
#include <cstdio>
#include <iostream>
#include <iterator>
#include <memory>

#include "cli/commands.h"
#include "cli/generation_options.h"
#include "core/error.h"
#include "io/json.h"
#include "tokenizer/chat_template.h"

namespace qinfer::cli {

void add_render_command(CLI::App& app) {
  auto model = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "render", "Print the prompt a chat-completions request (JSON on stdin) renders to through the chat template");
  cmd->add_option("--model", *model,
                  "model folder (only tokenizer_config.json / chat_template.jinja are read), or a Hugging Face "
                  "name org/name[@revision]")
      ->required();
  add_hub_flags(cmd);
  cmd->callback([model] {
    const std::string text((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    nlohmann::ordered_json request;
    // nlohmann parses recursively: a deep enough document would overflow the stack.
    if (const auto key = io::json_too_deep(text))
      fail("request on stdin: nested deeper than {} levels{}", io::kMaxJsonDepth, key->empty() ? "" : " (under \"" + *key + "\")");
    try {
      request = nlohmann::ordered_json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      fail("request on stdin is not valid JSON: {}", e.what());
    }
    const std::string prompt = tokenizer::ChatTemplate::from_model_dir(model_folder(*model)).render(request);
    std::fwrite(prompt.data(), 1, prompt.size(), stdout);
    std::fflush(stdout);
  });
}

}  // namespace qinfer::cli
