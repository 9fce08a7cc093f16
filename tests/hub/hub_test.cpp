// Models by Hugging Face name against a local fake hub: the cache layout huggingface_hub writes,
// resume, retries, hash checks, gated and missing repos, offline mode, concurrent pulls, a cache made
// by hand, and the qinfer commands (run --model org/name, pull, ls, rm) end to end.
#include "hub/hub.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "core/error.h"
#include "hub/fake_hub.h"
#include "support/run_command.h"
#include "support/safetensors_writer.h"

namespace qinfer::testing {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

const std::string kCommit = "0123456789abcdef0123456789abcdef01234567";
const std::string kGatedCommit = "fedcba9876543210fedcba9876543210fedcba98";

fs::path demo_dir() { return fs::path(QINFER_TEST_DATA).parent_path().parent_path() / "models" / "demo"; }

// The demo model as the hub holds it; TRAINING.md and the rest are not model files and stay behind.
FakeRepo demo_repo(const std::string& commit) {
  FakeRepo repo{.commit = commit};
  for (const char* name : {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                           "model.safetensors", "TRAINING.md"})
    repo.files[name] = {read_text(demo_dir() / name), std::string_view(name).ends_with(".safetensors")};
  return repo;
}

struct HubTest : ::testing::Test {
  FakeHub hub;
  TempDir cache;
  const std::string weights = read_text(demo_dir() / "model.safetensors");

  void SetUp() override {
    hub.add_repo("demo/tiny", demo_repo(kCommit));
    FakeRepo gated = demo_repo(kGatedCommit);
    gated.gated = true;
    hub.add_repo("meta/gated", std::move(gated));
  }

  hub::HubOptions options() const {
    hub::HubOptions o;
    o.cache_dir = cache.path();
    o.endpoint = hub.endpoint();
    o.progress = false;
    o.backoff = std::chrono::milliseconds(10);
    o.stall_timeout = std::chrono::seconds(1);
    return o;
  }
  fs::path repo_dir() const { return cache / "models--demo--tiny"; }

  // What blobs/ holds (partial files included).
  std::vector<std::string> blobs() const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(repo_dir() / "blobs"))
      names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }
};

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ModelName, ParsesOrgNameAndRevision) {
  auto n = hub::parse_model_name("Qwen/Qwen3-0.6B");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->repo, "Qwen/Qwen3-0.6B");
  EXPECT_EQ(n->revision, "main");
  n = hub::parse_model_name("Qwen/Qwen3-0.6B@refs/pr/1");
  ASSERT_TRUE(n);
  EXPECT_EQ(n->revision, "refs/pr/1");
  for (const char* bad : {"Qwen3", "/abs/path", "./models/demo", "a/b/c", "a/..", "org/name@", "org/name@../x", "o/n@a//b"})
    EXPECT_FALSE(hub::parse_model_name(bad)) << bad;
}

TEST_F(HubTest, PullWritesTheLayoutHuggingfaceHubWrites) {
  const fs::path snapshot = hub::pull("demo/tiny", options());
  EXPECT_EQ(snapshot, repo_dir() / "snapshots" / kCommit);
  EXPECT_EQ(read_text(repo_dir() / "refs" / "main"), kCommit);
  // The LFS file is named by its sha256, the others by their git blob sha1; links are relative.
  const fs::path link = snapshot / "model.safetensors";
  ASSERT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(fs::read_symlink(link), fs::path("../../blobs") / sha256_hex(weights));
  EXPECT_EQ(read_text(link), weights);
  const std::string config = read_text(demo_dir() / "config.json");
  EXPECT_EQ(fs::read_symlink(snapshot / "config.json"), fs::path("../../blobs") / git_blob_sha1(config));
  EXPECT_EQ(read_text(snapshot / "config.json"), config);
  EXPECT_FALSE(fs::exists(snapshot / "TRAINING.md"));  // only what a model needs
  EXPECT_FALSE(fs::exists(snapshot / "original"));
  EXPECT_EQ(blobs().size(), 5u);
  // Locks where huggingface_hub keeps them, none beside the blobs.
  EXPECT_TRUE(fs::exists(cache / ".locks" / "models--demo--tiny" / (sha256_hex(weights) + ".lock")));
  for (const auto& e : fs::directory_iterator(repo_dir() / "blobs")) EXPECT_NE(e.path().extension(), ".lock");
  // The CDN redirect was followed, and a second pull downloads nothing.
  EXPECT_EQ(hub.cdn_gets(), 1);
  hub::pull("demo/tiny", options());
  EXPECT_EQ(hub.cdn_gets(), 1);
  // resolve_model finds it without asking the hub.
  const size_t asked = hub.requests().size();
  EXPECT_EQ(hub::resolve_model("demo/tiny", options()), snapshot);
  EXPECT_EQ(hub::resolve_model("demo/tiny@" + kCommit, options()), snapshot);
  EXPECT_EQ(hub.requests().size(), asked);
}

