#pragma once

// Assertions that stay on in every build type and crash the process. They guard invariants
// (bugs), never external input: input is validated and answered with a typed error.

namespace tally {
[[noreturn]] void assertFailed(const char* expression, const char* file, int line);
}  // namespace tally

#define TALLY_ASSERT(condition) \
  ((condition) ? static_cast<void>(0) : ::tally::assertFailed(#condition, __FILE__, __LINE__))

#define TALLY_UNREACHABLE() ::tally::assertFailed("unreachable", __FILE__, __LINE__)
