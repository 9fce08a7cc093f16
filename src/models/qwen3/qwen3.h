#pragma once
// Qwen3 pieces its MoE variant reuses.
#include "models/common/tensor_specs.h"

namespace qinfer::models::qwen3 {

// Embedding, head and the attention layer stack (dense or MoE feed-forward per layer).
Expected expected_tensors(const io::TextConfig& c, bool with_mtp);

}  // namespace qinfer::models::qwen3
