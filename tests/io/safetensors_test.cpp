#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>

#include "../support/safetensors_writer.h"
#include "core/error.h"
#include "safetensors_cases.h"

namespace qinfer::io {
namespace {

namespace fs = std::filesystem;
using testing::SafetensorsWriter;
using testing::TempDir;
using testing::to_bytes;
using testing::write_file;

const fs::path kCorpus = fs::path(QINFER_TEST_DATA) / ".." / "fuzz" / "corpus";

// The message of the Error `body` throws; a test failure when it throws nothing.
template <typename Body>
std::string error_of(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a qinfer::Error";
  return {};
}

void expect_contains(const std::string& message, std::string_view part) {
  EXPECT_NE(message.find(part), std::string::npos) << "message: " << message << "\nlacks: " << part;
}

std::vector<std::byte> read_all(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::transform(chars.begin(), chars.end(), bytes.begin(), [](char c) { return std::byte(c); });
  return bytes;
}

std::string store_error(const fs::path& dir) {
  return error_of([&] { TensorStore store(dir); });
}

TEST(Safetensors, EachBrokenCaseNamesFileAndProblem) {
  int broken = 0;
  for (const auto& c : testing::safetensors_cases()) {
    SCOPED_TRACE(c.name);
    std::string label = c.name + ".safetensors";
    if (c.errors.empty()) {
      EXPECT_NO_THROW(parse_safetensors(c.bytes, label));
      continue;
    }
    ++broken;
    std::string message = error_of([&] { parse_safetensors(c.bytes, label); });
    EXPECT_EQ(message.rfind(label + ": ", 0), 0u) << message;
    for (const auto& part : c.errors) expect_contains(message, part);
  }
  EXPECT_GE(broken, 40);
}

TEST(Safetensors, CommittedCorpusHoldsEveryCase) {
  // Regenerate with the fuzz build's safetensors_corpus tool when the cases change.
  for (const auto& c : testing::safetensors_cases()) {
    SCOPED_TRACE(c.name);
    fs::path path = kCorpus / (c.name + ".safetensors");
    ASSERT_TRUE(fs::exists(path)) << path;
    EXPECT_EQ(read_all(path), c.bytes);
  }
}

TEST(Safetensors, EveryCorpusFileParsesOrThrowsError) {
  int files = 0;
  for (const auto& entry : fs::directory_iterator(kCorpus)) {
    SCOPED_TRACE(entry.path().string());
    ++files;
    std::vector<std::byte> bytes = read_all(entry.path());
    try {
      parse_safetensors(bytes, entry.path().filename().string());
    } catch (const Error&) {
    } catch (const std::exception& e) {
      ADD_FAILURE() << "escaped as a non-qinfer exception: " << e.what();
    }
  }
  EXPECT_GE(files, static_cast<int>(testing::safetensors_cases().size()));
}

TEST(Safetensors, HeaderFieldsOfValidFile) {
  auto bytes = SafetensorsWriter()
                   .metadata("format", "mlx")
                   .add_filled("b", DType::bf16, {2, 3})
                   .add_filled("a", DType::f4_e2m1, {5})
                   .add_filled("scales", DType::e8m0, {3})
                   .add_filled("empty", DType::f32, {4, 0})
                   .bytes();
  SafetensorsHeader header = parse_safetensors(bytes, "x.safetensors");
  EXPECT_EQ(header.metadata, (std::map<std::string, std::string>{{"format", "mlx"}}));
  EXPECT_EQ(header.data_start % 8, 0u);  // the writer pads like the Python one
  ASSERT_EQ(header.tensors.size(), 4u);
  // sorted by offset: b [0,12), a [12,15) (5 x 4 bits round up), scales [15,18), empty [18,18)
  const auto& b = header.tensors[0];
  EXPECT_EQ(b.name, "b");
  EXPECT_EQ(b.dtype, DType::bf16);
  EXPECT_EQ(b.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(b.numel(), 6u);
  EXPECT_EQ(b.data_offset, 0u);
  EXPECT_EQ(b.nbytes, 12u);
  EXPECT_EQ(header.tensors[1].name, "a");
  EXPECT_EQ(header.tensors[1].dtype, DType::f4_e2m1);
  EXPECT_EQ(header.tensors[1].data_offset, 12u);
  EXPECT_EQ(header.tensors[1].nbytes, 3u);
  EXPECT_EQ(header.tensors[2].name, "scales");
  EXPECT_EQ(header.tensors[2].nbytes, 3u);
  EXPECT_EQ(header.tensors[3].name, "empty");
  EXPECT_EQ(header.tensors[3].numel(), 0u);
  EXPECT_EQ(header.tensors[3].data_offset, 18u);
  EXPECT_EQ(header.tensors[3].nbytes, 0u);
  EXPECT_EQ(header.data_start + 18, bytes.size());
}

TEST(Safetensors, ManyTensorsParseQuickly) {
  // Real checkpoints have thousands of entries; any quadratic step would show here.
  SafetensorsWriter writer;
  constexpr int kCount = 30000;
  for (int i = 0; i < kCount; ++i)
    writer.add_filled(fmt::format("model.layers.{}.weight", i), DType::bf16, {1, i % 3});
  auto bytes = writer.bytes();
  auto start = std::chrono::steady_clock::now();
  SafetensorsHeader header = parse_safetensors(bytes, "big.safetensors");
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(header.tensors.size(), static_cast<size_t>(kCount));
  for (size_t i = 1; i < header.tensors.size(); ++i)
    ASSERT_LE(header.tensors[i - 1].data_offset, header.tensors[i].data_offset);
  EXPECT_LT(seconds, 3.0);  // 0.2 s in a release build, 9 s if quadratic
}

TEST(SafetensorsFile, DataSpansHoldTheStoredBytes) {
  TempDir dir;
  std::vector<float> weights = {1.5f, -2.0f, 3.25f};
  std::vector<uint8_t> fp4 = {0x21, 0x43, 0x05};  // 5 codes: the last byte holds one nibble
  std::vector<uint8_t> scales = {127, 128};
  SafetensorsWriter()
      .add("w", DType::f32, {3}, to_bytes(weights))
      .add("q", DType::f4_e2m1, {5}, to_bytes(fp4))
      .add("s", DType::e8m0, {2}, to_bytes(scales))
      .add("z", DType::bf16, {0, 8}, {})
      .write(dir / "m.safetensors");
  SafetensorsFile file(dir / "m.safetensors");
  EXPECT_EQ(file.path(), dir / "m.safetensors");
  ASSERT_EQ(file.tensors().size(), 4u);
  auto by_name = [&](std::string_view name) -> const TensorInfo& {
    for (const auto& t : file.tensors())
      if (t.name == name) return t;
    throw std::runtime_error("no tensor");
  };
  auto w = file.data(by_name("w"));
  ASSERT_EQ(w.size(), 12u);
  EXPECT_EQ(std::vector<std::byte>(w.begin(), w.end()), to_bytes(weights));
  auto q = file.data(by_name("q"));
  EXPECT_EQ(std::vector<std::byte>(q.begin(), q.end()), to_bytes(fp4));
  auto s = file.data(by_name("s"));
  EXPECT_EQ(std::vector<std::byte>(s.begin(), s.end()), to_bytes(scales));
  EXPECT_EQ(file.data(by_name("z")).size(), 0u);
  // Spans come from the data offsets: q is stored right after w.
  EXPECT_EQ(q.data(), w.data() + 12);
}

TEST(SafetensorsFile, TruncatedFileNamesTensor) {
  TempDir dir;
  fs::path path = dir / "cut.safetensors";
  SafetensorsWriter()
      .add_filled("first", DType::f32, {4})
      .add_filled("second", DType::f32, {4})
      .write(path);
  fs::resize_file(path, fs::file_size(path) - 3);
  std::string message = error_of([&] { SafetensorsFile file(path); });
  expect_contains(message, path.string());
  expect_contains(message, "tensor 'second'");
  expect_contains(message, "truncated");
}

TEST(SafetensorsFile, EmptyAndMissingFiles) {
  TempDir dir;
  write_file(dir / "empty.safetensors", std::string_view());
  MappedFile empty(dir / "empty.safetensors");
  EXPECT_EQ(empty.bytes().size(), 0u);
  std::string message = error_of([&] { SafetensorsFile file(dir / "empty.safetensors"); });
  expect_contains(message, (dir / "empty.safetensors").string());
  expect_contains(message, "0 bytes");

  message = error_of([&] { MappedFile file(dir / "absent.safetensors"); });
  expect_contains(message, (dir / "absent.safetensors").string());
  expect_contains(message, "No such file or directory");

  message = error_of([&] { MappedFile file(dir.path()); });
  expect_contains(message, "not a regular file");
}

// --- TensorStore ----------------------------------------------------------------------------

void write_index(const fs::path& dir, const std::string& weight_map) {
  write_file(dir / "model.safetensors.index.json",
             R"({"metadata":{"total_size":0},"weight_map":)" + weight_map + "}");
}

// Two shards as transformers writes them: a and b in the first, c in the second.
void write_sharded(const fs::path& dir) {
  SafetensorsWriter()
      .add_filled("a", DType::bf16, {2, 2})
      .add_filled("b", DType::f32, {3})
      .write(dir / "model-00001-of-00002.safetensors");
  SafetensorsWriter()
      .add_filled("c", DType::u8, {5})
      .write(dir / "model-00002-of-00002.safetensors");
}

TEST(TensorStore, SingleFile) {
  TempDir dir;
  SafetensorsWriter()
      .add_filled("x", DType::f16, {2, 4})
      .add_filled("y", DType::i32, {3})
      .write(dir / "model.safetensors");
  // Other safetensors next to model.safetensors (e.g. consolidated weights) are not read.
  write_file(dir / "consolidated.safetensors", std::string_view("junk"));
  TensorStore store(dir.path());
  EXPECT_EQ(store.dir(), dir.path());
  ASSERT_EQ(store.files().size(), 1u);
  ASSERT_EQ(store.tensors().size(), 2u);
  const StoredTensor& x = store.at("x");
  EXPECT_EQ(x.info->dtype, DType::f16);
  EXPECT_EQ(x.file, store.files()[0].get());
  EXPECT_EQ(x.data().size(), 16u);
  EXPECT_EQ(store.find("y")->data().size(), 12u);
  EXPECT_EQ(store.find("z"), nullptr);
  EXPECT_EQ(store.total_bytes(), 28u);
  std::string message = error_of([&] { store.at("model.norm.weight"); });
  expect_contains(message, "'model.norm.weight'");
  expect_contains(message, dir.path().string());
}

TEST(TensorStore, ShardedWithIndex) {
  TempDir dir;
  write_sharded(dir.path());
  write_index(dir.path(), R"({"a":"model-00001-of-00002.safetensors",)"
                          R"("b":"model-00001-of-00002.safetensors",)"
                          R"("c":"model-00002-of-00002.safetensors"})");
  TensorStore store(dir.path());
  ASSERT_EQ(store.files().size(), 2u);
  EXPECT_EQ(store.at("a").file->path().filename(), "model-00001-of-00002.safetensors");
  EXPECT_EQ(store.at("c").file->path().filename(), "model-00002-of-00002.safetensors");
  EXPECT_EQ(store.at("c").data().size(), 5u);
  EXPECT_EQ(store.total_bytes(), 8u + 12u + 5u);
}

TEST(TensorStore, IndexErrors) {
  TempDir dir;
  write_sharded(dir.path());
  const std::string index = (dir / "model.safetensors.index.json").string();
  const std::string shard1 = "model-00001-of-00002.safetensors";
  const std::string shard2 = "model-00002-of-00002.safetensors";
  auto map = [&](std::string_view a, std::string_view b, std::string_view c) {
    return fmt::format(R"({{"a":"{}","b":"{}","c":"{}"}})", a, b, c);
  };

  write_index(dir.path(), map(shard1, shard1, "model-00003-of-00002.safetensors"));
  std::string message = store_error(dir.path());
  expect_contains(message, index);
  expect_contains(message, "shard 'model-00003-of-00002.safetensors'");
  expect_contains(message, "does not exist");

  write_index(dir.path(), R"({"a":")" + shard1 + R"(","b":")" + shard1 + R"(","c":")" + shard2 +
                              R"(","d":")" + shard2 + R"("})");
  message = store_error(dir.path());
  expect_contains(message,
                  "tensor 'd' is listed in " + shard2 + " but that shard has no such tensor");

