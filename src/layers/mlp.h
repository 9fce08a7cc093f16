#pragma once
// Feed-forward blocks: the dense SwiGLU MLP and the mixture of experts (softmax top-k router, SwiGLU
// experts, optional shared expert scaled by a sigmoid gate).
#include <optional>
#include <string>

#include "io/config.h"
#include "layers/context.h"
#include "layers/weights.h"

namespace qinfer::layers {

struct Mlp {
  Weight gate_proj, up_proj, down_proj;
  static Mlp load(const WeightLoader& w, const std::string& prefix);
  // x f32 [T,H] -> out f32 [T,H]
  void forward(ForwardContext& ctx, const Tensor& x, Tensor& out) const;
};

struct Moe {
  Weight router;  // [E,H]
  Weight gate_proj, up_proj, down_proj;  // [E,I,H], [E,I,H], [E,H,I]
  std::optional<Mlp> shared_expert;
  Weight shared_expert_gate;  // [1,H]
  int64_t top_k = 0;
  bool renormalize = true;
  static Moe load(const WeightLoader& w, const std::string& prefix, const io::TextConfig& c);
  void forward(ForwardContext& ctx, const Tensor& x, Tensor& out) const;
};

}  // namespace qinfer::layers
