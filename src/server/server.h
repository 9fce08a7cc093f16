#pragma once
// The OpenAI-compatible HTTP server: POST /v1/chat/completions, POST /v1/completions,
// GET /v1/models, GET /health, GET /metrics. Requests are validated, rendered through the chat
// template, tokenized and handed to a Generator; results go back as JSON or as Server-Sent Events.
// Every malformed request gets a 4xx with an OpenAI-style error body; a client that goes away,
// streamed or not, has its request cancelled.
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/sampling.h"
#include "http/http_server.h"
#include "server/generator.h"
#include "server/request.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace qinfer::server {

// The model behind the server and what its files say about serving it.
struct ServedModel {
  std::string name;  // the id clients send as "model"
  const tokenizer::Tokenizer* tokenizer = nullptr;
  const tokenizer::ChatTemplate* chat_template = nullptr;  // null: /v1/chat/completions answers 400
  std::string chat_template_source;                        // read for the tool-call and reasoning format
  std::vector<int32_t> stop_ids;
  int64_t max_context = 0;           // prompt + completion tokens per sequence
  SamplingParams sampling_defaults;  // OpenAI defaults, overridden by generation_config.json
};

// SamplingParams with OpenAI's defaults (temperature 1, top_p 1) overridden by what the model
// directory's generation_config.json recommends (temperature, top_p, top_k, min_p,
// repetition_penalty), as vLLM does.
SamplingParams sampling_defaults(const std::filesystem::path& model_dir);

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;      // 0: any free port
  std::string api_key;  // non-empty: every /v1/ request needs "Authorization: Bearer <key>"
  // Host header names answered besides the loopback ones (localhost, 127.0.0.1, [::1]); "*": any.
  // Empty on a non-loopback address: any. A loopback server refuses other names, so that a web page
  // cannot reach it by DNS rebinding.
  std::vector<std::string> allowed_hosts;
  // Origins a browser page may call from (CORS); "*": any. Empty: no cross-origin answers.
  std::vector<std::string> allowed_origins;
  size_t max_body_bytes = 16u << 20;
  int http_threads = 0;  // requests answered at once (0: enough for every running and waiting request)
  int max_queue = 256;   // only sizes the HTTP worker pool (the scheduler decides admission)
  int max_running = 64;
  size_t max_connections = 4096;  // open connections; beyond, 503
  std::chrono::milliseconds header_timeout{10'000};  // a request's headers must arrive within this
  std::chrono::milliseconds body_timeout{60'000};    // and its body within this after them
  std::chrono::milliseconds idle_timeout{30'000};    // a kept-alive connection's silence
  RequestLimits limits;
};

class Server {
 public:
  Server(ServerOptions options, ServedModel model, Generator& generator);
  ~Server();  // stop()s
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds options.host:port and serves in the background; returns the port (the chosen one for
  // port 0). Throws Error when the address cannot be bound.
  int start();
  // Serves on a listener bound earlier (before the model loaded).
  int start(http::Listener listener);
  // Stops taking requests (new ones get 503) while those in progress go on: the start of a drain.
  void stop_accepting();
  // Generation requests in progress.
  size_t in_progress() const;
  // Ends every in-flight request with an error that says the server is stopping, stops listening
  // and closes every connection. Safe to call more than once and from any thread.
  void stop();

  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qinfer::server
