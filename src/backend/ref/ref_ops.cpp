// The scalar fp32 oracle of every op: one plain loop per formula of ops.h / qwen-spec.md, dot
// products accumulated in double, every argument checked so that a bad shape throws instead of
// reading out of bounds.
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>
#include <string>

#include "backend/ops.h"
#include "backend/ref/dot.h"
#include "backend/ref/gated_delta.h"
#include "core/error.h"

namespace qinfer {
namespace {

using ref::dot;
constexpr int64_t kAny = -1;
constexpr DType kF32[] = {DType::f32};
constexpr DType kKvDTypes[] = {DType::f32, DType::bf16};
constexpr DType kI32[] = {DType::i32};
constexpr DType kWeight[] = {DType::f32, DType::bf16, DType::f16};

std::string shape_str(const std::vector<int64_t>& shape) {
  std::vector<std::string> dims;
  for (int64_t d : shape) dims.push_back(d == kAny ? "?" : std::to_string(d));
  return fmt::format("[{}]", fmt::join(dims, ", "));
}

// Throws unless t is a host tensor of one of `dtypes` with exactly `shape` (kAny: any size).
void check_tensor(std::string_view op, std::string_view arg, const Tensor& t, std::span<const DType> dtypes,
                  const std::vector<int64_t>& shape) {
  bool ok = std::find(dtypes.begin(), dtypes.end(), t.dtype) != dtypes.end() && t.shape.size() == shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = t.shape[i] >= 0 && (shape[i] == kAny || shape[i] == t.shape[i]);
  if (!ok) {
    std::vector<std::string_view> names;
    for (DType d : dtypes) names.push_back(name(d));
    fail("ref {}: {} must be {} {}, got {} {}", op, arg, fmt::join(names, "|"), shape_str(shape), name(t.dtype),
         shape_str(t.shape));
  }
  QINFER_CHECK(t.device == Device::cpu, "ref {}: {} is on the GPU; the ref backend reads host memory", op, arg);
  QINFER_CHECK(t.data != nullptr || t.numel() == 0, "ref {}: {} has no storage", op, arg);
}

void check_distinct(std::string_view op, std::string_view a_name, const Tensor& a, std::string_view b_name,
                    const Tensor& b) {
  QINFER_CHECK(a.data != b.data || a.numel() == 0, "ref {}: {} must not alias {}", op, a_name, b_name);
}

// cu_seqlens starts at 0, never decreases and ends at `tokens`; with `slots` >= 0 every sequence
// also names a distinct state slot below it (two sequences sharing a slot would race on it).
// A dense weight is checked like a tensor; a quantized one by its logical shape, its layout and the
// shapes of its scales / biases.
void check_weight(std::string_view op, std::string_view arg, const Weight& w, const std::vector<int64_t>& shape) {
  if (!w.quantized()) return check_tensor(op, arg, w.dense, kWeight, shape);
  quant::validate(w.layout);
  const std::vector<int64_t> logical = w.shape();
  bool ok = logical.size() == shape.size() && w.codes.dtype == DType::u32 && w.codes.device == Device::cpu &&
            logical.back() % w.layout.group_size == 0;
  for (size_t i = 0; ok && i < shape.size(); ++i) ok = shape[i] == kAny || shape[i] == logical[i];
  if (!ok) fail("ref {}: {} must be quantized {}, got codes {} {} ({}-bit)", op, arg, shape_str(shape),
                name(w.codes.dtype), shape_str(w.codes.shape), w.layout.bits);
  std::vector<int64_t> grouped = logical;
  grouped.back() /= w.layout.group_size;
  const bool affine = w.layout.mode == quant::Mode::affine;
  const DType float_scales[] = {DType::f32, DType::bf16, DType::f16};
  const DType code_scales[] = {DType::u8};
  check_tensor(op, std::string(arg) + ".scales", w.scales, affine ? std::span<const DType>(float_scales)
                                                                  : std::span<const DType>(code_scales), grouped);
  if (affine) check_tensor(op, std::string(arg) + ".biases", w.biases, float_scales, grouped);
}

void check_seqs(std::string_view op, const SeqLayout& layout, int64_t tokens, int64_t slots) {
  check_seq_layout(fmt::format("ref {}", op), layout, tokens, slots);
}


float silu(float x) { return x / (1.0f + std::exp(-x)); }
float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
// torch.nn.functional.softplus(x) with beta 1, threshold 20.
float softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// Where the key / value of `position` of sequence s sits in the pool: a row index into
// [num_blocks * block_size, kv_heads * head_dim].
int64_t kv_row(std::string_view op, const AttentionLayout& layout, int64_t s, int64_t position, int64_t num_blocks) {
  const int64_t logical = position / layout.block_size;
  QINFER_CHECK(logical < layout.max_blocks,
               "ref {}: sequence {} reaches position {}, beyond its block table of {} blocks of {} tokens", op, s,
               position, layout.max_blocks, layout.block_size);
  const int32_t physical = layout.block_table[s * layout.max_blocks + logical];
  QINFER_CHECK(physical >= 0 && physical < num_blocks,
               "ref {}: block_table[{}, {}] = {} is outside the pool's {} blocks", op, s, logical, physical,
               num_blocks);
  return physical * layout.block_size + position % layout.block_size;
}

// Validates the layout against a pool [num_blocks, block_size, kv_heads, head_dim] and the batch.
void check_attention_layout(std::string_view op, const AttentionLayout& layout, const KvPool& pool, int64_t tokens,
                            int64_t kv_heads, int64_t head_dim) {
  check_seqs(op, layout.seqs, tokens, -1);
  const int64_t S = layout.seqs.num_seqs();
  QINFER_CHECK(layout.block_size > 0 && layout.max_blocks >= 0, "ref {}: block_size {} / max_blocks {} are invalid", op,
               layout.block_size, layout.max_blocks);
  QINFER_CHECK(static_cast<int64_t>(layout.block_table.size()) == S * layout.max_blocks,
               "ref {}: block_table has {} entries, expected {} sequences x {} max_blocks", op,
               layout.block_table.size(), S, layout.max_blocks);
  QINFER_CHECK(static_cast<int64_t>(layout.cached.size()) == S, "ref {}: cached has {} entries for {} sequences", op,
               layout.cached.size(), S);
  for (int64_t s = 0; s < S; ++s)
    QINFER_CHECK(layout.cached[s] >= 0, "ref {}: cached[{}] = {} is negative", op, s, layout.cached[s]);
  check_tensor(op, "pool.k", pool.k, kKvDTypes, {kAny, layout.block_size, kv_heads, head_dim});
  check_tensor(op, "pool.v", pool.v, std::span<const DType>(&pool.k.dtype, 1), pool.k.shape);
}

// n elements of a KV pool (f32 or bf16) from element `first`, as f32.
void read_kv(const Tensor& pool, int64_t first, int64_t n, float* out) {
  convert_to_f32(pool.dtype, static_cast<const std::byte*>(pool.data) + storage_bytes(pool.dtype, static_cast<uint64_t>(first)), out,
                 static_cast<uint64_t>(n));
}

// n values into a KV pool from element `first`, rounded to its dtype (RNE for bf16).
void write_kv(Tensor& pool, int64_t first, int64_t n, const float* values) {
  if (pool.dtype == DType::f32) {
    std::copy_n(values, n, pool.ptr<float>() + first);
    return;
  }
  for (int64_t i = 0; i < n; ++i) pool.ptr<uint16_t>()[first + i] = f32_to_bf16(values[i]);
}

class RefOps final : public Ops {
 public:
  std::string_view name() const override { return "ref"; }
  Device device() const override { return Device::cpu; }

