#pragma once
// Reading files of a model folder, which may be hostile: only regular files (or symlinks to one) are
// opened, since a FIFO blocks the reader forever and /dev/zero never ends.
#include <cstdint>
#include <filesystem>
#include <string>

namespace qinfer::io {

// Text files of a model folder larger than this are refused before reading: the largest real ones,
// tokenizer.json files, are 11 MB (Qwen3's 151k vocabulary) to ~20 MB, and a DOM takes ~10x the text.
inline constexpr uint64_t kMaxModelTextFileBytes = 512ull << 20;

// Throws an Error naming `path` and what it is (directory, FIFO, socket, device) unless it is a
// regular file or a symlink to one.
void check_regular_file(const std::filesystem::path& path);

// The whole file, after check_regular_file and a size check against `max_bytes`.
std::string read_model_file(const std::filesystem::path& path, uint64_t max_bytes = kMaxModelTextFileBytes);

}  // namespace qinfer::io
