#include "core/assert.h"

#include <cstdio>
#include <cstdlib>

namespace tally {

void assertFailed(const char* expression, const char* file, int line) {
  // The only output core ever produces: a dying process says why.
  std::fprintf(stderr, "tally: assertion failed: %s at %s:%d\n", expression, file, line);
  std::fflush(stderr);
  std::abort();
}

}  // namespace tally
