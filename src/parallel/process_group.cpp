#include "parallel/process_group.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "core/error.h"

namespace qinfer::parallel {

namespace {

constexpr char kMagic[8] = {'q', 'i', 'n', 'f', 't', 'p', '0', '1'};

constexpr uint64_t kFailed = ~uint64_t{0};  // all_reduce_sum's answer when lengths differ

struct Hello {  // what a connecting process says first
  char magic[8];
  int32_t index, count;
};

std::pair<std::string, std::string> split_address(const std::string& address) {
  const size_t colon = address.rfind(':');
  QINFER_CHECK(colon != std::string::npos && colon > 0 && colon + 1 < address.size(),
               "--tp-address {}: expected HOST:PORT", address);
  std::string host = address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);  // [::1]
  return {host, address.substr(colon + 1)};
}

struct AddressList {
  addrinfo* list = nullptr;
  ~AddressList() {
    if (list) freeaddrinfo(list);
  }
};

void resolve(const std::string& address, bool passive, AddressList& out) {
  const auto [host, port] = split_address(address);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  const int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &out.list);
  QINFER_CHECK(rc == 0, "--tp-address {}: cannot resolve it: {}", address, gai_strerror(rc));
}

void tune(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);  // collectives are small and latency-bound
}

}  // namespace

std::unique_ptr<ProcessGroup> ProcessGroup::listen(const std::string& address, int count) {
  QINFER_CHECK(count >= 1, "tensor parallel: a process group needs at least one process, got {}", count);
  std::unique_ptr<ProcessGroup> g(new ProcessGroup(0, count));
  AddressList addresses;
  resolve(address, true, addresses);
  std::string last_error = "no address";
  for (addrinfo* a = addresses.list; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 && ::listen(fd, count) == 0) {
      sockaddr_storage bound{};
      socklen_t length = sizeof bound;
      getsockname(fd, reinterpret_cast<sockaddr*>(&bound), &length);
      g->port_ = ntohs(bound.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                                                   : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
      g->listener_ = fd;
      return g;
    }
    last_error = std::strerror(errno);
    close(fd);
  }
  fail("--tp-address {}: process 0 cannot listen there: {}", address, last_error);
}

void ProcessGroup::accept_all(std::chrono::milliseconds timeout) {
  QINFER_CHECK(index_ == 0 && listener_ >= 0, "tensor parallel: only process 0 accepts the others");
  sockets_.assign(static_cast<size_t>(count_ - 1), -1);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  int joined = 0;
  while (joined < count_ - 1) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      std::vector<int> missing;
      for (int p = 1; p < count_; ++p)
        if (sockets_[static_cast<size_t>(p - 1)] < 0) missing.push_back(p);
      fail("tensor parallel: process{} {} did not join within {} s", missing.size() > 1 ? "es" : "",
           fmt::join(missing, ", "), timeout.count() / 1000);
    }
    pollfd waiting{listener_, POLLIN, 0};
    if (poll(&waiting, 1, static_cast<int>(std::min<int64_t>(left.count(), 1000))) <= 0) continue;
    const int fd = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    tune(fd);
    Hello hello{};
    try {
      receive(fd, &hello, sizeof hello);
    } catch (const Error&) {
      close(fd);  // not one of ours (a port scan, a process that died): keep waiting
      continue;
    }
    std::string refusal;
    if (std::memcmp(hello.magic, kMagic, sizeof kMagic) != 0) refusal = "it is not a qinfer process of this version";
    else if (hello.count != count_)
      refusal = fmt::format("it was started with --tp-processes {}, process 0 with {}", hello.count, count_);
    else if (hello.index < 1 || hello.index >= count_)
      refusal = fmt::format("--tp-process {} is outside 1..{}", hello.index, count_ - 1);
    else if (sockets_[static_cast<size_t>(hello.index - 1)] >= 0)
      refusal = fmt::format("--tp-process {} joined twice", hello.index);
    const uint32_t length = static_cast<uint32_t>(refusal.size());
    try {
      send(fd, &length, sizeof length);
      if (length) send(fd, refusal.data(), length);
    } catch (const Error&) {
    }
    if (!refusal.empty()) {
      close(fd);
      fail("tensor parallel: a process was refused: {}", refusal);
    }
    sockets_[static_cast<size_t>(hello.index - 1)] = fd;
    ++joined;
  }
  close(listener_);
  listener_ = -1;
}

