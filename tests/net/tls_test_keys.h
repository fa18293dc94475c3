#pragma once

// Fixed Ed25519 identities for the TLS tests: the ledger's, an admitted gateway's, and a key
// nobody admits or pins.

#include <cstdint>

#include "shard/identity.h"

namespace tally::net::test_support {

inline identity::KeyPair keyFrom(uint8_t fill) {
  identity::Seed seed{};
  seed.fill(fill);
  return identity::keyPairFromSeed(seed);
}

inline const identity::KeyPair kLedger = keyFrom(11);
inline const identity::KeyPair kGateway = keyFrom(22);
inline const identity::KeyPair kStranger = keyFrom(33);

}  // namespace tally::net::test_support
