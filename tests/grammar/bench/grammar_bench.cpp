// Token-mask time per generated token (a benchmark, not a test): the largest schemas of the test
// corpus, or one given, on a tokenizer's whole vocabulary. Sequences are random walks through the
// masks (each step a random allowed token, as a random model samples), so every mask is one a
// generation meets. Prints the median and p99 per token, for the first walk (tables being filled) and
// the rest (tables filled, each walk with its own memo), and the time to accept each sampled token.
// --tools: a tools array (as a request sends it) constraining Hermes tool calls, with tool_choice
// auto (text or calls) and required.
//
//   grammar_bench [--tokenizer DIR] [--schema FILE | --tools FILE] [--walks N] [--tokens N]
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "grammar/constraint.h"
#include "tokenizer/tokenizer.h"

namespace {

using namespace qinfer;
using Clock = std::chrono::steady_clock;

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_dir = std::string(QINFER_SOURCE_DIR) + "/.deps/qwen3-tokenizer", schema_file, tools_file;
  int walks = 8, max_tokens = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--tokenizer")) tokenizer_dir = argv[i + 1];
    else if (!std::strcmp(argv[i], "--schema")) schema_file = argv[i + 1];
    else if (!std::strcmp(argv[i], "--tools")) tools_file = argv[i + 1];
    else if (!std::strcmp(argv[i], "--walks")) walks = std::stoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--tokens")) max_tokens = std::stoi(argv[i + 1]);
    else {
      fmt::print(stderr, "usage: grammar_bench [--tokenizer DIR] [--schema FILE | --tools FILE] [--walks N] [--tokens N]\n");
      return 2;
    }
  }
  try {
    const tokenizer::Tokenizer tok = tokenizer::Tokenizer::load(tokenizer_dir);
    const int32_t stop = tok.token_to_id("<|im_end|>").value_or(0);
    std::vector<std::pair<std::string, grammar::ConstraintSpec>> specs;
    auto schema_spec = [](const nlohmann::ordered_json& schema) {
      grammar::ConstraintSpec spec;
      spec.kind = grammar::ConstraintSpec::Kind::json_schema;
      spec.schema = schema;
      return spec;
    };
    std::vector<std::pair<std::string, nlohmann::ordered_json>> schemas;
    if (!tools_file.empty()) {
      std::ifstream in(tools_file);
      const nlohmann::ordered_json tools = nlohmann::ordered_json::parse(in);
      for (const bool required : {false, true}) {
        grammar::ConstraintSpec spec;
        spec.kind = grammar::ConstraintSpec::Kind::tool_calls;
        spec.tool_calls.required = required;
        for (size_t i = 0; i < tools.size(); ++i) {
          const auto& f = tools[i]["function"];
          spec.tool_calls.tools.push_back({f["name"].get<std::string>(), f.value("parameters", nlohmann::ordered_json()),
                                           f.value("strict", false), fmt::format("tools[{}]", i)});
        }
        specs.emplace_back(fmt::format("{} tool_choice {}", tools_file, required ? "required" : "auto"), spec);
      }
    } else if (!schema_file.empty()) {
      std::ifstream in(schema_file);
      schemas.emplace_back(schema_file, nlohmann::ordered_json::parse(in));
    } else {
      // The corpus's three largest schemas (by their JSON text).
      std::ifstream in(std::string(QINFER_SOURCE_DIR) + "/tests/fixtures/grammar/schemas.json");
      for (const auto& entry : nlohmann::ordered_json::parse(in)) schemas.emplace_back(entry["name"], entry["schema"]);
      std::sort(schemas.begin(), schemas.end(),
                [](const auto& a, const auto& b) { return a.second.dump().size() > b.second.dump().size(); });
      schemas.resize(std::min<size_t>(3, schemas.size()));
    }
    for (const auto& [name, schema] : schemas) specs.emplace_back(name, schema_spec(schema));
    const auto t0 = Clock::now();
    auto trie = grammar::TokenTrie::from_tokenizer(tok);
    fmt::print("vocabulary trie of {} tokens: {:.1f} ms\n", tok.vocab_size(),
               std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    for (const auto& [name, spec] : specs) {
      const auto c0 = Clock::now();
      grammar::ConstraintCache cache(trie, 1);
      auto masks = cache.get(spec, grammar::Reasoning::none, {stop});
      const double compile_ms = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
      std::vector<double> cold, warm, accept;
      std::mt19937 rng(1);
      int64_t tokens = 0;
      for (int w = 0; w < walks; ++w) {
        grammar::TokenConstraint c(masks);
        for (int t = 0; t < max_tokens && !c.finished() && !c.must_stop(); ++t) {
          const auto s = Clock::now();
          const grammar::TokenBits& mask = c.mask();
          (w == 0 ? cold : warm).push_back(std::chrono::duration<double, std::micro>(Clock::now() - s).count());
          std::vector<int32_t> allowed;
          for (int32_t id = 0; id < trie->vocab_size(); ++id)
            if (grammar::test_bit(mask, id)) allowed.push_back(id);
          if (allowed.empty()) break;
          // Half the time the stop token where it is allowed, so that walks end as generations do.
          const bool stop_ok = grammar::test_bit(mask, stop);
          const int32_t id = stop_ok && rng() % 2 ? stop : allowed[rng() % allowed.size()];
          const auto a = Clock::now();
          c.accept(id);
          accept.push_back(std::chrono::duration<double, std::micro>(Clock::now() - a).count());
          ++tokens;
        }
      }
      fmt::print("{}: compile {:.1f} ms; {} tokens over {} walks; mask per token: first walk median {:.1f} us, p99 "
                 "{:.1f} us, max {:.0f} us; later walks median {:.1f} us, p99 {:.1f} us, max {:.0f} us; accept median {:.1f} "
                 "us, p99 {:.1f} us\n",
                 name, compile_ms, tokens, walks, percentile(cold, 0.5), percentile(cold, 0.99), percentile(cold, 1.0),
                 percentile(warm, 0.5), percentile(warm, 0.99), percentile(warm, 1.0), percentile(accept, 0.5),
                 percentile(accept, 0.99));
    }
  } catch (const std::exception& e) {
    fmt::print(stderr, "grammar_bench: {}\n", e.what());
    return 1;
  }
  return 0;
}
