#include "core/shard_book.h"

#include <gtest/gtest.h>

#include <string>

#include "tests/core/fake_shard_crypto.h"

namespace tally {
namespace {

constexpr uint64_t kNowMs = 1'800'000'000'000;
constexpr uint64_t kBootEpoch = 7;
constexpr uint64_t kHoldTtlMs = 1'000;
constexpr uint64_t kShardTtlMs = 60'000;

PublicKey keyOf(uint8_t b) {
  PublicKey key{};
  key.fill(b);
  return key;
}

Digest digestOf(uint8_t b) {
  Digest digest{};
  digest.fill(b);
  return digest;
}

class ShardBookTest : public ::testing::Test {
 protected:
  ShardBookOptions options() const {
    return {.gateway_id = keyOf(1),
            .boot_epoch = kBootEpoch,
            .crypto = &crypto_,
            .retention_ms = 10'000,
            .hold_ttl_ms = kHoldTtlMs};
  }

  ShardGrant grant(const std::string& id, Units units = 100, uint64_t fence = 1) const {
    ShardGrant g{.shard_id = id,
                 .subject = "tenant-a",
                 .route = "chat",
                 .policy_generation = 3,
                 .accounting_epoch_ms = kNowMs - kNowMs % 3'600'000,
                 .gateway_id = keyOf(1),
                 .gateway_name = "gw-1",
                 .gateway_boot_epoch = kBootEpoch,
                 .fence = fence,
                 .allocated_units = units,
                 .issued_at_ms = kNowMs,
                 .expires_at_ms = kNowMs + kShardTtlMs};
    crypto_.signGrant(&g);
    return g;
  }

  ShardGrant resign(ShardGrant g) const {
    crypto_.signGrant(&g);
    return g;
  }

  static ReserveRequest reserveOf(const std::string& id, Units units, uint8_t digest = 1) {
    return {.reservation_id = id,
            .request_digest = digestOf(digest),
            .subject = "tenant-a",
            .route = "chat",
            .units = units};
  }

  void expectSound(const ShardBook& book) {
    const std::vector<std::string> violations = book.audit();
    EXPECT_TRUE(violations.empty()) << violations.front();
  }

  const ShardBalances& balancesOf(const ShardBook& book, const std::string& id) {
    const ShardBook::Shard* shard = book.findShard(id);
    EXPECT_NE(shard, nullptr);
    return shard->account.balances();
  }

  // reserve + start, asserting both succeed.
  void reserveAndStart(ShardBook* book, const std::string& id, Units units) {
    auto reply = book->reserve(reserveOf(id, units), kNowMs);
    ASSERT_TRUE(reply.has_value());
    ASSERT_EQ(reply->code, ReplyCode::kOk);
    ASSERT_EQ(book->start({.reservation_id = id, .operation_id = "op-" + id}, kNowMs).code,
              ReplyCode::kOk);
  }

