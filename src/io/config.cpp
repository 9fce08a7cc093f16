#include "io/config.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/error.h"

namespace qinfer::io {
namespace {

// HF transformers' defaults per text model_type: the values a default-constructed config class has.
// tests/io/config_test.cpp compares this table with tests/fixtures/golden/hf_config_defaults.json,
// which tools/make_golden.py dumps from the classes themselves.
const json& defaults_table() {
  static const json table = json::parse(R"({
    "qwen3": {
      "vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 32, "head_dim": 128, "max_position_embeddings": 32768,
      "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "rope_theta": 10000.0, "attention_bias": false,
      "partial_rotary_factor": 1.0, "attn_output_gate": false, "hybrid": false
    },
    "qwen3_moe": {
      "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 24,
      "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": null, "max_position_embeddings": 32768,
      "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "rope_theta": 10000.0, "attention_bias": false,
      "partial_rotary_factor": 1.0, "attn_output_gate": false, "hybrid": false,
      "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
      "mlp_only_layers": [], "norm_topk_prob": false
    },
    "qwen3_next": {
      "vocab_size": 151936, "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 48,
      "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "max_position_embeddings": 32768,
      "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "rope_theta": 10000.0, "attention_bias": false,
      "partial_rotary_factor": 0.25, "attn_output_gate": true, "hybrid": true, "full_attention_interval": 4,
      "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
      "linear_num_key_heads": 16, "linear_num_value_heads": 32,
      "num_experts": 512, "num_experts_per_tok": 10, "moe_intermediate_size": 512,
      "shared_expert_intermediate_size": 512, "decoder_sparse_step": 1, "mlp_only_layers": [],
      "norm_topk_prob": true, "mtp_num_hidden_layers": 1
    },
    "qwen3_5_text": {
      "vocab_size": 248320, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 32,
      "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 256, "max_position_embeddings": 32768,
      "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "rope_theta": 10000.0, "attention_bias": false,
      "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10], "mrope_interleaved": true,
      "attn_output_gate": true, "hybrid": true, "full_attention_interval": 4,
      "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
      "linear_num_key_heads": 16, "linear_num_value_heads": 32,
      "num_experts": 0, "mtp_num_hidden_layers": 1
    },
    "qwen3_5_moe_text": {
      "vocab_size": 248320, "hidden_size": 2048, "intermediate_size": null, "num_hidden_layers": 40,
      "num_attention_heads": 16, "num_key_value_heads": 2, "head_dim": 256, "max_position_embeddings": 32768,
      "rms_norm_eps": 1e-6, "tie_word_embeddings": false, "rope_theta": 10000.0, "attention_bias": false,
      "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10], "mrope_interleaved": true,
      "attn_output_gate": true, "hybrid": true, "full_attention_interval": 4,
      "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
      "linear_num_key_heads": 16, "linear_num_value_heads": 32,
      "num_experts": 256, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
      "shared_expert_intermediate_size": 512, "norm_topk_prob": true, "every_layer_moe": true,
      "mtp_num_hidden_layers": 1
    }
  })");
  return table;
}

// Qwen3.5 VLM checkpoints name their text config by these types; a flat config uses the outer type.
std::string text_type_for(const std::string& model_type) {
  if (model_type == "qwen3_5") return "qwen3_5_text";
  if (model_type == "qwen3_5_moe") return "qwen3_5_moe_text";
  return model_type;
}

const json kVisionDefaults = json::parse(R"({
  "depth": 27, "hidden_size": 1152, "num_heads": 16, "intermediate_size": 4304, "patch_size": 16,
  "temporal_patch_size": 2, "spatial_merge_size": 2, "in_channels": 3, "out_hidden_size": 3584,
  "num_position_embeddings": 2304, "hidden_act": "gelu_pytorch_tanh", "deepstack_visual_indexes": []
})");

// Reads `key` from `given`, else from the defaults object (which may hold null = "derived").
struct Fields {
  const JsonObject& given;
  const json& defaults;

