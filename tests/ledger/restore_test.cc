// A restart rebuilds the exact shard registry: every change a Ledger names goes through the
// store (storeBatchOf, SqliteStore) and restoreLedger() into a fresh Ledger.

#include "ledger/restore.h"

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "core/ledger.h"
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

}  // namespace
}  // namespace tally::ledger
