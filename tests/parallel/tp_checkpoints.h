#pragma once
// Checkpoints the tensor-parallel tests make from the golden fixtures.
#include <fmt/format.h>
#include <unistd.h>

#include <filesystem>

#include "models/quantize.h"
#include "support/golden_reference.h"

namespace qinfer::parallel {

// A 4-bit affine MoE checkpoint with groups of 32, so that every row-parallel input splits on group
// boundaries at TP=2 (the stored qwen3_5_moe_mlx_4bit fixture's groups of 64 do not).
inline const std::filesystem::path& moe_4bit_g32() {
  struct Dir {
    std::filesystem::path path = std::filesystem::temp_directory_path() / fmt::format("qinfer_tp_moe4_{}", ::getpid());
    Dir() {
      std::filesystem::remove_all(path);
      models::QuantizeOptions options;
      options.layout = {quant::Mode::affine, 4, 32};
      models::quantize_checkpoint(golden::kGolden / "qwen3_5_moe", path, options);
    }
    ~Dir() { std::filesystem::remove_all(path); }
  };
  static const Dir dir;
  return dir.path;
}

}  // namespace qinfer::parallel
