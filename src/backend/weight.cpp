#include <cstring>

#include "backend/ops.h"
#include "core/error.h"

namespace qinfer {

std::vector<int64_t> Weight::shape() const {
  if (!quantized()) return dense.shape;
  std::vector<int64_t> s = codes.shape;
  s.back() = s.back() * 32 / layout.bits;
  return s;
}

int64_t Weight::rows() const {
  const std::vector<int64_t> s = shape();
  int64_t n = 1;
  for (size_t i = 0; i + 1 < s.size(); ++i) n *= s[i];
  return n;
}

void Weight::row_f32(int64_t r, float* out) const {
  if (!quantized()) {
    QINFER_CHECK(dense.device == Device::cpu, "Weight::row_f32 reads host weights only");
    const int64_t in = dense.shape.back();
    const char* base = static_cast<const char*>(dense.data) + storage_bytes(dense.dtype, static_cast<uint64_t>(r * in));
    if (dense.dtype == DType::f32) std::memcpy(out, base, static_cast<size_t>(in) * sizeof(float));
    else convert_to_f32(dense.dtype, base, out, static_cast<uint64_t>(in));
    return;
  }
  QINFER_CHECK(codes.device == Device::cpu, "Weight::row_f32 reads host weights only");
  const int64_t words = codes.shape.back(), in = words * 32 / layout.bits, groups = in / layout.group_size;
  const uint64_t scale_bytes = storage_bytes(scales.dtype, static_cast<uint64_t>(r * groups));
  quant::dequantize_row(layout, codes.ptr<uint32_t>() + r * words, scales.dtype,
                        static_cast<const char*>(scales.data) + scale_bytes,
                        biases.data ? static_cast<const char*>(biases.data) + scale_bytes : nullptr, global_scale, in,
                        out);
}

uint64_t Weight::nbytes() const {
  if (!quantized()) return dense.nbytes();
  return codes.nbytes() + scales.nbytes() + (biases.data ? biases.nbytes() : 0);
}

}  // namespace qinfer
