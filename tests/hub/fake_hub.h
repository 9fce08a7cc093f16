#pragma once
// A local stand-in for the Hugging Face hub on 127.0.0.1, on the project's own HTTP server: the
// revision API, /resolve answering LFS files with a redirect to a CDN-like path (ETag, X-Linked-Etag,
// X-Linked-Size), Range requests, and the faults a real download meets (a connection dropped
// mid-file, a stall, a corrupt body, a gated repo).
#include <fmt/format.h>
#include <openssl/evp.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "http/http_server.h"
#include "support/run_command.h"

namespace qinfer::testing {

inline std::string digest_hex(const EVP_MD* md, std::string_view data) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  EVP_Digest(data.data(), data.size(), out, &length, md, nullptr);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", out[i]);
  return hex;
}
inline std::string sha256_hex(std::string_view data) { return digest_hex(EVP_sha256(), data); }
// The id git gives a file's content, which the hub sends as the ETag of a file not in LFS.
inline std::string git_blob_sha1(std::string_view data) {
  // As git hashes a blob: "blob SIZE", a NUL, the bytes (`git hash-object`).
  return digest_hex(EVP_sha1(), fmt::format("blob {}", data.size()) + std::string(1, '\0') + std::string(data));
}

struct FakeFile {
  std::string content;
  bool lfs = false;  // *.safetensors: stored in LFS, served from the CDN path
};

struct FakeRepo {
  std::string commit;
  std::map<std::string, FakeFile> files;
  bool gated = false;  // answers 401 unless the request carries "Bearer good-token"
};

struct SeenRequest {
  std::string method, path, range, authorization;
};

class FakeHub {
 public:
  FakeHub() {
    server_ = std::make_unique<http::Server>(
        http::ServerLimits{.workers = 8}, [this](http::Request& req, http::Responder& res) { handle(req, res); },
        [](int status, const std::string& message) {
          return http::Response{status, "text/plain", fmt::format("error {}: {}", status, message), {}};
        });
    http::Listener listener("127.0.0.1", 0);
    port_ = listener.port();
    server_->start(std::move(listener));
  }
  ~FakeHub() { server_->stop(); }

  std::string endpoint() const { return fmt::format("http://127.0.0.1:{}", port_); }

  void add_repo(const std::string& repo, FakeRepo r) {
    std::lock_guard lock(mutex_);
    repos_[repo] = std::move(r);
  }

  std::vector<SeenRequest> requests() {
    std::lock_guard lock(mutex_);
    return seen_;
  }
  // GETs of the CDN path (the LFS bodies) seen so far.
  int cdn_gets() {
    int n = 0;
    for (const auto& r : requests()) n += r.method == "GET" && r.path.starts_with("/cdn/");
    return n;
  }

  // The next `times` CDN bodies are cut off after `bytes` bytes, the connection closed.
  std::atomic<int> drops{0};
  std::atomic<size_t> drop_after{0};
  // The next `stalls` CDN bodies stop for `stall_ms` after `drop_after` bytes.
  std::atomic<int> stalls{0};
  std::atomic<int> stall_ms{0};
  // CDN bodies have one byte changed (same size, wrong sha256); and so have the other files' bodies.
  std::atomic<bool> corrupt{false};
  std::atomic<bool> corrupt_text{false};
  // The revision API answers after this long.
  std::atomic<int> api_delay_ms{0};
  // CDN bodies start after this long; the most CDN GETs that were in flight at once.
  std::atomic<int> cdn_delay_ms{0};
  std::atomic<int> most_cdn_in_flight{0};

 private:
  void handle(http::Request& req, http::Responder& res) {
    {
      std::lock_guard lock(mutex_);
      seen_.push_back({req.method, req.path, req.header_or("range"), req.header_or("authorization")});
    }
    const std::string& path = req.path;
    if (path.starts_with("/api/models/")) return api(req, res);
    if (path.starts_with("/cdn/")) return cdn(req, res);
    return resolve(req, res);
  }

  const FakeRepo* find_repo(const std::string& repo) {
    std::lock_guard lock(mutex_);
    auto it = repos_.find(repo);
    return it == repos_.end() ? nullptr : &it->second;
  }

  static bool authorized(const FakeRepo& repo, const http::Request& req) {
    return !repo.gated || req.header_or("authorization") == "Bearer good-token";
  }

  // /api/models/{org}/{name}/revision/{rev}
  void api(http::Request& req, http::Responder& res) {
    if (api_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(api_delay_ms.load()));
    const std::string rest = req.path.substr(12);
    const size_t mark = rest.find("/revision/");
    if (mark == std::string::npos) return res.send({404, "application/json", R"({"error":"not found"})", {}});
    const FakeRepo* repo = find_repo(rest.substr(0, mark));
    const std::string revision = rest.substr(mark + 10);
    if (!repo) return res.send({401, "application/json", R"({"error":"Repository not found"})", {}});
    if (!authorized(*repo, req))
      return res.send({401, "application/json", R"({"error":"Access to model is restricted."})", {}});
    if (revision != "main" && revision != repo->commit)
      return res.send({404, "application/json", R"({"error":"Invalid rev id"})", {}});
    std::string siblings = R"({"rfilename":"README.md"},{"rfilename":"original/consolidated.pth"})";
    for (const auto& [name, file] : repo->files) siblings += fmt::format(R"(,{{"rfilename":"{}"}})", name);
    res.send({200, "application/json", fmt::format(R"({{"id":"x","sha":"{}","siblings":[{}]}})", repo->commit, siblings),
              {}});
  }

