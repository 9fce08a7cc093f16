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

Weight WeightLoader::matrix(const std::string& name) const {
  const io::CanonicalTensor& t = plan_.at(name);
  if (t.quant) {
    const std::string base = name.substr(0, name.size() - std::string_view(".weight").size());
    Weight w;
    w.layout = quant::Layout{quant::parse_mode(t.quant->mode), t.quant->bits, t.quant->group_size};
    w.codes = copy_to(ops_, t, progress_);
    w.scales = copy_to(ops_, plan_.at(base + ".scales"), progress_);
    if (w.layout.mode == quant::Mode::affine) w.biases = copy_to(ops_, plan_.at(base + ".biases"), progress_);
    return w;
  }
  QINFER_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16,
               "tensor '{}' ({}) has dtype {}; matrices must be f32, bf16 or f16", name, t.sources.front(),
               qinfer::name(t.dtype));
  if (t.add_one) return vector(name);
  return copy_to(ops_, t, progress_);
}

Tensor WeightLoader::vector(const std::string& name) const {
  const io::CanonicalTensor& t = plan_.at(name);
  std::vector<float> values = t.read_f32();
  Tensor host = host_tensor(DType::f32, t.shape);
  QINFER_CHECK(values.size() * sizeof(float) == host.nbytes(), "tensor '{}': read {} values, its shape holds {}",
               t.name, values.size(), host.numel());
  std::memcpy(host.data, values.data(), values.size() * sizeof(float));
  if (progress_) progress_->advance(t.nbytes());
  return to_backend(ops_, host);
}

}  // namespace qinfer::layers
