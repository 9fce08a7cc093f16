#pragma once
// `qinfer quantize`: converts any checkpoint qinfer reads into an MLX-quantized checkpoint in MLX's
// naming and layout (what mlx-lm's convert + quantize write), streaming tensor by tensor.
#include <filesystem>
#include <optional>
#include <string>

#include "quant/quant.h"

namespace qinfer {
class ThreadPool;
}

namespace qinfer::models {

struct QuantizeOptions {
  quant::Layout layout{quant::Mode::affine, 4, 64};
  std::string recipe;  // "", mixed_2_6, mixed_3_4, mixed_3_6, mixed_4_6 (affine only)
  uint64_t shard_bytes = 5ull << 30;
  ThreadPool* pool = nullptr;  // quantizes rows in parallel; null: the process-wide pool
};

struct QuantizeReport {
  int quantized = 0, kept = 0;  // tensors
  uint64_t bytes_in = 0, bytes_out = 0;
  int shards = 0;
};

QuantizeReport quantize_checkpoint(const std::filesystem::path& in, const std::filesystem::path& out,
                                   const QuantizeOptions& options);

}  // namespace qinfer::models
