// `qinfer serve`: the OpenAI-compatible HTTP server over the continuous-batching engine. The port is
// bound before the model loads (a port in use fails at once); the URL is printed when ready. SIGINT /
// SIGTERM drain: new requests get 503 while those in progress finish, for up to --drain-timeout
// seconds or until a second signal; what is left then ends with an error, and the process exits.
#include <fmt/format.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <cstdio>
#include <cstdlib>

#include "cli/commands.h"
#include "cli/generation_options.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/engine.h"
#include "server/server.h"

namespace qinfer::cli {
namespace {

// The one place that decides which model `serve` loads when --model is not given.
std::string resolve_model_dir(const std::string& flag) { return model_or_default(flag); }

// A model given by Hugging Face name is served under that name, not its snapshot's commit hash.
std::string default_served_name(const std::string& flag, const std::string& dir) {
  if (flag != dir && hub::parse_model_name(flag)) return hub::parse_model_name(flag)->repo;
  std::filesystem::path p(dir);
  if (p.filename().empty()) p = p.parent_path();
  return p.filename().string();
}

}  // namespace

void add_serve_command(CLI::App& app) {
  struct Options {
    std::string model, served_name;
    server::ServerOptions server;
    engine::EngineOptions engine;
    int threads = 0;
    std::string device = "cpu";
    int tensor_parallel = 1;
    double drain_timeout_s = 10;
  };
  auto o = std::make_shared<Options>();
  CLI::App* cmd = app.add_subcommand("serve", "OpenAI-compatible HTTP server (chat, completions, SSE streaming)");
  cmd->add_option("--model", o->model, "checkpoint folder with tokenizer files, or a Hugging Face name "
                  "org/name[@revision] (default: the bundled demo model)");
  add_hub_flags(cmd);
  cmd->add_option("--host", o->server.host, "address to bind (default 127.0.0.1; other hosts need care)");
  cmd->add_option("--port", o->server.port, "port (default 8000; 0 picks a free one)")->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", o->server.api_key, "require \"Authorization: Bearer KEY\" on /v1/ requests")
      ->envname("QINFER_API_KEY");
  cmd->add_option("--allowed-hosts", o->server.allowed_hosts,
                  "Host header names to answer besides localhost / 127.0.0.1 / [::1] (\"*\": any; default: any "
                  "unless bound to a loopback address), e.g. behind a reverse proxy")
      ->delimiter(',');
  cmd->add_option("--allowed-origins", o->server.allowed_origins,
                  "origins a browser page may call the API from (CORS), e.g. http://localhost:3000 (\"*\": any; "
                  "default: none)")
      ->delimiter(',');
  cmd->add_option("--max-connections", o->server.max_connections,
                  "open connections before new ones get 503 (default 4096)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20));
  cmd->add_option("--drain-timeout", o->drain_timeout_s,
                  "seconds a SIGTERM / SIGINT waits for requests in progress before ending them (default 10)")
      ->check(CLI::Range(0.0, 86400.0));
  cmd->add_option("--served-model-name", o->served_name,
                  "the model id clients send (default: the folder name, or org/name for a Hugging "
                  "Face name)");
  cmd->add_option("--max-running", o->engine.max_running, "sequences decoding at once (default 64)")
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--max-waiting", o->engine.max_waiting, "queued requests before 429 (default 256)")
      ->check(CLI::Range(0, 1 << 20));
  cmd->add_flag("!--no-prefix-caching", o->engine.prefix_caching,
                "compute every prompt whole instead of reusing the KV blocks (and state checkpoints) of earlier "
                "requests' shared prefixes");
  cmd->add_option("--state-checkpoint-memory", o->engine.state_checkpoint_gb,
                  "GB for checkpoints of Gated DeltaNet state that reused prefixes start from (default: a tenth of "
                  "the cache's device memory, 0.25 on the CPU; 0: none, and such models reuse nothing)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--host-cache-gb", o->engine.host_cache_gb,
                  "GB of host memory (pinned on a GPU) that evicted prefix-cache blocks and state checkpoints are "
                  "copied into, and come back from when a later request shares their prefix (default 0: none)")
      ->check(CLI::Range(0.0, 1e6));
  cmd->add_option("--state-checkpoint-interval", o->engine.state_checkpoint_interval,
                  "tokens between a long prefill's state checkpoints, a multiple of the block size (default 1024; "
                  "0: only at junctions and prompt ends)")
      ->check(CLI::Range(0, 1 << 30));
  cmd->add_option("--kv-blocks", o->engine.kv_blocks,
                  "KV-cache blocks (default: max-running x max-context, within --memory-fraction of free memory)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 40));
  cmd->add_option("--max-context", o->engine.max_context,
                  "prompt + completion tokens per sequence (default: the model's)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30));
  cmd->add_option("--max-body-bytes", o->server.max_body_bytes, "largest request body accepted (default 16 MiB)")
      ->check(CLI::Range(size_t{1024}, size_t{1} << 34));
  cmd->add_option("--threads", o->threads, "CPU threads for the model (default: all)")->check(CLI::Range(1, 4096));
  cmd->add_option("--device", o->device, "cpu (default) or cuda[:N]");
  add_device_flags(cmd, o->tensor_parallel);
  cmd->add_option("--memory-fraction", o->engine.memory_fraction,
                  "of a GPU's free memory, or of the host's available memory on the CPU (after the weights), the "
                  "KV cache and states may take by default (default 0.9)")
      ->check(CLI::Range(0.01, 1.0));
  cmd->callback([o] {
    const std::string dir = resolve_model_dir(o->model);
    // Signals are taken by sigwait below: block them before any thread starts so none inherits them.
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
    // The process-wide pool reads QINFER_THREADS when the model first uses it.
    if (o->threads > 0) setenv("QINFER_THREADS", std::to_string(o->threads).c_str(), 1);
    std::optional<http::Listener> listener;
    if (leads_the_group()) listener.emplace(o->server.host, o->server.port);

    auto m = load_model(dir, /*need_template=*/false, o->device, o->tensor_parallel);
    if (follow_the_group(*m)) return;  // requests arrive at process 0
    try {
      m->chat_template = tokenizer::ChatTemplate::from_model_dir(dir);
    } catch (const qinfer::Error& e) {
      log_warn("{}; /v1/chat/completions is off, /v1/completions works", e.what());
    }
    // Every running sequence decodes one token per step, so a step must hold at least that many.
    o->engine.step_token_budget = std::max(o->engine.step_token_budget, o->engine.max_running);
    engine::Engine engine(m->model(), m->tokenizer, o->engine);
    server::EngineGenerator generator(engine);
    const engine::EngineOptions& so = engine.options();  // with its defaults resolved

    server::ServedModel served;
    served.name = o->served_name.empty() ? default_served_name(o->model, dir) : o->served_name;
    served.tokenizer = &m->tokenizer;
    served.chat_template = m->chat_template ? &*m->chat_template : nullptr;
    served.chat_template_source = m->tokenizer.config().chat_template;
    served.stop_ids = m->stop_ids;
    // One sequence can never hold more tokens than the whole KV pool.
    served.max_context = std::min<int64_t>(so.max_context, so.kv_blocks * so.block_size);
    served.sampling_defaults = server::sampling_defaults(dir);
    o->server.max_running = so.max_running;
    o->server.max_queue = so.max_waiting;
    server::Server http(o->server, served, generator);
    const int port = http.start(std::move(*listener));
    if (o->server.host != "127.0.0.1" && o->server.host != "localhost" && o->server.host != "::1" &&
        o->server.api_key.empty())
      log_warn("listening on {} without --api-key: anyone who can reach this address can use the model",
               o->server.host);
    fmt::print("qinfer serve: {} ready on http://{}:{}/v1 (Ctrl-C stops)\n", served.name, o->server.host, port);
    std::fflush(stdout);

    int received = 0;
    sigwait(&signals, &received);
    fmt::print(stderr, "qinfer serve: {}, draining (a second signal stops at once)\n",
               received == SIGINT ? "interrupted" : "terminated");
    http.stop_accepting();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(o->drain_timeout_s);
    const timespec poll{0, 50'000'000};
    while (http.in_progress() > 0 && std::chrono::steady_clock::now() < deadline)
      if (sigtimedwait(&signals, nullptr, &poll) > 0) break;
    if (http.in_progress() > 0) fmt::print(stderr, "qinfer serve: ending {} requests in progress\n", http.in_progress());
    http.stop();
  });
}

}  // namespace qinfer::cli