  Tensor alloc(DType dtype, std::vector<int64_t> shape) override {
    for (int64_t d : shape) QINFER_CHECK(d >= 0, "ref alloc: negative dimension in shape {}", shape_str(shape));
    return host_tensor(dtype, std::move(shape));
  }

  void embedding(const Tensor& ids, const Weight& table, Tensor& out) override {
    check_tensor("embedding", "ids", ids, kI32, {kAny});
    check_weight("embedding", "table", table, {kAny, kAny});
    const int64_t T = ids.dim(0), V = table.shape()[0], H = table.shape()[1];
    check_tensor("embedding", "out", out, kF32, {T, H});
    for (int64_t t = 0; t < T; ++t) {
      const int32_t id = ids.ptr<int32_t>()[t];
      QINFER_CHECK(id >= 0 && id < V, "ref embedding: ids[{}] = {} is outside the table's {} rows", t, id, V);
      table.row_f32(id, out.ptr<float>() + t * H);
    }
  }

  void linear(const Tensor& x, const Weight& w, Tensor& y) override {
    check_tensor("linear", "x", x, kF32, {kAny, kAny});
    const int64_t T = x.dim(0), in = x.dim(1);
    check_weight("linear", "w", w, {kAny, in});
    const int64_t out = w.shape()[0];
    check_tensor("linear", "y", y, kF32, {T, out});
    check_distinct("linear", "y", y, "x", x);
    std::vector<float> row(in);
    for (int64_t o = 0; o < out; ++o) {
      w.row_f32(o, row.data());
      for (int64_t t = 0; t < T; ++t)
        y.ptr<float>()[t * out + o] = static_cast<float>(dot(x.ptr<float>() + t * in, row.data(), in));
    }
  }

  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override {
    check_tensor("rms_norm", "x", x, kF32, {kAny, kAny});
    const int64_t N = x.dim(0), D = x.dim(1);
    check_tensor("rms_norm", "w", w, kF32, {D});
    check_tensor("rms_norm", "y", y, kF32, {N, D});
    for (int64_t r = 0; r < N; ++r) {
      const float* xr = x.ptr<float>() + r * D;
      const float inv_rms = static_cast<float>(1.0 / std::sqrt(dot(xr, xr, D) / D + eps));
      for (int64_t i = 0; i < D; ++i) y.ptr<float>()[r * D + i] = xr[i] * inv_rms * w.ptr<float>()[i];
    }
  }

