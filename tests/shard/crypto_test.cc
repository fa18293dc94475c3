#include "shard/crypto.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tests/wire/shard_samples.h"
#include "wire/codec.h"
#include "wire/digest.h"
#include "wire/frame.h"

namespace tally::wire {
namespace {

using test::sampleGrant;
using test::sampleIssueRequest;
using test::sampleReport;

identity::KeyPair keyFromByte(uint8_t byte) {
  identity::Seed seed{};
  seed.fill(byte);
  return identity::keyPairFromSeed(seed);
}

const identity::KeyPair& ledgerKey() {
  static const identity::KeyPair key = keyFromByte(0x11);
  return key;
}

const identity::KeyPair& gatewayKey() {
  static const identity::KeyPair key = keyFromByte(0x22);
  return key;
}

WireShardCrypto ledgerCrypto() { return WireShardCrypto(ledgerKey(), {}); }
WireShardCrypto agentCrypto() { return WireShardCrypto(std::nullopt, {ledgerKey().public_key}); }

ShardGrant signedGrant() {
  ShardGrant grant = sampleGrant();
  grant.gateway_id = gatewayKey().public_key;
  ledgerCrypto().signGrant(&grant);
  return grant;
}

ShardIssueRequest signedIssueRequest() {
  ShardIssueRequest request = sampleIssueRequest();
  request.gateway_id = gatewayKey().public_key;
  signIssueRequest(gatewayKey(), &request);
  return request;
}

ShardReport signedReport() {
  ShardReport report = sampleReport();
  report.shard = signedGrant();
  signReport(gatewayKey(), &report);
  return report;
}

std::string hexOf(const Signature& signature) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string hex;
  for (uint8_t byte : signature) {
    hex.push_back(kDigits[byte >> 4]);
    hex.push_back(kDigits[byte & 0x0f]);
  }
  return hex;
}

template <typename T>
using Mutation = std::pair<const char*, std::function<void(T&)>>;

// Every field but the signature, each changed alone.
std::vector<Mutation<ShardGrant>> grantMutations() {
  return {
      {"shard_id", [](ShardGrant& g) { g.shard_id += "x"; }},
      {"subject", [](ShardGrant& g) { g.subject += "x"; }},
      {"route", [](ShardGrant& g) { g.route += "x"; }},
      {"policy_generation", [](ShardGrant& g) { ++g.policy_generation; }},
      {"accounting_epoch_ms", [](ShardGrant& g) { ++g.accounting_epoch_ms; }},
      {"gateway_id", [](ShardGrant& g) { g.gateway_id[31] ^= 1; }},
      {"gateway_name", [](ShardGrant& g) { g.gateway_name += "x"; }},
      {"gateway_boot_epoch", [](ShardGrant& g) { ++g.gateway_boot_epoch; }},
      {"fence", [](ShardGrant& g) { ++g.fence; }},
      {"allocated_units", [](ShardGrant& g) { ++g.allocated_units; }},
      {"issued_at_ms", [](ShardGrant& g) { ++g.issued_at_ms; }},
      {"expires_at_ms", [](ShardGrant& g) { ++g.expires_at_ms; }},
      {"ledger_key_id", [](ShardGrant& g) { g.ledger_key_id[0] ^= 1; }},
      {"signature", [](ShardGrant& g) { g.signature[0] ^= 1; }},
  };
}

std::vector<Mutation<Reservation>> receiptMutations() {
  return {
      {"reservation_id", [](Reservation& r) { r.reservation_id += "x"; }},
      {"request_digest", [](Reservation& r) { r.request_digest[0] ^= 1; }},
      {"subject", [](Reservation& r) { r.subject += "x"; }},
      {"route", [](Reservation& r) { r.route += "x"; }},
      {"policy_generation", [](Reservation& r) { ++r.policy_generation; }},
      {"accounting_epoch_ms", [](Reservation& r) { ++r.accounting_epoch_ms; }},
      {"reserved_units", [](Reservation& r) { ++r.reserved_units; }},
      {"actual_units", [](Reservation& r) { ++r.actual_units; }},
      {"refunded_units", [](Reservation& r) { ++r.refunded_units; }},
      {"debt_units", [](Reservation& r) { ++r.debt_units; }},
      {"operation_id", [](Reservation& r) { r.operation_id += "x"; }},
      {"created_at_ms", [](Reservation& r) { ++r.created_at_ms; }},
      {"expires_at_ms", [](Reservation& r) { ++r.expires_at_ms; }},
      {"started_at_ms", [](Reservation& r) { ++r.started_at_ms; }},
      {"closed_at_ms", [](Reservation& r) { ++r.closed_at_ms; }},
      {"state", [](Reservation& r) { r.state = ReservationState::kUsageUnknown; }},
      {"origin", [](Reservation& r) { r.origin += "x"; }},
      {"closed_by_hard_limit", [](Reservation& r) { r.closed_by_hard_limit ^= true; }},
      {"overdraft_breach", [](Reservation& r) { r.overdraft_breach ^= true; }},
      {"limiting_dimension",
       [](Reservation& r) { r.limiting_dimension = LimitingDimension::kDebt; }},
      {"retry_after_ms", [](Reservation& r) { ++r.retry_after_ms; }},
  };
}

TEST(ShardCrypto, SignedMessagesVerify) {
  EXPECT_TRUE(agentCrypto().verifyGrant(signedGrant()));
  EXPECT_TRUE(ledgerCrypto().verifyGrant(signedGrant()));  // its own key is trusted
  EXPECT_EQ(signedGrant().ledger_key_id, identity::keyIdOf(ledgerKey().public_key));
  EXPECT_TRUE(ledgerCrypto().verifyIssueRequest(signedIssueRequest()));
  EXPECT_TRUE(ledgerCrypto().verifyReport(signedReport()));
  EXPECT_TRUE(agentCrypto().verifyReport(signedReport()));
}

TEST(ShardCrypto, ChangingAnyGrantFieldBreaksTheGrantSignature) {
  for (const auto& [field, mutate] : grantMutations()) {
    ShardGrant grant = signedGrant();
    mutate(grant);
    EXPECT_FALSE(agentCrypto().verifyGrant(grant)) << field;
  }
}

TEST(ShardCrypto, ChangingAnyIssueRequestFieldBreaksItsSignature) {
  const std::vector<Mutation<ShardIssueRequest>> mutations = {
      {"request_id", [](ShardIssueRequest& r) { r.request_id += "x"; }},
      {"gateway_name", [](ShardIssueRequest& r) { r.gateway_name += "x"; }},
      {"gateway_id", [](ShardIssueRequest& r) { r.gateway_id[0] ^= 1; }},
      {"gateway_boot_epoch", [](ShardIssueRequest& r) { ++r.gateway_boot_epoch; }},
      {"subject", [](ShardIssueRequest& r) { r.subject += "x"; }},
      {"route", [](ShardIssueRequest& r) { r.route += "x"; }},
      {"signature", [](ShardIssueRequest& r) { r.signature[63] ^= 1; }},
  };
  for (const auto& [field, mutate] : mutations) {
    ShardIssueRequest request = signedIssueRequest();
    mutate(request);
    EXPECT_FALSE(ledgerCrypto().verifyIssueRequest(request)) << field;
  }
}

TEST(ShardCrypto, ChangingAnyReportFieldBreaksItsSignature) {
  // balances.allocated is not on the wire: it is the grant's (signed) allocated units.
  std::vector<Mutation<ShardReport>> mutations = {
      {"local_available", [](ShardReport& r) { ++r.balances.local_available; }},
      {"local_reserved", [](ShardReport& r) { ++r.balances.local_reserved; }},
      {"local_spent", [](ShardReport& r) { ++r.balances.local_spent; }},
      {"local_retired", [](ShardReport& r) { ++r.balances.local_retired; }},
      {"overspent", [](ShardReport& r) { ++r.balances.overspent; }},
      {"gateway_boot_epoch", [](ShardReport& r) { ++r.gateway_boot_epoch; }},
      {"reported_at_ms", [](ShardReport& r) { ++r.reported_at_ms; }},
      {"signature", [](ShardReport& r) { r.signature[10] ^= 1; }},
      {"receipts: one dropped", [](ShardReport& r) { r.receipts.pop_back(); }},
      {"receipts: one added", [](ShardReport& r) { r.receipts.push_back(r.receipts[0]); }},
      {"receipts: order", [](ShardReport& r) { std::swap(r.receipts[0], r.receipts[1]); }},
  };
  for (const auto& [field, mutate] : receiptMutations()) {
    mutations.emplace_back(field, [m = mutate](ShardReport& r) { m(r.receipts[1]); });
  }
  for (const auto& [field, mutate] : grantMutations()) {
    mutations.emplace_back(field, [m = mutate](ShardReport& r) { m(r.shard); });
  }
  ASSERT_EQ(mutations.size(), 11u + 21u + 14u);
  for (const auto& [field, mutate] : mutations) {
    ShardReport report = signedReport();
    mutate(report);
    EXPECT_FALSE(ledgerCrypto().verifyReport(report)) << field;
  }
}

TEST(ShardCrypto, WrongKeysDoNotVerify) {
  // A grant signed by a ledger key the agent does not trust, even under a trusted key's id.
  const identity::KeyPair rogue = keyFromByte(0x33);
  ShardGrant grant = sampleGrant();
  signGrant(rogue, &grant);
  EXPECT_FALSE(agentCrypto().verifyGrant(grant));
  grant.ledger_key_id = identity::keyIdOf(ledgerKey().public_key);
  EXPECT_FALSE(agentCrypto().verifyGrant(grant));
  // Trusting the rogue key makes it verify: the lookup is by key id.
  EXPECT_TRUE(WireShardCrypto(std::nullopt, {rogue.public_key}).verifyGrant([&] {
    ShardGrant g = sampleGrant();
    signGrant(rogue, &g);
    return g;
  }()));
  // No trusted keys at all.
  EXPECT_FALSE(WireShardCrypto(std::nullopt, {}).verifyGrant(signedGrant()));

  // An issue request or report signed by another gateway's key.
  ShardIssueRequest request = signedIssueRequest();
  signIssueRequest(rogue, &request);
  EXPECT_FALSE(ledgerCrypto().verifyIssueRequest(request));
  ShardReport report = signedReport();
  signReport(rogue, &report);
  EXPECT_FALSE(ledgerCrypto().verifyReport(report));
}

// Signs `bytes` with their domain prefix swapped for `prefix`.
Signature signAs(const identity::KeyPair& key, std::string bytes, std::string_view from,
                 std::string_view to) {
  EXPECT_EQ(bytes.substr(0, from.size() + 1), std::string(from) + '\0');
  bytes.replace(0, from.size(), to);
  return identity::signDetached(key, bytes);
}

TEST(ShardCrypto, PrefixSeparatesTheThreeKinds) {
  ShardIssueRequest request = signedIssueRequest();
  request.signature = signAs(gatewayKey(), issueRequestSignedBytes(request), kIssueSignaturePrefix,
                             kIssueSignaturePrefix);
  EXPECT_TRUE(ledgerCrypto().verifyIssueRequest(request));  // the control
  for (std::string_view other : {kGrantSignaturePrefix, kReportSignaturePrefix}) {
    request.signature =
        signAs(gatewayKey(), issueRequestSignedBytes(request), kIssueSignaturePrefix, other);
    EXPECT_FALSE(ledgerCrypto().verifyIssueRequest(request)) << other;
  }
  ShardReport report = signedReport();
  for (std::string_view other : {kGrantSignaturePrefix, kIssueSignaturePrefix}) {
    report.signature =
        signAs(gatewayKey(), reportSignedBytes(report), kReportSignaturePrefix, other);
    EXPECT_FALSE(ledgerCrypto().verifyReport(report)) << other;
  }
  ShardGrant grant = signedGrant();
  for (std::string_view other : {kReportSignaturePrefix, kIssueSignaturePrefix}) {
    grant.signature = signAs(ledgerKey(), grantSignedBytes(grant), kGrantSignaturePrefix, other);
    EXPECT_FALSE(agentCrypto().verifyGrant(grant)) << other;
  }
}

TEST(ShardCrypto, SignatureSurvivesTheWire) {
  // What the agent decodes from a reply verifies, and what the ledger decodes from a request.
  Result<std::vector<uint8_t>> bytes =
      encodeRequestFrame({.request_id = 1, .body = signedReport()});
  ASSERT_TRUE(bytes.isOk());
  DecodedRequest decoded =
      decodeRequest(std::span<const uint8_t>(bytes.value()).subspan(kFrameHeaderBytes));
  ASSERT_TRUE(decoded.body.isOk()) << decoded.body.status().toString();
  const ShardReport& report = std::get<ShardReport>(decoded.body.value());
  EXPECT_TRUE(ledgerCrypto().verifyReport(report));
  EXPECT_TRUE(agentCrypto().verifyGrant(report.shard));
}

// Ed25519 is deterministic: these pin the canonical encoding and the prefix. If this test fails,
// every signature already issued stops verifying; change the schema or codec, not the constants.
// The digest was reproduced independently: `capnp convert text:canonical` of this grant (without
// its signature) behind "tally.emergencyShard.v1\0", hashed with Python's hashlib.
TEST(ShardCrypto, PinnedGrantSignature) {
  ShardGrant grant = sampleGrant();
  grant.gateway_id = gatewayKey().public_key;
  signGrant(ledgerKey(), &grant);
  EXPECT_EQ(grant.ledger_key_id, identity::keyIdOf(ledgerKey().public_key));
  EXPECT_EQ(digestHex(sha256(grantSignedBytes(grant))),
            "b06d89dffa7d58fbc0f16ee76d4ea365cbe03417021526f39b34753f391568d5");
  EXPECT_EQ(hexOf(grant.signature),
            "1b41943e276b11b8bbba93a4c5545b30717f08e73a0b45540e6823e8f1f9d685"
            "84c6e5e9e996da1540a6f1448379f9907cacb7a6b581c6c422c4a103c37fa403");
  EXPECT_EQ(grant.ledger_key_id, "10ba682c8ad13513");
}

}  // namespace
}  // namespace tally::wire
