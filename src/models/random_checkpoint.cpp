#include "models/random_checkpoint.h"

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "core/progress.h"
#include "io/safetensors_writer.h"
#include "models/registry.h"

namespace qinfer::models {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace

io::json released_shape(const std::string& name) {
  // Dimensions of the released checkpoints (qwen-spec §13).
  if (name == "qwen3_5-0.8b" || name == "qwen3_5-4b" || name == "qwen3_5-9b") {
    struct Dims { int64_t hidden, layers, heads, kv, value_heads, intermediate; bool tied; };
    const Dims d = name == "qwen3_5-0.8b" ? Dims{1024, 24, 8, 2, 16, 3584, true}
                   : name == "qwen3_5-4b" ? Dims{2560, 32, 16, 4, 32, 9216, true}
                                          : Dims{4096, 32, 16, 4, 32, 12288, false};
    return {{"model_type", "qwen3_5"},
            {"torch_dtype", "bfloat16"},
            {"tie_word_embeddings", d.tied},
            {"text_config",
             {{"model_type", "qwen3_5_text"}, {"hidden_size", d.hidden}, {"num_hidden_layers", d.layers},
              {"num_attention_heads", d.heads}, {"num_key_value_heads", d.kv}, {"head_dim", 256},
              {"intermediate_size", d.intermediate}, {"vocab_size", 248320}, {"linear_num_key_heads", 16},
              {"linear_num_value_heads", d.value_heads}, {"linear_key_head_dim", 128},
              {"linear_value_head_dim", 128}, {"linear_conv_kernel_dim", 4}, {"full_attention_interval", 4},
              {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 262144}, {"mtp_num_hidden_layers", 0},
              {"rope_parameters",
               {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25},
                {"mrope_section", {11, 11, 10}}, {"mrope_interleaved", true}}}}}};
  }
  if (name == "qwen3-0.6b" || name == "qwen3-8b") {
    const bool small = name == "qwen3-0.6b";
    return {{"model_type", "qwen3"}, {"torch_dtype", "bfloat16"}, {"hidden_size", small ? 1024 : 4096}, {"num_hidden_layers", small ? 28 : 36},
            {"num_attention_heads", small ? 16 : 32}, {"num_key_value_heads", 8}, {"head_dim", 128},
            {"intermediate_size", small ? 3072 : 12288}, {"vocab_size", 151936}, {"rms_norm_eps", 1e-6},
            {"rope_theta", 1e6}, {"max_position_embeddings", 40960}, {"tie_word_embeddings", small}};
  }
  fail("unknown model shape '{}' (known: qwen3_5-0.8b, qwen3_5-4b, qwen3_5-9b, qwen3-0.6b, qwen3-8b)", name);
}

void write_random_checkpoint(const std::filesystem::path& dir, const io::json& config_json, uint64_t seed) {
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "config.json") << config_json.dump(2);
  const io::ModelConfig config = io::parse_config(config_json, (dir / "config.json").string());
  const Family& family = family_for(config);
  const std::vector<io::ExpectedTensor> expected = family.rules.expected(config.text, false);

  std::vector<io::TensorDeclaration> declarations;
  uint64_t total = 0;
  for (const io::ExpectedTensor& e : expected) {
    std::vector<int64_t> shape = e.shape;
    if (e.name.ends_with(".conv1d.weight")) shape = {shape[0], 1, shape[1]};  // HF layout
    declarations.push_back({e.name, DType::bf16, shape});
    uint64_t n = 1;
    for (int64_t d : shape) n *= static_cast<uint64_t>(d);
    total += 2 * n;
  }
  io::SafetensorsWriter writer(dir / "model.safetensors", declarations, {{"format", "pt"}});
  ProgressBar progress("writing random weights", total, ProgressBar::Unit::bytes);
  uint64_t state = seed;
  for (const io::ExpectedTensor& e : expected) {
    uint64_t n = 1;
    for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
    // Zero-centred and plain norm gains both load as ~1; matrices get a 1/sqrt(fan_in) spread.
    const bool gain = e.shape.size() == 1;
    const float center = gain && !(family.rules.zero_centred_norms && io::is_zero_centred_norm(e.name)) ? 1.0f : 0.0f;
    const float spread = gain ? 0.05f : 1.0f / std::sqrt(static_cast<float>(e.shape.back()));
    std::vector<uint16_t> chunk;
    for (uint64_t done = 0; done < n;) {
      const uint64_t count = std::min<uint64_t>(n - done, 1 << 20);
      chunk.resize(count);
      for (uint64_t i = 0; i < count; ++i) {
        // Uniform in [-sqrt(3), sqrt(3)]·spread: unit variance before scaling.
        const float u = static_cast<float>(splitmix64(state) >> 40) / static_cast<float>(1 << 24);
        chunk[i] = f32_to_bf16(center + spread * 1.7320508f * (2.0f * u - 1.0f));
      }
      writer.write(std::as_bytes(std::span(chunk)));
      progress.advance(2 * count);
      done += count;
    }
  }
  writer.finish();
}

}  // namespace qinfer::models