  void add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y) override {
    check_tensor("add_rms_norm", "x", x, kF32, {kAny, kAny});
    check_tensor("add_rms_norm", "delta", delta, kF32, x.shape);
    check_tensor("add_rms_norm", "w", w, kF32, {x.dim(1)});
    check_tensor("add_rms_norm", "y", y, kF32, x.shape);
    check_distinct("add_rms_norm", "y", y, "x", x);
    check_distinct("add_rms_norm", "y", y, "delta", delta);
    add(x, delta);
    rms_norm(x, w, eps, y);
  }

  void rms_norm_gated(const Tensor& x, const Tensor& z, const Tensor& w, float eps, Tensor& y) override {
    check_tensor("rms_norm_gated", "x", x, kF32, {kAny, kAny});
    const int64_t N = x.dim(0), D = x.dim(1);
    check_tensor("rms_norm_gated", "z", z, kF32, {N, D});
    check_tensor("rms_norm_gated", "w", w, kF32, {D});
    check_tensor("rms_norm_gated", "y", y, kF32, {N, D});
    for (int64_t r = 0; r < N; ++r) {
      const float* xr = x.ptr<float>() + r * D;
      const float* zr = z.ptr<float>() + r * D;
      const float inv_rms = static_cast<float>(1.0 / std::sqrt(dot(xr, xr, D) / D + eps));
      for (int64_t i = 0; i < D; ++i) y.ptr<float>()[r * D + i] = xr[i] * inv_rms * w.ptr<float>()[i] * silu(zr[i]);
    }
  }

  void l2_norm(const Tensor& x, float eps, float scale, Tensor& y) override {
    check_tensor("l2_norm", "x", x, kF32, {kAny, kAny});
    const int64_t N = x.dim(0), D = x.dim(1);
    check_tensor("l2_norm", "y", y, kF32, {N, D});
    for (int64_t r = 0; r < N; ++r) {
      const float* xr = x.ptr<float>() + r * D;
      const float inv_norm = static_cast<float>(1.0 / std::sqrt(dot(xr, xr, D) + eps));
      for (int64_t i = 0; i < D; ++i) y.ptr<float>()[r * D + i] = scale * (xr[i] * inv_norm);
    }
  }

