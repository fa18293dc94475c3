#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "core/shard_types.h"
#include "core/status.h"

// Ed25519 identities of ledgers and gateways (docs/SHARDS.md "Identities and keys"), libsodium.
//
// A key file holds the 64-byte libsodium secret key (seed ‖ public key) as one line of standard
// padded base64, mode 0600, created with O_CREAT|O_EXCL. A key file that group or others may
// access is refused (like ssh), and so is one that does not parse or whose public half does not
// match its seed. Public keys travel as standard base64 of their 32 bytes (44 characters); a key
// id is the first 8 bytes of sha256(public key) as 16 lowercase hex characters.
//
// Every function here initializes libsodium (once per process) before using it.

namespace tally::identity {

using Seed = std::array<uint8_t, 32>;
using SecretKey = std::array<uint8_t, 64>;  // seed ‖ public key

struct KeyPair {
  PublicKey public_key{};
  SecretKey secret_key{};

  bool operator==(const KeyPair&) const = default;
};

// sodium_init(), once per process; aborts if libsodium cannot initialize.
void initSodium();

// Deterministic: the same seed always gives the same pair (tests pin keys with it).
KeyPair keyPairFromSeed(const Seed& seed);
KeyPair generateKeyPair();

// Reads an existing key file; kNotFound if absent, kInvalidArgument if too open or corrupt.
Result<KeyPair> loadKeyPair(const std::string& path);
// Reads the key file, or creates it (0600, O_EXCL) with a fresh key pair if absent.
Result<KeyPair> loadOrCreateKeyPair(const std::string& path);

std::string encodePublicKey(const PublicKey& key);
// Exactly 44 characters of standard padded base64 naming 32 bytes; anything else is refused.
Result<PublicKey> decodePublicKey(std::string_view base64);
std::string keyIdOf(const PublicKey& key);

// Ed25519 (crypto_sign_detached). Deterministic.
Signature signDetached(const KeyPair& key_pair, std::string_view message);
bool verifyDetached(const PublicKey& key, const Signature& signature, std::string_view message);

// --- Gateway names: DIR/gateway.name, one line ---------------------------------------------------

std::string gatewayNamePath(const std::string& dir);
// 1 to limits::kGatewayNameBytesMax bytes of [A-Za-z0-9._-]; kInvalidArgument says why not.
Status validateGatewayName(std::string_view name);
// Reads DIR/gateway.name, or creates it from `default_name` (validated first) if absent.
Result<std::string> loadOrCreateGatewayName(const std::string& dir,
                                            const std::string& default_name);

}  // namespace tally::identity
