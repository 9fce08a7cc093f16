// `qinfer run`: one prompt through the chat template (or raw), streamed to stdout; stats on stderr.
#include <fmt/format.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <iterator>

#include "cli/commands.h"
#include "cli/generation_options.h"
#include "core/error.h"
#include "grammar/constraint.h"
#include "io/json.h"
#include "tokenizer/utf8.h"

namespace qinfer::cli {
namespace {

std::atomic<bool> g_cancel{false};

std::string read_text(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  QINFER_CHECK(in.good(), "{} {}: cannot be read", flag, path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

void add_run_command(CLI::App& app) {
  struct Options {
    std::string model, prompt, system;
    bool raw = false;
    std::string json_schema, grammar, regex;  // structured output: a file, a file, a pattern
    bool json = false;
    GenerationFlags flags;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("run", "Generate a reply to one prompt, streamed to stdout");
  cmd->add_option("--model", o->model, "checkpoint folder with tokenizer files, or a Hugging Face name "
                  "org/name[@revision] (default: the bundled demo model)");
  add_hub_flags(cmd);
  cmd->add_option("-p,--prompt", o->prompt, "the prompt (user message)")->required();
  cmd->add_option("--system", o->system, "system message");
  cmd->add_flag("--raw", o->raw, "send the prompt as is, without the chat template");
  add_generation_flags(cmd, o->flags);
  auto* schema = cmd->add_option("--json-schema", o->json_schema, "write JSON valid against the JSON Schema in this file");
  auto* grammar = cmd->add_option("--grammar", o->grammar, "write text of the GBNF grammar (llama.cpp syntax) in this file");
  auto* regex = cmd->add_option("--regex", o->regex, "write text matching this regular expression");
  auto* json = cmd->add_flag("--json", o->json, "write one JSON object (JSON mode)");
  schema->excludes(grammar)->excludes(regex)->excludes(json);
  grammar->excludes(regex)->excludes(json);
  regex->excludes(json);
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
    grammar::ConstraintSpec spec;
    std::string flag;
    if (!o->json_schema.empty()) {
      spec.kind = grammar::ConstraintSpec::Kind::json_schema, flag = "--json-schema";
      const std::string text = read_text(o->json_schema, "--json-schema");
      if (io::json_too_deep(text)) fail("--json-schema {}: nested deeper than {} levels", o->json_schema, io::kMaxJsonDepth);
      try {
        spec.schema = nlohmann::ordered_json::parse(text);
      } catch (const nlohmann::json::parse_error& e) {
        fail("--json-schema {}: not JSON: {}", o->json_schema, e.what());
      }
    } else if (!o->grammar.empty()) {
      spec.kind = grammar::ConstraintSpec::Kind::grammar, flag = "--grammar";
      spec.text = read_text(o->grammar, "--grammar");
    } else if (!o->regex.empty()) {
      spec.kind = grammar::ConstraintSpec::Kind::regex, flag = "--regex", spec.text = o->regex;
    } else if (o->json) {
      spec.kind = grammar::ConstraintSpec::Kind::json_object, flag = "--json";
    }
    if (spec.kind != grammar::ConstraintSpec::Kind::none) {
      // The answer after any reasoning the template opened or the model writes (as the server does).
      const bool reasons = !o->raw && m->tokenizer.config().chat_template.find("</think>") != std::string::npos;
      const grammar::Reasoning reasoning = engine::answer_start(reasons, text);
      grammar::ConstraintCache cache(grammar::TokenTrie::from_tokenizer(m->tokenizer), 1);
      try {
        options.constraint = cache.get(spec, reasoning, options.stop_ids);
      } catch (const Error& e) {
        fail("{}: {}", flag, e.what());
      }
    }
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
