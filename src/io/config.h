#pragma once
// config.json of every Qwen family, read into one normalized structure. Missing keys take the
// defaults HF transformers' config classes give (a table per text model_type, checked against the
// classes themselves by a test); nested `text_config` / `vision_config`, `rope_parameters` vs
// `rope_theta` / `rope_scaling`, `layer_types` vs `full_attention_interval` and MLX `quantization`
// tables are all resolved here, so nothing downstream looks at raw JSON.
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "io/json.h"

namespace qinfer::io {

enum class LayerKind { full_attention, linear_attention };
std::string_view name(LayerKind kind);

struct RopeConfig {
  std::string type = "default";  // default | linear | dynamic | yarn | llama3 | ... (rope_type)
  double theta = 10000.0;
  double partial_rotary_factor = 1.0;
  // Scaling factor for linear / dynamic / yarn; yarn without one: max_position_embeddings / original
  // (HF's default).
  double factor = 1.0;
  // The context the model was trained on; yarn without one: max_position_embeddings (HF's default).
  std::optional<int64_t> original_max_position_embeddings;
  // yarn's optional fields, with HF's defaults (like HF's `or`, a beta of 0 takes its default too).
  double beta_fast = 32.0, beta_slow = 1.0;
  std::optional<double> attention_factor;     // none: from factor (and the two mscales when both are set)
  double mscale = 0.0, mscale_all_dim = 0.0;  // 0: not given
  bool truncate = true;
  std::vector<int64_t> mrope_section;  // empty: 1-D RoPE
  bool mrope_interleaved = false;
  json raw;  // the resolved rope parameters as given, for the scaling types' extra fields
};

struct QuantSpec {
  int bits = 4;
  int group_size = 64;
  std::string mode = "affine";  // affine | mxfp4 | nvfp4 | mxfp8
  bool operator==(const QuantSpec&) const = default;
};

// MLX `quantization` table: global defaults plus per-module overrides keyed by MLX module path
// (`false` = module left unquantized).
struct QuantizationConfig {
  QuantSpec global;
  std::map<std::string, std::optional<QuantSpec>> overrides;
  // The spec for a module whose weight has `.scales` stored (the global one unless overridden);
  // nullopt when the module is explicitly left unquantized.
  std::optional<QuantSpec> for_module(const std::string& module_path) const;
};

struct TextConfig {
  std::string model_type;  // the text model's own type (qwen3, qwen3_5_text, ...)
  int64_t vocab_size = 0, hidden_size = 0, intermediate_size = 0, num_hidden_layers = 0;
  int64_t num_attention_heads = 0, num_key_value_heads = 0, head_dim = 0;
  // The positions the model reads: config.json's max_position_embeddings, or with yarn factor ×
  // original_max_position_embeddings (the context YaRN stretches to, as vLLM sizes it).
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;
  bool attention_bias = false;
  bool attn_output_gate = false;  // q_proj doubled with a per-head sigmoid gate (Next / 3.5)
  RopeConfig rope;
  std::vector<LayerKind> layer_types;  // one per layer
  // Gated DeltaNet (linear attention) dimensions; zero for families without it.
  int64_t linear_num_key_heads = 0, linear_num_value_heads = 0;
  int64_t linear_key_head_dim = 0, linear_value_head_dim = 0, linear_conv_kernel_dim = 0;
  // Mixture of experts; num_experts == 0 means dense MLPs everywhere.
  int64_t num_experts = 0, num_experts_per_tok = 0, moe_intermediate_size = 0;
  int64_t shared_expert_intermediate_size = 0, decoder_sparse_step = 1;
  std::vector<int64_t> mlp_only_layers;
  bool norm_topk_prob = true;
  int64_t mtp_num_hidden_layers = 0;  // MTP draft layers (num_nextn_predict_layers for Qwen3-Next)
  std::string dtype;  // torch_dtype / dtype as written ("bfloat16"), empty when absent

  bool is_moe_layer(int64_t layer) const;
  int64_t rotary_dim() const;  // head_dim * partial_rotary_factor, even
  int64_t linear_key_dim() const { return linear_num_key_heads * linear_key_head_dim; }
  int64_t linear_value_dim() const { return linear_num_value_heads * linear_value_head_dim; }
  int64_t linear_conv_dim() const { return 2 * linear_key_dim() + linear_value_dim(); }
};

struct VisionConfig {
  int64_t depth = 0, hidden_size = 0, num_heads = 0, intermediate_size = 0;
  int64_t patch_size = 16, temporal_patch_size = 2, spatial_merge_size = 2, in_channels = 3;
  int64_t out_hidden_size = 0, num_position_embeddings = 0;
  std::string hidden_act;
  std::vector<int64_t> deepstack_visual_indexes;
};

struct TokenIds {
  std::optional<int64_t> bos, pad;
  std::vector<int64_t> eos;  // eos_token_id may be one id or a list
  std::optional<int64_t> image, video, vision_start, vision_end;
};

struct ModelConfig {
  std::filesystem::path file;  // the config.json read
  std::string model_type;      // top-level model_type
  std::vector<std::string> architectures;
  TextConfig text;
  std::optional<VisionConfig> vision;
  std::optional<QuantizationConfig> quantization;  // MLX table
  std::string foreign_quantization;  // quant_method of a non-MLX quantization_config, e.g. "fp8"
  TokenIds tokens;
  json raw;
};

// Reads `<dir>/config.json` (or the given file). Errors name the file and the field.
ModelConfig load_config(const std::filesystem::path& dir_or_file);
// Same over an already parsed document; `label` names it in errors.
ModelConfig parse_config(const json& document, const std::string& label);
// YaRN by `factor` over the model's original context (`original` positions, else the config's
// original_max_position_embeddings, else max_position_embeddings), as the Qwen model cards describe:
// `--rope-scaling yarn:FACTOR[:ORIGINAL]`. A config that scales its frequencies otherwise (linear,
// dynamic, llama3) is an Error.
void apply_yarn(TextConfig& text, double factor, std::optional<int64_t> original = std::nullopt);
// The HF default values used for a text model_type (exposed for the defaults test).
const json& hf_text_defaults(const std::string& text_model_type);

}  // namespace qinfer::io
