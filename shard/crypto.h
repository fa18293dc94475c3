#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "shard/identity.h"
#include "core/shard_types.h"

// Ed25519 signatures of the three signed shard messages (docs/SHARDS.md "Signatures"), over
//
//   PREFIX ‖ 0x00 ‖ capnp::canonicalize(the message with its `signature` cleared)
//
// with PREFIX "tally.emergencyShard.v1", "tally.shardReport.v1" or "tally.shardIssue.v1", so that
// a signature on one kind of message never verifies as another. The message is encoded from the
// core value (wire/codec.h fromCore), so signer and verifier hash the same bytes whatever the
// peer's encoder produced. A report's nested grant keeps its ledger signature: the gateway signs
// over it. Fields that limitReservation.v1 / ShardReportV1 do not carry (Reservation::
// late_receipt_applied, ShardBalances::allocated) are not covered.

namespace tally::wire {

inline constexpr std::string_view kGrantSignaturePrefix = "tally.emergencyShard.v1";
inline constexpr std::string_view kReportSignaturePrefix = "tally.shardReport.v1";
inline constexpr std::string_view kIssueSignaturePrefix = "tally.shardIssue.v1";

// The exact bytes each signature covers.
std::string grantSignedBytes(const ShardGrant& grant);
std::string issueRequestSignedBytes(const ShardIssueRequest& request);
std::string reportSignedBytes(const ShardReport& report);

// Sets grant->ledger_key_id = keyIdOf(ledger key) and grant->signature.
void signGrant(const identity::KeyPair& ledger_key, ShardGrant* grant);
// Set request->signature / report->signature only; the gateway id inside the message must be the
// signer's public key for the signature to verify.
void signIssueRequest(const identity::KeyPair& gateway_key, ShardIssueRequest* request);
void signReport(const identity::KeyPair& gateway_key, ShardReport* report);

bool verifyIssueRequestSignature(const ShardIssueRequest& request);  // under request.gateway_id
bool verifyReportSignature(const ShardReport& report);  // under report.shard.gateway_id

// core's ShardCrypto over the functions above. Owns copies of its keys; immutable after
// construction, so it may be shared across threads.
//  * ledger_key: the ledger's own key pair, for signGrant (the ledger); absent in an agent, where
//    signGrant is a bug. Its public key is trusted too.
//  * trusted_ledger_keys: public keys whose grants verifyGrant accepts, looked up by the grant's
//    ledger_key_id.
class WireShardCrypto : public ShardCrypto {
 public:
  WireShardCrypto(std::optional<identity::KeyPair> ledger_key,
                  const std::vector<PublicKey>& trusted_ledger_keys);

  void signGrant(ShardGrant* grant) const override;
  bool verifyGrant(const ShardGrant& grant) const override;
  bool verifyIssueRequest(const ShardIssueRequest& request) const override;
  bool verifyReport(const ShardReport& report) const override;

 private:
  std::optional<identity::KeyPair> ledger_key_;
  std::map<std::string, PublicKey> trusted_by_key_id_;
};

}  // namespace tally::wire