  testing::KeyedFakeShardCrypto crypto_;
};

// --- rule 2 --------------------------------------------------------------------------------------

TEST_F(ShardBookTest, AcceptsAValidGrantAndRemembersItsFence) {
  ShardBook book(options());
  EXPECT_EQ(book.addShard(grant("shard-1", 100, 4), kNowMs), ShardAddCode::kOk);
  EXPECT_EQ(book.addShard(grant("shard-1", 100, 4), kNowMs), ShardAddCode::kDuplicate);
  EXPECT_EQ(book.highestFence({"tenant-a", "chat"}), 4u);
  EXPECT_EQ(book.usableShardCount({"tenant-a", "chat"}, kNowMs), 1u);
  EXPECT_EQ(book.usableUnits({"tenant-a", "chat"}, kNowMs), 100u);
  const ShardBookChanges changes = book.takeChanges();
  EXPECT_EQ(changes.shards_upserted, std::vector<std::string>{"shard-1"});
  ASSERT_EQ(changes.fences.size(), 1u);
  EXPECT_TRUE(book.takeChanges().empty());
}

TEST_F(ShardBookTest, RefusesEachRuleTwoViolation) {
  ShardBook book(options());
  ShardGrant tampered = grant("s-sig");
  tampered.allocated_units = 1'000;  // signature no longer covers it
  EXPECT_EQ(book.addShard(tampered, kNowMs), ShardAddCode::kBadSignature);

  testing::KeyedFakeShardCrypto other_ledger(99, "other-key");
  ShardGrant foreign = grant("s-key");
  other_ledger.signGrant(&foreign);
  EXPECT_EQ(book.addShard(foreign, kNowMs), ShardAddCode::kBadSignature);

  ShardGrant other_gateway = grant("s-gw");
  other_gateway.gateway_id = keyOf(2);
  EXPECT_EQ(book.addShard(resign(other_gateway), kNowMs), ShardAddCode::kNotOurGateway);

  ShardGrant old_boot = grant("s-boot");
  old_boot.gateway_boot_epoch = kBootEpoch - 1;
  EXPECT_EQ(book.addShard(resign(old_boot), kNowMs), ShardAddCode::kWrongBootEpoch);

  ASSERT_EQ(book.addShard(grant("s-fence-5", 100, 5), kNowMs), ShardAddCode::kOk);
  EXPECT_EQ(book.addShard(grant("s-fence-4", 100, 4), kNowMs), ShardAddCode::kFenceBelowSeen);

  ShardGrant expired = grant("s-exp", 100, 5);
  EXPECT_EQ(book.addShard(expired, expired.expires_at_ms), ShardAddCode::kExpired);

  ShardGrant conflicting = grant("s-fence-5", 50, 5);
  EXPECT_EQ(book.addShard(conflicting, kNowMs), ShardAddCode::kIdConflict);
  EXPECT_EQ(book.addShard(grant("s-zero", 0, 5), kNowMs), ShardAddCode::kInvalid);

  EXPECT_EQ(book.shardCount(), 1u);
  expectSound(book);
}

TEST_F(ShardBookTest, AHigherFenceClosesLowerFencedShards) {
  ShardBook book(options());
  ASSERT_EQ(book.addShard(grant("s-1", 100, 1), kNowMs), ShardAddCode::kOk);
  ASSERT_EQ(book.addShard(grant("s-2", 100, 2), kNowMs), ShardAddCode::kOk);
  const ShardBook::Shard* first = book.findShard("s-1");
  EXPECT_TRUE(first->account.closed());
  EXPECT_EQ(first->record.close_reason, ShardCloseReason::kFence);
  EXPECT_EQ(first->account.balances().local_retired, 100u);

  const std::vector<std::string> closed = book.noteFence({"tenant-a", "chat"}, 3, kNowMs);
  EXPECT_EQ(closed, std::vector<std::string>{"s-2"});
  EXPECT_EQ(book.usableShardCount({"tenant-a", "chat"}, kNowMs), 0u);
  EXPECT_EQ(book.reserve(reserveOf("r", 1), kNowMs), std::nullopt);
  expectSound(book);
}

// --- admission -----------------------------------------------------------------------------------

// The version the simulator's checker skips an unchanged book by: every change moves it;
// questions, audits and a tick with nothing due do not.
TEST_F(ShardBookTest, VersionMovesOnEveryChangeAndOnlyThen) {
  ShardBook book(options());
  uint64_t version = book.version();
  auto moved = [&] {
    const bool changed = book.version() != version;
    version = book.version();
    return changed;
  };
  ASSERT_EQ(book.addShard(grant("s-1", 100), kNowMs), ShardAddCode::kOk);
  EXPECT_TRUE(moved());
  ASSERT_TRUE(book.reserve(reserveOf("r-1", 10), kNowMs).has_value());
  EXPECT_TRUE(moved());
  ASSERT_EQ(book.start({.reservation_id = "r-1", .operation_id = "op-1"}, kNowMs).code,
            ReplyCode::kOk);
  EXPECT_TRUE(moved());
  expectSound(book);
  (void)book.query({.reservation_id = "r-1"});
  (void)book.shardsNeedingReport();
  (void)book.findShard("s-1");
  book.forEachShard([](const std::string&, const ShardBook::Shard&) {});
  (void)book.takeChanges();
  (void)book.tick(kNowMs + 1);  // nothing due
  EXPECT_FALSE(moved());
  ASSERT_EQ(
      book.settle({.reservation_id = "r-1", .operation_id = "op-1", .actual_units = 4}, kNowMs + 2)
          .code,
      ReplyCode::kOk);
  EXPECT_TRUE(moved());
  EXPECT_TRUE(book.close("s-1", ShardCloseReason::kRevoked, kNowMs + 3));
  EXPECT_TRUE(moved());
  (void)book.tick(kNowMs + kShardTtlMs + 1);  // expired: nothing left to close
  expectSound(book);
}

TEST_F(ShardBookTest, NeverAdmitsPastTheAllocation) {
  ShardBook book(options());
  ASSERT_EQ(book.addShard(grant("s-1", 100), kNowMs), ShardAddCode::kOk);
  Units admitted = 0;
  for (int i = 0; i < 20; ++i) {
    auto reply = book.reserve(reserveOf("r-" + std::to_string(i), 15), kNowMs);
    if (!reply.has_value()) continue;
    ASSERT_EQ(reply->code, ReplyCode::kOk);
    EXPECT_EQ(reply->receipt.origin, "s-1");
    EXPECT_EQ(reply->receipt.state, ReservationState::kReserved);
    EXPECT_EQ(reply->receipt.policy_generation, 3u);
    admitted += reply->receipt.reserved_units;
  }
  EXPECT_EQ(admitted, 90u);  // six of 15; the seventh would need 105
  EXPECT_EQ(book.reserve(reserveOf("r-big", 11), kNowMs), std::nullopt);
  auto last = book.reserve(reserveOf("r-last", 10), kNowMs);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(balancesOf(book, "s-1").local_available, 0u);
  EXPECT_EQ(book.reserve(reserveOf("r-one", 1), kNowMs), std::nullopt);
  EXPECT_EQ(book.reserve(reserveOf("r-other", 1, 1), kNowMs), std::nullopt);
  ReserveRequest other_route = reserveOf("r-route", 1);
  other_route.route = "embed";
  EXPECT_EQ(book.reserve(other_route, kNowMs), std::nullopt);
  expectSound(book);
}

TEST_F(ShardBookTest, SameIdAndDigestIsTheSameReceiptOtherDigestConflicts) {
  ShardBook book(options());
  ASSERT_EQ(book.addShard(grant("s-1", 100), kNowMs), ShardAddCode::kOk);
  auto first = book.reserve(reserveOf("r", 40, 1), kNowMs);
  ASSERT_TRUE(first.has_value());
  auto again = book.reserve(reserveOf("r", 40, 1), kNowMs + 5);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->code, ReplyCode::kOk);
  EXPECT_TRUE(again->duplicate);
  EXPECT_EQ(again->receipt, first->receipt);
  auto conflict = book.reserve(reserveOf("r", 40, 2), kNowMs);
  ASSERT_TRUE(conflict.has_value());
  EXPECT_EQ(conflict->code, ReplyCode::kIdempotencyConflict);
  EXPECT_EQ(balancesOf(book, "s-1").local_reserved, 40u);  // debited once
  // A known id is answered even when no shard is usable any more.
  ASSERT_TRUE(book.close("s-1", ShardCloseReason::kReconnect, kNowMs));
  auto after_close = book.reserve(reserveOf("r", 40, 1), kNowMs);
  ASSERT_TRUE(after_close.has_value());
  EXPECT_TRUE(after_close->duplicate);
  expectSound(book);
}

TEST_F(ShardBookTest, DuplicateSettleAndReleaseRefundZero) {
  ShardBook book(options());
  ASSERT_EQ(book.addShard(grant("s-1", 100), kNowMs), ShardAddCode::kOk);
  reserveAndStart(&book, "r-settle", 30);
  ReservationReply settled = book.settle(
      {.reservation_id = "r-settle", .operation_id = "op-r-settle", .actual_units = 10}, kNowMs);
  EXPECT_EQ(settled.code, ReplyCode::kOk);
  EXPECT_EQ(settled.refunded_units, 20u);
  EXPECT_EQ(settled.receipt.state, ReservationState::kSettled);
  ReservationReply again = book.settle(
      {.reservation_id = "r-settle", .operation_id = "op-r-settle", .actual_units = 10}, kNowMs);
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.refunded_units, 0u);
  EXPECT_EQ(
      book.settle({.reservation_id = "r-settle", .operation_id = "op-x", .actual_units = 1}, kNowMs)
          .code,
      ReplyCode::kOperationConflict);