  // /{org}/{name}/resolve/{commit}/{file}
  void resolve(http::Request& req, http::Responder& res) {
    const size_t mark = req.path.find("/resolve/");
    if (mark == std::string::npos) return res.send({404, "text/plain", "no such page", {}});
    const FakeRepo* repo = find_repo(req.path.substr(1, mark - 1));
    if (!repo) return res.send({404, "text/plain", "Repository not found", {{"X-Error-Code", "RepoNotFound"}}});
    if (!authorized(*repo, req)) return res.send({401, "text/plain", "gated", {{"X-Error-Code", "GatedRepo"}}});
    const std::string rest = req.path.substr(mark + 9);
    const size_t slash = rest.find('/');
    const std::string commit = rest.substr(0, slash), name = rest.substr(slash + 1);
    auto it = repo->files.find(name);
    if (commit != repo->commit || it == repo->files.end())
      return res.send({404, "text/plain", "Entry not found", {{"X-Error-Code", "EntryNotFound"}}});
    const FakeFile& file = it->second;
    if (!file.lfs)
      return res.send({200, "text/plain", corrupt_text ? std::string(file.content).replace(0, 1, "#") : file.content,
                       {{"ETag", '"' + git_blob_sha1(file.content) + '"'}, {"X-Repo-Commit", repo->commit}}});
    const std::string sha = sha256_hex(file.content);
    {
      std::lock_guard lock(mutex_);
      cdn_files_[sha] = &file;
    }
    res.send({302, "text/plain", "", {{"Location", "/cdn/" + sha + "?token=signed"},
                                      {"ETag", '"' + sha + '"'},
                                      {"X-Linked-Etag", '"' + sha + '"'},
                                      {"X-Linked-Size", std::to_string(file.content.size())},
                                      {"X-Repo-Commit", repo->commit}}});
  }

  // /cdn/{sha256}: the LFS bodies, with Range and the faults.
  void cdn(http::Request& req, http::Responder& res) {
    const FakeFile* file = nullptr;
    {
      std::lock_guard lock(mutex_);
      auto it = cdn_files_.find(req.path.substr(5));
      if (it != cdn_files_.end()) file = it->second;
    }
    if (!file) return res.send({404, "text/plain", "no such object", {}});
    if (req.method == "GET") {
      const int now = ++cdn_in_flight_;
      for (int most = most_cdn_in_flight; now > most && !most_cdn_in_flight.compare_exchange_weak(most, now);) {
      }
      if (cdn_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(cdn_delay_ms.load()));
    }
    struct Leaving {
      std::atomic<int>* count;
      ~Leaving() {
        if (count) --*count;
      }
    } leaving{req.method == "GET" ? &cdn_in_flight_ : nullptr};
    std::string body = file->content;
    if (corrupt) body[body.size() / 2] ^= 0x5a;
    const std::string cdn_etag = '"' + git_blob_sha1(body).substr(0, 32) + '"';  // S3's own, unlike the hub's
    size_t from = 0;
    if (const std::string range = req.header_or("range"); range.starts_with("bytes=")) {
      from = std::stoull(range.substr(6));
      if (from >= body.size())
        return res.send({416, "text/plain", "", {{"Content-Range", fmt::format("bytes */{}", body.size())}}});
    }
    const int status = from > 0 ? 206 : 200;
    http::Headers headers = {{"ETag", cdn_etag}, {"Accept-Ranges", "bytes"}};
    if (from > 0) headers.emplace_back("Content-Range", fmt::format("bytes {}-{}/{}", from, body.size() - 1, body.size()));
    if (req.method == "HEAD") return res.send({status, "application/octet-stream", body.substr(from), headers});
    const bool drop = drops.fetch_sub(1) > 0;
    const bool stall = !drop && stalls.fetch_sub(1) > 0;
    if (!drop && !stall) return res.send({status, "application/octet-stream", body.substr(from), headers});
    res.begin_stream(status, "application/octet-stream", headers);
    const size_t cut = std::min(body.size(), from + drop_after.load());
    for (size_t at = from; at < cut; at += 1u << 20) res.write(std::string_view(body).substr(at, std::min<size_t>(1u << 20, cut - at)));
    if (drop) return res.abort_stream();
    std::this_thread::sleep_for(std::chrono::milliseconds(stall_ms.load()));
    res.write(std::string_view(body).substr(cut));
    res.end_stream();
  }

  std::atomic<int> cdn_in_flight_{0};
  std::unique_ptr<http::Server> server_;
  int port_ = 0;
  std::mutex mutex_;
  std::map<std::string, FakeRepo> repos_;
  std::map<std::string, const FakeFile*> cdn_files_;
  std::vector<SeenRequest> seen_;
};

}  // namespace qinfer::testing
