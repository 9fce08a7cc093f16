// `qinfer eval` as tests and outside checks call it: logits file, greedy JSON line, --dump, errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "io/json.h"
#include "support/run_command.h"
#include "support/safetensors_writer.h"

namespace qinfer::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

const fs::path kFixture = fs::path(QINFER_TEST_DATA) / "golden" / "qwen3_next";

std::string eval(const std::string& args) {
  return std::string(QINFER_BINARY) + " eval --model '" + kFixture.string() + "' " + args;
}

std::string ids_of(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

TEST(Eval, LogitsFileAndGreedyLineMatchTheReference) {
  io::json ref = io::read_json_file(kFixture / "reference.json");
  const auto prompt = ref["prompts"][2].get<std::vector<int32_t>>();
  const auto greedy = ref["greedy"][2].get<std::vector<int32_t>>();
  TempDir dir;
  for (const char* mode : {"prefill", "decode", "chunked:7"}) {
    CommandResult r = run_command(eval("--ids " + ids_of(prompt) + " --mode " + mode + " --greedy 12 --logits '" +
                                       (dir / "l.bin").string() + "'"));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(io::json::parse(r.out)["greedy"].get<std::vector<int32_t>>(), greedy) << mode;
    std::string got = read_text(dir / "l.bin");
    std::string want = read_text(kFixture / ref["logits"][2].get<std::string>());
    ASSERT_EQ(got.size(), want.size()) << mode;
    const float* g = reinterpret_cast<const float*>(got.data());
    const float* w = reinterpret_cast<const float*>(want.data());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < want.size() / 4; ++i) {
      diff += (g[i] - w[i]) * double(g[i] - w[i]);
      norm += w[i] * double(w[i]);
    }
    EXPECT_LE(std::sqrt(diff / norm), 1e-2) << mode;
  }
}

std::vector<float> read_floats(const fs::path& path) {
  const std::string bytes = read_text(path);
  std::vector<float> out(bytes.size() / sizeof(float));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

// --rope-scaling yarn:4 means what YaRN in config.json over the same original context means (the
// fixture's max_position_embeddings, 4096), and changes the logits.
TEST(Eval, RopeScalingYarnIsTheConfigsYarn) {
  const fs::path qwen3 = fs::path(QINFER_TEST_DATA) / "golden" / "qwen3";
  const auto prompt = io::read_json_file(qwen3 / "reference.json")["prompts"][1].get<std::vector<int32_t>>();
  TempDir dir;
  io::json config = io::read_json_file(qwen3 / "config.json");
  config["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 4096}};
  fs::create_directory(dir / "yarn");
  write_file(dir / "yarn" / "config.json", config.dump());
  fs::create_symlink(qwen3 / "model.safetensors", dir / "yarn" / "model.safetensors");
  const auto logits = [&](const fs::path& model, const std::string& extra, const std::string& name) {
    const CommandResult r = run_command(std::string(QINFER_BINARY) + " eval --model '" + model.string() +
                                        "' --ids " + ids_of(prompt) + " --logits '" + (dir / name).string() + "'" +
                                        extra);
    EXPECT_EQ(r.status, 0) << r.err;
    return read_floats(dir / name);
  };
  const std::vector<float> plain = logits(qwen3, "", "plain.bin");
  const std::vector<float> flag = logits(qwen3, " --rope-scaling yarn:4", "flag.bin");
  EXPECT_EQ(logits(qwen3, " --rope-scaling yarn:4:4096", "named.bin"), flag) << "the config's original, named";
  const std::vector<float> configured = logits(dir / "yarn", "", "config.bin");
  ASSERT_EQ(flag.size(), plain.size());
  EXPECT_EQ(flag, configured);
  double diff = 0, norm = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    diff += (flag[i] - plain[i]) * double(flag[i] - plain[i]);
    norm += plain[i] * double(plain[i]);
  }
  EXPECT_GT(std::sqrt(diff / norm), 1e-3) << "YaRN left the logits as they were";
}

TEST(Eval, RopeScalingRefusesBadValuesNamingTheOption) {
  for (const char* value : {"yarn:0", "yarn:1", "yarn:-2", "yarn:abc", "yarn:", "yarn:4x", "yarn:inf", "yarn:nan"}) {
    const CommandResult r = run_command(eval(std::string("--ids 1,2 --rope-scaling ") + value));
    EXPECT_EQ(r.status, 1) << value;
    EXPECT_THAT(r.err, HasSubstr(std::string("--rope-scaling ") + value + ": FACTOR must be a number above 1"))
        << value;
  }
  for (const char* value : {"foo:2", "linear:2", "4"}) {
    const CommandResult r = run_command(eval(std::string("--ids 1,2 --rope-scaling ") + value));
    EXPECT_EQ(r.status, 1) << value;
    EXPECT_THAT(r.err, HasSubstr(std::string("--rope-scaling ") + value + ": expected yarn:FACTOR")) << value;
  }
  for (const char* value : {"yarn:4:", "yarn:4:0", "yarn:4:-5", "yarn:4:1.5", "yarn:4:x"}) {
    const CommandResult r = run_command(eval(std::string("--ids 1,2 --rope-scaling ") + value));
    EXPECT_EQ(r.status, 1) << value;
    EXPECT_THAT(r.err, HasSubstr(std::string("--rope-scaling ") + value + ": ORIGINAL must be a positive whole number"))
        << value;
  }
}

// Every command that loads a model for inference takes the option (add_device_flags).
TEST(Eval, RopeScalingIsOnEveryCommandThatLoadsAModel) {
  for (const char* command : {"run", "chat", "serve", "eval", "bench"}) {
    const CommandResult r = run_command(std::string(QINFER_BINARY) + " " + command + " --help");
    EXPECT_EQ(r.status, 0) << command << ": " << r.err;
    EXPECT_THAT(r.out, HasSubstr("--rope-scaling")) << command;
  }
}

// cached:N: an earlier request of the first N ids leaves them in the prefix cache (this fixture keeps
// recurrent state: a checkpoint of it); the logits stay the reference's and the whole blocks of N are
// reported reused, alone and over two tensor-parallel ranks.
TEST(Eval, CachedModeReportsTheReusedTokensAndMatchesTheReference) {
  io::json ref = io::read_json_file(kFixture / "reference.json");
  const auto prompt = ref["prompts"][2].get<std::vector<int32_t>>();
  const std::string want = read_text(kFixture / ref["logits"][2].get<std::string>());
  TempDir dir;
  for (const char* extra : {"", " --tensor-parallel 2"}) {
    for (const int n : {32, 45, static_cast<int>(prompt.size()) - 1}) {
      CommandResult r = run_command(eval("--ids " + ids_of(prompt) + " --mode cached:" + std::to_string(n) +
                                         " --logits '" + (dir / "l.bin").string() + "'" + extra));
      ASSERT_EQ(r.status, 0) << r.err;
      EXPECT_EQ(io::json::parse(r.out)["cached"], n / 16 * 16) << n << extra;
      const std::string got = read_text(dir / "l.bin");
      ASSERT_EQ(got.size(), want.size());
      const float* g = reinterpret_cast<const float*>(got.data());
      const float* w = reinterpret_cast<const float*>(want.data());
      double diff = 0, norm = 0;
      for (size_t i = 0; i < want.size() / 4; ++i) {
        diff += (g[i] - w[i]) * double(g[i] - w[i]);
        norm += w[i] * double(w[i]);
      }
      EXPECT_LE(std::sqrt(diff / norm), 1e-2) << n << extra;
    }
  }
}

// Two ranks (threads) splitting heads and intermediates give the greedy tokens of the reference;
// a split that does not divide names the field.
TEST(Eval, TensorParallelRanksMatchTheReference) {
  io::json ref = io::read_json_file(kFixture / "reference.json");
  const auto prompt = ref["prompts"][1].get<std::vector<int32_t>>();
  const auto greedy = ref["greedy"][1].get<std::vector<int32_t>>();
  for (const char* device : {"ref", "cpu"}) {
    CommandResult r = run_command(eval("--ids " + ids_of(prompt) + " --greedy " + std::to_string(greedy.size()) +
                                       " --tensor-parallel 2 --device " + device));
    ASSERT_EQ(r.status, 0) << device << ": " << r.err;
    EXPECT_EQ(io::json::parse(r.out)["greedy"].get<std::vector<int32_t>>(), greedy) << device;
  }
  CommandResult r = run_command(eval("--ids 1,2,3 --greedy 1 --tensor-parallel 3 --device ref"));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("is not divisible by 3"));
}

