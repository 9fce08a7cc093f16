#include "http/http_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>

#include "core/error.h"
#include "core/log.h"

namespace qinfer::http {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Bytes read from one connection per turn of the loop, so one fast sender cannot starve the rest.
constexpr size_t kReadPerTurn = 256u << 10;

std::string head_of(int status, std::string_view content_type, const Headers& headers, bool keep_alive,
                    bool http10, std::string_view framing) {
  std::string out = fmt::format("HTTP/1.1 {} {}\r\n", status, reason_phrase(status));
  if (!content_type.empty()) out += fmt::format("Content-Type: {}\r\n", content_type);
  for (const auto& [name, value] : headers) out += fmt::format("{}: {}\r\n", name, value);
  out += framing;
  if (!keep_alive)
    out += "Connection: close\r\n";
  else if (http10)
    out += "Connection: keep-alive\r\n";
  out += "\r\n";
  return out;
}

}  // namespace

// One client connection. The event thread owns its reading side; the output side is shared with the
// worker answering it, under `mutex`. Only the event thread closes the descriptor, under `mutex`, so
// a worker never writes to a number the kernel has since given to another connection.
class Connection {
 public:
  enum class Phase { idle, reading, answering, closing };

  Connection(Server::Impl* server, int fd, ParserLimits limits) : server(server), fd(fd), parser(limits) {}

  Server::Impl* const server;
  const int fd;

  // Event thread only.
  std::string in;
  RequestParser parser;
  Phase phase = Phase::idle;
  Clock::time_point deadline;
  bool continue_sent = false;
  bool reading_paused = false;

  // Shared, under mutex.
  std::mutex mutex;
  std::condition_variable drained;
  std::string out;
  size_t out_sent = 0;
  bool watching_out = false;
  bool closed = false;         // nothing more is written
  bool broken = false;         // a write failed: the event thread closes it
  bool answer_complete = true;  // false from dispatch until the last byte of the answer is queued
  bool keep_alive = true;       // of the request being answered
  bool http10 = false;
  bool head = false;            // a HEAD request: headers only
  Clock::time_point last_progress;
  std::function<void()> on_gone;

  // Queues bytes and sends what the socket takes now. Caller holds mutex.
  void queue(std::string_view bytes);
  // Sends queued bytes; watches for writability when the socket is full. Caller holds mutex.
  void flush();
  size_t unsent() const { return out.size() - out_sent; }
};

struct Server::Impl {
  ServerLimits limits;
  Handler handler;
  ErrorBody error_body;
  int listen_fd = -1;
  int epoll_fd = -1;
  int wake_fd = -1;
  int reserve_fd = -1;  // closed to accept (and refuse) a connection when descriptors run out
  std::thread loop;
  std::vector<std::thread> workers;
  std::atomic<bool> accepting{true}, stopping{false}, closing_all{false}, quit{false};
  std::atomic<size_t> in_flight{0}, open{0};

  std::unordered_map<int, std::shared_ptr<Connection>> connections;  // event thread only

  std::mutex woken_mutex;
  std::vector<std::shared_ptr<Connection>> woken;

  std::mutex queue_mutex;
  std::condition_variable queue_cv;
  std::deque<std::pair<std::shared_ptr<Connection>, Request>> queue;
  bool workers_quit = false;

  ~Impl() {
    for (int fd : {listen_fd, epoll_fd, wake_fd, reserve_fd})
      if (fd >= 0) ::close(fd);
  }

  void wake(std::shared_ptr<Connection> c) {
    if (c) {
      std::lock_guard lock(woken_mutex);
      woken.push_back(std::move(c));
    }
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd, &one, sizeof one);
  }

  void watch(Connection& c, bool out) {
    epoll_event ev{};
    ev.events = EPOLLRDHUP | (c.reading_paused ? 0u : EPOLLIN) | (out ? EPOLLOUT : 0u);
    ev.data.fd = c.fd;
    epoll_ctl(epoll_fd, EPOLL_CTL_MOD, c.fd, &ev);
  }

  void run_loop();
  void accept_all();
  void on_readable(const std::shared_ptr<Connection>& c);
  void on_writable(const std::shared_ptr<Connection>& c);
  void process(const std::shared_ptr<Connection>& c);
  void answer_done(const std::shared_ptr<Connection>& c);
  void refuse(const std::shared_ptr<Connection>& c, int status, const std::string& message);
  void close(const std::shared_ptr<Connection>& c, bool client_gone);
  void sweep_deadlines();
  void work();
};

void Connection::queue(std::string_view bytes) {
  if (closed || broken) return;
  if (out_sent == out.size()) {
    out.clear();
    out_sent = 0;
  }
  out.append(bytes);
  flush();
}