  std::optional<int64_t> int_opt(std::string_view key) const {
    if (auto v = given.int_opt(key)) return v;
    auto it = defaults.find(key);
    if (it == defaults.end() || it->is_null()) return std::nullopt;
    return it->get<int64_t>();
  }
  int64_t int_req(std::string_view key) const {
    auto v = int_opt(key);
    QINFER_CHECK(v.has_value(), "{}: required field is missing", given.where(key));
    return *v;
  }
  int64_t int_or(std::string_view key, int64_t fallback) const { return int_opt(key).value_or(fallback); }
  double number_or(std::string_view key, double fallback) const {
    if (auto v = given.number_opt(key)) return *v;
    auto it = defaults.find(key);
    return it == defaults.end() || it->is_null() ? fallback : it->get<double>();
  }
  bool bool_or(std::string_view key, bool fallback) const {
    if (auto v = given.bool_opt(key)) return *v;
    auto it = defaults.find(key);
    return it == defaults.end() || it->is_null() ? fallback : it->get<bool>();
  }
  std::vector<int64_t> ints_or_empty(std::string_view key) const {
    if (auto v = given.ints_opt(key)) return *v;
    auto it = defaults.find(key);
    return it == defaults.end() || it->is_null() ? std::vector<int64_t>{} : it->get<std::vector<int64_t>>();
  }
};

// Upper bounds on config sizes, checked before anything is sized by them. Each is 16x or more above
// the largest value of any released Qwen model (94 layers, hidden 8192, intermediate 29568, 96 heads,
// head_dim 256, vocab 248320, 512 experts, ~1M positions), so only a corrupt config.json meets one,
// and the products of any of them still fit in 64 bits.
constexpr int64_t kMaxLayers = 4096, kMaxHidden = 1 << 20, kMaxIntermediate = 1 << 22, kMaxHeads = 1 << 14,
                  kMaxHeadDim = 1 << 14, kMaxVocab = 1 << 24, kMaxExperts = 1 << 16, kMaxPositions = 1 << 24,
                  kMaxKernel = 1 << 10;

void check_range(const JsonObject& obj, std::string_view key, int64_t value, int64_t min, int64_t max) {
  QINFER_CHECK(value >= min, "{}: must be {}, got {}", obj.where(key),
               min == 1 ? "a positive integer" : fmt::format("an integer of at least {}", min), value);
  QINFER_CHECK(value <= max, "{}: {} is above the limit of {} (far beyond any Qwen model: a corrupt config?)",
               obj.where(key), value, max);
}

void check_size(const JsonObject& obj, std::string_view key, int64_t value, int64_t max) {
  check_range(obj, key, value, 1, max);
}

// Floats that scale the math: a zero, negative or out-of-range one makes every output garbage.
void check_real(const JsonObject& obj, std::string_view key, double value, double min_exclusive, double max) {
  QINFER_CHECK(value > min_exclusive && value <= max, "{}: {} is outside ({}, {}]", obj.where(key), value,
               min_exclusive, max);
}

void check_positive_real(const JsonObject& obj, std::string_view key, double value) {
  QINFER_CHECK(std::isfinite(value) && value > 0, "{}: must be a positive number, got {}", obj.where(key), value);
}

QuantSpec parse_quant_spec(const JsonObject& obj, QuantSpec base) {
  QuantSpec spec = base;
  if (auto bits = obj.int_opt("bits")) spec.bits = static_cast<int>(*bits);
  if (auto gs = obj.int_opt("group_size")) spec.group_size = static_cast<int>(*gs);
  if (auto mode = obj.string_opt("mode")) spec.mode = *mode;
  return spec;
}

void validate_quant_spec(const QuantSpec& spec, const std::string& where) {
  if (spec.mode == "affine") {
    static constexpr int kBits[] = {2, 3, 4, 5, 6, 8};
    QINFER_CHECK(std::find(std::begin(kBits), std::end(kBits), spec.bits) != std::end(kBits),
                 "{}: affine bits must be one of 2, 3, 4, 5, 6, 8, got {}", where, spec.bits);
    QINFER_CHECK(spec.group_size == 32 || spec.group_size == 64 || spec.group_size == 128,
                 "{}: affine group_size must be 32, 64 or 128, got {}", where, spec.group_size);
    return;
  }
  struct Fixed { const char* mode; int bits; int group; };
  static constexpr Fixed kFixed[] = {{"mxfp4", 4, 32}, {"nvfp4", 4, 16}, {"mxfp8", 8, 32}};
  for (const Fixed& f : kFixed) {
    if (spec.mode != f.mode) continue;
    QINFER_CHECK(spec.bits == f.bits && spec.group_size == f.group,
                 "{}: mode {} needs bits {} and group_size {}, got bits {} and group_size {}", where, f.mode,
                 f.bits, f.group, spec.bits, spec.group_size);
    return;
  }
  fail("{}: unknown quantization mode '{}' (expected affine, mxfp4, nvfp4 or mxfp8)", where, spec.mode);
}

