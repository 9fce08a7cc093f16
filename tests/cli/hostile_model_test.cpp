// A malformed or hostile model folder given to `qinfer inspect` and `qinfer run`: a clear error
// naming the file and the field (exit 1), never a crash, a hang or memory exhaustion. Each case is a
// copy of the demo model with one thing broken.
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <functional>

#include "core/error.h"
#include "core/thread_pool.h"
#include "io/safetensors.h"
#include "models/model.h"
#include "support/run_command.h"
#include "support/safetensors_writer.h"

namespace qinfer::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

const fs::path kDemo = fs::path(QINFER_TEST_DATA).parent_path().parent_path() / "models" / "demo";
const fs::path kGolden = fs::path(QINFER_TEST_DATA) / "golden";

// The demo model's files in `dir`: JSON files copied (they get edited), the weights linked unless
// `copy_weights` (they get patched).
void demo_copy(const fs::path& dir, bool copy_weights = false) {
  for (const char* name : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(kDemo / name, dir / name);
  if (copy_weights) fs::copy_file(kDemo / "model.safetensors", dir / "model.safetensors");
  else fs::create_symlink(kDemo / "model.safetensors", dir / "model.safetensors");
}

io::json read_json(const fs::path& path) { return io::json::parse(read_text(path)); }
void write_json(const fs::path& path, const io::json& value) { write_file(path, value.dump()); }

// Memory is capped (a run past it is a crash, not a swapping machine) and so is time (a hang is exit 124).
CommandResult qinfer(const std::string& args) {
#if defined(QINFER_SANITIZE)
  // AddressSanitizer reserves terabytes of address space for its shadow: no address-space cap there.
  return run_command("timeout 120 " + std::string(QINFER_BINARY) + " " + args);
#else
  return run_command("ulimit -v 4000000; timeout 60 " + std::string(QINFER_BINARY) + " " + args);
#endif
}
CommandResult inspect(const fs::path& dir) { return qinfer("inspect '" + dir.string() + "'"); }
CommandResult run(const fs::path& dir) { return qinfer("run --model '" + dir.string() + "' -p hi -n 4 --temp 0"); }

void expect_error(const CommandResult& r, const std::string& message, const std::string& what) {
  EXPECT_EQ(r.status, 1) << what << ": " << r.err;
  EXPECT_THAT(r.err, HasSubstr(message)) << what;
}

TEST(HostileModel, TheDemoCopyWorks) {
  TempDir dir;
  demo_copy(dir.path());
  const CommandResult r = run(dir.path());
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST(HostileModel, HugeConfigSizesFailAtOnce) {
  for (const char* field : {"num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                            "num_key_value_heads", "vocab_size", "head_dim", "max_position_embeddings",
                            "mtp_num_hidden_layers", "linear_num_value_heads", "linear_conv_kernel_dim"}) {
    TempDir dir;
    demo_copy(dir.path());
    io::json config = read_json(dir / "config.json");
    config["text_config"][field] = 1e12;
    // Without layer_types the layer kinds were derived for every one of the 10^12 layers.
    if (std::string(field) == "num_hidden_layers") config["text_config"].erase("layer_types");
    write_json(dir / "config.json", config);
    const std::string message = (dir / "config.json").string() + ": text_config." + field + ": 1000000000000 is above";
    expect_error(inspect(dir.path()), message, field);
    expect_error(run(dir.path()), message, field);
  }
}

TEST(HostileModel, ConfigThatDisagreesWithTheTensorsNamesTensorAndField) {
  struct Case {
    const char* field;
    io::json value;
    const char* tensor;
    const char* says;
  };
  const Case cases[] = {
      {"vocab_size", 16000, "tensor 'model.embed_tokens.weight'", "says vocab_size = 16000"},
      {"hidden_size", 512, "tensor 'model.embed_tokens.weight'", "says hidden_size = 512"},
      {"intermediate_size", 2048, "tensor 'model.layers.0.mlp.gate_proj.weight'", "says intermediate_size = 2048"},
      {"num_key_value_heads", 3, "tensor 'model.layers.3.self_attn.k_proj.weight'",
       "says num_key_value_heads x head_dim = 192"},
      {"linear_num_value_heads", 8, "tensor 'model.layers.0.linear_attn.in_proj_qkv.weight'",
       "says 2 x linear_num_key_heads x linear_key_head_dim + linear_num_value_heads x linear_value_head_dim = 768"},
  };
  for (const Case& c : cases) {
    TempDir dir;
    demo_copy(dir.path());
    io::json config = read_json(dir / "config.json");
    config["text_config"][c.field] = c.value;
    write_json(dir / "config.json", config);
    const CommandResult r = inspect(dir.path());
    expect_error(r, c.tensor, c.field);
    EXPECT_THAT(r.err, HasSubstr((dir / "config.json").string() + " " + c.says)) << c.field;
  }
  // More layers than stored: the first missing one, with the count that asked for it.
  TempDir dir;
  demo_copy(dir.path());
  io::json config = read_json(dir / "config.json");
  config["text_config"]["num_hidden_layers"] = 12;
  config["text_config"].erase("layer_types");
  write_json(dir / "config.json", config);
  const CommandResult r = inspect(dir.path());
  expect_error(r, "tensor 'model.layers.8.", "num_hidden_layers");
  EXPECT_THAT(r.err, HasSubstr("num_hidden_layers is 12"));

  // A MoE checkpoint with another expert count.
  TempDir moe;
  for (const auto& entry : fs::directory_iterator(kGolden / "qwen3_moe"))
    fs::create_symlink(entry.path(), moe / entry.path().filename());
  fs::remove(moe / "config.json");
  config = read_json(kGolden / "qwen3_moe" / "config.json");
  config["num_experts"] = 16;
  write_json(moe / "config.json", config);
  expect_error(inspect(moe.path()), "tensor 'model.layers.0.mlp.gate.weight'", "num_experts");
  EXPECT_THAT(inspect(moe.path()).err, HasSubstr("says num_experts = 16"));
}

std::string nested(int depth) { return std::string(depth, '[') + std::string(depth, ']'); }

// A file 100,000 levels deep once overflowed the stack in nlohmann's recursive copy (SIGSEGV).
TEST(HostileModel, DeepJsonInAnyModelFileIsAnError) {
  for (const char* name : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}) {
    TempDir dir;
    demo_copy(dir.path());
    write_file(dir / name, "{\"a\": 1, \"rope_parameters\": " + nested(100000) + "}");
    const CommandResult r = run(dir.path());
    expect_error(r, (dir / name).string() + ": ", name);
    EXPECT_THAT(r.err, HasSubstr("nested deeper than 128 levels")) << name;
    if (std::string(name) == "config.json")
      expect_error(inspect(dir.path()), (dir / name).string() + ": rope_parameters: nested deeper than 128", name);
  }
  // chat_template.json is read where tokenizer_config.json has no template.
  TempDir dir;
  demo_copy(dir.path());
  io::json tokenizer_config = read_json(dir / "tokenizer_config.json");
  tokenizer_config.erase("chat_template");
  write_json(dir / "tokenizer_config.json", tokenizer_config);
  write_file(dir / "chat_template.json", "{\"chat_template\": " + nested(100000) + "}");
  expect_error(run(dir.path()), (dir / "chat_template.json").string() + ": nested deeper than 128 levels",
               "chat_template.json");

  TempDir sharded;
  demo_copy(sharded.path());
  write_file(sharded / "model.safetensors.index.json", "{\"weight_map\": " + nested(100000) + "}");
  expect_error(inspect(sharded.path()), "'weight_map' in the index is nested deeper than 128 levels",
               "model.safetensors.index.json");
}

void make_socket(const fs::path& path) {
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  ASSERT_LT(path.string().size(), sizeof address.sun_path);
  std::strcpy(address.sun_path, path.c_str());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ::close(fd);
}

// A FIFO named model.safetensors made inspect wait forever for a writer.
TEST(HostileModel, NonRegularFilesAreErrorsNotHangs) {
  for (const char* name : {"model.safetensors", "config.json", "tokenizer.json"}) {
    const std::pair<std::function<void(const fs::path&)>, const char*> kinds[] = {
        {[](const fs::path& p) { ASSERT_EQ(::mkfifo(p.c_str(), 0600), 0); }, "is a FIFO, not a regular file"},
        {[](const fs::path& p) { fs::create_directory(p); }, "is a directory, not a regular file"},
        {[](const fs::path& p) { fs::create_symlink("/dev/zero", p); }, "is a character device, not a regular file"},
        {make_socket, "is a socket, not a regular file"},
    };
    for (const auto& kind : kinds) {
      TempDir dir;
      demo_copy(dir.path());
      fs::remove(dir / name);
      kind.first(dir / name);
      const std::string message = (dir / name).string() + ": " + kind.second;
      expect_error(run(dir.path()), message, name);
      if (std::string(name) != "tokenizer.json") expect_error(inspect(dir.path()), message, name);
    }
  }
}

// Where tensor `name`'s bytes start in a safetensors file.
uint64_t tensor_offset(const fs::path& file, const std::string& name) {
  io::SafetensorsFile f(file);
  for (const io::TensorInfo& t : f.tensors())
    if (t.name == name) return f.header().data_start + t.data_offset;
  throw std::runtime_error("no tensor " + name);
}

void patch(const fs::path& file, uint64_t offset, std::span<const std::byte> bytes) {
  const uint64_t at = offset;
  std::fstream out(file, std::ios::in | std::ios::out | std::ios::binary);
  out.seekp(static_cast<std::streamoff>(at));
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(out.good());
}

void patch_bf16(const fs::path& file, const std::string& tensor, uint64_t element, uint16_t bits) {
  const std::byte bytes[2] = {static_cast<std::byte>(bits & 0xFF), static_cast<std::byte>(bits >> 8)};
  patch(file, tensor_offset(file, tensor) + 2 * element, bytes);
}

// NaN weights generated "!!!!" with exit 0.
TEST(HostileModel, NonFiniteWeightsFailAtLoadNamingTheTensor) {
  struct Case {
    const char* tensor;
    uint64_t element;
    uint16_t bits;
    const char* value;
  };
  const Case cases[] = {
      {"model.language_model.embed_tokens.weight", 3, 0x7FC0, "nan"},  // a matrix, uploaded as stored
      {"model.language_model.embed_tokens.weight", 3'000'000, 0x7F80, "inf"},  // its third chunk of the scan
      {"model.language_model.layers.2.mlp.down_proj.weight", 3, 0xFF80, "-inf"},
      {"model.language_model.layers.5.linear_attn.A_log", 3, 0x7F80, "inf"},  // a vector, read as f32
      {"model.language_model.norm.weight", 3, 0x7FC1, "nan"},  // a gain the norm layout is read from
  };
  for (const Case& c : cases) {
    TempDir dir;
    demo_copy(dir.path(), /*copy_weights=*/true);
    patch_bf16(dir / "model.safetensors", c.tensor, c.element, c.bits);
    const std::string message = (dir / "model.safetensors").string() + ": tensor '" + c.tensor + "'";
    const CommandResult r = run(dir.path());
    expect_error(r, message, c.tensor);
    EXPECT_THAT(r.err, HasSubstr(fmt::format("holds {} at element {}", c.value, c.element))) << c.tensor;
  }
}

// `qinfer quantize` of a NaN or an infinity wrote scales that are not finite, with exit 0: it refuses,
// naming the tensor, and leaves no shard a later load could take for a model.
TEST(HostileModel, QuantizeRefusesNonFiniteWeights) {
  struct Case {
    const char* tensor;
    uint64_t element;
    uint16_t bits;
    const char* value;
  };
  const Case cases[] = {
      {"model.language_model.layers.2.mlp.down_proj.weight", 70'000, 0x7FC0, "nan"},  // quantized
      {"model.language_model.layers.5.linear_attn.conv1d.weight", 3, 0xFF80, "-inf"},  // kept, reshaped to MLX's
  };
  for (const Case& c : cases) {
    TempDir dir, out;
    demo_copy(dir.path(), /*copy_weights=*/true);
    patch_bf16(dir / "model.safetensors", c.tensor, c.element, c.bits);
    const CommandResult r = qinfer("quantize --model '" + dir.path().string() + "' --out '" + out.path().string() + "'");
    expect_error(r, (dir / "model.safetensors").string() + ": tensor '" + c.tensor + "'", c.tensor);
    EXPECT_THAT(r.err, HasSubstr(fmt::format("holds {} at element {}", c.value, c.element))) << c.tensor;
    EXPECT_FALSE(fs::exists(out / "model.safetensors")) << c.tensor;
    EXPECT_FALSE(fs::exists(out / "config.json")) << c.tensor;
  }
}

// Loads a checkpoint onto the CPU; the Error's message, or "" when it loads.
std::string load_error(const fs::path& dir) {
  try {
    const models::Checkpoint checkpoint = models::open_checkpoint(dir);
    const std::unique_ptr<Ops> ops = make_cpu_ops(global_thread_pool());
    models::Model model(checkpoint, *ops);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

void copy_folder(const fs::path& from, const fs::path& to) {
  for (const auto& entry : fs::directory_iterator(from)) fs::copy_file(entry.path(), to / entry.path().filename());
}

// A quantized weight's codes are integers: its scales and biases are where a bad value shows.
TEST(HostileModel, NonFiniteQuantizationScalesFailAtLoad) {
  TempDir affine;
  copy_folder(kGolden / "qwen3_mlx_8bit", affine.path());
  EXPECT_EQ(load_error(affine.path()), "");
  patch_bf16(affine / "model.safetensors", "model.layers.0.mlp.down_proj.scales", 1, 0x7FC0);
  std::string error = load_error(affine.path());
  EXPECT_THAT(error, HasSubstr((affine / "model.safetensors").string() + ": tensor 'model.layers.0.mlp.down_proj.scales'"));
  EXPECT_THAT(error, HasSubstr("holds nan at element 1"));

  // mxfp4 scales are E8M0 exponents, whose NaN is 0xFF.
  TempDir mx;
  copy_folder(kGolden / "qwen3_5_mlx_mxfp4", mx.path());
  EXPECT_EQ(load_error(mx.path()), "");
  const std::string scales = "language_model.model.layers.0.mlp.down_proj.scales";  // uint8 E8M0 codes
  const std::byte nan[1] = {std::byte{0xFF}};
  patch(mx / "model.safetensors", tensor_offset(mx / "model.safetensors", scales) + 2, nan);
  error = load_error(mx.path());
  EXPECT_THAT(error, HasSubstr("tensor '" + scales + "'"));
  EXPECT_THAT(error, HasSubstr("holds nan at element 2"));
}

TEST(HostileModel, BadNormEpsilonIsAnErrorNotGarbage) {
  for (const io::json& eps : {io::json(-1e-6), io::json(0), io::json(2.0)}) {
    TempDir dir;
    demo_copy(dir.path());
    io::json config = read_json(dir / "config.json");
    config["text_config"]["rms_norm_eps"] = eps;
    write_json(dir / "config.json", config);
    expect_error(run(dir.path()), (dir / "config.json").string() + ": text_config.rms_norm_eps: ", eps.dump());
  }
}

// A rope scaling the kernels do not apply is refused at load, not run with plain frequencies (YaRN
// they apply: tests/cli/eval_test.cpp).
TEST(HostileModel, UnimplementedRopeScalingIsAnError) {
  for (const char* type : {"linear", "llama3"}) {
    TempDir dir;
    demo_copy(dir.path());
    io::json config = read_json(dir / "config.json");
    io::json& rope = config["text_config"]["rope_parameters"];
    rope["rope_type"] = type;
    rope["factor"] = 4.0;
    rope["original_max_position_embeddings"] = 1024;
    write_json(dir / "config.json", config);
    expect_error(run(dir.path()), std::string("rope_type '") + type + "'", "not implemented");
  }
}

}  // namespace
}  // namespace qinfer::testing