void Connection::flush() {
  while (!closed && !broken && out_sent < out.size()) {
    const ssize_t n = ::send(fd, out.data() + out_sent, out.size() - out_sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      out_sent += static_cast<size_t>(n);
      last_progress = Clock::now();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!watching_out) {
        watching_out = true;
        server->watch(*this, true);
      }
      return;
    }
    broken = true;  // the peer reset or went away
    server->wake(nullptr);
    return;
  }
  if (out_sent == out.size()) {
    out.clear();
    out_sent = 0;
    if (watching_out) {
      watching_out = false;
      server->watch(*this, false);
    }
    drained.notify_all();
  }
}

Responder::Responder(std::shared_ptr<Connection> connection) : connection_(std::move(connection)) {}

Responder::~Responder() {
  if (!answered_) {
    send(connection_->server->error_body(500, "the request was not answered"));
  } else if (streaming_) {
    end_stream();
  }
}

void Responder::send(Response r) {
  if (answered_) return;
  answered_ = true;
  Connection& c = *connection_;
  std::function<void()> unused;  // the gone-callback holds the worker's state: let it go outside the lock
  {
    std::lock_guard lock(c.mutex);
    if (c.server->stopping) c.keep_alive = false;
    std::string bytes = head_of(r.status, r.content_type, r.headers, c.keep_alive, c.http10,
                                fmt::format("Content-Length: {}\r\n", r.body.size()));
    if (!c.head) bytes += r.body;
    c.answer_complete = true;
    unused = std::move(c.on_gone);
    c.on_gone = nullptr;
    c.queue(bytes);
  }
  c.server->wake(connection_);
}

bool Responder::begin_stream(int status, std::string content_type, Headers headers) {
  if (answered_) return false;
  answered_ = streaming_ = true;
  Connection& c = *connection_;
  std::lock_guard lock(c.mutex);
  // HTTP/1.0 has no chunked coding: the stream's end is the connection's.
  if (c.http10 || c.server->stopping) c.keep_alive = false;
  c.queue(head_of(status, content_type, headers, c.keep_alive, c.http10,
                  c.http10 ? "" : "Transfer-Encoding: chunked\r\n"));
  return !c.closed && !c.broken;
}

bool Responder::write(std::string_view chunk) {
  if (!streaming_) return false;
  Connection& c = *connection_;
  std::unique_lock lock(c.mutex);
  if (c.closed || c.broken) return false;
  if (chunk.empty()) return true;
  if (c.head) return true;
  c.queue(c.http10 ? std::string(chunk) : fmt::format("{:x}\r\n{}\r\n", chunk.size(), chunk));
  // A client that does not read holds at most this much of its stream here.
  const auto limit = c.server->limits.write_timeout;
  while (!c.closed && !c.broken && c.unsent() > c.server->limits.stream_buffer_bytes) {
    if (c.drained.wait_for(lock, 100ms) == std::cv_status::timeout && Clock::now() - c.last_progress > limit) {
      c.broken = true;
      c.server->wake(nullptr);
    }
  }
  return !c.closed && !c.broken;
}

void Responder::end_stream() { finish_stream(true); }

void Responder::abort_stream() { finish_stream(false); }

void Responder::finish_stream(bool whole) {
  if (!streaming_) return;
  streaming_ = false;
  Connection& c = *connection_;
  std::function<void()> unused;
  {
    std::lock_guard lock(c.mutex);
    if (!whole) c.keep_alive = false;
    else if (!c.http10 && !c.head) c.queue("0\r\n\r\n");
    c.answer_complete = true;
    unused = std::move(c.on_gone);
    c.on_gone = nullptr;
  }
  c.server->wake(connection_);
}

bool Responder::client_gone() const {
  std::lock_guard lock(connection_->mutex);
  return connection_->closed || connection_->broken;
}

void Responder::on_client_gone(std::function<void()> callback) {
  Connection& c = *connection_;
  {
    std::lock_guard lock(c.mutex);
    if (!c.closed && !c.broken) {
      c.on_gone = std::move(callback);
      return;
    }
  }
  callback();
}

void Server::Impl::refuse(const std::shared_ptr<Connection>& c, int status, const std::string& message) {
  Response r = error_body(status, message);
  const bool has_retry = std::any_of(r.headers.begin(), r.headers.end(), [](const auto& h) { return h.first == "Retry-After"; });
  if (status == 503 && !has_retry) r.headers.emplace_back("Retry-After", "1");  // overload passes
  {
    std::lock_guard lock(c->mutex);
    c->keep_alive = false;
    c->queue(head_of(r.status, r.content_type, r.headers, false, false,
                     fmt::format("Content-Length: {}\r\n", r.body.size())) +
             r.body);
    if (c->unsent() > 0) {
      c->phase = Connection::Phase::closing;
      c->deadline = Clock::now() + 2s;
      return;
    }
  }
  close(c, false);
}

