// Qwen3-MoE: Qwen3 attention with a softmax top-k router over SwiGLU experts; layers listed in
// mlp_only_layers (or off the decoder_sparse_step grid) keep a dense MLP.
// Its tensor list is Qwen3's: add_attention_layers places MoE where the config has experts.
#include "models/families.h"
#include "models/qwen3/qwen3.h"

namespace qinfer::models {

const Family& qwen3_moe_family() {
  static const Family family{
      .name = "qwen3_moe",
      .model_types = {"qwen3_moe"},
      .description = "Qwen3 mixture of experts",
      .accepts = [](const io::ModelConfig& c) { return c.model_type == "qwen3_moe" && c.text.num_experts > 0; },
      .capabilities = [](const io::ModelConfig&) { return Capabilities{.moe = true}; },
      .rules = {.vlm_naming = false, .zero_centred_norms = false, .expected = qwen3::expected_tensors},
  };
  return family;
}

}  // namespace qinfer::models
