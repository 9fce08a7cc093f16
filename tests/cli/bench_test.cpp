// `qinfer bench`: the JSON it prints for the GPU bench script, the released shapes it can make, and
// the byte counts behind its GB/s.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "io/config.h"
#include "io/json.h"
#include "models/registry.h"
#include "models/random_checkpoint.h"
#include "support/run_command.h"

namespace qinfer::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

const fs::path kFixture = fs::path(QINFER_TEST_DATA) / "golden" / "qwen3_moe";

TEST(Bench, JsonReportsEveryPrefillAndBatch) {
  CommandResult r = run_command(std::string(QINFER_BINARY) + " bench --model '" + kFixture.string() +
                                "' --batch 1,3 --prompt 5,9 --gen 4 --context 6 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const io::json out = io::json::parse(r.out);
  EXPECT_EQ(out["family"], "qwen3_moe");
  EXPECT_GT(out["copy_probe_gbs"].get<double>(), 0.0);
  ASSERT_EQ(out["prefill"].size(), 2u);
  EXPECT_EQ(out["prefill"][1]["tokens"], 9);
  EXPECT_GT(out["prefill"][1]["tok_s"].get<double>(), 0.0);
  ASSERT_EQ(out["decode"].size(), 2u);
  const io::json& one = out["decode"][0];
  const io::json& three = out["decode"][1];
  EXPECT_EQ(three["batch"], 3);
  // A bigger batch reads more (more experts, KV and embedding rows) but less than three times as much.
  EXPECT_GT(three["bytes_per_step"].get<double>(), one["bytes_per_step"].get<double>());
  EXPECT_LT(three["bytes_per_step"].get<double>(), 3 * one["bytes_per_step"].get<double>());
  EXPECT_NEAR(one["gbs"].get<double>() / out["copy_probe_gbs"].get<double>(), one["fraction_of_probe"].get<double>(),
              1e-9);
  EXPECT_NEAR(three["tok_s"].get<double>(), 3e3 / three["ms_per_step"].get<double>(), 1e-6);
}

// --temp / --top-k / --top-p: the decode steps are sampled, and the JSON says how.
TEST(Bench, DecodeSamplesWithTheGivenSettings) {
  CommandResult r = run_command(std::string(QINFER_BINARY) + " bench --model '" + kFixture.string() +
                                "' --batch 2 --prompt 5 --gen 3 --context 6 --temp 0.7 --top-k 20 --top-p 0.8 --json");
  ASSERT_EQ(r.status, 0) << r.err;
  const io::json out = io::json::parse(r.out);
  EXPECT_FLOAT_EQ(out["decode_sampling"]["temperature"].get<float>(), 0.7f);
  EXPECT_EQ(out["decode_sampling"]["top_k"], 20);
  EXPECT_FLOAT_EQ(out["decode_sampling"]["top_p"].get<float>(), 0.8f);
  ASSERT_EQ(out["decode"].size(), 1u);
  EXPECT_GT(out["decode"][0]["tok_s"].get<double>(), 0.0);
}

TEST(Bench, BadArgumentsAreNamed) {
  CommandResult r = run_command(std::string(QINFER_BINARY) + " bench --model '" + kFixture.string() + "' --batch 0");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--batch 0"));
  r = run_command(std::string(QINFER_BINARY) + " bench --shape qwen9-1t --print-config");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("unknown model shape 'qwen9-1t'"));
}

// Every released shape parses as its family's config, with the parameter count of its name.
TEST(Bench, ReleasedShapesParseWithTheirParameterCounts) {
  const std::vector<std::pair<std::string, double>> shapes = {
      {"qwen3-0.6b", 0.6},  {"qwen3-8b", 8.2},      {"qwen3-32b", 32.8},        {"qwen3-30b-a3b", 30.5},
      {"qwen3_5-0.8b", 0.75}, {"qwen3_5-9b", 9.0}, {"qwen3_5-27b", 26.9}, {"qwen3_5-35b-a3b", 34.7},
  };
  for (const auto& [name, billions] : shapes) {
    const io::json config = models::released_shape(name);
    const io::ModelConfig parsed = io::parse_config(config, name);
    const models::Family& family = models::family_for(parsed);
    double params = 0;
    for (const io::ExpectedTensor& e : family.rules.expected(parsed.text, false)) {
      double n = 1;
      for (int64_t d : e.shape) n *= static_cast<double>(d);
      params += n;
    }
    EXPECT_NEAR(params / 1e9, billions, 0.06 * billions) << name;
  }
}

}  // namespace
}  // namespace qinfer::testing
