#pragma once
// An event-driven HTTP/1.1 server: one thread reads and writes every connection through epoll, so an
// idle or slow connection costs a file descriptor and a bounded buffer, never a thread. A request is
// handed to a worker pool only once it has fully arrived; the worker answers through a Responder,
// whole or streamed (chunked, for Server-Sent Events). Requests pipelined on one connection are
// answered in order. A connection that closes while its request is being answered tells the worker
// (Responder::client_gone, on_client_gone), so the work can stop.
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "http/request_parser.h"

namespace qinfer::http {

struct ServerLimits {
  ParserLimits parser;
  size_t max_connections = 4096;  // beyond: 503 and close
  int workers = 64;               // requests answered at once
  size_t max_pending = 1024;      // arrived requests waiting for a worker; beyond: 503
  std::chrono::milliseconds header_timeout{10'000};  // from a request's first byte to its blank line
  std::chrono::milliseconds body_timeout{60'000};    // from the blank line to the body's last byte
  std::chrono::milliseconds idle_timeout{30'000};    // a kept-alive connection with nothing sent
  std::chrono::milliseconds write_timeout{60'000};   // a response the client does not read
  size_t stream_buffer_bytes = 1u << 20;             // unsent bytes a stream may queue before it waits
};

using Headers = std::vector<std::pair<std::string, std::string>>;

struct Response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  Headers headers;  // extra ones (Retry-After, CORS, ...)
};

class Connection;

// How a worker answers one request. Thread-safe; whatever is sent after the client left is dropped.
class Responder {
 public:
  explicit Responder(std::shared_ptr<Connection> connection);
  ~Responder();  // a request left unanswered gets a 500
  Responder(const Responder&) = delete;
  Responder& operator=(const Responder&) = delete;

  void send(Response response);
  // A streamed answer: headers now, then chunks. write() waits while the client is behind by more
  // than ServerLimits::stream_buffer_bytes; false once the client is gone.
  bool begin_stream(int status, std::string content_type, Headers headers = {});
  bool write(std::string_view chunk);
  void end_stream();
  // Ends a streamed answer without its last chunk and closes the connection once what was written has
  // gone out, as a server that dies mid-response would (for clients' retry paths and their tests).
  void abort_stream();

  bool client_gone() const;
  // Called once, on the server's thread, if the client goes away before the answer is complete
  // (at once when it already has). Keep it short: it runs where every connection is served.
  void on_client_gone(std::function<void()> callback);

  bool answered() const { return answered_; }

 private:
  // end_stream (`whole`: the last chunk goes out) and abort_stream (the connection closes instead).
  void finish_stream(bool whole);

  std::shared_ptr<Connection> connection_;
  bool answered_ = false;
  bool streaming_ = false;
};

using Handler = std::function<void(Request&, Responder&)>;
// The body of an error the server answers by itself (malformed HTTP, limits, overload).
using ErrorBody = std::function<Response(int status, const std::string& message)>;

// A bound, listening socket. Made before anything slow (loading a model), so that a port in use is
// found at once; connections that arrive meanwhile wait in the kernel's backlog.
class Listener {
 public:
  // Port 0: any free port. Throws Error when the address cannot be bound.
  Listener(const std::string& host, int port);
  ~Listener();
  Listener(Listener&& other) noexcept;
  Listener& operator=(Listener&& other) noexcept;
  int port() const { return port_; }
  int release();  // the descriptor, now the caller's

 private:
  int fd_ = -1;
  int port_ = 0;
};

class Server {
 public:
  Server(ServerLimits limits, Handler handler, ErrorBody error_body);
  ~Server();  // stop()s
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves on the listener: starts the event thread and the workers. Throws Error when a thread
  // cannot be made.
  void start(Listener listener);
  // Stops accepting, waits up to `grace` for the answers in progress, then closes every connection
  // and joins the threads. Safe to call more than once.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(0));
  // Stops accepting new connections (the first step of stop()).
  void stop_accepting();
  size_t connections() const;

 private:
  friend class Connection;
  friend class Responder;
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace qinfer::http
