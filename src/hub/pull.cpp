// Downloading a model from the hub's HTTP API into the cache, as huggingface_hub does it: the revision's
// commit and file list from /api/models, each file's etag from a HEAD of /resolve, the bytes into
// blobs/{etag}.incomplete (resumed with Range), a sha256 check for LFS files, then the blob, the
// snapshot symlink and the ref.
#include <curl/curl.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <exception>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "hub/hub.h"
#include "hub/layout.h"
#include "io/json.h"

namespace qinfer::hub {
namespace fs = std::filesystem;

namespace {

// The files a model needs; the rest of a repo (other weight formats, READMEs, images) stays on the hub.
const std::set<std::string, std::less<>> kModelFiles = {
    "config.json",         "generation_config.json",       "tokenizer.json",     "tokenizer_config.json",
    "chat_template.jinja", "chat_template.json",           "special_tokens_map.json", "vocab.json",
    "merges.txt",          "preprocessor_config.json",     "model.safetensors.index.json"};

bool model_file(const std::string& name) {
  if (name.find('/') != std::string::npos) return false;  // subfolders hold other formats (original/, onnx/)
  return kModelFiles.contains(name) || name.ends_with(".safetensors");
}

constexpr size_t kMaxTextReply = 64u << 20;

struct Reply {
  CURLcode code = CURLE_OK;
  std::string curl_error;
  long status = 0;
  // The headers of every response of the chain (redirects first), names lowercase.
  std::vector<std::vector<std::pair<std::string, std::string>>> responses;
  std::string body;  // a text reply, or the start of an error's body

  // The first response's header `name` that has it.
  std::string header(std::string_view name) const {
    for (const auto& response : responses)
      for (const auto& [key, value] : response)
        if (key == name) return value;
    return "";
  }
  std::string last_header(std::string_view name) const {
    if (responses.empty()) return "";
    for (const auto& [key, value] : responses.back())
      if (key == name) return value;
    return "";
  }
};

size_t on_header(char* data, size_t size, size_t count, void* user) {
  auto& reply = *static_cast<Reply*>(user);
  std::string_view line(data, size * count);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.remove_suffix(1);
  if (line.starts_with("HTTP/")) {
    reply.responses.emplace_back();
  } else if (const size_t colon = line.find(':'); colon != std::string_view::npos && !reply.responses.empty()) {
    std::string name(line.substr(0, colon));
    std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.remove_prefix(1);
    reply.responses.back().emplace_back(std::move(name), std::string(value));
  }
  return size * count;
}

// Where a file's body goes: appended to `fd` from `offset`, or restarted when the server ignored Range.
struct FileSink {
  CURL* curl = nullptr;
  Reply* reply = nullptr;
  int fd = -1;
  uint64_t offset = 0;  // bytes in the file before this request
  bool checked = false;
  bool accept = false;  // the final response is the body of this file
  std::string refusal;  // why the body was refused (a Content-Range that does not continue the file)
  ProgressBar* progress = nullptr;
};

// Breaks off a transfer that has received nothing for `timeout` (libcurl's low-speed limit averages
// over seconds, so it misses a stall that follows a fast start).
struct StallWatch {
  std::chrono::steady_clock::duration timeout;
  curl_off_t received = -1;
  std::chrono::steady_clock::time_point since = std::chrono::steady_clock::now();
};

int on_progress(void* user, curl_off_t, curl_off_t received, curl_off_t, curl_off_t) {
  auto& watch = *static_cast<StallWatch*>(user);
  const auto now = std::chrono::steady_clock::now();
  if (received != watch.received) {
    watch.received = received;
    watch.since = now;
    return 0;
  }
  return now - watch.since > watch.timeout ? 1 : 0;
}

size_t on_text(char* data, size_t size, size_t count, void* user) {
  auto& reply = *static_cast<Reply*>(user);
  const size_t n = size * count;
  if (reply.body.size() + n > kMaxTextReply) return 0;
  reply.body.append(data, n);
  return n;
}

size_t on_file(char* data, size_t size, size_t count, void* user) {
  auto& sink = *static_cast<FileSink*>(user);
  const size_t n = size * count;
  if (!sink.checked) {
    sink.checked = true;
    long status = 0;
    curl_easy_getinfo(sink.curl, CURLINFO_RESPONSE_CODE, &status);
    if (status == 200 && sink.offset > 0) {
      // The server sent the whole file: start it over.
      if (::ftruncate(sink.fd, 0) != 0 || ::lseek(sink.fd, 0, SEEK_SET) != 0) return 0;
      sink.offset = 0;
      sink.accept = true;
    } else if (status == 206) {
      const std::string range = sink.reply->last_header("content-range");  // bytes START-END/TOTAL
      const std::string expected = fmt::format("bytes {}-", sink.offset);
      if (!range.starts_with(expected)) {
        sink.refusal = fmt::format("the server answered the range from byte {} with \"{}\"", sink.offset, range);
        return 0;
      }
      sink.accept = true;
    } else {
      sink.accept = status == 200;
    }
  }
  if (!sink.accept) {  // an error's body, kept for the message
    if (sink.reply->body.size() < 4096) sink.reply->body.append(data, std::min(n, 4096 - sink.reply->body.size()));
    return n;
  }
  for (size_t done = 0; done < n;) {
    const ssize_t w = ::write(sink.fd, data + done, n - done);
    if (w <= 0) return 0;
    done += static_cast<size_t>(w);
  }
  if (sink.progress) sink.progress->advance(n);
  return n;
}

std::string escape(CURL* curl, const std::string& text, bool keep_slashes) {
  std::string out;
  size_t start = 0;
  while (true) {
    const size_t slash = keep_slashes ? text.find('/', start) : std::string::npos;
    const std::string part = text.substr(start, slash == std::string::npos ? std::string::npos : slash - start);
    char* escaped = curl_easy_escape(curl, part.c_str(), static_cast<int>(part.size()));
    out += escaped;
    curl_free(escaped);
    if (slash == std::string::npos) return out;
    out += '/';
    start = slash + 1;
  }
}

// An etag as a blob name: without W/ and quotes.
std::string blob_name(std::string etag) {
  if (etag.starts_with("W/")) etag.erase(0, 2);
  std::erase(etag, '"');
  return etag;
}

bool is_hex(const std::string& text, size_t digits) {
  return text.size() == digits &&
         std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isxdigit(c); });
}