TEST_F(HubTest, ResumesAPartialFileFromItsLastByte) {
  const std::string sha = sha256_hex(weights);
  fs::create_directories(repo_dir() / "blobs");
  const size_t half = weights.size() / 2;
  std::ofstream(repo_dir() / "blobs" / (sha + ".incomplete"), std::ios::binary) << weights.substr(0, half);
  hub::pull("demo/tiny", options());
  EXPECT_EQ(read_text(repo_dir() / "blobs" / sha), weights);
  std::vector<std::string> ranges;
  for (const auto& r : hub.requests())
    if (r.method == "GET" && r.path.starts_with("/cdn/")) ranges.push_back(r.range);
  EXPECT_EQ(ranges, std::vector<std::string>{fmt::format("bytes={}-", half)});
}

TEST_F(HubTest, AConnectionDroppedMidFileIsResumed) {
  hub.drop_after = 5u << 20;
  hub.drops = 2;
  hub::pull("demo/tiny", options());
  EXPECT_EQ(read_text(repo_dir() / "snapshots" / kCommit / "model.safetensors"), weights);
  std::vector<std::string> ranges;
  for (const auto& r : hub.requests())
    if (r.method == "GET" && r.path.starts_with("/cdn/")) ranges.push_back(r.range);
  EXPECT_EQ(ranges, (std::vector<std::string>{"", fmt::format("bytes={}-", 5u << 20), fmt::format("bytes={}-", 10u << 20)}));
}

TEST_F(HubTest, AStalledTransferIsBrokenOffAndResumed) {
  hub.drop_after = 1u << 20;
  hub.stalls = 1;
  hub.stall_ms = 1800;
  hub.api_delay_ms = 300;  // a slow answer is waited for
  hub::pull("demo/tiny", options());
  EXPECT_EQ(read_text(repo_dir() / "snapshots" / kCommit / "model.safetensors"), weights);
  EXPECT_EQ(hub.cdn_gets(), 2);
}

TEST_F(HubTest, GivesUpAfterTheRetriesWithAMessage) {
  hub.drop_after = 1u << 20;
  hub.drops = 100;
  hub::HubOptions o = options();
  o.retries = 2;
  const std::string error = error_of([&] { hub::pull("demo/tiny", o); });
  EXPECT_THAT(error, HasSubstr("model.safetensors broke off 3 times"));
  EXPECT_THAT(error, HasSubstr("run again to resume"));
  EXPECT_EQ(hub.cdn_gets(), 3);
  EXPECT_FALSE(fs::exists(repo_dir() / "refs" / "main"));
}

