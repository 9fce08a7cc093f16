#pragma once
// A transformers reference in the golden layout (tests/fixtures/golden/README.md: reference.json +
// logits_k.bin; models/demo/reference uses it too) and the logits comparison every golden test uses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "io/json.h"

namespace qinfer::golden {

// The fixtures: $QINFER_TEST_DATA when set (a build carried to the GPU machine, where the source
// tree sits elsewhere), else the source tree this binary was built from.
inline std::filesystem::path test_data() {
  const char* env = std::getenv("QINFER_TEST_DATA");
  return env && *env ? std::filesystem::path(env) : std::filesystem::path(QINFER_TEST_DATA);
}

inline const std::filesystem::path kGolden = test_data() / "golden";

inline const std::vector<std::string> kFixtures = {
    "qwen3",          "qwen3_moe",        "qwen3_next",       "qwen3_5",          "qwen3_5_moe",      "qwen3_5_mlx",
    "qwen3_5_moe_mlx_4bit", "qwen3_mlx_8bit", "qwen3_5_mlx_6bit", "qwen3_5_mlx_3bit", "qwen3_5_mlx_mxfp4",
    "qwen3_yarn"};

struct Reference {
  io::json doc;  // reference.json itself, for fields only some references carry
  std::vector<std::vector<int32_t>> prompts, greedy;
  std::vector<std::vector<float>> logits;  // [L, V] per prompt
  int64_t vocab = 0;
};

inline Reference load_reference(const std::filesystem::path& dir) {
  Reference r;
  r.doc = io::read_json_file(dir / "reference.json");
  const io::json& j = r.doc;
  r.prompts = j["prompts"].get<std::vector<std::vector<int32_t>>>();
  r.greedy = j["greedy"].get<std::vector<std::vector<int32_t>>>();
  for (size_t k = 0; k < r.prompts.size(); ++k) {
    const auto shape = j["shape"][k].get<std::vector<int64_t>>();
    EXPECT_EQ(shape[0], static_cast<int64_t>(r.prompts[k].size())) << dir << " prompt " << k;
    r.vocab = shape[1];
    std::vector<float> values(static_cast<size_t>(shape[0] * shape[1]));
    std::ifstream in(dir / j["logits"][k].get<std::string>(), std::ios::binary);
    in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(float)));
    EXPECT_TRUE(in.good()) << dir / j["logits"][k].get<std::string>();
    r.logits.push_back(std::move(values));
  }
  return r;
}

struct Comparison {
  double relative_rms = 0;
  int argmax_mismatches = 0;  // at positions with a clear (>= 1e-2) reference margin
};

inline Comparison compare(const float* got, const std::vector<float>& want, int64_t vocab) {
  Comparison c;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (got[i] - want[i]) * double(got[i] - want[i]);
    norm += want[i] * double(want[i]);
  }
  c.relative_rms = std::sqrt(diff / norm);
  for (size_t row = 0; row < want.size() / vocab; ++row) {
    const float* w = want.data() + row * vocab;
    const float* g = got + row * vocab;
    std::vector<float> sorted(w, w + vocab);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<>());
    if (sorted[0] - sorted[1] < 1e-2f) continue;
    c.argmax_mismatches += (std::max_element(w, w + vocab) - w) != (std::max_element(g, g + vocab) - g);
  }
  return c;
}

}  // namespace qinfer::golden
