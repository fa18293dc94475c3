#pragma once

#include <cstdint>
#include <optional>

// Overflow-checked unsigned arithmetic for balances. Every amount is a non-negative 64-bit
// integer; a result that does not fit is reported, never wrapped.

namespace tally {

[[nodiscard]] inline std::optional<uint64_t> checkedAdd(uint64_t a, uint64_t b) {
  uint64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return std::nullopt;
  return sum;
}

[[nodiscard]] inline std::optional<uint64_t> checkedSub(uint64_t a, uint64_t b) {
  if (b > a) return std::nullopt;
  return a - b;
}

[[nodiscard]] inline std::optional<uint64_t> checkedMul(uint64_t a, uint64_t b) {
  uint64_t product = 0;
  if (__builtin_mul_overflow(a, b, &product)) return std::nullopt;
  return product;
}

// a + b, saturating at UINT64_MAX. For deadlines only (time never overflows in practice, but a
// hostile TTL must not wrap a deadline into the past).
[[nodiscard]] inline uint64_t saturatingAdd(uint64_t a, uint64_t b) {
  uint64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum)) return UINT64_MAX;
  return sum;
}

}  // namespace tally
