#pragma once
// Random-weight checkpoints of a family's real shape, for speed measurements without a download:
// bf16 matrices scaled by 1/sqrt(fan_in), unit norm gains, in the HF layout the family loads.
#include <filesystem>
#include <string>

#include "io/json.h"

namespace qinfer::models {

// config.json contents for a released model shape by name (e.g. "qwen3_5-0.8b", "qwen3-0.6b").
io::json released_shape(const std::string& name);
// Writes config.json + model.safetensors into dir (streamed tensor by tensor).
void write_random_checkpoint(const std::filesystem::path& dir, const io::json& config, uint64_t seed);

}  // namespace qinfer::models
