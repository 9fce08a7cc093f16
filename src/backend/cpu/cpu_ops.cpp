// The cpu backend: argument checks, threading and layout handling over the kernel table of
// kernels.h. Matrix, attention and Gated DeltaNet ops live in matmul.cpp, attention.cpp and gdn.cpp.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>

#include "backend/cpu/cpu_ops.h"

namespace qinfer::cpu {
namespace {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

// Elementwise work below this many floats runs on the calling thread.
constexpr int64_t kSerialElements = 1 << 15;

}  // namespace

void Context::parallel(int64_t n, int64_t serial_below, const std::function<void(int64_t, int64_t)>& body) const {
  if (n <= 0) return;
  if (n <= serial_below || pool.size() == 1) return body(0, n);
  pool.parallel_for(static_cast<size_t>(n), [&](size_t begin, size_t end) {
    body(static_cast<int64_t>(begin), static_cast<int64_t>(end));
  });
}

void check_tensor(std::string_view op, std::string_view arg, const Tensor& t, int rank) {
  QINFER_CHECK(t.device == Device::cpu, "cpu {}: {} is not in host memory", op, arg);
  QINFER_CHECK(t.rank() == rank, "cpu {}: {} must have rank {}, got shape {}", op, arg, rank, shape_str(t.shape));
  for (int64_t d : t.shape) QINFER_CHECK(d >= 0, "cpu {}: {} has a negative dimension {}", op, arg, shape_str(t.shape));
  QINFER_CHECK(t.data != nullptr || t.numel() == 0, "cpu {}: {} has no storage", op, arg);
}

void check_f32(std::string_view op, std::string_view arg, const Tensor& t, int rank) {
  check_tensor(op, arg, t, rank);
  QINFER_CHECK(t.dtype == DType::f32, "cpu {}: {} must be f32, got {}", op, arg, name(t.dtype));
}

void check_kv_pool(std::string_view op, const KvPool& pool) {
  check_tensor(op, "pool.k", pool.k, 4);
  check_tensor(op, "pool.v", pool.v, 4);
  QINFER_CHECK(pool.k.dtype == DType::f32 || pool.k.dtype == DType::bf16, "cpu {}: pool.k must be f32 or bf16, got {}",
               op, name(pool.k.dtype));
  QINFER_CHECK(pool.v.dtype == pool.k.dtype, "cpu {}: pool.k is {} but pool.v {}", op, name(pool.k.dtype),
               name(pool.v.dtype));
}

void check_weight(std::string_view op, std::string_view arg, const Tensor& t, int rank) {
  check_tensor(op, arg, t, rank);
  QINFER_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16,
               "cpu {}: {} must be f32, bf16 or f16, got {}", op, arg, name(t.dtype));
}

void check_shape(std::string_view op, std::string_view arg, const Tensor& t, const std::vector<int64_t>& shape) {
  QINFER_CHECK(t.shape == shape, "cpu {}: {} must have shape {}, got {}", op, arg, shape_str(shape),
               shape_str(t.shape));
}

void check_layout(std::string_view op, const SeqLayout& layout, int64_t tokens, int64_t slots) {
  check_seq_layout(fmt::format("cpu {}", op), layout, tokens, slots);
}

namespace {

float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

class CpuOps final : public Ops {
 public:
  CpuOps(ThreadPool& pool, const Kernels& kernels) : ctx_{pool, kernels} {}

  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::cpu; }

  Tensor alloc(DType dtype, std::vector<int64_t> shape) override {
    for (int64_t d : shape) QINFER_CHECK(d >= 0, "cpu alloc: negative dimension in shape {}", shape_str(shape));
    return host_tensor(dtype, std::move(shape));
  }