std::unique_ptr<ProcessGroup> ProcessGroup::join(const std::string& address, int index, int count,
                                                 std::chrono::milliseconds timeout) {
  QINFER_CHECK(count >= 1 && index >= 0 && index < count, "--tp-process {}: expected 0..{} (--tp-processes {})",
               index, count - 1, count);
  if (index == 0) {
    std::unique_ptr<ProcessGroup> g = listen(address, count);
    g->accept_all(timeout);
    return g;
  }
  std::unique_ptr<ProcessGroup> g(new ProcessGroup(index, count));
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last_error;
  // Process 0 may start later (another host, a slower load): keep trying until the deadline.
  while (true) {
    AddressList addresses;
    resolve(address, false, addresses);
    for (addrinfo* a = addresses.list; a != nullptr && g->sockets_.empty(); a = a->ai_next) {
      const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
      if (fd < 0) continue;
      if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) {
        tune(fd);
        g->sockets_.push_back(fd);
      } else {
        last_error = std::strerror(errno);
        close(fd);
      }
    }
    if (!g->sockets_.empty()) break;
    QINFER_CHECK(std::chrono::steady_clock::now() < deadline,
                 "tensor parallel: process {} could not reach process 0 at {} within {} s: {}", index, address,
                 timeout.count() / 1000, last_error);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  Hello hello{};
  std::memcpy(hello.magic, kMagic, sizeof kMagic);
  hello.index = index;
  hello.count = count;
  g->send(g->sockets_[0], &hello, sizeof hello);
  uint32_t length = 0;
  g->receive(g->sockets_[0], &length, sizeof length);
  if (length > 0) {
    std::string refusal(std::min<uint32_t>(length, 4096), '\0');
    g->receive(g->sockets_[0], refusal.data(), refusal.size());
    fail("tensor parallel: process 0 at {} refused process {}: {}", address, index, refusal);
  }
  return g;
}

ProcessGroup::~ProcessGroup() {
  for (int fd : sockets_)
    if (fd >= 0) close(fd);
  if (listener_ >= 0) close(listener_);
}

int ProcessGroup::departed(std::chrono::milliseconds timeout) const {
  std::vector<pollfd> fds;
  for (int fd : sockets_) fds.push_back(pollfd{fd, POLLRDHUP, 0});
  if (fds.empty()) {
    std::this_thread::sleep_for(timeout);
    return -1;
  }
  if (poll(fds.data(), fds.size(), static_cast<int>(timeout.count())) <= 0) return -1;
  for (size_t i = 0; i < fds.size(); ++i)
    if (fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) return index_ == 0 ? static_cast<int>(i) + 1 : 0;
  return -1;
}

int ProcessGroup::peer(int p) const { return index_ == 0 ? sockets_.at(static_cast<size_t>(p - 1)) : sockets_.at(0); }

