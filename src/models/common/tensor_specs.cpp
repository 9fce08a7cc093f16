#include "models/common/tensor_specs.h"

#include <fmt/format.h>

namespace qinfer::models {

void add_embedding_and_head(Expected& out, const io::TextConfig& c) {
  out.push_back({"model.embed_tokens.weight", {c.vocab_size, c.hidden_size}, true, {"vocab_size", "hidden_size"}});
  out.push_back({"model.norm.weight", {c.hidden_size}, false, {"hidden_size"}});
  if (!c.tie_word_embeddings)
    out.push_back({"lm_head.weight", {c.vocab_size, c.hidden_size}, true, {"vocab_size", "hidden_size"}});
}

void add_attention(Expected& out, const std::string& prefix, const io::TextConfig& c, bool gated) {
  const int64_t q_rows = c.num_attention_heads * c.head_dim * (gated ? 2 : 1);
  const int64_t kv_rows = c.num_key_value_heads * c.head_dim;
  const std::string q_dim = gated ? "2 x num_attention_heads x head_dim" : "num_attention_heads x head_dim";
  const std::string kv_dim = "num_key_value_heads x head_dim";
  const std::string p = prefix + ".self_attn.";
  out.push_back({p + "q_proj.weight", {q_rows, c.hidden_size}, true, {q_dim, "hidden_size"}});
  out.push_back({p + "k_proj.weight", {kv_rows, c.hidden_size}, true, {kv_dim, "hidden_size"}});
  out.push_back({p + "v_proj.weight", {kv_rows, c.hidden_size}, true, {kv_dim, "hidden_size"}});
  out.push_back({p + "o_proj.weight", {c.hidden_size, c.num_attention_heads * c.head_dim}, true,
                 {"hidden_size", "num_attention_heads x head_dim"}});
  out.push_back({p + "q_norm.weight", {c.head_dim}, false, {"head_dim"}});
  out.push_back({p + "k_norm.weight", {c.head_dim}, false, {"head_dim"}});
}

void add_dense_mlp(Expected& out, const std::string& prefix, int64_t hidden, int64_t intermediate,
                   const std::string& intermediate_field) {
  out.push_back({prefix + ".gate_proj.weight", {intermediate, hidden}, true, {intermediate_field, "hidden_size"}});
  out.push_back({prefix + ".up_proj.weight", {intermediate, hidden}, true, {intermediate_field, "hidden_size"}});
  out.push_back({prefix + ".down_proj.weight", {hidden, intermediate}, true, {"hidden_size", intermediate_field}});
}

void add_moe(Expected& out, const std::string& prefix, const io::TextConfig& c) {
  const int64_t e = c.num_experts, i = c.moe_intermediate_size, h = c.hidden_size;
  out.push_back({prefix + ".gate.weight", {e, h}, true, {"num_experts", "hidden_size"}});
  out.push_back({prefix + ".experts.gate_proj.weight", {e, i, h}, true,
                 {"num_experts", "moe_intermediate_size", "hidden_size"}});
  out.push_back({prefix + ".experts.up_proj.weight", {e, i, h}, true,
                 {"num_experts", "moe_intermediate_size", "hidden_size"}});
  out.push_back({prefix + ".experts.down_proj.weight", {e, h, i}, true,
                 {"num_experts", "hidden_size", "moe_intermediate_size"}});
  if (c.shared_expert_intermediate_size > 0) {
    add_dense_mlp(out, prefix + ".shared_expert", h, c.shared_expert_intermediate_size,
                  "shared_expert_intermediate_size");
    out.push_back({prefix + ".shared_expert_gate.weight", {1, h}, true, {"1", "hidden_size"}});
  }
}

void add_layer_norms(Expected& out, const std::string& prefix, int64_t hidden) {
  out.push_back({prefix + ".input_layernorm.weight", {hidden}, false, {"hidden_size"}});
  out.push_back({prefix + ".post_attention_layernorm.weight", {hidden}, false, {"hidden_size"}});
}

void add_gated_deltanet(Expected& out, const std::string& prefix, const io::TextConfig& c, bool grouped) {
  const int64_t h = c.hidden_size, hv = c.linear_num_value_heads;
  const int64_t key_dim = c.linear_key_dim(), value_dim = c.linear_value_dim();
  const std::string key = "linear_num_key_heads x linear_key_head_dim";
  const std::string value = "linear_num_value_heads x linear_value_head_dim";
  const std::string p = prefix + ".linear_attn.";
  if (grouped) {
    out.push_back({p + "in_proj_qkvz.weight", {2 * key_dim + 2 * value_dim, h}, true,
                   {fmt::format("2 x {} + 2 x {}", key, value), "hidden_size"}});
    out.push_back({p + "in_proj_ba.weight", {2 * hv, h}, true, {"2 x linear_num_value_heads", "hidden_size"}});
  } else {
    out.push_back({p + "in_proj_qkv.weight", {2 * key_dim + value_dim, h}, true,
                   {fmt::format("2 x {} + {}", key, value), "hidden_size"}});
    out.push_back({p + "in_proj_z.weight", {value_dim, h}, true, {value, "hidden_size"}});
    out.push_back({p + "in_proj_b.weight", {hv, h}, true, {"linear_num_value_heads", "hidden_size"}});
    out.push_back({p + "in_proj_a.weight", {hv, h}, true, {"linear_num_value_heads", "hidden_size"}});
  }
  out.push_back({p + "conv1d.weight", {c.linear_conv_dim(), c.linear_conv_kernel_dim}, false,
                 {fmt::format("2 x {} + {}", key, value), "linear_conv_kernel_dim"}});
  out.push_back({p + "A_log", {hv}, false, {"linear_num_value_heads"}});
  out.push_back({p + "dt_bias", {hv}, false, {"linear_num_value_heads"}});
  out.push_back({p + "norm.weight", {c.linear_value_head_dim}, false, {"linear_value_head_dim"}});
  out.push_back({p + "out_proj.weight", {h, value_dim}, true, {"hidden_size", value}});
}

void add_mtp(Expected& out, const io::TextConfig& c) {
  const int64_t h = c.hidden_size;
  out.push_back({"mtp.fc.weight", {h, 2 * h}, true, {"hidden_size", "2 x hidden_size"}});
  out.push_back({"mtp.pre_fc_norm_embedding.weight", {h}, false, {"hidden_size"}});
  out.push_back({"mtp.pre_fc_norm_hidden.weight", {h}, false, {"hidden_size"}});
  out.push_back({"mtp.norm.weight", {h}, false, {"hidden_size"}});
  for (int64_t j = 0; j < c.mtp_num_hidden_layers; ++j) {
    const std::string layer = fmt::format("mtp.layers.{}", j);
    add_layer_norms(out, layer, h);
    add_attention(out, layer, c, /*gated=*/true);
    if (c.num_experts > 0) add_moe(out, layer + ".mlp", c);
    else add_dense_mlp(out, layer + ".mlp", h, c.intermediate_size, "intermediate_size");
  }
}

void add_attention_layers(Expected& out, const io::TextConfig& c) {
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string layer = fmt::format("model.layers.{}", i);
    add_layer_norms(out, layer, c.hidden_size);
    add_attention(out, layer, c, /*gated=*/false);
    if (c.is_moe_layer(i)) add_moe(out, layer + ".mlp", c);
    else add_dense_mlp(out, layer + ".mlp", c.hidden_size, c.intermediate_size, "intermediate_size");
  }
}

void add_hybrid_layers(Expected& out, const io::TextConfig& c, bool grouped_deltanet) {
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string layer = fmt::format("model.layers.{}", i);
    add_layer_norms(out, layer, c.hidden_size);
    if (c.layer_types[i] == io::LayerKind::linear_attention) add_gated_deltanet(out, layer, c, grouped_deltanet);
    else add_attention(out, layer, c, /*gated=*/c.attn_output_gate);
    if (c.is_moe_layer(i)) add_moe(out, layer + ".mlp", c);
    else add_dense_mlp(out, layer + ".mlp", c.hidden_size, c.intermediate_size, "intermediate_size");
  }
}

}  // namespace qinfer::models
