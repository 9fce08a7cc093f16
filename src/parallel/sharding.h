#pragma once
// Tensor-parallel sharding, computed from the checkpoint's config: attention heads, KV heads, Gated
// DeltaNet key / value heads and MLP / expert intermediates split evenly over the ranks. Column-
// parallel projections (q/k/v, gate/up, GDN in_proj_*) keep a rank's rows; row-parallel ones
// (o_proj, down_proj, out_proj) keep a rank's input columns and their output is all-reduced.
// Embeddings, lm_head, norms and the MoE router stay whole on every rank.
#include <cstdint>
#include <span>
#include <string_view>
#include <utility>
#include <vector>

#include "io/checkpoint.h"
#include "io/config.h"

namespace qinfer::parallel {

struct ShardPlan {
  int rank = 0, size = 1;
  io::TextConfig global;  // the checkpoint's config
  // The model as one rank holds it: num_attention_heads, num_key_value_heads, linear_num_key_heads,
  // linear_num_value_heads, intermediate_size, moe_intermediate_size and
  // shared_expert_intermediate_size divided by `size`; everything else as in `global`.
  io::TextConfig local;
};

// Rank `rank` of `size`. Error naming the config field when a sharded count does not divide, e.g.
// "tensor parallel 3: num_key_value_heads 8 is not divisible by 3".
ShardPlan plan_shards(const io::TextConfig& config, int rank, int size);

// How one rank takes a canonical tensor. Rows are the matrix's output axis (axis -2; axis 0 of a
// vector), taken from every leading block (each expert of a stacked [E, out, in] tensor); columns
// are the last axis.
struct Slice {
  enum Kind { replicated, rows, columns } kind = replicated;
  std::vector<std::pair<int64_t, int64_t>> row_ranges;  // rows: [begin, end) each, in order
  int64_t column_begin = 0, column_end = 0;              // columns: [begin, end)
};

// The slice of tensor `name` (logical shape `shape`: unpacked for a quantized weight) for this rank.
// Quantized weights' `.scales` / `.biases` follow their `.weight`'s slice (stored_slice maps it).
Slice slice_of(std::string_view name, const std::vector<int64_t>& shape, const ShardPlan& plan);

// The stored bytes of `t` that a slice selects, as spans of the mapped files (nothing is read until
// they are copied, and then only their pages), with the stored shape they form. `logical_columns` is
// the matrix's input width before packing: a column slice of MLX codes or scales maps onto whole
// stored columns or is an error.
struct StoredSlice {
  std::vector<int64_t> shape;
  std::vector<std::span<const std::byte>> spans;
  uint64_t nbytes() const;
};
StoredSlice stored_slice(const io::CanonicalTensor& t, const Slice& slice, int64_t logical_columns);

// Every text tensor's slice, checked up front (shapes against the config; a quantized row-parallel
// weight's per-rank input width a multiple of its group size), so a bad split fails before loading.
void check_shards(const ShardPlan& plan, const io::NormalizationPlan& checkpoint);

// The logical [..., out, in] shape of a canonical tensor (a quantized weight's codes unpacked).
std::vector<int64_t> logical_shape(const io::CanonicalTensor& t);

}  // namespace qinfer::parallel