  ASSERT_TRUE(book.reserve(reserveOf("r-release", 20), kNowMs).has_value());
  ReservationReply released = book.release({.reservation_id = "r-release"}, kNowMs);
  EXPECT_EQ(released.refunded_units, 20u);
  ReservationReply released_again = book.release({.reservation_id = "r-release"}, kNowMs);
  EXPECT_TRUE(released_again.duplicate);
  EXPECT_EQ(released_again.refunded_units, 0u);
  const ShardBalances& b = balancesOf(book, "s-1");
  EXPECT_EQ(b.local_available, 90u);
  EXPECT_EQ(b.local_spent, 10u);
  EXPECT_EQ(b.local_reserved, 0u);
  // Release of a started one is refused; start of a released one too.
  reserveAndStart(&book, "r-started", 5);
  EXPECT_EQ(book.release({.reservation_id = "r-started"}, kNowMs).code, ReplyCode::kInvalidState);
  EXPECT_EQ(book.start({.reservation_id = "r-release", .operation_id = "o"}, kNowMs).code,
            ReplyCode::kInvalidState);
  EXPECT_EQ(book.settle({.reservation_id = "nope", .operation_id = "o"}, kNowMs).code,
            ReplyCode::kNotFound);
  expectSound(book);
}

TEST_F(ShardBookTest, UsageUnknownKeepsItsUnitsUntilAReceipt) {
  ShardBook book(options());
  ASSERT_EQ(book.addShard(grant("s-1", 100), kNowMs), ShardAddCode::kOk);
  reserveAndStart(&book, "r", 40);
  ReservationReply unknown =
      book.markUnknown({.reservation_id = "r", .operation_id = "op-r"}, kNowMs);
  EXPECT_EQ(unknown.code, ReplyCode::kOk);
  EXPECT_EQ(unknown.refunded_units, 0u);
  EXPECT_EQ(unknown.receipt.state, ReservationState::kUsageUnknown);
  // Neither time, nor close, nor a tick returns them.
  (void)book.tick(kNowMs + kHoldTtlMs * 10);
  ASSERT_TRUE(book.close("s-1", ShardCloseReason::kReconnect, kNowMs));
  EXPECT_EQ(balancesOf(book, "s-1").local_reserved, 40u);
  EXPECT_EQ(balancesOf(book, "s-1").local_retired, 60u);
  ReservationReply receipt = book.reportOperation(
      {.reservation_id = "r", .operation_id = "op-r", .actual_units = 25}, kNowMs);
  EXPECT_EQ(receipt.code, ReplyCode::kOk);
  EXPECT_EQ(receipt.receipt.state, ReservationState::kSettled);
  const ShardBalances& b = balancesOf(book, "s-1");
  EXPECT_EQ(b.local_spent, 25u);
  EXPECT_EQ(b.local_retired, 75u);  // the unused part comes back retired after close
  EXPECT_EQ(b.local_reserved, 0u);
  expectSound(book);
}