void Server::Impl::close(const std::shared_ptr<Connection>& c, bool client_gone) {
  std::function<void()> gone;
  {
    std::lock_guard lock(c->mutex);
    if (c->closed) return;
    c->closed = true;
    ::close(c->fd);
    if (client_gone && !c->answer_complete) gone = std::move(c->on_gone);
    c->on_gone = nullptr;
    c->drained.notify_all();
  }
  connections.erase(c->fd);
  --open;
  if (gone) gone();
}

void Server::Impl::accept_all() {
  while (accepting) {
    int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if ((errno == EMFILE || errno == ENFILE) && reserve_fd >= 0) {
        // Out of descriptors: free the reserve to take the connection and tell it so.
        ::close(reserve_fd);
        fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
          const Response r = error_body(503, "the server has no room for another connection; retry after a moment");
          const std::string bytes = head_of(503, r.content_type, {{"Retry-After", "1"}}, false, false,
                                            fmt::format("Content-Length: {}\r\n", r.body.size())) + r.body;
          [[maybe_unused]] const ssize_t n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
          ::close(fd);
        }
        reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
        continue;
      }
      return;  // EAGAIN, or an error the next readiness retries
    }
    const int yes = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);  // SSE chunks are small: send each at once
    auto c = std::make_shared<Connection>(this, fd, limits.parser);
    c->deadline = Clock::now() + limits.idle_timeout;
    c->last_progress = Clock::now();
    connections[fd] = c;
    ++open;
    if (open > limits.max_connections || stopping) {
      refuse(c, 503, stopping ? "the server is shutting down"
                              : "the server has no room for another connection; retry after a moment");
      continue;
    }
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.fd = fd;
    epoll_ctl(epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  }
}

