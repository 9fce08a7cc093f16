// qinfer: inference for the Qwen model families.
#include <CLI/CLI.hpp>

#include <cstdio>

#include "cli/commands.h"
#include "core/error.h"
#include "core/log.h"

int main(int argc, char** argv) {
  CLI::App app{"qinfer: fast, exact inference for the Qwen model families (Qwen3, Qwen3-MoE, Qwen3-Next, "
               "Qwen3.5/3.6 dense and MoE)",
               "qinfer"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "qinfer 0.1.0");
  std::string level;
  app.add_option("--log-level", level, "trace|debug|info|warn|error|off (default: QINFER_LOG or info)");
  app.parse_complete_callback([&] {
    if (!level.empty()) qinfer::set_log_level(qinfer::parse_log_level(level));
  });
  qinfer::cli::add_inspect_command(app);
  qinfer::cli::add_eval_command(app);
  qinfer::cli::add_bench_command(app);
  qinfer::cli::add_render_command(app);
  qinfer::cli::add_tokenize_command(app);
  qinfer::cli::add_quantize_command(app);
  qinfer::cli::add_run_command(app);
  qinfer::cli::add_chat_command(app);
  qinfer::cli::add_serve_command(app);
  qinfer::cli::add_hub_commands(app);
#ifdef QINFER_HAVE_CUDA
  add_devices_command(app);
#endif
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const qinfer::Error& e) {
    std::fprintf(stderr, "qinfer: error: %s\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "qinfer: internal error: %s\n", e.what());
    return 2;
  }
  return 0;
}