void ProcessGroup::send(int fd, const void* data, size_t bytes) const {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    QINFER_CHECK(n > 0, "tensor parallel process {}: a peer process stopped (it failed, or the connection broke: {})",
                 index_, n < 0 ? std::strerror(errno) : "closed");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void ProcessGroup::receive(int fd, void* data, size_t bytes) const {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::recv(fd, p, bytes, 0);
    if (n < 0 && errno == EINTR) continue;
    QINFER_CHECK(n > 0, "tensor parallel process {}: a peer process stopped (it failed, or the connection broke: {})",
                 index_, n < 0 ? std::strerror(errno) : "closed");
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

std::vector<char> ProcessGroup::broadcast(const std::vector<char>& bytes) {
  if (index_ == 0) {
    const uint64_t length = bytes.size();
    for (int p = 1; p < count_; ++p) {
      send(peer(p), &length, sizeof length);
      send(peer(p), bytes.data(), bytes.size());
    }
    return bytes;
  }
  uint64_t length = 0;
  receive(peer(0), &length, sizeof length);
  std::vector<char> out(length);
  receive(peer(0), out.data(), out.size());
  return out;
}

std::vector<int64_t> ProcessGroup::all_gather(int64_t value) {
  std::vector<int64_t> all(static_cast<size_t>(count_));
  if (index_ == 0) {
    all[0] = value;
    for (int p = 1; p < count_; ++p) receive(peer(p), &all[static_cast<size_t>(p)], sizeof(int64_t));
    for (int p = 1; p < count_; ++p) send(peer(p), all.data(), all.size() * sizeof(int64_t));
  } else {
    send(peer(0), &value, sizeof value);
    receive(peer(0), all.data(), all.size() * sizeof(int64_t));
  }
  return all;
}

std::vector<std::vector<char>> ProcessGroup::gather(const std::vector<char>& bytes) {
  if (index_ != 0) {
    const uint64_t length = bytes.size();
    send(peer(0), &length, sizeof length);
    send(peer(0), bytes.data(), bytes.size());
    return {};
  }
  std::vector<std::vector<char>> all(static_cast<size_t>(count_));
  all[0] = bytes;
  for (int p = 1; p < count_; ++p) {
    uint64_t length = 0;
    receive(peer(p), &length, sizeof length);
    QINFER_CHECK(length <= (uint64_t{1} << 36), "tensor parallel: process {} announced {} bytes", p, length);
    all[static_cast<size_t>(p)].resize(length);
    receive(peer(p), all[static_cast<size_t>(p)].data(), length);
  }
  return all;
}

void ProcessGroup::all_reduce_sum(std::span<float> values) {
  const uint64_t n = values.size();
  if (index_ != 0) {
    send(peer(0), &n, sizeof n);
    send(peer(0), values.data(), n * sizeof(float));
    uint64_t answer = 0;  // n when the sum follows; kFailed when the processes' lengths differ
    receive(peer(0), &answer, sizeof answer);
    QINFER_CHECK(answer == n, "tensor parallel process {}: all_reduce_sum of {} values failed: the processes' lengths "
                 "differ", index_, n);
    receive(peer(0), values.data(), n * sizeof(float));
    return;
  }
  // Every contribution is read before any answer, so a mismatch leaves no stream half read.
  std::vector<std::vector<float>> parts(static_cast<size_t>(count_));
  int mismatched = 0;
  for (int p = 1; p < count_; ++p) {
    uint64_t length = 0;
    receive(peer(p), &length, sizeof length);
    QINFER_CHECK(length <= (uint64_t{1} << 34), "tensor parallel: process {} announced {} values", p, length);
    parts[static_cast<size_t>(p)].resize(length);
    receive(peer(p), parts[static_cast<size_t>(p)].data(), length * sizeof(float));
    if (length != n && mismatched == 0) mismatched = p;
  }
  const uint64_t answer = mismatched == 0 ? n : kFailed;
  for (int p = 1; p < count_; ++p) send(peer(p), &answer, sizeof answer);
  QINFER_CHECK(mismatched == 0, "tensor parallel: all_reduce_sum of {} values on process 0, {} on process {}", n,
               parts[static_cast<size_t>(mismatched)].size(), mismatched);
  for (int p = 1; p < count_; ++p) {
    const std::vector<float>& part = parts[static_cast<size_t>(p)];
    for (uint64_t i = 0; i < n; ++i) values[i] += part[i];
  }
  for (int p = 1; p < count_; ++p) send(peer(p), values.data(), n * sizeof(float));
}

void ProcessCommunicator::all_reduce_sum(Ops& ops, Tensor& t) {
  (void)ops;
  QINFER_CHECK(t.dtype == DType::f32 && t.device == Device::cpu,
               "all_reduce_sum: process {} gave a {} tensor in device memory; host ranks sum f32 host tensors",
               group_.index(), name(t.dtype));
  group_.all_reduce_sum(std::span<float>(t.ptr<float>(), static_cast<size_t>(t.numel())));
}

}  // namespace qinfer::parallel
