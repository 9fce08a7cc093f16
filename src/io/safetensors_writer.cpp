#include "io/safetensors_writer.h"

#include <nlohmann/json.hpp>

#include "core/error.h"

namespace qinfer::io {

SafetensorsWriter::SafetensorsWriter(const std::filesystem::path& path, std::vector<TensorDeclaration> tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), out_(path, std::ios::binary | std::ios::trunc) {
  QINFER_CHECK(out_.good(), "{}: cannot create the file", path.string());
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  for (const TensorDeclaration& t : tensors) {
    uint64_t count = 1;
    for (int64_t d : t.shape) count *= static_cast<uint64_t>(d);
    const uint64_t bytes = storage_bytes(t.dtype, count);
    header[t.name] = {{"dtype", traits(t.dtype).safetensors}, {"shape", t.shape},
                      {"data_offsets", {expected_, expected_ + bytes}}};
    expected_ += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // keeps the data 8-byte aligned, as the reference writer does
  const uint64_t length = text.size();
  char prefix[8];
  for (int i = 0; i < 8; ++i) prefix[i] = static_cast<char>(length >> (8 * i));
  out_.write(prefix, 8);
  out_.write(text.data(), static_cast<std::streamsize>(text.size()));
}

void SafetensorsWriter::write(std::span<const std::byte> bytes) {
  QINFER_CHECK(written_ + bytes.size() <= expected_, "{}: more data written than the tensors declared", path_.string());
  out_.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  QINFER_CHECK(out_.good(), "{}: write failed (disk full?)", path_.string());
  written_ += bytes.size();
}

void SafetensorsWriter::finish() {
  QINFER_CHECK(written_ == expected_, "{}: {} of {} declared bytes were written", path_.string(), written_, expected_);
  out_.close();
  QINFER_CHECK(!out_.fail(), "{}: closing the file failed", path_.string());
}

}  // namespace qinfer::io
