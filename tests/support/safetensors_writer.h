#pragma once
// Test helper: writes safetensors files. SafetensorsWriter makes well-formed files from
// name -> (dtype, shape, bytes); safetensors_bytes() wraps any header text and payload, for broken
// files. Nothing is validated here: a byte count that does not match the shape is written as given.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace qinfer::testing {

// The raw bytes of any trivially copyable values, e.g. to_bytes(std::vector<float>{1, 2}).
template <typename T>
std::vector<std::byte> to_bytes(const std::vector<T>& values) {
  std::vector<std::byte> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

// A file: u64 little-endian `header_length`, the header text, the payload. The length is
// normally header.size(); pass another value to write a file that lies about it.
inline std::vector<std::byte> safetensors_bytes(uint64_t header_length, std::string_view header,
                                                std::span<const std::byte> payload = {}) {
  std::vector<std::byte> file(8);
  for (int i = 0; i < 8; ++i) file[i] = static_cast<std::byte>(header_length >> (8 * i));
  for (char c : header) file.push_back(static_cast<std::byte>(c));
  file.insert(file.end(), payload.begin(), payload.end());
  return file;
}

inline std::vector<std::byte> safetensors_bytes(std::string_view header,
                                                std::span<const std::byte> payload = {}) {
  return safetensors_bytes(header.size(), header, payload);
}

inline void write_file(const std::filesystem::path& path, std::span<const std::byte> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

inline void write_file(const std::filesystem::path& path, std::string_view text) {
  write_file(path, std::as_bytes(std::span(text.data(), text.size())));
}

class SafetensorsWriter {
 public:
  // Tensors are laid out in the order added. Returns *this for chaining.
  SafetensorsWriter& add(std::string name, DType dtype, std::vector<int64_t> shape,
                         std::vector<std::byte> data) {
    tensors_.push_back({std::move(name), dtype, std::move(shape), std::move(data)});
    return *this;
  }
  // A tensor filled with a repeating byte pattern of the right size for its shape.
  SafetensorsWriter& add_filled(std::string name, DType dtype, std::vector<int64_t> shape) {
    uint64_t count = 1;
    for (int64_t extent : shape) count *= static_cast<uint64_t>(extent);
    std::vector<std::byte> data(storage_bytes(dtype, count));
    for (size_t i = 0; i < data.size(); ++i)
      data[i] = static_cast<std::byte>(i * 7 + tensors_.size());
    return add(std::move(name), dtype, std::move(shape), std::move(data));
  }
  SafetensorsWriter& metadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
    return *this;
  }

  // The JSON header, padded with spaces to a multiple of 8 bytes as the Python writer does.
  std::string header() const {
    nlohmann::json header = nlohmann::json::object();
    if (!metadata_.empty()) header["__metadata__"] = metadata_;
    uint64_t offset = 0;
    for (const auto& t : tensors_) {
      header[t.name] = {{"dtype", traits(t.dtype).safetensors},
                        {"shape", t.shape},
                        {"data_offsets", {offset, offset + t.data.size()}}};
      offset += t.data.size();
    }
    std::string text = header.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    return text;
  }
  std::vector<std::byte> payload() const {
    std::vector<std::byte> bytes;
    for (const auto& t : tensors_) bytes.insert(bytes.end(), t.data.begin(), t.data.end());
    return bytes;
  }
  std::vector<std::byte> bytes() const { return safetensors_bytes(header(), payload()); }
  void write(const std::filesystem::path& path) const { write_file(path, bytes()); }

 private:
  struct Tensor {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::vector<std::byte> data;
  };
  std::vector<Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::random_device random;
    auto base = std::filesystem::temp_directory_path();
    for (int attempt = 0; attempt < 100; ++attempt) {
      path_ = base / ("qinfer-test-" + std::to_string(random()));
      if (std::filesystem::create_directory(path_)) return;
    }
    throw std::runtime_error("cannot create a temporary directory in " + base.string());
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::filesystem::path& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

}  // namespace qinfer::testing
