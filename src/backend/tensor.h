#pragma once
// A dense, contiguous, row-major tensor on one device. Owning (allocated by a backend) or a view of
// memory someone else owns; copying a Tensor copies the handle, not the data.
#include <cstdint>
#include <memory>
#include <vector>

#include "core/dtype.h"

namespace qinfer {

enum class Device : uint8_t { cpu, cuda };

struct Tensor {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;
  void* data = nullptr;
  Device device = Device::cpu;
  std::shared_ptr<void> owner;  // keeps the storage alive; empty for views

  int64_t dim(int axis) const { return shape.at(axis < 0 ? shape.size() + axis : axis); }
  int rank() const { return static_cast<int>(shape.size()); }
  int64_t numel() const;
  uint64_t nbytes() const { return storage_bytes(dtype, static_cast<uint64_t>(numel())); }
  template <typename T>
  T* ptr() const { return static_cast<T*>(data); }

  // The same storage with another shape of the same element count.
  Tensor reshape(std::vector<int64_t> new_shape) const;
  // Rows [begin, end) along axis 0 (a view).
  Tensor rows(int64_t begin, int64_t end) const;
};

// Copies `width` columns of 2-D src (starting at src_col) into 2-D dst (starting at dst_col), row by
// row: the strided copy behind splitting fused projections (q|gate, q|k|v|z) and concatenating them.
// Both tensors on the same device, same dtype, same row count.
void copy_columns(const Tensor& src, int64_t src_col, Tensor& dst, int64_t dst_col, int64_t width);

// Host tensor, 64-byte aligned, zero-filled (from 32 MiB up, by the kernel as pages are first touched).
Tensor host_tensor(DType dtype, std::vector<int64_t> shape);

}  // namespace qinfer