// MLX writes `quantization` (and an identical `quantization_config`); other tools write a
// `quantization_config` with a `quant_method`, which is not an MLX table.
void parse_quantization(const JsonObject& top, ModelConfig& config) {
  std::optional<JsonObject> table = top.object_opt("quantization");
  if (!table) table = top.object_opt("quantization_config");
  if (!table) return;
  if (auto method = table->string_opt("quant_method")) {
    config.foreign_quantization = *method;
    return;
  }
  QuantizationConfig q;
  q.global = parse_quant_spec(*table, QuantSpec{});
  validate_quant_spec(q.global, table->where("bits/group_size/mode"));
  for (const auto& [key, value] : table->raw().items()) {
    if (key == "bits" || key == "group_size" || key == "mode") continue;
    if (value.is_boolean()) {
      q.overrides[key] = value.get<bool>() ? std::optional<QuantSpec>(q.global) : std::nullopt;
    } else if (value.is_object()) {
      // A per-module dict is passed to MLX's to_quantized as keyword arguments, so missing keys take
      // MLX's own defaults (group 64, 4 bits, affine), not the global ones.
      QuantSpec spec = parse_quant_spec(JsonObject(value, table->where(key)), QuantSpec{});
      validate_quant_spec(spec, table->where(key));
      q.overrides[key] = spec;
    } else {
      fail("{}: expected an object of quantization parameters or false", table->where(key));
    }
  }
  config.quantization = std::move(q);
}

// rope_type yarn's own fields; the absent ones resolve as transformers 5 resolves them
// (standardize_rope_params, then _compute_yarn_parameters).
void parse_yarn(const JsonObject& params, int64_t max_positions, RopeConfig& rope) {
  if (!rope.original_max_position_embeddings) rope.original_max_position_embeddings = max_positions;
  if (!params.has("factor"))
    rope.factor = static_cast<double>(max_positions) / static_cast<double>(*rope.original_max_position_embeddings);
  for (const auto& [key, beta] : {std::pair{"beta_fast", &rope.beta_fast}, std::pair{"beta_slow", &rope.beta_slow}}) {
    const std::optional<double> given = params.number_opt(key);
    if (!given || *given == 0) continue;
    check_positive_real(params, key, *given);
    *beta = *given;
  }
  rope.attention_factor = params.number_opt("attention_factor");
  if (rope.attention_factor) check_positive_real(params, "attention_factor", *rope.attention_factor);
  rope.mscale = params.number_opt("mscale").value_or(0.0);
  rope.mscale_all_dim = params.number_opt("mscale_all_dim").value_or(0.0);
  rope.truncate = params.bool_opt("truncate").value_or(true);
}

// The positions a YaRN model reads: factor × its original context (as vLLM sizes it).
int64_t yarn_positions(const RopeConfig& rope, std::string_view where) {
  const double positions = std::floor(rope.factor * static_cast<double>(*rope.original_max_position_embeddings));
  QINFER_CHECK(positions >= 1 && positions <= static_cast<double>(kMaxPositions),
               "{}: yarn factor {} x original_max_position_embeddings {} gives {} positions, outside 1..{}", where,
               rope.factor, *rope.original_max_position_embeddings, positions, kMaxPositions);
  return static_cast<int64_t>(positions);
}

