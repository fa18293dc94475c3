// The ledger's shard registry (docs/SHARDS.md): one test per rule, with balances written out.

#include "core/shard_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/ledger.h"
#include "core/limits.h"
#include "tests/core/shard_fake_crypto.h"

namespace tally {

static void PrintTo(const Balances& b, std::ostream* os) {
  *os << "{opening " << b.opening << ", minted " << b.minted << ", overdraftIssued "
      << b.overdraft_issued << ", available " << b.available << ", reserved " << b.reserved
      << ", spent " << b.spent << ", retired " << b.retired_for_emergency << ", overdraftRepaid "
      << b.overdraft_repaid << ", transferredOut " << b.transferred_out << "}";
}
static void PrintTo(ReplyCode code, std::ostream* os) { *os << replyCodeName(code); }
static void PrintTo(ShardState state, std::ostream* os) { *os << shardStateName(state); }

namespace {

using testing::FakeShardCrypto;
using ::testing::HasSubstr;
using testing::signIssue;
using testing::signReport;
using RS = ReservationState;

constexpr uint64_t kT0 = 1'700'000'000'000;
constexpr uint64_t kTtlMs = 60'000;
const std::string kSubject = "tenant-7";
const std::string kRoute = "/v1/chat";
const std::string kGateway = "gw-a";

PublicKey keyOf(uint8_t seed) {
  PublicKey key{};
  key.fill(seed);
  return key;
}

// burst 1000, no refill (balances stay put as time passes), shards of 100 for 60 s.
Budget shardBudget(Units refill_per_second = 0, bool emergency = true) {
  return Budget{
      .subject_pattern = kSubject,
      .route = kRoute,
      .unit = "tokens",
      .refill_per_second = refill_per_second,
      .burst = 1000,
      .max_single_reservation = 1000,
      .hold_ttl_ms = 30'000,
      .hard_execution_limit_ms = 60'000,
      .max_overdraft = 500,
      .emergency = {.enabled = emergency, .shard_units = 100, .shard_ttl_ms = kTtlMs},
  };
}

Reservation receipt(const std::string& id, const std::string& shard_id, RS state,
                    Units reserved_units, Units actual_units = 0) {
  return Reservation{.reservation_id = id,
                     .subject = kSubject,
                     .route = kRoute,
                     .reserved_units = reserved_units,
                     .actual_units = actual_units,
                     .operation_id = "op-" + id,
                     .state = state,
                     .origin = shard_id};
}

class ShardRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override { start(shardBudget()); }

  void start(const Budget& budget) {
    ledger_.setShardCrypto(&crypto_);
    ASSERT_EQ(ledger_.publishPolicy(Policy{.budgets = {budget}}, kT0).code, ReplyCode::kOk);
    ASSERT_EQ(ledger_.enrollGateway(kGateway, keyOf(1), kT0).code, ReplyCode::kOk);
  }

  ShardIssueRequest request(const std::string& request_id, const std::string& gateway = kGateway,
                            uint8_t key = 1, uint64_t boot_epoch = 1) {
    ShardIssueRequest r{.request_id = request_id,
                        .gateway_name = gateway,
                        .gateway_id = keyOf(key),
                        .gateway_boot_epoch = boot_epoch,
                        .subject = kSubject,
                        .route = kRoute};
    signIssue(&r);
    return r;
  }

  ShardGrant issued(const std::string& request_id = "req-1", uint64_t now_ms = kT0) {
    const ShardReply reply = ledger_.issueShard(request(request_id), now_ms);
    EXPECT_EQ(reply.code, ReplyCode::kOk) << reply.message;
    EXPECT_EQ(reply.shards.size(), 1u);
    return reply.shards.empty() ? ShardGrant{} : reply.shards.front().grant;
  }

  static ShardReport report(const ShardGrant& grant, ShardBalances balances,
                            std::vector<Reservation> receipts, uint64_t boot_epoch = 1,
                            uint64_t reported_at_ms = kT0) {
    balances.allocated = grant.allocated_units;
    ShardReport r{.shard = grant,
                  .balances = balances,
                  .receipts = std::move(receipts),
                  .gateway_boot_epoch = boot_epoch,
                  .reported_at_ms = reported_at_ms};
    signReport(&r);
    return r;
  }

  Balances account(Generation generation = 1) const {
    const AccountEntry* entry = ledger_.accounts().find(AccountKey{kSubject, kRoute, generation});
    return entry == nullptr ? Balances{} : entry->account.balances();
  }

  ShardLedgerView view(const std::string& shard_id) const {
    const ShardReply reply = ledger_.shardStatus("", {shard_id});
    EXPECT_EQ(reply.shards.size(), 1u);
    return reply.shards.empty() ? ShardLedgerView{} : reply.shards.front();
  }

  void expectAuditPasses(uint64_t now_ms = kT0) const {
    const AuditReport audit = ledger_.audit(now_ms);
    EXPECT_TRUE(audit.conserved) << (audit.violations.empty() ? "" : audit.violations.front());
  }