TEST_F(HubTest, AWrongHashIsRefusedAndNothingCorruptStays) {
  hub.corrupt = true;
  const std::string error = error_of([&] { hub::pull("demo/tiny", options()); });
  EXPECT_THAT(error, HasSubstr("model.safetensors is corrupt"));
  EXPECT_THAT(error, HasSubstr(sha256_hex(weights)));
  for (const std::string& name : blobs()) {
    EXPECT_NE(name, sha256_hex(weights));
    EXPECT_FALSE(name.ends_with(".incomplete")) << name;
  }
  EXPECT_FALSE(fs::exists(repo_dir() / "snapshots" / kCommit / "model.safetensors"));
  EXPECT_FALSE(fs::exists(repo_dir() / "refs" / "main"));
  EXPECT_THROW(hub::resolve_model("demo/tiny", [&] { auto o = options(); o.offline = true; return o; }()), Error);
  // Once the hub serves good bytes again, the pull completes.
  hub.corrupt = false;
  hub::pull("demo/tiny", options());
  EXPECT_EQ(read_text(repo_dir() / "snapshots" / kCommit / "model.safetensors"), weights);
}

// A file outside LFS is checked against its git blob id (the ETag the hub gives it), as git computes
// it (`git hash-object`).
TEST_F(HubTest, AWrongGitBlobIdIsRefused) {
  EXPECT_EQ(git_blob_sha1("hello\n"), "ce013625030ba8dba906f756967f9e9ca394464a");
  hub.corrupt_text = true;
  const std::string error = error_of([&] { hub::pull("demo/tiny", options()); });
  EXPECT_THAT(error, HasSubstr("is corrupt: git blob sha1"));
  EXPECT_FALSE(fs::exists(repo_dir() / "refs" / "main"));
  hub.corrupt_text = false;
  hub::pull("demo/tiny", options());
  EXPECT_EQ(read_text(repo_dir() / "snapshots" / kCommit / "config.json"), read_text(demo_dir() / "config.json"));
}

TEST_F(HubTest, AGatedRepoSaysHowToGetIn) {
  const std::string error = error_of([&] { hub::pull("meta/gated", options()); });
  EXPECT_THAT(error, HasSubstr("HTTP 401"));
  EXPECT_THAT(error, HasSubstr("gated or private"));
  EXPECT_THAT(error, HasSubstr("HF_TOKEN"));
  EXPECT_THAT(error, HasSubstr(hub.endpoint() + "/meta/gated"));
  // With a token it works, and every request for the repo carried it.
  hub::HubOptions o = options();
  o.token = "good-token";
  const size_t before = hub.requests().size();
  hub::pull("meta/gated", o);
  const std::vector<SeenRequest> seen = hub.requests();
  ASSERT_GT(seen.size(), before);
  for (size_t i = before; i < seen.size(); ++i) {
    if (seen[i].path.starts_with("/cdn/")) continue;
    EXPECT_EQ(seen[i].authorization, "Bearer good-token") << seen[i].path;
  }
}

TEST_F(HubTest, MissingRepoRevisionOrFileIsNamed) {
  hub.add_repo("demo/broken", [] {
    FakeRepo r = demo_repo("1111111111111111111111111111111111111111");
    r.files.erase("config.json");
    return r;
  }());
  EXPECT_THAT(error_of([&] { hub::pull("demo/tiny@v9", options()); }),
              HasSubstr("demo/tiny@v9: the repo or revision does not exist"));
  EXPECT_THAT(error_of([&] { hub::pull("demo/broken", options()); }), HasSubstr("has no config.json"));
  // A path that is no name is left to the loader, which names what is missing.
  EXPECT_EQ(hub::resolve_model("/no/such/folder", options()), fs::path("/no/such/folder"));
}

TEST_F(HubTest, NoNetworkSaysSoAndThatNothingIsCached) {
  hub::HubOptions o = options();
  o.endpoint = "http://127.0.0.1:1";  // nothing listens there
  const std::string error = error_of([&] { hub::resolve_model("demo/tiny", o); });
  EXPECT_THAT(error, HasSubstr("cannot reach http://127.0.0.1:1"));
  EXPECT_THAT(error, HasSubstr("nothing is cached"));
}

TEST_F(HubTest, OfflineWithNothingCachedMakesNoRequest) {
  hub::HubOptions o = options();
  o.offline = true;
  const std::string error = error_of([&] { hub::resolve_model("demo/tiny", o); });
  EXPECT_THAT(error, HasSubstr("HF_HUB_OFFLINE"));
  EXPECT_THAT(error, HasSubstr("not in the Hugging Face cache"));
  EXPECT_TRUE(hub.requests().empty());
}

