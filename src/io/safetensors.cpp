#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <system_error>
#include <unordered_set>

#include "core/error.h"
#include "io/file.h"
#include "io/json.h"

namespace qinfer::io {

namespace {

using json = nlohmann::json;

std::string errno_text(int error) { return std::generic_category().message(error); }

// A first, DOM-free pass over the JSON text that finds syntax errors and objects repeating a key:
// nlohmann keeps only one of the values, which would let a second definition of a tensor hide.
// (nlohmann's parser callback would also see the keys, but it rescans the parent object after every
// child object, which is quadratic in the number of tensors.)
class KeyChecker : public json::json_sax_t {
 public:
  std::string syntax_error;  // nlohmann's message, with the byte position
  std::string duplicate_key;
  std::string duplicate_in;  // the top-level key holding the object; empty for the top level

  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_array(std::size_t) override { return true; }
  bool end_array() override { return true; }
  bool start_object(std::size_t) override {
    open_objects_.emplace_back();
    return true;
  }
  bool end_object() override {
    open_objects_.pop_back();
    return true;
  }
  bool key(string_t& key) override {
    if (open_objects_.size() == 1) top_key_ = key;
    if (open_objects_.back().insert(key).second) return true;
    duplicate_key = key;
    if (open_objects_.size() > 1) duplicate_in = top_key_;
    return false;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    syntax_error = e.what();
    return false;
  }