// The hex digest of `prefix` followed by the file's bytes (`what`: the digest's name, for errors).
std::string hex_digest(const fs::path& path, const EVP_MD* md, const std::string& prefix, std::string_view what) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  QINFER_CHECK(fd >= 0, "{}: cannot be opened to check its {}", path.string(), what);
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  EVP_DigestInit_ex(ctx.get(), md, nullptr);
  EVP_DigestUpdate(ctx.get(), prefix.data(), prefix.size());
  std::vector<unsigned char> buffer(1u << 20);
  ssize_t n;
  while ((n = ::read(fd, buffer.data(), buffer.size())) > 0) EVP_DigestUpdate(ctx.get(), buffer.data(), n);
  ::close(fd);
  QINFER_CHECK(n == 0, "{}: read error while checking its {}", path.string(), what);
  std::array<unsigned char, EVP_MAX_MD_SIZE> digest{};
  unsigned int length = 0;
  EVP_DigestFinal_ex(ctx.get(), digest.data(), &length);
  std::string hex;
  for (unsigned int i = 0; i < length; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

uint64_t file_size_or_zero(const fs::path& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0 ? static_cast<uint64_t>(st.st_size) : 0;
}

// A transfer that broke off and may work when resumed.
bool transient(const Reply& reply) {
  switch (reply.code) {
    case CURLE_PARTIAL_FILE:
    case CURLE_RECV_ERROR:
    case CURLE_SEND_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_COULDNT_CONNECT:
    case CURLE_HTTP2_STREAM:
    case CURLE_ABORTED_BY_CALLBACK:  // a stall (StallWatch)
      return true;
    case CURLE_OK:
      return reply.status >= 500 || reply.status == 429;
    default:
      return false;
  }
}

// flock on .locks/models--org--name/{etag}.lock: one process (or thread) downloads a blob, the others
// wait for it.
class BlobLock {
 public:
  explicit BlobLock(const fs::path& path) : fd_(::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644)) {
    QINFER_CHECK(fd_ >= 0, "{}: cannot be created (is the cache folder writable?)", path.string());
    while (::flock(fd_, LOCK_EX) != 0)
      QINFER_CHECK(errno == EINTR, "{}: cannot be locked", path.string());
  }
  ~BlobLock() { ::close(fd_); }  // closing releases the lock
  BlobLock(const BlobLock&) = delete;
  BlobLock& operator=(const BlobLock&) = delete;

 private:
  int fd_;
};

