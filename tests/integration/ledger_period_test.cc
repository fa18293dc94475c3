// Accounting-period close (SPEC §4, issue 9) with the real tally-ledger: a data dir whose
// accounts' open period began two hourly epochs ago (the ledger was down across two
// boundaries) is closed by the first tick after start as one snapshot covering both epochs,
// served by `audit --period`, durable across a restart and never closed twice.
//
// Time is injected through the data dir (the ledger's clock is restored from it and never runs
// backwards), not by waiting for a real boundary: the test edits the stored accounts' open
// period with the store API while the ledger is stopped.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <variant>

#include "core/period_close.h"
#include "ledger/sqlite_store.h"
#include "tests/integration/ledger_harness.h"
#include "tests/support/temp_dir.h"

namespace tally::testing {
namespace {

constexpr uint64_t kHourMs = 3'600'000;
constexpr uint64_t kPollMs = 20;
constexpr uint64_t kPollRounds = 500;  // 10 s: the ledger ticks every 100 ms by default

Result<wire::ResponseBody> auditPeriods(client::BlockingClient& client,
                                        std::optional<uint64_t> period, bool list) {
  Result<wire::Response> response =
      client.call(wire::AuditRequest{.period = period, .list_periods = list}, kCallTimeoutMs);
  if (!response.isOk()) return response.status();
  return std::move(response).value().body;
}

// Moves every stored account's open period back by `epochs` hourly epochs.
void agePeriods(const std::string& data_dir, uint64_t epochs) {
  Result<std::unique_ptr<ledger::SqliteStore>> store = ledger::SqliteStore::open(data_dir);
  ASSERT_TRUE(store.isOk()) << store.status().toString();
  Result<ledger::StoreContents> contents = store.value()->load();
  ASSERT_TRUE(contents.isOk()) << contents.status().toString();
  ledger::StoreBatch batch{.ledger_clock_ms = contents.value().ledger_clock_ms};
  for (ledger::AccountRecord account : contents.value().accounts) {
    ASSERT_GE(account.period.epoch_first, epochs);
    account.period.epoch_first -= epochs;
    account.period.opened_at_ms -= epochs * kHourMs;
    batch.accounts.push_back(account);
  }
  ASSERT_FALSE(batch.accounts.empty());
  ASSERT_TRUE(store.value()->commit(batch).isOk());
}

// Polls `audit --periods` until a closed period is listed (the first tick's batch committed).
std::vector<PeriodSpan> waitForClosedPeriods(client::BlockingClient& client) {
  for (uint64_t round = 0; round < kPollRounds; ++round) {
    Result<wire::ResponseBody> body = auditPeriods(client, std::nullopt, true);
    EXPECT_TRUE(body.isOk()) << body.status().toString();
    if (!body.isOk()) return {};
    const auto* report = std::get_if<AuditReport>(&body.value());
    EXPECT_NE(report, nullptr) << wire::describe(body.value());
    if (report == nullptr) return {};
    if (!report->closed_periods.empty()) return report->closed_periods;
    pauseMs(kPollMs);
  }
  ADD_FAILURE() << "no period closed within " << kPollRounds * kPollMs << " ms";
  return {};
}

TEST(LedgerPeriodTest, ALedgerDownAcrossBoundariesClosesTheGapOnceAndKeepsItDurably) {
  TempDir dir;
  const std::string data_dir = dir.file("data");
  {
    LedgerInstance ledger(data_dir, dir.file("ledger.log"));
    ASSERT_TRUE(ledger.start().isOk()) << ledger.log();
    auto client = ledger.connect();
    ASSERT_TRUE(client.isOk()) << client.status().toString();
    ASSERT_TRUE(publishPolicy(*client.value(), {makeBudget({.burst = 1000})}).isOk());
    ASSERT_TRUE(callReservation(*client.value(), makeReserve({.id = "a", .units = 600})).isOk());
    ASSERT_TRUE(
        callReservation(*client.value(), StartRequest{.reservation_id = "a", .operation_id = "op"})
            .isOk());
    ASSERT_TRUE(callReservation(
                    *client.value(),
                    SettleRequest{.reservation_id = "a", .operation_id = "op", .actual_units = 450})
                    .isOk());
    // Nothing has closed yet: the account's period is the current epoch.
    Result<wire::ResponseBody> none = auditPeriods(*client.value(), std::nullopt, true);
    ASSERT_TRUE(none.isOk());
    ASSERT_TRUE(std::holds_alternative<AuditReport>(none.value()));
    EXPECT_TRUE(std::get<AuditReport>(none.value()).closed_periods.empty());
    EXPECT_EQ(ledger.terminate(), 0) << ledger.log();
  }
  ASSERT_NO_FATAL_FAILURE(agePeriods(data_dir, 2));

  LedgerInstance ledger(data_dir, dir.file("ledger.log"));
  ASSERT_TRUE(ledger.start().isOk()) << ledger.log();
  auto client = ledger.connect();
  ASSERT_TRUE(client.isOk()) << client.status().toString();
  const std::vector<PeriodSpan> spans = waitForClosedPeriods(*client.value());
  ASSERT_GE(spans.size(), 1u);  // 2 only if a real hour boundary passes right now
  const PeriodSpan span = spans[0];
  EXPECT_EQ(span.epoch_last, span.epoch_first + 1);  // one snapshot for the whole gap
  EXPECT_EQ(span.accounts, 1u);
  EXPECT_TRUE(span.conserved);

  for (uint64_t epoch : {span.epoch_first, span.epoch_last}) {
    Result<wire::ResponseBody> body = auditPeriods(*client.value(), epoch, false);
    ASSERT_TRUE(body.isOk()) << body.status().toString();
    const auto* report = std::get_if<AuditReport>(&body.value());
    ASSERT_NE(report, nullptr) << wire::describe(body.value());
    EXPECT_TRUE(report->conserved);
    EXPECT_EQ(report->period_epoch, epoch);
    ASSERT_EQ(report->period_snapshots.size(), 1u);
    const PeriodSnapshot& snapshot = report->period_snapshots[0];
    EXPECT_EQ(snapshot.key, (AccountKey{"tenant-1", "chat", 1}));
    EXPECT_EQ(snapshot.opening, Balances{});  // the account opened in this period
    EXPECT_EQ(snapshot.closing.opening, 1000u);
    EXPECT_EQ(snapshot.closing.spent, 450u);
    EXPECT_EQ(snapshot.closing.available, 550u);
    EXPECT_TRUE(snapshot.conserved);
    // The balances now are the snapshot's: closing a period changed none.
    Result<AuditReport> audit = auditLedger(*client.value());
    ASSERT_TRUE(audit.isOk());
    ASSERT_EQ(audit.value().accounts.size(), 1u);
    EXPECT_EQ(audit.value().accounts[0].balances, snapshot.closing);
  }
  // The open period is no closed one: a typed NOT_FOUND naming what is kept.
  Result<wire::ResponseBody> open = auditPeriods(*client.value(), span.epoch_last + 1, false);
  ASSERT_TRUE(open.isOk());
  const auto* error = std::get_if<wire::ErrorReply>(&open.value());
  ASSERT_NE(error, nullptr) << wire::describe(open.value());
  EXPECT_EQ(error->code, wire::ErrorCode::kNotFound);
  EXPECT_NE(error->message.find("no closed accounting period covers epoch " +
                                std::to_string(span.epoch_last + 1)),
            std::string::npos)
      << error->message;

  // After a restart the snapshot is still there, and nothing is closed a second time.
  EXPECT_EQ(ledger.terminate(), 0) << ledger.log();
  ASSERT_TRUE(ledger.start().isOk()) << ledger.log();
  client = ledger.connect();
  ASSERT_TRUE(client.isOk()) << client.status().toString();
  Result<wire::ResponseBody> again = auditPeriods(*client.value(), std::nullopt, true);
  ASSERT_TRUE(again.isOk());
  ASSERT_TRUE(std::holds_alternative<AuditReport>(again.value()));
  const std::vector<PeriodSpan>& kept = std::get<AuditReport>(again.value()).closed_periods;
  // (A real hour boundary may pass during the test; then a second, later span appears.)
  ASSERT_GE(kept.size(), 1u);
  EXPECT_EQ(kept[0], span);
}

}  // namespace
}  // namespace tally::testing
