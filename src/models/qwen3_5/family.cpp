// Qwen3.5 / 3.6 dense: the Qwen3-Next hybrid with split linear-attention projections, dense MLPs,
// interleaved MRoPE, a vision tower and an MTP head; checkpoints are VLMs (model.language_model.*).
#include "models/qwen3_5/qwen3_5.h"

#include "models/common/tensor_specs.h"
#include "models/families.h"

namespace qinfer::models::qwen3_5 {

Expected expected_tensors(const io::TextConfig& c, bool with_mtp) {
  Expected out;
  add_embedding_and_head(out, c);
  add_hybrid_layers(out, c, /*grouped_deltanet=*/false);
  if (with_mtp) add_mtp(out, c);
  return out;
}

Capabilities capabilities(const io::ModelConfig& c) {
  return Capabilities{.recurrent_state = true,
                      .vision = c.vision.has_value(),
                      .mtp = c.text.mtp_num_hidden_layers > 0,
                      .moe = c.text.num_experts > 0};
}

}  // namespace qinfer::models::qwen3_5

namespace qinfer::models {

const Family& qwen3_5_family() {
  static const Family family{
      .name = "qwen3_5",
      .model_types = {"qwen3_5", "qwen3_5_text"},
      .description = "Qwen3.5 / 3.6 dense hybrid (Gated DeltaNet + gated attention), vision, MTP",
      .accepts =
          [](const io::ModelConfig& c) {
            return (c.model_type == "qwen3_5" || c.model_type == "qwen3_5_text") && c.text.num_experts == 0;
          },
      .capabilities = qwen3_5::capabilities,
      .rules = {.vlm_naming = true, .zero_centred_norms = true, .expected = qwen3_5::expected_tensors},
  };
  return family;
}

}  // namespace qinfer::models
