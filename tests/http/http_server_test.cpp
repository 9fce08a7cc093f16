#include "http/http_server.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

#include "support/raw_http.h"

namespace qinfer::http {
namespace {

using qinfer::testing::HttpResponse;
using qinfer::testing::parse_http;
using qinfer::testing::RawConnection;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

bool has_full_response(const std::string& raw) {
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return false;
  const size_t cl = raw.find("Content-Length: ");
  if (cl == std::string::npos || cl > end) return true;
  return raw.size() >= end + 4 + std::stoul(raw.substr(cl + 16));
}

// What the test handler saw, for the tests to wait on.
struct Observed {
  std::mutex mutex;
  std::condition_variable changed;
  int gone = 0;              // on_client_gone calls
  int64_t stream_writes = 0;  // chunks a /stream handler queued
  bool stream_write_failed = false;
  Clock::time_point gone_at;

  template <typename Pred>
  bool wait(Pred pred, std::chrono::milliseconds timeout = 5s) {
    std::unique_lock lock(mutex);
    return changed.wait_for(lock, timeout, pred);
  }
};

struct TestServer {
  explicit TestServer(ServerLimits limits = {}) {
    if (limits.workers == 64) limits.workers = 8;
    auto seen = observed;
    server = std::make_unique<Server>(
        limits, [seen](Request& req, Responder& res) { handle(*seen, req, res); },
        [](int status, const std::string& message) {
          return Response{status, "text/plain", fmt::format("error {}: {}", status, message), {}};
        });
    Listener listener("127.0.0.1", 0);
    port = listener.port();
    server->start(std::move(listener));
  }

  static void handle(Observed& seen, Request& req, Responder& res) {
    if (req.path == "/echo") return res.send({200, "text/plain", req.method + " " + req.body, {}});
    if (req.path == "/slow") {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::stoi(req.query.substr(req.query.find('=') + 1))));
      return res.send({200, "text/plain", "slow " + req.query, {}});
    }
    if (req.path == "/wait") {  // answers only when the client leaves, or after 10 s
      auto done = std::make_shared<std::atomic<bool>>(false);
      res.on_client_gone([&seen, done] {
        std::lock_guard lock(seen.mutex);
        ++seen.gone;
        seen.gone_at = Clock::now();
        *done = true;
        seen.changed.notify_all();
      });
      const auto deadline = Clock::now() + 10s;
      while (!*done && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
      return res.send({200, "text/plain", "waited", {}});
    }
    if (req.path == "/stream") {
      const int chunks = std::stoi(req.query.substr(req.query.find('=') + 1));
      res.begin_stream(200, "text/event-stream");
      const std::string chunk(64 << 10, 'x');
      for (int i = 0; i < chunks; ++i) {
        if (!res.write(i == 0 ? std::string("first") : chunk)) {
          std::lock_guard lock(seen.mutex);
          seen.stream_write_failed = true;
          seen.changed.notify_all();
          return;
        }
        std::lock_guard lock(seen.mutex);
        ++seen.stream_writes;
      }
      return res.end_stream();
    }
    if (req.path == "/throw") throw std::runtime_error("boom");
    if (req.path == "/silent") return;  // answered by the server: 500
    res.send({404, "text/plain", "no " + req.path, {}});
  }

