#pragma once

#include <cstdint>
#include <string>

#include "core/shard_types.h"

// A ShardCrypto for tests (the agent's side; tests/core/shard_fake_crypto.h is the ledger's,
// with another class name: both link into tally_core_tests): the "signature" is a 64-bit FNV-1a
// checksum of every signed field and a per-instance key, so that changing any field (or signing
// with another key) makes verification fail, like Ed25519 would. Not cryptography.

namespace tally::testing {

class KeyedFakeShardCrypto : public ShardCrypto {
 public:
  explicit KeyedFakeShardCrypto(uint64_t key = 0x5eed, std::string key_id = "fake-key")
      : key_(key), key_id_(std::move(key_id)) {}

  void signGrant(ShardGrant* grant) const override {
    grant->ledger_key_id = key_id_;
    grant->signature = signatureOf(*grant);
  }
  bool verifyGrant(const ShardGrant& grant) const override {
    return grant.ledger_key_id == key_id_ && grant.signature == signatureOf(grant);
  }
  bool verifyIssueRequest(const ShardIssueRequest&) const override { return true; }
  bool verifyReport(const ShardReport&) const override { return true; }

 private:
  Signature signatureOf(const ShardGrant& grant) const {
    uint64_t h = 1469598103934665603ull ^ key_;
    auto mix = [&h](const void* data, size_t size) {
      const auto* bytes = static_cast<const uint8_t*>(data);
      for (size_t i = 0; i < size; ++i) {
        h ^= bytes[i];
        h *= 1099511628211ull;
      }
      h ^= size;
      h *= 1099511628211ull;
    };
    auto text = [&mix](const std::string& s) { mix(s.data(), s.size()); };
    auto number = [&mix](uint64_t v) { mix(&v, sizeof v); };
    text(grant.shard_id);
    text(grant.subject);
    text(grant.route);
    number(grant.policy_generation);
    number(grant.accounting_epoch_ms);
    mix(grant.gateway_id.data(), grant.gateway_id.size());
    text(grant.gateway_name);
    number(grant.gateway_boot_epoch);
    number(grant.fence);
    number(grant.allocated_units);
    number(grant.issued_at_ms);
    number(grant.expires_at_ms);
    text(grant.ledger_key_id);
    Signature signature{};
    for (size_t i = 0; i < signature.size(); ++i) {
      signature[i] = static_cast<uint8_t>(h >> ((i % 8) * 8));
    }
    return signature;
  }

  uint64_t key_;
  std::string key_id_;
};

}  // namespace tally::testing
