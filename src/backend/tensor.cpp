#include "backend/tensor.h"

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace qinfer {

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::reshape(std::vector<int64_t> new_shape) const {
  Tensor t = *this;
  t.shape = std::move(new_shape);
  QINFER_CHECK(t.numel() == numel(), "reshape: {} elements cannot take a shape of {}", numel(), t.numel());
  return t;
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  QINFER_CHECK(rank() >= 1 && 0 <= begin && begin <= end && end <= shape[0], "rows [{}, {}) out of range {}", begin,
               end, rank() ? shape[0] : 0);
  Tensor t = *this;
  t.shape[0] = end - begin;
  const uint64_t row_bytes = storage_bytes(dtype, static_cast<uint64_t>(numel() / (shape[0] ? shape[0] : 1)));
  t.data = static_cast<char*>(data) + begin * row_bytes;
  return t;
}

Tensor host_tensor(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const size_t bytes = (t.nbytes() + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes ? bytes : 64);
  QINFER_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
  std::memset(p, 0, bytes);
  t.owner = std::shared_ptr<void>(p, std::free);
  t.data = p;
  return t;
}

}  // namespace qinfer
