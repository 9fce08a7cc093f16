#pragma once
// What a layer's forward needs besides its weights: the ops, the batch's sequence layout and
// positions, and the caches. Built once per forward by the model; layers never see the Batch itself.
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

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

  // The residual add and pre-norm that produce a layer's input x (the model's add_rms_norm), left
  // by the model to a layer whose first read of x is one projection op: the layer runs them with
  // it (input_linear_many / input_linear_swiglu), and x is written by then.
  struct PendingNorm {
    Tensor& residual;
    const Tensor& delta;
    const Tensor& weight;
    float eps;
    Tensor& normed;  // the layer's x
  };
  std::optional<PendingNorm> pending_norm;
  // ops.linear_many(x, ws, ys), with the pending add and norm where x is their output.
  void input_linear_many(const Tensor& x, const std::vector<const Weight*>& ws, const std::vector<Tensor*>& ys) {
    const std::optional<PendingNorm> p = take_pending(x);
    if (!p) return ops.linear_many(x, ws, ys);
    ops.add_rms_norm_linear_many(p->residual, p->delta, p->weight, p->eps, p->normed, ws, ys);
  }
  // ops.linear_swiglu(x, gate, up, out), likewise.
  void input_linear_swiglu(const Tensor& x, const Weight& gate, const Weight& up, Tensor& out) {
    const std::optional<PendingNorm> p = take_pending(x);
    if (!p) return ops.linear_swiglu(x, gate, up, out);
    ops.add_rms_norm_linear_swiglu(p->residual, p->delta, p->weight, p->eps, p->normed, gate, up, out);
  }
  std::optional<PendingNorm> take_pending(const Tensor& x) {
    if (!pending_norm || x.data != pending_norm->normed.data) return std::nullopt;
    return std::exchange(pending_norm, std::nullopt);
  }

  // Activations: every one is an op's output before it is read.
  Tensor alloc(std::vector<int64_t> shape) { return ops.alloc_output(DType::f32, std::move(shape)); }
  // The name is put together only when dumping: a decode step names hundreds of tensors.
  void named(std::string_view prefix, std::string_view suffix, const Tensor& value) const {
    if (dump) dump(std::string(prefix).append(suffix), value);
  }
  void named(std::string_view name, const Tensor& value) const { named(name, {}, value); }
};

}  // namespace qinfer::layers