RopeConfig parse_rope(const JsonObject& text, const Fields& f, int64_t max_positions) {
  RopeConfig rope;
  std::optional<JsonObject> params = text.object_opt("rope_parameters");
  if (!params) params = text.object_opt("rope_scaling");
  auto from_params_number = [&](std::string_view key) -> std::optional<double> {
    return params ? params->number_opt(key) : std::nullopt;
  };
  rope.theta = from_params_number("rope_theta").value_or(f.number_or("rope_theta", 10000.0));
  rope.partial_rotary_factor =
      from_params_number("partial_rotary_factor").value_or(f.number_or("partial_rotary_factor", 1.0));
  rope.mrope_section = f.ints_or_empty("mrope_section");
  rope.mrope_interleaved = f.bool_or("mrope_interleaved", false);
  if (params) {
    rope.raw = params->raw();
    if (auto type = params->string_opt("rope_type")) rope.type = *type;
    else if (auto legacy = params->string_opt("type")) rope.type = *legacy;
    rope.factor = params->number_opt("factor").value_or(1.0);
    rope.original_max_position_embeddings = params->int_opt("original_max_position_embeddings");
    if (auto section = params->ints_opt("mrope_section")) rope.mrope_section = *section;
    if (auto interleaved = params->bool_opt("mrope_interleaved")) rope.mrope_interleaved = *interleaved;
  }
  // Each value is checked where it was read from, so the error names that field.
  const auto owner = [&](std::string_view key) -> const JsonObject& {
    return params && params->has(key) ? *params : text;
  };
  check_positive_real(owner("rope_theta"), "rope_theta", rope.theta);
  check_real(owner("partial_rotary_factor"), "partial_rotary_factor", rope.partial_rotary_factor, 0, 1);
  if (params) check_positive_real(*params, "factor", rope.factor);
  if (rope.original_max_position_embeddings)
    check_size(*params, "original_max_position_embeddings", *rope.original_max_position_embeddings, kMaxPositions);
  for (int64_t section : rope.mrope_section)
    check_range(owner("mrope_section"), "mrope_section", section, 0, kMaxHeadDim);
  if (params && rope.type == "yarn") parse_yarn(*params, max_positions, rope);
  static constexpr std::string_view kTypes[] = {"default", "linear", "dynamic", "yarn", "llama3", "mrope"};
  QINFER_CHECK(std::find(std::begin(kTypes), std::end(kTypes), rope.type) != std::end(kTypes),
               "{}: unsupported rope_type '{}' (supported: default, linear, dynamic, yarn, llama3, mrope)",
               text.where(params ? "rope_parameters.rope_type" : "rope_type"), rope.type);
  return rope;
}

std::vector<LayerKind> parse_layer_types(const JsonObject& text, const Fields& f, int64_t layers, bool hybrid) {
  std::vector<LayerKind> kinds;
  if (auto given = text.strings_opt("layer_types")) {
    QINFER_CHECK(static_cast<int64_t>(given->size()) == layers,
                 "{}: has {} entries but num_hidden_layers is {}", text.where("layer_types"), given->size(), layers);
    for (size_t i = 0; i < given->size(); ++i) {
      const std::string& t = (*given)[i];
      if (t == "full_attention") kinds.push_back(LayerKind::full_attention);
      else if (t == "linear_attention" && hybrid) kinds.push_back(LayerKind::linear_attention);
      else
        fail("{}[{}]: unsupported layer type '{}' for this model (expected {})", text.where("layer_types"), i, t,
             hybrid ? "full_attention or linear_attention" : "full_attention");
    }
    return kinds;
  }
  // HF derives the pattern when layer_types is absent: every interval-th layer is full attention.
  const int64_t interval = hybrid ? f.int_or("full_attention_interval", 4) : 1;
  check_size(text, "full_attention_interval", interval, kMaxLayers);
  for (int64_t i = 0; i < layers; ++i)
    kinds.push_back((i + 1) % interval == 0 ? LayerKind::full_attention : LayerKind::linear_attention);
  return kinds;
}