// A sharded model's shards come down at once, each on a connection of its own, and land whole.
TEST_F(HubTest, ShardsDownloadAtOnce) {
  FakeRepo sharded{.commit = std::string(40, 'c')};
  sharded.files["config.json"] = {read_text(demo_dir() / "config.json"), false};
  for (int i = 1; i <= 3; ++i)
    sharded.files[fmt::format("model-{:05d}-of-00003.safetensors", i)] = {std::string(1 << 20, static_cast<char>('a' + i)), true};
  hub.add_repo("demo/sharded", sharded);
  hub.cdn_delay_ms = 300;
  const fs::path snapshot = hub::pull("demo/sharded", options());
  EXPECT_GE(hub.most_cdn_in_flight.load(), 2) << "the shards came one after another";
  for (const auto& [name, file] : sharded.files) EXPECT_EQ(read_text(snapshot / name), file.content) << name;
  hub::HubOptions one = options();
  one.parallel = 1;
  hub.most_cdn_in_flight = 0;
  fs::remove_all(cache / "models--demo--sharded");
  hub::pull("demo/sharded", one);
  EXPECT_EQ(hub.most_cdn_in_flight.load(), 1) << "parallel = 1 downloads one at a time";
}

TEST_F(HubTest, TwoConcurrentPullsShareOneDownload) {
  std::string errors[2];
  std::thread threads[2];
  for (int i = 0; i < 2; ++i)
    threads[i] = std::thread([&, i] { errors[i] = error_of([&] { hub::pull("demo/tiny", options()); }); });
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors[0], "(no error)");
  EXPECT_EQ(errors[1], "(no error)");
  EXPECT_EQ(hub.cdn_gets(), 1);
  EXPECT_EQ(blobs().size(), 5u);
  EXPECT_EQ(read_text(repo_dir() / "snapshots" / kCommit / "model.safetensors"), weights);
}