class Client {
 public:
  Client(const HubOptions& options, std::string repo, std::string revision)
      : options_(options), repo_(std::move(repo)), revision_(std::move(revision)) {
    static std::once_flag global;
    std::call_once(global, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
    curl_ = curl_easy_init();
    QINFER_CHECK(curl_ != nullptr, "libcurl could not be initialized");
    if (!options_.token.empty())
      auth_ = curl_slist_append(nullptr, ("Authorization: Bearer " + options_.token).c_str());
  }
  ~Client() {
    curl_slist_free_all(auth_);
    curl_easy_cleanup(curl_);
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  CURL* curl() { return curl_; }

  Reply get_text(const std::string& url) {
    Reply reply;
    prepare(url, reply);
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, on_text);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &reply);
    return perform(reply);
  }

  Reply head(const std::string& url) {
    Reply reply;
    prepare(url, reply);
    curl_easy_setopt(curl_, CURLOPT_NOBODY, 1L);
    return perform(reply);
  }

  Reply get_file(const std::string& url, FileSink& sink) {
    Reply reply;
    prepare(url, reply);
    sink.curl = curl_;
    sink.reply = &reply;
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, on_file);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &sink);
    const std::string range = fmt::format("{}-", sink.offset);
    if (sink.offset > 0) curl_easy_setopt(curl_, CURLOPT_RANGE, range.c_str());
    return perform(reply);
  }

  // An answer that is not a success, as a message naming what was asked for and what to do.
  [[noreturn]] void fail_reply(const Reply& reply, const std::string& what) const {
    const std::string model = repo_ + "@" + revision_;
    if (reply.code != CURLE_OK) {
      const bool cached = [&] {
        const auto commit = cached_commit(repo_folder(options_.cache_dir, repo_), revision_);
        return commit && snapshot_complete(repo_folder(options_.cache_dir, repo_) / "snapshots" / *commit);
      }();
      fail("{}: cannot reach {} ({}){}", model, options_.endpoint,
           reply.curl_error.empty() ? curl_easy_strerror(reply.code) : reply.curl_error,
           cached ? "" : fmt::format("; nothing is cached for it in {}", options_.cache_dir.string()));
    }
    if (reply.status == 401 || reply.status == 403)
      fail("{}: HTTP {} for {}: the repo is gated or private. Accept its license on {}/{} and set HF_TOKEN (or "
           "--hf-token) to a token that may read it{}",
           model, reply.status, what, options_.endpoint, repo_, options_.token.empty() ? " (no token was sent)" : "");
    if (reply.status == 404)
      fail("{}: {} does not exist on {} (HTTP 404; check the repo name, the revision and the file)", model, what,
           options_.endpoint);
    std::string body = reply.body.substr(0, 300);
    std::replace(body.begin(), body.end(), '\n', ' ');
    fail("{}: HTTP {} for {}{}", model, reply.status, what, body.empty() ? "" : ": " + body);
  }

 private:
  void prepare(const std::string& url, Reply& reply) {
    curl_easy_reset(curl_);  // keeps the connections, so the files of a pull share one
    curl_easy_setopt(curl_, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl_, CURLOPT_FOLLOWLOCATION, 1L);  // libcurl sends Authorization to the first host only
    curl_easy_setopt(curl_, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(curl_, CURLOPT_USERAGENT, "qinfer/0.1.0");
    curl_easy_setopt(curl_, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT, 15L);
    stall_ = StallWatch{.timeout = options_.stall_timeout};
    curl_easy_setopt(curl_, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl_, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(curl_, CURLOPT_XFERINFODATA, &stall_);
    curl_easy_setopt(curl_, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(curl_, CURLOPT_HEADERDATA, &reply);
    curl_easy_setopt(curl_, CURLOPT_ERRORBUFFER, error_);
    if (auth_) curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, auth_);
    error_[0] = 0;
  }

  Reply& perform(Reply& reply) {
    reply.code = curl_easy_perform(curl_);
    reply.curl_error = reply.code == CURLE_ABORTED_BY_CALLBACK
                           ? fmt::format("nothing received for {} s", options_.stall_timeout.count())
                           : std::string(error_);
    curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &reply.status);
    return reply;
  }

  const HubOptions& options_;
  std::string repo_, revision_;
  CURL* curl_ = nullptr;
  curl_slist* auth_ = nullptr;
  char error_[CURL_ERROR_SIZE] = {};
  StallWatch stall_{};
};

