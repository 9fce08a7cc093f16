#include "http/request_parser.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

namespace qinfer::http {
namespace {

// RFC 9110 token characters (method and header names).
bool is_tchar(unsigned char c) {
  if (std::isalnum(c)) return true;
  return std::string_view("!#$%&'*+-.^_`|~").find(static_cast<char>(c)) != std::string_view::npos;
}

bool is_token(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return is_tchar(static_cast<unsigned char>(c)); });
}

// A field value's bytes: visible ASCII, space, tab and obs-text; never NUL, CR, LF or another control.
bool is_field_value(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return c == '\t' || (c >= 0x20 && c != 0x7F);
  });
}

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(), [](unsigned char c) { return std::tolower(c); });
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

// The comma-separated elements of a list header, trimmed; empty elements dropped (RFC 9110 5.6.1).
std::vector<std::string> list_elements(std::string_view value) {
  std::vector<std::string> out;
  while (true) {
    const size_t comma = value.find(',');
    const std::string_view item = trim(value.substr(0, comma));
    if (!item.empty()) out.push_back(lower(item));
    if (comma == std::string_view::npos) break;
    value.remove_prefix(comma + 1);
  }
  return out;
}

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A chunk-size line may carry extensions; this bounds the line, not just its digits.
constexpr size_t kMaxChunkLine = 4096;

}  // namespace

const std::string* Request::header(std::string_view name) const {
  for (const Header& h : headers)
    if (h.name == name) return &h.value;
  return nullptr;
}

std::string Request::header_or(std::string_view name, std::string_view fallback) const {
  const std::string* v = header(name);
  return v ? *v : std::string(fallback);
}

RequestParser::RequestParser(ParserLimits limits) : limits_(limits) {}

bool RequestParser::fail(int status, std::string message) {
  state_ = State::error;
  error_status_ = status;
  error_message_ = std::move(message);
  return false;
}

size_t RequestParser::feed(std::string_view data) {
  size_t used = 0;
  while (used < data.size() && (state_ == State::start || state_ == State::headers || state_ == State::body)) {
    if (state_ == State::start) {
      // A client may send a blank line before a request (RFC 9112 2.2).
      if (data[used] == '\r' || data[used] == '\n') {
        ++used;
        continue;
      }
      state_ = State::headers;
    }
    used += state_ == State::headers ? feed_headers(data.substr(used)) : feed_body(data.substr(used));
  }
  return used;
}

size_t RequestParser::feed_headers(std::string_view data) {
  const size_t before = head_.size();
  const size_t room = limits_.max_header_bytes + 4 - std::min(limits_.max_header_bytes + 4, before);
  head_.append(data.substr(0, room));
  const size_t end = head_.find("\r\n\r\n", scanned_);
  if (end == std::string::npos) {
    if (head_.size() > limits_.max_header_bytes)
      return fail(431, fmt::format("the request's headers are larger than {} bytes", limits_.max_header_bytes)), 0;
    scanned_ = head_.size() < 3 ? 0 : head_.size() - 3;
    return head_.size() - before;
  }
  if (end + 2 > limits_.max_header_bytes)
    return fail(431, fmt::format("the request's headers are larger than {} bytes", limits_.max_header_bytes)), 0;
  const size_t used = end + 4 - before;
  head_.resize(end + 2);  // each line keeps its CRLF
  if (!parse_head() || !framing()) return used;
  head_.clear();
  head_.shrink_to_fit();
  scanned_ = 0;
  state_ = body_ == Body::none ? State::complete : State::body;
  return used;
}