TEST_F(ShardBookTest, SettleAboveTheReservationIsOverspent) {
  ShardBook book(options());
  ASSERT_EQ(book.addShard(grant("s-1", 100), kNowMs), ShardAddCode::kOk);
  reserveAndStart(&book, "r-1", 60);
  reserveAndStart(&book, "r-2", 30);
  ReservationReply over =
      book.settle({.reservation_id = "r-1", .operation_id = "op-r-1", .actual_units = 80}, kNowMs);
  EXPECT_EQ(over.receipt.state, ReservationState::kSettledWithDebt);
  EXPECT_EQ(over.receipt.debt_units, 10u);  // 20 excess, 10 from localAvailable
  const ShardBalances& b = balancesOf(book, "s-1");
  EXPECT_EQ(b.local_available, 0u);
  EXPECT_EQ(b.local_spent, 70u);
  EXPECT_EQ(b.overspent, 10u);
  EXPECT_EQ(book.reserve(reserveOf("r-3", 1), kNowMs), std::nullopt);
  expectSound(book);
}

TEST_F(ShardBookTest, CloseRetiresAndALateReleaseRetiresToo) {
  ShardBook book(options());
  ASSERT_EQ(book.addShard(grant("s-1", 100), kNowMs), ShardAddCode::kOk);
  ASSERT_TRUE(book.reserve(reserveOf("r", 30), kNowMs).has_value());
  ASSERT_TRUE(book.close("s-1", ShardCloseReason::kReconnect, kNowMs));
  EXPECT_TRUE(book.close("s-1", ShardCloseReason::kExpiry, kNowMs));  // idempotent
  EXPECT_EQ(book.findShard("s-1")->record.close_reason, ShardCloseReason::kReconnect);
  EXPECT_EQ(balancesOf(book, "s-1").local_retired, 70u);
  EXPECT_EQ(book.reserve(reserveOf("r-new", 1), kNowMs), std::nullopt);
  EXPECT_EQ(book.shardsNeedingReport(), std::vector<std::string>{"s-1"});
  ReservationReply released = book.release({.reservation_id = "r"}, kNowMs);
  EXPECT_EQ(released.code, ReplyCode::kOk);
  const ShardBalances& b = balancesOf(book, "s-1");
  EXPECT_EQ(b.local_available, 0u);
  EXPECT_EQ(b.local_retired, 100u);
  expectSound(book);
}