TextConfig parse_text(const JsonObject& top, const JsonObject& text, const std::string& text_type) {
  const json& defaults = hf_text_defaults(text_type);
  Fields f{text, defaults};
  TextConfig t;
  t.model_type = text_type;
  t.vocab_size = f.int_req("vocab_size");
  t.hidden_size = f.int_req("hidden_size");
  t.num_hidden_layers = f.int_req("num_hidden_layers");
  t.num_attention_heads = f.int_req("num_attention_heads");
  t.num_key_value_heads = f.int_or("num_key_value_heads", t.num_attention_heads);
  check_size(text, "vocab_size", t.vocab_size, kMaxVocab);
  check_size(text, "hidden_size", t.hidden_size, kMaxHidden);
  check_size(text, "num_hidden_layers", t.num_hidden_layers, kMaxLayers);
  check_size(text, "num_attention_heads", t.num_attention_heads, kMaxHeads);
  check_size(text, "num_key_value_heads", t.num_key_value_heads, kMaxHeads);
  t.head_dim = f.int_or("head_dim", t.hidden_size / t.num_attention_heads);
  check_size(text, "head_dim", t.head_dim, kMaxHeadDim);
  QINFER_CHECK(t.num_attention_heads % t.num_key_value_heads == 0,
               "{}: {} does not divide num_attention_heads {}", text.where("num_key_value_heads"),
               t.num_key_value_heads, t.num_attention_heads);
  t.max_position_embeddings = f.int_or("max_position_embeddings", 32768);
  check_size(text, "max_position_embeddings", t.max_position_embeddings, kMaxPositions);
  t.rms_norm_eps = f.number_or("rms_norm_eps", 1e-6);
  check_real(text, "rms_norm_eps", t.rms_norm_eps, 0, 1);
  // A VLM's head tying is decided by its outer config (the class that owns lm_head).
  t.tie_word_embeddings = top.bool_opt("tie_word_embeddings").value_or(f.bool_or("tie_word_embeddings", false));
  t.attention_bias = f.bool_or("attention_bias", false);
  QINFER_CHECK(!t.attention_bias, "{}: attention biases are not part of any Qwen3 family checkpoint",
               text.where("attention_bias"));
  t.attn_output_gate = f.bool_or("attn_output_gate", false);
  t.rope = parse_rope(text, f, t.max_position_embeddings);
  if (t.rope.type == "yarn")
    t.max_position_embeddings =
        yarn_positions(t.rope, text.where(text.has("rope_parameters") ? "rope_parameters" : "rope_scaling"));
  const int64_t rotary = t.rotary_dim();
  QINFER_CHECK(rotary > 0 && rotary <= t.head_dim && rotary % 2 == 0,
               "{}: head_dim {} x partial_rotary_factor {} gives {} rotary dims (must be even, in 2..head_dim)",
               text.where("partial_rotary_factor"), t.head_dim, t.rope.partial_rotary_factor, rotary);
  if (!t.rope.mrope_section.empty()) {
    int64_t sum = 0;
    for (int64_t s : t.rope.mrope_section) sum += s;
    QINFER_CHECK(sum == rotary / 2, "{}: sections sum to {} but the rotary dims have {} frequencies",
                 text.where("rope_parameters.mrope_section"), sum, rotary / 2);
  }

  const bool hybrid = defaults.value("hybrid", false);
  t.layer_types = parse_layer_types(text, f, t.num_hidden_layers, hybrid);
  if (hybrid) {
    t.linear_num_key_heads = f.int_req("linear_num_key_heads");
    t.linear_num_value_heads = f.int_req("linear_num_value_heads");
    t.linear_key_head_dim = f.int_req("linear_key_head_dim");
    t.linear_value_head_dim = f.int_req("linear_value_head_dim");
    t.linear_conv_kernel_dim = f.int_req("linear_conv_kernel_dim");
    check_size(text, "linear_num_key_heads", t.linear_num_key_heads, kMaxHeads);
    check_size(text, "linear_num_value_heads", t.linear_num_value_heads, kMaxHeads);
    check_size(text, "linear_key_head_dim", t.linear_key_head_dim, kMaxHeadDim);
    check_size(text, "linear_value_head_dim", t.linear_value_head_dim, kMaxHeadDim);
    check_size(text, "linear_conv_kernel_dim", t.linear_conv_kernel_dim, kMaxKernel);
    QINFER_CHECK(t.linear_num_value_heads % t.linear_num_key_heads == 0,
                 "{}: {} is not a multiple of linear_num_key_heads {}", text.where("linear_num_value_heads"),
                 t.linear_num_value_heads, t.linear_num_key_heads);
  }

  // transformers 5 writes Qwen3-MoE's expert count as num_local_experts.
  const bool local = text.has("num_local_experts") && !text.has("num_experts");
  t.num_experts = local ? *text.int_opt("num_local_experts") : f.int_or("num_experts", 0);
  check_range(text, local ? "num_local_experts" : "num_experts", t.num_experts, 0, kMaxExperts);
  if (t.num_experts > 0) {
    t.num_experts_per_tok = f.int_req("num_experts_per_tok");
    t.moe_intermediate_size = f.int_req("moe_intermediate_size");
    t.shared_expert_intermediate_size = f.int_or("shared_expert_intermediate_size", 0);
    t.norm_topk_prob = f.bool_or("norm_topk_prob", true);
    QINFER_CHECK(t.num_experts_per_tok > 0 && t.num_experts_per_tok <= t.num_experts,
                 "{}: must be in 1..num_experts ({}), got {}", text.where("num_experts_per_tok"), t.num_experts,
                 t.num_experts_per_tok);
    check_size(text, "moe_intermediate_size", t.moe_intermediate_size, kMaxIntermediate);
    check_range(text, "shared_expert_intermediate_size", t.shared_expert_intermediate_size, 0, kMaxIntermediate);
    // Qwen3.5-MoE puts MoE in every layer: HF deletes decoder_sparse_step / mlp_only_layers.
    if (!defaults.value("every_layer_moe", false)) {
      t.decoder_sparse_step = f.int_or("decoder_sparse_step", 1);
      check_size(text, "decoder_sparse_step", t.decoder_sparse_step, kMaxLayers);
      t.mlp_only_layers = f.ints_or_empty("mlp_only_layers");
    } else {
      t.norm_topk_prob = true;  // Qwen3.5-MoE's router always renormalizes (HF has no switch for it)
    }
  }
  bool any_dense = false;
  for (int64_t i = 0; i < t.num_hidden_layers; ++i) any_dense = any_dense || !t.is_moe_layer(i);
  if (any_dense) {
    t.intermediate_size = f.int_req("intermediate_size");
    check_size(text, "intermediate_size", t.intermediate_size, kMaxIntermediate);
  } else {
    t.intermediate_size = f.int_or("intermediate_size", 0);
    check_range(text, "intermediate_size", t.intermediate_size, 0, kMaxIntermediate);
  }

  // Qwen3-Next names its MTP depth num_nextn_predict_layers; Qwen3.5 mtp_num_hidden_layers.
  const bool nextn = text.has("num_nextn_predict_layers");
  t.mtp_num_hidden_layers = nextn ? *text.int_opt("num_nextn_predict_layers") : f.int_or("mtp_num_hidden_layers", 0);
  check_range(text, nextn ? "num_nextn_predict_layers" : "mtp_num_hidden_layers", t.mtp_num_hidden_layers, 0,
              kMaxLayers);

  // The outer dtype is the stored one: transformers 5 writes nested configs with the load dtype.
  for (const JsonObject* owner : {&top, &text})
    for (std::string_view key : {"dtype", "torch_dtype"})
      if (t.dtype.empty())
        if (auto dtype = owner->string_opt(key)) t.dtype = *dtype;
  return t;
}

