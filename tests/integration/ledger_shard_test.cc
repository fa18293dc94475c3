// Emergency shards against a real tally-ledger process (docs/SHARDS.md): the signing key and
// `identity`, gateway enrollment, issue, report, revoke and write-off over the wire, signed with
// real Ed25519 keys (shard/identity, shard/crypto), and a kill -9 that loses none of it.

#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "shard/crypto.h"
#include "shard/identity.h"
#include "tests/integration/ledger_fixture.h"
#include "tests/support/process.h"

namespace tally::testing {
namespace {

constexpr uint64_t kShardTtlMs = 1'500;
constexpr uint64_t kWriteOffWaitMs = 10'000;

template <typename T>
Result<T> callAs(client::BlockingClient& client, const wire::RequestBody& body) {
  Result<wire::Response> response = client.call(body, kCallTimeoutMs);
  if (!response.isOk()) return response.status();
  if (auto* typed = std::get_if<T>(&response.value().body)) return std::move(*typed);
  return Status::corruption("unexpected response: " + wire::describe(response.value().body));
}

class LedgerShardTest : public LedgerServiceTest {
 protected:
  void SetUp() override {
    identity::Seed seed{};
    seed.fill(7);
    gateway_key_ = identity::keyPairFromSeed(seed);
  }

  Budget shardBudget() {
    Budget budget = makeBudget({.subject = "tenant-1", .route = "chat", .burst = 1000});
    budget.emergency = {.enabled = true, .shard_units = 100, .shard_ttl_ms = kShardTtlMs};
    return budget;
  }

  ShardIssueRequest issueRequest(const std::string& request_id) {
    ShardIssueRequest request{.request_id = request_id,
                              .gateway_name = "gw-a",
                              .gateway_id = gateway_key_.public_key,
                              .gateway_boot_epoch = 1,
                              .subject = "tenant-1",
                              .route = "chat"};
    wire::signIssueRequest(gateway_key_, &request);
    return request;
  }

  void issue(const std::string& request_id, ShardGrant* grant) {
    TALLY_ASSIGN_OR_FAIL(ShardReply reply, callAs<ShardReply>(*client_, issueRequest(request_id)));
    ASSERT_EQ(reply.code, ReplyCode::kOk) << reply.message;
    ASSERT_EQ(reply.shards.size(), 1u);
    *grant = reply.shards.front().grant;
  }

  ShardReply listShards() {
    Result<ShardReply> reply = callAs<ShardReply>(*client_, wire::ListShardsRequest{});
    EXPECT_TRUE(reply.isOk()) << reply.status().toString();
    return reply.isOk() ? reply.value() : ShardReply{};
  }