void Server::Impl::on_readable(const std::shared_ptr<Connection>& c) {
  char buffer[64 << 10];
  size_t total = 0;
  while (total < kReadPerTurn) {
    const ssize_t n = ::recv(c->fd, buffer, sizeof buffer, 0);
    if (n > 0) {
      total += static_cast<size_t>(n);
      if (c->phase == Connection::Phase::closing) continue;  // drained and dropped
      c->in.append(buffer, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    return close(c, true);  // end of stream or reset: the client is gone
  }
  if (c->phase == Connection::Phase::answering) {
    // Pipelined bytes wait for the answer in progress; past a bound, stop reading them.
    if (c->in.size() > limits.parser.max_header_bytes + (64u << 10) && !c->reading_paused) {
      c->reading_paused = true;
      std::lock_guard lock(c->mutex);
      watch(*c, c->watching_out);
    }
    return;
  }
  process(c);
}

void Server::Impl::process(const std::shared_ptr<Connection>& c) {
  while ((c->phase == Connection::Phase::idle || c->phase == Connection::Phase::reading) && !c->in.empty()) {
    const RequestParser::State before = c->parser.state();
    const size_t used = c->parser.feed(c->in);
    c->in.erase(0, used);
    const RequestParser::State state = c->parser.state();
    if (state == RequestParser::State::start) continue;  // blank lines only
    if (c->phase == Connection::Phase::idle) {
      c->phase = Connection::Phase::reading;
      c->deadline = Clock::now() + limits.header_timeout;
    }
    if (state == RequestParser::State::error) return refuse(c, c->parser.error_status(), c->parser.error_message());
    if (state == RequestParser::State::body && before != RequestParser::State::body) {
      c->deadline = Clock::now() + limits.body_timeout;
      if (c->parser.wants_continue() && !c->continue_sent) {
        c->continue_sent = true;
        std::lock_guard lock(c->mutex);
        c->queue("HTTP/1.1 100 Continue\r\n\r\n");
      }
    }
    if (state != RequestParser::State::complete) return;
    Request request = c->parser.take();
    c->continue_sent = false;
    if (stopping) return refuse(c, 503, "the server is shutting down");
    {
      std::lock_guard lock(c->mutex);
      c->answer_complete = false;
      c->keep_alive = request.keep_alive;
      c->http10 = request.minor_version == 0;
      c->head = request.method == "HEAD";
      c->on_gone = nullptr;
    }
    c->phase = Connection::Phase::answering;
    {
      std::lock_guard lock(queue_mutex);
      if (queue.size() >= limits.max_pending) {
        std::lock_guard conn_lock(c->mutex);
        c->answer_complete = true;
      } else {
        ++in_flight;
        queue.emplace_back(c, std::move(request));
        queue_cv.notify_one();
        return;
      }
    }
    return refuse(c, 503, "the server is busy; retry after a moment");
  }
}

void Server::Impl::answer_done(const std::shared_ptr<Connection>& c) {
  bool keep_alive = false, drained = false;
  {
    std::lock_guard lock(c->mutex);
    if (c->closed) return;
    if (c->broken) {
      // handled below, outside the lock
    } else if (!c->answer_complete || c->phase != Connection::Phase::answering) {
      return;  // an earlier wake, or already past
    }
    keep_alive = c->keep_alive && !stopping && !c->broken;
    drained = c->unsent() == 0;
  }
  if (!keep_alive) {
    if (drained) return close(c, false);
    c->phase = Connection::Phase::closing;
    c->deadline = Clock::now() + limits.write_timeout;
    return;
  }
  c->phase = Connection::Phase::idle;
  c->deadline = Clock::now() + limits.idle_timeout;
  if (c->reading_paused) {
    c->reading_paused = false;
    std::lock_guard lock(c->mutex);
    watch(*c, c->watching_out);
  }
  process(c);  // a pipelined request may be waiting
}

void Server::Impl::on_writable(const std::shared_ptr<Connection>& c) {
  bool done_closing = false;
  {
    std::lock_guard lock(c->mutex);
    c->flush();
    done_closing = c->phase == Connection::Phase::closing && c->unsent() == 0;
  }
  if (done_closing) close(c, false);
}

void Server::Impl::sweep_deadlines() {
  const auto now = Clock::now();
  std::vector<std::pair<std::shared_ptr<Connection>, int>> expired;  // 0: close, 408: answer then close
  for (auto& [fd, c] : connections) {
    bool broken = false, stalled = false;
    {
      std::lock_guard lock(c->mutex);
      broken = c->broken;
      stalled = c->unsent() > 0 && now - c->last_progress > limits.write_timeout;
    }
    if (broken || stalled) {
      expired.emplace_back(c, -1);
    } else if (c->phase == Connection::Phase::idle && (now > c->deadline || closing_all)) {
      expired.emplace_back(c, 0);
    } else if (c->phase == Connection::Phase::reading && (now > c->deadline || closing_all)) {
      expired.emplace_back(c, 408);
    } else if (c->phase == Connection::Phase::closing && (now > c->deadline || closing_all)) {
      expired.emplace_back(c, 0);
    } else if (c->phase == Connection::Phase::answering && closing_all) {
      expired.emplace_back(c, -1);
    }
  }
  for (auto& [c, what] : expired) {
    if (what == 408 && !closing_all) {
      refuse(c, 408, "the request did not arrive in time");
      // refuse() leaves it closing when the answer could not be sent at once; do not wait for it.
      if (c->phase == Connection::Phase::closing) c->deadline = now + 1s;
    } else {
      close(c, what == -1);
    }
  }
}

void Server::Impl::run_loop() {
  std::vector<epoll_event> events(256);
  auto last_sweep = Clock::now();
  while (!quit) {
    const int n = epoll_wait(epoll_fd, events.data(), static_cast<int>(events.size()), 100);
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      const uint32_t what = events[i].events;
      if (fd == listen_fd) {
        accept_all();
        continue;
      }
      if (fd == wake_fd) {
        uint64_t count;
        [[maybe_unused]] const ssize_t r = ::read(wake_fd, &count, sizeof count);
        std::vector<std::shared_ptr<Connection>> ready;
        {
          std::lock_guard lock(woken_mutex);
          ready.swap(woken);
        }
        for (const auto& c : ready) answer_done(c);
        if (!accepting && listen_fd >= 0) {
          epoll_ctl(epoll_fd, EPOLL_CTL_DEL, listen_fd, nullptr);
          ::close(listen_fd);
          listen_fd = -1;
        }
        continue;
      }
      auto it = connections.find(fd);
      if (it == connections.end()) continue;
      const std::shared_ptr<Connection> c = it->second;
      if (what & EPOLLOUT) on_writable(c);
      if (c->closed) continue;
      if (what & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        on_readable(c);
      } else if ((what & EPOLLRDHUP) && c->reading_paused) {
        close(c, true);  // nothing more can be read, and the client has stopped sending
      }
    }
    const auto now = Clock::now();
    if (now - last_sweep >= 100ms || closing_all) {
      last_sweep = now;
      sweep_deadlines();
    }
  }
  std::vector<std::shared_ptr<Connection>> all;
  for (auto& [fd, c] : connections) all.push_back(c);
  for (const auto& c : all) close(c, true);
}

void Server::Impl::work() {
  while (true) {
    std::pair<std::shared_ptr<Connection>, Request> job;
    {
      std::unique_lock lock(queue_mutex);
      queue_cv.wait(lock, [&] { return workers_quit || !queue.empty(); });
      if (queue.empty()) return;
      job = std::move(queue.front());
      queue.pop_front();
    }
    {
      Responder responder(job.first);
      try {
        handler(job.second, responder);
      } catch (const std::exception& e) {
        log_error("{} {}: {}", job.second.method, job.second.path, e.what());
        if (!responder.answered()) responder.send(error_body(500, fmt::format("internal error: {}", e.what())));
      }
    }
    --in_flight;
  }
}

Server::Server(ServerLimits limits, Handler handler, ErrorBody error_body) : impl_(std::make_unique<Impl>()) {
  impl_->limits = limits;
  impl_->handler = std::move(handler);
  impl_->error_body = std::move(error_body);
}

Server::~Server() { stop(); }

Listener::Listener(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    fail("cannot listen on {}:{}: {}", host, port, gai_strerror(rc));
  std::string last_error = "no address";
  for (addrinfo* a = found; a; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    // SO_REUSEADDR only: SO_REUSEPORT would let a second server share the port silently.
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (::bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(found);
  QINFER_CHECK(fd_ >= 0, "cannot listen on {}:{}: {} (is the address valid and the port free?)", host, port,
               last_error);
  sockaddr_storage addr{};
  socklen_t len = sizeof addr;
  getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
}

Listener::~Listener() {
  if (fd_ >= 0) ::close(fd_);
}

Listener::Listener(Listener&& other) noexcept : fd_(std::exchange(other.fd_, -1)), port_(other.port_) {}

Listener& Listener::operator=(Listener&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    port_ = other.port_;
  }
  return *this;
}

int Listener::release() { return std::exchange(fd_, -1); }

void Server::start(Listener listener) {
  Impl& s = *impl_;
  QINFER_CHECK(s.listen_fd < 0, "http: start() called twice");
  s.listen_fd = listener.release();
  QINFER_CHECK(s.listen_fd >= 0, "http: start() with a listener already used");
  // Every connection is a descriptor: raise the soft limit toward what the connection cap needs.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0) {
    const rlim_t want = static_cast<rlim_t>(s.limits.max_connections + s.limits.workers + 256);
    if (nofile.rlim_cur < want) {
      nofile.rlim_cur = nofile.rlim_max == RLIM_INFINITY ? want : std::min(want, nofile.rlim_max);
      setrlimit(RLIMIT_NOFILE, &nofile);
    }
  }
  s.epoll_fd = epoll_create1(EPOLL_CLOEXEC);
  s.wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  s.reserve_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  QINFER_CHECK(s.epoll_fd >= 0 && s.wake_fd >= 0, "http: cannot create the event loop: {}", std::strerror(errno));
  for (int fd : {s.listen_fd, s.wake_fd}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(s.epoll_fd, EPOLL_CTL_ADD, fd, &ev);
  }
  try {
    for (int i = 0; i < std::max(1, s.limits.workers); ++i) s.workers.emplace_back([&s] { s.work(); });
    s.loop = std::thread([&s] { s.run_loop(); });
  } catch (const std::system_error& e) {
    {
      std::lock_guard lock(s.queue_mutex);
      s.workers_quit = true;
    }
    s.queue_cv.notify_all();
    for (std::thread& t : s.workers) t.join();
    s.workers.clear();
    fail("http: cannot start {} worker threads: {}", s.limits.workers, e.what());
  }
}

void Server::stop_accepting() {
  Impl& s = *impl_;
  s.accepting = false;
  s.stopping = true;
  if (s.loop.joinable()) s.wake(nullptr);
}

void Server::stop(std::chrono::milliseconds grace) {
  Impl& s = *impl_;
  stop_accepting();
  const auto deadline = Clock::now() + grace;
  while (s.in_flight > 0 && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
  s.closing_all = true;
  s.quit = true;
  if (s.loop.joinable()) {
    s.wake(nullptr);
    s.loop.join();
  }
  {
    std::lock_guard lock(s.queue_mutex);
    s.workers_quit = true;
  }
  s.queue_cv.notify_all();
  for (std::thread& t : s.workers)
    if (t.joinable()) t.join();
  s.workers.clear();
}

size_t Server::connections() const { return impl_->open; }

}  // namespace qinfer::http
