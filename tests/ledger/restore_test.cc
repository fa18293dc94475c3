// A restart rebuilds the exact shard registry: every change a Ledger names goes through the
// store (storeBatchOf, SqliteStore) and restoreLedger() into a fresh Ledger.

#include "ledger/restore.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "core/ledger.h"
#include "core/limits.h"
#include "ledger/restore_check.h"
#include "ledger/sqlite_store.h"
#include "ledger/store_batch.h"
#include "tests/core/shard_fake_crypto.h"

namespace tally::ledger {
namespace {

using tally::testing::FakeShardCrypto;

constexpr uint64_t kT0 = 1'700'000'000'000;
constexpr uint64_t kTtlMs = 60'000;

class RestoreShardsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tally-restore-test-XXXXXX";
    const char* made = ::mkdtemp(pattern);
    ASSERT_NE(made, nullptr) << std::strerror(errno);
    dir_ = made;
    Result<std::unique_ptr<SqliteStore>> store = SqliteStore::open(dir_ + "/data");
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    store_ = std::move(store).value();
    ledger_.setShardCrypto(&crypto_);
  }
  void TearDown() override {
    store_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  // What the server does after each batch: persist every changed row.
  void persist(uint64_t now_ms) {
    LedgerChangedRows rows = ledger_.takeChangedRows();
    ASSERT_TRUE(store_->commit(storeBatchOf(ledger_, &rows, now_ms)).isOk());
  }

  ShardIssueRequest request(const std::string& id, const std::string& subject) {
    ShardIssueRequest r{.request_id = id,
                        .gateway_name = "gw-a",
                        .gateway_id = key_,
                        .gateway_boot_epoch = 1,
                        .subject = subject,
                        .route = "/v1/chat"};
    tally::testing::signIssue(&r);
    return r;
  }

  std::string dir_;
  std::unique_ptr<SqliteStore> store_;
  FakeShardCrypto crypto_;
  Ledger ledger_;
  PublicKey key_ = [] {
    PublicKey key{};
    key.fill(9);
    return key;
  }();
};

TEST_F(RestoreShardsTest, RestartRebuildsTheExactRegistry) {
  Budget budget{.subject_pattern = "tenant-*",
                .route = "/v1/chat",
                .unit = "tokens",
                .refill_per_second = 0,
                .burst = 1000,
                .max_single_reservation = 1000,
                .hold_ttl_ms = 30'000,
                .hard_execution_limit_ms = 60'000,
                .max_overdraft = 500,
                .emergency = {.enabled = true, .shard_units = 100, .shard_ttl_ms = kTtlMs}};
  ASSERT_EQ(ledger_.publishPolicy(Policy{.budgets = {budget}}, kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger_.enrollGateway("gw-a", key_, kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger_.enrollGateway("gw-b", PublicKey{1}, kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger_.setGatewayEnabled("gw-b", false, kT0).code, ReplyCode::kOk);
  persist(kT0);
  const ShardReply first = ledger_.issueShard(request("q1", "tenant-1"), kT0);
  const ShardReply second = ledger_.issueShard(request("q2", "tenant-2"), kT0);
  const ShardReply third = ledger_.issueShard(request("q3", "tenant-2"), kT0);
  ASSERT_EQ(third.code, ReplyCode::kOk);
  persist(kT0);
  // shard-1: reported by a restarted agent (boot epoch 2) with a USAGE_UNKNOWN receipt: spent
  // recorded, remint deferred to expiry. shard-2: revoked (fence of tenant-2 bumped).
  const ShardGrant grant = first.shards.front().grant;
  ShardReport report{
      .shard = grant,
      .balances = {.allocated = 100, .local_reserved = 30, .local_spent = 20, .local_retired = 50},
      .receipts = {Reservation{.reservation_id = "r1",
                               .subject = "tenant-1",
                               .route = "/v1/chat",
                               .reserved_units = 30,
                               .operation_id = "op-1",
                               .state = ReservationState::kUsageUnknown,
                               .origin = grant.shard_id},
                   Reservation{.reservation_id = "r2",
                               .subject = "tenant-1",
                               .route = "/v1/chat",
                               .reserved_units = 20,
                               .actual_units = 20,
                               .operation_id = "op-2",
                               .state = ReservationState::kSettled,
                               .origin = grant.shard_id}},
      .gateway_boot_epoch = 2,
      .reported_at_ms = kT0 + 5};
  tally::testing::signReport(&report);
  ASSERT_EQ(ledger_.reportShard(report, kT0 + 5).code, ReplyCode::kOk);
  ASSERT_EQ(ledger_.revokeShards(second.shards.front().grant.shard_id, "", kT0 + 5).code,
            ReplyCode::kOk);
  persist(kT0 + 5);
  const uint64_t later = kT0 + 10;
  const ShardReply before = ledger_.listShards("", std::nullopt);
  ASSERT_EQ(before.shards.size(), 3u);

  // Restart: a new store over the same files, a new Ledger.
  store_.reset();
  Result<std::unique_ptr<SqliteStore>> reopened = SqliteStore::open(dir_ + "/data");
  ASSERT_TRUE(reopened.isOk()) << reopened.status().toString();
  store_ = std::move(reopened).value();
  Ledger restored;
  restored.setShardCrypto(&crypto_);
  Result<RestoreSummary> summary = restoreLedger(store_.get(), &restored, later);
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  EXPECT_EQ(summary.value().gateways, 2u);
  EXPECT_EQ(summary.value().shards, 3u);
  EXPECT_EQ(restored.listShards("", std::nullopt).shards, before.shards);
  EXPECT_EQ(restored.listGateways().gateways, ledger_.listGateways().gateways);
  for (const ShardLedgerView& view : before.shards) {
    EXPECT_TRUE(*restored.shards().find(view.grant.shard_id) ==
                *ledger_.shards().find(view.grant.shard_id))
        << view.grant.shard_id;
  }
  EXPECT_EQ(restored.shards().fenceOf("tenant-2", "/v1/chat"), 2u);
  EXPECT_EQ(restored.shards().shardSequence(), 3u);
  EXPECT_TRUE(restored.audit(later).conserved);
  EXPECT_EQ(restored.audit(later).accounts, ledger_.audit(later).accounts);
  // It carries on where the first left off: the next shard is shard-4 with the new fence, the
  // deferred remint happens at expiry, a retried issue is still a duplicate.
  const ShardReply next = restored.issueShard(request("q4", "tenant-2"), later);
  ASSERT_EQ(next.code, ReplyCode::kOk);
  EXPECT_EQ(next.shards.front().grant.shard_id, "shard-4");
  EXPECT_EQ(next.shards.front().grant.fence, 2u);
  EXPECT_TRUE(restored.issueShard(request("q1", "tenant-1"), later).duplicate);
  EXPECT_EQ(restored.tick(kT0 + kTtlMs).shards_reminted, 1u);
  EXPECT_EQ(restored.shards().find(grant.shard_id)->reminted_units, 50u);
  EXPECT_TRUE(restored.audit(kT0 + kTtlMs).conserved);
}

// --- A record the ledger cannot apply (issue 9, defect 1) -------------------------------------
//
// What the ledger wrote before units were bounded: a settle of 2^64 - 1 units on "q" (SETTLED_
// WITH_DEBT, an absurd debt) in the account that also holds "p", USAGE_UNKNOWN, whose close at
// the hard limit then overflowed `spent` and aborted the ledger on every restart.

constexpr uint64_t kHuge = UINT64_MAX;
constexpr Units kOpening = 1000;
const AccountKey kPoisonedKey{"tenant-7", "/v1/chat", 1};

Budget poisonBudget() {
  return Budget{.subject_pattern = "tenant-7",
                .route = "/v1/chat",
                .unit = "tokens",
                .refill_per_second = 0,
                .burst = kOpening,
                .max_single_reservation = kOpening,
                .hold_ttl_ms = 30'000,
                .hard_execution_limit_ms = 60'000,
                .max_overdraft = 500};
}

Reservation storedReservation(const std::string& id, ReservationState state) {
  Reservation r;
  r.reservation_id = id;
  r.request_digest.fill(7);
  r.subject = kPoisonedKey.subject;
  r.route = kPoisonedKey.route;
  r.policy_generation = 1;
  r.reserved_units = 100;
  r.operation_id = "op-" + id;
  r.created_at_ms = kT0;
  r.expires_at_ms = kT0 + 30'000;
  r.started_at_ms = kT0 + 10;
  r.state = state;
  return r;
}

// The batch as the old ledger committed it; `poisoned` false: the same history with q settled
// at 100 (a healthy store, to show that only the poison is refused).
StoreBatch historyBatch(bool poisoned) {
  Reservation q = storedReservation("q", ReservationState::kSettled);
  q.actual_units = 100;
  q.closed_at_ms = kT0 + 20;
  // opening 1000 = available 800 + reserved 100 (p) + spent 100 (q).
  Balances balances{.opening = kOpening, .available = 800, .reserved = 100, .spent = 100};
  if (poisoned) {
    q.state = ReservationState::kSettledWithDebt;
    q.actual_units = kHuge;
    q.debt_units = kHuge - 100 - 800;
    balances.available = 0;
    balances.spent = kHuge;
    balances.overdraft_issued = kHuge - 100 - 800;
  }
  EXPECT_TRUE(isConserved(balances));  // the poison conserves: only the bounds catch it
  StoreBatch batch;
  batch.ledger_clock_ms = kT0 + 20;
  batch.policies.push_back({.policy = Policy{.generation = 1, .budgets = {poisonBudget()}}});
  batch.accounts.push_back({.key = kPoisonedKey, .balances = balances, .refill_clock_ms = kT0});
  batch.reservations = {storedReservation("p", ReservationState::kUsageUnknown), q};
  return batch;
}

class RestorePoisonTest : public RestoreShardsTest {
 protected:
  void write(bool poisoned) { ASSERT_TRUE(store_->commit(historyBatch(poisoned)).isOk()); }
  StoreContents contents() {
    Result<StoreContents> loaded = store_->load();
    EXPECT_TRUE(loaded.isOk()) << loaded.status().toString();
    return loaded.isOk() ? std::move(loaded).value() : StoreContents{};
  }
};

bool names(const std::vector<BadRecord>& records, const std::string& table, const std::string& key,
           const std::string& field, const std::string& value) {
  return std::any_of(records.begin(), records.end(), [&](const BadRecord& r) {
    return r.table == table && r.key == key && r.field == field && r.value == value;
  });
}

TEST_F(RestorePoisonTest, AHealthyHistoryRestoresWithItsBreachCounters) {
  StoreBatch batch = historyBatch(/*poisoned=*/false);
  batch.accounts[0].breaches = {.count = 3, .units = 170};
  ASSERT_TRUE(store_->commit(batch).isOk());
  EXPECT_TRUE(findBadRecords(contents()).empty());
  Ledger restored;
  Result<RestoreSummary> summary = restoreLedger(store_.get(), &restored, kT0 + 30);
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  EXPECT_EQ(summary.value().reservations, 2u);
  const AuditReport audit = restored.audit(kT0 + 30);
  ASSERT_EQ(audit.accounts.size(), 1u);
  EXPECT_EQ(audit.accounts[0].overdraft_breaches, (OverdraftBreaches{.count = 3, .units = 170}));
}

TEST_F(RestorePoisonTest, RestoreRefusesAPoisonedRecordNamingIt) {
  write(/*poisoned=*/true);
  Ledger restored;
  std::vector<BadRecord> bad;
  Result<RestoreSummary> summary = restoreLedger(store_.get(), &restored, kT0 + 30, &bad);
  ASSERT_FALSE(summary.isOk());
  EXPECT_EQ(summary.status().code(), StatusCode::kCorruption);
  EXPECT_NE(summary.status().message().find("4 stored records cannot be applied"),
            std::string::npos)
      << summary.status().toString();
  const std::string huge = std::to_string(kHuge);
  EXPECT_TRUE(names(bad, "accounts", "tenant-7 /v1/chat @1", "spent", huge));
  EXPECT_TRUE(names(bad, "accounts", "tenant-7 /v1/chat @1", "overdraftIssued",
                    std::to_string(kHuge - 900)));
  EXPECT_TRUE(names(bad, "reservations", "q", "actualUnits", huge));
  EXPECT_TRUE(names(bad, "reservations", "q", "debtUnits", std::to_string(kHuge - 900)));
  EXPECT_EQ(bad.size(), 4u);
  EXPECT_EQ(describe(bad.front()),
            "accounts tenant-7 /v1/chat @1: overdraftIssued = " + std::to_string(kHuge - 900) +
                ": above the balance bound 4611686018427387904");
  // `check` lists the same records.
  EXPECT_EQ(findBadRecords(contents()), bad);
}

TEST_F(RestorePoisonTest, RepairQuarantinesThePoisonAndTheLedgerStartsAndAuditsClean) {
  write(/*poisoned=*/true);
  const RepairPlan plan = planRepair(contents());
  ASSERT_TRUE(plan.unrepairable.empty()) << describe(plan.unrepairable.front());
  ASSERT_EQ(plan.corrections.size(), 4u);
  EXPECT_EQ(plan.batch.deleted_reservations, std::vector<std::string>{"q"});
  ASSERT_EQ(plan.batch.accounts.size(), 1u);
  // Rebased: nothing available (it was 0), p's 100 still reserved, opening their sum; the
  // absurd spent and debt stay only in the quarantine log.
  const Balances expected{.opening = 100, .reserved = 100};
  EXPECT_EQ(plan.batch.accounts[0].balances, expected);
  for (const Correction& c : plan.corrections) {
    const std::string line = quarantineLine(c, kT0 + 40);
    EXPECT_EQ(line.front(), '{');
    EXPECT_EQ(line.back(), '\n');
    EXPECT_NE(line.find("\"table\":\"" + c.record.table + "\""), std::string::npos) << line;
  }
  ASSERT_TRUE(store_->commit(plan.batch).isOk());
  EXPECT_TRUE(findBadRecords(contents()).empty());
  EXPECT_TRUE(planRepair(contents()).corrections.empty());  // a second repair finds nothing

  Ledger restored;
  Result<RestoreSummary> summary = restoreLedger(store_.get(), &restored, kT0 + 40);
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  EXPECT_EQ(summary.value().reservations, 1u);
  EXPECT_TRUE(restored.audit(kT0 + 40).conserved);
  // The tick that used to abort: p reaches its hard limit and closes as fully consumed.
  EXPECT_EQ(restored.tick(kT0 + 10 + 60'000).closed_by_hard_limit, 1u);
  const AuditReport after = restored.audit(kT0 + 10 + 60'000);
  EXPECT_TRUE(after.conserved);
  ASSERT_EQ(after.accounts.size(), 1u);
  EXPECT_EQ(after.accounts[0].balances.spent, 100u);
  EXPECT_EQ(after.accounts[0].debt, 0u);
}

TEST_F(RestorePoisonTest, AHealthyAccountGivesAQuarantinedLiveReservationsUnitsToSpent) {
  StoreBatch batch = historyBatch(/*poisoned=*/false);
  batch.reservations[0].reserved_units = limits::kUnitsPerRequestMax + 1;  // p, USAGE_UNKNOWN
  batch.accounts[0].balances.reserved = limits::kUnitsPerRequestMax + 1;
  batch.accounts[0].balances.opening = limits::kUnitsPerRequestMax + 1 + 900;
  ASSERT_TRUE(store_->commit(batch).isOk());
  const std::vector<BadRecord> bad = findBadRecords(contents());
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_TRUE(names(bad, "reservations", "p", "reservedUnits",
                    std::to_string(limits::kUnitsPerRequestMax + 1)));
  const RepairPlan plan = planRepair(contents());
  ASSERT_TRUE(plan.unrepairable.empty());
  ASSERT_EQ(plan.batch.accounts.size(), 1u);
  const Balances& fixed = plan.batch.accounts[0].balances;
  EXPECT_EQ(fixed.reserved, 0u);
  EXPECT_EQ(fixed.spent, 100 + limits::kUnitsPerRequestMax + 1);
  EXPECT_EQ(fixed.available, 800u);
  EXPECT_TRUE(isConserved(fixed));
  ASSERT_TRUE(store_->commit(plan.batch).isOk());
  Ledger restored;
  Result<RestoreSummary> summary = restoreLedger(store_.get(), &restored, kT0 + 40);
  ASSERT_TRUE(summary.isOk()) << summary.status().toString();
  EXPECT_TRUE(restored.audit(kT0 + 40).conserved);
}

TEST_F(RestorePoisonTest, APolicyAboveTodaysMaximaIsNamedAndClampedByRepair) {
  StoreBatch batch = historyBatch(/*poisoned=*/false);
  batch.policies[0].policy.budgets[0].refill_per_second = uint64_t{1} << 40;  // valid before
  ASSERT_TRUE(store_->commit(batch).isOk());
  const std::vector<BadRecord> bad = findBadRecords(contents());
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_TRUE(names(bad, "policies", "generation 1", "budgets[0].refill_per_second",
                    std::to_string(uint64_t{1} << 40)));
  const RepairPlan plan = planRepair(contents());
  ASSERT_EQ(plan.batch.policies.size(), 1u);
  EXPECT_EQ(plan.batch.policies[0].policy.budgets[0].refill_per_second,
            limits::kRefillPerSecondMax);
  ASSERT_TRUE(store_->commit(plan.batch).isOk());
  Ledger restored;
  ASSERT_TRUE(restoreLedger(store_.get(), &restored, kT0 + 40).isOk());
}

}  // namespace
}  // namespace tally::ledger
