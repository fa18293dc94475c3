// The main of a fuzz target outside the fuzz build: runs LLVMFuzzerTestOneInput once on every
// file named (directories are walked), so the ordinary suites replay each seed of
// tests/fuzz/corpus and each past finding of tests/fuzz/regressions. Fails when it finds no input,
// so a moved corpus cannot pass by replaying nothing.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "tests/fuzz/fuzz_support.h"

namespace {

bool replay(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    std::fprintf(stderr, "replay: cannot read %s\n", path.c_str());
    return false;
  }
  const std::vector<char> bytes((std::istreambuf_iterator<char>(file)),
                                std::istreambuf_iterator<char>());
  // A copy of its own, so reading past the input is caught under ASan as it is by libFuzzer.
  std::vector<uint8_t> input(bytes.begin(), bytes.end());
  (void)LLVMFuzzerTestOneInput(input.data(), input.size());
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  size_t replayed = 0;
  for (int i = 1; i < argc; ++i) {
    const std::filesystem::path root(argv[i]);
    std::error_code error;
    if (std::filesystem::is_directory(root, error)) {
      for (const auto& entry : std::filesystem::recursive_directory_iterator(root)) {
        if (!entry.is_regular_file()) continue;
        if (!replay(entry.path())) return 1;
        ++replayed;
      }
    } else if (std::filesystem::exists(root, error)) {
      if (!replay(root)) return 1;
      ++replayed;
    }
  }
  std::printf("replayed %zu inputs\n", replayed);
  return replayed > 0 ? 0 : 1;
}
