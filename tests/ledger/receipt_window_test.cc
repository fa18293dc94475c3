// Issue 13: a terminal reservation leaves the live table for the packed receipt archive once its
// final image is durable, and a restart puts the store's receipts straight into the archive. A
// repeat of any request about it within the idempotency window is still answered with the same
// bytes it was answered with while the reservation was live: from the archive, and after a
// restart through the real store.

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "core/ledger.h"
#include "ledger/restore.h"
#include "ledger/sqlite_store.h"
#include "ledger/store_batch.h"
#include "wire/codec.h"

namespace tally::ledger {
namespace {

constexpr uint64_t kT0 = 1'700'000'000'000;
constexpr uint64_t kRetentionMs = 600'000;
constexpr uint64_t kHoldTtlMs = 30'000;
constexpr uint64_t kHardLimitMs = 60'000;

using Request = std::variant<ReserveRequest, StartRequest, SettleRequest, ReleaseRequest,
                             MarkUnknownRequest, ReportOperationRequest, QueryRequest>;

ReserveRequest reserveOf(const std::string& id, Units units) {
  ReserveRequest r{
      .reservation_id = id, .subject = "tenant-1", .route = "/v1/chat", .units = units};
  r.request_digest.fill(static_cast<uint8_t>(id.size() + units));
  return r;
}

class ReceiptWindowTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char pattern[] = "/tmp/tally-receipt-window-XXXXXX";
    const char* made = ::mkdtemp(pattern);
    ASSERT_NE(made, nullptr) << std::strerror(errno);
    dir_ = made;
    openStore();
    ledger_ = std::make_unique<Ledger>(LedgerOptions{.retention_ms = kRetentionMs});
    const Budget budget{.subject_pattern = "tenant-*",
                        .route = "/v1/chat",
                        .unit = "tokens",
                        .refill_per_second = 0,
                        .burst = 1'000,
                        .max_single_reservation = 500,
                        .hold_ttl_ms = kHoldTtlMs,
                        .hard_execution_limit_ms = kHardLimitMs,
                        .max_overdraft = 1'000};
    ASSERT_EQ(ledger_->publishPolicy(Policy{.budgets = {budget}}, kT0).code, ReplyCode::kOk);
    persist(kT0);
  }
  void TearDown() override {
    store_.reset();
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }

  void openStore() {
    store_.reset();
    Result<std::unique_ptr<SqliteStore>> store = SqliteStore::open(dir_ + "/data");
    ASSERT_TRUE(store.isOk()) << store.status().toString();
    store_ = std::move(store).value();
  }

  // What the server does after each batch and each tick that changed something.
  void persist(uint64_t now_ms) {
    LedgerChangedRows rows = ledger_->takeChangedRows();
    ASSERT_TRUE(store_->commit(storeBatchOf(*ledger_, &rows, now_ms)).isOk());
  }

  // The framed reply to `request`, as the server would send it; the batch persisted.
  std::vector<uint8_t> answer(const Request& request, uint64_t now_ms) {
    const ReservationReply reply = std::visit(
        [&](const auto& r) -> ReservationReply {
          using R = std::decay_t<decltype(r)>;
          if constexpr (std::is_same_v<R, ReserveRequest>) return ledger_->reserve(r, now_ms);
          if constexpr (std::is_same_v<R, StartRequest>) return ledger_->start(r, now_ms);
          if constexpr (std::is_same_v<R, SettleRequest>) return ledger_->settle(r, now_ms);
          if constexpr (std::is_same_v<R, ReleaseRequest>) return ledger_->release(r, now_ms);
          if constexpr (std::is_same_v<R, MarkUnknownRequest>)
            return ledger_->markUnknown(r, now_ms);
          if constexpr (std::is_same_v<R, ReportOperationRequest>) {
            return ledger_->reportOperation(r, now_ms);
          }
          if constexpr (std::is_same_v<R, QueryRequest>) return ledger_->query(r);
        },
        request);
    persist(now_ms);
    Result<std::vector<uint8_t>> frame =
        wire::encodeResponseFrame(wire::Response{.request_id = 7, .body = reply});
    EXPECT_TRUE(frame.isOk());
    return frame.isOk() ? std::move(frame).value() : std::vector<uint8_t>{};
  }

