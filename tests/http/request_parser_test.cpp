#include "http/request_parser.h"

#include <gtest/gtest.h>

#include <string>

namespace qinfer::http {
namespace {

using namespace std::string_literals;

struct Parsed {
  RequestParser::State state;
  int status = 0;
  std::string message;
  Request request;
  size_t used = 0;
};

// Feeds `bytes` whole, or one byte at a time (a client that sends slowly must parse the same).
Parsed parse(const std::string& bytes, bool bytewise = false, ParserLimits limits = {}) {
  RequestParser p(limits);
  Parsed out;
  if (bytewise) {
    for (size_t i = 0; i < bytes.size() && out.used == i; ++i) out.used += p.feed(std::string_view(bytes).substr(i, 1));
  } else {
    out.used = p.feed(bytes);
  }
  out.state = p.state();
  out.status = p.error_status();
  out.message = p.error_message();
  if (out.state == RequestParser::State::complete) out.request = p.take();
  return out;
}

void expect_refused(const std::string& bytes, int status, const std::string& says) {
  for (const bool bytewise : {false, true}) {
    const Parsed r = parse(bytes, bytewise);
    EXPECT_EQ(r.state, RequestParser::State::error) << bytes;
    EXPECT_EQ(r.status, status) << bytes;
    EXPECT_NE(r.message.find(says), std::string::npos) << r.message;
  }
}

TEST(RequestParser, ReadsARequestWholeOrByteByByte) {
  const std::string raw =
      "POST /v1/chat%2Fx?a=1 HTTP/1.1\r\nHost: h\r\nContent-Type: application/json\r\nX-Pad:  v a l \t\r\n"
      "Content-Length: 5\r\n\r\nhello";
  for (const bool bytewise : {false, true}) {
    const Parsed r = parse(raw, bytewise);
    ASSERT_EQ(r.state, RequestParser::State::complete) << r.message;
    EXPECT_EQ(r.used, raw.size());
    EXPECT_EQ(r.request.method, "POST");
    EXPECT_EQ(r.request.target, "/v1/chat%2Fx?a=1");
    EXPECT_EQ(r.request.path, "/v1/chat/x");
    EXPECT_EQ(r.request.query, "a=1");
    EXPECT_EQ(r.request.body, "hello");
    EXPECT_EQ(r.request.header_or("content-type"), "application/json");
    EXPECT_EQ(r.request.header_or("x-pad"), "v a l");  // surrounding whitespace is not the value's
    EXPECT_TRUE(r.request.keep_alive);
  }
}

TEST(RequestParser, DecodesChunkedBodiesWithExtensionsAndTrailers) {
  const std::string raw =
      "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
      "5;name=value\r\nhello\r\n1A\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nX-Trailer: t\r\n\r\n";
  for (const bool bytewise : {false, true}) {
    const Parsed r = parse(raw, bytewise);
    ASSERT_EQ(r.state, RequestParser::State::complete) << r.message;
    EXPECT_EQ(r.used, raw.size());
    EXPECT_EQ(r.request.body, "helloabcdefghijklmnopqrstuvwxyz");
  }
}

TEST(RequestParser, StopsAtTheEndOfARequestSoPipelinedOnesWait) {
  const std::string first = "GET /a HTTP/1.1\r\nHost: h\r\n\r\n";
  const std::string second = "GET /b HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n";
  const std::string both = first + second;
  RequestParser p;
  const size_t used = p.feed(both);
  EXPECT_EQ(used, first.size());
  ASSERT_EQ(p.state(), RequestParser::State::complete);
  EXPECT_EQ(p.take().path, "/a");
  EXPECT_EQ(p.feed(std::string_view(both).substr(used)), second.size());
  ASSERT_EQ(p.state(), RequestParser::State::complete);
  const Request b = p.take();
  EXPECT_EQ(b.path, "/b");
  EXPECT_FALSE(b.keep_alive);
}

TEST(RequestParser, KeepAliveFollowsTheVersionAndConnectionHeader) {
  EXPECT_FALSE(parse("GET / HTTP/1.0\r\n\r\n").request.keep_alive);
  EXPECT_TRUE(parse("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").request.keep_alive);
  EXPECT_FALSE(parse("GET / HTTP/1.1\r\nHost: h\r\nConnection: upgrade, close\r\n\r\n").request.keep_alive);
  EXPECT_EQ(parse("GET / HTTP/1.0\r\n\r\n").request.minor_version, 0);
  // Blank lines before a request line are skipped (RFC 9112 2.2).
  EXPECT_EQ(parse("\r\n\r\nGET /x HTTP/1.1\r\nHost: h\r\n\r\n").request.path, "/x");
}

TEST(RequestParser, RefusesAmbiguousFraming) {
  expect_refused("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", 400,
                 "more than one Content-Length");
  expect_refused("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", 400,
                 "both Content-Length and Transfer-Encoding");
  expect_refused("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: +3\r\n\r\nabc", 400, "malformed Content-Length");
  expect_refused("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3, 3\r\n\r\nabc", 400, "malformed Content-Length");
  expect_refused("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501, "only");
  expect_refused("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                 501, "only");
  expect_refused("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", 400, "HTTP/1.0");
  expect_refused("GET / HTTP/1.1\r\n\r\n", 400, "needs a Host header");
  expect_refused("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400, "more than one Host");
}

TEST(RequestParser, RefusesMalformedLines) {
  expect_refused("GET / HTTP/1.1\nHost: h\r\n\r\n", 400, "bare CR or LF");
  expect_refused("GET / HTTP/1.1\r\nHost: h\rX: y\r\n\r\n", 400, "bare CR or LF");
  expect_refused("GET / HTTP/1.1\r\nHost: h\r\nX-A: a\r\n folded\r\n\r\n", 400, "line folding");
  expect_refused("GET / HTTP/1.1\r\nHost: h\r\nno colon here\r\n\r\n", 400, "no colon");
  expect_refused("GET / HTTP/1.1\r\nHost: h\r\nBad Name: x\r\n\r\n", 400, "malformed header name");
  expect_refused("GET / HTTP/1.1\r\nHost: h\r\nX: a\0b\r\n\r\n"s, 400, "control character");
  expect_refused("GET / HTTP/1.1\r\nHost: h\r\nX: a\x01" "b\r\n\r\n", 400, "control character");
  expect_refused("GET  / HTTP/1.1\r\nHost: h\r\n\r\n", 400, "malformed request line");
  expect_refused("GET / HTTP/1.1 \r\nHost: h\r\n\r\n", 400, "malformed request line");
  expect_refused("G(T / HTTP/1.1\r\nHost: h\r\n\r\n", 400, "method");
  expect_refused("GET / HTTP/2.0\r\nHost: h\r\n\r\n", 505, "HTTP/2.0");
  expect_refused("GET / HTTPS/1.1\r\nHost: h\r\n\r\n", 400, "HTTP version");
  expect_refused("GET http://a/ HTTP/1.1\r\nHost: h\r\n\r\n", 400, "starting with");
  expect_refused("GET /a%zz HTTP/1.1\r\nHost: h\r\n\r\n", 400, "percent-encoding");
  expect_refused("GET /a%00 HTTP/1.1\r\nHost: h\r\n\r\n", 400, "percent-encoding");
  expect_refused("GET / HTTP/1.1\r\nHost: h\r\nExpect: 200-ok\r\n\r\n", 417, "Expect");
}

TEST(RequestParser, RefusesMalformedChunks) {
  const std::string head = "POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n";
  expect_refused(head + "zz\r\n", 400, "malformed chunk size");
  expect_refused(head + "3\r\nabcX\r\n", 400, "not followed by CRLF");
  expect_refused(head + "3\nabc\r\n", 400, "bare LF");
  expect_refused(head + "1000000000000000\r\n", 400, "malformed chunk size");
  expect_refused(head + "1;" + std::string(5000, 'e') + "\r\n", 400, "too long");
  expect_refused(head + "0\r\nbad trailer\r\n\r\n", 400, "trailer");
}

TEST(RequestParser, BoundsHeadersAndBodies) {
  ParserLimits small;
  small.max_header_bytes = 256;
  small.max_headers = 4;
  small.max_body_bytes = 10;
  auto refused = [&](const std::string& bytes, int status) {
    for (const bool bytewise : {false, true}) {
      const Parsed r = parse(bytes, bytewise, small);
      EXPECT_EQ(r.state, RequestParser::State::error) << bytes.substr(0, 80);
      EXPECT_EQ(r.status, status) << r.message;
    }
  };
  refused("GET / HTTP/1.1\r\nHost: h\r\nX: " + std::string(300, 'a') + "\r\n\r\n", 431);
  refused("GET / HTTP/1.1\r\nHost: h\r\nX: " + std::string(300, 'a'), 431);  // never finished
  refused("GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 2\r\nC: 3\r\nD: 4\r\n\r\n", 431);
  // A body over the limit is refused from its length, before any of it is read.
  refused("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\n", 413);
  refused("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999\r\n\r\n", 413);
  // Chunked: refused at the chunk that crosses it.
  refused("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n6\r\nabcdef\r\n5\r\n", 413);
  refused("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffff\r\n", 413);
  refused("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: " + std::string(300, 't'), 431);
  const Parsed at_limit = parse("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n0123456789", false, small);
  EXPECT_EQ(at_limit.state, RequestParser::State::complete);
}

TEST(RequestParser, AnswersExpectContinueOnceHeadersAreRead) {
  RequestParser p;
  p.feed("POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n");
  EXPECT_TRUE(p.wants_continue());
  p.feed("ok");
  EXPECT_EQ(p.state(), RequestParser::State::complete);
  EXPECT_EQ(p.take().body, "ok");
}

}  // namespace
}  // namespace qinfer::http
