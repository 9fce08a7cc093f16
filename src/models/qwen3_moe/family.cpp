// Qwen3-MoE: Qwen3 attention with a softmax top-k router over SwiGLU experts; layers listed in
// mlp_only_layers (or off the decoder_sparse_step grid) keep a dense MLP.
#include <fmt/format.h>

#include "models/common/tensor_specs.h"
#include "models/families.h"

namespace qinfer::models {
namespace {

Expected expected(const io::TextConfig& c, bool /*with_mtp*/) {
  Expected out;
  add_embedding_and_head(out, c);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string layer = fmt::format("model.layers.{}", i);
    add_layer_norms(out, layer, c.hidden_size);
    add_attention(out, layer, c, /*gated=*/false);
    if (c.is_moe_layer(i)) add_moe(out, layer + ".mlp", c);
    else add_dense_mlp(out, layer + ".mlp", c.hidden_size, c.intermediate_size);
  }
  return out;
}

}  // namespace

const Family& qwen3_moe_family() {
  static const Family family{
      .name = "qwen3_moe",
      .model_types = {"qwen3_moe"},
      .description = "Qwen3 mixture of experts",
      .accepts = [](const io::ModelConfig& c) { return c.model_type == "qwen3_moe" && c.text.num_experts > 0; },
      .capabilities = [](const io::ModelConfig&) { return Capabilities{.moe = true}; },
      .rules = {.vlm_naming = false, .zero_centred_norms = false, .expected = expected},
  };
  return family;
}

}  // namespace qinfer::models