  std::shared_ptr<Observed> observed = std::make_shared<Observed>();
  std::unique_ptr<Server> server;
  int port = 0;
};

const std::string kGet = "GET /echo HTTP/1.1\r\nHost: t\r\n\r\n";

TEST(HttpServer, AnswersPipelinedRequestsInOrder) {
  TestServer t;
  RawConnection c(t.port);
  // The first is slow: the second and third must still come after it.
  c.send("GET /slow?ms=200 HTTP/1.1\r\nHost: t\r\n\r\n"
         "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabc"
         "POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n2\r\nxy\r\n0\r\n\r\n");
  const std::string all = c.read_all(5s);
  const size_t a = all.find("slow ms=200"), b = all.find("POST abc"), d = all.find("POST xy");
  ASSERT_NE(a, std::string::npos) << all;
  ASSERT_NE(b, std::string::npos) << all;
  ASSERT_NE(d, std::string::npos) << all;
  EXPECT_LT(a, b);
  EXPECT_LT(b, d);
  EXPECT_NE(all.rfind("Connection: close"), std::string::npos);
}

TEST(HttpServer, KeepsConnectionsAliveAndAnswersExpectContinue) {
  TestServer t;
  RawConnection c(t.port);
  c.send(kGet);
  c.read_until(has_full_response, 5s);
  c.send("POST /echo HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 4\r\n\r\n");
  const std::string interim = c.read_until([](const std::string& r) { return r.find("100 Continue") != std::string::npos; }, 5s);
  ASSERT_NE(interim.find("HTTP/1.1 100 Continue\r\n\r\n"), std::string::npos);
  c.send("body");
  const std::string all = c.read_until([](const std::string& r) { return r.find("POST body") != std::string::npos; }, 5s);
  EXPECT_NE(all.find("GET "), std::string::npos);
  EXPECT_NE(all.find("POST body"), std::string::npos);
}

TEST(HttpServer, RefusesMalformedAndOversizedRequestsAndCloses) {
  ServerLimits limits;
  limits.parser.max_body_bytes = 1000;
  limits.parser.max_header_bytes = 2048;
  TestServer t(limits);
  struct Case {
    std::string bytes;
    int status;
  };
  const std::vector<Case> cases = {
      {"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\nab", 400},
      {"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n", 400},
      {"GET /echo HTTP/1.1\r\nHost: t\r\nX: " + std::string(4000, 'a') + "\r\n\r\n", 431},
      {"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5000\r\n\r\n", 413},
      {"GET /echo HTTP/1.1\r\nHost: t\r\nbroken\r\n\r\n", 400},
  };
  for (const Case& k : cases) {
    RawConnection c(t.port);
    c.send(k.bytes);
    const HttpResponse r = parse_http(c.read_all(5s));
    EXPECT_EQ(r.status, k.status) << k.bytes.substr(0, 60);
    EXPECT_EQ(r.header("connection"), "close");
  }
  // A chunked body past the limit is refused at the chunk that crosses it, before the rest is sent.
  RawConnection c(t.port);
  c.send("POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n");
  for (int i = 0; i < 3; ++i) c.send("1f4\r\n" + std::string(500, 'b') + "\r\n");
  EXPECT_EQ(parse_http(c.read_all(5s)).status, 413);
}

TEST(HttpServer, SlowHeadersGet408AndIdleConnectionsClose) {
  ServerLimits limits;
  limits.header_timeout = 300ms;
  limits.idle_timeout = 300ms;
  TestServer t(limits);
  RawConnection slow(t.port);
  slow.send("GET /echo HTTP/1.1\r\nHo");
  const auto start = Clock::now();
  EXPECT_EQ(parse_http(slow.read_all(5s)).status, 408);
  EXPECT_LT(seconds_since(start), 2.0);
  RawConnection idle(t.port);
  idle.send(kGet);
  const auto sent = Clock::now();
  const std::string got = idle.read_all(5s);  // ends when the server closes the idle connection
  EXPECT_EQ(parse_http(got).status, 200);
  EXPECT_LT(seconds_since(sent), 2.0);
}

TEST(HttpServer, ServesWhileAThousandSlowConnectionsAreOpen) {
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  if (nofile.rlim_max != RLIM_INFINITY && nofile.rlim_max < 2600) GTEST_SKIP() << "needs 2600 file descriptors";
  TestServer t;  // the server raises the soft limit for its connection cap
  std::vector<std::unique_ptr<RawConnection>> loris;
  for (int i = 0; i < 1000; ++i) {
    loris.push_back(std::make_unique<RawConnection>(t.port));
    ASSERT_TRUE(loris.back()->ok()) << i;
    loris.back()->send("GET /echo HTTP/1.1\r\nHost: t\r\nX-");
  }
  // They trickle a byte each now and then, never finishing their headers, while normal requests come.
  double worst = 0;
  for (int round = 0; round < 10; ++round) {
    for (size_t i = round % 3; i < loris.size(); i += 3) loris[i]->send("a");
    const auto start = Clock::now();
    RawConnection c(t.port);
    c.send("GET /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    const HttpResponse r = parse_http(c.read_all(5s));
    worst = std::max(worst, seconds_since(start));
    EXPECT_EQ(r.status, 200);
    std::this_thread::sleep_for(100ms);
  }
  EXPECT_LT(worst, 1.0);
  EXPECT_GE(t.server->connections(), 1000u);
}

TEST(HttpServer, ConnectionsBeyondTheCapGet503) {
  ServerLimits limits;
  limits.max_connections = 4;
  TestServer t(limits);
  std::vector<std::unique_ptr<RawConnection>> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(std::make_unique<RawConnection>(t.port));
    held.back()->send(kGet);
    held.back()->read_until(has_full_response, 5s);
  }
  RawConnection extra(t.port);
  const HttpResponse r = parse_http(extra.read_all(5s));
  EXPECT_EQ(r.status, 503);
  EXPECT_EQ(r.header("retry-after"), "1");
  held.clear();
  for (int i = 0; i < 100 && t.server->connections() > 0; ++i) std::this_thread::sleep_for(10ms);
  RawConnection after(t.port);
  after.send("GET /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  EXPECT_EQ(parse_http(after.read_all(5s)).status, 200);
}

TEST(HttpServer, RequestsBeyondTheWorkersAndQueueGet503) {
  ServerLimits limits;
  limits.workers = 1;
  limits.max_pending = 1;
  TestServer t(limits);
  std::vector<std::unique_ptr<RawConnection>> c;
  for (int i = 0; i < 3; ++i) {
    c.push_back(std::make_unique<RawConnection>(t.port));
    c.back()->send("GET /slow?ms=400 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    std::this_thread::sleep_for(50ms);
  }
  std::vector<int> statuses;
  for (auto& k : c) statuses.push_back(parse_http(k->read_all(5s)).status);
  EXPECT_EQ(statuses, (std::vector<int>{200, 200, 503}));
}

TEST(HttpServer, AClosedConnectionTellsTheWorkerAtOnce) {
  TestServer t;
  auto c = std::make_unique<RawConnection>(t.port);
  c->send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n");
  std::this_thread::sleep_for(200ms);
  const auto closed = Clock::now();
  c.reset();
  Observed& seen = *t.observed;
  ASSERT_TRUE(seen.wait([&] { return seen.gone == 1; }));
  EXPECT_LT(std::chrono::duration<double>(seen.gone_at - closed).count(), 0.2);
}

TEST(HttpServer, AStreamToAClientThatDoesNotReadWaitsAndStopsWhenItLeaves) {
  TestServer t;
  auto c = std::make_unique<RawConnection>(t.port);
  c->send("GET /stream?n=4000 HTTP/1.1\r\nHost: t\r\n\r\n");  // 250 MB if it were all queued
  c->read_until([](const std::string& r) { return r.find("first") != std::string::npos; }, 5s);
  std::this_thread::sleep_for(1s);
  Observed& seen = *t.observed;
  int64_t writes = 0;
  {
    std::lock_guard lock(seen.mutex);
    writes = seen.stream_writes;
  }
  // What waits is the server's bound plus the kernel's socket buffers, not the whole stream.
  EXPECT_LT(writes * (64 << 10), int64_t{64} << 20);
  c.reset();
  EXPECT_TRUE(seen.wait([&] { return seen.stream_write_failed; }));
}

TEST(HttpServer, StreamsChunkedOrToTheEndOfAnHttp10Connection) {
  TestServer t;
  RawConnection c11(t.port);
  c11.send("GET /stream?n=3 HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  const HttpResponse r11 = parse_http(c11.read_all(5s));
  EXPECT_EQ(r11.header("transfer-encoding"), "chunked");
  EXPECT_EQ(r11.body.size(), 5u + 2 * (64u << 10));
  RawConnection c10(t.port);
  c10.send("GET /stream?n=3 HTTP/1.0\r\n\r\n");
  const std::string raw = c10.read_all(5s);
  EXPECT_EQ(raw.find("Transfer-Encoding"), std::string::npos);
  EXPECT_EQ(parse_http(raw).body.size(), 5u + 2 * (64u << 10));
}

TEST(HttpServer, HandlersThatThrowOrNeverAnswerGet500) {
  TestServer t;
  for (const char* path : {"/throw", "/silent"}) {
    RawConnection c(t.port);
    c.send(fmt::format("GET {} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n", path));
    EXPECT_EQ(parse_http(c.read_all(5s)).status, 500) << path;
  }
  RawConnection head(t.port);
  head.send("HEAD /echo HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
  const std::string raw = head.read_all(5s);
  EXPECT_NE(raw.find("Content-Length: 5"), std::string::npos);  // "HEAD " is what GET would send
  EXPECT_EQ(parse_http(raw).body, "");
}

TEST(HttpServer, StopsPromptlyWhileClientsTrickleAndWorkersWait) {
  auto t = std::make_unique<TestServer>();
  RawConnection trickle(t->port);
  trickle.send("POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\nab");
  RawConnection waiting(t->port);
  waiting.send("GET /wait HTTP/1.1\r\nHost: t\r\n\r\n");
  std::this_thread::sleep_for(200ms);
  const auto start = Clock::now();
  auto observed = t->observed;
  t->server->stop(100ms);
  EXPECT_LT(seconds_since(start), 2.0);
  EXPECT_EQ(observed->gone, 1);  // the waiting worker was told its client is gone
  // The port no longer answers.
  RawConnection late(t->port);
  EXPECT_TRUE(!late.ok() || late.read_all(1s).empty());
}

TEST(HttpServer, APortInUseIsRefusedWhenBound) {
  Listener first("127.0.0.1", 0);
  try {
    Listener second("127.0.0.1", first.port());
    FAIL() << "bound a port in use";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("cannot listen on 127.0.0.1:" + std::to_string(first.port())),
              std::string::npos);
  }
}

}  // namespace
}  // namespace qinfer::http
