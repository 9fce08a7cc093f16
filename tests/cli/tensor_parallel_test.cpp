// --tensor-parallel on `qinfer run` and `qinfer bench`: two host ranks write the text of one, a split
// that does not divide names the config field, and bench counts what every rank reads.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

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

// A port nothing listens on right now (the OS's pick for a socket bound to port 0, then closed).
int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
  socklen_t length = sizeof address;
  getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  close(fd);
  return ntohs(address.sin_port);
}

TEST(TensorParallelCli, RunOverTwoProcessesWritesTheTextOfOne) {
  const CommandResult one = run_command(run("qwen3_5", "--device cpu"));
  ASSERT_EQ(one.status, 0) << one.err;
  TempDir dir;
  const std::string group = "--device cpu --tensor-parallel 2 --tp-processes 2 --tp-address 127.0.0.1:" +
                            std::to_string(free_port()) + " --tp-process ";
  const std::string second = run("qwen3_5", group + "1") + " > '" + (dir.path() / "out1").string() + "' 2> '" +
                             (dir.path() / "err1").string() + "'; echo $? > '" + (dir.path() / "rc1").string() + "'";
  // Process 1 starts first and waits for process 0; the shell waits for both.
  const CommandResult r = run_command("( (" + second + ") & " + run("qwen3_5", group + "0") + "; rc=$?; wait; exit $rc )");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, one.out);
  EXPECT_THAT(r.err, HasSubstr("process 0 of 2 (ranks 0..0 of 2)"));
  EXPECT_EQ(read_text(dir.path() / "rc1"), "0\n") << read_text(dir.path() / "err1");
  EXPECT_EQ(read_text(dir.path() / "out1"), "");  // process 0 speaks for the group
  EXPECT_THAT(read_text(dir.path() / "err1"), HasSubstr("process 1 of 2 (ranks 1..1 of 2)"));
}

TEST(TensorParallelCli, ProcessFlagsAreChecked) {
  CommandResult r = run_command(run("qwen3", "--device cpu --tensor-parallel 2 --tp-processes 2 --tp-process 0"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--tp-processes 2: needs --tp-address HOST:PORT"));
  r = run_command(run("qwen3", "--device cpu --tensor-parallel 3 --tp-processes 2 --tp-address 127.0.0.1:1"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--tensor-parallel 3: not divisible over --tp-processes 2"));
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