bool RequestParser::parse_head() {
  std::string_view rest = head_;
  bool first = true;
  while (!rest.empty()) {
    const size_t eol = rest.find("\r\n");
    std::string_view line = rest.substr(0, eol);
    rest.remove_prefix(eol + 2);
    if (line.find_first_of("\r\n") != std::string_view::npos)
      return fail(400, "a line of the request ends in a bare CR or LF (lines end in CRLF)");
    if (first) {
      first = false;
      const size_t sp1 = line.find(' ');
      const size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
      if (sp2 == std::string_view::npos || line.find(' ', sp2 + 1) != std::string_view::npos)
        return fail(400, "malformed request line (expected \"METHOD /path HTTP/1.1\")");
      const std::string_view method = line.substr(0, sp1), target = line.substr(sp1 + 1, sp2 - sp1 - 1),
                             version = line.substr(sp2 + 1);
      if (!is_token(method)) return fail(400, "malformed request method");
      if (version == "HTTP/1.1") {
        request_.minor_version = 1;
      } else if (version == "HTTP/1.0") {
        request_.minor_version = 0;
      } else if (version.starts_with("HTTP/") && version.size() == 8 && std::isdigit(static_cast<unsigned char>(version[5])) &&
                 version[6] == '.' && std::isdigit(static_cast<unsigned char>(version[7]))) {
        return fail(505, fmt::format("{} is not served here (HTTP/1.1 is)", version));
      } else {
        return fail(400, "malformed HTTP version in the request line");
      }
      if (target.empty() || !std::all_of(target.begin(), target.end(), [](char c) {
            return static_cast<unsigned char>(c) > 0x20 && static_cast<unsigned char>(c) < 0x7F;
          }))
        return fail(400, "malformed request target");
      if (target[0] != '/' && !(target == "*" && method == "OPTIONS"))
        return fail(400, "the request target must be a path starting with \"/\"");
      request_.method = std::string(method);
      request_.target = std::string(target);
      const std::string_view raw_path = target.substr(0, target.find('?'));
      if (raw_path.size() < target.size()) request_.query = std::string(target.substr(raw_path.size() + 1));
      for (size_t i = 0; i < raw_path.size(); ++i) {
        if (raw_path[i] != '%') {
          request_.path += raw_path[i];
          continue;
        }
        const int hi = i + 2 < raw_path.size() ? hex_value(raw_path[i + 1]) : -1;
        const int lo = hi < 0 ? -1 : hex_value(raw_path[i + 2]);
        if (lo < 0 || (hi == 0 && lo == 0)) return fail(400, "malformed percent-encoding in the request path");
        request_.path += static_cast<char>(hi * 16 + lo);
        i += 2;
      }
      continue;
    }
    if (line.empty()) break;
    if (line[0] == ' ' || line[0] == '\t') return fail(400, "obsolete line folding in a header is not accepted");
    const size_t colon = line.find(':');
    if (colon == std::string_view::npos) return fail(400, "a header line has no colon");
    const std::string_view name = line.substr(0, colon);
    if (!is_token(name)) return fail(400, fmt::format("malformed header name \"{}\"", name.substr(0, 64)));
    const std::string_view value = trim(line.substr(colon + 1));
    if (!is_field_value(value))
      return fail(400, fmt::format("header \"{}\" holds a control character", name.substr(0, 64)));
    if (request_.headers.size() == limits_.max_headers)
      return fail(431, fmt::format("the request has more than {} headers", limits_.max_headers));
    request_.headers.push_back({lower(name), std::string(value)});
  }
  return true;
}

