#include "layers/weights.h"

#include <cstring>

#include "core/error.h"

namespace qinfer::layers {

namespace {

// The tensor's bytes straight from the mapped files to the backend.
Tensor copy_to(Ops& ops, const io::CanonicalTensor& t, ProgressBar* progress) {
  std::vector<std::span<const std::byte>> pieces;
  for (const io::Piece& p : t.pieces) pieces.push_back(p.source->data().subspan(p.offset, p.nbytes));
  Tensor out = ops.upload(t.dtype, t.shape, pieces);
  if (progress) progress->advance(t.nbytes());
  return out;
}

}  // namespace

parallel::Slice WeightLoader::slice(const io::CanonicalTensor& t) const {
  return shard_ ? parallel::slice_of(t.name, parallel::logical_shape(t), *shard_) : parallel::Slice{};
}

Tensor WeightLoader::upload_slice(const io::CanonicalTensor& t, const parallel::Slice& slice,
                                  int64_t logical_columns) const {
  if (slice.kind == parallel::Slice::replicated) return copy_to(ops_, t, progress_);
  const parallel::StoredSlice part = parallel::stored_slice(t, slice, logical_columns);
  Tensor out = ops_.upload(t.dtype, part.shape, part.spans);
  if (progress_) progress_->advance(part.nbytes());
  return out;
}

Weight WeightLoader::matrix(const std::string& name) const {
  const io::CanonicalTensor& t = plan_.at(name);
  const parallel::Slice part = slice(t);
  const int64_t columns = parallel::logical_shape(t).back();
  if (t.quant) {
    const std::string base = name.substr(0, name.size() - std::string_view(".weight").size());
    Weight w;
    w.layout = quant::Layout{quant::parse_mode(t.quant->mode), t.quant->bits, t.quant->group_size};
    w.codes = upload_slice(t, part, columns);
    w.scales = upload_slice(plan_.at(base + ".scales"), part, columns);
    if (w.layout.mode == quant::Mode::affine) w.biases = upload_slice(plan_.at(base + ".biases"), part, columns);
    return w;
  }
  QINFER_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16,
               "tensor '{}' ({}) has dtype {}; matrices must be f32, bf16 or f16", name, t.sources.front(),
               qinfer::name(t.dtype));
  if (t.add_one) return vector(name);
  return upload_slice(t, part, columns);
}

Tensor WeightLoader::vector(const std::string& name) const {
  const io::CanonicalTensor& t = plan_.at(name);
  const parallel::Slice part = slice(t);
  std::vector<float> values;
  std::vector<int64_t> shape = t.shape;
  if (part.kind == parallel::Slice::replicated) {
    values = t.read_f32();
    if (progress_) progress_->advance(t.nbytes());
  } else {
    QINFER_CHECK(traits(t.dtype).is_float, "tensor '{}' has dtype {}, which has no float values", name,
                 qinfer::name(t.dtype));
    const parallel::StoredSlice stored = parallel::stored_slice(t, part, t.shape.back());
    shape = stored.shape;
    for (const auto& span : stored.spans) {
      const uint64_t count = span.size() / storage_bytes(t.dtype, 1);
      values.resize(values.size() + count);
      convert_to_f32(t.dtype, span.data(), values.data() + values.size() - count, count);
    }
    if (t.add_one)
      for (float& v : values) v += 1.0f;
    if (progress_) progress_->advance(stored.nbytes());
  }
  Tensor host = host_tensor(DType::f32, shape);
  QINFER_CHECK(values.size() * sizeof(float) == host.nbytes(), "tensor '{}': read {} values, its shape holds {}",
               t.name, values.size(), host.numel());
  std::memcpy(host.data, values.data(), values.size() * sizeof(float));
  return to_backend(ops_, host);
}

}  // namespace qinfer::layers
