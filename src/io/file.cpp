#include "io/file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "core/error.h"

namespace qinfer::io {
namespace {

std::string_view kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "a special file";
}

}  // namespace

void check_regular_file(const std::filesystem::path& path) {
  struct stat st {};
  // stat follows symlinks: a link to a regular file is as good as the file.
  if (::stat(path.c_str(), &st) != 0)
    fail("{}: cannot read: {}", path.string(), std::generic_category().message(errno));
  QINFER_CHECK(S_ISREG(st.st_mode), "{}: is {}, not a regular file", path.string(), kind_of(st.st_mode));
}

std::string read_model_file(const std::filesystem::path& path, uint64_t max_bytes) {
  check_regular_file(path);
  // O_NONBLOCK: should the path turn into a FIFO after the check, open must not wait for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) fail("{}: cannot open: {}", path.string(), std::generic_category().message(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("{}: is {}, not a regular file", path.string(), kind_of(st.st_mode));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    fail("{}: is {} bytes, more than the {} byte limit for this file", path.string(), st.st_size, max_bytes);
  }
  std::string text(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::read(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      fail("{}: cannot read: {}", path.string(), std::generic_category().message(error));
    }
    if (n == 0) break;  // shrank while reading
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  text.resize(done);
  return text;
}

}  // namespace qinfer::io
