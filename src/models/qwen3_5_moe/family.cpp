// Qwen3.5-MoE / 3.6-MoE: Qwen3.5 with MoE (router always renormalized, shared expert) in every layer.
// The layer list is Qwen3.5's: add_hybrid_layers already places MoE where the config has experts.
#include "models/families.h"
#include "models/qwen3_5/qwen3_5.h"

namespace qinfer::models {

const Family& qwen3_5_moe_family() {
  static const Family family{
      .name = "qwen3_5_moe",
      .model_types = {"qwen3_5_moe", "qwen3_5_moe_text"},
      .description = "Qwen3.5 / 3.6 mixture of experts hybrid, vision, MTP",
      .accepts =
          [](const io::ModelConfig& c) {
            return (c.model_type == "qwen3_5_moe" || c.model_type == "qwen3_5_moe_text") && c.text.num_experts > 0;
          },
      .capabilities = qwen3_5::capabilities,
      .rules = {.vlm_naming = true, .zero_centred_norms = true, .expected = qwen3_5::expected_tensors},
  };
  return family;
}

}  // namespace qinfer::models
