// Qwen3 dense (Qwen3ForCausalLM): GQA with per-head q/k RMSNorm, full RoPE, plain (w) norms.
// Also the backbone of Qwen3-Embedding, whose checkpoints may omit the `model.` prefix.
#include "models/qwen3/qwen3.h"

#include "models/families.h"

namespace qinfer::models::qwen3 {

Expected expected_tensors(const io::TextConfig& c, bool /*with_mtp*/) {
  Expected out;
  add_embedding_and_head(out, c);
  add_attention_layers(out, c);
  return out;
}

}  // namespace qinfer::models::qwen3

namespace qinfer::models {

const Family& qwen3_family() {
  static const Family family{
      .name = "qwen3",
      .model_types = {"qwen3"},
      .description = "Qwen3 dense (also the Qwen3-Embedding backbone)",
      .accepts = [](const io::ModelConfig& c) { return c.model_type == "qwen3" && c.text.num_experts == 0; },
      .capabilities = [](const io::ModelConfig&) { return Capabilities{.embedding_terminator = "<|endoftext|>"}; },
      .rules = {.vlm_naming = false, .zero_centred_norms = false, .expected = qwen3::expected_tensors},
  };
  return family;
}

}  // namespace qinfer::models
