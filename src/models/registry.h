#pragma once
// The family registry: model_type -> family, with the family's acceptance predicate, its
// capabilities and its checkpoint rules. One row per folder under models/.
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "io/checkpoint.h"
#include "io/config.h"

namespace qinfer::models {

struct Capabilities {
  bool recurrent_state = false;  // Gated DeltaNet layers: conv window + delta state per sequence
  bool vision = false;           // a vision tower may come with the checkpoint
  bool mtp = false;              // a native multi-token-prediction head may come with the checkpoint
  bool moe = false;
  // Token an embedding model appends and pools (Qwen3-Embedding: <|endoftext|>); empty if none.
  std::string_view embedding_terminator;
};

struct Family {
  std::string_view name;  // the folder, named after the HF model_type
  std::vector<std::string_view> model_types;  // top-level model_type values this family serves
  std::string_view description;
  // Whether the family can run this config (a model_type match alone is not enough: a Qwen3.5
  // config with experts belongs to qwen3_5_moe).
  bool (*accepts)(const io::ModelConfig& config);
  Capabilities (*capabilities)(const io::ModelConfig& config);
  io::SanitizeRules rules;
};

std::span<const Family> families();
// The family for a config; an Error listing the supported model types when none accepts it.
const Family& family_for(const io::ModelConfig& config);

// Loads config.json, opens the safetensors and builds the normalization plan.
struct Checkpoint {
  io::ModelConfig config;
  const Family* family;
  io::TensorStore store;
  io::NormalizationPlan plan;
};
Checkpoint open_checkpoint(const std::filesystem::path& dir);

}  // namespace qinfer::models
