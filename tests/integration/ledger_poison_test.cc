// Issue 9, defect 1, with the real binary: a settle of 2^64 - 1 units is refused at the wire,
// and a store poisoned by an earlier build (that accepted it) makes tally-ledger refuse to start
// with exit 65 naming the record, `check` lists it, `repair` quarantines it, and the ledger then
// starts and audits clean.

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "ledger/sqlite_store.h"
#include "tests/integration/ledger_harness.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

namespace tally::testing {
namespace {

constexpr uint64_t kHuge = UINT64_MAX;

// Runs `tally-ledger --data-dir D COMMAND` to completion; its exit code, output in `*output`.
int runLedgerCommand(const TempDir& dir, const std::string& data_dir, const std::string& command,
                     std::string* output) {
  const std::string log = dir.file(command + ".log");
  Process process(binaryPath("tally-ledger"), {"--data-dir", data_dir, command}, log,
                  /*ready_fd=*/false);
  const int code = process.waitExit(kExitTimeoutMs);
  *output = process.log();
  return code;
}

// What a build before the bounds wrote after `settle --actual 18446744073709551615` on "q", with
// "p" USAGE_UNKNOWN in the same account (its hard-limit close then aborted every restart).
void writePoisonedStore(const std::string& data_dir, uint64_t now_ms) {
  Result<std::unique_ptr<ledger::SqliteStore>> opened = ledger::SqliteStore::open(data_dir);
  ASSERT_TRUE(opened.isOk()) << opened.status().toString();
  Budget budget = makeBudget({.subject = "tenant-1", .route = "chat", .burst = 1000});
  const auto reservation = [&](const std::string& id, ReservationState state) {
    Reservation r;
    r.reservation_id = id;
    r.request_digest.fill(3);
    r.subject = "tenant-1";
    r.route = "chat";
    r.policy_generation = 1;
    r.reserved_units = 100;
    r.operation_id = "op-" + id;
    r.created_at_ms = now_ms;
    r.expires_at_ms = now_ms + 600'000;
    r.started_at_ms = now_ms;
    r.state = state;
    return r;
  };
  Reservation q = reservation("q", ReservationState::kSettledWithDebt);
  q.actual_units = kHuge;
  q.debt_units = kHuge - 900;
  q.closed_at_ms = now_ms;
  ledger::StoreBatch batch;
  batch.ledger_clock_ms = now_ms;
  batch.policies.push_back({.policy = Policy{.generation = 1, .budgets = {budget}}});
  batch.accounts.push_back({.key = {"tenant-1", "chat", 1},
                            .balances = {.opening = 1000,
                                         .overdraft_issued = kHuge - 900,
                                         .reserved = 100,
                                         .spent = kHuge},
                            .refill_clock_ms = now_ms});
  batch.reservations = {reservation("p", ReservationState::kUsageUnknown), q};
  ASSERT_TRUE(isConserved(batch.accounts[0].balances));
  ASSERT_TRUE(opened.value()->commit(batch).isOk());
}

TEST(LedgerPoisonTest, ASettleOfTwoToThe64MinusOneIsRefusedAsInvalidArgument) {
  TempDir dir;
  LedgerInstance ledger(dir.file("data"), dir.file("ledger.log"));
  ASSERT_TRUE(ledger.start().isOk()) << ledger.log();
  auto client = ledger.connect();
  ASSERT_TRUE(client.isOk()) << client.status().toString();
  ASSERT_TRUE(publishPolicy(*client.value(), {makeBudget({})}).isOk());
  Result<ReservationReply> reserved =
      callReservation(*client.value(), makeReserve({.id = "q", .units = 100}));
  ASSERT_TRUE(reserved.isOk()) << reserved.status().toString();
  ASSERT_TRUE(
      callReservation(*client.value(), StartRequest{.reservation_id = "q", .operation_id = "op"})
          .isOk());
  Result<ReservationReply> settled = callReservation(
      *client.value(),
      SettleRequest{.reservation_id = "q", .operation_id = "op", .actual_units = kHuge});
  ASSERT_FALSE(settled.isOk());
  EXPECT_NE(settled.status().message().find("actualUnits: 18446744073709551615 units, at most "
                                            "1099511627776 allowed"),
            std::string::npos)
      << settled.status().toString();
  // Nothing changed: the reservation is still STARTED and the account holds its 100.
  Result<AuditReport> audit = auditLedger(*client.value());
  ASSERT_TRUE(audit.isOk());
  EXPECT_TRUE(audit.value().conserved) << describe(audit.value());
  ASSERT_EQ(audit.value().accounts.size(), 1u);
  EXPECT_EQ(audit.value().accounts[0].balances.reserved, 100u);
  EXPECT_EQ(audit.value().accounts[0].balances.spent, 0u);
}

TEST(LedgerBreachTest, ASettleBeyondMaxOverdraftIsLoggedOnceAndCountedInTheAudit) {
  TempDir dir;
  LedgerInstance ledger(dir.file("data"), dir.file("ledger.log"));
  ASSERT_TRUE(ledger.start().isOk()) << ledger.log();
  auto client = ledger.connect();
  ASSERT_TRUE(client.isOk()) << client.status().toString();
  ASSERT_TRUE(
      publishPolicy(*client.value(), {makeBudget({.burst = 100, .max_overdraft = 10})}).isOk());
  ASSERT_TRUE(callReservation(*client.value(), makeReserve({.id = "b", .units = 100})).isOk());
  ASSERT_TRUE(
      callReservation(*client.value(), StartRequest{.reservation_id = "b", .operation_id = "op"})
          .isOk());
  const SettleRequest settle{.reservation_id = "b", .operation_id = "op", .actual_units = 150};
  for (int i = 0; i < 2; ++i) {  // the second is a duplicate: not a second breach
    Result<ReservationReply> settled = callReservation(*client.value(), settle);
    ASSERT_TRUE(settled.isOk()) << settled.status().toString();
    EXPECT_TRUE(settled.value().receipt.overdraft_breach);
  }
  Result<AuditReport> audit = auditLedger(*client.value());
  ASSERT_TRUE(audit.isOk());
  ASSERT_EQ(audit.value().accounts.size(), 1u);
  EXPECT_EQ(audit.value().accounts[0].overdraft_breaches,
            (OverdraftBreaches{.count = 1, .units = 40}));  // debt 50, max overdraft 10
  EXPECT_EQ(ledger.terminate(), 0);
  const std::string log = ledger.log();
  const size_t first = log.find("event=overdraft_breach reservation=b");
  EXPECT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.find("event=overdraft_breach", first + 1), std::string::npos) << log;
  // Durable: a restart shows the same count.
  ASSERT_TRUE(ledger.start().isOk()) << ledger.log();
  auto again = ledger.connect();
  ASSERT_TRUE(again.isOk());
  Result<AuditReport> after = auditLedger(*again.value());
  ASSERT_TRUE(after.isOk());
  ASSERT_EQ(after.value().accounts.size(), 1u);
  EXPECT_EQ(after.value().accounts[0].overdraft_breaches.count, 1u);
}

TEST(LedgerPoisonTest, APoisonedStoreIsRefusedNamedCheckedRepairedAndThenServes) {
  TempDir dir;
  const std::string data_dir = dir.file("data");
  writePoisonedStore(data_dir, wallNowMs());
  if (HasFatalFailure()) return;

  {
    Process refused(binaryPath("tally-ledger"), {"--data-dir", data_dir, "--listen", "127.0.0.1:0"},
                    dir.file("refused.log"), /*ready_fd=*/false);
    EXPECT_EQ(refused.waitExit(kExitTimeoutMs), 65) << refused.log();
    const std::string log = refused.log();
    EXPECT_NE(log.find("event=bad_record table=accounts key=\"tenant-1 chat @1\" field=spent "
                       "value=18446744073709551615"),
              std::string::npos)
        << log;
    EXPECT_NE(log.find("event=restore_failed"), std::string::npos) << log;
  }

  std::string output;
  EXPECT_EQ(runLedgerCommand(dir, data_dir, "check", &output), 65) << output;
  EXPECT_NE(output.find("bad record: reservations q: actualUnits = 18446744073709551615"),
            std::string::npos)
      << output;
  EXPECT_NE(output.find("bad record: accounts tenant-1 chat @1: spent = 18446744073709551615"),
            std::string::npos)
      << output;

  EXPECT_EQ(runLedgerCommand(dir, data_dir, "repair", &output), 0) << output;
  EXPECT_NE(output.find("rebased: accounts tenant-1 chat @1: spent"), std::string::npos) << output;
  EXPECT_NE(output.find("quarantined: reservations q: actualUnits"), std::string::npos) << output;
  EXPECT_EQ(runLedgerCommand(dir, data_dir, "check", &output), 0) << output;

  LedgerInstance ledger(data_dir, dir.file("ledger.log"));
  ASSERT_TRUE(ledger.start().isOk()) << ledger.log();
  auto client = ledger.connect();
  ASSERT_TRUE(client.isOk()) << client.status().toString();
  Result<AuditReport> audit = auditLedger(*client.value());
  ASSERT_TRUE(audit.isOk());
  EXPECT_TRUE(audit.value().conserved) << describe(audit.value());
  ASSERT_EQ(audit.value().accounts.size(), 1u);
  const Balances expected{.opening = 100, .reserved = 100};  // p's 100 still held
  EXPECT_EQ(audit.value().accounts[0].balances, expected);
  Result<ReservationReply> p =
      callReservation(*client.value(), QueryRequest{.reservation_id = "p"});
  ASSERT_TRUE(p.isOk());
  EXPECT_EQ(p.value().receipt.state, ReservationState::kUsageUnknown);
  Result<ReservationReply> q =
      callReservation(*client.value(), QueryRequest{.reservation_id = "q"});
  ASSERT_TRUE(q.isOk());
  EXPECT_EQ(q.value().code, ReplyCode::kNotFound);
  EXPECT_EQ(ledger.terminate(), 0) << ledger.log();
}

}  // namespace
}  // namespace tally::testing
