// Qwen3-Next: Gated DeltaNet layers with a gated full-attention layer every few layers, grouped
// in_proj_qkvz / in_proj_ba projections, MoE with a shared expert, zero-centred (1+w) norms, MTP head.
#include "models/common/tensor_specs.h"
#include "models/families.h"

namespace qinfer::models {
namespace {

Expected expected(const io::TextConfig& c, bool with_mtp) {
  Expected out;
  add_embedding_and_head(out, c);
  add_hybrid_layers(out, c, /*grouped_deltanet=*/true);
  if (with_mtp) add_mtp(out, c);
  return out;
}

}  // namespace

const Family& qwen3_next_family() {
  static const Family family{
      .name = "qwen3_next",
      .model_types = {"qwen3_next"},
      .description = "Qwen3-Next hybrid Gated DeltaNet + gated attention, MoE",
      .accepts = [](const io::ModelConfig& c) { return c.model_type == "qwen3_next"; },
      .capabilities =
          [](const io::ModelConfig& c) {
            return Capabilities{
                .recurrent_state = true, .mtp = c.text.mtp_num_hidden_layers > 0, .moe = c.text.num_experts > 0};
          },
      .rules = {.vlm_naming = false, .zero_centred_norms = true, .expected = expected},
  };
  return family;
}

}  // namespace qinfer::models
