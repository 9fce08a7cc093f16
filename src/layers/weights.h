#pragma once
// Moves canonical checkpoint tensors onto a backend: matrices keep their stored form (bf16 stays
// bf16, MLX-quantized stays packed: decode streams it), vectors (norm gains, conv kernels, gates' parameters) become f32 with
// any due +1 applied.
#include <string>

#include "backend/ops.h"
#include "core/progress.h"
#include "io/checkpoint.h"

namespace qinfer::layers {

class WeightLoader {
 public:
  // `progress`, when given, advances by each tensor's stored bytes.
  WeightLoader(const io::NormalizationPlan& plan, Ops& ops, ProgressBar* progress = nullptr)
      : plan_(plan), ops_(ops), progress_(progress) {}
  // A matrix as stored: dense (f32|bf16|f16) or MLX-quantized (codes + scales [+ biases]).
  Weight matrix(const std::string& name) const;
  Tensor vector(const std::string& name) const;  // any shape, as f32
  bool has(const std::string& name) const { return plan_.find(name) != nullptr; }

 private:
  const io::NormalizationPlan& plan_;
  Ops& ops_;
  ProgressBar* progress_;
};

}  // namespace qinfer::layers