VisionConfig parse_vision(const JsonObject& obj) {
  Fields f{obj, kVisionDefaults};
  VisionConfig v;
  v.depth = f.int_req("depth");
  v.hidden_size = f.int_req("hidden_size");
  v.num_heads = f.int_req("num_heads");
  v.intermediate_size = f.int_req("intermediate_size");
  v.patch_size = f.int_req("patch_size");
  v.temporal_patch_size = f.int_req("temporal_patch_size");
  v.spatial_merge_size = f.int_req("spatial_merge_size");
  v.in_channels = f.int_req("in_channels");
  v.out_hidden_size = f.int_req("out_hidden_size");
  v.num_position_embeddings = f.int_req("num_position_embeddings");
  check_size(obj, "depth", v.depth, kMaxLayers);
  check_size(obj, "hidden_size", v.hidden_size, kMaxHidden);
  check_size(obj, "num_heads", v.num_heads, kMaxHeads);
  check_size(obj, "intermediate_size", v.intermediate_size, kMaxIntermediate);
  for (auto key : {"patch_size", "temporal_patch_size", "spatial_merge_size", "in_channels"})
    check_size(obj, key, f.int_req(key), kMaxKernel);
  check_size(obj, "out_hidden_size", v.out_hidden_size, kMaxHidden);
  check_size(obj, "num_position_embeddings", v.num_position_embeddings, kMaxPositions);
  QINFER_CHECK(v.hidden_size % v.num_heads == 0, "{}: {} is not divisible by num_heads {}", obj.where("hidden_size"),
               v.hidden_size, v.num_heads);
  v.hidden_act = obj.string_opt("hidden_act").value_or(kVisionDefaults["hidden_act"].get<std::string>());
  v.deepstack_visual_indexes = f.ints_or_empty("deepstack_visual_indexes");
  for (int64_t index : v.deepstack_visual_indexes) check_range(obj, "deepstack_visual_indexes", index, 0, v.depth - 1);
  return v;
}

