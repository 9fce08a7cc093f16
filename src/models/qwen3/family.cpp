// Qwen3 dense (Qwen3ForCausalLM): GQA with per-head q/k RMSNorm, full RoPE, plain (w) norms.
// Also the backbone of Qwen3-Embedding, whose checkpoints may omit the `model.` prefix.
#include "models/common/tensor_specs.h"
#include "models/families.h"

namespace qinfer::models {
namespace {

Expected expected(const io::TextConfig& c, bool /*with_mtp*/) {
  Expected out;
  add_embedding_and_head(out, c);
  add_attention_layers(out, c);
  return out;
}

}  // namespace

const Family& qwen3_family() {
  static const Family family{
      .name = "qwen3",
      .model_types = {"qwen3"},
      .description = "Qwen3 dense (also the Qwen3-Embedding backbone)",
      .accepts = [](const io::ModelConfig& c) { return c.model_type == "qwen3" && c.text.num_experts == 0; },
      .capabilities = [](const io::ModelConfig&) { return Capabilities{.embedding_terminator = "<|endoftext|>"}; },
      .rules = {.vlm_naming = false, .zero_centred_norms = false, .expected = expected},
  };
  return family;
}

}  // namespace qinfer::models