bool RequestParser::framing() {
  std::vector<std::string> codings;
  int lengths = 0, hosts = 0;
  std::string length;
  for (const Header& h : request_.headers) {
    if (h.name == "transfer-encoding") {
      for (std::string& c : list_elements(h.value)) codings.push_back(std::move(c));
    } else if (h.name == "content-length") {
      ++lengths;
      length = h.value;
    } else if (h.name == "host") {
      ++hosts;
    }
  }
  if (request_.minor_version == 1 && hosts != 1)
    return fail(400, hosts == 0 ? "an HTTP/1.1 request needs a Host header" : "the request has more than one Host header");
  if (lengths > 1) return fail(400, "the request has more than one Content-Length header");
  if (!codings.empty()) {
    if (request_.minor_version == 0) return fail(400, "Transfer-Encoding is not defined for HTTP/1.0");
    if (lengths > 0) return fail(400, "the request has both Content-Length and Transfer-Encoding");
    if (codings.size() != 1 || codings[0] != "chunked")
      return fail(501, "only \"Transfer-Encoding: chunked\" is accepted on requests");
    body_ = Body::chunk_size;
  } else if (lengths == 1) {
    if (length.empty() || length.size() > 18 ||
        !std::all_of(length.begin(), length.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return fail(400, "malformed Content-Length");
    remaining_ = std::stoull(length);
    if (remaining_ > limits_.max_body_bytes)
      return fail(413, fmt::format("the request body is larger than this server accepts ({} bytes)", limits_.max_body_bytes));
    body_ = remaining_ == 0 ? Body::none : Body::length;
    if (remaining_ > 0) request_.body.reserve(remaining_);
  }
  bool close = false, keep_alive = false;
  for (const Header& h : request_.headers)
    if (h.name == "connection")
      for (const std::string& option : list_elements(h.value)) {
        close = close || option == "close";
        keep_alive = keep_alive || option == "keep-alive";
      }
  request_.keep_alive = request_.minor_version == 1 ? !close : keep_alive && !close;
  if (const std::string* expect = request_.header("expect")) {
    if (lower(*expect) != "100-continue") return fail(417, fmt::format("Expect \"{}\" is not supported", expect->substr(0, 64)));
    expect_continue_ = request_.minor_version == 1;
  }
  return true;
}

bool RequestParser::chunk_size_line(std::string_view line) {
  const std::string_view size = trim(line.substr(0, line.find(';')));
  if (size.empty() || size.size() > 15 || !std::all_of(size.begin(), size.end(), [](char c) { return hex_value(c) >= 0; }))
    return fail(400, "malformed chunk size in a chunked body");
  uint64_t n = 0;
  for (const char c : size) n = n * 16 + static_cast<uint64_t>(hex_value(c));
  if (n > limits_.max_body_bytes - std::min(limits_.max_body_bytes, request_.body.size()))
    return fail(413, fmt::format("the request body is larger than this server accepts ({} bytes)", limits_.max_body_bytes));
  remaining_ = n;
  body_ = n == 0 ? Body::trailers : Body::chunk_data;
  return true;
}

size_t RequestParser::feed_body(std::string_view data) {
  size_t used = 0;
  while (used < data.size() && state_ == State::body) {
    switch (body_) {
      case Body::length:
      case Body::chunk_data: {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, data.size() - used));
        request_.body.append(data.substr(used, n));
        used += n;
        remaining_ -= n;
        if (remaining_ == 0) {
          if (body_ == Body::length)
            state_ = State::complete;
          else
            body_ = Body::chunk_data_end;
        }
        break;
      }
      case Body::chunk_data_end:
        line_ += data[used++];
        if (line_.size() == 2) {
          if (line_ != "\r\n") return fail(400, "a chunk of a chunked body is not followed by CRLF"), used;
          line_.clear();
          body_ = Body::chunk_size;
        }
        break;
      case Body::chunk_size:
      case Body::trailers: {
        const size_t lf = data.find('\n', used);
        const size_t take = (lf == std::string_view::npos ? data.size() : lf + 1) - used;
        line_.append(data.substr(used, take));
        used += take;
        const size_t bound = body_ == Body::chunk_size ? kMaxChunkLine : limits_.max_header_bytes - std::min(limits_.max_header_bytes, trailer_bytes_);
        if (line_.size() > bound)
          return fail(body_ == Body::chunk_size ? 400 : 431,
                      body_ == Body::chunk_size ? "a chunk-size line of a chunked body is too long"
                                                : "the chunked body's trailers are too large"),
                 used;
        if (lf == std::string_view::npos) break;
        if (line_.size() < 2 || line_[line_.size() - 2] != '\r')
          return fail(400, "a line of the chunked body ends in a bare LF"), used;
        const std::string_view line = std::string_view(line_).substr(0, line_.size() - 2);
        if (line.find('\r') != std::string_view::npos) return fail(400, "a line of the chunked body holds a bare CR"), used;
        if (body_ == Body::chunk_size) {
          if (!chunk_size_line(line)) return used;
        } else if (line.empty()) {
          state_ = State::complete;
        } else {
          // Trailer fields are read for framing and dropped: nothing here gives them a meaning.
          const size_t colon = line.find(':');
          if (colon == std::string_view::npos || !is_token(line.substr(0, colon)) ||
              !is_field_value(line.substr(colon + 1)))
            return fail(400, "malformed trailer field in a chunked body"), used;
          trailer_bytes_ += line_.size();
        }
        line_.clear();
        break;
      }
      case Body::none:
        state_ = State::complete;
        break;
    }
  }
  return used;
}

Request RequestParser::take() {
  Request out = std::move(request_);
  *this = RequestParser(limits_);
  return out;
}

std::string_view reason_phrase(int status) {
  switch (status) {
    case 100: return "Continue";
    case 200: return "OK";
    case 204: return "No Content";
    case 206: return "Partial Content";
    case 302: return "Found";
    case 307: return "Temporary Redirect";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 416: return "Range Not Satisfiable";
    case 417: return "Expectation Failed";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return status < 300 ? "OK" : status < 500 ? "Bad Request" : "Internal Server Error";
  }
}

}  // namespace qinfer::http
