#include "backend/tensor.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"

namespace qinfer {
namespace {

// glibc's largest mmap threshold: at or above it malloc maps fresh pages for every call already.
constexpr size_t kLazyHostBytes = size_t{32} << 20;

}  // namespace

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

void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width) {
  QINFER_CHECK(src.rank() == 2 && dst.rank() == 2 && src.dim(0) == dst.dim(0) && src.dtype == dst.dtype &&
                   src.device == dst.device && src_col >= 0 && dst_col >= 0 && width >= 0 &&
                   src_col + width <= src.dim(1) && dst_col + width <= dst.dim(1) && bits(src.dtype) % 8 == 0,
               "copy_columns: bad arguments (src [{}, {}] col {}, dst [{}, {}] col {}, width {})", src.dim(0),
               src.dim(1), src_col, dst.dim(0), dst.dim(1), dst_col, width);
  QINFER_CHECK(src.device == Device::cpu, "copy_columns: device tensors are copied by their backend");
  const size_t elem = bits(src.dtype) / 8;
  const char* from = static_cast<const char*>(src.data);
  char* to = static_cast<char*>(dst.data);
  for (int64_t r = 0; r < src.dim(0); ++r)
    std::memcpy(to + (r * dst.dim(1) + dst_col) * elem, from + (r * src.dim(1) + src_col) * elem, width * elem);
}

Tensor host_tensor(DType dtype, std::vector<int64_t> shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = std::move(shape);
  const size_t bytes = (t.nbytes() + 63) / 64 * 64;
  // Large buffers come zeroed from the kernel and take memory only where written: a KV pool sized
  // for max_running x max_context costs what the requests use. (glibc maps these sizes anyway.)
  if (bytes >= kLazyHostBytes) {
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    QINFER_CHECK(p != MAP_FAILED, "out of host memory allocating {} bytes", bytes);
    t.owner = std::shared_ptr<void>(p, [bytes](void* q) { ::munmap(q, bytes); });
    t.data = p;
    return t;
  }
  void* p = std::aligned_alloc(64, bytes ? bytes : 64);
  QINFER_CHECK(p != nullptr, "out of host memory allocating {} bytes", bytes);
  std::memset(p, 0, bytes);
  t.owner = std::shared_ptr<void>(p, std::free);
  t.data = p;
  return t;
}

}  // namespace qinfer
