#pragma once
// A test's HTTP client over a raw socket: it sends exactly the bytes a test writes (malformed ones
// included) and reads what comes back, so the server's framing is what is tested.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace qinfer::testing {

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;                            // de-chunked
  nlohmann::json body_json() const { return nlohmann::json::parse(body, nullptr, false); }
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

}  // namespace qinfer::testing
