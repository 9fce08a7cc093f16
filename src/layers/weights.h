#pragma once
// Moves canonical checkpoint tensors onto a backend: matrices keep their stored form (bf16 stays
// bf16, MLX-quantized stays packed: decode streams it), vectors (norm gains, conv kernels, gates' parameters) become f32 with
// any due +1 applied. Under tensor parallelism each rank loads only its slice (parallel/sharding.h).
// A NaN or infinity in any float tensor (a quantized one's scales / biases) is an Error naming it.
#include <cstdint>
#include <span>
#include <string>

#include "backend/ops.h"
#include "core/progress.h"
#include "io/checkpoint.h"
#include "parallel/sharding.h"

namespace qinfer::layers {

// A NaN or infinity in a weight turns every output into garbage (often "!!!!") with no error, so
// each tensor is checked as it is read, as `values` (a quantized one's uint8 scale codes say what
// they hold): an Error naming file, tensor and element. When `spans` are t's pieces the stored
// tensor is named; `part` names a rank's slice; `first`: the element the spans start at.
void check_finite(const io::CanonicalTensor& t, DType values, std::span<const std::span<const std::byte>> spans,
                  bool spans_are_pieces, const std::string& part, uint64_t first = 0);

class WeightLoader {
 public:
  // `progress`, when given, advances by each tensor's stored bytes (the slice's, when sharded).
  // `shard`, when given, loads the rank's slice of every sharded tensor (parallel::slice_of).
  WeightLoader(const io::NormalizationPlan& plan, Ops& ops, ProgressBar* progress = nullptr,
               const parallel::ShardPlan* shard = nullptr)
      : plan_(plan), ops_(ops), progress_(progress), shard_(shard) {}
  // A matrix as stored: dense (f32|bf16|f16) or MLX-quantized (codes + scales [+ biases]).
  Weight matrix(const std::string& name) const;
  Tensor vector(const std::string& name) const;  // any shape, as f32
  bool has(const std::string& name) const { return plan_.find(name) != nullptr; }

 private:
  const io::NormalizationPlan& plan_;
  Ops& ops_;
  ProgressBar* progress_;
  const parallel::ShardPlan* shard_;

  parallel::Slice slice(const io::CanonicalTensor& t) const;
  // A rank's slice of a tensor (of its weight's slice, for scales and biases) on the backend, checked
  // for NaN and infinity as `values` (the dtype its bytes hold).
  Tensor upload_slice(const io::CanonicalTensor& t, const parallel::Slice& slice, int64_t logical_columns,
                      DType values) const;
};

}  // namespace qinfer::layers
