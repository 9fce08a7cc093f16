#pragma once
// Synthetic checkpoints for the sanitize tests: canonical tensors with known values, written in the
// HF or the MLX-converted layout of a family, so a test can check that normalization maps every
// stored byte back to the canonical tensor it came from.
#include <map>
#include <string>
#include <vector>

#include "../support/safetensors_writer.h"
#include "io/json.h"
#include "models/registry.h"

namespace qinfer::testing {

enum class Layout { hf, mlx };

struct CanonicalValues {
  std::vector<int64_t> shape;
  std::vector<float> gamma;  // the values the model must see (after any +1)
};

struct SyntheticOptions {
  Layout layout = Layout::hf;
  bool with_mtp = false;
  bool with_vision = false;
  bool store_tied_head = false;   // write lm_head even when the config ties it
  bool strip_model_prefix = false;  // Qwen3-Embedding style names
  bool quantize = false;          // MLX affine 4-bit g64 for every quantizable weight whose in % 64 == 0
  bool mtp_per_expert = false;    // MTP experts stored per expert (Qwen3.5-35B layout)
  bool gains_already_shifted = false;  // store zero-centred gains as γ even in the HF layout (a broken file)
};

io::json tiny_config(const std::string& model_type);

// Writes config.json + model.safetensors into dir; returns the canonical values by name.
std::map<std::string, CanonicalValues> write_synthetic(const std::filesystem::path& dir, const io::json& config,
                                                       const SyntheticOptions& options);

}  // namespace qinfer::testing
