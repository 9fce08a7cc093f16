// Writes the cases of tests/io/safetensors_cases.h as seed files:
//   safetensors_corpus tests/fuzz/corpus
// safetensors_test.cpp checks that the committed corpus matches the cases.
#include <cstdio>
#include <filesystem>

#include "../io/safetensors_cases.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s <corpus dir>\n", argv[0]);
    return 2;
  }
  std::filesystem::path dir = argv[1];
  std::filesystem::create_directories(dir);
  for (const auto& c : qinfer::testing::safetensors_cases())
    qinfer::testing::write_file(dir / (c.name + ".safetensors"), c.bytes);
  return 0;
}
