#pragma once
// safetensors files: mmapped, every header field validated before any tensor byte is touched.
// Layout: u64 little-endian header length N, N bytes of JSON header, then the data region.
// A bad file (truncated, offsets out of range or overlapping, span != shape x dtype, unknown dtype,
// duplicate names, malformed or enormous header) is an Error naming the file and the tensor.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/dtype.h"

namespace qinfer::io {

// Headers larger than this are refused before allocation (the format's reference reader uses 100 MB).
inline constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct TensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t data_offset = 0;  // relative to the start of the data region
  uint64_t nbytes = 0;
  uint64_t numel() const;
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // sorted by data_offset
  std::map<std::string, std::string> metadata;  // the optional "__metadata__" string map
  uint64_t data_start = 0;  // absolute file offset of the data region (8 + header length)
};

// Parses and validates a header from the file's full contents. `label` names the file in errors.
// Pure function over bytes: the fuzz target calls it directly.
SafetensorsHeader parse_safetensors(std::span<const std::byte> file, std::string_view label);

// A read-only memory mapping of a whole file.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  std::span<const std::byte> bytes() const { return {data_, size_}; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  const std::byte* data_ = nullptr;
  size_t size_ = 0;
};

class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::filesystem::path& path);
  const std::filesystem::path& path() const { return file_.path(); }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  // The stored bytes of a tensor of this file.
  std::span<const std::byte> data(const TensorInfo& tensor) const;

 private:
  MappedFile file_;
  SafetensorsHeader header_;
};

// A stored tensor of a checkpoint: its header facts and the file that holds it.
struct StoredTensor {
  const TensorInfo* info;
  const SafetensorsFile* file;
  std::span<const std::byte> data() const { return file->data(*info); }
};

// All safetensors of a checkpoint directory: one `model.safetensors`, a sharded set listed by
// `model.safetensors.index.json`, or (MLX style) every `*.safetensors` in the folder. Names are
// unique across shards; an index entry whose shard is missing, or a tensor stored in a shard other
// than the one the index names, is an Error.
class TensorStore {
 public:
  explicit TensorStore(const std::filesystem::path& dir);
  const std::filesystem::path& dir() const { return dir_; }
  const std::map<std::string, StoredTensor, std::less<>>& tensors() const { return tensors_; }
  const StoredTensor* find(std::string_view name) const;
  const StoredTensor& at(std::string_view name) const;  // Error naming the tensor when absent
  const std::vector<std::unique_ptr<SafetensorsFile>>& files() const { return files_; }
  uint64_t total_bytes() const;

 private:
  std::filesystem::path dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, StoredTensor, std::less<>> tensors_;
};

}  // namespace qinfer::io
