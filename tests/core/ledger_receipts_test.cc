// Issue 13: the Ledger's memory is O(live reservations + accounts), whatever it has served: a
// closed reservation leaves the live table for the packed receipt archive (bounded by the window
// and by receipt_bytes_max), and a repeat within the window is answered from it.

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "core/ledger.h"

namespace tally {
namespace {

constexpr uint64_t kT0 = 1'700'000'000'000;

Policy policy() {
  return Policy{.budgets = {Budget{.subject_pattern = "tenant-*",
                                   .route = "/v1/chat",
                                   .unit = "tokens",
                                   .refill_per_second = 1'000'000,
                                   .burst = 1'000'000,
                                   .max_single_reservation = 1'000,
                                   .hold_ttl_ms = 30'000,
                                   .hard_execution_limit_ms = 60'000,
                                   .max_overdraft = 0}}};
}

ReserveRequest reserveOf(const std::string& id, Units units = 10) {
  ReserveRequest r{
      .reservation_id = id, .subject = "tenant-1", .route = "/v1/chat", .units = units};
  r.request_digest.fill(7);
  return r;
}

// One cycle as the benchmark makes it: reserve, start, settle; the shell takes the changes.
void cycle(Ledger* ledger, const std::string& id, uint64_t now_ms) {
  ASSERT_EQ(ledger->reserve(reserveOf(id), now_ms).code, ReplyCode::kOk);
  ASSERT_EQ(ledger->start({.reservation_id = id, .operation_id = "op"}, now_ms).code,
            ReplyCode::kOk);
  ASSERT_EQ(
      ledger->settle({.reservation_id = id, .operation_id = "op", .actual_units = 5}, now_ms).code,
      ReplyCode::kOk);
}

// `cycles` cycles (ids r-*n, r-*n+1, ...), then a tick between two takes, as the shell does.
void cyclesThenTick(Ledger* ledger, int cycles, uint64_t now_ms, uint64_t* n) {
  for (int i = 0; i < cycles; ++i)
    ASSERT_NO_FATAL_FAILURE(cycle(ledger, "r-" + std::to_string((*n)++), now_ms));
  (void)ledger->takeChangedRows();
  (void)ledger->tick(now_ms);
  (void)ledger->takeChangedRows();
}

TEST(LedgerReceiptsTest, SustainedCyclesKeepTheLiveTableEmptyAndTheReceiptsToTheWindow) {
  constexpr uint64_t kRetentionMs = 500;
  constexpr int kCyclesPerMs = 10;
  Ledger ledger({.retention_ms = kRetentionMs});
  ASSERT_EQ(ledger.publishPolicy(policy(), kT0).code, ReplyCode::kOk);
  // 10 cycles per ms for 10 windows; a tick (and a take) every ms, as the shell does.
  uint64_t n = 0;
  uint64_t bytes_after_two_windows = 0;
  uint64_t bytes_peak = 0;
  for (uint64_t ms = 1; ms <= 10 * kRetentionMs; ++ms) {
    const uint64_t now = kT0 + ms;
    ASSERT_NO_FATAL_FAILURE(cyclesThenTick(&ledger, kCyclesPerMs, now, &n));
    ASSERT_LE(ledger.liveReservationCount(),
              uint64_t{kCyclesPerMs});  // only the last ms's, not yet archived
    ASSERT_LE(ledger.receiptCount(), kCyclesPerMs * (kRetentionMs + kRetentionMs / 16 + 1));
    if (ms == 2 * kRetentionMs) bytes_after_two_windows = ledger.receiptBytes();
    if (ms > 2 * kRetentionMs) bytes_peak = std::max(bytes_peak, ledger.receiptBytes());
  }
  // Flat after the first windows (chunks come and go; the index stays).
  EXPECT_LE(bytes_peak, bytes_after_two_windows + bytes_after_two_windows / 10);
  // Packed: ~120 bytes a receipt here and an index entry (8 bytes, the index at least 35% full),
  // plus each span's last, partly filled 64 KiB chunk; a live record costs ~600.
  const uint64_t receipts = ledger.receiptCount();
  EXPECT_LE(bytes_peak, receipts * (128 + 24) + 18 * 65'536 + 4'096);
  // The window's receipts still answer; older ones are compacted.
  const ReservationReply repeat =
      ledger.reserve(reserveOf("r-" + std::to_string(n - 1)), kT0 + 10 * kRetentionMs);
  EXPECT_TRUE(repeat.duplicate);
  EXPECT_EQ(repeat.receipt.state, ReservationState::kSettled);
  EXPECT_EQ(ledger.query({.reservation_id = "r-0"}).code, ReplyCode::kNotFound);
  EXPECT_TRUE(ledger.audit(kT0 + 10 * kRetentionMs).conserved);
}

TEST(LedgerReceiptsTest, SustainedCyclesKeepTheDeadlineQueuesToTheLiveReservations) {
  // Every reserve queues its expiry, due hold_ttl_ms (30 s here) later. The cycles settle at
  // once, so the entries go stale; without compaction 2 s of cycles would leave 20,000 of them.
  constexpr int kCyclesPerMs = 10;
  constexpr uint64_t kRunMs = 2'000;
  Ledger ledger({.retention_ms = 500});
  ASSERT_EQ(ledger.publishPolicy(policy(), kT0).code, ReplyCode::kOk);
  // Two that must still fall due after every compaction: a hold nobody starts, and a started
  // one whose outcome became unknown (closed by the hard execution limit, 60 s).
  ASSERT_EQ(ledger.reserve(reserveOf("held"), kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger.reserve(reserveOf("unknown"), kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger.start({.reservation_id = "unknown", .operation_id = "op"}, kT0).code,
            ReplyCode::kOk);
  ASSERT_EQ(ledger.markUnknown({.reservation_id = "unknown", .operation_id = "op"}, kT0).code,
            ReplyCode::kOk);
  uint64_t n = 0;
  size_t queued_peak = 0;
  for (uint64_t ms = 1; ms <= kRunMs; ++ms) {
    const uint64_t now = kT0 + ms;
    ASSERT_NO_FATAL_FAILURE(cyclesThenTick(&ledger, kCyclesPerMs, now, &n));
    const size_t kept_max = 2 * (2 * ledger.liveReservationCount() + Ledger::kDeadlinesKeptMin);
    ASSERT_LE(ledger.deadlinesQueued(), kept_max) << "at ms " << ms;
    queued_peak = std::max(queued_peak, ledger.deadlinesQueued());
  }
  EXPECT_GT(n, 2 * queued_peak);  // the bound is well below what the cycles queued
  // The two still fall due at their own times.
  const uint64_t expiry_ms = kT0 + 30'000;
  (void)ledger.tick(expiry_ms - 1);
  EXPECT_EQ(ledger.query({.reservation_id = "held"}).receipt.state, ReservationState::kReserved);
  (void)ledger.tick(expiry_ms);
  EXPECT_EQ(ledger.query({.reservation_id = "held"}).receipt.state, ReservationState::kExpired);
  const uint64_t hard_limit_ms = kT0 + 60'000;
  (void)ledger.tick(hard_limit_ms - 1);
  EXPECT_EQ(ledger.query({.reservation_id = "unknown"}).receipt.state,
            ReservationState::kUsageUnknown);
  (void)ledger.tick(hard_limit_ms);
  const ReservationReply closed = ledger.query({.reservation_id = "unknown"});
  EXPECT_EQ(closed.receipt.state, ReservationState::kSettled);
  EXPECT_TRUE(closed.receipt.closed_by_hard_limit);
  EXPECT_TRUE(ledger.audit(hard_limit_ms).conserved);
}

TEST(LedgerReceiptsTest, NewReservationsAreRefusedWhileTheReceiptBudgetIsFullRepeatsStillAnswer) {
  Ledger ledger({.retention_ms = 10'000, .receipt_bytes_max = 1});
  ASSERT_EQ(ledger.publishPolicy(policy(), kT0).code, ReplyCode::kOk);
  ASSERT_NO_FATAL_FAILURE(cycle(&ledger, "a", kT0));
  (void)ledger.takeChangedRows();
  (void)ledger.tick(kT0 + 1);
  ASSERT_EQ(ledger.receiptCount(), 1u);
  const AuditReport before = ledger.audit(kT0 + 2);
  const ReservationReply refused = ledger.reserve(reserveOf("b"), kT0 + 2);
  EXPECT_EQ(refused.code, ReplyCode::kResourceExhausted);
  EXPECT_NE(refused.message.find("receipt_bytes_max"), std::string::npos) << refused.message;
  EXPECT_EQ(ledger.findReservation("b"), nullptr);
  EXPECT_EQ(ledger.audit(kT0 + 2).accounts, before.accounts);
  EXPECT_TRUE(ledger.takeChanges().empty());  // nothing changed
  const ReservationReply repeat = ledger.reserve(reserveOf("a"), kT0 + 2);
  EXPECT_EQ(repeat.code, ReplyCode::kOk);
  EXPECT_TRUE(repeat.duplicate);
}

TEST(LedgerReceiptsTest, AClosedReservationIsArchivedOnlyAfterItsImageWasTaken) {
  Ledger ledger({.retention_ms = 10'000});
  ASSERT_EQ(ledger.publishPolicy(policy(), kT0).code, ReplyCode::kOk);
  ASSERT_NO_FATAL_FAILURE(cycle(&ledger, "a", kT0));
  (void)ledger.tick(kT0 + 1);  // its settle not taken yet: stays live
  EXPECT_EQ(ledger.liveReservationCount(), 1u);
  const LedgerChanges changes = ledger.takeChanges();
  ASSERT_EQ(changes.reservations_upserted.size(), 1u);
  (void)ledger.tick(kT0 + 2);
  EXPECT_EQ(ledger.liveReservationCount(), 0u);
  EXPECT_EQ(ledger.receiptCount(), 1u);
  EXPECT_EQ(ledger.reservationCount(), 1u);
  EXPECT_TRUE(ledger.takeChanges().empty());  // archiving is not a durable change
  // Compacted exactly at closedAt + retention, and its deletion is named.
  EXPECT_EQ(ledger.tick(kT0 + 9'999).compacted, 0u);
  EXPECT_EQ(ledger.tick(kT0 + 10'000).compacted, 1u);
  EXPECT_EQ(ledger.takeChanges().reservations_deleted, std::vector<std::string>{"a"});
}

}  // namespace
}  // namespace tally
