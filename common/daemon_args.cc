#include "common/daemon_args.h"

#include <cstdio>

namespace tally {

bool DaemonArgs::printedHelpOrVersion(const char* version) const {
  const std::string_view arg = current();
  if (arg == "--help" || arg == "-h") {
    std::fputs(usage_, stdout);
    return true;
  }
  if (arg == "--version") {
    std::printf("%s %s\n", program_, version);
    return true;
  }
  return false;
}

const char* DaemonArgs::value() {
  if (index_ + 1 >= argc_) {
    std::fprintf(stderr, "%s: %s needs a value\n%s", program_, current(), usage_);
    return nullptr;
  }
  return argv_[++index_];
}

}  // namespace tally
