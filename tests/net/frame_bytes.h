#pragma once

// A frame's bytes as they travel: a 4-byte little-endian length, then the payload.

#include <cstdint>
#include <string>
#include <vector>

namespace tally::net::test_support {

inline std::vector<uint8_t> frameOf(const std::string& payload) {
  std::vector<uint8_t> out;
  out.reserve(4 + payload.size());
  const auto length = static_cast<uint32_t>(payload.size());
  for (int shift = 0; shift < 32; shift += 8) out.push_back(static_cast<uint8_t>(length >> shift));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

}  // namespace tally::net::test_support
