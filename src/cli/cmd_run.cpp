// `qinfer run`: one prompt through the chat template (or raw), streamed to stdout; stats on stderr.
#include <fmt/format.h>

#include <csignal>
#include <cstdio>

#include "cli/commands.h"
#include "cli/generation_options.h"
#include "core/error.h"
#include "tokenizer/utf8.h"

namespace qinfer::cli {
namespace {

std::atomic<bool> g_cancel{false};

}  // namespace

void add_run_command(CLI::App& app) {
  struct Options {
    std::string model, prompt, system;
    bool raw = false;
    GenerationFlags flags;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("run", "Generate a reply to one prompt, streamed to stdout");
  cmd->add_option("--model", o->model, "checkpoint folder with tokenizer files (default: the bundled demo model)");
  cmd->add_option("-p,--prompt", o->prompt, "the prompt (user message)")->required();
  cmd->add_option("--system", o->system, "system message");
  cmd->add_flag("--raw", o->raw, "send the prompt as is, without the chat template");
  add_generation_flags(cmd, o->flags);
  cmd->callback([o] {
    QINFER_CHECK(tokenizer::is_valid_utf8(o->prompt), "--prompt: not valid UTF-8 (at byte {})",
                 tokenizer::valid_utf8_prefix(o->prompt));
    auto m = load_model((o->model = model_or_default(o->model)), !o->raw, o->flags.device,
                        o->flags.tensor_parallel);
    std::string text = o->prompt;
    if (!o->raw) {
      nlohmann::ordered_json request = {{"messages", nlohmann::ordered_json::array()}};
      if (!o->system.empty()) request["messages"].push_back({{"role", "system"}, {"content", o->system}});
      request["messages"].push_back({{"role", "user"}, {"content", o->prompt}});
      request["chat_template_kwargs"] = {{"enable_thinking", o->flags.thinking}};
      text = m->chat_template->render(request);
    }
    // A rendered template already holds its special tokens (apply_chat_template adds none).
    const std::vector<int32_t> prompt = m->tokenizer.encode(text, /*add_special_tokens=*/o->raw);
    engine::GenerationOptions options = o->flags.options;
    options.stop_ids = m->stop_ids;
    options.cancel = &g_cancel;
    std::signal(SIGINT, [](int) { g_cancel = true; });
    ReplyPrinter print(o->flags.think == "hide", text);
    const engine::GenerationResult r = engine::generate(m->model(), m->tokenizer, prompt, options, std::ref(print));
    print.finish();
    std::fputc('\n', stdout);
    std::fflush(stdout);  // the statistics line (stderr) comes after the text
    std::signal(SIGINT, SIG_DFL);
    fmt::print(stderr, "prompt {} tokens, {:.1f} tok/s; generated {} tokens, {:.1f} tok/s; finish: {}\n",
               r.prompt_tokens, r.prompt_tokens / std::max(r.prefill_seconds, 1e-9), r.tokens.size(),
               r.tokens.size() / std::max(r.decode_seconds, 1e-9), r.finish_reason);
  });
}

}  // namespace qinfer::cli
