#include "parallel/sharding.h"

#include <algorithm>
#include <array>

#include "core/error.h"

namespace qinfer::parallel {

namespace {

int64_t product(std::span<const int64_t> dims) {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

// Tensors split along their output rows, evenly (whole heads, whole key-head groups of Qwen3-Next's
// grouped projections, whole intermediate channels).
constexpr std::array kEvenRows = {
    ".self_attn.q_proj.weight",          ".self_attn.k_proj.weight",         ".self_attn.v_proj.weight",
    ".gate_proj.weight",                 ".up_proj.weight",                  ".linear_attn.in_proj_qkvz.weight",
    ".linear_attn.in_proj_ba.weight",    ".linear_attn.in_proj_z.weight",    ".linear_attn.in_proj_b.weight",
    ".linear_attn.in_proj_a.weight",     ".linear_attn.A_log",               ".linear_attn.dt_bias",
};
// Tensors whose rows are the conv channels q (all key heads) | k | v (all value heads): each
// section split on its own.
constexpr std::array kQkvRows = {".linear_attn.in_proj_qkv.weight", ".linear_attn.conv1d.weight"};
// Row-parallel projections: split along their inputs, outputs summed over the ranks.
constexpr std::array kColumns = {".self_attn.o_proj.weight", ".down_proj.weight", ".linear_attn.out_proj.weight"};

template <size_t N>
bool ends_with_any(std::string_view name, const std::array<const char*, N>& suffixes) {
  return std::any_of(suffixes.begin(), suffixes.end(), [&](const char* s) { return name.ends_with(s); });
}

}  // namespace

ShardPlan plan_shards(const io::TextConfig& config, int rank, int size) {
  QINFER_CHECK(size >= 1, "tensor parallel {}: the number of ranks must be at least 1", size);
  QINFER_CHECK(rank >= 0 && rank < size, "tensor parallel {}: rank {} is not in 0..{}", size, rank, size - 1);
  ShardPlan plan{rank, size, config, config};
  io::TextConfig& local = plan.local;
  auto split = [&](const char* field, int64_t& value) {
    QINFER_CHECK(value % size == 0, "tensor parallel {}: {} {} is not divisible by {}", size, field, value, size);
    value /= size;
  };
  bool has_attention = false, has_linear = false, has_dense = false;
  for (size_t i = 0; i < config.layer_types.size(); ++i) {
    (config.layer_types[i] == io::LayerKind::linear_attention ? has_linear : has_attention) = true;
    has_dense = has_dense || !config.is_moe_layer(static_cast<int64_t>(i));
  }
  if (has_attention) {
    split("num_attention_heads", local.num_attention_heads);
    split("num_key_value_heads", local.num_key_value_heads);
  }
  if (has_linear) {
    split("linear_num_key_heads", local.linear_num_key_heads);
    split("linear_num_value_heads", local.linear_num_value_heads);
  }
  if (has_dense) split("intermediate_size", local.intermediate_size);
  if (config.num_experts > 0) {
    split("moe_intermediate_size", local.moe_intermediate_size);
    if (config.shared_expert_intermediate_size > 0)
      split("shared_expert_intermediate_size", local.shared_expert_intermediate_size);
  }
  return plan;
}

Slice slice_of(std::string_view name, const std::vector<int64_t>& shape, const ShardPlan& plan) {
  if (plan.size == 1 || !(name.starts_with("model.layers.") || name.starts_with("mtp.layers."))) return {};
  QINFER_CHECK(!shape.empty(), "tensor '{}' has no dimensions", name);
  const int64_t n = plan.size, r = plan.rank;
  const int64_t out = shape.size() >= 2 ? shape[shape.size() - 2] : shape[0];
  auto rows = [&](const std::vector<int64_t>& sections) {
    Slice s{Slice::rows};
    int64_t offset = 0;
    for (int64_t length : sections) {
      QINFER_CHECK(length % n == 0, "tensor parallel {}: '{}' has a row section of {}, not divisible by {}", n, name,
                   length, n);
      const int64_t share = length / n;
      s.row_ranges.emplace_back(offset + r * share, offset + (r + 1) * share);
      offset += length;
    }
    QINFER_CHECK(offset == out, "tensor parallel: '{}' has {} rows, expected {} (q | k | v of the config)", name, out,
                 offset);
    return s;
  };
  if (ends_with_any(name, kEvenRows)) return rows({out});
  if (ends_with_any(name, kQkvRows)) {
    const int64_t keys = plan.global.linear_key_dim(), values = plan.global.linear_value_dim();
    return rows({keys, keys, values});
  }
  if (ends_with_any(name, kColumns)) {
    const int64_t in = shape.back();
    QINFER_CHECK(shape.size() >= 2 && in % n == 0, "tensor parallel {}: '{}' has {} input columns, not divisible by {}",
                 n, name, in, n);
    return Slice{Slice::columns, {}, r * (in / n), (r + 1) * (in / n)};
  }
  return {};
}

uint64_t StoredSlice::nbytes() const {
  uint64_t total = 0;
  for (const auto& s : spans) total += s.size();
  return total;
}

StoredSlice stored_slice(const io::CanonicalTensor& t, const Slice& slice, int64_t logical_columns) {
  QINFER_CHECK(slice.kind == Slice::replicated || bits(t.dtype) % 8 == 0,
               "tensor '{}' ({}): {} elements pack below a byte and cannot be sliced", t.name, t.sources.front(),
               name(t.dtype));
  const std::vector<int64_t>& s = t.shape;
  StoredSlice out{s, {}};
  struct Range {
    uint64_t offset, nbytes;
  };
  std::vector<Range> ranges;
  auto add = [&](int64_t first_element, int64_t count) {
    const uint64_t offset = storage_bytes(t.dtype, static_cast<uint64_t>(first_element));
    const uint64_t nbytes = storage_bytes(t.dtype, static_cast<uint64_t>(count));
    if (!ranges.empty() && ranges.back().offset + ranges.back().nbytes == offset) ranges.back().nbytes += nbytes;
    else ranges.push_back({offset, nbytes});
  };
  if (slice.kind == Slice::replicated) {
    ranges.push_back({0, t.nbytes()});
  } else if (slice.kind == Slice::rows) {
    const size_t axis = s.size() >= 2 ? s.size() - 2 : 0;
    const int64_t columns = s.size() >= 2 ? s.back() : 1, out_rows = s[axis];
    const int64_t blocks = product(std::span(s).first(axis));
    int64_t kept = 0;
    for (const auto& [begin, end] : slice.row_ranges) kept += end - begin;
    for (int64_t b = 0; b < blocks; ++b)
      for (const auto& [begin, end] : slice.row_ranges) {
        QINFER_CHECK(0 <= begin && begin <= end && end <= out_rows, "tensor '{}': rows [{}, {}) are outside its {}",
                     t.name, begin, end, out_rows);
        add((b * out_rows + begin) * columns, (end - begin) * columns);
      }
    out.shape[axis] = kept;
  } else {
    QINFER_CHECK(s.size() >= 2, "tensor '{}' is a vector; only matrices split by columns", t.name);
    const int64_t stored = s.back();
    const int64_t begin = slice.column_begin * stored, end = slice.column_end * stored;
    QINFER_CHECK(begin % logical_columns == 0 && end % logical_columns == 0,
                 "tensor '{}' ({}): input columns [{}, {}) of {} do not fall on whole stored columns ({} stored)",
                 t.name, t.sources.front(), slice.column_begin, slice.column_end, logical_columns, stored);
    const int64_t first = begin / logical_columns, last = end / logical_columns;
    const int64_t rows = product(std::span(s).first(s.size() - 1));
    for (int64_t row = 0; row < rows; ++row) add(row * stored + first, last - first);
    out.shape.back() = last - first;
  }
  // Ranges ascend; walk the pieces once, cutting each range where it crosses pieces.
  size_t piece = 0;
  uint64_t piece_start = 0;
  for (const Range& range : ranges) {
    uint64_t at = range.offset, left = range.nbytes;
    while (left > 0) {
      QINFER_CHECK(piece < t.pieces.size(), "tensor '{}': byte {} is past its stored bytes", t.name, at);
      const io::Piece& p = t.pieces[piece];
      if (at >= piece_start + p.nbytes) {
        piece_start += p.nbytes;
        ++piece;
        continue;
      }
      const uint64_t within = at - piece_start, take = std::min(left, p.nbytes - within);
      out.spans.push_back(p.source->data().subspan(p.offset + within, take));
      at += take;
      left -= take;
    }
  }
  return out;
}

std::vector<int64_t> logical_shape(const io::CanonicalTensor& t) {
  std::vector<int64_t> shape = t.shape;
  if (!t.quant || shape.empty()) return shape;
  if (t.name.ends_with(".scales") || t.name.ends_with(".biases")) shape.back() *= t.quant->group_size;
  else shape.back() = shape.back() * 32 / t.quant->bits;
  return shape;
}

void check_shards(const ShardPlan& plan, const io::NormalizationPlan& checkpoint) {
  if (plan.size == 1) return;
  for (const auto& [name, t] : checkpoint.tensors) {
    if (t.group != io::TensorGroup::text || name.ends_with(".scales") || name.ends_with(".biases")) continue;
    const Slice slice = slice_of(name, logical_shape(t), plan);
    if (slice.kind != Slice::columns || !t.quant) continue;
    const int64_t width = slice.column_end - slice.column_begin;
    QINFER_CHECK(width % t.quant->group_size == 0,
                 "tensor parallel {}: '{}' gives each rank {} input columns, not a multiple of its quantization group "
                 "size {}",
                 plan.size, name, width, t.quant->group_size);
  }
}

}  // namespace qinfer::parallel
