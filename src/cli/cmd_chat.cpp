// `qinfer chat`: an interactive multi-turn conversation. /reset clears the history, /exit (or end of
// input) quits, Ctrl-C stops the answer being written but not the program.
#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <iostream>

#include "cli/commands.h"
#include "cli/generation_options.h"
#include "core/error.h"
#include "tokenizer/utf8.h"

namespace qinfer::cli {
namespace {

std::atomic<bool> g_cancel{false};

}  // namespace

void add_chat_command(CLI::App& app) {
  struct Options {
    std::string model, system;
    GenerationFlags flags;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("chat", "Interactive multi-turn chat (/reset, /exit; Ctrl-C stops an answer)");
  cmd->add_option("--model", o->model, "checkpoint folder with tokenizer files, or a Hugging Face name "
                  "org/name[@revision] (default: the bundled demo model)");
  add_hub_flags(cmd);
  cmd->add_option("--system", o->system, "system message");
  add_generation_flags(cmd, o->flags);
  cmd->callback([o] {
    auto m = load_model((o->model = model_or_default(o->model)), true, o->flags.device, o->flags.tensor_parallel);
    if (follow_the_group(*m)) return;  // process 0 reads the conversation
    struct sigaction action {};
    action.sa_handler = [](int) { g_cancel = true; };
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;  // a Ctrl-C at the prompt does not end the read
    sigaction(SIGINT, &action, nullptr);
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (!o->system.empty()) messages.push_back({{"role", "system"}, {"content", o->system}});
    const bool hide = o->flags.think == "hide";
    fmt::print("qinfer chat: {} ({}). /reset clears the conversation, /exit quits.\n", o->model,
               m->checkpoint.family->name);
    std::string line;
    while (true) {
      fmt::print("> ");
      std::fflush(stdout);
      if (!std::getline(std::cin, line)) break;
      if (line == "/exit" || line == "/quit") break;
      if (line == "/reset") {
        messages.erase(messages.begin() + (o->system.empty() ? 0 : 1), messages.end());
        fmt::print("(conversation cleared)\n");
        continue;
      }
      if (line.empty()) continue;
      if (!tokenizer::is_valid_utf8(line)) {
        fmt::print("(that line is not valid UTF-8; please type it again)\n");
        continue;
      }
      messages.push_back({{"role", "user"}, {"content", line}});
      try {
        const std::string text = m->chat_template->render(
            {{"messages", messages}, {"chat_template_kwargs", {{"enable_thinking", o->flags.thinking}}}});
        engine::GenerationOptions options = o->flags.options;
        options.stop_ids = m->stop_ids;
        options.cancel = &g_cancel;
        g_cancel = false;
        ReplyPrinter print(hide, text);
        const engine::GenerationResult r =
            engine::generate(m->model(), m->tokenizer, m->tokenizer.encode(text, false), options, std::ref(print));
        print.finish();
        fmt::print("{}\n", r.finish_reason == "cancelled" ? " [stopped]" : "");
        messages.push_back({{"role", "assistant"}, {"content", m->tokenizer.decode(r.tokens)}});
      } catch (const Error& e) {
        // A bad turn (template error, over-long prompt) loses that turn, not the conversation.
        messages.erase(messages.end() - 1);
        fmt::print("error: {}\n", e.what());
      }
    }
    fmt::print("\n");
  });
}

}  // namespace qinfer::cli