  // One tick, its changes persisted: closed reservations whose image is durable are archived.
  void tickAndPersist(uint64_t now_ms) {
    (void)ledger_->tick(now_ms);
    persist(now_ms);
  }

  std::string dir_;
  std::unique_ptr<SqliteStore> store_;
  std::unique_ptr<Ledger> ledger_;
};

TEST_F(ReceiptWindowTest, RepeatsOfArchivedReceiptsAreAnsweredByteForByteAlsoAfterARestart) {
  const uint64_t t = kT0 + 1'000;
  // One reservation in each terminal state, and the repeats a client might send about each,
  // answered while the reservation is still in the live table (a closed one stays there until
  // the tick after its final image was taken).
  const std::vector<Request> repeats = {
      reserveOf("settled", 100),
      StartRequest{"settled", "op-s"},
      SettleRequest{"settled", "op-s", 80},
      QueryRequest{"settled"},
      reserveOf("settled", 99),  // a conflict
      reserveOf("released", 50),
      ReleaseRequest{"released"},
      StartRequest{"released", "op-x"},
      reserveOf("rejected", 501),
      QueryRequest{"rejected"},
      reserveOf("expired", 10),
      StartRequest{"expired", "op-e"},
      reserveOf("closed", 20),
      MarkUnknownRequest{"closed", "op-c"},
      QueryRequest{"closed"},
  };
  std::vector<std::vector<uint8_t>> live(repeats.size());
  auto answerLive = [&](size_t first, size_t last, uint64_t now_ms) {
    for (size_t i = first; i < last; ++i) live[i] = answer(repeats[i], now_ms);
  };
  ASSERT_NO_FATAL_FAILURE(answer(reserveOf("settled", 100), t));
  ASSERT_NO_FATAL_FAILURE(answer(StartRequest{"settled", "op-s"}, t));
  ASSERT_NO_FATAL_FAILURE(answer(SettleRequest{"settled", "op-s", 80}, t));
  ASSERT_NO_FATAL_FAILURE(answer(reserveOf("released", 50), t));
  ASSERT_NO_FATAL_FAILURE(answer(ReleaseRequest{"released"}, t));
  ASSERT_NO_FATAL_FAILURE(answer(reserveOf("rejected", 501), t));  // above max single
  ASSERT_NO_FATAL_FAILURE(answer(reserveOf("expired", 10), t));
  ASSERT_NO_FATAL_FAILURE(answer(reserveOf("closed", 20), t));
  ASSERT_NO_FATAL_FAILURE(answer(StartRequest{"closed", "op-c"}, t));
  ASSERT_NO_FATAL_FAILURE(answer(MarkUnknownRequest{"closed", "op-c"}, t));
  answerLive(0, 10, t);
  EXPECT_EQ(ledger_->receiptCount(), 0u);
  // Expiry of "expired" (the same tick archives the first three), then the hard-limit close of
  // "closed" (as fully consumed); each answered before the next tick.
  tickAndPersist(t + kHoldTtlMs);
  EXPECT_EQ(ledger_->receiptCount(), 3u);
  answerLive(10, 12, t + kHoldTtlMs);
  const uint64_t closed_at = t + kHardLimitMs;
  tickAndPersist(closed_at);
  EXPECT_EQ(ledger_->receiptCount(), 4u);
  answerLive(12, 15, closed_at);
  const uint64_t live_at = closed_at;

  const AuditReport audit_before = ledger_->audit(live_at);
  uint64_t now = live_at + 1;
  for (size_t i = 0; i < repeats.size(); ++i, ++now) {
    tickAndPersist(now);  // re-archives what the last repeat took back
    ASSERT_EQ(ledger_->liveReservationCount(), 0u) << i;
    ASSERT_EQ(ledger_->receiptCount(), 5u);
    EXPECT_EQ(answer(repeats[i], now), live[i]) << "repeat " << i << " from the archive";
  }
  EXPECT_EQ(ledger_->audit(now).accounts, audit_before.accounts);

  // Restart: a new store over the same files and a new Ledger; the receipts go straight to the
  // archive and every repeat is answered with the same bytes.
  openStore();
  ledger_ = std::make_unique<Ledger>(LedgerOptions{.retention_ms = kRetentionMs});
  Result<RestoreSummary> restored = restoreLedger(store_.get(), ledger_.get(), now);
  ASSERT_TRUE(restored.isOk()) << restored.status().toString();
  EXPECT_EQ(ledger_->liveReservationCount(), 0u);
  EXPECT_EQ(ledger_->receiptCount(), 5u);
  for (size_t i = 0; i < repeats.size(); ++i, ++now) {
    tickAndPersist(now);
    ASSERT_EQ(ledger_->liveReservationCount(), 0u) << i;
    EXPECT_EQ(answer(repeats[i], now), live[i]) << "repeat " << i << " after the restart";
  }
  EXPECT_EQ(ledger_->audit(now).accounts, audit_before.accounts);

  // Past the window they are compacted, from memory and from the store.
  tickAndPersist(closed_at + kRetentionMs + kRetentionMs / 16);
  EXPECT_EQ(ledger_->reservationCount(), 0u);
  EXPECT_EQ(ledger_->query({.reservation_id = "settled"}).code, ReplyCode::kNotFound);
  openStore();
  Result<StoreContents> contents = store_->load();
  ASSERT_TRUE(contents.isOk());
  EXPECT_TRUE(contents.value().reservations.empty());
}

TEST_F(ReceiptWindowTest, ALateReceiptForAnArchivedHardLimitCloseIsChargedOnceAndSurvivesRestart) {
  const uint64_t t = kT0 + 1'000;
  ASSERT_NO_FATAL_FAILURE(answer(reserveOf("late", 100), t));
  ASSERT_NO_FATAL_FAILURE(answer(StartRequest{"late", "op"}, t));
  ASSERT_NO_FATAL_FAILURE(answer(MarkUnknownRequest{"late", "op"}, t));
  tickAndPersist(t + kHardLimitMs);  // closed as fully consumed
  tickAndPersist(t + kHardLimitMs + 1);
  ASSERT_EQ(ledger_->liveReservationCount(), 0u);
  ASSERT_EQ(ledger_->receiptCount(), 1u);

  // The receipt, 150 units (50 more than the close charged), arrives for the archived record.
  const uint64_t late_at = t + kHardLimitMs + 10;
  const ReportOperationRequest report{"late", "op", 150};
  const std::vector<uint8_t> first = answer(report, late_at);
  const Reservation* charged = ledger_->findReservation("late");
  ASSERT_NE(charged, nullptr);
  EXPECT_TRUE(charged->late_receipt_applied);
  EXPECT_EQ(charged->state, ReservationState::kSettledWithDebt);
  const AuditReport after_charge = ledger_->audit(late_at);
  ASSERT_TRUE(after_charge.conserved);

  tickAndPersist(late_at + 1);
  ASSERT_EQ(ledger_->liveReservationCount(), 0u);
  const std::vector<uint8_t> repeat = answer(report, late_at + 2);
  EXPECT_NE(repeat, first);  // the repeat is marked a duplicate, and charges nothing
  EXPECT_EQ(ledger_->audit(late_at + 2).accounts, after_charge.accounts);

  openStore();
  ledger_ = std::make_unique<Ledger>(LedgerOptions{.retention_ms = kRetentionMs});
  ASSERT_TRUE(restoreLedger(store_.get(), ledger_.get(), late_at + 3).isOk());
  EXPECT_EQ(answer(report, late_at + 3), repeat);
  EXPECT_EQ(ledger_->audit(late_at + 3).accounts, after_charge.accounts);
}

}  // namespace
}  // namespace tally::ledger