  identity::KeyPair gateway_key_;
};

TEST_F(LedgerShardTest, IssueReportRevokeWriteOffAndKill9) {
  startLedger();
  publish({shardBudget()});
  // The ledger created its signing key at first start; agents trust its public half.
  TALLY_ASSIGN_OR_FAIL(identity::KeyPair ledger_key,
                       identity::loadKeyPair(ledger_.dataDir() + "/ledger.key"));
  const wire::WireShardCrypto agent_crypto(std::nullopt, {ledger_key.public_key});

  TALLY_ASSIGN_OR_FAIL(GatewayReply enrolled,
                       callAs<GatewayReply>(*client_, wire::EnrollGatewayRequest{
                                                          .gateway_name = "gw-a",
                                                          .public_key = gateway_key_.public_key}));
  ASSERT_EQ(enrolled.code, ReplyCode::kOk) << enrolled.message;

  // Issue: 100 units carved, the grant signed by the ledger key.
  ShardGrant first;
  issue("q1", &first);
  EXPECT_TRUE(agent_crypto.verifyGrant(first));
  EXPECT_EQ(first.ledger_key_id, identity::keyIdOf(ledger_key.public_key));
  EXPECT_EQ(first.allocated_units, 100u);
  AuditReport audit;
  auditConserved(&audit);
  ASSERT_EQ(audit.shards.size(), 1u);
  EXPECT_EQ(sumBalances(audit, {"tenant-1", "chat"}).retired_for_emergency, 100u);
  // A request signed by another key is refused.
  ShardIssueRequest forged = issueRequest("q-forged");
  forged.subject = "tenant-2";
  TALLY_ASSIGN_OR_FAIL(ShardReply denied, callAs<ShardReply>(*client_, forged));
  EXPECT_TRUE(denied.permission_denied);

  // Report: 30 used, 70 proven unused come back.
  ShardReport report{.shard = first,
                     .balances = {.allocated = 100, .local_spent = 30, .local_retired = 70},
                     .receipts = {Reservation{.reservation_id = "s1",
                                              .subject = "tenant-1",
                                              .route = "chat",
                                              .reserved_units = 40,
                                              .actual_units = 30,
                                              .operation_id = "op-s1",
                                              .state = ReservationState::kSettled,
                                              .origin = first.shard_id}},
                     .gateway_boot_epoch = 1,
                     .reported_at_ms = wallNowMs()};
  wire::signReport(gateway_key_, &report);
  TALLY_ASSIGN_OR_FAIL(ShardReply reconciled, callAs<ShardReply>(*client_, report));
  ASSERT_EQ(reconciled.code, ReplyCode::kOk) << reconciled.message;
  EXPECT_EQ(reconciled.reminted_units, 70u);
  EXPECT_EQ(reconciled.spent_units, 30u);
  EXPECT_EQ(reconciled.shards.front().state, ShardState::kReconciled);
  TALLY_ASSIGN_OR_FAIL(ShardReply again, callAs<ShardReply>(*client_, report));
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.reminted_units, 0u);

  // Revoke a second shard: the fence of tenant-1/chat goes to 2.
  ShardGrant second;
  issue("q2", &second);
  TALLY_ASSIGN_OR_FAIL(
      ShardReply revoked,
      callAs<ShardReply>(*client_, wire::RevokeShardsRequest{.shard_id = second.shard_id}));
  ASSERT_EQ(revoked.code, ReplyCode::kOk) << revoked.message;
  EXPECT_EQ(revoked.shards.front().current_fence, 2u);

  // Write off a third once it expired: refused before, accepted after (bounded polling).
  ShardGrant third;
  issue("q3", &third);
  EXPECT_EQ(third.fence, 2u);
  const wire::RequestBody write_off = wire::WriteOffShardRequest{.shard_id = third.shard_id};
  TALLY_ASSIGN_OR_FAIL(ShardReply early, callAs<ShardReply>(*client_, write_off));
  EXPECT_EQ(early.code, ReplyCode::kInvalidState);
  const uint64_t deadline_ms = wallNowMs() + kWriteOffWaitMs;
  ShardReply written_off;
  do {
    waitUntilWallMs(third.expires_at_ms);
    TALLY_ASSIGN_OR_FAIL(written_off, callAs<ShardReply>(*client_, write_off));
    if (written_off.code == ReplyCode::kOk) break;
    pauseMs(50);
  } while (wallNowMs() < deadline_ms);
  ASSERT_EQ(written_off.code, ReplyCode::kOk) << written_off.message;
  EXPECT_EQ(written_off.shards.front().state, ShardState::kWrittenOff);

  const ShardReply before = listShards();
  ASSERT_EQ(before.shards.size(), 3u);
  auditConserved(&audit);
  const Balances balances = sumBalances(audit, {"tenant-1", "chat"});
  // shard-1 reconciled (30 spent, 70 reminted); shard-2 revoked and shard-3 written off keep
  // their 100 each retired.
  EXPECT_EQ(balances.retired_for_emergency, 200u);
  EXPECT_EQ(balances.spent, 30u);