struct Revision {
  std::string commit;
  std::vector<std::string> files;
};

Revision fetch_revision(Client& client, const HubOptions& options, const ModelName& name) {
  const std::string url = fmt::format("{}/api/models/{}/revision/{}", options.endpoint, name.repo,
                                      escape(client.curl(), name.revision, false));
  const Reply reply = client.get_text(url);
  if (reply.code != CURLE_OK || reply.status != 200) client.fail_reply(reply, "the repo or revision");
  Revision revision;
  try {
    const io::json info = io::json::parse(reply.body);
    revision.commit = info.at("sha").get<std::string>();
    for (const auto& sibling : info.at("siblings")) revision.files.push_back(sibling.at("rfilename").get<std::string>());
  } catch (const std::exception& e) {
    fail("{}: the answer is not model info with \"sha\" and \"siblings\" ({})", url, e.what());
  }
  QINFER_CHECK(is_commit(revision.commit), "{}: \"sha\" is {}, not a 40-hex commit", url, revision.commit);
  return revision;
}

// Downloads `file` of the commit into blobs/ unless it is there already, and returns the blob's name.
std::string fetch_blob(Client& client, const HubOptions& options, const fs::path& repo_dir, const ModelName& name,
                       const std::string& commit, const std::string& file) {
  const std::string url =
      fmt::format("{}/{}/resolve/{}/{}", options.endpoint, name.repo, commit, escape(client.curl(), file, true));
  const Reply meta = client.head(url);
  if (meta.code != CURLE_OK || meta.status != 200) client.fail_reply(meta, file);
  const std::string linked = blob_name(meta.header("x-linked-etag"));
  const std::string etag = linked.empty() ? blob_name(meta.header("etag")) : linked;
  QINFER_CHECK(!etag.empty() && std::all_of(etag.begin(), etag.end(), [](unsigned char c) {
                 return std::isalnum(c) || c == '-' || c == '_';
               }),
               "{}: the answer has no usable ETag (got \"{}\"), so the file cannot be named in the cache", url, etag);
  const std::string size_text = linked.empty() ? meta.last_header("content-length") : meta.header("x-linked-size");
  const std::optional<uint64_t> size =
      size_text.empty() ? std::nullopt : std::optional<uint64_t>(std::stoull(size_text));

  const fs::path blobs = repo_dir / "blobs";
  const fs::path blob = blobs / etag;
  std::error_code ec;
  if (fs::exists(blob, ec)) return etag;
  fs::create_directories(blobs);
  // Where huggingface_hub keeps its locks, so that it and qinfer wait for each other too.
  const fs::path locks = options.cache_dir / ".locks" / repo_dir.filename();
  fs::create_directories(locks);
  const BlobLock lock(locks / (etag + ".lock"));
  if (fs::exists(blob, ec)) return etag;  // another process finished it while this one waited

  const fs::path incomplete = blobs / (etag + ".incomplete");
  std::optional<ProgressBar> progress;
  if (options.progress) progress.emplace(file, size.value_or(0), ProgressBar::Unit::bytes);
  uint64_t reported = 0;
  for (int attempt = 0;; ++attempt) {
    const uint64_t have = file_size_or_zero(incomplete);
    if (progress && have > reported) progress->advance(have - reported), reported = have;
    if (size && have == *size) break;
    const int fd = ::open(incomplete.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    QINFER_CHECK(fd >= 0, "{}: cannot be created (is the cache folder writable?)", incomplete.string());
    ::lseek(fd, 0, SEEK_END);
    FileSink sink{.fd = fd, .offset = have, .progress = progress ? &*progress : nullptr};
    const Reply reply = client.get_file(url, sink);
    ::close(fd);
    reported = file_size_or_zero(incomplete);
    QINFER_CHECK(sink.refusal.empty(), "{}: {}", url, sink.refusal);
    if (reply.code == CURLE_OK && reply.status == 416) break;  // nothing left past `have`: check it below
    const bool complete = reply.code == CURLE_OK && (reply.status == 200 || reply.status == 206) &&
                          (!size || file_size_or_zero(incomplete) == *size);
    if (complete) break;
    const bool retry = transient(reply) || (reply.code == CURLE_OK && sink.accept);  // a short body resumes too
    if (!retry) client.fail_reply(reply, file);
    const std::string why = reply.code != CURLE_OK
                                ? (reply.curl_error.empty() ? curl_easy_strerror(reply.code) : reply.curl_error)
                                : fmt::format("HTTP {}, {} of {} bytes", reply.status, file_size_or_zero(incomplete),
                                              size.value_or(0));
    QINFER_CHECK(attempt < options.retries, "{}@{}: {} broke off {} times ({}); run again to resume from byte {}",
                 name.repo, name.revision, file, attempt + 1, why, file_size_or_zero(incomplete));
    const auto wait = options.backoff * (1 << attempt);
    log_warn("{}: the download broke off at byte {} ({}); resuming in {} ms", file, file_size_or_zero(incomplete),
             why, wait.count());
    std::this_thread::sleep_for(wait);
  }
  if (progress) progress->finish();

  const uint64_t got_size = file_size_or_zero(incomplete);
  if (size && got_size != *size) {
    fs::remove(incomplete, ec);
    fail("{}@{}: {} is {} bytes, the hub said {}; the partial file was deleted, run again", name.repo, name.revision,
         file, got_size, *size);
  }
  // LFS files are named by their sha256, the others by their git blob id: sha1 of "blob SIZE\0" and
  // the bytes, as git hashes them.
  std::string_view digest;
  std::string got;
  if (is_hex(linked, 64)) {
    digest = "sha256";
    got = hex_digest(incomplete, EVP_sha256(), "", digest);
  } else if (linked.empty() && is_hex(etag, 40)) {
    digest = "git blob sha1";
    got = hex_digest(incomplete, EVP_sha1(), fmt::format("blob {}", got_size) + std::string(1, '\0'), digest);
  }
  const std::string& want = linked.empty() ? etag : linked;
  if (!digest.empty() && got != want) {
    fs::remove(incomplete, ec);
    fail("{}@{}: {} is corrupt: {} {} expected, {} received; the download was deleted, run again", name.repo,
         name.revision, file, digest, want, got);
  }
  fs::rename(incomplete, blob, ec);
  QINFER_CHECK(!ec, "{}: cannot be moved into place ({})", blob.string(), ec.message());
  return etag;
}

// snapshots/{commit}/{file} -> ../../blobs/{etag}, relative like huggingface_hub's, replaced atomically.
void link_snapshot(const fs::path& repo_dir, const std::string& commit, const std::string& file,
                   const std::string& etag) {
  static std::atomic<int> counter{0};
  const fs::path link = repo_dir / "snapshots" / commit / file;
  fs::create_directories(link.parent_path());
  std::string target = "../../blobs/" + etag;
  for (char c : file)
    if (c == '/') target = "../" + target;
  std::error_code ec;
  if (fs::is_symlink(link, ec) && fs::read_symlink(link, ec) == target) return;
  const fs::path temp = link.string() + fmt::format(".{}-{}.link", ::getpid(), counter++);
  fs::create_symlink(target, temp, ec);
  QINFER_CHECK(!ec, "{}: cannot be created ({})", temp.string(), ec.message());
  fs::rename(temp, link, ec);
  if (ec) {
    fs::remove(temp);
    fail("{}: cannot be created ({})", link.string(), ec.message());
  }
}

}  // namespace