  FakeShardCrypto crypto_;
  Ledger ledger_;
};

// ---- issue ------------------------------------------------------------------------------------

TEST_F(ShardRegistryTest, IssueCarvesAndSignsAGrant) {
  const ShardReply reply = ledger_.issueShard(request("req-1"), kT0);
  ASSERT_EQ(reply.code, ReplyCode::kOk) << reply.message;
  ASSERT_EQ(reply.shards.size(), 1u);
  const ShardLedgerView& v = reply.shards.front();
  EXPECT_EQ(v.grant.shard_id, "shard-1");
  EXPECT_EQ(v.grant.subject, kSubject);
  EXPECT_EQ(v.grant.policy_generation, 1u);
  EXPECT_EQ(v.grant.gateway_name, kGateway);
  EXPECT_EQ(v.grant.gateway_id, keyOf(1));
  EXPECT_EQ(v.grant.gateway_boot_epoch, 1u);
  EXPECT_EQ(v.grant.fence, 1u);
  EXPECT_EQ(v.grant.allocated_units, 100u);
  EXPECT_EQ(v.grant.issued_at_ms, kT0);
  EXPECT_EQ(v.grant.expires_at_ms, kT0 + kTtlMs);
  EXPECT_EQ(v.grant.accounting_epoch_ms, accountingEpochStartMs(kT0, EpochPeriod::kHour));
  EXPECT_TRUE(crypto_.verifyGrant(v.grant));
  EXPECT_EQ(v.state, ShardState::kIssued);
  EXPECT_EQ(v.retired_units, 100u);
  EXPECT_EQ(v.current_fence, 1u);
  // available 1000 → 900, retiredForEmergency 0 → 100.
  EXPECT_EQ(account(), (Balances{.opening = 1000, .available = 900, .retired_for_emergency = 100}));
  expectAuditPasses();
  EXPECT_EQ(issued("req-2").shard_id, "shard-2");
  EXPECT_EQ(account().available, 800u);
  EXPECT_EQ(account().retired_for_emergency, 200u);
}

TEST_F(ShardRegistryTest, IssueIsIdempotentPerRequestId) {
  const ShardGrant first = issued("req-1");
  const ShardReply again = ledger_.issueShard(request("req-1"), kT0 + 5);
  ASSERT_EQ(again.code, ReplyCode::kOk);
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.shards.front().grant, first);
  EXPECT_EQ(account(), (Balances{.opening = 1000, .available = 900, .retired_for_emergency = 100}));
  EXPECT_EQ(ledger_.shards().shardCount(), 1u);
}

TEST_F(ShardRegistryTest, ConflictingIssueUnderTheSameRequestIdIsRefused) {
  (void)issued("req-1");
  ShardIssueRequest other = request("req-1");
  other.gateway_boot_epoch = 2;
  signIssue(&other);
  const ShardReply reply = ledger_.issueShard(other, kT0);
  EXPECT_EQ(reply.code, ReplyCode::kIdempotencyConflict);
  EXPECT_EQ(account().available, 900u);
  EXPECT_EQ(ledger_.shards().shardCount(), 1u);
}

TEST(ShardRegistryPolicyTest, EmergencyOffOrNoBudgetIssuesNothing) {
  FakeShardCrypto crypto;
  Ledger ledger;
  ledger.setShardCrypto(&crypto);
  ASSERT_EQ(ledger.enrollGateway(kGateway, keyOf(1), kT0).code, ReplyCode::kOk);
  ShardIssueRequest r{.request_id = "req-1",
                      .gateway_name = kGateway,
                      .gateway_id = keyOf(1),
                      .gateway_boot_epoch = 1,
                      .subject = kSubject,
                      .route = kRoute};
  signIssue(&r);
  ShardReply reply = ledger.issueShard(r, kT0);  // no policy at all
  EXPECT_EQ(reply.code, ReplyCode::kRejected);
  EXPECT_EQ(reply.limiting_dimension, LimitingDimension::kNoBudget);
  ASSERT_EQ(ledger.publishPolicy(Policy{.budgets = {shardBudget(0, false)}}, kT0).code,
            ReplyCode::kOk);
  reply = ledger.issueShard(r, kT0);
  EXPECT_EQ(reply.code, ReplyCode::kInvalidState);
  EXPECT_THAT(reply.message, HasSubstr("emergency mode is off"));
  EXPECT_EQ(ledger.accounts().accountCount(), 0u);
  EXPECT_EQ(ledger.shards().shardCount(), 0u);
}

