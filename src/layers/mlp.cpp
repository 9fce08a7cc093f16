#include "layers/mlp.h"

namespace qinfer::layers {

Mlp Mlp::load(const WeightLoader& w, const std::string& prefix) {
  return Mlp{w.matrix(prefix + ".gate_proj.weight"), w.matrix(prefix + ".up_proj.weight"),
             w.matrix(prefix + ".down_proj.weight")};
}

void Mlp::forward(ForwardContext& ctx, const Tensor& x, Tensor& out) const {
  const int64_t T = x.dim(0), I = gate_proj.shape()[0];
  Tensor act = ctx.alloc({T, I});
  ctx.input_linear_swiglu(x, gate_proj, up_proj, act);
  ctx.ops.linear(act, down_proj, out);
}

Moe Moe::load(const WeightLoader& w, const std::string& prefix, const io::TextConfig& c) {
  Moe m;
  m.router = w.matrix(prefix + ".gate.weight");
  m.gate_proj = w.matrix(prefix + ".experts.gate_proj.weight");
  m.up_proj = w.matrix(prefix + ".experts.up_proj.weight");
  m.down_proj = w.matrix(prefix + ".experts.down_proj.weight");
  if (c.shared_expert_intermediate_size > 0) {
    m.shared_expert = Mlp::load(w, prefix + ".shared_expert");
    m.shared_expert_gate = w.matrix(prefix + ".shared_expert_gate.weight");
  }
  m.top_k = c.num_experts_per_tok;
  m.renormalize = c.norm_topk_prob;
  return m;
}

void Moe::forward(ForwardContext& ctx, const Tensor& x, Tensor& out) const {
  Ops& ops = ctx.ops;
  const int64_t T = x.dim(0), E = router.shape()[0];
  Tensor logits = ctx.alloc({T, E});
  ops.linear(x, router, logits);
  Tensor ids = ops.alloc_output(DType::i32, {T, top_k});
  Tensor weights = ctx.alloc({T, top_k});
  ops.moe_route(logits, renormalize, ids, weights);
  ops.moe_experts(x, ids, weights, gate_proj, up_proj, down_proj, out);
  if (shared_expert) {
    Tensor shared = ctx.alloc({T, x.dim(1)});
    shared_expert->forward(ctx, x, shared);
    Tensor gate = ctx.alloc({T, 1});
    ops.linear(x, shared_expert_gate, gate);
    ops.sigmoid_mul(shared, gate);
    ops.add(out, shared);
  }
}

}  // namespace qinfer::layers
