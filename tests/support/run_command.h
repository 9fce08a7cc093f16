#pragma once
// Test helper: runs a shell command, capturing stdout, stderr and the exit status.
#include <sys/wait.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace qinfer::testing {

struct CommandResult {
  int status = -1;  // exit code, or -1 when the process did not exit normally (a crash)
  std::string out, err;
};

inline std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

inline CommandResult run_command(const std::string& command) {
  static int counter = 0;
  const auto base = std::filesystem::temp_directory_path() /
                    ("qinfer-cmd-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  const std::string out = base.string() + ".out", err = base.string() + ".err";
  const int raw = std::system((command + " >" + out + " 2>" + err).c_str());
  CommandResult r;
  r.status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  r.out = read_text(out);
  r.err = read_text(err);
  std::filesystem::remove(out);
  std::filesystem::remove(err);
  return r;
}

}  // namespace qinfer::testing
