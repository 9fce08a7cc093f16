// libFuzzer target: any input either parses into a header that tiles its data region exactly, or
// throws qinfer::Error. Any other exception, crash or sanitizer report is a bug.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/error.h"
#include "io/safetensors.h"

namespace {

// What every successful parse promises its callers (they index the mapping with these numbers).
void check_postconditions(const qinfer::io::SafetensorsHeader& header, size_t file_size) {
  uint64_t covered = 0;
  for (const auto& tensor : header.tensors) {
    if (tensor.data_offset != covered) __builtin_trap();
    if (tensor.nbytes != qinfer::storage_bytes(tensor.dtype, tensor.numel())) __builtin_trap();
    covered += tensor.nbytes;
  }
  if (header.data_start + covered != file_size) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const std::byte> file(reinterpret_cast<const std::byte*>(data), size);
  try {
    check_postconditions(qinfer::io::parse_safetensors(file, "fuzz"), size);
  } catch (const qinfer::Error&) {
  }
  return 0;
}
