// libFuzzer target over what a client sends: bytes through the HTTP request parser (in two pieces
// split where the first byte says, so incremental parsing is exercised), and each complete
// request's body through the API's JSON checks, the request parser and the chat template. The
// expected failures are qinfer::Error (ApiError, jinja::Error); any other exception, a crash or a
// sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "http/request_parser.h"
#include "server/api_error.h"
#include "server/request.h"
#include "tokenizer/chat_template.h"

namespace {

const qinfer::tokenizer::ChatTemplate& chat_template() {
  static const qinfer::tokenizer::ChatTemplate t = [] {
    std::ifstream in(QINFER_FUZZ_TEMPLATE);
    std::stringstream s;
    s << in.rdbuf();
    return qinfer::tokenizer::ChatTemplate(s.str(), "qwen3.jinja");
  }();
  return t;
}

void use_body(const std::string& body) {
  using namespace qinfer;
  try {
    const server::json parsed = server::parse_body(body);
    if (parsed.contains("messages")) {
      const server::ChatRequest r = server::parse_chat_request(parsed, {});
      chat_template().render(r.template_request);
    } else {
      server::parse_completion_request(parsed, {});
    }
  } catch (const server::ApiError&) {
  } catch (const qinfer::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const size_t split = 1 + data[0] % size;
  const std::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  qinfer::http::ParserLimits limits;
  limits.max_header_bytes = 4096;
  limits.max_body_bytes = 1 << 16;
  qinfer::http::RequestParser parser(limits);
  // The bytes as two reads of a socket: the first `split - 1` bytes, then the rest.
  std::string_view pieces[2] = {input.substr(0, std::min(input.size(), split - 1)),
                                input.substr(std::min(input.size(), split - 1))};
  for (std::string_view piece : pieces) {
    while (!piece.empty()) {
      piece.remove_prefix(parser.feed(piece));
      if (parser.state() == qinfer::http::RequestParser::State::error) {
        const int status = parser.error_status();
        if (status != 400 && status != 413 && status != 417 && status != 431 && status != 501 && status != 505)
          __builtin_trap();
        return 0;
      }
      if (parser.state() != qinfer::http::RequestParser::State::complete) break;
      const qinfer::http::Request request = parser.take();
      if (request.body.size() > limits.max_body_bytes || request.path.find('\0') != std::string::npos) __builtin_trap();
      use_body(request.body);
    }
  }
  return 0;
}