// As huggingface_hub documents it (and hard links or plain files in a snapshot work as well).
TEST(HubCache, AHandMadeCacheIsUsedWithNoServer) {
  TempDir cache;
  const fs::path repo = cache / "models--Qwen--Demo";
  const std::string commit = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  fs::create_directories(repo / "refs");
  fs::create_directories(repo / "blobs");
  fs::create_directories(repo / "snapshots" / commit);
  std::ofstream(repo / "refs" / "main") << commit;
  int n = 0;
  for (const char* name : {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors"}) {
    const std::string blob = fmt::format("blob{}", n++);
    fs::copy_file(demo_dir() / name, repo / "blobs" / blob);
    fs::create_symlink(fs::path("../../blobs") / blob, repo / "snapshots" / commit / name);
  }
  fs::copy_file(demo_dir() / "generation_config.json", repo / "snapshots" / commit / "generation_config.json");
  hub::HubOptions o;
  o.cache_dir = cache.path();
  o.endpoint = "http://127.0.0.1:1";
  EXPECT_EQ(hub::resolve_model("Qwen/Demo", o), repo / "snapshots" / commit);
  o.offline = true;
  EXPECT_EQ(hub::resolve_model("Qwen/Demo@main", o), repo / "snapshots" / commit);
  // A folder that exists wins over the name.
  fs::create_directories(cache / "Qwen" / "Demo");
  const fs::path cwd = fs::current_path();
  fs::current_path(cache.path());
  EXPECT_EQ(hub::resolve_model("Qwen/Demo", o), fs::path("Qwen/Demo"));
  fs::current_path(cwd);

  const std::vector<hub::CachedModel> models = hub::list_cached(o);
  ASSERT_EQ(models.size(), 1u);
  EXPECT_EQ(models[0].repo, "Qwen/Demo");
  EXPECT_EQ(models[0].refs, (std::vector<std::pair<std::string, std::string>>{{"main", commit}}));
  EXPECT_EQ(models[0].family, "qwen3_5");
  EXPECT_GT(models[0].bytes, fs::file_size(demo_dir() / "model.safetensors"));

  EXPECT_THROW(hub::remove_cached("Qwen/Demo@main", o), Error);
  EXPECT_THROW(hub::remove_cached("../etc", o), Error);
  hub::remove_cached("Qwen/Demo", o);
  EXPECT_FALSE(fs::exists(repo));
  EXPECT_TRUE(fs::exists(cache.path()));
}

// The binary with HF_ENDPOINT and HF_HUB_CACHE pointing at the fake hub and a temporary cache.
TEST_F(HubTest, CommandsRunPullListAndRemoveByName) {
  const std::string env = fmt::format("HF_ENDPOINT={} HF_HUB_CACHE='{}' HF_TOKEN= HF_HUB_OFFLINE= ", hub.endpoint(),
                                      cache.path().string());
  const std::string bin = std::string(QINFER_BINARY);
  const CommandResult by_name = run_command(env + bin + " run --model demo/tiny -p hi -n 4 --temp 0");
  ASSERT_EQ(by_name.status, 0) << by_name.err;
  const CommandResult by_folder =
      run_command(bin + " run --model '" + demo_dir().string() + "' -p hi -n 4 --temp 0");
  ASSERT_EQ(by_folder.status, 0) << by_folder.err;
  EXPECT_EQ(by_name.out, by_folder.out);
  EXPECT_FALSE(by_name.out.empty());
  EXPECT_EQ(hub.cdn_gets(), 1);

  // Cached now: offline works, and a second run asks nothing.
  const size_t asked = hub.requests().size();
  const CommandResult offline =
      run_command(env + "HF_HUB_OFFLINE=1 " + bin + " run --model demo/tiny -p hi -n 4 --temp 0");
  ASSERT_EQ(offline.status, 0) << offline.err;
  EXPECT_EQ(offline.out, by_folder.out);
  EXPECT_EQ(hub.requests().size(), asked);

  const CommandResult gated = run_command(env + bin + " pull meta/gated");
  EXPECT_EQ(gated.status, 1);
  EXPECT_THAT(gated.err, HasSubstr("gated or private"));
  const CommandResult pulled = run_command(env + bin + " pull meta/gated --hf-token good-token");
  ASSERT_EQ(pulled.status, 0) << pulled.err;
  EXPECT_THAT(pulled.out, HasSubstr(kGatedCommit));

  const CommandResult ls = run_command(env + bin + " ls");
  ASSERT_EQ(ls.status, 0) << ls.err;
  EXPECT_THAT(ls.out, HasSubstr("demo/tiny"));
  EXPECT_THAT(ls.out, HasSubstr("meta/gated"));
  EXPECT_THAT(ls.out, HasSubstr("main -> " + kCommit.substr(0, 12)));
  EXPECT_THAT(ls.out, HasSubstr("qwen3_5"));
  EXPECT_THAT(ls.out, HasSubstr("MiB"));

  const CommandResult bad_rm = run_command(env + bin + " rm tiny");
  EXPECT_EQ(bad_rm.status, 1);
  EXPECT_THAT(bad_rm.err, HasSubstr("expected a Hugging Face name org/name"));
  const CommandResult rm = run_command(env + bin + " rm demo/tiny");
  ASSERT_EQ(rm.status, 0) << rm.err;
  EXPECT_FALSE(fs::exists(repo_dir()));
  EXPECT_FALSE(fs::exists(cache / ".locks" / "models--demo--tiny")) << "its locks go with it";
  EXPECT_TRUE(fs::exists(cache / "models--meta--gated"));
  const CommandResult offline_gone =
      run_command(env + "HF_HUB_OFFLINE=1 " + bin + " run --model demo/tiny -p hi -n 4 --temp 0");
  EXPECT_EQ(offline_gone.status, 1);
  EXPECT_THAT(offline_gone.err, HasSubstr("HF_HUB_OFFLINE"));
}

}  // namespace
}  // namespace qinfer::testing
