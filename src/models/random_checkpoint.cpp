#include "models/random_checkpoint.h"

#include <cmath>
#include <fstream>

#include "core/error.h"
#include "core/progress.h"
#include "core/thread_pool.h"
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
  struct Hybrid {
    const char* name;
    int64_t hidden, layers, heads, kv, value_heads, intermediate, experts, moe_intermediate;
    bool tied;
  };
  static constexpr Hybrid kHybrids[] = {
      {"qwen3_5-0.8b", 1024, 24, 8, 2, 16, 3584, 0, 0, true},
      {"qwen3_5-4b", 2560, 32, 16, 4, 32, 9216, 0, 0, true},
      {"qwen3_5-9b", 4096, 32, 16, 4, 32, 12288, 0, 0, false},
      {"qwen3_5-27b", 5120, 64, 24, 4, 48, 17408, 0, 0, false},
      {"qwen3_5-35b-a3b", 2048, 40, 16, 2, 32, 0, 256, 512, false},
      {"qwen3_5-122b-a10b", 3072, 48, 32, 2, 64, 0, 256, 1024, false},
  };
  struct Plain {
    const char* name;
    int64_t hidden, layers, heads, kv, intermediate, experts, moe_intermediate;
    bool tied;
  };
  static constexpr Plain kPlain[] = {
      {"qwen3-0.6b", 1024, 28, 16, 8, 3072, 0, 0, true},
      {"qwen3-8b", 4096, 36, 32, 8, 12288, 0, 0, false},
      {"qwen3-32b", 5120, 64, 64, 8, 25600, 0, 0, false},
      {"qwen3-30b-a3b", 2048, 48, 32, 4, 6144, 128, 768, false},
  };
  for (const Hybrid& d : kHybrids) {
    if (name != d.name) continue;
    const bool moe = d.experts > 0;
    io::json text = {{"model_type", moe ? "qwen3_5_moe_text" : "qwen3_5_text"}, {"hidden_size", d.hidden},
                     {"num_hidden_layers", d.layers}, {"num_attention_heads", d.heads},
                     {"num_key_value_heads", d.kv}, {"head_dim", 256}, {"vocab_size", 248320},
                     {"linear_num_key_heads", 16}, {"linear_num_value_heads", d.value_heads},
                     {"linear_key_head_dim", 128}, {"linear_value_head_dim", 128}, {"linear_conv_kernel_dim", 4},
                     {"full_attention_interval", 4}, {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 262144},
                     {"mtp_num_hidden_layers", 0}, {"tie_word_embeddings", d.tied},
                     {"rope_parameters",
                      {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25},
                       {"mrope_section", {11, 11, 10}}, {"mrope_interleaved", true}}}};
    if (moe) {
      text["num_experts"] = d.experts;
      text["num_experts_per_tok"] = 8;
      text["moe_intermediate_size"] = d.moe_intermediate;
      text["shared_expert_intermediate_size"] = d.moe_intermediate;
    } else {
      text["intermediate_size"] = d.intermediate;
    }
    return {{"model_type", moe ? "qwen3_5_moe" : "qwen3_5"},
            {"torch_dtype", "bfloat16"},
            {"tie_word_embeddings", d.tied},
            {"text_config", text}};
  }
  for (const Plain& d : kPlain) {
    if (name != d.name) continue;
    io::json config = {{"model_type", d.experts > 0 ? "qwen3_moe" : "qwen3"}, {"torch_dtype", "bfloat16"},
                       {"hidden_size", d.hidden}, {"num_hidden_layers", d.layers}, {"num_attention_heads", d.heads},
                       {"num_key_value_heads", d.kv}, {"head_dim", 128}, {"intermediate_size", d.intermediate},
                       {"vocab_size", 151936}, {"rms_norm_eps", 1e-6}, {"rope_theta", 1e6},
                       {"max_position_embeddings", 40960}, {"tie_word_embeddings", d.tied}};
    if (d.experts > 0) {
      config["num_experts"] = d.experts;
      config["num_experts_per_tok"] = 8;
      config["moe_intermediate_size"] = d.moe_intermediate;
      config["norm_topk_prob"] = true;
      config["decoder_sparse_step"] = 1;
      config["mlp_only_layers"] = io::json::array();
    }
    return config;
  }
  std::string known;
  for (const Hybrid& d : kHybrids) known += std::string(known.empty() ? "" : ", ") + d.name;
  for (const Plain& d : kPlain) known += std::string(", ") + d.name;
  fail("unknown model shape '{}' (known: {})", name, known);
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
  // Each 1 Mi-element chunk has its own generator stream, so chunks fill in parallel and the file
  // does not depend on the thread count.
  constexpr uint64_t kChunk = uint64_t{1} << 20, kChunksPerPass = 64;
  ThreadPool& pool = global_thread_pool();
  std::vector<uint16_t> buffer(kChunk * kChunksPerPass);
  for (size_t index = 0; index < expected.size(); ++index) {
    const io::ExpectedTensor& e = expected[index];
    uint64_t n = 1;
    for (int64_t d : e.shape) n *= static_cast<uint64_t>(d);
    // Zero-centred and plain norm gains both load as ~1; matrices get a 1/sqrt(fan_in) spread.
    const bool gain = e.shape.size() == 1;
    const float center = gain && !(family.rules.zero_centred_norms && io::is_zero_centred_norm(e.name)) ? 1.0f : 0.0f;
    const float spread = gain ? 0.05f : 1.0f / std::sqrt(static_cast<float>(e.shape.back()));
    for (uint64_t done = 0; done < n;) {
      const uint64_t count = std::min<uint64_t>(n - done, kChunk * kChunksPerPass);
      const uint64_t first_chunk = done / kChunk;
      pool.parallel_for((count + kChunk - 1) / kChunk, [&](size_t begin, size_t end) {
        for (size_t c = begin; c < end; ++c) {
          uint64_t state = seed ^ (index * 0x9E3779B97F4A7C15ull) ^ ((first_chunk + c) << 20);
          const uint64_t stop = std::min<uint64_t>(count, (c + 1) * kChunk);
          for (uint64_t i = c * kChunk; i < stop; ++i) {
            // Uniform in [-sqrt(3), sqrt(3)]·spread: unit variance before scaling.
            const float u = static_cast<float>(splitmix64(state) >> 40) / static_cast<float>(1 << 24);
            buffer[i] = f32_to_bf16(center + spread * 1.7320508f * (2.0f * u - 1.0f));
          }
        }
      });
      writer.write(std::as_bytes(std::span(buffer.data(), count)));
      progress.advance(2 * count);
      done += count;
    }
  }
  writer.finish();
}

}  // namespace qinfer::models