 private:
  std::vector<std::unordered_set<std::string>> open_objects_;
  std::string top_key_;  // names the tensor in messages
};

json parse_json_unique_keys(std::string_view text, std::string_view label, std::string_view what) {
  if (const auto key = json_too_deep(text))
    fail("{}: {}{} is nested deeper than {} levels", label, key->empty() ? "" : "'" + *key + "' in the ", what,
         kMaxJsonDepth);
  KeyChecker checker;
  if (!json::sax_parse(text.begin(), text.end(), &checker)) {
    if (!checker.syntax_error.empty())
      fail("{}: {} is not valid JSON: {}", label, what, checker.syntax_error);
    if (checker.duplicate_in.empty())
      fail("{}: '{}' appears twice in the {}", label, checker.duplicate_key, what);
    fail("{}: '{}' in the {} has key '{}' twice", label, checker.duplicate_in, what,
         checker.duplicate_key);
  }
  json value = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  QINFER_CHECK(!value.is_discarded(), "{}: {} is not valid JSON", label, what);
  return value;
}

std::string_view json_type(const json& value) { return value.type_name(); }

// A JSON value for a message, cut short: a hostile header can hold arrays of millions of items.
std::string describe(const json& value) {
  std::string text = value.dump();
  if (text.size() > 80) text = text.substr(0, 77) + "...";
  return text;
}

TensorInfo parse_entry(const std::string& name, const json& entry, uint64_t data_size,
                       std::string_view label) {
  auto bad = [&](std::string_view problem) { fail("{}: tensor '{}': {}", label, name, problem); };
  if (!entry.is_object())
    bad(fmt::format("entry is a JSON {}, expected an object", json_type(entry)));
  for (const char* key : {"dtype", "shape", "data_offsets"})
    if (!entry.contains(key)) bad(fmt::format("missing key '{}'", key));
  if (entry.size() != 3) {
    for (const auto& [key, value] : entry.items())
      if (key != "dtype" && key != "shape" && key != "data_offsets")
        bad(fmt::format("unexpected key '{}' (allowed: dtype, shape, data_offsets)", key));
  }

  TensorInfo info;
  info.name = name;

  const json& dtype = entry["dtype"];
  if (!dtype.is_string())
    bad(fmt::format("dtype is a JSON {}, expected a string", json_type(dtype)));
  auto parsed_dtype = dtype_from_safetensors(dtype.get_ref<const std::string&>());
  if (!parsed_dtype) bad(fmt::format("unknown dtype '{}'", dtype.get_ref<const std::string&>()));
  info.dtype = *parsed_dtype;

  const json& shape = entry["shape"];
  if (!shape.is_array())
    bad(fmt::format("shape is a JSON {}, expected an array", json_type(shape)));
  uint64_t numel = 1;
  info.shape.reserve(shape.size());
  for (const json& dim : shape) {
    if (!dim.is_number_unsigned())
      bad(fmt::format("shape {} is not a list of non-negative integers", describe(shape)));
    uint64_t extent = dim.get<uint64_t>();
    if (extent > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad(fmt::format("shape {} has an extent above 2^63 - 1", describe(shape)));
    if (__builtin_mul_overflow(numel, extent, &numel))
      bad(fmt::format("shape {} has more elements than fit in 64 bits", describe(shape)));
    info.shape.push_back(static_cast<int64_t>(extent));
  }
  // storage_bytes computes numel * bits + 7; refuse counts where that would wrap.
  uint64_t total_bits = 0;
  if (__builtin_mul_overflow(numel, uint64_t{bits(info.dtype)}, &total_bits) ||
      total_bits > std::numeric_limits<uint64_t>::max() - 7)
    bad(fmt::format("shape {} of dtype {} is larger than 2^64 bytes", describe(shape),
                    traits(info.dtype).safetensors));

  const json& offsets = entry["data_offsets"];
  if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
      !offsets[1].is_number_unsigned())
    bad(fmt::format("data_offsets {} is not a pair of non-negative integers [begin, end]",
                    describe(offsets)));
  uint64_t begin = offsets[0].get<uint64_t>();
  uint64_t end = offsets[1].get<uint64_t>();
  if (begin > end) bad(fmt::format("data_offsets [{}, {}] have end before begin", begin, end));
  if (end > data_size)
    bad(
        fmt::format("data_offsets [{}, {}] run past the end of the data ({} bytes); the file is "
                    "truncated or the offsets are wrong",
                    begin, end, data_size));
  uint64_t expected = storage_bytes(info.dtype, numel);
  if (end - begin != expected)
    bad(fmt::format("data_offsets [{}, {}] span {} bytes, but shape {} of dtype {} needs {} bytes",
                    begin, end, end - begin, describe(shape), traits(info.dtype).safetensors,
                    expected));
  info.data_offset = begin;
  info.nbytes = end - begin;
  return info;
}

std::map<std::string, std::string> parse_metadata(const json& metadata, std::string_view label) {
  QINFER_CHECK(metadata.is_object(), "{}: __metadata__ is a JSON {}, expected an object of strings",
               label, json_type(metadata));
  std::map<std::string, std::string> result;
  for (const auto& [key, value] : metadata.items()) {
    QINFER_CHECK(value.is_string(), "{}: __metadata__ '{}' is a JSON {}, expected a string", label,
                 key, json_type(value));
    result.emplace(key, value.get<std::string>());
  }
  return result;
}

// The data region must be tiled exactly: each tensor starts where the previous one ends, and the
// last ends at the end of the file (the format's reference reader refuses holes and overlaps).
void check_tiling(const std::vector<TensorInfo>& tensors, uint64_t data_size,
                  std::string_view label) {
  uint64_t covered = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo& t : tensors) {
    uint64_t end = t.data_offset + t.nbytes;
    if (t.data_offset < covered)
      fail("{}: tensor '{}' (bytes [{}, {})) overlaps tensor '{}' (bytes [{}, {}))", label, t.name,
           t.data_offset, end, previous->name, previous->data_offset,
           previous->data_offset + previous->nbytes);
    if (t.data_offset > covered)
      fail("{}: bytes [{}, {}) of the data belong to no tensor (a hole before tensor '{}')", label,
           covered, t.data_offset, t.name);
    covered = end;
    previous = &t;
  }
  if (covered != data_size)
    fail("{}: {} trailing bytes after the last tensor (data is {} bytes, tensors cover {})", label,
         data_size - covered, data_size, covered);
}

}  // namespace

uint64_t TensorInfo::numel() const {
  uint64_t count = 1;
  for (int64_t extent : shape) count *= static_cast<uint64_t>(extent);
  return count;
}

