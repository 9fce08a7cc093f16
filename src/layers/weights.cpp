#include "layers/weights.h"

#include <cstring>

#include "core/error.h"

namespace qinfer::layers {

Tensor WeightLoader::matrix(const std::string& name) const {
  const io::CanonicalTensor& t = plan_.at(name);
  QINFER_CHECK(!t.quant, "tensor '{}' is quantized ({}-bit {}); quantized weights are not supported by this build",
               name, t.quant->bits, t.quant->mode);
  QINFER_CHECK(t.dtype == DType::f32 || t.dtype == DType::bf16 || t.dtype == DType::f16,
               "tensor '{}' ({}) has dtype {}; matrices must be f32, bf16 or f16", name, t.sources.front(),
               qinfer::name(t.dtype));
  if (t.add_one) return vector(name);
  Tensor out = ops_.alloc(t.dtype, t.shape);
  QINFER_CHECK(out.device == Device::cpu, "weight upload to {} is done by its backend", ops_.name());
  std::vector<std::byte> bytes = t.read_bytes();
  std::memcpy(out.data, bytes.data(), bytes.size());
  return out;
}

Tensor WeightLoader::vector(const std::string& name) const {
  const io::CanonicalTensor& t = plan_.at(name);
  std::vector<float> values = t.read_f32();
  Tensor out = ops_.alloc(DType::f32, t.shape);
  QINFER_CHECK(out.device == Device::cpu, "weight upload to {} is done by its backend", ops_.name());
  std::memcpy(out.data, values.data(), values.size() * sizeof(float));
  return out;
}

}  // namespace qinfer::layers