TEST_F(ShardBookTest, LocalReservedExpiresAfterTheHoldAndExpiryWinsOverALateStart) {
  ShardBook book(options());
  ASSERT_EQ(book.addShard(grant("s-1", 100), kNowMs), ShardAddCode::kOk);
  ASSERT_TRUE(book.reserve(reserveOf("r-tick", 10), kNowMs).has_value());
  ASSERT_TRUE(book.reserve(reserveOf("r-start", 20), kNowMs).has_value());
  EXPECT_EQ(book.tick(kNowMs + kHoldTtlMs - 1).reservations_expired, 0u);
  ReservationReply late =
      book.start({.reservation_id = "r-start", .operation_id = "o"}, kNowMs + kHoldTtlMs);
  EXPECT_EQ(late.code, ReplyCode::kExpired);
  EXPECT_EQ(late.receipt.state, ReservationState::kExpired);
  EXPECT_EQ(book.tick(kNowMs + kHoldTtlMs).reservations_expired, 1u);
  EXPECT_EQ(book.query({.reservation_id = "r-tick"}).receipt.state, ReservationState::kExpired);
  EXPECT_EQ(balancesOf(book, "s-1").local_available, 100u);
  expectSound(book);
}

TEST_F(ShardBookTest, AnExpiredShardIsClosedByTheTick) {
  ShardBook book(options());
  ASSERT_EQ(book.addShard(grant("s-1", 100), kNowMs), ShardAddCode::kOk);
  const uint64_t expires_at_ms = kNowMs + kShardTtlMs;
  EXPECT_EQ(book.usableShardCount({"tenant-a", "chat"}, expires_at_ms), 0u);
  EXPECT_EQ(book.reserve(reserveOf("r", 1), expires_at_ms), std::nullopt);
  const ShardTickOutcome outcome = book.tick(expires_at_ms);
  EXPECT_EQ(outcome.shards_closed, std::vector<std::string>{"s-1"});
  EXPECT_EQ(book.findShard("s-1")->record.close_reason, ShardCloseReason::kExpiry);
  EXPECT_EQ(balancesOf(book, "s-1").local_retired, 100u);
  expectSound(book);
}