SafetensorsHeader parse_safetensors(std::span<const std::byte> file, std::string_view label) {
  QINFER_CHECK(file.size() >= 8,
               "{}: file is {} bytes, too short for the 8-byte header length of a safetensors file",
               label, file.size());
  uint64_t header_size = 0;
  for (int i = 7; i >= 0; --i)
    header_size = (header_size << 8) | std::to_integer<uint64_t>(file[i]);
  QINFER_CHECK(header_size <= kMaxHeaderBytes,
               "{}: header length {} exceeds the {} byte limit (corrupt file or not safetensors)",
               label, header_size, kMaxHeaderBytes);
  QINFER_CHECK(header_size <= file.size() - 8,
               "{}: header length {} runs past the end of the file ({} bytes)", label, header_size,
               file.size());

  std::string_view text(reinterpret_cast<const char*>(file.data() + 8), header_size);
  json header = parse_json_unique_keys(text, label, "header");
  QINFER_CHECK(header.is_object(), "{}: header is a JSON {}, expected an object", label,
               json_type(header));

  SafetensorsHeader result;
  result.data_start = 8 + header_size;
  uint64_t data_size = file.size() - result.data_start;
  result.tensors.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__")
      result.metadata = parse_metadata(entry, label);
    else
      result.tensors.push_back(parse_entry(name, entry, data_size, label));
  }
  std::sort(result.tensors.begin(), result.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) {
              return std::tie(a.data_offset, a.nbytes) < std::tie(b.data_offset, b.nbytes);
            });
  check_tiling(result.tensors, data_size, label);
  return result;
}

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  check_regular_file(path);  // open() of a FIFO waits for a writer: never reach it
  // O_NONBLOCK: should the path turn into a FIFO after the check, open must not wait either.
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("cannot open {}: {}", path.string(), errno_text(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int error = errno;
    ::close(fd);
    fail("cannot stat {}: {}", path.string(), errno_text(error));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: is not a regular file", path.string());
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* data = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (data == MAP_FAILED) {
      int error = errno;
      ::close(fd);
      fail("cannot mmap {} ({} bytes): {}", path.string(), size_, errno_text(error));
    }
    data_ = static_cast<const std::byte*>(data);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::byte*>(data_), size_);
}

SafetensorsFile::SafetensorsFile(const std::filesystem::path& path)
    : file_(path), header_(parse_safetensors(file_.bytes(), path.string())) {}

std::span<const std::byte> SafetensorsFile::data(const TensorInfo& tensor) const {
  uint64_t begin = header_.data_start + tensor.data_offset;
  QINFER_CHECK(tensor.data_offset <= file_.bytes().size() &&
                   tensor.nbytes <= file_.bytes().size() &&
                   begin + tensor.nbytes <= file_.bytes().size(),
               "{}: tensor '{}' (bytes [{}, {})) is not inside this file", path().string(),
               tensor.name, tensor.data_offset, tensor.data_offset + tensor.nbytes);
  return file_.bytes().subspan(begin, tensor.nbytes);
}

namespace {

constexpr std::string_view kIndexName = "model.safetensors.index.json";

// weight_map of a sharded checkpoint's index: tensor name -> shard file name.
std::map<std::string, std::string> read_index(const std::filesystem::path& index_path) {
  MappedFile file(index_path);
  std::string label = index_path.string();
  std::string_view text(reinterpret_cast<const char*>(file.bytes().data()), file.bytes().size());
  json index = parse_json_unique_keys(text, label, "index");
  QINFER_CHECK(index.is_object(), "{}: index is a JSON {}, expected an object", label,
               json_type(index));
  auto weight_map = index.find("weight_map");
  QINFER_CHECK(weight_map != index.end(), "{}: index has no 'weight_map'", label);
  QINFER_CHECK(weight_map->is_object(), "{}: 'weight_map' is a JSON {}, expected an object", label,
               json_type(*weight_map));
  QINFER_CHECK(!weight_map->empty(), "{}: 'weight_map' lists no tensors", label);
  std::map<std::string, std::string> result;
  for (const auto& [tensor, shard] : weight_map->items()) {
    QINFER_CHECK(shard.is_string(), "{}: weight_map['{}'] is a JSON {}, expected a file name",
                 label, tensor, json_type(shard));
    const auto& name = shard.get_ref<const std::string&>();
    // Shards live next to the index; a path could read any file on the machine.
    QINFER_CHECK(!name.empty() && name != "." && name != ".." &&
                     name.find_first_of("/\\") == std::string::npos,
                 "{}: weight_map['{}'] = '{}' is not a plain file name in the checkpoint directory",
                 label, tensor, name);
    result.emplace(tensor, name);
  }
  return result;
}

}  // namespace

