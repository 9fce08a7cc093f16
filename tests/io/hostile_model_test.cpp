// A malformed or hostile model folder: every bad config value, file kind or JSON shape is an Error
// naming the file and the field, before anything is sized by it; nothing hangs or crashes.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>

#include "core/error.h"
#include "io/config.h"
#include "io/file.h"
#include "io/safetensors.h"
#include "support/safetensors_writer.h"

namespace qinfer::io {
namespace {

using ::testing::HasSubstr;
using qinfer::testing::TempDir;
using qinfer::testing::write_file;
namespace fs = std::filesystem;

std::string error_of(const json& doc) {
  try {
    parse_config(doc, "cfg.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A hybrid VLM config and a MoE one, valid as they are.
json qwen3_5() {
  return json::parse(R"({
    "model_type": "qwen3_5", "eos_token_id": 248044,
    "text_config": {
      "model_type": "qwen3_5_text", "hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8,
      "num_key_value_heads": 2, "head_dim": 256, "intermediate_size": 3584, "vocab_size": 248320,
      "linear_num_key_heads": 16, "linear_num_value_heads": 16, "linear_key_head_dim": 128,
      "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4, "mtp_num_hidden_layers": 1,
      "max_position_embeddings": 262144, "rms_norm_eps": 1e-6,
      "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                          "mrope_section": [11, 11, 10], "mrope_interleaved": true}
    },
    "vision_config": {"depth": 12, "hidden_size": 768, "num_heads": 12, "intermediate_size": 3072,
                      "out_hidden_size": 1024, "num_position_embeddings": 2304}
  })");
}

json qwen3_moe() {
  return json::parse(R"({
    "model_type": "qwen3_moe", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "intermediate_size": 128, "vocab_size": 512,
    "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 48,
    "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
  })");
}

TEST(HostileConfig, TheValidConfigsParse) {
  EXPECT_EQ(error_of(qwen3_5()), "");
  EXPECT_EQ(error_of(qwen3_moe()), "");
}

// 1e12 layers once built a vector of 10^12 layer kinds (and a list of expected tensors per layer):
// memory ran out before any message.
TEST(HostileConfig, HugeSizesAreRefusedNamingTheField) {
  for (const char* field : {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                            "num_key_value_heads", "head_dim", "max_position_embeddings", "linear_num_key_heads",
                            "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
                            "linear_conv_kernel_dim", "mtp_num_hidden_layers"}) {
    json doc = qwen3_5();
    doc["text_config"][field] = 1e12;
    const std::string error = error_of(doc);
    EXPECT_THAT(error, HasSubstr(std::string("cfg.json: text_config.") + field + ": 1000000000000 is above the limit"))
        << field;
  }
  for (const char* field : {"num_experts", "moe_intermediate_size"}) {
    json doc = qwen3_moe();
    doc[field] = 1e12;
    EXPECT_THAT(error_of(doc), HasSubstr(std::string("cfg.json: ") + field + ": 1000000000000 is above the limit"))
        << field;
  }
  json doc = qwen3_moe();
  doc["rope_scaling"]["original_max_position_embeddings"] = int64_t{1} << 40;
  EXPECT_THAT(error_of(doc), HasSubstr("cfg.json: rope_scaling.original_max_position_embeddings: 1099511627776 is "
                                       "above the limit"));
  for (const char* field : {"depth", "hidden_size", "num_heads", "intermediate_size", "patch_size",
                            "num_position_embeddings"}) {
    doc = qwen3_5();
    doc["vision_config"][field] = int64_t{1} << 40;
    EXPECT_THAT(error_of(doc), HasSubstr(std::string("cfg.json: vision_config.") + field)) << field;
  }
  // The bounds sit far above every released model: the largest real values still parse.
  doc = qwen3_5();
  doc["text_config"]["max_position_embeddings"] = 1010000;  // Qwen2.5-1M
  EXPECT_EQ(error_of(doc), "");
}

TEST(HostileConfig, IntegerFieldsRefuseFractionsNegativesAndOverflow) {
  struct Case {
    json value;
    const char* message;
  };
  const Case cases[] = {
      {2.5, "text_config.num_hidden_layers: expected an integer, got 2.5"},
      {-4, "text_config.num_hidden_layers: must be a positive integer, got -4"},
      {0, "text_config.num_hidden_layers: must be a positive integer, got 0"},
      {1e300, "text_config.num_hidden_layers: expected an integer, got 1e+300"},  // the cast was undefined
      {std::numeric_limits<uint64_t>::max(), "text_config.num_hidden_layers: 18446744073709551615 is out of the range"},
      {"4", "text_config.num_hidden_layers: expected an integer, got \"4\""},
  };
  for (const Case& c : cases) {
    json doc = qwen3_5();
    doc["text_config"]["num_hidden_layers"] = c.value;
    EXPECT_THAT(error_of(doc), HasSubstr(c.message)) << c.value;
  }
  json doc = qwen3_5();
  doc["text_config"]["num_hidden_layers"] = 4.0;  // an exact integral float is what some writers emit
  EXPECT_EQ(error_of(doc), "");

  doc = qwen3_5();
  doc["eos_token_id"] = -1;
  EXPECT_THAT(error_of(doc), HasSubstr("cfg.json: eos_token_id: must be an integer of at least 0, got -1"));
  doc["eos_token_id"] = {1, int64_t{1} << 40};
  EXPECT_THAT(error_of(doc), HasSubstr("cfg.json: eos_token_id: 1099511627776 is above the limit"));

  doc = qwen3_moe();
  doc["num_experts"] = -8;
  EXPECT_THAT(error_of(doc), HasSubstr("cfg.json: num_experts: must be an integer of at least 0, got -8"));
  doc = qwen3_moe();
  doc["shared_expert_intermediate_size"] = -1;
  EXPECT_THAT(error_of(doc), HasSubstr("cfg.json: shared_expert_intermediate_size: must be an integer of at least 0"));
}

// A zero, negative or NaN epsilon, or a non-positive rope theta, loaded fine and made every token "!".
TEST(HostileConfig, BadFloatsAreRefusedNamingTheField) {
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  for (double eps : {-1e-6, 0.0, 2.0, nan, inf}) {
    json doc = qwen3_5();
    doc["text_config"]["rms_norm_eps"] = eps;
    EXPECT_THAT(error_of(doc), HasSubstr("cfg.json: text_config.rms_norm_eps: ")) << eps;
  }
  for (double theta : {0.0, -10000.0, nan}) {
    json doc = qwen3_5();
    doc["text_config"]["rope_parameters"]["rope_theta"] = theta;
    EXPECT_THAT(error_of(doc), HasSubstr("cfg.json: text_config.rope_parameters.rope_theta: ")) << theta;
    doc = qwen3_moe();
    doc["rope_theta"] = theta;
    EXPECT_THAT(error_of(doc), HasSubstr("cfg.json: rope_theta: ")) << theta;
  }
  for (double factor : {0.0, 1.5, -0.25}) {
    json doc = qwen3_5();
    doc["text_config"]["rope_parameters"]["partial_rotary_factor"] = factor;
    EXPECT_THAT(error_of(doc), HasSubstr("cfg.json: text_config.rope_parameters.partial_rotary_factor: ")) << factor;
  }
  json doc = qwen3_moe();
  doc["rope_scaling"]["factor"] = 0.0;
  EXPECT_THAT(error_of(doc), HasSubstr("cfg.json: rope_scaling.factor: must be a positive number, got 0"));
}

TEST(HostileConfig, NumbersPastADoubleNameTheFile) {
  TempDir dir;
  write_file(dir / "config.json", R"({"model_type": "qwen3", "rms_norm_eps": 1e999})");
  try {
    load_config(dir.path());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((dir / "config.json").string() + ": malformed JSON"));
  }
}

// Runs `f` in a child process and returns the Error it threw ("" for none), or "(hung)" when it did
// not finish within `seconds`: opening a FIFO used to block forever.
std::string error_in_child(const std::function<void()>& f, int seconds = 20) {
  int fds[2];
  if (::pipe(fds) != 0) return "(no pipe)";
  const pid_t child = ::fork();
  if (child == 0) {
    ::close(fds[0]);
    std::string message;
    try {
      f();
    } catch (const std::exception& e) {
      message = e.what();
    }
    (void)!::write(fds[1], message.data(), message.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  pollfd p{fds[0], POLLIN, 0};
  char buffer[4096];
  for (;;) {
    if (::poll(&p, 1, seconds * 1000) <= 0) {
      ::kill(child, SIGKILL);
      out = "(hung)";
      break;
    }
    const ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n <= 0) break;
    out.append(buffer, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  ::waitpid(child, nullptr, 0);
  return out;
}

void make_socket(const fs::path& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  ASSERT_LT(path.string().size(), sizeof address.sun_path);
  std::strcpy(address.sun_path, path.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ::close(fd);  // the socket file stays
}

// Fills `path` with something other than a regular file.
enum class Kind { fifo, directory, dev_zero, socket };
void make(Kind kind, const fs::path& path) {
  switch (kind) {
    case Kind::fifo: ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0); break;
    case Kind::directory: fs::create_directory(path); break;
    case Kind::dev_zero: fs::create_symlink("/dev/zero", path); break;
    case Kind::socket: make_socket(path); break;
  }
}

TEST(HostileFiles, OnlyRegularFilesAreOpened) {
  const std::pair<Kind, const char*> kinds[] = {{Kind::fifo, "is a FIFO, not a regular file"},
                                                {Kind::directory, "is a directory, not a regular file"},
                                                {Kind::dev_zero, "is a character device, not a regular file"},
                                                {Kind::socket, "is a socket, not a regular file"}};
  for (const auto& kind : kinds) {
    TempDir dir;
    write_file(dir / "config.json", qwen3_moe().dump());
    make(kind.first, dir / "model.safetensors");
    EXPECT_THAT(error_in_child([&] { TensorStore store(dir.path()); }),
                HasSubstr((dir / "model.safetensors").string() + ": " + kind.second));

    TempDir other;
    make(kind.first, other / "config.json");
    EXPECT_THAT(error_in_child([&] { load_config(other.path()); }),
                HasSubstr((other / "config.json").string() + ": " + kind.second));
    EXPECT_THAT(error_in_child([&] { read_json_file(other / "config.json"); }), HasSubstr(kind.second));
  }
}

TEST(HostileFiles, SymlinksToRegularFilesAreFine) {
  TempDir dir, elsewhere;
  write_file(elsewhere / "config.json", qwen3_moe().dump());
  qinfer::testing::SafetensorsWriter().add_filled("model.norm.weight", DType::f32, {4}).write(elsewhere / "w.safetensors");
  fs::create_symlink(elsewhere / "config.json", dir / "config.json");
  fs::create_symlink(elsewhere / "w.safetensors", dir / "model.safetensors");
  EXPECT_EQ(load_config(dir.path()).text.hidden_size, 64);
  EXPECT_EQ(TensorStore(dir.path()).tensors().size(), 1u);
}

TEST(HostileFiles, OversizedTextFilesAreRefusedBeforeReading) {
  TempDir dir;
  write_file(dir / "tokenizer.json", std::string(100, ' '));
  EXPECT_EQ(read_model_file(dir / "tokenizer.json", 100).size(), 100u);
  try {
    read_model_file(dir / "tokenizer.json", 99);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr((dir / "tokenizer.json").string() + ": is 100 bytes, more than the 99 byte limit"));
  }
}

TEST(HostileFiles, DeepIndexIsRefusedByName) {
  TempDir dir;
  write_file(dir / "model.safetensors.index.json",
             "{\"weight_map\": " + std::string(100000, '[') + std::string(100000, ']') + "}");
  try {
    TensorStore store(dir.path());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("model.safetensors.index.json: 'weight_map' in the index is nested deeper"));
  }
}

}  // namespace
}  // namespace qinfer::io