void parse_tokens(const JsonObject& top, const JsonObject& text, TokenIds& ids) {
  auto pick = [&](std::string_view key) { return top.has(key) ? top.int_opt(key) : text.int_opt(key); };
  ids.bos = pick("bos_token_id");
  ids.pad = pick("pad_token_id");
  const JsonObject& eos_owner = top.has("eos_token_id") ? top : text;
  if (eos_owner.has("eos_token_id")) {
    const json& eos = eos_owner.raw().at("eos_token_id");
    if (eos.is_array()) ids.eos = *eos_owner.ints_opt("eos_token_id");
    else ids.eos = {*eos_owner.int_opt("eos_token_id")};
    // Stop ids are token ids (int32) everywhere after this.
    for (int64_t id : ids.eos) check_range(eos_owner, "eos_token_id", id, 0, std::numeric_limits<int32_t>::max());
  }
  ids.image = top.int_opt("image_token_id");
  ids.video = top.int_opt("video_token_id");
  ids.vision_start = top.int_opt("vision_start_token_id");
  ids.vision_end = top.int_opt("vision_end_token_id");
}

}  // namespace

std::string_view name(LayerKind kind) {
  return kind == LayerKind::full_attention ? "full_attention" : "linear_attention";
}

std::optional<QuantSpec> QuantizationConfig::for_module(const std::string& module_path) const {
  auto it = overrides.find(module_path);
  if (it != overrides.end()) return it->second;
  return global;
}

bool TextConfig::is_moe_layer(int64_t layer) const {
  if (num_experts <= 0) return false;
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return (layer + 1) % decoder_sparse_step == 0;
}

int64_t TextConfig::rotary_dim() const {
  return static_cast<int64_t>(static_cast<double>(head_dim) * rope.partial_rotary_factor);
}

void apply_yarn(TextConfig& text, double factor, std::optional<int64_t> original) {
  const std::string where =
      original ? fmt::format("--rope-scaling yarn:{}:{}", factor, *original) : fmt::format("--rope-scaling yarn:{}", factor);
  RopeConfig& rope = text.rope;
  QINFER_CHECK(rope.type == "default" || rope.type == "mrope" || rope.type == "yarn",
               "{}: the config already scales its rotary frequencies (rope_type '{}')", where, rope.type);
  QINFER_CHECK(!original || (*original > 0 && *original <= kMaxPositions), "{}: ORIGINAL must be in 1..{}", where,
               kMaxPositions);
  if (original) rope.original_max_position_embeddings = *original;
  if (!rope.original_max_position_embeddings) rope.original_max_position_embeddings = text.max_position_embeddings;
  rope.type = "yarn";
  rope.factor = factor;
  text.max_position_embeddings = yarn_positions(rope, where);
}

const json& hf_text_defaults(const std::string& text_model_type) {
  const json& table = defaults_table();
  auto it = table.find(text_model_type);
  if (it == table.end()) {
    std::string known;
    for (const auto& [key, _] : table.items()) known += (known.empty() ? "" : ", ") + key;
    fail("unsupported text model_type '{}' (supported: {})", text_model_type, known);
  }
  return *it;
}

ModelConfig parse_config(const json& document, const std::string& label) {
  JsonObject top(document, label);
  ModelConfig config;
  config.raw = document;
  auto model_type = top.string_opt("model_type");
  QINFER_CHECK(model_type.has_value(), "{}: required field is missing", top.where("model_type"));
  config.model_type = *model_type;
  config.architectures = top.strings_opt("architectures").value_or(std::vector<std::string>{});

  // Qwen3.5 VLM configs nest the language model; a flat config is its own text config (as mlx-lm reads it).
  std::optional<JsonObject> nested = top.object_opt("text_config");
  const JsonObject& text = nested ? *nested : top;
  std::string text_type = text_type_for(config.model_type);
  if (nested) {
    if (auto declared = nested->string_opt("model_type")) text_type = *declared;
  }
  try {
    hf_text_defaults(text_type);
  } catch (const Error& e) {
    fail("{}: {}", top.where(nested ? "text_config.model_type" : "model_type"), e.what());
  }
  config.text = parse_text(top, text, text_type);
  if (auto vision = top.object_opt("vision_config")) config.vision = parse_vision(*vision);
  parse_tokens(top, text, config.tokens);
  parse_quantization(top, config);
  return config;
}

ModelConfig load_config(const std::filesystem::path& dir_or_file) {
  std::filesystem::path file = dir_or_file;
  if (std::filesystem::is_directory(file)) file /= "config.json";
  QINFER_CHECK(std::filesystem::exists(file), "{}: config.json not found", file.string());
  ModelConfig config = parse_config(read_json_file(file), file.string());
  config.file = file;
  return config;
}

}  // namespace qinfer::io