TensorStore::TensorStore(const std::filesystem::path& dir) : dir_(dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  QINFER_CHECK(fs::is_directory(dir, ec), "{}: not a directory{}", dir.string(),
               ec ? fmt::format(" ({})", ec.message()) : std::string());

  const fs::path index_path = dir / kIndexName;
  const bool indexed = fs::exists(index_path, ec);
  std::map<std::string, std::string> weight_map;
  std::vector<std::string> file_names;
  if (indexed) {
    weight_map = read_index(index_path);
    std::set<std::string> shards;
    for (const auto& [tensor, shard] : weight_map) {
      if (shards.insert(shard).second)
        QINFER_CHECK(fs::exists(dir / shard, ec),
                     "{}: shard '{}' (holding tensor '{}') does not exist in {}",
                     index_path.string(), shard, tensor, dir.string());
    }
    file_names.assign(shards.begin(), shards.end());
  } else if (fs::exists(dir / "model.safetensors", ec)) {
    file_names.push_back("model.safetensors");
  } else {
    // MLX style: every *.safetensors; like Python's glob, hidden files (e.g. macOS "._x") are
    // skipped.
    fs::directory_iterator it(dir, ec);
    QINFER_CHECK(!ec, "{}: cannot list directory: {}", dir.string(), ec.message());
    for (; it != fs::directory_iterator(); it.increment(ec)) {
      std::string name = it->path().filename().string();
      if (name.ends_with(".safetensors") && name[0] != '.' && it->is_regular_file(ec))
        file_names.push_back(name);
    }
    QINFER_CHECK(!ec, "{}: cannot list directory: {}", dir.string(), ec.message());
    std::sort(file_names.begin(), file_names.end());
    QINFER_CHECK(!file_names.empty(),
                 "{}: no safetensors found (expected model.safetensors, {} or *.safetensors)",
                 dir.string(), kIndexName);
  }

  for (const auto& name : file_names) {
    files_.push_back(std::make_unique<SafetensorsFile>(dir / name));
    const SafetensorsFile& file = *files_.back();
    for (const TensorInfo& info : file.tensors()) {
      if (indexed) {
        auto listed = weight_map.find(info.name);
        QINFER_CHECK(listed != weight_map.end(), "{}: tensor '{}' is stored in {} but not listed",
                     index_path.string(), info.name, name);
        QINFER_CHECK(listed->second == name, "{}: tensor '{}' is listed in {} but stored in {}",
                     index_path.string(), info.name, listed->second, name);
      }
      auto [it, inserted] = tensors_.emplace(info.name, StoredTensor{&info, &file});
      QINFER_CHECK(inserted, "{}: tensor '{}' is stored in both {} and {}", dir.string(), info.name,
                   it->second.file->path().string(), file.path().string());
    }
  }
  for (const auto& [tensor, shard] : weight_map)
    QINFER_CHECK(tensors_.contains(tensor),
                 "{}: tensor '{}' is listed in {} but that shard has no such tensor",
                 index_path.string(), tensor, shard);
}

const StoredTensor* TensorStore::find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

const StoredTensor& TensorStore::at(std::string_view name) const {
  const StoredTensor* tensor = find(name);
  QINFER_CHECK(tensor, "{}: checkpoint has no tensor '{}'", dir_.string(), name);
  return *tensor;
}

uint64_t TensorStore::total_bytes() const {
  uint64_t total = 0;
  for (const auto& [name, tensor] : tensors_) total += tensor.info->nbytes;
  return total;
}

}  // namespace qinfer::io
