#include "layers/gated_deltanet.h"

#include <cmath>

namespace qinfer::layers {

GatedDeltaNet GatedDeltaNet::load(const WeightLoader& w, const std::string& prefix, const io::TextConfig& c,
                                  bool grouped, int64_t state_index) {
  const std::string p = prefix + ".linear_attn.";
  GatedDeltaNet g;
  g.name = prefix + ".linear_attn";
  g.grouped = grouped;
  if (grouped) {
    g.in_proj_qkvz = w.matrix(p + "in_proj_qkvz.weight");
    g.in_proj_ba = w.matrix(p + "in_proj_ba.weight");
  } else {
    g.in_proj_qkv = w.matrix(p + "in_proj_qkv.weight");
    g.in_proj_z = w.matrix(p + "in_proj_z.weight");
    g.in_proj_b = w.matrix(p + "in_proj_b.weight");
    g.in_proj_a = w.matrix(p + "in_proj_a.weight");
  }
  g.conv1d = w.vector(p + "conv1d.weight");
  g.A_log = w.vector(p + "A_log");
  g.dt_bias = w.vector(p + "dt_bias");
  g.norm = w.vector(p + "norm.weight");
  g.out_proj = w.matrix(p + "out_proj.weight");
  g.key_heads = c.linear_num_key_heads;
  g.value_heads = c.linear_num_value_heads;
  g.key_dim = c.linear_key_head_dim;
  g.value_dim = c.linear_value_head_dim;
  g.eps = static_cast<float>(c.rms_norm_eps);
  g.state_index = state_index;
  return g;
}

void GatedDeltaNet::forward(ForwardContext& ctx, const Tensor& x, Tensor& out) const {
  Ops& ops = ctx.ops;
  const int64_t T = ctx.tokens(), Hk = key_heads, Hv = value_heads, Dk = key_dim, Dv = value_dim;
  const int64_t keys = Hk * Dk, values = Hv * Dv, conv_channels = 2 * keys + values, r = Hv / Hk;

  // 1. Projections: qkv in conv channel order (q all heads | k | v), z [T,Hv,Dv], b and a [T,Hv].
  Tensor qkv = ctx.alloc({T, conv_channels}), z = ctx.alloc({T, values});
  Tensor b = ctx.alloc({T, Hv}), a = ctx.alloc({T, Hv});
  if (grouped) {
    // Per key head g: [q(Dk) | k(Dk) | v(r·Dv) | z(r·Dv)] and [b(r) | a(r)]; value head = g·r + j.
    Tensor qkvz = ctx.alloc({T, 2 * keys + 2 * values}), ba = ctx.alloc({T, 2 * Hv});
    ops.linear_many(x, {&in_proj_qkvz, &in_proj_ba}, {&qkvz, &ba});
    Tensor groups = qkvz.reshape({T * Hk, 2 * Dk + 2 * r * Dv});
    Tensor q = ctx.alloc({T * Hk, Dk}), k = ctx.alloc({T * Hk, Dk}), v = ctx.alloc({T * Hk, r * Dv});
    Tensor z_groups = z.reshape({T * Hk, r * Dv});
    ops.copy_columns(groups, 0, q, 0, Dk);
    ops.copy_columns(groups, Dk, k, 0, Dk);
    ops.copy_columns(groups, 2 * Dk, v, 0, r * Dv);
    ops.copy_columns(groups, 2 * Dk + r * Dv, z_groups, 0, r * Dv);
    ops.copy_columns(q.reshape({T, keys}), 0, qkv, 0, keys);
    ops.copy_columns(k.reshape({T, keys}), 0, qkv, keys, keys);
    ops.copy_columns(v.reshape({T, values}), 0, qkv, 2 * keys, values);
    Tensor ba_groups = ba.reshape({T * Hk, 2 * r});
    Tensor b_groups = b.reshape({T * Hk, r}), a_groups = a.reshape({T * Hk, r});
    ops.copy_columns(ba_groups, 0, b_groups, 0, r);
    ops.copy_columns(ba_groups, r, a_groups, 0, r);
  } else {
    ops.linear_many(x, {&in_proj_qkv, &in_proj_z, &in_proj_b, &in_proj_a}, {&qkv, &z, &b, &a});
  }

  // 2. Causal conv over the channels with SiLU, continuing each sequence's window.
  Tensor conv = ctx.alloc({T, conv_channels});
  ops.conv1d_causal(qkv, conv1d, ctx.attention.seqs, ctx.cache.conv_state(state_index), conv);
  ctx.named(name, ".conv", conv);

  // 3. q, k l2-normalized per head (q also scaled by Dk^-1/2); v as is.
  Tensor q = ctx.alloc({T, Hk, Dk}), k = ctx.alloc({T, Hk, Dk}), v = ctx.alloc({T, Hv, Dv});
  Tensor q_flat = q.reshape({T, keys}), k_flat = k.reshape({T, keys}), v_flat = v.reshape({T, values});
  ops.copy_columns(conv, 0, q_flat, 0, keys);
  ops.copy_columns(conv, keys, k_flat, 0, keys);
  ops.copy_columns(conv, 2 * keys, v_flat, 0, values);
  Tensor q_rows = q.reshape({T * Hk, Dk}), k_rows = k.reshape({T * Hk, Dk});
  ops.l2_norm(q_rows, 1e-6f, 1.0f / std::sqrt(static_cast<float>(Dk)), q_rows);
  ops.l2_norm(k_rows, 1e-6f, 1.0f, k_rows);

  // 4. Gates and the delta rule over each sequence's state.
  Tensor g = ctx.alloc({T, Hv}), beta = ctx.alloc({T, Hv});
  ops.gdn_gates(a, b, A_log, dt_bias, g, beta);
  ctx.named(name, ".g", g);
  ctx.named(name, ".beta", beta);
  Tensor o = ctx.alloc({T, Hv, Dv});
  ops.gated_delta_rule(q, k, v, g, beta, ctx.attention.seqs, ctx.cache.delta_state(state_index), o,
                       GdnAlgorithm::automatic);

  ctx.named(name, ".core", o);

  // 5. Gated RMSNorm per value head with z, then out_proj.
  Tensor o_rows = o.reshape({T * Hv, Dv});
  ops.rms_norm_gated(o_rows, z.reshape({T * Hv, Dv}), norm, eps, o_rows);
  ops.linear(o.reshape({T, values}), out_proj, out);
}

}  // namespace qinfer::layers
