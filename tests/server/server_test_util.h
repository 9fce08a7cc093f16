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
#include "server/request.h"

namespace qinfer::server::testing {

inline std::filesystem::path repo_root() { return std::filesystem::path(QINFER_TEST_DATA).parent_path().parent_path(); }

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
  json body_json() const { return json::parse(body, nullptr, false); }
  std::string header(const std::string& lower_case_name) const {
    auto it = headers.find(lower_case_name);
    return it == headers.end() ? "" : it->second;
  }
};

// A connected socket to 127.0.0.1:port (closed on destruction).
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &address.sin_addr);
    if (::connect(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) close();
  }
  ~RawConnection() { close(); }
  bool ok() const { return fd_ >= 0; }
  void send(const std::string& bytes) {
    for (size_t sent = 0; sent < bytes.size() && fd_ >= 0;) {
      const ssize_t n = ::send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  }
  // Reads until `done(received)` holds, the peer closes, or the deadline passes.
  template <typename Done>
  std::string read_until(Done done, std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (fd_ >= 0 && !done(received_) && std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      char buffer[8192];
      const ssize_t n = ::recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) break;
      received_.append(buffer, static_cast<size_t>(n));
    }
    return received_;
  }
  std::string read_all(std::chrono::milliseconds timeout = std::chrono::seconds(20)) {
    return read_until([](const std::string&) { return false; }, timeout);
  }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  std::string received_;
};

inline HttpResponse parse_http(const std::string& raw) {
  HttpResponse r;
  const size_t head_end = raw.find("\r\n\r\n");
  if (head_end == std::string::npos) return r;
  std::istringstream head(raw.substr(0, head_end));
  std::string line;
  std::getline(head, line);
  if (line.size() > 12) r.status = std::atoi(line.c_str() + 9);
  while (std::getline(head, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    const size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string name = line.substr(0, colon);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    r.headers[name] = line.substr(line.find_first_not_of(' ', colon + 1));
  }
  std::string body = raw.substr(head_end + 4);
  if (r.headers["transfer-encoding"] == "chunked") {
    std::string decoded;
    size_t pos = 0;
    while (pos < body.size()) {
      const size_t eol = body.find("\r\n", pos);
      if (eol == std::string::npos) break;
      const size_t size = std::stoul(body.substr(pos, eol - pos), nullptr, 16);
      if (size == 0) break;
      decoded += body.substr(eol + 2, size);
      pos = eol + 2 + size + 2;
    }
    body = decoded;
  }
  r.body = body;
  return r;
}

inline std::string http_request(const std::string& method, const std::string& path, const std::string& body,
                                const std::vector<std::string>& headers = {}) {
  std::string request = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const std::string& h : headers) request += h + "\r\n";
  if (method == "POST")
    request += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  return request + "\r\n" + body;
}

// One request on its own connection, read to the end.
inline HttpResponse fetch(int port, const std::string& method, const std::string& path, const std::string& body = "",
                          const std::vector<std::string>& headers = {}) {
  RawConnection c(port);
  EXPECT_TRUE(c.ok());
  c.send(http_request(method, path, body, headers));
  return parse_http(c.read_all());
}

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

  std::optional<uint64_t> submit(engine::RequestParams params, engine::EventSink sink) override {
    if (refuse_) return std::nullopt;
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
  std::atomic<bool> refuse_{false};
  std::atomic<int> running_{0}, cancels_{0};
  uint64_t next_id_ = 1;
  std::map<uint64_t, std::shared_ptr<std::atomic<bool>>> cancelled_;
  std::vector<engine::RequestParams> submitted_;
  std::vector<std::thread> threads_;
};

}  // namespace qinfer::server::testing
