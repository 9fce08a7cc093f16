#include "layers/attention.h"

#include <cmath>

#include "core/error.h"

namespace qinfer::layers {

RopeParams rope_params(const io::TextConfig& c) {
  // Scaled rotary frequencies change every position's rotation: running such a checkpoint with plain
  // ones would answer, wrongly. "dynamic" NTK equals plain RoPE up to max_position_embeddings, which
  // bounds the context here; YaRN's frequencies and attention factor are computed by rope_frequencies.
  const std::string& type = c.rope.type;
  QINFER_CHECK(type == "default" || type == "mrope" || type == "dynamic" || type == "yarn",
               "config.json: rope_type '{}' (scaled rotary frequencies, factor {}) is not implemented; remove "
               "rope_scaling to run the model within its original context", c.rope.type, c.rope.factor);
  RopeParams p;
  p.rotary_dim = c.rotary_dim();
  p.theta = c.rope.theta;
  if (c.rope.mrope_interleaved) p.mrope_section = c.rope.mrope_section;
  if (type == "yarn") {
    const io::RopeConfig& r = c.rope;
    const int64_t original = r.original_max_position_embeddings.value_or(c.max_position_embeddings);
    p.yarn = YarnParams{.factor = r.factor,
                        .original_max_positions = original,
                        .beta_fast = r.beta_fast,
                        .beta_slow = r.beta_slow,
                        .attention_factor = r.attention_factor,
                        .mscale = r.mscale,
                        .mscale_all_dim = r.mscale_all_dim,
                        .truncate = r.truncate};
  }
  return p;
}

Attention Attention::load(const WeightLoader& w, const std::string& prefix, const io::TextConfig& c, bool output_gate,
                          int64_t kv_index) {
  const std::string p = prefix + ".self_attn.";
  Attention a;
  a.name = prefix + ".self_attn";
  a.q_proj = w.matrix(p + "q_proj.weight");
  a.k_proj = w.matrix(p + "k_proj.weight");
  a.v_proj = w.matrix(p + "v_proj.weight");
  a.o_proj = w.matrix(p + "o_proj.weight");
  a.q_norm = w.vector(p + "q_norm.weight");
  a.k_norm = w.vector(p + "k_norm.weight");
  a.output_gate = output_gate;
  a.heads = c.num_attention_heads;
  a.kv_heads = c.num_key_value_heads;
  a.head_dim = c.head_dim;
  a.eps = static_cast<float>(c.rms_norm_eps);
  a.rope = rope_params(c);
  a.kv_index = kv_index;
  return a;
}

void Attention::forward(ForwardContext& ctx, const Tensor& x, Tensor& out) const {
  Ops& ops = ctx.ops;
  const int64_t T = ctx.tokens(), hd = head_dim;
  Tensor q = ctx.alloc({T, heads, hd});
  Tensor k = ctx.alloc({T, kv_heads, hd});
  Tensor v = ctx.alloc({T, kv_heads, hd});
  Tensor k_flat = k.reshape({T, kv_heads * hd}), v_flat = v.reshape({T, kv_heads * hd});
  Tensor gate;
  if (output_gate) {
    // q_proj rows interleave per head: [query(hd) | gate(hd)] for head 0, then head 1, ...
    Tensor q_and_gate = ctx.alloc({T, heads * 2 * hd});
    ctx.input_linear_many(x, {&q_proj, &k_proj, &v_proj}, {&q_and_gate, &k_flat, &v_flat});
    Tensor per_head = q_and_gate.reshape({T * heads, 2 * hd});
    Tensor q_rows = q.reshape({T * heads, hd});
    gate = ctx.alloc({T * heads, hd});
    ops.copy_columns(per_head, 0, q_rows, 0, hd);
    ops.copy_columns(per_head, hd, gate, 0, hd);
    gate = gate.reshape({T, heads * hd});
  } else {
    Tensor q_flat = q.reshape({T, heads * hd});
    ctx.input_linear_many(x, {&q_proj, &k_proj, &v_proj}, {&q_flat, &k_flat, &v_flat});
  }

  KvPool& pool = ctx.cache.kv(kv_index);
  ops.rms_norm_rope_store(q, k, v, q_norm, k_norm, eps, ctx.positions, rope, ctx.attention, pool);
  ctx.named(name, ".q", q);
  ctx.named(name, ".k", k);
  ctx.named(name, ".v", v);
  Tensor attn = ctx.alloc({T, heads, hd});
  ops.attention(q, pool, ctx.attention, 1.0f / std::sqrt(static_cast<float>(hd)), attn);
  Tensor attn_flat = attn.reshape({T, heads * hd});
  ctx.named(name, ".attention", attn_flat);
  if (output_gate) ops.sigmoid_mul(attn_flat, gate);
  ops.linear(attn_flat, o_proj, out);
}

}  // namespace qinfer::layers
