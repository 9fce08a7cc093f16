#pragma once
// Models by Hugging Face name (org/name[@revision]): found in, and downloaded into, the cache laid out
// as huggingface_hub writes it, so a cache filled by either tool serves the other:
//   {cache}/models--{org}--{name}/refs/{revision}      the commit hash
//   {cache}/models--{org}--{name}/snapshots/{commit}/  the files, relative symlinks into ../../blobs/
//   {cache}/models--{org}--{name}/blobs/{etag}         sha256 for LFS files, git blob sha1 otherwise
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace qinfer::hub {

struct HubOptions {
  std::filesystem::path cache_dir;  // HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub
  std::string endpoint;             // HF_ENDPOINT, else https://huggingface.co
  std::string token;                // HF_TOKEN; sent as "Authorization: Bearer" to the endpoint's host only
  bool offline = false;             // HF_HUB_OFFLINE=1: the cache only, no request at all
  bool progress = true;             // progress bars (drawn only on a terminal)
  int parallel = 4;                 // files downloaded at once (each shard on a connection of its own)
  int retries = 4;                  // further attempts at a file whose transfer broke off, each resuming
  std::chrono::milliseconds backoff{500};  // before the first retry; doubles after each
  std::chrono::seconds stall_timeout{30};  // a transfer that receives nothing this long is broken off

  // The defaults above, read from the environment.
  static HubOptions from_env();
};

struct ModelName {
  std::string repo;      // org/name
  std::string revision;  // a branch, tag or 40-hex commit; "main" when not given
};

// "org/name" or "org/name@revision" as a name; nullopt for anything else (a path, a bare word).
std::optional<ModelName> parse_model_name(const std::string& text);

// The folder of `model`: the folder itself when it exists or `model` is no name, else the cached
// snapshot of the name, else (unless offline) the snapshot pull() makes. Throws Error naming the model
// and what to do.
std::filesystem::path resolve_model(const std::string& model, const HubOptions& options);

// Downloads the files a model needs (config, tokenizer, chat template, safetensors) of `name`
// (org/name[@revision]) into the cache, resuming partial files, and returns the snapshot folder.
std::filesystem::path pull(const std::string& name, const HubOptions& options);

struct CachedModel {
  std::string repo;
  std::vector<std::pair<std::string, std::string>> refs;  // revision -> commit
  uint64_t bytes = 0;                                     // on disk, each file once
  std::string family;                                     // config.json model_type
  std::string quantization;                               // empty when unquantized
  std::filesystem::path folder;                           // models--org--name
};

// Every model in the cache, by name.
std::vector<CachedModel> list_cached(const HubOptions& options);

// Deletes models--org--name from the cache and returns its size; throws when `name` is not org/name
// (a revision is refused too: the whole model goes) or the model is not cached.
uint64_t remove_cached(const std::string& name, const HubOptions& options);

}  // namespace qinfer::hub