  // kill -9 and restart: gateways, shards and fences survive exactly.
  ledger_.kill9();
  startLedger();
  const ShardReply after = listShards();
  EXPECT_EQ(after.shards, before.shards);
  TALLY_ASSIGN_OR_FAIL(GatewayReply gateways,
                       callAs<GatewayReply>(*client_, wire::ListGatewaysRequest{}));
  ASSERT_EQ(gateways.gateways.size(), 1u);
  EXPECT_EQ(gateways.gateways.front().public_key, gateway_key_.public_key);
  AuditReport restored;
  auditConserved(&restored);
  EXPECT_EQ(sumBalances(restored, {"tenant-1", "chat"}), balances);
  // The same key signs after the restart; a retried issue is still the same shard.
  TALLY_ASSIGN_OR_FAIL(ShardReply retried, callAs<ShardReply>(*client_, issueRequest("q1")));
  EXPECT_TRUE(retried.duplicate);
  ShardGrant fourth;
  issue("q4", &fourth);
  EXPECT_EQ(fourth.shard_id, "shard-4");
  EXPECT_TRUE(agent_crypto.verifyGrant(fourth));

  const std::string log = ledger_.log();
  for (const char* event :
       {"event=gateway_enrolled", "event=shard_issued", "event=shard_reconciled",
        "event=shard_revoked", "event=shard_written_off"}) {
    EXPECT_NE(log.find(event), std::string::npos) << event;
  }
}

TEST_F(LedgerShardTest, OverspendIsAConflictLoggedAtErrorLevel) {
  startLedger();
  publish({shardBudget()});
  TALLY_ASSIGN_OR_FAIL(GatewayReply enrolled,
                       callAs<GatewayReply>(*client_, wire::EnrollGatewayRequest{
                                                          .gateway_name = "gw-a",
                                                          .public_key = gateway_key_.public_key}));
  ASSERT_EQ(enrolled.code, ReplyCode::kOk);
  ShardGrant grant;
  issue("q1", &grant);
  ShardReport report{.shard = grant,
                     .balances = {.allocated = 100, .local_spent = 100, .overspent = 25},
                     .receipts = {Reservation{.reservation_id = "s1",
                                              .subject = "tenant-1",
                                              .route = "chat",
                                              .reserved_units = 100,
                                              .actual_units = 125,
                                              .operation_id = "op-s1",
                                              .state = ReservationState::kSettledWithDebt,
                                              .origin = grant.shard_id}},
                     .gateway_boot_epoch = 1,
                     .reported_at_ms = wallNowMs()};
  wire::signReport(gateway_key_, &report);
  TALLY_ASSIGN_OR_FAIL(ShardReply reply, callAs<ShardReply>(*client_, report));
  ASSERT_EQ(reply.code, ReplyCode::kOk) << reply.message;
  EXPECT_EQ(reply.shards.front().state, ShardState::kConflict);
  EXPECT_EQ(reply.debt_units, 25u);
  AuditReport audit;
  auditConserved(&audit);
  const Balances balances = sumBalances(audit, {"tenant-1", "chat"});
  EXPECT_EQ(balances.overdraft_issued, 25u);
  EXPECT_EQ(balances.spent, 125u);
  EXPECT_NE(ledger_.log().find("level=error component=ledger event=shard_conflict"),
            std::string::npos);
}

TEST(LedgerIdentityTest, PrintsTheSigningKeyCreatingItIfAbsent) {
  TempDir dir;
  const std::string data_dir = dir.file("data");
  std::string printed;
  for (int run = 0; run < 2; ++run) {  // creates it, then reads the same key
    Process process(binaryPath("tally-ledger"), {"--data-dir", data_dir, "identity", "--json"},
                    dir.file("identity.log"), /*ready_fd=*/false);
    ASSERT_EQ(process.waitExit(kExitTimeoutMs), 0) << process.log();
    printed = process.log();
  }
  TALLY_ASSIGN_OR_FAIL(identity::KeyPair key, identity::loadKeyPair(data_dir + "/ledger.key"));
  const std::string line = "{\"keyId\":\"" + identity::keyIdOf(key.public_key) +
                           "\",\"publicKey\":\"" + identity::encodePublicKey(key.public_key) +
                           "\"}\n";
  EXPECT_EQ(printed, line + line);
}

}  // namespace
}  // namespace tally::testing
