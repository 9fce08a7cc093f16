#include "layers/weights.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/thread_pool.h"

namespace qinfer::layers {

namespace {

// first_non_finite over the thread pool for large spans: one pass over every weight byte at load
// runs at the memory bandwidth of all cores, not one.
std::optional<uint64_t> first_non_finite_parallel(DType values, std::span<const std::byte> bytes, uint64_t count) {
  constexpr uint64_t kChunk = uint64_t{1} << 20;  // elements per task
  if (count <= kChunk) return first_non_finite(values, bytes.data(), count);
  const uint64_t width = bits(values) / 8, chunks = (count + kChunk - 1) / kChunk;
  std::vector<uint64_t> found(chunks, count);
  global_thread_pool().parallel_for(chunks, [&](size_t begin, size_t end) {
    for (size_t c = begin; c < end; ++c) {
      const uint64_t first = c * kChunk, n = std::min(kChunk, count - first);
      if (const auto at = first_non_finite(values, bytes.data() + first * width, n)) found[c] = first + *at;
    }
  });
  const uint64_t first = *std::min_element(found.begin(), found.end());
  return first < count ? std::optional<uint64_t>(first) : std::nullopt;
}

}  // namespace

void check_finite(const io::CanonicalTensor& t, DType values, std::span<const std::span<const std::byte>> spans,
                  bool spans_are_pieces, const std::string& part, uint64_t first) {
  if (bits(values) % 8 != 0) return;
  const uint64_t width = bits(values) / 8;
  uint64_t before = first;  // elements before this span
  for (size_t k = 0; k < spans.size(); ++k) {
    const uint64_t count = spans[k].size() / width;
    const std::optional<uint64_t> at = first_non_finite_parallel(values, spans[k], count);
    if (!at) {
      before += count;
      continue;
    }
    float value = 0;
    convert_to_f32(values, spans[k].data() + *at * width, &value, 1);
    const bool whole = spans_are_pieces && spans.size() == t.pieces.size();
    const io::Piece& piece = t.pieces[whole ? k : 0];
    fail("{}: tensor '{}'{} holds {} at element {}{}: non-finite weights make the output garbage (a corrupt "
         "download or a broken conversion)",
         piece.source->file->path().string(), whole ? piece.source->info->name : t.sources.front(),
         t.name == piece.source->info->name ? "" : fmt::format(" (canonical '{}')", t.name), value,
         whole ? piece.offset / width + *at : before + *at, part);
  }
}

namespace {

// The tensor's bytes straight from the mapped files to the backend.
Tensor copy_to(Ops& ops, const io::CanonicalTensor& t, DType values, ProgressBar* progress) {
  std::vector<std::span<const std::byte>> pieces;
  for (const io::Piece& p : t.pieces) pieces.push_back(p.source->data().subspan(p.offset, p.nbytes));
  check_finite(t, values, pieces, true, "");
  Tensor out = ops.upload(t.dtype, t.shape, pieces);
  if (progress) progress->advance(t.nbytes());
  return out;
}

}  // namespace

parallel::Slice WeightLoader::slice(const io::CanonicalTensor& t) const {
  return shard_ ? parallel::slice_of(t.name, parallel::logical_shape(t), *shard_) : parallel::Slice{};
}

Tensor WeightLoader::upload_slice(const io::CanonicalTensor& t, const parallel::Slice& slice, int64_t logical_columns,
                                  DType values) const {
  if (slice.kind == parallel::Slice::replicated) return copy_to(ops_, t, values, progress_);
  const parallel::StoredSlice part = parallel::stored_slice(t, slice, logical_columns);
  check_finite(t, values, part.spans, false, fmt::format(" of the slice rank {} loads", shard_->rank));
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
    // The packed codes are integers; the scales (and biases) are where a bad value shows.
    w.codes = upload_slice(t, part, columns, DType::u32);
    const io::CanonicalTensor& scales = plan_.at(base + ".scales");
    const quant::ModeTraits& mode = quant::traits(w.layout.mode);
    w.scales = upload_slice(scales, part, columns, mode.float_scales ? scales.dtype : mode.scale_codes);
    if (w.layout.mode == quant::Mode::affine) {
      const io::CanonicalTensor& biases = plan_.at(base + ".biases");
      w.biases = upload_slice(biases, part, columns, biases.dtype);
    }
    return w;
  }
  QINFER_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16,
               "tensor '{}' ({}) has dtype {}; matrices must be f32, bf16 or f16", name, t.sources.front(),
               qinfer::name(t.dtype));
  if (t.add_one) return vector(name);
  return upload_slice(t, part, columns, t.dtype);
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
  const std::span<const std::byte> bytes = std::as_bytes(std::span(values));
  check_finite(t, DType::f32, std::span(&bytes, 1), false,
               part.kind == parallel::Slice::replicated ? "" : fmt::format(" of the slice rank {} loads", shard_->rank));
  Tensor host = host_tensor(DType::f32, shape);
  QINFER_CHECK(values.size() * sizeof(float) == host.nbytes(), "tensor '{}': read {} values, its shape holds {}",
               t.name, values.size(), host.numel());
  std::memcpy(host.data, values.data(), values.size() * sizeof(float));
  return to_backend(ops_, host);
}

}  // namespace qinfer::layers
