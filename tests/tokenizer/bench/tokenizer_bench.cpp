// Encode throughput on one thread: the parity strings joined by "\n" and repeated to 10 MiB, encoded as
// one text (tools/tokenizer_reference.mjs --bench measures HF's JS tokenizer on the same text).
//   tokenizer_bench [--model DIR] [--strings FILE]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "io/json.h"
#include "tokenizer/tokenizer.h"

#ifndef QINFER_SOURCE_DIR  // the repository root, for the default paths
#define QINFER_SOURCE_DIR "."
#endif

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int run(int argc, char** argv) {
  std::string model = QINFER_SOURCE_DIR "/.deps/qwen3-tokenizer";
  std::string strings_path = QINFER_SOURCE_DIR "/tests/tokenizer/data/strings.jsonl";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--model")) model = argv[i + 1];
    else if (!std::strcmp(argv[i], "--strings")) strings_path = argv[i + 1];
    else qinfer::fail("usage: tokenizer_bench [--model DIR] [--strings FILE]");
  }
  auto start = Clock::now();
  const auto tok = qinfer::tokenizer::Tokenizer::load(model);
  const double load_s = seconds_since(start);

  std::ifstream in(strings_path, std::ios::binary);
  QINFER_CHECK(in.good(), "{}: cannot open file", strings_path);
  std::string unit;
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) unit += qinfer::io::json::parse(line).get<std::string>() + "\n";
  // The JS side joins with "\n" and appends one: the same bytes.
  const size_t copies = (10u * 1024 * 1024 + unit.size() - 1) / unit.size();
  std::string text;
  text.reserve(unit.size() * copies);
  for (size_t i = 0; i < copies; ++i) text += unit;

  tok.encode(unit);  // warm-up
  std::vector<double> times;
  size_t tokens = 0;
  for (int run = 0; run < 3; ++run) {
    start = Clock::now();
    tokens = tok.encode(text).size();
    times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  const double mb = static_cast<double>(text.size()) / 1e6;
  fmt::print("qinfer tokenizer (load {:.2f} s): {:.1f} MB -> {} tokens in {:.3f} s (median of 3): {:.2f} MB/s\n",
             load_s, mb, tokens, times[1], mb / times[1]);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    fmt::print(stderr, "tokenizer_bench: {}\n", e.what());
    return 1;
  }
}
