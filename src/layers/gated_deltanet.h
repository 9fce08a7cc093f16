#pragma once
// Gated DeltaNet (the linear-attention mixer of Qwen3-Next and Qwen3.5): projections, causal
// depthwise conv over q|k|v with SiLU, l2-normed q/k, the gated delta rule over per-sequence state,
// a gated RMSNorm with z, and out_proj. Qwen3-Next stores the projections grouped per key head
// (in_proj_qkvz / in_proj_ba); Qwen3.5 stores them split.
#include <string>

#include "io/config.h"
#include "layers/context.h"
#include "layers/weights.h"

namespace qinfer::layers {

struct GatedDeltaNet {
  std::string name;  // canonical prefix, e.g. model.layers.0.linear_attn
  bool grouped = false;
  Weight in_proj_qkvz, in_proj_ba;                      // grouped (Qwen3-Next)
  Weight in_proj_qkv, in_proj_z, in_proj_b, in_proj_a;  // split (Qwen3.5)
  Tensor conv1d, A_log, dt_bias, norm;
  Weight out_proj;
  int64_t key_heads = 0, value_heads = 0, key_dim = 0, value_dim = 0;
  float eps = 1e-6f;
  int64_t state_index = 0;  // which recurrent-state tensors of the cache this layer uses

  static GatedDeltaNet load(const WeightLoader& w, const std::string& prefix, const io::TextConfig& c, bool grouped,
                            int64_t state_index);
  void forward(ForwardContext& ctx, const Tensor& x, Tensor& out) const;
};

}  // namespace qinfer::layers
