// What every backend shares: transfers between host memory and a backend's, with the host
// backends' implementation (a memcpy) as the default, linear_many and rms_norm_rope_store as the ops they
// stand for.
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "backend/ops.h"
#include "core/error.h"

namespace qinfer {

void check_seq_layout(std::string_view who, const SeqLayout& layout, int64_t tokens, int64_t slots) {
  const auto& cu = layout.cu_seqlens;
  QINFER_CHECK(!cu.empty() && cu[0] == 0, "{}: layout.cu_seqlens must start with 0", who);
  for (size_t s = 0; s + 1 < cu.size(); ++s)
    QINFER_CHECK(cu[s] <= cu[s + 1], "{}: layout.cu_seqlens decreases at {}: {} > {}", who, s, cu[s], cu[s + 1]);
  QINFER_CHECK(cu.back() == tokens, "{}: layout.cu_seqlens covers {} tokens but the batch has {}", who, cu.back(),
               tokens);
  if (slots < 0) return;
  const int64_t S = layout.num_seqs();
  QINFER_CHECK(static_cast<int64_t>(layout.state_slot.size()) == S,
               "{}: layout.state_slot has {} entries for {} sequences", who, layout.state_slot.size(), S);
  QINFER_CHECK(layout.state_to.empty() || static_cast<int64_t>(layout.state_to.size()) == S,
               "{}: layout.state_to has {} entries for {} sequences (or none: in place)", who, layout.state_to.size(),
               S);
  for (const auto* v : {&layout.snapshot_at, &layout.snapshot_to})
    QINFER_CHECK(v->empty() || static_cast<int64_t>(v->size()) == S,
                 "{}: layout.snapshot_at and snapshot_to have {} entries for {} sequences (or none)", who, v->size(), S);
  QINFER_CHECK(layout.snapshot_at.size() == layout.snapshot_to.size(),
               "{}: layout.snapshot_at has {} entries and snapshot_to {}", who, layout.snapshot_at.size(),
               layout.snapshot_to.size());
  // (slot, sequence) for every slot a sequence reads or writes, each of a sequence's once.
  std::vector<std::pair<int32_t, int64_t>> used;
  for (int64_t s = 0; s < S; ++s) {
    const int32_t from = layout.state_slot[static_cast<size_t>(s)], to = layout.target_slot(s);
    const int32_t snapshot = layout.snapshot_slot(s);
    for (const int32_t slot : {from, to, snapshot < 0 ? from : snapshot})
      QINFER_CHECK(slot >= 0 && slot < slots, "{}: state slot {} is outside the {} slots of the state", who, slot,
                   slots);
    used.push_back({from, s});
    if (to != from) used.push_back({to, s});
    if (snapshot >= 0) {
      const int64_t len = cu[static_cast<size_t>(s) + 1] - cu[static_cast<size_t>(s)];
      const int32_t at = layout.snapshot_tokens(s);
      QINFER_CHECK(at >= 1 && at <= len, "{}: sequence {} of {} tokens has a snapshot after {} (1 .. {} allowed)",
                   who, s, len, at, len);
      used.push_back({snapshot, S + s});  // unshared even with the sequence's own slots
    }
  }
  std::sort(used.begin(), used.end());
  for (size_t i = 1; i < used.size(); ++i)
    QINFER_CHECK(used[i].first != used[i - 1].first, "{}: state slot {} is used by two sequences of one batch", who,
                 used[i].first);
}

void Ops::set_kv_dtype(DType dtype) {
  QINFER_CHECK(dtype == DType::f32 || dtype == DType::bf16, "{}: a KV cache holds f32 or bf16, not {}", name(),
               qinfer::name(dtype));
  kv_dtype_ = dtype;
}

Tensor Ops::alloc_pinned(DType dtype, std::vector<int64_t> shape) { return host_tensor(dtype, std::move(shape)); }

void Ops::copy_many(std::span<const std::pair<Tensor, Tensor>> copies) {
  for (const auto& [src, dst] : copies) {
    Tensor to = dst;
    copy(src, to);
  }
}

void Ops::copy(const Tensor& src, Tensor& dst) {
  QINFER_CHECK(src.device == Device::cpu && dst.device == Device::cpu, "{} copy: both tensors must be in host memory",
               name());
  QINFER_CHECK(src.dtype == dst.dtype && src.numel() == dst.numel(),
               "{} copy: {} elements of {} cannot be copied into {} elements of {}", name(), src.numel(),
               qinfer::name(src.dtype), dst.numel(), qinfer::name(dst.dtype));
  if (src.nbytes() > 0) std::memmove(dst.data, src.data, src.nbytes());
}

void Ops::linear_many(const Tensor& x, const std::vector<const Weight*>& ws, const std::vector<Tensor*>& ys) {
  QINFER_CHECK(ws.size() == ys.size() && !ws.empty() && ws.size() <= 4,
               "{} linear_many: {} matrices and {} outputs (expected 1 to 4 of each, as many outputs as matrices)",
               name(), ws.size(), ys.size());
  for (size_t i = 0; i < ws.size(); ++i) linear(x, *ws[i], *ys[i]);
}

void Ops::add_rms_norm_linear_many(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y,
                                   const std::vector<const Weight*>& ws, const std::vector<Tensor*>& ys) {
  add_rms_norm(x, delta, w, eps, y);
  linear_many(y, ws, ys);
}

void Ops::add_rms_norm_linear_swiglu(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y,
                                     const Weight& gate, const Weight& up, Tensor& out) {
  add_rms_norm(x, delta, w, eps, y);
  linear_swiglu(y, gate, up, out);
}

void Ops::linear_swiglu(const Tensor& x, const Weight& gate, const Weight& up, Tensor& out) {
  QINFER_CHECK(x.rank() == 2 && gate.shape().size() == 2 && gate.shape() == up.shape(),
               "{} linear_swiglu: gate [{}] and up [{}] must be matrices of one shape, x [T, in]", name(),
               fmt::join(gate.shape(), ", "), fmt::join(up.shape(), ", "));
  // Written whole by linear_many: no zero fill (on a device, a memset of both per layer of a prompt).
  Tensor g = alloc_output(DType::f32, {x.dim(0), gate.shape()[0]});
  Tensor u = alloc_output(DType::f32, {x.dim(0), up.shape()[0]});
  linear_many(x, {&gate, &up}, {&g, &u});
  silu_mul(g, u, out);
}

namespace {

// YaRN's blend per frequency, as HF's _compute_yarn_parameters: the ramp's ends and the attention
// factor in Python floats (double), the frequencies in torch's f32 with every operation rounded on
// its own (torch runs each in a kernel of its own: no fused multiply-add).
struct YarnRamp {
  float low, width, factor;
  float attention_factor;

