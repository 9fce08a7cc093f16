// Finding models in the Hugging Face cache: names, refs, snapshots; listing and removing them.
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "hub/hub.h"
#include "hub/layout.h"
#include "io/json.h"

namespace qinfer::hub {
namespace fs = std::filesystem;

namespace {

std::string env_or(const char* name, const std::string& fallback = "") {
  const char* value = std::getenv(name);
  return value && *value ? value : fallback;
}

// huggingface_hub's truthy values of a boolean environment variable.
bool env_flag(const char* name) {
  std::string value = env_or(name);
  std::transform(value.begin(), value.end(), value.begin(), [](unsigned char c) { return std::tolower(c); });
  return value == "1" || value == "true" || value == "yes" || value == "on";
}

// The characters the hub allows in an org or repo name.
bool valid_name_part(std::string_view part) {
  if (part.empty() || part.size() > 96 || part == "." || part == ".." || part.starts_with("--")) return false;
  return std::all_of(part.begin(), part.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '-' || c == '_' || c == '.';
  });
}

// Branches and tags may hold slashes (refs/pr/1), never a ".." step out of refs/.
bool valid_revision(std::string_view revision) {
  if (revision.empty() || revision.front() == '/' || revision.back() == '/') return false;
  if (revision.find("..") != std::string_view::npos || revision.find("//") != std::string_view::npos) return false;
  return std::all_of(revision.begin(), revision.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '/';
  });
}

std::string read_small_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

std::string trim(std::string text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.pop_back();
  size_t start = 0;
  while (start < text.size() && std::isspace(static_cast<unsigned char>(text[start]))) ++start;
  return text.substr(start);
}

// "affine 4-bit g64" (MLX "quantization"), or the quant_method of a transformers quantization_config.
std::string describe_quantization(const io::json& config) {
  if (auto q = config.find("quantization"); q != config.end() && q->is_object()) {
    const std::string mode = q->value("mode", std::string("affine"));
    return fmt::format("{} {}-bit g{}", mode, q->value("bits", 0), q->value("group_size", 0));
  }
  if (auto q = config.find("quantization_config"); q != config.end() && q->is_object())
    return q->value("quant_method", std::string("quantized"));
  return "";
}

// Bytes under `folder`, each file once however many hard links or symlinks reach it.
uint64_t disk_bytes(const fs::path& folder) {
  uint64_t total = 0;
  std::set<std::pair<dev_t, ino_t>> seen;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(folder, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    struct stat st {};
    if (::lstat(it->path().c_str(), &st) != 0 || !S_ISREG(st.st_mode)) continue;
    if (seen.insert({st.st_dev, st.st_ino}).second) total += static_cast<uint64_t>(st.st_size);
  }
  return total;
}

}  // namespace

HubOptions HubOptions::from_env() {
  HubOptions options;
  if (std::string cache = env_or("HF_HUB_CACHE"); !cache.empty()) {
    options.cache_dir = cache;
  } else if (std::string home = env_or("HF_HOME"); !home.empty()) {
    options.cache_dir = fs::path(home) / "hub";
  } else {
    options.cache_dir = fs::path(env_or("HOME", "/root")) / ".cache" / "huggingface" / "hub";
  }
  options.endpoint = env_or("HF_ENDPOINT", "https://huggingface.co");
  while (options.endpoint.ends_with('/')) options.endpoint.pop_back();
  options.token = env_or("HF_TOKEN");
  options.offline = env_flag("HF_HUB_OFFLINE");
  return options;
}

std::optional<ModelName> parse_model_name(const std::string& text) {
  ModelName name;
  const size_t at = text.find('@');
  name.repo = text.substr(0, at);
  name.revision = at == std::string::npos ? "main" : text.substr(at + 1);
  const size_t slash = name.repo.find('/');
  if (slash == std::string::npos || name.repo.find('/', slash + 1) != std::string::npos) return std::nullopt;
  if (!valid_name_part(std::string_view(name.repo).substr(0, slash)) ||
      !valid_name_part(std::string_view(name.repo).substr(slash + 1)) || !valid_revision(name.revision))
    return std::nullopt;
  return name;
}

fs::path repo_folder(const fs::path& cache, const std::string& repo) {
  std::string folder = "models--" + repo;
  const size_t slash = folder.find('/');
  folder.replace(slash, 1, "--");
  return cache / folder;
}

bool is_commit(const std::string& revision) {
  return revision.size() == 40 && std::all_of(revision.begin(), revision.end(), [](unsigned char c) {
           return std::isdigit(c) || (c >= 'a' && c <= 'f');
         });
}

std::optional<std::string> cached_commit(const fs::path& repo_dir, const std::string& revision) {
  if (is_commit(revision)) return revision;
  std::error_code ec;
  const fs::path ref = repo_dir / "refs" / revision;
  if (!fs::is_regular_file(ref, ec)) return std::nullopt;
  std::string commit = trim(read_small_file(ref));
  if (!is_commit(commit)) return std::nullopt;
  return commit;
}

