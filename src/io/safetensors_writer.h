#pragma once
// Streams a safetensors file: every tensor is declared first (the header needs all offsets), then
// the data is written tensor by tensor in declaration order, so nothing larger than one tensor is
// ever held in memory.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace qinfer::io {

struct TensorDeclaration {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
};

class SafetensorsWriter {
 public:
  SafetensorsWriter(const std::filesystem::path& path, std::vector<TensorDeclaration> tensors,
                    const std::map<std::string, std::string>& metadata = {});
  // The next declared tensor's bytes (exactly its size). Several calls may fill one tensor in parts.
  void write(std::span<const std::byte> bytes);
  // Checks every declared byte was written and closes the file.
  void finish();

 private:
  std::filesystem::path path_;
  std::ofstream out_;
  uint64_t expected_ = 0, written_ = 0;
};

}  // namespace qinfer::io