  float inv_freq(int64_t i, float pos_freq) const {
    const float extrapolated = 1.0f / pos_freq, interpolated = 1.0f / (factor * pos_freq);
    const float ramp = std::clamp((static_cast<float>(i) - low) / width, 0.0f, 1.0f);
    const float keep = 1.0f - ramp;  // HF's inv_freq_extrapolation_factor
    const float from_interpolated = interpolated * (1.0f - keep), from_extrapolated = extrapolated * keep;
    return from_interpolated + from_extrapolated;
  }
};

YarnRamp yarn_ramp(std::string_view who, const RopeParams& params) {
  const YarnParams& y = *params.yarn;
  QINFER_CHECK(std::isfinite(y.factor) && y.factor > 0, "{}: yarn factor {} must be a positive number", who,
               y.factor);
  QINFER_CHECK(y.original_max_positions > 0, "{}: yarn original_max_positions {} must be positive", who,
               y.original_max_positions);
  QINFER_CHECK(std::isfinite(y.beta_fast) && std::isfinite(y.beta_slow) && y.beta_fast > 0 && y.beta_slow > 0,
               "{}: yarn beta_fast {} and beta_slow {} must be positive numbers", who, y.beta_fast, y.beta_slow);
  QINFER_CHECK(params.theta != 1, "{}: yarn needs theta other than 1 (its ramp divides by log theta)", who);
  const auto mscale = [&](double m) { return y.factor <= 1 ? 1.0 : 0.1 * m * std::log(y.factor) + 1.0; };
  double attention = mscale(1.0);
  if (y.attention_factor) attention = *y.attention_factor;
  else if (y.mscale != 0 && y.mscale_all_dim != 0) attention = mscale(y.mscale) / mscale(y.mscale_all_dim);
  QINFER_CHECK(std::isfinite(attention), "{}: yarn attention factor {} must be a number", who, attention);

  // The dimension whose frequency turns `rotations` times over the original context.
  const double d = static_cast<double>(params.rotary_dim);
  const auto correction_dim = [&](double rotations) {
    return (d * std::log(static_cast<double>(y.original_max_positions) / (rotations * 2 * std::numbers::pi))) /
           (2 * std::log(params.theta));
  };
  double low = correction_dim(y.beta_fast), high = correction_dim(y.beta_slow);
  if (y.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, d - 1);
  const double width = (high == low ? high + 0.001 : high) - low;  // HF's guard against a zero-width ramp
  return {static_cast<float>(low), static_cast<float>(width), static_cast<float>(y.factor),
          static_cast<float>(attention)};
}

}  // namespace

RopeFrequencies rope_frequencies(std::string_view who, const RopeParams& params) {
  const int64_t d = params.rotary_dim, half = d / 2;
  QINFER_CHECK(d > 0 && d % 2 == 0, "{}: rotary_dim {} must be even and positive", who, d);
  QINFER_CHECK(params.theta > 0, "{}: theta {} must be positive", who, params.theta);
  const auto& section = params.mrope_section;
  QINFER_CHECK(section.empty() || (section.size() == 3 && section[0] >= 0 && section[1] >= 0 && section[2] >= 0),
               "{}: mrope_section must be empty or 3 non-negative sizes, got [{}]", who, fmt::join(section, ", "));
  std::optional<YarnRamp> yarn;
  if (params.yarn) yarn = yarn_ramp(who, params);
  RopeFrequencies f;
  f.inv_freq.resize(static_cast<size_t>(half));
  f.axis.assign(static_cast<size_t>(half), 0);
  if (yarn) f.attention_factor = yarn->attention_factor;
  const float base = static_cast<float>(params.theta);
  for (int64_t i = 0; i < half; ++i) {
    // Interleaved MRoPE, qwen-spec §10.3.
    if (!section.empty() && i % 3 == 1 && i < 3 * section[1]) f.axis[i] = 1;
    if (!section.empty() && i % 3 == 2 && i < 3 * section[2]) f.axis[i] = 2;
    // torch's `base ** (arange(0, d, 2).float() / d)`, in f32.
    const float pos_freq = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(d));
    f.inv_freq[i] = yarn ? yarn->inv_freq(i, pos_freq) : 1.0f / pos_freq;
  }
  return f;
}

