// `qinfer run` and `qinfer chat` on a tiny random-weight Qwen3 with the real Qwen3 tokenizer and chat
// template: text comes out, sampling is reproducible, bad input is a clear error, and chat is driven
// through a pseudo-terminal like a person at a keyboard (including Ctrl-C during an answer).
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <regex>
#include <thread>

#include "models/random_checkpoint.h"
#include "support/run_command.h"
#include "support/safetensors_writer.h"

namespace qinfer::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

// A Qwen3-shaped model small enough to build in a second, with the full Qwen3 vocabulary.
const fs::path& tiny_model() {
  static TempDir dir;
  static bool made = false;
  if (!made) {
    const fs::path tokenizer = fs::path(QINFER_TEST_DATA).parent_path().parent_path() / ".deps" / "qwen3-tokenizer";
    if (!fs::exists(tokenizer / "tokenizer.json"))
      throw std::runtime_error("Qwen3 tokenizer data missing: run scripts/fetch-test-data.sh");
    io::json config = {{"model_type", "qwen3"}, {"hidden_size", 32}, {"num_hidden_layers", 2},
                       {"num_attention_heads", 2}, {"num_key_value_heads", 1}, {"head_dim", 16},
                       {"intermediate_size", 64}, {"vocab_size", 151936}, {"rms_norm_eps", 1e-6},
                       {"rope_theta", 1e6}, {"max_position_embeddings", 4096}, {"tie_word_embeddings", true},
                       {"eos_token_id", 151645}, {"torch_dtype", "bfloat16"}};
    models::write_random_checkpoint(dir.path(), config, 11);
    fs::copy_file(tokenizer / "tokenizer.json", dir / "tokenizer.json");
    fs::copy_file(tokenizer / "tokenizer_config.json", dir / "tokenizer_config.json");
    made = true;
  }
  return dir.path();
}

std::string run(const std::string& args) {
  return std::string(QINFER_BINARY) + " run --model '" + tiny_model().string() + "' " + args;
}

TEST(Run, GeneratesTextThroughTheChatTemplate) {
  CommandResult r = run_command(run("-p 'Hello there' -n 12 --seed 3"));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_GT(r.out.size(), 1u);
  EXPECT_THAT(r.err, HasSubstr("generated"));
  EXPECT_THAT(r.err, HasSubstr("tok/s"));
  // Same seed, same text; another seed, (almost surely) other text.
  EXPECT_EQ(run_command(run("-p 'Hello there' -n 12 --seed 3")).out, r.out);
  EXPECT_NE(run_command(run("-p 'Hello there' -n 12 --seed 4")).out, r.out);
}

TEST(Run, GreedyRawAndStopStrings) {
  CommandResult greedy = run_command(run("-p 'abc' --raw --temp 0 -n 8"));
  ASSERT_EQ(greedy.status, 0) << greedy.err;
  EXPECT_EQ(run_command(run("-p 'abc' --raw --temp 0 -n 8")).out, greedy.out);
  // Stopping at the first character of the greedy output leaves nothing before it.
  const std::string first(1, greedy.out[0]);
  if (first != "'" && first != "\\" && first != "\n") {
    CommandResult stopped = run_command(run("-p 'abc' --raw --temp 0 -n 8 --stop '" + first + "'"));
    EXPECT_EQ(stopped.status, 0);
    EXPECT_EQ(stopped.out, "\n");
    EXPECT_THAT(stopped.err, HasSubstr("finish: stop"));
  }
}