  // Follows HF's fp32 arithmetic (inv_freq, pos·inv_freq, cos and sin times the attention factor, all
  // in f32) so that golden comparisons stay tight.
  void rope(Tensor& x, const Tensor& positions, const RopeParams& params) override {
    check_tensor("rope", "x", x, kF32, {kAny, kAny, kAny});
    const int64_t T = x.dim(0), heads = x.dim(1), head_dim = x.dim(2), d = params.rotary_dim, half = d / 2;
    check_tensor("rope", "positions", positions, kI32, {3, T});
    QINFER_CHECK(d > 0 && d % 2 == 0 && d <= head_dim, "ref rope: rotary_dim {} must be even and in (0, head_dim {}]",
                 d, head_dim);
    const RopeFrequencies f = rope_frequencies("ref rope", params);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < half; ++i) {
        const float angle = static_cast<float>(positions.ptr<int32_t>()[f.axis[i] * T + t]) * f.inv_freq[i];
        const float c = std::cos(angle) * f.attention_factor, s = std::sin(angle) * f.attention_factor;
        for (int64_t h = 0; h < heads; ++h) {
          float* xh = x.ptr<float>() + (t * heads + h) * head_dim;
          const float a = xh[i], b = xh[i + half];
          xh[i] = a * c - b * s;
          xh[i + half] = b * c + a * s;
        }
      }
    }
  }

  void rms_norm_rope(Tensor& x, const Tensor& w, float eps, const Tensor& positions,
                     const RopeParams& params) override {
    check_tensor("rms_norm_rope", "x", x, kF32, {kAny, kAny, kAny});
    check_tensor("rms_norm_rope", "w", w, kF32, {x.dim(2)});
    check_tensor("rms_norm_rope", "positions", positions, kI32, {3, x.dim(0)});
    Tensor rows = x.reshape({x.dim(0) * x.dim(1), x.dim(2)});
    rms_norm(rows, w, eps, rows);
    rope(x, positions, params);
  }

  void silu_mul(const Tensor& gate, const Tensor& up, Tensor& out) override {
    check_tensor("silu_mul", "gate", gate, kF32, gate.shape);
    check_tensor("silu_mul", "up", up, kF32, gate.shape);
    check_tensor("silu_mul", "out", out, kF32, gate.shape);
    for (int64_t i = 0; i < gate.numel(); ++i) out.ptr<float>()[i] = silu(gate.ptr<float>()[i]) * up.ptr<float>()[i];
  }

  // gate has x's shape, or [N,1] for x [N,D]: one gate per row.
  void sigmoid_mul(Tensor& x, const Tensor& gate) override {
    check_tensor("sigmoid_mul", "x", x, kF32, x.shape);
    const bool per_row = x.rank() == 2 && gate.rank() == 2 && gate.dim(1) == 1 && x.dim(1) != 1;
    check_tensor("sigmoid_mul", "gate", gate, kF32, per_row ? std::vector<int64_t>{x.dim(0), 1} : x.shape);
    const int64_t width = per_row ? x.dim(1) : 1;
    for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] *= sigmoid(gate.ptr<float>()[i / width]);
  }

  void add(Tensor& x, const Tensor& y) override {
    check_tensor("add", "x", x, kF32, x.shape);
    check_tensor("add", "y", y, kF32, x.shape);
    for (int64_t i = 0; i < x.numel(); ++i) x.ptr<float>()[i] += y.ptr<float>()[i];
  }

  void kv_store(const Tensor& k, const Tensor& v, const AttentionLayout& layout, KvPool& pool) override {
    check_tensor("kv_store", "k", k, kF32, {kAny, kAny, kAny});
    const int64_t T = k.dim(0), kv_heads = k.dim(1), head_dim = k.dim(2), row = kv_heads * head_dim;
    check_tensor("kv_store", "v", v, kF32, k.shape);
    check_attention_layout("kv_store", layout, pool, T, kv_heads, head_dim);
    const auto& cu = layout.seqs.cu_seqlens;
    for (int64_t s = 0; s < layout.seqs.num_seqs(); ++s) {
      for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
        const int64_t dst = kv_row("kv_store", layout, s, layout.cached[s] + (t - cu[s]), pool.k.dim(0));
        write_kv(pool.k, dst * row, row, k.ptr<float>() + t * row);
        write_kv(pool.v, dst * row, row, v.ptr<float>() + t * row);
      }
    }
  }

  // Token t of sequence s sees key positions 0 .. cached[s] + (t − cu_seqlens[s]); softmax in fp32
  // after subtracting the row maximum.
  void attention(const Tensor& q, const KvPool& pool, const AttentionLayout& layout, float scale,
                 Tensor& out) override {
    check_tensor("attention", "q", q, kF32, {kAny, kAny, kAny});
    const int64_t T = q.dim(0), heads = q.dim(1), head_dim = q.dim(2);
    check_tensor("attention", "out", out, kF32, q.shape);
    check_distinct("attention", "out", out, "q", q);
    QINFER_CHECK(pool.k.rank() == 4,
                 "ref attention: pool.k must be [num_blocks, block_size, kv_heads, head_dim], got {}",
                 shape_str(pool.k.shape));
    const int64_t kv_heads = pool.k.dim(2), row = kv_heads * head_dim;
    check_attention_layout("attention", layout, pool, T, kv_heads, head_dim);
    QINFER_CHECK(kv_heads > 0 && heads % kv_heads == 0,
                 "ref attention: {} query heads are not a multiple of {} kv heads", heads, kv_heads);
    const int64_t group = heads / kv_heads;
    const auto& cu = layout.seqs.cu_seqlens;
    std::vector<float> scores, keys, values;
    std::vector<double> acc(head_dim);
    for (int64_t s = 0; s < layout.seqs.num_seqs(); ++s) {
      if (cu[s + 1] == cu[s]) continue;
      // The sequence's keys and values [positions, kv_heads, head_dim] as f32, read once: each of
      // its tokens sees a prefix of them.
      const int64_t positions = layout.cached[s] + (cu[s + 1] - cu[s]);
      keys.resize(positions * row), values.resize(positions * row);
      for (int64_t p = 0; p < positions; ++p) {
        const int64_t r = kv_row("attention", layout, s, p, pool.k.dim(0));
        read_kv(pool.k, r * row, row, keys.data() + p * row);
        read_kv(pool.v, r * row, row, values.data() + p * row);
      }
      for (int64_t t = cu[s]; t < cu[s + 1]; ++t) {
        const int64_t n_keys = layout.cached[s] + (t - cu[s]) + 1;
        for (int64_t h = 0; h < heads; ++h) {
          const float* qh = q.ptr<float>() + (t * heads + h) * head_dim;
          const int64_t kv_offset = (h / group) * head_dim;
          scores.resize(n_keys);
          for (int64_t p = 0; p < n_keys; ++p)
            scores[p] = static_cast<float>(scale * dot(qh, keys.data() + p * row + kv_offset, head_dim));
          const float max_score = *std::max_element(scores.begin(), scores.end());
          double denominator = 0.0;
          std::fill(acc.begin(), acc.end(), 0.0);
          for (int64_t p = 0; p < n_keys; ++p) {
            const float weight = std::exp(scores[p] - max_score);
            denominator += weight;
            const float* vp = values.data() + p * row + kv_offset;
            for (int64_t i = 0; i < head_dim; ++i) acc[i] += static_cast<double>(weight) * vp[i];
          }
          float* oh = out.ptr<float>() + (t * heads + h) * head_dim;
          for (int64_t i = 0; i < head_dim; ++i) oh[i] = static_cast<float>(acc[i] / denominator);
        }
      }
    }
  }

  // Top-k by probability, ties to the lower expert id, in descending order (torch.topk's order).
  void moe_route(const Tensor& logits, bool renormalize, Tensor& ids, Tensor& weights) override {
    check_tensor("moe_route", "logits", logits, kF32, {kAny, kAny});
    const int64_t T = logits.dim(0), E = logits.dim(1);
    check_tensor("moe_route", "ids", ids, kI32, {T, kAny});
    const int64_t k = ids.dim(1);
    check_tensor("moe_route", "weights", weights, kF32, {T, k});
    QINFER_CHECK(k >= 1 && k <= E, "ref moe_route: top-k {} must be in [1, {} experts]", k, E);
    std::vector<float> probs(E);
    std::vector<int32_t> order(E);
    for (int64_t t = 0; t < T; ++t) {
      const float* lt = logits.ptr<float>() + t * E;
      const float max_logit = *std::max_element(lt, lt + E);
      double sum = 0.0;
      for (int64_t e = 0; e < E; ++e) sum += probs[e] = std::exp(lt[e] - max_logit);
      for (int64_t e = 0; e < E; ++e) probs[e] = static_cast<float>(probs[e] / sum);
      // NaN ranks last so that the comparison stays a strict weak order.
      auto rank = [&](int32_t e) { return std::isnan(probs[e]) ? -1.0f : probs[e]; };
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return rank(a) > rank(b); });
      float total = 0.0f;
      for (int64_t j = 0; j < k; ++j) total += probs[order[j]];
      for (int64_t j = 0; j < k; ++j) {
        ids.ptr<int32_t>()[t * k + j] = order[j];
        weights.ptr<float>()[t * k + j] = renormalize ? probs[order[j]] / total : probs[order[j]];
      }
    }
  }

  void moe_experts(const Tensor& x, const Tensor& ids, const Tensor& weights, const Weight& gate, const Weight& up,
                   const Weight& down, Tensor& out) override {
    check_tensor("moe_experts", "x", x, kF32, {kAny, kAny});
    const int64_t T = x.dim(0), H = x.dim(1);
    check_tensor("moe_experts", "ids", ids, kI32, {T, kAny});
    const int64_t k = ids.dim(1);
    check_tensor("moe_experts", "weights", weights, kF32, {T, k});
    check_weight("moe_experts", "gate", gate, {kAny, kAny, H});
    const int64_t E = gate.shape()[0], I = gate.shape()[1];
    check_weight("moe_experts", "up", up, {E, I, H});
    check_weight("moe_experts", "down", down, {E, H, I});
    check_tensor("moe_experts", "out", out, kF32, {T, H});
    check_distinct("moe_experts", "out", out, "x", x);
    std::vector<float> w_row(std::max(H, I)), act(I);
    std::vector<double> sum(H);
    for (int64_t t = 0; t < T; ++t) {
      const float* xt = x.ptr<float>() + t * H;
      std::fill(sum.begin(), sum.end(), 0.0);
      for (int64_t j = 0; j < k; ++j) {
        const int32_t e = ids.ptr<int32_t>()[t * k + j];
        QINFER_CHECK(e >= 0 && e < E, "ref moe_experts: ids[{}, {}] = {} is outside the {} experts", t, j, e, E);
        for (int64_t i = 0; i < I; ++i) {
          gate.row_f32(e * I + i, w_row.data());
          const float g = static_cast<float>(dot(xt, w_row.data(), H));
          up.row_f32(e * I + i, w_row.data());
          act[i] = silu(g) * static_cast<float>(dot(xt, w_row.data(), H));
        }
        const float weight = weights.ptr<float>()[t * k + j];
        for (int64_t o = 0; o < H; ++o) {
          down.row_f32(e * H + o, w_row.data());
          sum[o] += static_cast<double>(weight) * static_cast<float>(dot(act.data(), w_row.data(), I));
        }
      }
      for (int64_t o = 0; o < H; ++o) out.ptr<float>()[t * H + o] = static_cast<float>(sum[o]);
    }
  }

  void gdn_gates(const Tensor& a, const Tensor& b, const Tensor& A_log, const Tensor& dt_bias, Tensor& g,
                 Tensor& beta) override {
    check_tensor("gdn_gates", "a", a, kF32, {kAny, kAny});
    const int64_t T = a.dim(0), Hv = a.dim(1);
    check_tensor("gdn_gates", "b", b, kF32, {T, Hv});
    check_tensor("gdn_gates", "A_log", A_log, kF32, {Hv});
    check_tensor("gdn_gates", "dt_bias", dt_bias, kF32, {Hv});
    check_tensor("gdn_gates", "g", g, kF32, {T, Hv});
    check_tensor("gdn_gates", "beta", beta, kF32, {T, Hv});
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < Hv; ++h) {
        const int64_t i = t * Hv + h;
        const float decay_rate = std::exp(A_log.ptr<float>()[h]);
        const float a_i = a.ptr<float>()[i], b_i = b.ptr<float>()[i];
        g.ptr<float>()[i] = -decay_rate * softplus(a_i + dt_bias.ptr<float>()[h]);
        beta.ptr<float>()[i] = sigmoid(b_i);
      }
    }
  }

  void conv1d_causal(const Tensor& x, const Tensor& w, const SeqLayout& layout, Tensor& conv_state,
                     Tensor& out) override {
    check_tensor("conv1d_causal", "x", x, kF32, {kAny, kAny});
    const int64_t T = x.dim(0), C = x.dim(1);
    check_tensor("conv1d_causal", "w", w, kF32, {C, kAny});
    const int64_t K = w.dim(1);
    QINFER_CHECK(K >= 1, "ref conv1d_causal: kernel size must be at least 1, w is {}", shape_str(w.shape));
    check_tensor("conv1d_causal", "conv_state", conv_state, kF32, {kAny, K - 1, C});
    check_tensor("conv1d_causal", "out", out, kF32, {T, C});
    check_distinct("conv1d_causal", "out", out, "x", x);
    check_seqs("conv1d_causal", layout, T, conv_state.dim(0));
    const auto& cu = layout.cu_seqlens;
    const int64_t state_size = (K - 1) * C;
    std::vector<float> window;  // [K−1 + len, C]: the slot's frames, then the sequence's
    for (int64_t s = 0; s < layout.num_seqs(); ++s) {
      const float* slot_state = conv_state.ptr<float>() + layout.state_slot[s] * state_size;
      window.assign(slot_state, slot_state + state_size);
      window.insert(window.end(), x.ptr<float>() + cu[s] * C, x.ptr<float>() + cu[s + 1] * C);
      for (int64_t t = 0; t < cu[s + 1] - cu[s]; ++t) {
        for (int64_t c = 0; c < C; ++c) {
          double acc = 0.0;  // window row t + j is input frame t − K + 1 + j
          for (int64_t j = 0; j < K; ++j)
            acc += static_cast<double>(w.ptr<float>()[c * K + j]) * window[(t + j) * C + c];
          out.ptr<float>()[(cu[s] + t) * C + c] = silu(static_cast<float>(acc));
        }
      }
      if (const int32_t snapshot = layout.snapshot_slot(s); snapshot >= 0) {
        const auto at = window.begin() + layout.snapshot_tokens(s) * C;  // the K−1 frames before token `at`
        std::copy(at, at + state_size, conv_state.ptr<float>() + snapshot * state_size);
      }
      std::copy(window.end() - state_size, window.end(), conv_state.ptr<float>() + layout.target_slot(s) * state_size);
    }
  }

  void gated_delta_rule(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const Tensor& beta,
                        const SeqLayout& layout, Tensor& state, Tensor& out, GdnAlgorithm algorithm) override {
    constexpr std::string_view op = "gated_delta_rule";
    check_tensor(op, "q", q, kF32, {kAny, kAny, kAny});
    const int64_t T = q.dim(0), Hk = q.dim(1), Dk = q.dim(2);
    check_tensor(op, "k", k, kF32, q.shape);
    check_tensor(op, "v", v, kF32, {T, kAny, kAny});
    const int64_t Hv = v.dim(1), Dv = v.dim(2);
    QINFER_CHECK(Hk > 0 && Hv % Hk == 0, "ref {}: {} value heads are not a multiple of {} key heads", op, Hv, Hk);
    check_tensor(op, "g", g, kF32, {T, Hv});
    check_tensor(op, "beta", beta, kF32, {T, Hv});
    check_tensor(op, "state", state, kF32, {kAny, Hv, Dv, Dk});
    check_tensor(op, "out", out, kF32, {T, Hv, Dv});
    check_distinct(op, "out", out, "q", q);
    check_distinct(op, "out", out, "k", k);
    check_distinct(op, "out", out, "v", v);
    check_seqs(op, layout, T, state.dim(0));
    const int64_t ratio = Hv / Hk;
    const auto& cu = layout.cu_seqlens;
    std::vector<float> qh, kh, vh, gh, bh, oh;
    for (int64_t s = 0; s < layout.num_seqs(); ++s) {
      const int64_t len = cu[s + 1] - cu[s];
      const bool chunked = algorithm == GdnAlgorithm::chunked || (algorithm == GdnAlgorithm::automatic && len > 64);
      for (auto* buffer : {&qh, &kh}) buffer->resize(len * Dk);
      for (auto* buffer : {&vh, &oh}) buffer->resize(len * Dv);
      for (auto* buffer : {&gh, &bh}) buffer->resize(len);
      for (int64_t h = 0; h < Hv; ++h) {
        const int64_t key_head = h / ratio;
        for (int64_t i = 0; i < len; ++i) {
          const int64_t t = cu[s] + i;
          std::copy_n(q.ptr<float>() + (t * Hk + key_head) * Dk, Dk, qh.data() + i * Dk);
          std::copy_n(k.ptr<float>() + (t * Hk + key_head) * Dk, Dk, kh.data() + i * Dk);
          std::copy_n(v.ptr<float>() + (t * Hv + h) * Dv, Dv, vh.data() + i * Dv);
          gh[i] = g.ptr<float>()[t * Hv + h];
          bh[i] = beta.ptr<float>()[t * Hv + h];
        }
        const ref::DeltaHead head{.len = len,
                                  .dk = Dk,
                                  .dv = Dv,
                                  .q = qh.data(),
                                  .k = kh.data(),
                                  .v = vh.data(),
                                  .g = gh.data(),
                                  .beta = bh.data(),
                                  .out = oh.data()};
        // The rule runs on the target slot's copy of the state it starts from.
        const float* S0 = state.ptr<float>() + (layout.state_slot[s] * Hv + h) * Dv * Dk;
        float* S = state.ptr<float>() + (layout.target_slot(s) * Hv + h) * Dv * Dk;
        if (S != S0) std::copy_n(S0, Dv * Dk, S);
        auto rule = [&](const ref::DeltaHead& part) {
          if (chunked) ref::delta_rule_chunked(part, S);
          else ref::delta_rule_recurrent(part, S);
        };
        if (const int32_t snapshot = layout.snapshot_slot(s); snapshot >= 0) {
          // The tokens before the snapshot, the state as it is then, the rest.
          const int64_t at = layout.snapshot_tokens(s);
          rule(head.first(at));
          std::copy_n(S, Dv * Dk, state.ptr<float>() + (snapshot * Hv + h) * Dv * Dk);
          rule(head.rest(at));
        } else {
          rule(head);
        }
        for (int64_t i = 0; i < len; ++i)
          std::copy_n(oh.data() + i * Dv, Dv, out.ptr<float>() + ((cu[s] + i) * Hv + h) * Dv);
      }
    }
  }

  // The sampling semantics are shared by every backend (backend/sampling.h).
  void sample(const Tensor& logits, const std::vector<SamplingParams>& params,
              const std::vector<std::vector<int32_t>>& history, const std::vector<uint64_t>& step,
              std::vector<int32_t>& out) override {
    sample_rows(logits, params, history, step, out);
  }

  void mask_logits(Tensor& logits, const Tensor& rows, const Tensor& allowed) override {
    mask_logits_rows(logits, rows, allowed);
  }
};

}  // namespace

std::unique_ptr<Ops> make_ref_ops() { return std::make_unique<RefOps>(); }

}  // namespace qinfer
