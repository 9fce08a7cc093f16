#pragma once
// A strict, incremental HTTP/1.1 request parser (RFC 9112). It refuses what makes framing ambiguous
// (a Content-Length given twice, Content-Length with Transfer-Encoding, obsolete line folding,
// bare LF or CR, control bytes in a header) instead of guessing, since a server and a proxy in front
// of it that guess differently disagree about where one request ends. Every size it keeps is bounded.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qinfer::http {

struct Header {
  std::string name;  // lowercase
  std::string value;
};

struct Request {
  std::string method;
  std::string target;  // as sent
  std::string path;    // percent-decoded, without the query
  std::string query;   // after '?', as sent
  int minor_version = 1;
  std::vector<Header> headers;
  std::string body;  // chunked bodies decoded
  bool keep_alive = true;

  // The first header of that (lowercase) name, or null.
  const std::string* header(std::string_view name) const;
  std::string header_or(std::string_view name, std::string_view fallback = "") const;
};

struct ParserLimits {
  size_t max_header_bytes = 64u << 10;  // the request line, headers and a chunked body's trailers
  size_t max_headers = 100;
  size_t max_body_bytes = 16u << 20;    // after chunked decoding
};

class RequestParser {
 public:
  enum class State { start, headers, body, complete, error };

  explicit RequestParser(ParserLimits limits = {});

  // Consumes bytes of `data` and returns how many; stops after a complete request, so bytes of a
  // pipelined next request stay with the caller. Nothing is consumed in the complete and error states.
  size_t feed(std::string_view data);

  State state() const { return state_; }
  // The request's headers were read and it waits for a body ("Expect: 100-continue" is answered then).
  bool wants_continue() const { return state_ == State::body && expect_continue_; }
  // The complete request; the parser starts over for the next one on the connection.
  Request take();

  // The error: an HTTP status (400, 413, 417, 431, 501, 505) and what was wrong.
  int error_status() const { return error_status_; }
  const std::string& error_message() const { return error_message_; }

 private:
  enum class Body { none, length, chunk_size, chunk_data, chunk_data_end, trailers };

  size_t feed_headers(std::string_view data);
  size_t feed_body(std::string_view data);
  bool parse_head();  // the request line and headers in head_; false on error (set)
  bool framing();     // Content-Length / Transfer-Encoding / Host / Connection / Expect
  bool chunk_size_line(std::string_view line);
  bool fail(int status, std::string message);

  ParserLimits limits_;
  State state_ = State::start;
  Request request_;
  std::string head_;       // header bytes until the blank line
  size_t scanned_ = 0;     // head_ before this holds no "\r\n\r\n"
  Body body_ = Body::none;
  uint64_t remaining_ = 0;  // of the Content-Length or the current chunk
  std::string line_;        // a chunk-size or trailer line being read
  size_t trailer_bytes_ = 0;
  bool expect_continue_ = false;
  int error_status_ = 0;
  std::string error_message_;
};

// HTTP's reason phrase for a status ("OK", "Not Found", ...).
std::string_view reason_phrase(int status);

}  // namespace qinfer::http
