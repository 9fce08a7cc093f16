#pragma once
// Qwen3.5 pieces its MoE variant reuses.
#include "models/common/tensor_specs.h"
#include "models/registry.h"

namespace qinfer::models::qwen3_5 {

Expected expected_tensors(const io::TextConfig& c, bool with_mtp);
Capabilities capabilities(const io::ModelConfig& c);

}  // namespace qinfer::models::qwen3_5