// A random tiny model writes whatever the constraint allows: the output is checked, not the model.
TEST(Run, StructuredOutputFlags) {
  TempDir files;
  const fs::path schema = files / "schema.json", gbnf = files / "list.gbnf";
  std::ofstream(schema) << R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9},
    "tag": {"enum": ["x", "yy"]}}, "required": ["n", "tag"], "additionalProperties": false})";
  std::ofstream(gbnf) << "root ::= \"[\" [0-9] (\",\" [0-9]){0,2} \"]\"\n";
  for (int seed : {1, 2}) {
    const std::string flags = fmt::format(" -n 60 --temp 1 --seed {} --no-thinking", seed);
    CommandResult r = run_command(run("-p 'a' --json-schema '" + schema.string() + "'" + flags));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("finish: stop"));
    const io::json v = io::json::parse(r.out);
    EXPECT_EQ(v.size(), 2u) << r.out;
    EXPECT_GE(v.at("n").get<int>(), 1);
    EXPECT_LE(v.at("n").get<int>(), 9);
    EXPECT_TRUE(v.at("tag") == "x" || v.at("tag") == "yy") << r.out;
  }
  const std::string flags = " -n 60 --temp 1 --seed 1 --no-thinking";
  CommandResult r;
  r = run_command(run("-p 'a' --grammar '" + gbnf.string() + "'" + flags));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(std::regex_match(r.out, std::regex(R"(\[[0-9](,[0-9]){0,2}\]\n)"))) << r.out;
  r = run_command(run("-p 'a' --regex '(yes|no)!'" + flags));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(r.out == "yes!\n" || r.out == "no!\n") << r.out;
  r = run_command(run("-p 'a' --json" + flags));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out[0], '{') << r.out;
  CommandResult bad = run_command(run("-p a --json-schema '" + gbnf.string() + "'"));
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.err, HasSubstr("--json-schema " + gbnf.string() + ": not JSON"));
  bad = run_command(run("-p a --regex '(?=a)'"));
  EXPECT_EQ(bad.status, 1);
  EXPECT_THAT(bad.err, HasSubstr("--regex: regex"));
  bad = run_command(run("-p a --regex a --json"));
  EXPECT_NE(bad.status, 0);
  EXPECT_THAT(bad.err, HasSubstr("excludes"));
}

TEST(Run, BadInputIsAClearError) {
  CommandResult r = run_command(run("-p \"$(printf '\\377\\376')\" -n 2"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("not valid UTF-8"));
  r = run_command(run("-p hi -n 0"));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("max_tokens must be positive"));
  r = run_command(std::string(QINFER_BINARY) + " run --model /nonexistent -p hi");
  EXPECT_EQ(r.status, 1);
}

// Reads from the pty until `needle` shows up (or the deadline passes); returns everything read.
std::string read_until(int fd, const std::string& needle, std::string& seen, int seconds = 20) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (seen.find(needle) == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    char buffer[4096];
    const ssize_t n = read(fd, buffer, sizeof buffer);
    if (n <= 0) break;
    seen.append(buffer, static_cast<size_t>(n));
  }
  return seen;
}

TEST(Chat, MultiTurnResetAndCtrlCThroughAPseudoTerminal) {
  const fs::path model = tiny_model();
  int fd = -1;
  const pid_t pid = forkpty(&fd, nullptr, nullptr, nullptr);
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    execl(QINFER_BINARY, QINFER_BINARY, "chat", "--model", model.c_str(), "-n", "400000", "--seed", "1",
          static_cast<char*>(nullptr));
    _exit(127);
  }
  std::string seen;
  read_until(fd, "> ", seen);
  ASSERT_THAT(seen, HasSubstr("qinfer chat"));
  // A long answer, interrupted with Ctrl-C: the answer stops, the program asks for the next turn.
  const std::string line = "Tell me a story\n";
  ASSERT_EQ(write(fd, line.data(), line.size()), static_cast<ssize_t>(line.size()));
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const char ctrl_c = 0x03;
  ASSERT_EQ(write(fd, &ctrl_c, 1), 1);
  seen.clear();
  read_until(fd, "[stopped]", seen);
  EXPECT_THAT(seen, HasSubstr("[stopped]"));
  read_until(fd, "> ", seen);
  const std::string reset = "/reset\n";
  ASSERT_EQ(write(fd, reset.data(), reset.size()), static_cast<ssize_t>(reset.size()));
  seen.clear();
  read_until(fd, "(conversation cleared)", seen);
  EXPECT_THAT(seen, HasSubstr("(conversation cleared)"));
  const std::string bye = "/exit\n";
  ASSERT_EQ(write(fd, bye.data(), bye.size()), static_cast<ssize_t>(bye.size()));
  int status = 0;
  for (int i = 0; i < 100 && waitpid(pid, &status, WNOHANG) == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (waitpid(pid, &status, WNOHANG) == 0) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    FAIL() << "chat did not exit after /exit";
  }
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  close(fd);
}

}  // namespace
}  // namespace qinfer::testing
