#pragma once

#include <cstdint>

// The simulator's only source of randomness: xoshiro256** seeded through splitmix64
// (Blackman & Vigna). One 64-bit seed determines every choice of a run; nothing in the
// simulator reads std::random_device, a clock or the environment.

namespace tally::sim {

class Rng {
 public:
  explicit Rng(uint64_t seed) {
    uint64_t x = seed;
    for (uint64_t& word : s_) word = splitmix64(&x);
  }

  uint64_t next() {
    const uint64_t result = rotl(s_[1] * 5, 7) * 9;
    const uint64_t t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }

  // Uniform in [0, n); 0 when n is 0. The modulo bias is below 2^-40 for the n we use.
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
  // Uniform in [lo, hi].
  uint64_t range(uint64_t lo, uint64_t hi) { return lo + below(hi - lo + 1); }
  // True with probability permille / 1000.
  bool chance(uint64_t permille) { return below(1000) < permille; }

  // A fresh generator for one component, so that adding a draw in one place does not shift
  // every other component's choices.
  Rng fork() { return Rng(next()); }

  static uint64_t splitmix64(uint64_t* x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

  uint64_t s_[4] = {};
};

}  // namespace tally::sim