bool snapshot_complete(const fs::path& snapshot) {
  std::error_code ec;
  // fs::exists follows the symlinks, so a link to a missing blob counts as missing.
  if (!fs::exists(snapshot / "config.json", ec)) return false;
  const fs::path index = snapshot / "model.safetensors.index.json";
  if (fs::exists(index, ec)) {
    try {
      const io::json doc = io::read_json_file(index);
      for (const auto& [tensor, shard] : doc.at("weight_map").items())
        if (!shard.is_string() || !fs::exists(snapshot / shard.get<std::string>(), ec)) return false;
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }
  for (const auto& entry : fs::directory_iterator(snapshot, ec))
    if (entry.path().extension() == ".safetensors" && fs::exists(entry.path(), ec)) return true;
  return false;
}

void write_atomically(const fs::path& path, const std::string& text) {
  static std::atomic<int> counter{0};
  fs::create_directories(path.parent_path());
  const fs::path temp = path.string() + fmt::format(".{}-{}.tmp", ::getpid(), counter++);
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << text;
    out.flush();
    QINFER_CHECK(out.good(), "{}: cannot be written", temp.string());
  }
  std::error_code ec;
  fs::rename(temp, path, ec);
  if (ec) {
    fs::remove(temp, ec);
    fail("{}: cannot be written ({})", path.string(), ec.message());
  }
}

fs::path resolve_model(const std::string& model, const HubOptions& options) {
  std::error_code ec;
  if (fs::exists(model, ec)) return model;
  const std::optional<ModelName> name = parse_model_name(model);
  if (!name) return model;  // a path: the loader that opens it names what is missing
  const fs::path repo_dir = repo_folder(options.cache_dir, name->repo);
  if (const auto commit = cached_commit(repo_dir, name->revision)) {
    const fs::path snapshot = repo_dir / "snapshots" / *commit;
    if (snapshot_complete(snapshot)) {
      log_debug("{}: cached at {}", model, snapshot.string());
      return snapshot;
    }
  }
  QINFER_CHECK(!options.offline,
               "--model {}: no folder here, not in the Hugging Face cache ({}), and HF_HUB_OFFLINE is set so it "
               "cannot be downloaded (unset HF_HUB_OFFLINE, or run `qinfer pull {}` where the hub can be reached)",
               model, repo_dir.string(), model);
  try {
    return pull(model, options);
  } catch (const Error& e) {
    fail("{} (--model {} is no folder here either)", e.what(), model);
  }
}

std::vector<CachedModel> list_cached(const HubOptions& options) {
  std::vector<CachedModel> models;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(options.cache_dir, ec)) {
    const std::string folder = entry.path().filename().string();
    if (!folder.starts_with("models--") || !entry.is_directory(ec)) continue;
    CachedModel m;
    m.folder = entry.path();
    m.repo = folder.substr(8);
    if (const size_t sep = m.repo.find("--"); sep != std::string::npos) m.repo.replace(sep, 2, "/");
    const fs::path refs = entry.path() / "refs";
    for (auto it = fs::recursive_directory_iterator(refs, ec); !ec && it != fs::recursive_directory_iterator();
         it.increment(ec)) {
      if (!it->is_regular_file(ec)) continue;
      m.refs.emplace_back(fs::relative(it->path(), refs, ec).string(), trim(read_small_file(it->path())));
    }
    ec.clear();
    std::sort(m.refs.begin(), m.refs.end());
    // The family of the main snapshot, else of any snapshot.
    std::vector<fs::path> snapshots;
    for (const auto& [revision, commit] : m.refs)
      if (revision == "main") snapshots.push_back(entry.path() / "snapshots" / commit);
    for (const auto& snapshot : fs::directory_iterator(entry.path() / "snapshots", ec)) snapshots.push_back(snapshot);
    ec.clear();
    for (const fs::path& snapshot : snapshots) {
      if (!fs::exists(snapshot / "config.json", ec)) continue;
      try {
        const io::json config = io::read_json_file(snapshot / "config.json");
        m.family = config.value("model_type", std::string());
        m.quantization = describe_quantization(config);
      } catch (const std::exception& e) {
        m.family = "?";
      }
      break;
    }
    m.bytes = disk_bytes(entry.path());
    models.push_back(std::move(m));
  }
  std::sort(models.begin(), models.end(), [](const CachedModel& a, const CachedModel& b) { return a.repo < b.repo; });
  return models;
}

uint64_t remove_cached(const std::string& name, const HubOptions& options) {
  const std::optional<ModelName> parsed = parse_model_name(name);
  QINFER_CHECK(parsed.has_value() && name.find('@') == std::string::npos,
               "rm {}: expected a Hugging Face name org/name (the whole model is removed, every revision)", name);
  const fs::path folder = repo_folder(options.cache_dir, parsed->repo);
  std::error_code ec;
  QINFER_CHECK(fs::is_directory(folder, ec), "rm {}: not in the Hugging Face cache (no {})", name, folder.string());
  const uint64_t bytes = disk_bytes(folder);
  fs::remove_all(folder, ec);
  QINFER_CHECK(!ec, "rm {}: {} could not be removed: {}", name, folder.string(), ec.message());
  fs::remove_all(options.cache_dir / ".locks" / folder.filename(), ec);  // its lock files, if any
  return bytes;
}

}  // namespace qinfer::hub
