// `qinfer inspect` as a user runs it: the binary, its output and its exit status.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "../support/run_command.h"
#include "../support/safetensors_writer.h"
#include "io/json.h"

namespace qinfer::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

const fs::path kGolden = fs::path(QINFER_TEST_DATA) / "golden";
const fs::path kCorpus = fs::path(QINFER_TEST_DATA) / ".." / "fuzz" / "corpus";

CommandResult inspect(const fs::path& dir, const std::string& flags = "--json") {
  return run_command(std::string(QINFER_BINARY) + " inspect " + flags + " '" + dir.string() + "'");
}

io::json inspect_json(const fs::path& dir) {
  CommandResult r = inspect(dir);
  EXPECT_EQ(r.status, 0) << r.err;
  return io::json::parse(r.out);
}

struct Expectation {
  const char* fixture;
  const char* family;
  const char* generation;
  bool shift;
  bool mtp;
  bool vision;
  const char* quant;  // quantization.format
  size_t files;
};

class InspectGolden : public ::testing::TestWithParam<Expectation> {};

TEST_P(InspectGolden, DescribesTheFixture) {
  const Expectation& e = GetParam();
  io::json d = inspect_json(kGolden / e.fixture);
  EXPECT_EQ(d["family"], e.family);
  EXPECT_EQ(d["generation"], e.generation);
  EXPECT_EQ(d["plan"]["shift_norms"], e.shift);
  EXPECT_EQ(d["canonical"]["mtp"].get<size_t>() > 0, e.mtp);
  EXPECT_EQ(d["canonical"]["vision"].get<size_t>() > 0, e.vision);
  EXPECT_EQ(d["quantization"]["format"], e.quant);
  EXPECT_EQ(d["stored"]["files"], e.files);
  EXPECT_GT(d["stored"]["bytes"].get<uint64_t>(), 0u);
  if (e.shift) EXPECT_FALSE(d["plan"]["shifted"].empty());
  else EXPECT_TRUE(d["plan"]["shifted"].empty());
  // The human-readable form of the same checkpoint works too.
  CommandResult text = inspect(kGolden / e.fixture, "");
  EXPECT_EQ(text.status, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr(std::string("family        ") + e.family));
}

INSTANTIATE_TEST_SUITE_P(
    Fixtures, InspectGolden,
    ::testing::Values(Expectation{"qwen3", "qwen3", "HF", false, false, false, "none", 1},
                      Expectation{"qwen3_moe", "qwen3_moe", "HF", false, false, false, "none", 2},
                      Expectation{"qwen3_next", "qwen3_next", "HF", true, true, false, "none", 1},
                      Expectation{"qwen3_5", "qwen3_5", "HF", true, true, true, "none", 1},
                      Expectation{"qwen3_5_moe", "qwen3_5_moe", "HF", true, true, true, "none", 1},
                      Expectation{"qwen3_5_mlx", "qwen3_5", "MLX-converted", false, true, true, "none", 1},
                      Expectation{"qwen3_5_moe_mlx_4bit", "qwen3_5_moe", "MLX-converted", false, false, true, "mlx",
                                  1},
                      Expectation{"qwen3_mlx_8bit", "qwen3", "MLX-converted", false, false, false, "mlx", 1},
                      Expectation{"qwen3_5_mlx_6bit", "qwen3_5", "MLX-converted", false, false, true, "mlx", 1},
                      Expectation{"qwen3_5_mlx_3bit", "qwen3_5", "MLX-converted", false, false, true, "mlx", 1},
                      Expectation{"qwen3_5_mlx_mxfp4", "qwen3_5", "MLX-converted", false, false, true, "mlx", 1}),
    [](const auto& info) { return std::string(info.param.fixture); });

TEST(Inspect, QuantizedFixtureReportsOverrides) {
  io::json d = inspect_json(kGolden / "qwen3_5_moe_mlx_4bit");
  EXPECT_EQ(d["quantization"]["global"], "affine 4-bit group 64");
  EXPECT_GT(d["quantization"]["weights"]["affine 8-bit group 64"].get<int>(), 0);
  EXPECT_GT(d["quantization"]["weights"]["affine 4-bit group 64"].get<int>(), 0);
}

// Every broken file of the fuzz corpus, dropped into an otherwise valid checkpoint folder, makes
// inspect exit 1 with an error naming the file. The corpus's valid_* files parse, and then fail only
// for not holding this model's tensors.
TEST(Inspect, FailsCleanlyOnEveryBrokenCorpusFile) {
  ASSERT_TRUE(fs::is_directory(kCorpus)) << kCorpus;
  int broken = 0;
  for (const auto& entry : fs::directory_iterator(kCorpus)) {
    TempDir dir;
    write_file(dir / "config.json",
               R"({"model_type": "qwen3", "hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
                   "num_key_value_heads": 1, "head_dim": 4, "intermediate_size": 16, "vocab_size": 16})");
    fs::copy_file(entry.path(), dir / "model.safetensors");
    CommandResult r = inspect(dir.path());
    ASSERT_NE(r.status, -1) << entry.path() << " crashed inspect";
    EXPECT_EQ(r.status, 1) << entry.path() << ": " << r.err;
    if (entry.path().filename().string().starts_with("valid_")) {
      EXPECT_THAT(r.err, ::testing::Not(HasSubstr("model.safetensors:"))) << entry.path();
      continue;
    }
    EXPECT_THAT(r.err, HasSubstr("qinfer: error: " + (dir / "model.safetensors").string())) << entry.path();
    ++broken;
  }
  EXPECT_GT(broken, 30);
}

TEST(Inspect, MissingFolderAndMissingShardAreClearErrors) {
  CommandResult r = inspect("/nonexistent/checkpoint");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("/nonexistent/checkpoint: not a directory"));

  TempDir dir;
  fs::copy_file(kGolden / "qwen3_moe" / "config.json", dir / "config.json");
  fs::copy_file(kGolden / "qwen3_moe" / "model.safetensors.index.json", dir / "model.safetensors.index.json");
  fs::copy_file(kGolden / "qwen3_moe" / "model-00001-of-00002.safetensors", dir / "model-00001-of-00002.safetensors");
  r = inspect(dir.path());
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("model-00002-of-00002.safetensors"));
}

TEST(Inspect, HelpListsInspect) {
  CommandResult r = run_command(std::string(QINFER_BINARY) + " --help");
  EXPECT_EQ(r.status, 0);
  EXPECT_THAT(r.out, HasSubstr("inspect"));
}

}  // namespace
}  // namespace qinfer::testing