  void embedding(const Tensor& ids, const Weight& weight, Tensor& out) override {
    check_tensor("embedding", "ids", ids, 1);
    QINFER_CHECK(ids.dtype == DType::i32, "cpu embedding: ids must be i32, got {}", qinfer::name(ids.dtype));
    if (weight.quantized()) {
      check_quantized("embedding", "table", weight, 2);
      const int64_t T = ids.dim(0), V = weight.shape()[0], H = weight.shape()[1];
      check_f32("embedding", "out", out, 2);
      check_shape("embedding", "out", out, {T, H});
      const int32_t* id = ids.ptr<int32_t>();
      for (int64_t t = 0; t < T; ++t)
        QINFER_CHECK(id[t] >= 0 && id[t] < V, "cpu embedding: ids[{}] = {} is outside the table's {} rows", t, id[t], V);
      for (int64_t t = 0; t < T; ++t) weight.row_f32(id[t], out.ptr<float>() + t * H);
      return;
    }
    const Tensor& table = weight.dense;
    check_weight("embedding", "table", table, 2);
    const int64_t T = ids.dim(0), V = table.dim(0), H = table.dim(1);
    check_f32("embedding", "out", out, 2);
    check_shape("embedding", "out", out, {T, H});
    const int32_t* id = ids.ptr<int32_t>();
    for (int64_t t = 0; t < T; ++t)
      QINFER_CHECK(id[t] >= 0 && id[t] < V, "cpu embedding: ids[{}] = {} is outside the table's {} rows", t, id[t], V);
    const int64_t row_bytes = static_cast<int64_t>(storage_bytes(table.dtype, H));
    ctx_.parallel(T, kSerialElements / std::max<int64_t>(H, 1), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        ctx_.k.to_f32(table.dtype, table.ptr<char>() + id[t] * row_bytes, out.ptr<float>() + t * H, H);
    });
  }

  void linear(const Tensor& x, const Weight& weight, Tensor& y) override {
    check_f32("linear", "x", x, 2);
    if (weight.quantized()) {
      check_quantized("linear", "w", weight, 2);
      const int64_t T = x.dim(0), in = x.dim(1), out = weight.shape()[0];
      QINFER_CHECK(weight.shape()[1] == in, "cpu linear: quantized w does not take inputs of width {}", in);
      check_f32("linear", "y", y, 2);
      check_shape("linear", "y", y, {T, out});
      QINFER_CHECK(y.data != x.data || y.numel() == 0, "cpu linear: y must not alias x");
      cpu::linear_quantized(ctx_, x, weight, y);
      return;
    }
    const Tensor& w = weight.dense;
    check_weight("linear", "w", w, 2);
    const int64_t T = x.dim(0), in = x.dim(1), out = w.dim(0);
    QINFER_CHECK(w.dim(1) == in, "cpu linear: w {} does not take inputs of width {}", shape_str(w.shape), in);
    check_f32("linear", "y", y, 2);
    check_shape("linear", "y", y, {T, out});
    QINFER_CHECK(y.data != x.data || y.numel() == 0, "cpu linear: y must not alias x");
    gemm(ctx_, T, out, in, x.ptr<float>(), w.data, w.dtype, y.ptr<float>());
  }

  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override {
    check_rows("rms_norm", x, y);
    const int64_t N = x.dim(0), D = x.dim(1);
    check_f32("rms_norm", "w", w, 1);
    check_shape("rms_norm", "w", w, {D});
    ctx_.parallel(N, kSerialElements / std::max<int64_t>(D, 1), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x.ptr<float>() + r * D;
        const float inv = 1.0f / std::sqrt(ctx_.k.sum_sq(xr, D) / static_cast<float>(D) + eps);
        ctx_.k.scale_mul(xr, inv, w.ptr<float>(), y.ptr<float>() + r * D, D);
      }
    });
  }

  // The add and the norm of each row back to back, with the kernels of add and rms_norm: the same
  // values as the two ops, the row still in cache for the norm.
  void add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y) override {
    check_rows("add_rms_norm", x, y);
    check_f32("add_rms_norm", "delta", delta, 2);
    check_shape("add_rms_norm", "delta", delta, x.shape);
    const int64_t N = x.dim(0), D = x.dim(1);
    check_f32("add_rms_norm", "w", w, 1);
    check_shape("add_rms_norm", "w", w, {D});
    QINFER_CHECK((y.data != x.data && y.data != delta.data) || y.numel() == 0,
                 "cpu add_rms_norm: y must not alias x or delta");
    ctx_.parallel(N, kSerialElements / std::max<int64_t>(D, 1), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        float* xr = x.ptr<float>() + r * D;
        ctx_.k.add(xr, delta.ptr<float>() + r * D, D);
        const float inv = 1.0f / std::sqrt(ctx_.k.sum_sq(xr, D) / static_cast<float>(D) + eps);
        ctx_.k.scale_mul(xr, inv, w.ptr<float>(), y.ptr<float>() + r * D, D);
      }
    });
  }

  void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& y) override {
    check_rows("rms_norm_gated", x, y);
    const int64_t N = x.dim(0), D = x.dim(1);
    check_f32("rms_norm_gated", "z", z, 2);
    check_shape("rms_norm_gated", "z", z, x.shape);
    check_f32("rms_norm_gated", "w", w, 1);
    check_shape("rms_norm_gated", "w", w, {D});
    ctx_.parallel(N, kSerialElements / std::max<int64_t>(D, 1), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x.ptr<float>() + r * D;
        float* yr = y.ptr<float>() + r * D;
        const float inv = 1.0f / std::sqrt(ctx_.k.sum_sq(xr, D) / static_cast<float>(D) + eps);
        ctx_.k.scale_mul(xr, inv, w.ptr<float>(), yr, D);
        ctx_.k.silu_mul(z.ptr<float>() + r * D, yr, yr, D);
      }
    });
  }

  void l2_norm(const Tensor& x, float eps, float scale, Tensor& y) override {
    check_rows("l2_norm", x, y);
    const int64_t N = x.dim(0), D = x.dim(1);
    ctx_.parallel(N, kSerialElements / std::max<int64_t>(D, 1), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* xr = x.ptr<float>() + r * D;
        ctx_.k.scale_mul(xr, scale / std::sqrt(ctx_.k.sum_sq(xr, D) + eps), nullptr, y.ptr<float>() + r * D, D);
      }
    });
  }

  // Angles in f32 exactly as HF computes them (inv_freq, pos·inv_freq, cos and sin times the attention
  // factor), like ref: at position 10⁵ a double angle would differ from HF's by more than the op's
  // tolerance.
  void rope(Tensor& x, const Tensor& positions, const RopeParams& params) override {
    rope_heads("rope", x, nullptr, 0.0f, positions, params);
  }

  void rms_norm_rope(Tensor& x, const Tensor& w, float eps, const Tensor& positions,
                     const RopeParams& params) override {
    check_f32("rms_norm_rope", "x", x, 3);
    check_f32("rms_norm_rope", "w", w, 1);
    check_shape("rms_norm_rope", "w", w, {x.dim(2)});
    rope_heads("rms_norm_rope", x, &w, eps, positions, params);
  }

  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    check_same("silu_mul", "gate", gate, "up", up);
    check_same("silu_mul", "gate", gate, "out", out);
    elementwise(gate.numel(), [&](int64_t i, int64_t n) {
      ctx_.k.silu_mul(gate.ptr<float>() + i, up.ptr<float>() + i, out.ptr<float>() + i, n);
    });
  }

  // gate has x's shape, or [N, 1] for x [N, D]: one gate per row (the shared-expert gate).
  void sigmoid_mul(Tensor& x, const Tensor& gate) override {
    check_f32("sigmoid_mul", "x", x, x.rank());
    const bool per_row = x.rank() == 2 && gate.rank() == 2 && gate.dim(1) == 1 && x.dim(1) != 1;
    check_f32("sigmoid_mul", "gate", gate, gate.rank());
    if (!per_row) {
      check_shape("sigmoid_mul", "gate", gate, x.shape);
      elementwise(x.numel(), [&](int64_t i, int64_t n) {
        ctx_.k.sigmoid_mul(x.ptr<float>() + i, gate.ptr<float>() + i, n);
      });
      return;
    }
    check_shape("sigmoid_mul", "gate", gate, {x.dim(0), 1});
    const int64_t D = x.dim(1);
    ctx_.parallel(x.dim(0), kSerialElements / D, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r)
        ctx_.k.scale(1.0f / (1.0f + std::exp(-gate.ptr<float>()[r])), x.ptr<float>() + r * D, D);
    });
  }

  void add(Tensor& x, const Tensor& y) override {
    check_same("add", "x", x, "y", y);
    elementwise(x.numel(), [&](int64_t i, int64_t n) { ctx_.k.add(x.ptr<float>() + i, y.ptr<float>() + i, n); });
  }

  void kv_store(const Tensor& k, const Tensor& v, const AttentionLayout& layout, KvPool& pool) override {
    check_f32("kv_store", "k", k, 3);
    check_f32("kv_store", "v", v, 3);
    check_shape("kv_store", "v", v, k.shape);
    const int64_t T = k.dim(0), kv_heads = k.dim(1), head_dim = k.dim(2), row = kv_heads * head_dim;
    check_layout("kv_store", layout.seqs, T, -1);
    const int64_t S = layout.seqs.num_seqs();
    check_kv_pool("kv_store", pool);
    check_shape("kv_store", "pool.k", pool.k, {pool.k.dim(0), layout.block_size, kv_heads, head_dim});
    check_shape("kv_store", "pool.v", pool.v, pool.k.shape);
    QINFER_CHECK(static_cast<int64_t>(layout.block_table.size()) == S * layout.max_blocks &&
                     static_cast<int64_t>(layout.cached.size()) == S,
                 "cpu kv_store: block_table has {} entries and cached {} for {} sequences of {} blocks",
                 layout.block_table.size(), layout.cached.size(), S, layout.max_blocks);
    const auto& cu = layout.seqs.cu_seqlens;
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
        const int64_t position = layout.cached[s] + (t - cu[s]), logical = position / layout.block_size;
        QINFER_CHECK(layout.cached[s] >= 0 && logical < layout.max_blocks,
                     "cpu kv_store: sequence {} reaches position {}, beyond its block table of {} blocks of {}", s,
                     position, layout.max_blocks, layout.block_size);
        const int64_t block = layout.block_table[s * layout.max_blocks + logical];
        QINFER_CHECK(block >= 0 && block < pool.k.dim(0), "cpu kv_store: block_table[{}, {}] = {} is outside the {} blocks",
                     s, logical, block, pool.k.dim(0));
        const int64_t dst = (block * layout.block_size + position % layout.block_size) * row;
        if (pool.k.dtype == DType::f32) {
          std::copy_n(k.ptr<float>() + t * row, row, pool.k.ptr<float>() + dst);
          std::copy_n(v.ptr<float>() + t * row, row, pool.v.ptr<float>() + dst);
          continue;
        }
        for (int64_t i = 0; i < row; ++i) {  // bf16, rounded to nearest even
          pool.k.ptr<uint16_t>()[dst + i] = f32_to_bf16(k.ptr<float>()[t * row + i]);
          pool.v.ptr<uint16_t>()[dst + i] = f32_to_bf16(v.ptr<float>()[t * row + i]);
        }
      }
    }
  }

  void attention(const Tensor& q, const KvPool& pool, const AttentionLayout& layout, float scale,
                 Tensor& out) override {
    cpu::attention(ctx_, q, pool, layout, scale, out);
  }

  // The same arithmetic as ref (f32 exp, double sum, stable order by probability) so that expert
  // ids agree exactly even for near-ties.
  void moe_route(const Tensor& logits, bool renormalize, Tensor& ids, Tensor& weights) override {
    check_f32("moe_route", "logits", logits, 2);
    const int64_t T = logits.dim(0), E = logits.dim(1);
    check_tensor("moe_route", "ids", ids, 2);
    QINFER_CHECK(ids.dtype == DType::i32 && ids.dim(0) == T, "cpu moe_route: ids must be i32 [{}, k], got {} {}", T,
                 qinfer::name(ids.dtype), shape_str(ids.shape));
    const int64_t k = ids.dim(1);
    check_f32("moe_route", "weights", weights, 2);
    check_shape("moe_route", "weights", weights, {T, k});
    QINFER_CHECK(k >= 1 && k <= E, "cpu moe_route: top-k {} must be in [1, {} experts]", k, E);
    ctx_.parallel(T, 16, [&](int64_t t0, int64_t t1) {
      std::vector<float> probs(E);
      std::vector<int32_t> order(E);
      for (int64_t t = t0; t < t1; ++t) {
        const float* lt = logits.ptr<float>() + t * E;
        const float max_logit = *std::max_element(lt, lt + E);
        double sum = 0.0;
        for (int64_t e = 0; e < E; ++e) sum += probs[e] = std::exp(lt[e] - max_logit);
        for (int64_t e = 0; e < E; ++e) probs[e] = static_cast<float>(probs[e] / sum);
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
          return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
        });
        float total = 0.0f;
        for (int64_t j = 0; j < k; ++j) total += probs[order[j]];
        for (int64_t j = 0; j < k; ++j) {
          ids.ptr<int32_t>()[t * k + j] = order[j];
          weights.ptr<float>()[t * k + j] = renormalize ? probs[order[j]] / total : probs[order[j]];
        }
      }
    });
  }

  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const Weight& gate, const Weight& up,
                   const Weight& down, Tensor& out) override {
    if (gate.quantized() || up.quantized() || down.quantized()) {
      check_f32("moe_experts", "x", x, 2);
      check_f32("moe_experts", "out", out, 2);
      check_shape("moe_experts", "out", out, x.shape);
      QINFER_CHECK(out.data != x.data || out.numel() == 0, "cpu moe_experts: out must not alias x");
      QINFER_CHECK(ids.dtype == DType::i32 && ids.rank() == 2 && ids.dim(0) == x.dim(0),
                   "cpu moe_experts: ids must be i32 [{}, k]", x.dim(0));
      cpu::moe_experts_quantized(ctx_, x, ids, weights, gate, up, down, out);
      return;
    }
    cpu::moe_experts(ctx_, x, ids, weights, gate.dense, up.dense, down.dense, out);
  }

  void gdn_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, Tensor& g,
                 Tensor& beta) override {
    check_f32("gdn_gates", "a", a, 2);
    const int64_t T = a.dim(0), Hv = a.dim(1);
    for (const auto& [arg, t] : {std::pair<const char*, const Tensor*>{"b", &b}, {"g", &g}, {"beta", &beta}}) {
      check_f32("gdn_gates", arg, *t, 2);
      check_shape("gdn_gates", arg, *t, a.shape);
    }
    check_f32("gdn_gates", "A_log", A_log, 1);
    check_shape("gdn_gates", "A_log", A_log, {Hv});
    check_f32("gdn_gates", "dt_bias", dt_bias, 1);
    check_shape("gdn_gates", "dt_bias", dt_bias, {Hv});
    std::vector<float> rate(Hv);
    for (int64_t h = 0; h < Hv; ++h) rate[h] = std::exp(A_log.ptr<float>()[h]);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < Hv; ++h) {
        const int64_t i = t * Hv + h;
        g.ptr<float>()[i] = -rate[h] * softplus(a.ptr<float>()[i] + dt_bias.ptr<float>()[h]);
        beta.ptr<float>()[i] = 1.0f / (1.0f + std::exp(-b.ptr<float>()[i]));
      }
    }
  }

  void conv1d_causal(const Tensor& x, const Tensor& w, const SeqLayout& layout, Tensor& conv_state,
                     Tensor& out) override {
    cpu::conv1d_causal(ctx_, x, w, layout, conv_state, out);
  }

  void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        const SeqLayout& layout, Tensor& state, Tensor& out, GdnAlgorithm algorithm) override {
    cpu::gated_delta_rule(ctx_, q, k, v, g, beta, layout, state, out, algorithm);
  }

  void sample(const Tensor& logits, const std::vector<SamplingParams>& params,
              const std::vector<std::vector<int32_t>>& history, const std::vector<uint64_t>& step,
              std::vector<int32_t>& out) override {
    sample_rows(logits, params, history, step, out);
  }

  void mask_logits(Tensor& logits, const Tensor& rows, const Tensor& allowed) override {
    mask_logits_rows(logits, rows, allowed);
  }

 private:
  // rope over every head of x, each head first rms_norm'ed by w when w is given (rms_norm_rope).
  void rope_heads(std::string_view op, Tensor& x, const Tensor* w, float eps, const Tensor& positions,
                  const RopeParams& params) {
    check_f32(op, "x", x, 3);
    const int64_t T = x.dim(0), heads = x.dim(1), head_dim = x.dim(2), d = params.rotary_dim, half = d / 2;
    check_tensor(op, "positions", positions, 2);
    QINFER_CHECK(positions.dtype == DType::i32, "cpu {}: positions must be i32, got {}", op,
                 qinfer::name(positions.dtype));
    check_shape(op, "positions", positions, {3, T});
    QINFER_CHECK(d > 0 && d % 2 == 0 && d <= head_dim, "cpu {}: rotary_dim {} must be even and in (0, head_dim {}]",
                 op, d, head_dim);
    const RopeFrequencies f = rope_frequencies(fmt::format("cpu {}", op), params);
    const int32_t* pos = positions.ptr<int32_t>();
    ctx_.parallel(T, kSerialElements / std::max<int64_t>(heads * head_dim, 1), [&](int64_t t0, int64_t t1) {
      std::vector<float> cos(half), sin(half);
      for (int64_t t = t0; t < t1; ++t) {
        for (int64_t i = 0; i < half; ++i) {
          const float angle = static_cast<float>(pos[f.axis[i] * T + t]) * f.inv_freq[i];
          cos[i] = std::cos(angle) * f.attention_factor, sin[i] = std::sin(angle) * f.attention_factor;
        }
        for (int64_t h = 0; h < heads; ++h) {
          float* xh = x.ptr<float>() + (t * heads + h) * head_dim;
          if (w) {
            const float inv = 1.0f / std::sqrt(ctx_.k.sum_sq(xh, head_dim) / static_cast<float>(head_dim) + eps);
            ctx_.k.scale_mul(xh, inv, w->ptr<float>(), xh, head_dim);
          }
          ctx_.k.rope_rotate(xh, cos.data(), sin.data(), half);
        }
      }
    });
  }

  void check_rows(std::string_view op, const Tensor& x, const Tensor& y) {
    check_f32(op, "x", x, 2);
    check_f32(op, "y", y, 2);
    check_shape(op, "y", y, x.shape);
  }

  void check_same(std::string_view op, std::string_view a_name, const Tensor& a, std::string_view b_name,
                  const Tensor& b) {
    check_f32(op, a_name, a, a.rank());
    check_f32(op, b_name, b, b.rank());
    check_shape(op, b_name, b, a.shape);
  }

  // fn(offset, count) over [0, n) in chunks of whole cache lines.
  void elementwise(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
    const int64_t lines = (n + 15) / 16;
    ctx_.parallel(lines, kSerialElements / 16, [&](int64_t l0, int64_t l1) {
      const int64_t i0 = l0 * 16, i1 = std::min(n, l1 * 16);
      fn(i0, i1 - i0);
    });
  }

  Context ctx_;
};

}  // namespace
}  // namespace qinfer::cpu

namespace qinfer {

std::unique_ptr<Ops> make_cpu_ops(ThreadPool& pool, const cpu::Kernels& kernels) {
  return std::make_unique<cpu::CpuOps>(pool, kernels);
}

std::unique_ptr<Ops> make_cpu_ops(ThreadPool& pool) { return make_cpu_ops(pool, cpu::best_kernels()); }

}  // namespace qinfer
