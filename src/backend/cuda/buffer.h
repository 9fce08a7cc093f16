#pragma once
// An owned block of device memory (cudaMalloc / cudaFree), move-only, sized in bytes.
#include <cstddef>
#include <span>
#include <utility>
#include <vector>

#include "backend/cuda/check.h"
#include "core/error.h"

namespace qinfer::cuda {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes_ > 0) QINFER_CUDA_CHECK(cudaMalloc(&data_, bytes_));
  }
  ~DeviceBuffer() { release(); }

  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      release();
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }

  void* data() { return data_; }
  const void* data() const { return data_; }
  template <typename T>
  T* as() { return static_cast<T*>(data_); }
  template <typename T>
  const T* as() const { return static_cast<const T*>(data_); }
  size_t size() const { return bytes_; }

  // Synchronous copies between host memory and [offset, offset + bytes) of this buffer.
  void upload(const void* host, size_t bytes, size_t offset = 0) {
    check_range(bytes, offset, "upload");
    if (bytes > 0)
      QINFER_CUDA_CHECK(cudaMemcpy(static_cast<char*>(data_) + offset, host, bytes, cudaMemcpyHostToDevice));
  }
  void download(void* host, size_t bytes, size_t offset = 0) const {
    check_range(bytes, offset, "download");
    if (bytes > 0)
      QINFER_CUDA_CHECK(cudaMemcpy(host, static_cast<const char*>(data_) + offset, bytes, cudaMemcpyDeviceToHost));
  }
  template <typename T>
  void upload(std::span<const T> host, size_t offset = 0) { upload(host.data(), host.size_bytes(), offset); }
  // The whole buffer as elements of T (its size must be a multiple of sizeof(T)).
  template <typename T>
  std::vector<T> download() const {
    QINFER_CHECK(bytes_ % sizeof(T) == 0, "device buffer download: {} bytes is not a whole number of {}-byte elements",
                 bytes_, sizeof(T));
    std::vector<T> host(bytes_ / sizeof(T));
    download(host.data(), bytes_);
    return host;
  }

 private:
  void check_range(size_t bytes, size_t offset, const char* what) const {
    QINFER_CHECK(offset <= bytes_ && bytes <= bytes_ - offset,
                 "device buffer {}: {} bytes at offset {} do not fit in a buffer of {} bytes", what, bytes, offset, bytes_);
  }
  void release() noexcept {
    if (data_) cudaFree(data_);  // a destructor must not throw; a failed free leaves nothing to do
    data_ = nullptr;
    bytes_ = 0;
  }

  void* data_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace qinfer::cuda
