#pragma once
// Full attention with per-head q/k RMSNorm and (partial / MRoPE) rotary embeddings over the paged KV
// cache. Qwen3 uses it plain; Qwen3-Next / 3.5 double q_proj into per-head [query | gate] and multiply
// the attention output by sigmoid(gate) before o_proj.
#include <string>

#include "io/config.h"
#include "layers/context.h"
#include "layers/weights.h"

namespace qinfer::layers {

struct Attention {
  std::string name;  // canonical prefix, e.g. model.layers.3.self_attn
  Weight q_proj, k_proj, v_proj, o_proj;
  Tensor q_norm, k_norm;
  bool output_gate = false;
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  float eps = 1e-6f;
  RopeParams rope;
  int64_t kv_index = 0;  // which KV pool of the cache this layer uses

  static Attention load(const WeightLoader& w, const std::string& prefix, const io::TextConfig& c, bool output_gate,
                        int64_t kv_index);
  // x f32 [T,H] (normed input) -> out f32 [T,H].
  void forward(ForwardContext& ctx, const Tensor& x, Tensor& out) const;
};

RopeParams rope_params(const io::TextConfig& c);

}  // namespace qinfer::layers