  write_index(dir.path(), R"({"a":")" + shard1 + R"(","c":")" + shard2 + R"("})");
  message = store_error(dir.path());
  expect_contains(message, index);
  expect_contains(message, "tensor 'b' is stored in " + shard1 + " but not listed");

  write_index(dir.path(), map(shard1, shard2, shard2));
  message = store_error(dir.path());
  expect_contains(message, "tensor 'b' is listed in " + shard2 + " but stored in " + shard1);

  for (std::string escape :
       {"../model-00001-of-00002.safetensors", "sub/x.safetensors", "..", ""}) {
    SCOPED_TRACE(escape);
    write_index(dir.path(), map(shard1, shard1, escape));
    message = store_error(dir.path());
    expect_contains(message, "weight_map['c'] = '" + escape + "' is not a plain file name");
  }

  write_file(dir / "model.safetensors.index.json", std::string_view(R"({"weight_map":)"));
  expect_contains(store_error(dir.path()), index + ": index is not valid JSON");
  write_file(dir / "model.safetensors.index.json", std::string_view(R"({"metadata":{}})"));
  expect_contains(store_error(dir.path()), "index has no 'weight_map'");
  write_index(dir.path(), "[]");
  expect_contains(store_error(dir.path()), "'weight_map' is a JSON array, expected an object");
  write_index(dir.path(), "{}");
  expect_contains(store_error(dir.path()), "'weight_map' lists no tensors");
  write_index(dir.path(), R"({"a":1})");
  expect_contains(store_error(dir.path()), "weight_map['a'] is a JSON number");
}

TEST(TensorStore, BrokenShardNamesItsFile) {
  TempDir dir;
  write_sharded(dir.path());
  fs::resize_file(dir / "model-00002-of-00002.safetensors",
                  fs::file_size(dir / "model-00002-of-00002.safetensors") - 1);
  std::string message = store_error(dir.path());
  expect_contains(message, (dir / "model-00002-of-00002.safetensors").string());
  expect_contains(message, "tensor 'c'");
}

TEST(TensorStore, MlxStyleFilesWithoutIndex) {
  TempDir dir;
  write_sharded(dir.path());
  // macOS resource forks are skipped, as Python's glob does.
  write_file(dir / "._model-00001-of-00002.safetensors", std::string_view("not safetensors"));
  write_file(dir / "config.json", std::string_view("{}"));
  TensorStore store(dir.path());
  ASSERT_EQ(store.files().size(), 2u);
  EXPECT_EQ(store.files()[0]->path().filename(), "model-00001-of-00002.safetensors");
  EXPECT_EQ(store.files()[1]->path().filename(), "model-00002-of-00002.safetensors");
  EXPECT_EQ(store.tensors().size(), 3u);
  EXPECT_EQ(store.at("b").file, store.files()[0].get());
}

TEST(TensorStore, OneFileWithAnotherName) {
  TempDir dir;
  SafetensorsWriter().add_filled("w", DType::f32, {2}).write(dir / "weights.safetensors");
  TensorStore store(dir.path());
  ASSERT_EQ(store.files().size(), 1u);
  EXPECT_EQ(store.at("w").data().size(), 8u);
}

TEST(TensorStore, DuplicateTensorAcrossFilesNamesBoth) {
  TempDir dir;
  SafetensorsWriter().add_filled("w", DType::f32, {2}).write(dir / "a.safetensors");
  SafetensorsWriter().add_filled("w", DType::f32, {2}).write(dir / "b.safetensors");
  std::string message = store_error(dir.path());
  expect_contains(message, "tensor 'w'");
  expect_contains(message, (dir / "a.safetensors").string());
  expect_contains(message, (dir / "b.safetensors").string());
}

TEST(TensorStore, NoSafetensors) {
  TempDir dir;
  write_file(dir / "config.json", std::string_view("{}"));
  std::string message = store_error(dir.path());
  expect_contains(message, dir.path().string());
  expect_contains(message, "no safetensors found");
  expect_contains(store_error(dir / "absent"), "not a directory");
  expect_contains(store_error(dir / "config.json"), "not a directory");
}

}  // namespace
}  // namespace qinfer::io
