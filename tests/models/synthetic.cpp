#include "synthetic.h"

#include <fmt/format.h>

#include <random>

#include "io/config.h"

namespace qinfer::testing {
namespace {

std::vector<std::byte> bf16_bytes(const std::vector<float>& values) {
  std::vector<uint16_t> bits(values.size());
  for (size_t i = 0; i < values.size(); ++i) bits[i] = f32_to_bf16(values[i]);
  return to_bytes(bits);
}

uint64_t numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// Canonical name -> name as stored by the layout (before expert / conv handling).
std::string stored_name(const std::string& canonical, bool vlm, const SyntheticOptions& o) {
  std::string name = canonical;
  if (o.strip_model_prefix && name.starts_with("model.")) return name.substr(6);
  if (!vlm) return name;
  const bool mlx = o.layout == Layout::mlx;
  if (name.starts_with("model.")) return (mlx ? "language_model.model." : "model.language_model.") + name.substr(6);
  if (name.starts_with("lm_head.")) return mlx ? "language_model." + name : name;
  if (name.starts_with("mtp.")) return mlx ? "language_model." + name : name;
  return name;
}

struct Stored {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};

// Packs random 4-bit codes and bf16 scales / biases in MLX's layout (values need not dequantize to
// anything meaningful: these tests check naming and shapes, not numerics).
void add_quantized(std::vector<Stored>& out, const std::string& base, const std::vector<int64_t>& shape, int bits,
                   std::mt19937& rng) {
  std::vector<int64_t> packed = shape, grouped = shape;
  packed.back() = shape.back() * bits / 32;
  grouped.back() = shape.back() / 64;
  std::vector<uint32_t> words(numel(packed));
  for (auto& w : words) w = rng();
  std::vector<float> scales(numel(grouped), 0.01f), biases(numel(grouped), -0.05f);
  out.push_back({base + ".weight", DType::u32, packed, to_bytes(words)});
  out.push_back({base + ".scales", DType::bf16, grouped, bf16_bytes(scales)});
  out.push_back({base + ".biases", DType::bf16, grouped, bf16_bytes(biases)});
}

}  // namespace

io::json tiny_config(const std::string& model_type) {
  io::json text = {{"hidden_size", 64}, {"num_hidden_layers", 4}, {"num_attention_heads", 4},
                   {"num_key_value_heads", 2}, {"head_dim", 16}, {"intermediate_size", 128},
                   {"vocab_size", 96}, {"rms_norm_eps", 1e-6}, {"max_position_embeddings", 4096},
                   {"tie_word_embeddings", false}};
  if (model_type == "qwen3") {
    text["tie_word_embeddings"] = true;
    text["num_hidden_layers"] = 2;
  }
  if (model_type == "qwen3_moe" || model_type == "qwen3_next" || model_type == "qwen3_5_moe") {
    text.update({{"num_experts", 4}, {"num_experts_per_tok", 2}, {"moe_intermediate_size", 64},
                 {"norm_topk_prob", true}});
  }
  if (model_type == "qwen3_moe") text.update({{"num_hidden_layers", 3}, {"mlp_only_layers", {1}}});
  if (model_type == "qwen3_next" || model_type.starts_with("qwen3_5")) {
    text.update({{"linear_num_key_heads", 2}, {"linear_num_value_heads", 4}, {"linear_key_head_dim", 16},
                 {"linear_value_head_dim", 16}, {"linear_conv_kernel_dim", 4}, {"full_attention_interval", 4},
                 {"partial_rotary_factor", 0.25}});
  }
  if (model_type == "qwen3_next" || model_type == "qwen3_5_moe") text["shared_expert_intermediate_size"] = 64;
  if (model_type == "qwen3_next") text["num_nextn_predict_layers"] = 1;
  if (!model_type.starts_with("qwen3_5")) {
    text["model_type"] = model_type;
    return text;
  }
  // Qwen3.5 checkpoints are VLM configs with a nested text config and rope_parameters.
  text.erase("partial_rotary_factor");
  text["model_type"] = model_type + "_text";
  text["mtp_num_hidden_layers"] = 1;
  text["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e7}, {"partial_rotary_factor", 0.25},
                             {"mrope_section", {1, 1, 0}}, {"mrope_interleaved", true}};
  return {{"model_type", model_type},
          {"architectures", {model_type == "qwen3_5" ? "Qwen3_5ForConditionalGeneration"
                                                     : "Qwen3_5MoeForConditionalGeneration"}},
          {"text_config", text},
          {"vision_config", {{"depth", 1}, {"hidden_size", 32}, {"num_heads", 2}, {"intermediate_size", 64},
                             {"out_hidden_size", 64}, {"num_position_embeddings", 16}}},
          {"tie_word_embeddings", false}};
}

std::map<std::string, CanonicalValues> write_synthetic(const std::filesystem::path& dir, const io::json& config_json,
                                                       const SyntheticOptions& o) {
  io::json config_to_write = config_json;
  if (o.quantize) {
    config_to_write["quantization"] = {{"group_size", 64}, {"bits", 4}, {"mode", "affine"}};
    config_to_write["quantization_config"] = config_to_write["quantization"];
  }
  write_file(dir / "config.json", config_to_write.dump(2));
  io::ModelConfig config = io::parse_config(config_to_write, "config.json");
  const models::Family& family = models::family_for(config);
  const bool vlm = family.rules.vlm_naming;
  const bool zero_centred = family.rules.zero_centred_norms;
  const bool mlx = o.layout == Layout::mlx;
  std::vector<io::ExpectedTensor> expected = family.rules.expected(config.text, o.with_mtp);

  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::map<std::string, CanonicalValues> values;
  std::vector<Stored> stored;
  std::vector<std::byte> pending_gate;  // HF fuses gate and up: written when the up half arrives
  for (const io::ExpectedTensor& e : expected) {
    const bool norm = zero_centred && io::is_zero_centred_norm(e.name);
    CanonicalValues v{e.shape, std::vector<float>(numel(e.shape))};
    for (float& x : v.gamma) x = (norm ? 1.0f : 0.0f) + normal(rng);
    // What the file stores: HF keeps zero-centred gains as γ−1, MLX conversion adds the 1.
    std::vector<float> as_stored = v.gamma;
    if (norm && !mlx && !o.gains_already_shifted)
      for (float& x : as_stored) x -= 1.0f;
    values[e.name] = v;

    std::string name = stored_name(e.name, vlm, o);
    const bool is_mtp = e.name.starts_with("mtp.");
    if (o.quantize && e.quantizable && e.shape.back() % 64 == 0) {
      std::string base = name.substr(0, name.size() - 7);
      if (auto at = base.find(".mlp.experts."); at != std::string::npos) base.replace(at, 13, ".mlp.switch_mlp.");
      const bool router = base.ends_with(".mlp.gate") || base.ends_with(".shared_expert_gate");
      add_quantized(stored, base, e.shape, router ? 8 : 4, rng);
      if (router) config_to_write["quantization"][base] = {{"group_size", 64}, {"bits", 8}};
      continue;
    }
    std::vector<std::byte> bytes = bf16_bytes(as_stored);
    if (e.name.ends_with(".conv1d.weight")) {
      std::vector<int64_t> shape = mlx ? std::vector<int64_t>{e.shape[0], e.shape[1], 1}
                                       : std::vector<int64_t>{e.shape[0], 1, e.shape[1]};
      stored.push_back({name, DType::bf16, shape, bytes});
      continue;
    }
    const auto experts_at = name.find(".mlp.experts.");
    if (experts_at != std::string::npos) {
      const std::string base = name.substr(0, experts_at) + ".mlp.";
      const std::string proj = name.substr(experts_at + 13);  // gate_proj.weight / up_proj.weight / down_proj.weight
      const int64_t count = e.shape[0];
      std::vector<int64_t> one(e.shape.begin() + 1, e.shape.end());
      const size_t expert_bytes = bytes.size() / static_cast<size_t>(count);
      const bool fused_hf = vlm && !mlx && !(is_mtp && o.mtp_per_expert);
      if (mlx) {
        stored.push_back({base + "switch_mlp." + proj, DType::bf16, e.shape, bytes});
      } else if (fused_hf) {
        if (proj == "down_proj.weight") {
          stored.push_back({base + "experts.down_proj", DType::bf16, e.shape, bytes});
        } else {
          if (proj == "gate_proj.weight") {
            pending_gate = bytes;
          } else {
            std::vector<std::byte> fused;
            for (int64_t x = 0; x < count; ++x) {
              fused.insert(fused.end(), pending_gate.begin() + x * expert_bytes,
                           pending_gate.begin() + (x + 1) * expert_bytes);
              fused.insert(fused.end(), bytes.begin() + x * expert_bytes, bytes.begin() + (x + 1) * expert_bytes);
            }
            stored.push_back({base + "experts.gate_up_proj", DType::bf16, {count, 2 * e.shape[1], e.shape[2]}, fused});
          }
        }
      } else {
        for (int64_t x = 0; x < count; ++x)
          stored.push_back({fmt::format("{}experts.{}.{}", base, x, proj), DType::bf16, one,
                            std::vector<std::byte>(bytes.begin() + x * expert_bytes,
                                                   bytes.begin() + (x + 1) * expert_bytes)});
      }
      continue;
    }
    stored.push_back({name, DType::bf16, e.shape, bytes});
  }
  if (o.store_tied_head) {
    const CanonicalValues& embed = values.at("model.embed_tokens.weight");
    stored.push_back({stored_name("lm_head.weight", vlm, o), DType::bf16, embed.shape, bf16_bytes(embed.gamma)});
  }
  if (o.with_vision) {
    const std::string prefix = mlx ? "vision_tower." : "model.visual.";
    stored.push_back({prefix + "patch_embed.proj.weight", DType::bf16, {32, 3, 2, 16, 16},
                      bf16_bytes(std::vector<float>(32 * 3 * 2 * 16 * 16, 0.01f))});
    stored.push_back({prefix + "blocks.0.norm1.weight", DType::bf16, {32}, bf16_bytes(std::vector<float>(32, 1.0f))});
  }
  SafetensorsWriter writer;
  for (Stored& s : stored) writer.add(s.name, s.dtype, s.shape, std::move(s.data));
  writer.write(dir / "model.safetensors");
  if (o.quantize) write_file(dir / "config.json", config_to_write.dump(2));
  return values;
}

}  // namespace qinfer::testing
