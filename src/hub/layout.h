#pragma once
// The cache layout huggingface_hub writes, shared by resolution (cache.cpp) and download (pull.cpp).
#include <filesystem>
#include <optional>
#include <string>

namespace qinfer::hub {

// {cache}/models--{org}--{name}
std::filesystem::path repo_folder(const std::filesystem::path& cache, const std::string& repo);
// A 40-hex commit hash, which names a snapshot by itself.
bool is_commit(const std::string& revision);
// The commit refs/{revision} holds, or the revision itself when it is a commit; nullopt when unknown.
std::optional<std::string> cached_commit(const std::filesystem::path& repo_dir, const std::string& revision);
// Whether a snapshot holds a loadable model: config.json and its weights (every shard the index names).
bool snapshot_complete(const std::filesystem::path& snapshot);
// Writes `text` to `path` through a temporary file and a rename, so readers see all of it or nothing.
void write_atomically(const std::filesystem::path& path, const std::string& text);

}  // namespace qinfer::hub