void Ops::rms_norm_rope_store(Tensor& q, Tensor& k, const Tensor& v, const Tensor& q_w, const Tensor& k_w, float eps,
                              const Tensor& positions, const RopeParams& params, const AttentionLayout& layout,
                              KvPool& pool) {
  rms_norm_rope(q, q_w, eps, positions, params);
  rms_norm_rope(k, k_w, eps, positions, params);
  kv_store(k, v, layout, pool);
}

void Ops::copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) {
  qinfer::copy_columns(src, src_col, dst, dst_col, width);
}

Tensor Ops::upload(DType dtype, std::vector<int64_t> shape, std::span<const std::span<const std::byte>> pieces) {
  Tensor t = alloc_output(dtype, std::move(shape));
  uint64_t total = 0;
  for (const auto& piece : pieces) total += piece.size();
  QINFER_CHECK(total == t.nbytes(), "{} upload: {} bytes given for a {} tensor of {} bytes", name(), total,
               qinfer::name(dtype), t.nbytes());
  QINFER_CHECK(t.device == Device::cpu, "{} upload: this backend keeps tensors off the host and must stream them itself",
               name());
  auto* out = static_cast<std::byte*>(t.data);
  for (const auto& piece : pieces) {
    if (!piece.empty()) std::memcpy(out, piece.data(), piece.size());
    out += piece.size();
  }
  return t;
}

Tensor to_backend(Ops& ops, const Tensor& host) {
  if (host.device == ops.device()) return host;
  Tensor t = ops.alloc_output(host.dtype, host.shape);
  ops.copy(host, t);
  return t;
}

Tensor to_host(Ops& ops, const Tensor& t) {
  if (t.device == Device::cpu) return t;
  Tensor host = host_tensor(t.dtype, t.shape);
  ops.copy(t, host);
  return host;
}

}  // namespace qinfer
