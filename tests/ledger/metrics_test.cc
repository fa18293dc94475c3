// tally-ledger's gauges read from a Ledger (ledger/metrics.h): the overdraft breach count comes
// from the accounts' durable counters, so compacting the reservations that breached (after
// retention) does not make it go down.

#include "ledger/metrics.h"

#include <string>

#include <gtest/gtest.h>

#include "core/ledger.h"

namespace tally::ledger {
namespace {

constexpr uint64_t kT0 = 1'700'000'000'000;
constexpr uint64_t kRetentionMs = 1'000;

ReserveRequest reserveOf(const std::string& id, const std::string& subject, Units units) {
  ReserveRequest request{
      .reservation_id = id, .subject = subject, .route = "/v1/chat", .units = units};
  request.request_digest[0] = 1;
  return request;
}

// Reserves the account's whole burst and settles 60 over it: debt 60, above max_overdraft 10.
void breach(Ledger* ledger, const std::string& id, const std::string& subject) {
  ASSERT_EQ(ledger->reserve(reserveOf(id, subject, 1'000), kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger->start({.reservation_id = id, .operation_id = "op"}, kT0).code, ReplyCode::kOk);
  const ReservationReply settled =
      ledger->settle({.reservation_id = id, .operation_id = "op", .actual_units = 1'060}, kT0);
  ASSERT_EQ(settled.code, ReplyCode::kOk);
  ASSERT_TRUE(settled.receipt.overdraft_breach);
}

TEST(LedgerGauges, OverdraftBreachesCountSettlesPerAccountAndSurviveCompaction) {
  Ledger ledger({.retention_ms = kRetentionMs});
  const Budget budget{.subject_pattern = "tenant-*",
                      .route = "/v1/chat",
                      .unit = "tokens",
                      .refill_per_second = 0,
                      .burst = 1'000,
                      .max_single_reservation = 1'000,
                      .hold_ttl_ms = 30'000,
                      .hard_execution_limit_ms = 60'000,
                      .max_overdraft = 10};
  ASSERT_EQ(ledger.publishPolicy(Policy{.budgets = {budget}}, kT0).code, ReplyCode::kOk);
  ASSERT_NO_FATAL_FAILURE(breach(&ledger, "a", "tenant-1"));
  ASSERT_NO_FATAL_FAILURE(breach(&ledger, "b", "tenant-2"));

  const LedgerGauges before = ledgerGauges(ledger, kT0);
  EXPECT_EQ(before.overdraft_breaches, 2u);
  EXPECT_EQ(before.reservations[static_cast<size_t>(ReservationState::kSettledWithDebt)], 2u);

  // Past retention both reservations are compacted; the accounts still count their breaches.
  ASSERT_EQ(ledger.tick(kT0 + kRetentionMs).compacted, 2u);
  ASSERT_EQ(ledger.findReservation("a"), nullptr);
  const LedgerGauges after = ledgerGauges(ledger, kT0 + kRetentionMs);
  EXPECT_EQ(after.reservations[static_cast<size_t>(ReservationState::kSettledWithDebt)], 0u);
  EXPECT_EQ(after.overdraft_breaches, 2u);
  const std::string rendered = LedgerMetrics().render(after);
  EXPECT_NE(rendered.find("\ntally_ledger_overdraft_breaches 2\n"), std::string::npos) << rendered;
}

TEST(LedgerGauges, TheLastPeriodCloseIsExported) {
  constexpr uint64_t kHourMs = 3'600'000;
  Ledger ledger;
  const Budget budget{.subject_pattern = "tenant-*",
                      .route = "/v1/chat",
                      .unit = "tokens",
                      .burst = 1'000,
                      .max_single_reservation = 1'000,
                      .hold_ttl_ms = 30'000,
                      .hard_execution_limit_ms = 60'000};
  ASSERT_EQ(ledger.publishPolicy(Policy{.budgets = {budget}}, kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger.reserve(reserveOf("a", "tenant-1", 10), kT0).code, ReplyCode::kOk);
  EXPECT_EQ(ledgerGauges(ledger, kT0).period_last_closed_epoch, 0u);
  const uint64_t closed_at = (kT0 / kHourMs + 1) * kHourMs + 250;
  ASSERT_EQ(ledger.tick(closed_at).periods_closed, 1u);
  const LedgerGauges gauges = ledgerGauges(ledger, closed_at);
  EXPECT_EQ(gauges.period_last_closed_epoch, kT0 / kHourMs);
  EXPECT_EQ(gauges.period_last_closed_at_ms, closed_at);
  EXPECT_EQ(gauges.period_spans_unconserved, 0u);
  const std::string rendered = LedgerMetrics().render(gauges);
  EXPECT_NE(rendered.find("\ntally_ledger_period_last_closed_epoch " +
                          std::to_string(kT0 / kHourMs) + "\n"),
            std::string::npos)
      << rendered;
  EXPECT_NE(rendered.find("\ntally_ledger_period_spans_unconserved 0\n"), std::string::npos);
}

}  // namespace
}  // namespace tally::ledger
