#include "models/registry.h"

#include <fmt/format.h>

#include "core/error.h"
#include "models/families.h"

namespace qinfer::models {

std::span<const Family> families() {
  static const std::vector<Family> all = {qwen3_family(), qwen3_moe_family(), qwen3_next_family(),
                                          qwen3_5_family(), qwen3_5_moe_family()};
  return all;
}

const Family& family_for(const io::ModelConfig& config) {
  for (const Family& family : families())
    if (family.accepts(config)) return family;
  std::vector<std::string_view> types;
  for (const Family& family : families())
    for (std::string_view t : family.model_types) types.push_back(t);
  fail("{}: no qinfer family accepts model_type '{}' with {} experts (supported model types: {})",
       config.file.string(), config.model_type, config.text.num_experts, fmt::join(types, ", "));
}

Checkpoint open_checkpoint(const std::filesystem::path& dir) {
  QINFER_CHECK(std::filesystem::is_directory(dir), "{}: not a directory (expected a checkpoint folder)", dir.string());
  io::ModelConfig config = io::load_config(dir);
  const Family& family = family_for(config);
  io::TensorStore store(dir);
  io::NormalizationPlan plan = io::normalize_checkpoint(config, store, family.rules);
  return Checkpoint{std::move(config), &family, std::move(store), std::move(plan)};
}

}  // namespace qinfer::models