TEST_F(ShardBookTest, CloseForReconnectClosesUsedAndNearlyExpiredShardsOnly) {
  ShardBook book(options());
  ASSERT_EQ(book.addShard(grant("s-used", 100), kNowMs), ShardAddCode::kOk);
  ShardGrant soon = grant("s-soon");
  soon.expires_at_ms = kNowMs + 1'000;
  ASSERT_EQ(book.addShard(resign(soon), kNowMs), ShardAddCode::kOk);
  ShardGrant spare = grant("s-spare");
  spare.route = "embed";
  ASSERT_EQ(book.addShard(resign(spare), kNowMs), ShardAddCode::kOk);
  // pickShard prefers the one that expires first: s-soon.
  auto reply = book.reserve(reserveOf("r", 5), kNowMs);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->receipt.origin, "s-soon");
  ASSERT_TRUE(book.close("s-soon", ShardCloseReason::kReconnect, kNowMs));
  ASSERT_TRUE(book.reserve(reserveOf("r-2", 5), kNowMs).has_value());  // from s-used
  std::vector<std::string> closed = book.closeForReconnect(kNowMs, 5'000);
  EXPECT_EQ(closed, std::vector<std::string>{"s-used"});
  EXPECT_EQ(book.openShards(), std::vector<std::string>{"s-spare"});
  closed = book.closeForReconnect(kNowMs + kShardTtlMs - 5'000, 5'000);
  EXPECT_EQ(closed, std::vector<std::string>{"s-spare"});
  // A refresh window longer than the grant's lifetime is capped at half of it.
  ASSERT_EQ(book.addShard(grant("s-short"), kNowMs), ShardAddCode::kOk);
  EXPECT_TRUE(book.closeForReconnect(kNowMs, kShardTtlMs * 2).empty());
  EXPECT_EQ(book.closeForReconnect(kNowMs + kShardTtlMs / 2, kShardTtlMs * 2),
            std::vector<std::string>{"s-short"});
  EXPECT_EQ(book.findShard("s-spare")->record.close_reason, ShardCloseReason::kExpiry);
  expectSound(book);
}

// --- reports and the ledger's answers ------------------------------------------------------------

TEST_F(ShardBookTest, TheReportCarriesBalancesAndEveryReceipt) {
  ShardBook book(options());
  const ShardGrant g = grant("s-1", 100);
  ASSERT_EQ(book.addShard(g, kNowMs), ShardAddCode::kOk);
  reserveAndStart(&book, "r-a", 30);
  ASSERT_EQ(
      book.settle({.reservation_id = "r-a", .operation_id = "op-r-a", .actual_units = 20}, kNowMs)
          .code,
      ReplyCode::kOk);
  reserveAndStart(&book, "r-b", 25);
  ASSERT_EQ(book.markUnknown({.reservation_id = "r-b", .operation_id = "op-r-b"}, kNowMs).code,
            ReplyCode::kOk);
  ASSERT_TRUE(book.reserve(reserveOf("r-c", 5), kNowMs).has_value());
  ASSERT_EQ(book.release({.reservation_id = "r-c"}, kNowMs).code, ReplyCode::kOk);
  EXPECT_EQ(book.buildReport("s-1", kNowMs), std::nullopt);  // still open
  ASSERT_TRUE(book.close("s-1", ShardCloseReason::kReconnect, kNowMs));

  const std::optional<ShardReport> report = book.buildReport("s-1", kNowMs + 9);
  ASSERT_TRUE(report.has_value());
  EXPECT_EQ(report->shard, g);
  EXPECT_EQ(report->gateway_boot_epoch, kBootEpoch);
  EXPECT_EQ(report->reported_at_ms, kNowMs + 9);
  EXPECT_EQ(report->balances, (ShardBalances{.allocated = 100,
                                             .local_available = 0,
                                             .local_reserved = 25,
                                             .local_spent = 20,
                                             .local_retired = 55}));
  ASSERT_EQ(report->receipts.size(), 3u);
  EXPECT_EQ(report->receipts[0].reservation_id, "r-a");
  EXPECT_EQ(report->receipts[0].state, ReservationState::kSettled);
  EXPECT_EQ(report->receipts[0].actual_units, 20u);
  EXPECT_EQ(report->receipts[1].state, ReservationState::kUsageUnknown);
  EXPECT_EQ(report->receipts[2].state, ReservationState::kReleased);
  for (const Reservation& receipt : report->receipts) EXPECT_EQ(receipt.origin, "s-1");
  EXPECT_EQ(report->signature, Signature{});  // the shell signs it
}

