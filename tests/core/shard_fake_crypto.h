#pragma once

#include <cstdint>
#include <string>

#include "core/shard_types.h"

// A stand-in for shard/crypto.h in core tests: a "signature" is a 64-bit FNV hash of a
// text form of every signed field (and of a per-signer secret: the ledger's or the gateway's
// public key), repeated over 64 bytes. Tampering with any field or signing with another
// gateway's key makes verification fail, which is all the registry relies on.

namespace tally::testing {

inline uint64_t fnv(const std::string& text) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  return h;
}

inline Signature fakeSignature(const std::string& text) {
  Signature signature{};
  const uint64_t h = fnv(text);
  for (size_t i = 0; i < signature.size(); ++i) {
    signature[i] = static_cast<uint8_t>(h >> (8 * (i % 8)));
  }
  return signature;
}

inline std::string keyText(const PublicKey& key) { return std::string(key.begin(), key.end()); }

inline std::string grantText(const ShardGrant& g) {
  return "grant|" + g.shard_id + "|" + g.subject + "|" + g.route + "|" +
         std::to_string(g.policy_generation) + "|" + std::to_string(g.accounting_epoch_ms) + "|" +
         keyText(g.gateway_id) + "|" + g.gateway_name + "|" + std::to_string(g.gateway_boot_epoch) +
         "|" + std::to_string(g.fence) + "|" + std::to_string(g.allocated_units) + "|" +
         std::to_string(g.issued_at_ms) + "|" + std::to_string(g.expires_at_ms) + "|" +
         g.ledger_key_id;
}

inline std::string issueText(const ShardIssueRequest& r) {
  return "issue|" + r.request_id + "|" + r.gateway_name + "|" + keyText(r.gateway_id) + "|" +
         std::to_string(r.gateway_boot_epoch) + "|" + r.subject + "|" + r.route;
}

inline std::string reportText(const ShardReport& r) {
  const ShardBalances& b = r.balances;
  std::string text = "report|" + grantText(r.shard) + "|" + keyText(r.shard.gateway_id) + "|" +
                     std::to_string(b.allocated) + "," + std::to_string(b.local_available) + "," +
                     std::to_string(b.local_reserved) + "," + std::to_string(b.local_spent) + "," +
                     std::to_string(b.local_retired) + "," + std::to_string(b.overspent) + "|" +
                     std::to_string(r.gateway_boot_epoch) + "|" + std::to_string(r.reported_at_ms);
  for (const Reservation& receipt : r.receipts) {
    text += "|" + receipt.reservation_id + ":" + reservationStateName(receipt.state) + ":" +
            std::to_string(receipt.reserved_units) + ":" + std::to_string(receipt.actual_units) +
            ":" + receipt.origin + ":" + receipt.subject + ":" + receipt.route;
  }
  return text;
}

// The gateway's side: signs with its key (the key is part of the hashed text).
inline void signIssue(ShardIssueRequest* request) {
  request->signature = fakeSignature(issueText(*request) + "|key:" + keyText(request->gateway_id));
}
inline void signReport(ShardReport* report) {
  report->signature =
      fakeSignature(reportText(*report) + "|key:" + keyText(report->shard.gateway_id));
}

class FakeShardCrypto : public ShardCrypto {
 public:
  void signGrant(ShardGrant* grant) const override {
    grant->ledger_key_id = "fake-ledger-key";
    grant->signature = fakeSignature(grantText(*grant) + "|ledger");
  }
  bool verifyGrant(const ShardGrant& grant) const override {
    return grant.signature == fakeSignature(grantText(grant) + "|ledger");
  }
  bool verifyIssueRequest(const ShardIssueRequest& request) const override {
    return request.signature ==
           fakeSignature(issueText(request) + "|key:" + keyText(request.gateway_id));
  }
  bool verifyReport(const ShardReport& report) const override {
    return report.signature ==
           fakeSignature(reportText(report) + "|key:" + keyText(report.shard.gateway_id));
  }
};

}  // namespace tally::testing
