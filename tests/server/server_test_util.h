#pragma once
// Helpers for driving the HTTP server in tests: a raw HTTP/1.1 client (for streams read partway,
// clients that vanish and bytes no library would send), SSE parsing, and a scripted Generator.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "server/generator.h"
#include "support/raw_http.h"
#include "server/request.h"

namespace qinfer::server::testing {

inline std::filesystem::path repo_root() { return std::filesystem::path(QINFER_TEST_DATA).parent_path().parent_path(); }

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

using qinfer::testing::fetch;
using qinfer::testing::http_request;
using qinfer::testing::HttpResponse;
using qinfer::testing::parse_http;
using qinfer::testing::RawConnection;

// The JSON payloads of an SSE body; "[DONE]" becomes the string "[DONE]".
inline std::vector<json> sse_payloads(const std::string& body) {
  std::vector<json> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    const std::string event = body.substr(pos, end - pos);
    pos = end + 2;
    if (!event.starts_with("data: ")) continue;
    const std::string data = event.substr(6);
    out.push_back(data == "[DONE]" ? json("[DONE]") : json::parse(data, nullptr, false));
  }
  return out;
}

// Plays canned text instead of running a model: every choice of a request emits `pieces` in turn,
// one every `interval`, then finishes with `finish`. For outputs a random-weight model cannot be
// made to write (tool calls) and for timing-controlled edge cases (a client leaving mid-stream).
class ScriptedGenerator final : public Generator {
 public:
  struct Script {
    std::vector<std::string> pieces;
    std::string finish = "stop";  // or "error", "length"
    std::chrono::milliseconds interval{0};
  };

  ~ScriptedGenerator() override {
    {
      std::lock_guard lock(mutex_);
      for (auto& [id, flag] : cancelled_) *flag = true;
    }
    for (std::thread& t : threads_) t.join();
  }

  void set_script(Script script) {
    std::lock_guard lock(mutex_);
    script_ = std::move(script);
  }
  void refuse_all(bool refuse) { refuse_ = refuse; }
  void run_out_of_memory(bool oom) { oom_ = oom; }  // submit throws std::bad_alloc

  std::optional<uint64_t> submit(engine::RequestParams params, engine::EventSink sink) override {
    if (refuse_) return std::nullopt;
    if (oom_) throw std::bad_alloc();
    std::lock_guard lock(mutex_);
    const uint64_t id = next_id_++;
    submitted_.push_back(params);
    auto flag = std::make_shared<std::atomic<bool>>(false);
    cancelled_[id] = flag;
    ++running_;
    threads_.emplace_back([this, params = std::move(params), sink = std::move(sink), script = script_, flag] {
      std::vector<bool> open(params.n, true);
      int emitted = 0;
      auto finish_all = [&](const std::string& reason) {
        for (int c = 0; c < params.n; ++c) {
          engine::Event e;
          e.kind = engine::Event::Kind::finished;
          e.choice = c;
          e.finish_reason = reason;
          e.error = reason == "error" ? "scripted failure" : "";
          e.prompt_tokens = static_cast<int64_t>(params.prompt.size());
          e.completion_tokens = emitted;
          sink(e);
        }
        --running_;
      };
      for (const std::string& piece : script.pieces) {
        for (int c = 0; c < params.n; ++c) {
          if (*flag) return finish_all("cancelled");
          engine::Event e;
          e.choice = c;
          e.text = piece;
          e.tokens = {7};
          if (params.top_logprobs >= 0) {
            engine::TokenLogprob lp{7, -0.5f, {}};
            for (int k = 0; k < params.top_logprobs; ++k) lp.top.push_back({7 + k, -0.5f - k});
            e.logprobs.push_back(lp);
          }
          sink(e);
        }
        ++emitted;
        std::this_thread::sleep_for(script.interval);
      }
      finish_all(*flag ? "cancelled" : script.finish);
    });
    return id;
  }

  void cancel(uint64_t id) override {
    std::lock_guard lock(mutex_);
    if (auto it = cancelled_.find(id); it != cancelled_.end()) {
      *it->second = true;
      ++cancels_;
    }
  }

  engine::EngineStats stats() const override {
    engine::EngineStats s;
    s.running = running_;
    return s;
  }

  int cancels() const { return cancels_; }
  int running() const { return running_; }
  std::vector<engine::RequestParams> submitted() const {
    std::lock_guard lock(mutex_);
    return submitted_;
  }

 private:
  mutable std::mutex mutex_;
  Script script_;
  std::atomic<bool> refuse_{false}, oom_{false};
  std::atomic<int> running_{0}, cancels_{0};
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::shared_ptr<std::atomic<bool>>> cancelled_;
  std::vector<engine::RequestParams> submitted_;
  std::vector<std::thread> threads_;
};

}  // namespace qinfer::server::testing
