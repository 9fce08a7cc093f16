#pragma once
// Each subcommand registers itself on the app; main.cpp only wires them up.
#include <CLI/CLI.hpp>

namespace qinfer::cli {

void add_inspect_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_render_command(CLI::App& app);
void add_tokenize_command(CLI::App& app);
void add_quantize_command(CLI::App& app);
void add_run_command(CLI::App& app);
void add_chat_command(CLI::App& app);
void add_serve_command(CLI::App& app);
// pull, ls, rm: the Hugging Face cache.
void add_hub_commands(CLI::App& app);

}  // namespace qinfer::cli

#ifdef QINFER_HAVE_CUDA
void add_devices_command(CLI::App& app);
#endif