TEST_F(ShardRegistryTest, DebtOnTheSubjectRouteRefusesIssue) {
  // Reserve 600, settle at 1200: 400 from available, 200 of debt.
  const ReserveRequest reserve{
      .reservation_id = "c1", .subject = kSubject, .route = kRoute, .units = 600};
  ASSERT_EQ(ledger_.reserve(reserve, kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger_.start({"c1", "op"}, kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger_.settle({"c1", "op", 1200}, kT0).code, ReplyCode::kOk);
  const Balances before = account();
  ASSERT_EQ(before.overdraft_issued, 200u);
  const ShardReply reply = ledger_.issueShard(request("req-1"), kT0);
  EXPECT_EQ(reply.code, ReplyCode::kRejected);
  EXPECT_EQ(reply.limiting_dimension, LimitingDimension::kDebt);
  EXPECT_EQ(account(), before);
  EXPECT_EQ(ledger_.shards().shardCount(), 0u);
}

TEST_F(ShardRegistryTest, DrainingGenerationIssuesNothing) {
  (void)issued("req-1");
  // Generation 2 drops the budget: generation 1 drains, and nothing is carved from it.
  Budget other = shardBudget();
  other.subject_pattern = "tenant-8";
  ASSERT_EQ(ledger_.publishPolicy(Policy{.budgets = {other}}, kT0).code, ReplyCode::kOk);
  const Balances before = account(1);
  const ShardReply reply = ledger_.issueShard(request("req-2"), kT0);
  EXPECT_EQ(reply.code, ReplyCode::kRejected);
  EXPECT_EQ(reply.limiting_dimension, LimitingDimension::kNoBudget);
  EXPECT_EQ(account(1), before);
  EXPECT_EQ(ledger_.accounts().generationState(1), GenerationState::kDraining);
}

TEST_F(ShardRegistryTest, AtMostFourLiveShardsPerGatewayAndAccount) {
  for (int i = 1; i <= 4; ++i) (void)issued("req-" + std::to_string(i));
  const ShardReply fifth = ledger_.issueShard(request("req-5"), kT0);
  EXPECT_EQ(fifth.code, ReplyCode::kResourceExhausted);
  EXPECT_EQ(account(), (Balances{.opening = 1000, .available = 600, .retired_for_emergency = 400}));
  // Another gateway still gets one.
  ASSERT_EQ(ledger_.enrollGateway("gw-b", keyOf(2), kT0).code, ReplyCode::kOk);
  EXPECT_EQ(ledger_.issueShard(request("req-b", "gw-b", 2), kT0).code, ReplyCode::kOk);
  EXPECT_EQ(account().retired_for_emergency, 500u);
  expectAuditPasses();
}

TEST_F(ShardRegistryTest, DisabledGatewayGetsNoShardAndItsReportsAreRefused) {
  const ShardGrant grant = issued("req-1");
  ASSERT_EQ(ledger_.setGatewayEnabled(kGateway, false, kT0).code, ReplyCode::kOk);
  ShardReply reply = ledger_.issueShard(request("req-2"), kT0);
  EXPECT_TRUE(reply.permission_denied);
  EXPECT_NE(reply.code, ReplyCode::kOk);
  reply = ledger_.reportShard(report(grant, {.local_retired = 100}, {}), kT0);
  EXPECT_TRUE(reply.permission_denied);
  EXPECT_EQ(view(grant.shard_id).state, ShardState::kIssued);
  EXPECT_EQ(account(), (Balances{.opening = 1000, .available = 900, .retired_for_emergency = 100}));
  ASSERT_EQ(ledger_.setGatewayEnabled(kGateway, true, kT0).code, ReplyCode::kOk);
  EXPECT_EQ(ledger_.reportShard(report(grant, {.local_retired = 100}, {}), kT0).code,
            ReplyCode::kOk);
}

TEST_F(ShardRegistryTest, BadSignatureOrUnknownKeyIsDenied) {
  ShardIssueRequest tampered = request("req-1");
  tampered.gateway_boot_epoch = 9;  // changed after signing
  EXPECT_TRUE(ledger_.issueShard(tampered, kT0).permission_denied);
  // Signed by a key that is not the enrolled one.
  EXPECT_TRUE(ledger_.issueShard(request("req-1", kGateway, 3), kT0).permission_denied);
  // Never enrolled.
  EXPECT_TRUE(ledger_.issueShard(request("req-1", "gw-x", 4), kT0).permission_denied);
  EXPECT_EQ(ledger_.shards().shardCount(), 0u);
  EXPECT_EQ(account(), Balances{});  // not even opened
}

// ---- report: refusals -------------------------------------------------------------------------

TEST_F(ShardRegistryTest, ReportWithATamperedGrantIsDenied) {
  const ShardGrant grant = issued();
  ShardGrant forged = grant;
  forged.allocated_units = 200;
  ShardReport r = report(forged, {.local_retired = 200}, {});
  const ShardReply reply = ledger_.reportShard(r, kT0);
  EXPECT_TRUE(reply.permission_denied);
  // A report signed by another key than the grant's gateway.
  ShardReport other = report(grant, {.local_retired = 100}, {});
  other.signature[0] ^= 1;
  EXPECT_TRUE(ledger_.reportShard(other, kT0).permission_denied);
  EXPECT_FALSE(view(grant.shard_id).reported);
  EXPECT_EQ(account(), (Balances{.opening = 1000, .available = 900, .retired_for_emergency = 100}));
}

TEST_F(ShardRegistryTest, ReportOfAnUnknownShardIsNotFoundOnlyForItsOwnGateway) {
  // A grant this ledger's key signed, for a shard the registry does not hold (compacted, or
  // lost with a restore from an older backup): kNotFound for its enrolled, enabled gateway.
  ShardGrant gone{.shard_id = "shard-99",
                  .subject = kSubject,
                  .route = kRoute,
                  .policy_generation = 1,
                  .gateway_id = keyOf(1),
                  .gateway_name = kGateway,
                  .gateway_boot_epoch = 1,
                  .fence = 1,
                  .allocated_units = 100,
                  .issued_at_ms = kT0,
                  .expires_at_ms = kT0 + kTtlMs};
  crypto_.signGrant(&gone);
  (void)ledger_.takeChanges();
  ShardReply reply = ledger_.reportShard(report(gone, {.local_retired = 100}, {}), kT0);
  EXPECT_EQ(reply.code, ReplyCode::kNotFound);
  EXPECT_FALSE(reply.permission_denied);
  EXPECT_TRUE(reply.shards.empty());
  EXPECT_TRUE(ledger_.takeChanges().empty());
  // A grant the ledger key did not sign is refused as before.
  ShardGrant forged = gone;
  forged.allocated_units = 200;
  EXPECT_TRUE(
      ledger_.reportShard(report(forged, {.local_retired = 200}, {}), kT0).permission_denied);
  // So is a disabled gateway's report.
  ASSERT_EQ(ledger_.setGatewayEnabled(kGateway, false, kT0).code, ReplyCode::kOk);
  reply = ledger_.reportShard(report(gone, {.local_retired = 100}, {}), kT0);
  EXPECT_TRUE(reply.permission_denied);
  EXPECT_NE(reply.code, ReplyCode::kNotFound);
  EXPECT_EQ(ledger_.shards().shardCount(), 0u);
}

TEST_F(ShardRegistryTest, InconsistentReportsChangeNothing) {
  const ShardGrant grant = issued();
  const std::string id = grant.shard_id;
  const std::vector<ShardReport> bad = {
      // balances do not add up to allocated
      report(grant, {.local_available = 50, .local_retired = 40}, {}),
      // holding receipts sum to 30, localReserved says 20
      report(grant, {.local_reserved = 20, .local_retired = 80},
             {receipt("r1", id, RS::kStarted, 30)}),
      // settled receipts sum to 25, localSpent says 30
      report(grant, {.local_spent = 30, .local_retired = 70},
             {receipt("r1", id, RS::kSettled, 30, 25)}),
      // a receipt of another shard
      report(grant, {.local_spent = 30, .local_retired = 70},
             {receipt("r1", "shard-9", RS::kSettled, 30, 30)}),
      // the same receipt twice
      report(grant, {.local_spent = 20, .local_retired = 80},
             {receipt("r1", id, RS::kSettled, 10, 10), receipt("r1", id, RS::kSettled, 10, 10)}),
  };
  for (const ShardReport& r : bad) {
    const ShardReply reply = ledger_.reportShard(r, kT0);
    EXPECT_EQ(reply.code, ReplyCode::kInvalidArgument) << reply.message;
  }
  EXPECT_FALSE(view(id).reported);
  EXPECT_EQ(view(id).state, ShardState::kIssued);
  EXPECT_EQ(account(), (Balances{.opening = 1000, .available = 900, .retired_for_emergency = 100}));
}

// ---- report: reconciliation -------------------------------------------------------------------

TEST_F(ShardRegistryTest, HoldingReceiptsStayRetiredUntilALaterReportResolvesThem) {
  const ShardGrant grant = issued();
  const std::string id = grant.shard_id;
  // r1 settled 20 of 30; r2 STARTED 25; r3 USAGE_UNKNOWN 15; the rest (40) retired at close.
  const ShardReport first =
      report(grant, {.local_reserved = 40, .local_spent = 20, .local_retired = 40},
             {receipt("r1", id, RS::kSettled, 30, 20), receipt("r2", id, RS::kStarted, 25),
              receipt("r3", id, RS::kUsageUnknown, 15)});
  ShardReply reply = ledger_.reportShard(first, kT0 + 1'000);
  ASSERT_EQ(reply.code, ReplyCode::kOk) << reply.message;
  EXPECT_EQ(reply.spent_units, 20u);
  EXPECT_EQ(reply.reminted_units, 40u);  // only what terminal receipts prove unused
  ShardLedgerView v = reply.shards.front();
  EXPECT_EQ(v.state, ShardState::kReconciling);
  EXPECT_EQ(v.spent_units, 20u);
  EXPECT_EQ(v.reminted_units, 40u);
  EXPECT_EQ(v.retired_units, 40u);  // r2 and r3 hold theirs
  // available 900 + 40 reminted; spent 20; retired 40; the remint is a paired entry in the
  // same (active) account: transferredOut 40, minted 40.
  EXPECT_EQ(account(), (Balances{.opening = 1000,
                                 .minted = 40,
                                 .available = 940,
                                 .spent = 20,
                                 .retired_for_emergency = 40,
                                 .transferred_out = 40}));
  expectAuditPasses(kT0 + 1'000);
  // r2 settles at 25, r3's receipt says 5 (its other 10 return to the closed shard: retired).
  const ShardReport second =
      report(grant, {.local_spent = 50, .local_retired = 50},
             {receipt("r1", id, RS::kSettled, 30, 20), receipt("r2", id, RS::kSettled, 25, 25),
              receipt("r3", id, RS::kSettled, 15, 5)});
  reply = ledger_.reportShard(second, kT0 + 2'000);
  ASSERT_EQ(reply.code, ReplyCode::kOk) << reply.message;
  EXPECT_EQ(reply.spent_units, 30u);
  EXPECT_EQ(reply.reminted_units, 10u);
  v = reply.shards.front();
  EXPECT_EQ(v.state, ShardState::kReconciled);
  EXPECT_EQ(v.spent_units, 50u);
  EXPECT_EQ(v.reminted_units, 50u);
  EXPECT_EQ(v.retired_units, 0u);
  EXPECT_EQ(
      account(),
      (Balances{
          .opening = 1000, .minted = 50, .available = 950, .spent = 50, .transferred_out = 50}));
  expectAuditPasses(kT0 + 2'000);
}

TEST_F(ShardRegistryTest, ASupersededReportDeliveredLateChangesNothing) {
  const ShardGrant grant = issued();
  const std::string id = grant.shard_id;
  const ShardReport first = report(grant, {.local_reserved = 25, .local_retired = 75},
                                   {receipt("r1", id, RS::kStarted, 25)});
  ASSERT_EQ(ledger_.reportShard(first, kT0 + 1'000).code, ReplyCode::kOk);
  const ShardReport second = report(grant, {.local_spent = 20, .local_retired = 80},
                                    {receipt("r1", id, RS::kSettled, 25, 20)});
  const ShardReply latest = ledger_.reportShard(second, kT0 + 2'000);
  ASSERT_EQ(latest.code, ReplyCode::kOk) << latest.message;
  ASSERT_EQ(latest.shards.front().state, ShardState::kReconciled);
  const Balances after_latest = account();
  // The first report again (reordered on the network, or replayed): no conflict, no change.
  const ShardReply late = ledger_.reportShard(first, kT0 + 3'000);
  EXPECT_EQ(late.code, ReplyCode::kOk) << late.message;
  EXPECT_TRUE(late.duplicate);
  EXPECT_EQ(late.reminted_units, 0u);
  EXPECT_EQ(late.shards.front(), latest.shards.front());
  EXPECT_EQ(account(), after_latest);
  // Or the first boot epoch's report, after the restarted agent's (boot epoch 2) resolved it.
  const ShardReport restarted = report(grant, {.local_spent = 20, .local_retired = 80},
                                       {receipt("r1", id, RS::kSettled, 25, 20)}, 2, kT0 + 3'500);
  ASSERT_EQ(ledger_.reportShard(restarted, kT0 + 3'500).shards.front().state,
            ShardState::kReconciled);
  EXPECT_TRUE(ledger_.reportShard(first, kT0 + 3'600).duplicate);
  EXPECT_EQ(view(id).state, ShardState::kReconciled);
  EXPECT_EQ(account(), after_latest);
  // A report that only looks earlier but names a receipt the record lacks is still a conflict.
  const ShardReport other = report(grant, {.local_reserved = 25, .local_retired = 75},
                                   {receipt("r9", id, RS::kStarted, 25)});
  EXPECT_EQ(ledger_.reportShard(other, kT0 + 4'000).shards.front().state, ShardState::kConflict);
}

TEST_F(ShardRegistryTest, DuplicateReportRemintsNothing) {
  const ShardGrant grant = issued();
  const ShardReport r = report(grant, {.local_spent = 30, .local_retired = 70},
                               {receipt("r1", grant.shard_id, RS::kSettled, 40, 30)});
  const ShardReply first = ledger_.reportShard(r, kT0);
  ASSERT_EQ(first.code, ReplyCode::kOk);
  EXPECT_EQ(first.reminted_units, 70u);
  const Balances after_first = account();
  // The ACK was lost: the agent sends the very same report again.
  const ShardReply again = ledger_.reportShard(r, kT0 + 10);
  EXPECT_EQ(again.code, ReplyCode::kOk);
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.reminted_units, 0u);
  EXPECT_EQ(again.spent_units, 0u);
  EXPECT_EQ(again.shards.front(), first.shards.front());  // the same result
  EXPECT_EQ(account(), after_first);
  // Rebuilt after a restart with a new timestamp: not identical, still remints nothing more.
  const ShardReply rebuilt =
      ledger_.reportShard(report(grant, r.balances, r.receipts, 1, kT0 + 20), kT0 + 20);
  EXPECT_EQ(rebuilt.code, ReplyCode::kOk);
  EXPECT_EQ(rebuilt.reminted_units, 0u);
  EXPECT_EQ(rebuilt.spent_units, 0u);
  EXPECT_EQ(account(), after_first);
  EXPECT_EQ(
      account(),
      (Balances{
          .opening = 1000, .minted = 70, .available = 970, .spent = 30, .transferred_out = 70}));
}

TEST_F(ShardRegistryTest, ReportsFromTwoBootEpochsAreAConflict) {
  const ShardGrant grant = issued();
  const std::string id = grant.shard_id;
  ASSERT_EQ(ledger_
                .reportShard(report(grant, {.local_spent = 30, .local_retired = 70},
                                    {receipt("r1", id, RS::kSettled, 30, 30)}),
                             kT0)
                .code,
            ReplyCode::kOk);
  // A copy of the old process, another boot epoch, admitted r9 (40) from the same units.
  const ShardReply reply =
      ledger_.reportShard(report(grant, {.local_spent = 40, .local_retired = 60},
                                 {receipt("r9", id, RS::kSettled, 40, 40)}, /*boot_epoch=*/2),
                          kT0);
  ASSERT_EQ(reply.code, ReplyCode::kOk) << reply.message;
  EXPECT_THAT(reply.message, HasSubstr("conflict"));
  EXPECT_EQ(reply.reminted_units, 0u);
  const ShardLedgerView v = reply.shards.front();
  EXPECT_EQ(v.state, ShardState::kConflict);
  // The union of terminal receipts (30 + 40 = 70) is spent: 30 recorded before, 40 now, but only
  // 0 units were still retired (70 reminted by the first report): the 40 become debt.
  EXPECT_EQ(v.spent_units, 30u);
  EXPECT_EQ(v.reminted_units, 70u);
  EXPECT_EQ(v.retired_units, 0u);
  EXPECT_EQ(v.debt_units, 40u);
  EXPECT_EQ(reply.debt_units, 40u);
  EXPECT_EQ(account(), (Balances{.opening = 1000,
                                 .minted = 70,
                                 .overdraft_issued = 40,
                                 .available = 970,
                                 .spent = 70,
                                 .transferred_out = 70}));
  expectAuditPasses();
  // Nothing more of it is ever reminted, even by a report that looks clean.
  const ShardReply later =
      ledger_.reportShard(report(grant, {.local_spent = 40, .local_retired = 60},
                                 {receipt("r9", id, RS::kSettled, 40, 40)}, 2, kT0 + 5),
                          kT0 + 5);
  EXPECT_EQ(later.reminted_units, 0u);
  EXPECT_EQ(later.debt_units, 0u);
  EXPECT_EQ(view(id).state, ShardState::kConflict);
}

TEST_F(ShardRegistryTest, ARestartThatOnlyResolvesHoldingReceiptsIsNoConflict) {
  const ShardGrant grant = issued();
  const std::string id = grant.shard_id;
  ASSERT_EQ(ledger_
                .reportShard(report(grant, {.local_reserved = 30, .local_retired = 70},
                                    {receipt("r1", id, RS::kUsageUnknown, 30)}),
                             kT0)
                .code,
            ReplyCode::kOk);
  EXPECT_EQ(account().retired_for_emergency, 30u);
  // The agent restarted (boot epoch 2); r1's operation receipt says 10 were used.
  const ShardReply reply =
      ledger_.reportShard(report(grant, {.local_spent = 10, .local_retired = 90},
                                 {receipt("r1", id, RS::kSettled, 30, 10)}, /*boot_epoch=*/2),
                          kT0 + kTtlMs);
  ASSERT_EQ(reply.code, ReplyCode::kOk) << reply.message;
  EXPECT_EQ(reply.shards.front().state, ShardState::kReconciled);
  EXPECT_EQ(reply.spent_units, 10u);
  EXPECT_EQ(reply.reminted_units, 20u);
  EXPECT_EQ(
      account(),
      (Balances{
          .opening = 1000, .minted = 90, .available = 990, .spent = 10, .transferred_out = 90}));
  expectAuditPasses(kT0 + kTtlMs);
}

TEST_F(ShardRegistryTest, ChangedTerminalReceiptIsAConflict) {
  const ShardGrant grant = issued();
  const std::string id = grant.shard_id;
  ASSERT_EQ(ledger_
                .reportShard(report(grant, {.local_spent = 10, .local_retired = 90},
                                    {receipt("r1", id, RS::kSettled, 30, 10)}),
                             kT0)
                .code,
            ReplyCode::kOk);
  const ShardReply reply =
      ledger_.reportShard(report(grant, {.local_spent = 30, .local_retired = 70},
                                 {receipt("r1", id, RS::kSettled, 30, 30)}),
                          kT0);
  EXPECT_EQ(reply.shards.front().state, ShardState::kConflict);
  // Union: r1 at its larger actual (30): 10 recorded, 20 more, none retired → debt 20.
  EXPECT_EQ(reply.debt_units, 20u);
  expectAuditPasses();
}

TEST_F(ShardRegistryTest, OverspendBecomesDebtAndAConflict) {
  const ShardGrant grant = issued();
  // r1 reserved all 100 and settled at 105: localSpent 100, overspent 5.
  const ShardReply reply =
      ledger_.reportShard(report(grant, {.local_spent = 100, .overspent = 5},
                                 {receipt("r1", grant.shard_id, RS::kSettledWithDebt, 100, 105)}),
                          kT0);
  ASSERT_EQ(reply.code, ReplyCode::kOk) << reply.message;
  const ShardLedgerView v = reply.shards.front();
  EXPECT_EQ(v.state, ShardState::kConflict);
  EXPECT_EQ(v.spent_units, 100u);
  EXPECT_EQ(v.debt_units, 5u);
  EXPECT_EQ(reply.spent_units, 100u);
  EXPECT_EQ(reply.debt_units, 5u);
  EXPECT_EQ(account(),
            (Balances{.opening = 1000, .overdraft_issued = 5, .available = 900, .spent = 105}));
  expectAuditPasses();
  // The debt freezes admission: central reserves and new shards alike.
  const ReservationReply reserve = ledger_.reserve(
      {.reservation_id = "c1", .subject = kSubject, .route = kRoute, .units = 1}, kT0);
  EXPECT_EQ(reserve.code, ReplyCode::kRejected);
  EXPECT_EQ(ledger_.issueShard(request("req-2"), kT0).limiting_dimension, LimitingDimension::kDebt);
}

TEST_F(ShardRegistryTest, ReportFromAnotherBootEpochRemintsOnlyAfterExpiry) {
  const ShardGrant grant = issued();  // boot epoch 1
  // The agent restarted (boot epoch 2), closed the shard at boot and reports it.
  const ShardReply reply = ledger_.reportShard(
      report(grant, {.local_spent = 30, .local_retired = 70},
             {receipt("r1", grant.shard_id, RS::kSettled, 30, 30)}, /*boot_epoch=*/2),
      kT0 + 1'000);
  ASSERT_EQ(reply.code, ReplyCode::kOk) << reply.message;
  EXPECT_EQ(reply.spent_units, 30u);
  EXPECT_EQ(reply.reminted_units, 0u);
  EXPECT_EQ(
      account(),
      (Balances{.opening = 1000, .available = 900, .spent = 30, .retired_for_emergency = 70}));
  EXPECT_EQ(ledger_.tick(kT0 + kTtlMs - 1).shards_reminted, 0u);
  EXPECT_EQ(account().retired_for_emergency, 70u);
  EXPECT_EQ(ledger_.tick(kT0 + kTtlMs).shards_reminted, 1u);
  EXPECT_EQ(
      account(),
      (Balances{
          .opening = 1000, .minted = 70, .available = 970, .spent = 30, .transferred_out = 70}));
  EXPECT_EQ(view(grant.shard_id).reminted_units, 70u);
  EXPECT_EQ(ledger_.tick(kT0 + kTtlMs + 1).shards_reminted, 0u);
  expectAuditPasses(kT0 + kTtlMs + 1);
}

TEST(ShardRegistryBurstTest, RemintIsCappedByBurstAndTheRestStaysRetired) {
  FakeShardCrypto crypto;
  Ledger ledger;
  ledger.setShardCrypto(&crypto);
  ASSERT_EQ(ledger.publishPolicy(Policy{.budgets = {shardBudget(10)}}, kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger.enrollGateway(kGateway, keyOf(1), kT0).code, ReplyCode::kOk);
  ShardIssueRequest r{.request_id = "req-1",
                      .gateway_name = kGateway,
                      .gateway_id = keyOf(1),
                      .gateway_boot_epoch = 1,
                      .subject = kSubject,
                      .route = kRoute};
  signIssue(&r);
  const ShardReply issued = ledger.issueShard(r, kT0);
  ASSERT_EQ(issued.code, ReplyCode::kOk);
  const ShardGrant grant = issued.shards.front().grant;
  // 10 s at 10/s refills available back to the burst (900 → 1000): no room for the remint.
  ShardReport report{.shard = grant,
                     .balances = {.allocated = 100, .local_retired = 100},
                     .gateway_boot_epoch = 1,
                     .reported_at_ms = kT0 + 10'000};
  signReport(&report);
  const ShardReply reply = ledger.reportShard(report, kT0 + 10'000);
  ASSERT_EQ(reply.code, ReplyCode::kOk);
  EXPECT_EQ(reply.reminted_units, 0u);
  EXPECT_EQ(reply.shards.front().retired_units, 100u);
  EXPECT_EQ(reply.shards.front().state, ShardState::kReconciled);
  const Balances b = ledger.accounts().find(AccountKey{kSubject, kRoute, 1})->account.balances();
  EXPECT_EQ(
      b,
      (Balances{.opening = 1000, .minted = 100, .available = 1000, .retired_for_emergency = 100}));
  EXPECT_TRUE(ledger.audit(kT0 + 10'000).conserved);
}

TEST_F(ShardRegistryTest, RemintGoesIntoTheCurrentGeneration) {
  const ShardGrant grant = issued();
  // Generation 2: generation 1 hands its 900 available over and keeps the 100 retired.
  ASSERT_EQ(ledger_.publishPolicy(Policy{.budgets = {shardBudget()}}, kT0 + 10).code,
            ReplyCode::kOk);
  ASSERT_EQ(
      ledger_
          .reserve({.reservation_id = "c1", .subject = kSubject, .route = kRoute, .units = 50},
                   kT0 + 10)
          .code,
      ReplyCode::kOk);
  EXPECT_EQ(account(1),
            (Balances{.opening = 1000, .retired_for_emergency = 100, .transferred_out = 900}));
  EXPECT_EQ(account(2), (Balances{.minted = 900, .available = 850, .reserved = 50}));
  EXPECT_EQ(ledger_.accounts().generationState(1), GenerationState::kDraining);
  const ShardReply reply =
      ledger_.reportShard(report(grant, {.local_spent = 20, .local_retired = 80},
                                 {receipt("r1", grant.shard_id, RS::kSettled, 20, 20)}),
                          kT0 + 20);
  ASSERT_EQ(reply.code, ReplyCode::kOk) << reply.message;
  EXPECT_EQ(reply.reminted_units, 80u);
  EXPECT_EQ(account(1), (Balances{.opening = 1000, .spent = 20, .transferred_out = 980}));
  EXPECT_EQ(account(2), (Balances{.minted = 980, .available = 930, .reserved = 50}));
  EXPECT_EQ(ledger_.accounts().generationState(1), GenerationState::kDrained);
  expectAuditPasses(kT0 + 20);
}

// ---- revoke, write off ------------------------------------------------------------------------

TEST_F(ShardRegistryTest, RevokeBumpsTheFence) {
  const ShardGrant first = issued("req-1");
  ShardReply reply = ledger_.revokeShards(first.shard_id, "", kT0);
  ASSERT_EQ(reply.code, ReplyCode::kOk);
  EXPECT_EQ(reply.shards.front().state, ShardState::kRevoked);
  EXPECT_EQ(reply.shards.front().current_fence, 2u);
  EXPECT_EQ(ledger_.revokeShards(first.shard_id, "", kT0).duplicate, true);
  EXPECT_EQ(view(first.shard_id).current_fence, 2u);
  // The units stay retired; a new grant carries the new fence.
  EXPECT_EQ(account().retired_for_emergency, 100u);
  const ShardGrant second = issued("req-2");
  const ShardGrant third = issued("req-3");
  EXPECT_EQ(second.fence, 2u);
  // Revoking by gateway revokes every ISSUED shard of it and bumps the fence once.
  reply = ledger_.revokeShards("", kGateway, kT0);
  ASSERT_EQ(reply.code, ReplyCode::kOk);
  EXPECT_EQ(reply.shards.size(), 2u);
  EXPECT_EQ(view(third.shard_id).state, ShardState::kRevoked);
  EXPECT_EQ(view(third.shard_id).current_fence, 3u);
  // A revoked shard's report is still accepted (the usage happened).
  reply = ledger_.reportShard(report(second, {.local_retired = 100}, {}), kT0);
  ASSERT_EQ(reply.code, ReplyCode::kOk);
  EXPECT_EQ(reply.shards.front().state, ShardState::kReconciled);
  EXPECT_EQ(ledger_.revokeShards(second.shard_id, "", kT0).code, ReplyCode::kInvalidState);
  EXPECT_EQ(ledger_.revokeShards("shard-99", "", kT0).code, ReplyCode::kNotFound);
  EXPECT_EQ(ledger_.revokeShards("", "", kT0).code, ReplyCode::kInvalidArgument);
  expectAuditPasses();
}

TEST_F(ShardRegistryTest, WriteOffOnlyAfterExpiryAndThenReportsAreRefused) {
  const ShardGrant grant = issued();
  ShardReply reply = ledger_.writeOffShard(grant.shard_id, kT0 + kTtlMs - 1);
  EXPECT_EQ(reply.code, ReplyCode::kInvalidState);
  EXPECT_EQ(view(grant.shard_id).state, ShardState::kIssued);
  reply = ledger_.writeOffShard(grant.shard_id, kT0 + kTtlMs);
  ASSERT_EQ(reply.code, ReplyCode::kOk);
  EXPECT_EQ(reply.shards.front().state, ShardState::kWrittenOff);
  EXPECT_TRUE(reply.shards.front().written_off);
  // Its units stay retired for ever.
  EXPECT_EQ(account(), (Balances{.opening = 1000, .available = 900, .retired_for_emergency = 100}));
  reply = ledger_.reportShard(report(grant, {.local_retired = 100}, {}), kT0 + kTtlMs);
  EXPECT_EQ(reply.code, ReplyCode::kInvalidState);
  EXPECT_EQ(account().retired_for_emergency, 100u);
  EXPECT_EQ(ledger_.writeOffShard(grant.shard_id, kT0 + kTtlMs).duplicate, true);
  EXPECT_EQ(ledger_.revokeShards(grant.shard_id, "", kT0 + kTtlMs).code, ReplyCode::kInvalidState);
  expectAuditPasses(kT0 + kTtlMs);
}

// ---- gateways, audit, changes -----------------------------------------------------------------

TEST_F(ShardRegistryTest, EnrollIsIdempotentPerNameAndKey) {
  GatewayReply reply = ledger_.enrollGateway(kGateway, keyOf(1), kT0 + 5);
  EXPECT_EQ(reply.code, ReplyCode::kOk);
  EXPECT_TRUE(reply.duplicate);
  EXPECT_EQ(reply.gateways.front().enrolled_at_ms, kT0);
  EXPECT_EQ(ledger_.enrollGateway(kGateway, keyOf(2), kT0).code, ReplyCode::kIdempotencyConflict);
  EXPECT_EQ(ledger_.enrollGateway("", keyOf(2), kT0).code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(ledger_.enrollGateway("gw b", keyOf(2), kT0).code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(ledger_.enrollGateway(std::string(129, 'g'), keyOf(2), kT0).code,
            ReplyCode::kInvalidArgument);
  EXPECT_EQ(ledger_.enrollGateway("gw-c", PublicKey{}, kT0).code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(ledger_.setGatewayEnabled("nobody", false, kT0).code, ReplyCode::kNotFound);
  ASSERT_EQ(ledger_.enrollGateway("gw-b", keyOf(2), kT0).code, ReplyCode::kOk);
  reply = ledger_.listGateways();
  ASSERT_EQ(reply.gateways.size(), 2u);
  EXPECT_EQ(reply.gateways[1].gateway_name, "gw-b");
}

TEST_F(ShardRegistryTest, AuditCatchesRetiredUnitsNoShardAccountsFor) {
  (void)issued();
  expectAuditPasses();
  // A carve that bypasses the registry leaves retiredForEmergency above Σ shard retired.
  ASSERT_EQ(ledger_.accounts().carve(AccountKey{kSubject, kRoute, 1}, 10, kT0), AccountCode::kOk);
  const AuditReport audit = ledger_.audit(kT0);
  EXPECT_FALSE(audit.conserved);
  ASSERT_FALSE(audit.violations.empty());
  EXPECT_THAT(audit.violations.front(), HasSubstr("retiredForEmergency 110"));
  ASSERT_EQ(audit.shards.size(), 1u);
  EXPECT_TRUE(audit.shards.front().conserved);
}

TEST_F(ShardRegistryTest, ChangesNameEveryRowToPersist) {
  (void)ledger_.takeChanges();
  const ShardGrant grant = issued();
  LedgerChanges changes = ledger_.takeChanges();
  EXPECT_EQ(changes.shards, std::vector<std::string>{grant.shard_id});
  EXPECT_TRUE(changes.shard_sequence);
  EXPECT_EQ(changes.accounts.size(), 1u);
  EXPECT_TRUE(ledger_.takeChanges().empty());
  ASSERT_EQ(ledger_.revokeShards(grant.shard_id, "", kT0).code, ReplyCode::kOk);
  const LedgerChangedRows rows = ledger_.takeChangedRows();
  ASSERT_EQ(rows.shards.fences.size(), 1u);
  EXPECT_EQ(rows.shards.fences.front().fence, 2u);
  ASSERT_EQ(rows.shards.shards.size(), 1u);
  EXPECT_EQ(rows.shards.shards.front()->state, ShardState::kRevoked);
  EXPECT_FALSE(rows.shards.shard_sequence_changed);
  ASSERT_EQ(ledger_.setGatewayEnabled(kGateway, false, kT0).code, ReplyCode::kOk);
  changes = ledger_.takeChanges();
  EXPECT_EQ(changes.gateways, std::vector<std::string>{kGateway});
}

TEST(ShardRegistryCompactionTest, ReconciledShardsAreDroppedAfterShardRetention) {
  FakeShardCrypto crypto;
  // The receipts' window is much shorter than the shards' retention: shards keep the latter.
  Ledger ledger(LedgerOptions{.retention_ms = 1'000, .shard_retention_ms = 10'000});
  ledger.setShardCrypto(&crypto);
  ASSERT_EQ(ledger.publishPolicy(Policy{.budgets = {shardBudget()}}, kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger.enrollGateway(kGateway, keyOf(1), kT0).code, ReplyCode::kOk);
  auto issue = [&](const std::string& request_id) {
    ShardIssueRequest r{.request_id = request_id,
                        .gateway_name = kGateway,
                        .gateway_id = keyOf(1),
                        .gateway_boot_epoch = 1,
                        .subject = kSubject,
                        .route = kRoute};
    signIssue(&r);
    return ledger.issueShard(r, kT0);
  };
  const ShardGrant done = issue("q1").shards.front().grant;
  const ShardGrant held = issue("q2").shards.front().grant;
  ShardReport all_unused{
      .shard = done, .balances = {.allocated = 100, .local_retired = 100}, .gateway_boot_epoch = 1};
  signReport(&all_unused);
  ASSERT_EQ(ledger.reportShard(all_unused, kT0).shards.front().state, ShardState::kReconciled);
  (void)ledger.takeChanges();
  // Kept until expiry + shard retention (not expiry + retention_ms); `held` (ISSUED, its units
  // retired) is never dropped.
  EXPECT_EQ(ledger.tick(kT0 + kTtlMs + 1'000).shards_compacted, 0u);
  EXPECT_NE(ledger.shards().find(done.shard_id), nullptr);
  // A retried report within the shard retention is still answered as a duplicate.
  const ShardReply retried = ledger.reportShard(all_unused, kT0 + kTtlMs + 1'000);
  ASSERT_EQ(retried.code, ReplyCode::kOk);
  EXPECT_TRUE(retried.duplicate);
  const uint64_t due = kT0 + kTtlMs + 10'000;
  EXPECT_EQ(ledger.tick(due - 1).shards_compacted, 0u);
  EXPECT_EQ(ledger.tick(due).shards_compacted, 1u);
  EXPECT_EQ(ledger.shards().find(done.shard_id), nullptr);
  EXPECT_NE(ledger.shards().find(held.shard_id), nullptr);
  const LedgerChanges changes = ledger.takeChanges();
  EXPECT_EQ(changes.shards_deleted, std::vector<std::string>{done.shard_id});
  EXPECT_TRUE(changes.shards.empty());
  EXPECT_TRUE(ledger.audit(due).conserved);
  EXPECT_EQ(ledger.tick(due + 1'000'000).shards_compacted, 0u);
  // A report after compaction: the typed "no record" answer, nothing changes.
  const ShardReply forgotten = ledger.reportShard(all_unused, due + 1);
  EXPECT_EQ(forgotten.code, ReplyCode::kNotFound);
  EXPECT_FALSE(forgotten.permission_denied);
  EXPECT_TRUE(forgotten.shards.empty());
  EXPECT_THAT(forgotten.message, HasSubstr(done.shard_id));
  EXPECT_TRUE(ledger.takeChanges().empty());
  // Past retention its request id is forgotten, like a reservation's: a new shard.
  const ShardReply again = issue("q1");
  ASSERT_EQ(again.code, ReplyCode::kOk);
  EXPECT_FALSE(again.duplicate);
  EXPECT_EQ(again.shards.front().grant.shard_id, "shard-3");
}

TEST(ShardRegistryRestoreTest, InconsistentRecordsAreCorruption) {
  AccountBook accounts;
  ShardRegistry registry(&accounts, limits::kShardRetentionMsDefault);
  ShardRecord record;
  record.grant.shard_id = "shard-1";
  record.grant.allocated_units = 100;
  record.issue_request.request_id = "q1";
  record.retired_units = 90;  // 10 missing
  EXPECT_FALSE(registry.restoreShard(record).isOk());
  record.retired_units = 100;
  record.state = ShardState::kConflict;
  record.remint_due_at_ms = 5;  // a deferred remint only exists while reconciling
  EXPECT_FALSE(registry.restoreShard(record).isOk());
  record.remint_due_at_ms = 0;
  record.grant.shard_id = "not-a-shard";
  EXPECT_FALSE(registry.restoreShard(record).isOk());
  record.grant.shard_id = "shard-7";
  ASSERT_TRUE(registry.restoreShard(record).isOk());
  EXPECT_FALSE(registry.restoreShard(record).isOk());  // twice
  registry.restoreShardSequence(7);
  EXPECT_FALSE(registry.finishRestore().isOk());  // its source account is missing
  ASSERT_TRUE(
      accounts.restorePolicy(Policy{.generation = 1, .budgets = {shardBudget()}}, 0).isOk());
  record.grant.subject = kSubject;
  record.grant.route = kRoute;
  record.grant.policy_generation = 1;
  ASSERT_TRUE(
      accounts
          .restoreAccount(AccountKey{kSubject, kRoute, 1},
                          Balances{.opening = 1000, .available = 900, .retired_for_emergency = 100},
                          kT0, 0)
          .isOk());
  ShardRegistry restored(&accounts, limits::kShardRetentionMsDefault);
  record.issue_request.request_id = "q7";
  ASSERT_TRUE(restored.restoreShard(record).isOk());
  restored.restoreShardSequence(6);
  EXPECT_FALSE(restored.finishRestore().isOk());  // shard-7 above the sequence
  restored.restoreShardSequence(7);
  EXPECT_TRUE(restored.finishRestore().isOk());
  EXPECT_FALSE(registry.restoreFence({.key = {"a", "b"}, .fence = 0}).isOk());
}

}  // namespace
}  // namespace tally
