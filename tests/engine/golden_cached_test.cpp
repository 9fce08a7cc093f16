// Every family and quantized fixture against HF transformers' logits through the prefix cache
// (`qinfer eval --mode cached:N`): an earlier request of the prompt's first N ids leaves its blocks
// (and, for models with recurrent state, its checkpoints) in the cache, and the prompt then starts
// from them. N on a block boundary, inside a block and N = length - 1; the tolerances of the other
// modes (relative RMS of logits <= 1e-2, argmax identical where the reference top-2 margin >= 1e-2).
#include <gtest/gtest.h>

#include <fmt/format.h>

#include "core/thread_pool.h"
#include "engine/cached_logits.h"
#include "support/golden_reference.h"

namespace qinfer::engine {
namespace {

struct Case {
  std::string fixture, device;
};

class GoldenCached : public ::testing::TestWithParam<Case> {};

TEST_P(GoldenCached, LogitsWithAPrefixFromTheCache) {
  const std::filesystem::path dir = golden::kGolden / GetParam().fixture;
  models::Checkpoint checkpoint = models::open_checkpoint(dir);
  std::unique_ptr<Ops> ops = GetParam().device == "ref" ? make_ref_ops() : make_cpu_ops(global_thread_pool());
  models::Model model(checkpoint, *ops);
  const golden::Reference ref = golden::load_reference(dir);
  constexpr int64_t kBlock = 16;
  for (size_t k = 1; k < ref.prompts.size(); ++k) {
    const auto L = static_cast<int64_t>(ref.prompts[k].size());
    ASSERT_GT(L, kBlock + 4) << "prompt " << k << " is too short for a block boundary and a tail";
    for (const int64_t n : {kBlock, kBlock + 3, L - 1}) {
      const CachedLogits r = cached_prompt_logits(model, ref.prompts[k], n, kBlock);
      EXPECT_EQ(r.cached, n / kBlock * kBlock) << "cached:" << n << " prompt " << k << ": the whole blocks of N";
      const golden::Comparison c = golden::compare(r.logits.ptr<float>(), ref.logits[k], ref.vocab);
      EXPECT_LE(c.relative_rms, 1e-2) << "cached:" << n << " prompt " << k;
      EXPECT_EQ(c.argmax_mismatches, 0) << "cached:" << n << " prompt " << k;
      if (k == 2) RecordProperty(fmt::format("rel_rms_cached_{}", n), fmt::format("{:.3g}", c.relative_rms));
    }
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (const std::string& f : golden::kFixtures)
    for (const char* d : {"cpu", "ref"}) out.push_back({f, d});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenCached, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.fixture + "_" + info.param.device; });

}  // namespace
}  // namespace qinfer::engine