fs::path pull(const std::string& model, const HubOptions& options) {
  const std::optional<ModelName> name = parse_model_name(model);
  QINFER_CHECK(name.has_value(), "{}: not a Hugging Face name (org/name[@revision])", model);
  QINFER_CHECK(!options.offline, "{}: HF_HUB_OFFLINE is set, so nothing can be downloaded (unset it to pull)", model);
  Client client(options, name->repo, name->revision);
  const Revision revision = fetch_revision(client, options, *name);
  std::vector<std::string> files;
  std::copy_if(revision.files.begin(), revision.files.end(), std::back_inserter(files), model_file);
  const auto has = [&](std::string_view f) { return std::find(files.begin(), files.end(), f) != files.end(); };
  QINFER_CHECK(has("config.json"), "{}@{}: the repo has no config.json (not a transformers model)", name->repo,
               name->revision);
  QINFER_CHECK(std::any_of(files.begin(), files.end(), [](const std::string& f) { return f.ends_with(".safetensors"); }),
               "{}@{}: the repo has no *.safetensors weights at its top level (qinfer loads safetensors)", name->repo,
               name->revision);

  const fs::path repo_dir = repo_folder(options.cache_dir, name->repo);
  log_info("pulling {}@{} (commit {}): {} files into {}", name->repo, name->revision, revision.commit, files.size(),
           repo_dir.string());
  // Several files at once, each worker on a connection of its own, the largest (shards) first. With
  // more than one worker one bar counts the files instead of a bar each that would share a line.
  std::stable_sort(files.begin(), files.end(), [](const std::string& a, const std::string& b) {
    return a.ends_with(".safetensors") > b.ends_with(".safetensors");
  });
  const size_t workers = std::clamp<size_t>(static_cast<size_t>(std::max(options.parallel, 1)), 1, files.size());
  HubOptions each = options;
  std::optional<ProgressBar> files_done;
  if (workers > 1) {
    each.progress = false;
    if (options.progress) files_done.emplace("pulling " + name->repo, files.size(), ProgressBar::Unit::items);
  }
  std::atomic<size_t> next{0};
  std::mutex failed_mutex;
  std::exception_ptr failed;
  auto work = [&](Client& own) {
    for (size_t i; (i = next++) < files.size();) {
      {
        std::lock_guard lock(failed_mutex);
        if (failed) return;
      }
      try {
        const std::string etag = fetch_blob(own, each, repo_dir, *name, revision.commit, files[i]);
        link_snapshot(repo_dir, revision.commit, files[i], etag);
        if (files_done) files_done->advance();
      } catch (...) {
        std::lock_guard lock(failed_mutex);
        if (!failed) failed = std::current_exception();
        return;
      }
    }
  };
  std::vector<std::thread> threads;
  for (size_t t = 1; t < workers; ++t)
    threads.emplace_back([&] {
      try {
        Client own(options, name->repo, name->revision);
        work(own);
      } catch (...) {
        std::lock_guard lock(failed_mutex);
        if (!failed) failed = std::current_exception();
      }
    });
  work(client);
  for (std::thread& t : threads) t.join();
  if (failed) std::rethrow_exception(failed);
  if (files_done) files_done->finish();
  // Last, so that a ref names only a snapshot that is whole.
  if (!is_commit(name->revision)) write_atomically(repo_dir / "refs" / name->revision, revision.commit);
  return repo_dir / "snapshots" / revision.commit;
}

}  // namespace qinfer::hub
