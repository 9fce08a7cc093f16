// --tensor-parallel on `qinfer run` and `qinfer bench`: two host ranks write the text of one, a split
// that does not divide names the config field, and bench counts what every rank reads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "io/json.h"
#include "support/run_command.h"
#include "support/safetensors_writer.h"

namespace qinfer::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

const fs::path kGolden = fs::path(QINFER_TEST_DATA) / "golden";

// A golden fixture with the small test tokenizer that covers its 512 ids.
const fs::path& model_with_tokenizer(const std::string& fixture) {
  static std::map<std::string, std::unique_ptr<TempDir>> dirs;
  auto& dir = dirs[fixture];
  if (!dir) {
    dir = std::make_unique<TempDir>();
    for (const char* file : {"config.json", "model.safetensors"}) fs::copy_file(kGolden / fixture / file, *dir / file);
    const fs::path tokenizer = fs::path(QINFER_TEST_DATA).parent_path() / "tokenizer" / "data" / "qwen35_mini";
    for (const char* file : {"tokenizer.json", "tokenizer_config.json"}) fs::copy_file(tokenizer / file, *dir / file);
  }
  return dir->path();
}

std::string run(const std::string& fixture, const std::string& args) {
  return std::string(QINFER_BINARY) + " run --model '" + model_with_tokenizer(fixture).string() +
         "' -p 'the cat sat' --raw --temp 0 -n 16 " + args;
}

TEST(TensorParallelCli, RunOnTwoRanksWritesTheTextOfOne) {
  for (const char* fixture : {"qwen3", "qwen3_5"}) {
    const CommandResult one = run_command(run(fixture, "--device cpu"));
    ASSERT_EQ(one.status, 0) << one.err;
    EXPECT_THAT(one.err, HasSubstr("generated 16 tokens"));
    for (const char* device : {"cpu", "ref"}) {
      const CommandResult two = run_command(run(fixture, std::string("--tensor-parallel 2 --device ") + device));
      ASSERT_EQ(two.status, 0) << fixture << " " << device << ": " << two.err;
      EXPECT_EQ(two.out, one.out) << fixture << " " << device;
    }
  }
}

TEST(TensorParallelCli, ASplitThatDoesNotDivideNamesTheField) {
  const CommandResult r = run_command(run("qwen3", "--tensor-parallel 4 --device cpu"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("tensor parallel 4: num_key_value_heads 2 is not divisible by 4"));
}

TEST(TensorParallelCli, BenchCountsTheBytesOfEveryRank) {
  auto bench = [](int ranks) {
    const CommandResult r = run_command(std::string(QINFER_BINARY) + " bench --model '" +
                                        (kGolden / "qwen3_moe").string() +
                                        "' --batch 2 --prompt 5 --gen 3 --context 6 --json --tensor-parallel " +
                                        std::to_string(ranks));
    EXPECT_EQ(r.status, 0) << r.err;
    return io::json::parse(r.out);
  };
  const io::json one = bench(1), two = bench(2);
  EXPECT_EQ(one["tensor_parallel"], 1);
  EXPECT_EQ(two["tensor_parallel"], 2);
  // The split matrices once, the replicated embeddings, head and norms once per rank.
  const double bytes_one = one["decode"][0]["bytes_per_step"].get<double>();
  const double bytes_two = two["decode"][0]["bytes_per_step"].get<double>();
  EXPECT_GT(bytes_two, bytes_one);
  EXPECT_LT(bytes_two, 2 * bytes_one);
  // Host ranks share one memory: the ceiling stays the probe's.
  const io::json& d = two["decode"][0];
  EXPECT_NEAR(d["gbs"].get<double>() / two["copy_probe_gbs"].get<double>(), d["fraction_of_probe"].get<double>(), 1e-9);
}

}  // namespace
}  // namespace qinfer::testing