TEST(Eval, DumpWritesNamedIntermediates) {
  TempDir dir;
  CommandResult r = run_command(eval("--ids 1,2,3,4 --dump '" + (dir / "d").string() + "'"));
  ASSERT_EQ(r.status, 0) << r.err;
  io::json manifest = io::read_json_file(dir / "d" / "manifest.json");
  EXPECT_EQ(manifest["model.layers.0.linear_attn.core"], (std::vector<int64_t>{4, 4, 32}));
  EXPECT_EQ(manifest["model.layers.3.self_attn.q"], (std::vector<int64_t>{4, 4, 32}));
  EXPECT_EQ(manifest["logits"], (std::vector<int64_t>{4, 512}));
  EXPECT_EQ(fs::file_size(dir / "d" / "model.layers.2.mlp.bin"), 4u * 64 * 4);
}

TEST(Eval, BadArgumentsAreClearErrors) {
  struct Bad {
    std::string args, message;
  };
  for (const Bad& b : {Bad{"--ids 1,x,3", "--ids: 'x' is not a token id"},
                       Bad{"--ids 1,512", "--ids: token id 512 is outside the vocabulary (0..511)"},
                       Bad{"--ids 1,2 --mode sideways", "--mode sideways: expected prefill, decode, chunked:N or cached:N"},
                       Bad{"--ids 1,2 --mode cached:0", "the cached length must be a positive integer"},
                       Bad{"--ids 1,2 --mode cached:3", "cached:3: the earlier request's length must be in 1..2"},
                       Bad{"--ids 1,2 --mode cached:1 --greedy 2", "--greedy does not go with --mode cached:N"},
                       Bad{"--ids 1,2 --mode chunked:0", "the chunk size must be a positive integer"},
                       Bad{"--ids 1,2 --mode decode --dump /tmp/x", "--dump needs --mode prefill"},
                       Bad{"--ids 1,2 --device tpu", "--device tpu"}}) {
    CommandResult r = run_command(eval(b.args));
    EXPECT_EQ(r.status, 1) << b.args;
    EXPECT_THAT(r.err, HasSubstr(b.message)) << b.args;
  }
}

}  // namespace
}  // namespace qinfer::testing
