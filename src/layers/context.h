#pragma once
// What a layer's forward needs besides its weights: the ops, the batch's sequence layout and
// positions, and the caches. Built once per forward by the model; layers never see the Batch itself.
#include <functional>
#include <string>
#include <string_view>

#include "backend/ops.h"
#include "cache/cache.h"

namespace qinfer::layers {

struct ForwardContext {
  Ops& ops;
  ModelCache& cache;
  AttentionLayout attention;  // also carries the plain sequence layout (attention.seqs)
  Tensor positions;           // i32 [3, T]
  int64_t tokens() const { return attention.seqs.num_tokens(); }
  // Called with every named intermediate when set (`qinfer eval --dump`), to diff against HF layer by layer.
  std::function<void(const std::string& name, const Tensor& value)> dump;

  // Activations: every one is an op's output before it is read.
  Tensor alloc(std::vector<int64_t> shape) { return ops.alloc_output(DType::f32, std::move(shape)); }
  // The name is put together only when dumping: a decode step names hundreds of tensors.
  void named(std::string_view prefix, std::string_view suffix, const Tensor& value) const {
    if (dump) dump(std::string(prefix).append(suffix), value);
  }
  void named(std::string_view name, const Tensor& value) const { named(name, {}, value); }
};

}  // namespace qinfer::layers