TEST_F(ShardBookTest, ReconcilingIsReportedAgainWhenAHoldingReceiptResolves) {
  ShardBook book(options());
  ASSERT_EQ(book.addShard(grant("s-1", 100), kNowMs), ShardAddCode::kOk);
  reserveAndStart(&book, "r", 40);
  ASSERT_EQ(book.markUnknown({.reservation_id = "r", .operation_id = "op-r"}, kNowMs).code,
            ReplyCode::kOk);
  ASSERT_TRUE(book.close("s-1", ShardCloseReason::kReconnect, kNowMs));
  ShardLedgerView view{.grant = grant("s-1", 100),
                       .state = ShardState::kReconciling,
                       .current_fence = 1,
                       .reminted_units = 60,
                       .retired_units = 40,
                       .reported = true,
                       .last_reported = balancesOf(book, "s-1")};
  ShardAnswerOutcome outcome = book.onLedgerAnswer("s-1", view, kNowMs);
  EXPECT_TRUE(outcome.acknowledged);
  EXPECT_FALSE(outcome.became_final);
  EXPECT_TRUE(book.shardsNeedingReport().empty());

  ASSERT_EQ(book.reportOperation(
                    {.reservation_id = "r", .operation_id = "op-r", .actual_units = 40}, kNowMs)
                .code,
            ReplyCode::kOk);
  EXPECT_EQ(book.shardsNeedingReport(), std::vector<std::string>{"s-1"});
  // A stale answer (for the earlier balances) does not acknowledge the new ones.
  outcome = book.onLedgerAnswer("s-1", view, kNowMs);
  EXPECT_FALSE(outcome.acknowledged);
  EXPECT_EQ(book.shardsNeedingReport(), std::vector<std::string>{"s-1"});

  view.state = ShardState::kReconciled;
  view.last_reported = balancesOf(book, "s-1");
  outcome = book.onLedgerAnswer("s-1", view, kNowMs + 100);
  EXPECT_TRUE(outcome.became_final);
  EXPECT_TRUE(book.shardsNeedingReport().empty());
  // Kept for retention so a retried id is answered locally, then forgotten with its receipts.
  EXPECT_TRUE(book.tick(kNowMs + 100 + 9'999).shards_forgotten.empty());
  EXPECT_TRUE(book.reserve(reserveOf("r", 40), kNowMs + 10'000)->duplicate);
  (void)book.takeChanges();
  EXPECT_EQ(book.tick(kNowMs + 100 + 10'000).shards_forgotten, std::vector<std::string>{"s-1"});
  EXPECT_FALSE(book.ownsReservation("r"));
  const ShardBookChanges changes = book.takeChanges();
  EXPECT_EQ(changes.shards_deleted, std::vector<std::string>{"s-1"});
  EXPECT_EQ(changes.reservations_deleted, std::vector<std::string>{"r"});
}

TEST_F(ShardBookTest, ARevokedOrFencedAnswerClosesTheShard) {
  ShardBook book(options());
  ASSERT_EQ(book.addShard(grant("s-1", 100, 1), kNowMs), ShardAddCode::kOk);
  ASSERT_EQ(book.addShard(grant("s-2", 100, 1), kNowMs), ShardAddCode::kOk);
  ShardLedgerView revoked{.grant = grant("s-1"), .state = ShardState::kRevoked, .current_fence = 1};
  EXPECT_TRUE(book.onLedgerAnswer("s-1", revoked, kNowMs).closed_now);
  EXPECT_EQ(book.findShard("s-1")->record.close_reason, ShardCloseReason::kRevoked);
  EXPECT_FALSE(book.findShard("s-2")->account.closed());
  ShardLedgerView fenced{.grant = grant("s-2"), .state = ShardState::kIssued, .current_fence = 2};
  EXPECT_TRUE(book.onLedgerAnswer("s-2", fenced, kNowMs).closed_now);
  EXPECT_EQ(book.findShard("s-2")->record.close_reason, ShardCloseReason::kFence);
  EXPECT_EQ(book.highestFence({"tenant-a", "chat"}), 2u);
  EXPECT_EQ(book.shardsNeedingReport(), (std::vector<std::string>{"s-1", "s-2"}));
  expectSound(book);
}

// --- boot ---------------------------------------------------------------------------------------

TEST_F(ShardBookTest, RestoreClosesEarlierBootEpochsAndQuarantinesBadGrants) {
  ShardBook before(options());
  ASSERT_EQ(before.addShard(grant("s-good", 100), kNowMs), ShardAddCode::kOk);
  reserveAndStart(&before, "r", 10);
  ASSERT_EQ(before.addShard(grant("s-bad", 50, 1), kNowMs), ShardAddCode::kOk);

  ShardBookOptions next = options();
  next.boot_epoch = kBootEpoch + 1;
  ShardBook after(next);
  after.restoreFence({"tenant-a", "chat"}, before.highestFence({"tenant-a", "chat"}));
  before.forEachShard([&](const std::string& id, const ShardBook::Shard& shard) {
    StoredShard stored{.shard_id = id,
                       .grant_decoded = true,
                       .record = shard.record,
                       .balances = shard.account.balances(),
                       .closed = shard.account.closed()};
    if (id == "s-bad") stored.record.grant.allocated_units = 5'000;  // a tampered blob
    if (id == "s-bad")
      stored.balances = ShardBalances{.allocated = 5'000, .local_available = 5'000};
    ASSERT_TRUE(after.restoreShard(stored).isOk());
  });
  ASSERT_TRUE(after.restoreReservation(*before.findReservation("r")).isOk());
  Result<ShardRestoreReport> report = after.finishRestore(kNowMs + 1);
  ASSERT_TRUE(report.isOk());
  EXPECT_EQ(report.value().quarantined, std::vector<std::string>{"s-bad"});
  EXPECT_EQ(report.value().closed_at_boot, std::vector<std::string>{"s-good"});
  EXPECT_EQ(after.findShard("s-good")->record.close_reason, ShardCloseReason::kBootEpoch);
  EXPECT_EQ(after.findShard("s-bad")->record.close_reason, ShardCloseReason::kQuarantined);
  EXPECT_EQ(after.usableShardCount({"tenant-a", "chat"}, kNowMs + 1), 0u);
  EXPECT_EQ(after.shardsNeedingReport(), std::vector<std::string>{"s-good"});
  EXPECT_EQ(after.buildReport("s-bad", kNowMs + 1), std::nullopt);
  // Reservations of the old boot keep their state machine.
  EXPECT_EQ(
      after.settle({.reservation_id = "r", .operation_id = "op-r", .actual_units = 10}, kNowMs + 2)
          .code,
      ReplyCode::kOk);
  EXPECT_EQ(after.findShard("s-good")->account.balances().local_spent, 10u);
  // The restored shard of the old boot epoch can never be added again either.
  EXPECT_EQ(after.addShard(grant("s-new", 100), kNowMs), ShardAddCode::kWrongBootEpoch);
  const ShardBookChanges changes = after.takeChanges();
  EXPECT_EQ(changes.shards_upserted, (std::vector<std::string>{"s-bad", "s-good"}));
  expectSound(after);
}

TEST_F(ShardBookTest, RestoreRefusesInconsistentRows) {
  ShardBook book(options());
  StoredShard stored{.shard_id = "s-1",
                     .grant_decoded = true,
                     .record = {.grant = grant("s-1", 100)},
                     .balances = {.allocated = 100, .local_available = 60, .local_reserved = 40},
                     .closed = false};
  ASSERT_TRUE(book.restoreShard(stored).isOk());
  EXPECT_FALSE(book.restoreShard(stored).isOk());  // twice
  Reservation orphan{.reservation_id = "r-x",
                     .reserved_units = 1,
                     .state = ReservationState::kReserved,
                     .origin = "s-none"};
  EXPECT_FALSE(book.restoreReservation(orphan).isOk());
  // localReserved 40 but no reservation holds anything.
  EXPECT_FALSE(book.finishRestore(kNowMs).isOk());
}

}  // namespace
}  // namespace tally
