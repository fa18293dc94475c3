// tally-ledger end to end: real processes on temp dirs, real SQLite, real sockets (SPEC §4, §5,
// §8). Each test states what it proves; the fault-injecting ones print their seed.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "tests/integration/cycle_load.h"
#include "tests/integration/ledger_fixture.h"

namespace tally::testing {
namespace {

using std::chrono::steady_clock;

std::string join(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

uint64_t elapsedMs(steady_clock::time_point since) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(steady_clock::now() - since).count());
}

// /proc/PID/FILE of a running process, whole ("" if it cannot be read).
std::string procFile(pid_t pid, const char* file) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/" + file, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Sets (or, with nullopt, unsets) GLIBC_TUNABLES in this process, for the children it starts,
// and puts back what was there when it goes.
class ScopedTunables {
 public:
  explicit ScopedTunables(std::optional<std::string> value) {
    if (const char* old = std::getenv("GLIBC_TUNABLES")) old_ = old;
    if (value.has_value()) {
      ::setenv("GLIBC_TUNABLES", value->c_str(), 1);
    } else {
      ::unsetenv("GLIBC_TUNABLES");
    }
  }
  ~ScopedTunables() {
    if (old_.has_value()) {
      ::setenv("GLIBC_TUNABLES", old_->c_str(), 1);
    } else {
      ::unsetenv("GLIBC_TUNABLES");
    }
  }

 private:
  std::optional<std::string> old_;
};

// The article's opening scenario: three gateways reserve 600 each from one bucket of 1,000.
TEST_F(LedgerServiceTest, OpeningScenarioAdmitsExactlyOneOfThreeConcurrentReserves) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  Generation generation = 0;
  ASSERT_NO_FATAL_FAILURE(
      publish({makeBudget({.burst = 1000, .refill_per_second = 0})}, &generation));

  std::vector<std::unique_ptr<client::BlockingClient>> gateways;
  std::vector<ReserveRequest> requests;
  for (int i = 0; i < 3; ++i) {
    gateways.push_back(connect());
    ASSERT_NE(gateways.back(), nullptr);
    requests.push_back(makeReserve({.id = "gateway-" + std::to_string(i), .units = 600}));
  }
  // All three are on the wire before any answer is read.
  for (int i = 0; i < 3; ++i) {
    Result<uint64_t> sent = gateways[i]->send(requests[i], kCallTimeoutMs);
    ASSERT_TRUE(sent.isOk()) << sent.status().toString();
  }
  std::vector<ReservationReply> replies(3);
  int winner = -1;
  int rejected = 0;
  for (int i = 0; i < 3; ++i) {
    TALLY_ASSIGN_OR_FAIL(replies[i], reservationOf(gateways[i]->receive(kCallTimeoutMs)));
    const Reservation& receipt = replies[i].receipt;
    EXPECT_EQ(receipt.policy_generation, generation);
    if (replies[i].code == ReplyCode::kOk) {
      EXPECT_EQ(winner, -1) << "a second reservation was admitted: " << describe(replies[i]);
      winner = i;
      EXPECT_EQ(receipt.state, ReservationState::kReserved);
      EXPECT_EQ(receipt.reserved_units, 600u);
    } else {
      ++rejected;
      EXPECT_EQ(replies[i].code, ReplyCode::kRejected) << describe(replies[i]);
      EXPECT_EQ(receipt.state, ReservationState::kRejected);
      EXPECT_EQ(receipt.limiting_dimension, LimitingDimension::kCapacity);
      EXPECT_EQ(receipt.retry_after_ms, kRetryNever) << "refill 0: retrying never helps";
    }
  }
  ASSERT_NE(winner, -1);
  EXPECT_EQ(rejected, 2);
  const ReserveRequest& won = requests[winner];
  client::BlockingClient& gateway = *gateways[winner];

  // A retry with the same id and digest: the same receipt, nothing debited again.
  TALLY_ASSIGN_OR_FAIL(ReservationReply retry, callReservation(gateway, won));
  EXPECT_EQ(retry.code, ReplyCode::kOk);
  EXPECT_TRUE(retry.duplicate);
  EXPECT_EQ(retry.receipt, replies[winner].receipt);
  for (int i = 0; i < 3; ++i) {
    if (i == winner) continue;
    TALLY_ASSIGN_OR_FAIL(ReservationReply again, callReservation(*gateways[i], requests[i]));
    EXPECT_EQ(again.code, ReplyCode::kRejected) << describe(again);
    EXPECT_TRUE(again.duplicate);
    EXPECT_EQ(again.receipt, replies[i].receipt);
  }

  TALLY_ASSIGN_OR_FAIL(ReservationReply started,
                       callReservation(gateway, StartRequest{.reservation_id = won.reservation_id,
                                                             .operation_id = "op-1"}));
  ASSERT_EQ(started.code, ReplyCode::kOk) << describe(started);
  EXPECT_EQ(started.receipt.state, ReservationState::kStarted);
  TALLY_ASSIGN_OR_FAIL(ReservationReply settled,
                       callReservation(gateway, SettleRequest{.reservation_id = won.reservation_id,
                                                              .operation_id = "op-1",
                                                              .actual_units = 200}));
  ASSERT_EQ(settled.code, ReplyCode::kOk) << describe(settled);
  EXPECT_EQ(settled.receipt.state, ReservationState::kSettled);
  EXPECT_EQ(settled.receipt.actual_units, 200u);
  EXPECT_EQ(settled.refunded_units, 400u);
  EXPECT_EQ(settled.receipt.refunded_units, 400u);

  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  const AccountView* account = findAccount(audit, {"tenant-1", "chat", generation});
  ASSERT_NE(account, nullptr) << describe(audit);
  EXPECT_EQ(account->balances, (Balances{.opening = 1000, .available = 800, .spent = 200}))
      << describe(audit);

  // Later duplicates: the settled receipt, a settle that refunds 0, and still 800 available.
  TALLY_ASSIGN_OR_FAIL(ReservationReply late_retry, callReservation(gateway, won));
  EXPECT_EQ(late_retry.code, ReplyCode::kOk);
  EXPECT_TRUE(late_retry.duplicate);
  EXPECT_EQ(late_retry.receipt, settled.receipt);
  TALLY_ASSIGN_OR_FAIL(ReservationReply settled_again,
                       callReservation(gateway, SettleRequest{.reservation_id = won.reservation_id,
                                                              .operation_id = "op-1",
                                                              .actual_units = 200}));
  EXPECT_EQ(settled_again.code, ReplyCode::kOk);
  EXPECT_TRUE(settled_again.duplicate);
  EXPECT_EQ(settled_again.refunded_units, 0u);

  // The same id with another request digest is a conflict, whatever else it says.
  ReserveRequest other_units = makeReserve({.id = won.reservation_id, .units = 601});
  TALLY_ASSIGN_OR_FAIL(ReservationReply conflict, callReservation(gateway, other_units));
  EXPECT_EQ(conflict.code, ReplyCode::kIdempotencyConflict) << describe(conflict);
  ReserveRequest other_digest = won;
  other_digest.request_digest[0] ^= 0xff;
  TALLY_ASSIGN_OR_FAIL(ReservationReply conflict2, callReservation(gateway, other_digest));
  EXPECT_EQ(conflict2.code, ReplyCode::kIdempotencyConflict) << describe(conflict2);

  AuditReport after;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&after));
  const AccountView* unchanged = findAccount(after, {"tenant-1", "chat", generation});
  ASSERT_NE(unchanged, nullptr) << describe(after);
  EXPECT_EQ(unchanged->balances, account->balances) << describe(after);
}

// start is a CAS RESERVED → STARTED; expiry may only turn RESERVED into EXPIRED. Starts are sent
// around expiresAt (client-side pacing only): whichever side wins, exactly one does.
TEST_F(LedgerServiceTest, StartVersusExpiryExactlyOneWinsAndBalancesStayExact) {
  std::mt19937_64 rng(testSeed("StartVersusExpiry"));
  constexpr Units kBurst = 1'000'000;
  constexpr uint64_t kHoldTtlMs = 50;
  constexpr int kWaves = 20;
  constexpr int kTrialsPerWave = 20;
  constexpr int64_t kSpreadMs = 12;  // starts land in expiresAt ± this
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = kBurst, .hold_ttl_ms = kHoldTtlMs})}));

  struct Trial {
    std::string id;
    Units units = 0;
    ReservationReply start;
  };
  std::vector<Trial> trials;
  for (int wave = 0; wave < kWaves; ++wave) {
    const size_t first = trials.size();
    std::vector<wire::RequestBody> reserves;
    for (int i = 0; i < kTrialsPerWave; ++i) {
      Trial& trial = trials.emplace_back();
      trial.id = "race-" + std::to_string(wave) + "-" + std::to_string(i);
      trial.units = 1 + rng() % 50;
      reserves.push_back(makeReserve({.id = trial.id, .units = trial.units}));
    }
    const std::vector<Result<ReservationReply>> reserved = callPipelined(*client_, reserves);
    std::vector<std::pair<uint64_t, size_t>> schedule;  // (wall ms to send the start, trial)
    for (size_t i = 0; i < reserved.size(); ++i) {
      ASSERT_TRUE(reserved[i].isOk()) << reserved[i].status().toString();
      ASSERT_EQ(reserved[i].value().code, ReplyCode::kOk) << describe(reserved[i].value());
      const int64_t offset_ms = static_cast<int64_t>(rng() % (2 * kSpreadMs + 1)) - kSpreadMs;
      schedule.emplace_back(reserved[i].value().receipt.expires_at_ms + offset_ms, first + i);
    }
    std::sort(schedule.begin(), schedule.end());
    std::map<uint64_t, size_t> trial_of_request;
    for (const auto& [at_ms, index] : schedule) {
      waitUntilWallMs(at_ms);
      Result<uint64_t> sent = client_->send(StartRequest{.reservation_id = trials[index].id,
                                                         .operation_id = "op-" + trials[index].id},
                                            kCallTimeoutMs);
      ASSERT_TRUE(sent.isOk()) << sent.status().toString();
      trial_of_request[sent.value()] = index;
    }
    for (size_t i = 0; i < schedule.size(); ++i) {
      Result<wire::Response> response = client_->receive(kCallTimeoutMs);
      ASSERT_TRUE(response.isOk()) << response.status().toString();
      const size_t index = trial_of_request.at(response.value().request_id);
      TALLY_ASSIGN_OR_FAIL(trials[index].start, reservationOf(std::move(response)));
    }
  }

  // Every trial has exactly one winner, and a later query agrees with it.
  std::vector<wire::RequestBody> queries;
  for (const Trial& trial : trials) queries.push_back(QueryRequest{.reservation_id = trial.id});
  const std::vector<Result<ReservationReply>> queried = callPipelined(*client_, queries);
  std::vector<size_t> started;
  size_t expired = 0;
  for (size_t i = 0; i < trials.size(); ++i) {
    const ReservationReply& start = trials[i].start;
    const bool start_won =
        start.code == ReplyCode::kOk && start.receipt.state == ReservationState::kStarted;
    const bool expiry_won =
        start.code == ReplyCode::kExpired && start.receipt.state == ReservationState::kExpired;
    ASSERT_NE(start_won, expiry_won) << trials[i].id << ": " << describe(start);
    ASSERT_TRUE(queried[i].isOk()) << queried[i].status().toString();
    const Reservation& now = queried[i].value().receipt;
    EXPECT_EQ(now.state, start_won ? ReservationState::kStarted : ReservationState::kExpired)
        << "start answered " << describe(start) << " but the reservation is " << describe(now);
    if (start_won) {
      started.push_back(i);
    } else {
      ++expired;
      EXPECT_EQ(now.refunded_units, trials[i].units) << describe(now);
    }
  }
  std::cout << "[ race     ] start won " << started.size() << ", expiry won " << expired << " of "
            << trials.size() << std::endl;

  // Settle every other started reservation; the rest keep holding their units.
  Units held = 0;
  Units spent = 0;
  for (size_t k = 0; k < started.size(); ++k) {
    const Trial& trial = trials[started[k]];
    if (k % 2 == 1) {
      held += trial.units;
      continue;
    }
    TALLY_ASSIGN_OR_FAIL(ReservationReply settled,
                         callReservation(*client_, SettleRequest{.reservation_id = trial.id,
                                                                 .operation_id = "op-" + trial.id,
                                                                 .actual_units = trial.units / 2}));
    ASSERT_EQ(settled.code, ReplyCode::kOk) << describe(settled);
    spent += trial.units / 2;
  }
  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  const Balances sum = sumBalances(audit, {"tenant-1", "chat"});
  EXPECT_EQ(sum.reserved, held) << describe(audit);
  EXPECT_EQ(sum.spent, spent) << describe(audit);
  EXPECT_EQ(sum.available + sum.reserved + sum.spent, kBurst) << describe(audit);
}

// Actual above reserved beyond what is available: SETTLED_WITH_DEBT, every admission refused
// for debt until refill repays it, then admission resumes.
TEST_F(LedgerServiceTest, OverdraftFreezesAdmissionUntilRefillRepaysTheDebt) {
  constexpr Units kBurst = 1000;
  constexpr Units kRefillPerSecond = 1000;
  constexpr Units kOverdraft = 1000;  // actual = reserved + this, with nothing else available
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget(
      {.burst = kBurst, .refill_per_second = kRefillPerSecond, .max_overdraft = 100'000})}));
  TALLY_ASSIGN_OR_FAIL(ReservationReply reserved,
                       callReservation(*client_, makeReserve({.id = "big", .units = kBurst})));
  ASSERT_EQ(reserved.code, ReplyCode::kOk) << describe(reserved);
  TALLY_ASSIGN_OR_FAIL(
      ReservationReply started,
      callReservation(*client_, StartRequest{.reservation_id = "big", .operation_id = "op"}));
  ASSERT_EQ(started.code, ReplyCode::kOk) << describe(started);
  TALLY_ASSIGN_OR_FAIL(
      ReservationReply settled,
      callReservation(*client_, SettleRequest{.reservation_id = "big",
                                              .operation_id = "op",
                                              .actual_units = kBurst + kOverdraft}));
  ASSERT_EQ(settled.code, ReplyCode::kOk) << describe(settled);
  EXPECT_EQ(settled.receipt.state, ReservationState::kSettledWithDebt);
  const Units debt = settled.receipt.debt_units;
  EXPECT_GT(debt, 0u) << describe(settled);
  EXPECT_LE(debt, kOverdraft) << describe(settled);
  EXPECT_EQ(settled.refunded_units, 0u);

  // Poll with fresh ids (a refused id stays refused: it is a receipt) until admitted.
  const steady_clock::time_point deadline = steady_clock::now() + std::chrono::seconds(5);
  int attempts = 0;
  int refused_for_debt = 0;
  bool saw_capacity = false;
  ReservationReply admitted;
  for (;;) {
    ASSERT_LT(steady_clock::now(), deadline) << "admission did not resume within 5 s";
    TALLY_ASSIGN_OR_FAIL(
        ReservationReply reply,
        callReservation(*client_, makeReserve({.id = "poll-" + std::to_string(attempts++)})));
    if (reply.code == ReplyCode::kOk) {
      admitted = reply;
      break;
    }
    ASSERT_EQ(reply.code, ReplyCode::kRejected) << describe(reply);
    const LimitingDimension dimension = reply.receipt.limiting_dimension;
    if (dimension == LimitingDimension::kDebt) {
      // Debt never comes back once repaid, and it outranks capacity.
      EXPECT_FALSE(saw_capacity) << describe(reply);
      ++refused_for_debt;
      EXPECT_GT(reply.receipt.retry_after_ms, 0) << describe(reply);
    } else {
      // Debt just repaid, not a whole unit available yet.
      EXPECT_EQ(dimension, LimitingDimension::kCapacity) << describe(reply);
      saw_capacity = true;
    }
    pauseMs(20);  // pacing between polls
  }
  EXPECT_GE(refused_for_debt, 1) << "the first reserve after the overdraft must be refused";
  // Admission = 0 while debt is outstanding: the bucket refills from the big reservation on, so
  // the first unit can be admitted only after the refill has covered the whole overdraft
  // (kOverdraft units at 1 unit/ms of ledger time; 1 ms of slack for the sub-unit carry).
  EXPECT_GE(admitted.receipt.created_at_ms + 1, reserved.receipt.created_at_ms + kOverdraft)
      << "admitted at " << admitted.receipt.created_at_ms << ", the overdraft began at "
      << reserved.receipt.created_at_ms;

  // Admission has resumed: from here on only capacity (refilling at 1 unit/ms) limits it.
  int admitted_after = 0;
  for (int i = 0; admitted_after < 3; ++i) {
    ASSERT_LT(steady_clock::now(), deadline) << "admission did not resume within 5 s";
    TALLY_ASSIGN_OR_FAIL(
        ReservationReply more,
        callReservation(*client_, makeReserve({.id = "after-" + std::to_string(i), .units = 5})));
    if (more.code == ReplyCode::kOk) {
      ++admitted_after;
      continue;
    }
    ASSERT_EQ(more.code, ReplyCode::kRejected) << describe(more);
    EXPECT_EQ(more.receipt.limiting_dimension, LimitingDimension::kCapacity) << describe(more);
    pauseMs(10);  // pacing while the bucket refills
  }
  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  const Balances sum = sumBalances(audit, {"tenant-1", "chat"});
  EXPECT_EQ(sum.overdraft_issued, debt) << describe(audit);
  EXPECT_EQ(sum.overdraft_repaid, sum.overdraft_issued) << describe(audit);
  for (const AccountView& view : audit.accounts) EXPECT_EQ(view.debt, 0u) << describe(audit);
}

// Issue 9: the ledger used to trust the client's digest: the same id and digest with other
// units, subject, priority or generation pin was answered duplicate=true. It compares the
// request's own fields, and still does after a restart (they are stored with the receipt).
TEST_F(LedgerServiceTest, SameIdAndDigestWithOtherFieldsIsAConflictAcrossARestart) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.subject = "tenant-1", .burst = 1'000}),
                                   makeBudget({.subject = "tenant-2", .burst = 1'000})}));
  const ReserveRequest first = makeReserve({.id = "q", .units = 5});
  TALLY_ASSIGN_OR_FAIL(ReservationReply admitted, callReservation(*client_, first));
  ASSERT_EQ(admitted.code, ReplyCode::kOk) << describe(admitted);
  std::vector<ReserveRequest> others(4, first);  // the same digest each time
  others[0].units = 600;
  others[1].subject = "tenant-2";
  others[2].priority = 3;
  others[3].policy_generation = admitted.receipt.policy_generation;
  for (int round = 0; round < 2; ++round) {
    for (const ReserveRequest& other : others) {
      TALLY_ASSIGN_OR_FAIL(ReservationReply reply, callReservation(*client_, other));
      EXPECT_EQ(reply.code, ReplyCode::kIdempotencyConflict) << round << ": " << describe(reply);
      EXPECT_FALSE(reply.duplicate);
    }
    TALLY_ASSIGN_OR_FAIL(ReservationReply again, callReservation(*client_, first));
    EXPECT_EQ(again.code, ReplyCode::kOk) << describe(again);
    EXPECT_TRUE(again.duplicate);
    if (round == 0) {
      ledger_.kill9();
      ASSERT_NO_FATAL_FAILURE(startLedger());
    }
  }
  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  const AccountView* account =
      findAccount(audit, {"tenant-1", "chat", admitted.receipt.policy_generation});
  ASSERT_NE(account, nullptr) << describe(audit);
  EXPECT_EQ(account->balances.reserved, 5u) << describe(audit);
}

// Checks the ledger's balances against what the clients know after a restart: nothing is held
// or spent that the reservations do not account for, and no capacity appeared or vanished
// beyond the debt outstanding. Overdraft is issued only up to `overdraft_issued_max` (none, unless
// a test makes debt on purpose).
void expectBalancesMatch(const AuditReport& audit, const DurabilitySummary& summary, Units opening,
                         Units overdraft_issued_max = 0) {
  const Balances sum = sumBalances(audit, {"tenant-1", "chat"});
  EXPECT_EQ(sum.reserved, summary.held) << describe(audit);
  EXPECT_EQ(sum.spent, summary.spent) << describe(audit);
  EXPECT_EQ(sum.opening, opening) << describe(audit);
  EXPECT_EQ(sum.minted, sum.transferred_out) << "refill 0: every mint is a transfer";
  EXPECT_LE(sum.overdraft_issued, overdraft_issued_max) << describe(audit);
  const Units debt = sum.overdraft_issued - sum.overdraft_repaid;
  EXPECT_EQ(sum.available + sum.reserved + sum.spent, opening + debt) << describe(audit);
}

// kill -9 at random points of a sustained pipelined load from four clients, then restart on the
// same data dir: every acknowledged operation is there, nothing is applied twice.
TEST_F(LedgerServiceTest, KillNineUnderLoadLosesNoAcknowledgedOperation) {
  const uint64_t seed = testSeed("KillNineUnderLoad");
  std::mt19937_64 rng(seed);
  constexpr Units kBurst = 1'000'000'000'000;
  constexpr int kRounds = 20;
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = kBurst})}));

  std::vector<CycleRecord> all;
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t kill_after_acks = 30 + rng() % 2000;
    const uint64_t extra_delay_ms = rng() % 15;
    const int window = 1 + static_cast<int>(rng() % 16);
    std::cout << "[ crash    ] round " << round << ": window " << window << ", kill -9 after "
              << kill_after_acks << " acks + " << extra_delay_ms << " ms" << std::endl;
    CycleLoad load(ledger_.endpoint(), {.id_prefix = "r" + std::to_string(round),
                                        .clients = 4,
                                        .window = window,
                                        .seed = seed + static_cast<uint64_t>(round)});
    load.start();
    ASSERT_TRUE(load.waitForAcks(kill_after_acks, 30'000)) << "load stalled at " << load.acks();
    pauseMs(extra_delay_ms);  // timing only: where in the commit cycle the kill lands
    ledger_.kill9();
    load.stop();
    load.join();
    EXPECT_TRUE(load.unexpected().empty()) << join(load.unexpected());
    const std::vector<CycleRecord> records = load.records();
    all.insert(all.end(), records.begin(), records.end());

    ASSERT_NO_FATAL_FAILURE(startLedger());
    const DurabilitySummary summary = verifyDurable(*client_, all);
    std::cout << "[ crash    ] round " << round << ": " << all.size() << " cycles begun, "
              << summary.acked << " acknowledged, " << summary.found << " known to the ledger, "
              << summary.applied_unacked << " unacknowledged steps applied" << std::endl;
    AuditReport audit;
    ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
    expectBalancesMatch(audit, summary, kBurst);
    if (HasFailure()) return;
  }
}

// A policy switch and a rollback while cycles run on another connection: nothing is lost, the
// generation of every reserve respects the order of the publishes, the old generations drain to
// zero, and no capacity is created by switching.
TEST_F(LedgerServiceTest, GenerationSwitchAndRollbackUnderLoadDrainOldGenerations) {
  const uint64_t seed = testSeed("GenerationSwitch");
  constexpr Units kBurst = 1'000'000;
  constexpr uint64_t kCycles = 400;
  ASSERT_NO_FATAL_FAILURE(startLedger());
  Generation first = 0;
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = kBurst})}, &first));

  CycleLoad load(ledger_.endpoint(), {.id_prefix = "gen",
                                      .clients = 1,
                                      .window = 8,
                                      .cycles_per_client_max = kCycles,
                                      .seed = seed});
  load.start();
  ASSERT_TRUE(load.waitForAcks(150, 30'000));
  Generation second = 0;
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = kBurst / 2})}, &second));
  const steady_clock::time_point published_at = steady_clock::now();
  // Pinned to the draining generation: refused, whatever the load does.
  TALLY_ASSIGN_OR_FAIL(
      ReservationReply pinned,
      callReservation(*client_, makeReserve({.id = "pinned", .units = 1, .generation = first})));
  EXPECT_EQ(pinned.code, ReplyCode::kRejected) << describe(pinned);
  EXPECT_EQ(pinned.receipt.limiting_dimension, LimitingDimension::kGenerationDraining);

  ASSERT_TRUE(load.waitForAcks(load.acks() + 150, 30'000));
  TALLY_ASSIGN_OR_FAIL(PolicyReply rolled_back, rollbackPolicy(*client_));
  ASSERT_EQ(rolled_back.code, ReplyCode::kOk) << rolled_back.message;
  const Generation third = rolled_back.generation;
  const steady_clock::time_point rolled_back_at = steady_clock::now();
  load.join();
  ASSERT_TRUE(load.unexpected().empty()) << join(load.unexpected());

  const std::vector<CycleRecord> records = load.records();
  ASSERT_EQ(records.size(), kCycles);
  std::map<Generation, int> per_generation;
  for (const CycleRecord& record : records) {
    EXPECT_EQ(record.acked, Step::kSettle) << record.reservation_id;
    ++per_generation[record.generation];
    // Linearizable: a reserve sent after a publish was answered sees that generation or later.
    if (record.reserve_sent_at > rolled_back_at) {
      EXPECT_EQ(record.generation, third) << record.reservation_id;
    } else if (record.reserve_sent_at > published_at) {
      EXPECT_GE(record.generation, second) << record.reservation_id;
    }
  }
  EXPECT_GT(per_generation[first], 0);
  EXPECT_GT(per_generation[second], 0);
  EXPECT_GT(per_generation[third], 0);

  const DurabilitySummary summary = verifyDurable(*client_, records);
  EXPECT_EQ(summary.found, kCycles);
  EXPECT_EQ(summary.held, 0u);
  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  // A draining account has handed its available on (SPEC 4, generation switch), so a cycle of
  // its that was in flight at the switch and settles above its reservation goes into debt
  // (SPEC 4, settle a > u): by at most that cycle's excess. The active account keeps plenty.
  Units drained_excess = 0;
  for (Generation generation : {first, second, third}) {
    const AccountView* view = findAccount(audit, {"tenant-1", "chat", generation});
    ASSERT_NE(view, nullptr) << "generation " << generation << "\n" << describe(audit);
    EXPECT_EQ(view->balances.reserved, 0u) << describe(audit);
    EXPECT_EQ(view->generation_state,
              generation == third ? GenerationState::kActive : GenerationState::kDrained)
        << describe(audit);
    Units excess = 0;
    for (const CycleRecord& record : records) {
      if (record.generation == generation && record.actual > record.units) {
        excess += record.actual - record.units;
      }
    }
    if (generation != third) drained_excess += excess;
    EXPECT_LE(view->balances.overdraft_issued, generation == third ? 0u : excess)
        << "generation " << generation << "\n"
        << describe(audit);
  }
  const Balances sum = sumBalances(audit, {"tenant-1", "chat"});
  EXPECT_EQ(sum.opening + sum.minted + sum.overdraft_issued,
            sum.available + sum.reserved + sum.spent + sum.retired_for_emergency +
                sum.overdraft_repaid + sum.transferred_out)
      << describe(audit);
  expectBalancesMatch(audit, summary, kBurst, drained_excess);
}

// SIGTERM while requests are in flight: the ledger answers what it read, exits 0 promptly, and
// every answer it gave survives the restart. Three rounds on one data dir, at random points.
TEST_F(LedgerServiceTest, SigtermWithRequestsInFlightKeepsEveryAnswerAndExitsZero) {
  const uint64_t seed = testSeed("Sigterm");
  std::mt19937_64 rng(seed);
  constexpr Units kBurst = 1'000'000'000;
  constexpr int kRounds = 3;
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.burst = kBurst})}));
  std::vector<CycleRecord> all;
  for (int round = 0; round < kRounds; ++round) {
    const uint64_t term_after_acks = 100 + rng() % 1500;
    CycleLoad load(ledger_.endpoint(), {.id_prefix = "term" + std::to_string(round),
                                        .clients = 3,
                                        .window = 16,
                                        .seed = seed + static_cast<uint64_t>(round)});
    load.start();
    ASSERT_TRUE(load.waitForAcks(term_after_acks, 30'000)) << "load stalled at " << load.acks();
    const steady_clock::time_point signalled = steady_clock::now();
    ASSERT_EQ(ledger_.terminate(kExitTimeoutMs), 0) << "tally-ledger did not exit 0 on SIGTERM";
    const uint64_t exit_ms = elapsedMs(signalled);
    load.stop();
    load.join();
    EXPECT_TRUE(load.unexpected().empty()) << join(load.unexpected());
    const std::vector<CycleRecord> records = load.records();
    all.insert(all.end(), records.begin(), records.end());

    ASSERT_NO_FATAL_FAILURE(startLedger());
    const DurabilitySummary summary = verifyDurable(*client_, all);
    std::cout << "[ sigterm  ] round " << round << ": SIGTERM after " << term_after_acks
              << " acks, exit 0 after " << exit_ms << " ms; " << all.size() << " cycles begun, "
              << summary.acked << " acknowledged, " << summary.applied_unacked
              << " unacknowledged steps applied" << std::endl;
    // A graceful stop answers every request it applied (each client sends its next step only
    // after every reply to the previous one arrived, so no answer is lost to a reset).
    EXPECT_EQ(summary.applied_unacked, 0u) << "applied but never answered";
    AuditReport audit;
    ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
    expectBalancesMatch(audit, summary, kBurst);
    if (HasFailure()) return;
  }
}

// After varied activity (every terminal state, debt, a draining generation), a graceful restart
// restores exactly the same accounts and receipts (refill 0, so nothing moves meanwhile).
// Large batches are several Cap'n Proto segments in the log: thousands of pipelined reserves
// over as many new accounts, then a publish that moves all of them to a new generation. The
// ledger keeps committing and comes back after kill -9 (the restart reads every log row the
// fold has not folded yet). An audit of every account is then above one frame: it is answered
// FRAME_TOO_LARGE with what to ask instead, and a narrower audit is served.
TEST_F(LedgerServiceTest, LargeBatchesKeepTheLedgerServingAndSurviveAKill) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.subject = "tenant-*", .burst = 1'000'000})}));
  constexpr int kSubjects = 7000;
  std::vector<wire::RequestBody> reserves;
  for (int i = 0; i < kSubjects; ++i) {
    reserves.push_back(makeReserve({.id = "large-" + std::to_string(i) + std::string(80, 'x'),
                                    .subject = "tenant-" + std::to_string(i) + std::string(60, 's'),
                                    .units = 1}));
  }
  for (const Result<ReservationReply>& reply : callPipelined(*client_, reserves)) {
    ASSERT_TRUE(reply.isOk()) << reply.status().toString();
    ASSERT_EQ(reply.value().code, ReplyCode::kOk) << describe(reply.value());
  }
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.subject = "tenant-*", .burst = 2'000'000})}));
  for (int i = 0; i < 3; ++i) {
    TALLY_ASSIGN_OR_FAIL(ReservationReply reply,
                         callReservation(*client_, makeReserve({.id = "after-" + std::to_string(i),
                                                                .subject = "tenant-after",
                                                                .units = 1})));
    ASSERT_EQ(reply.code, ReplyCode::kOk) << describe(reply);
  }
  const wire::AuditRequest one_subject{.subject = "tenant-after"};
  TALLY_ASSIGN_OR_FAIL(AuditReport before, auditLedger(*client_, one_subject));
  ASSERT_TRUE(before.conserved) << describe(before);
  ASSERT_EQ(before.accounts.size(), 1u) << describe(before);
  ledger_.kill9();
  ASSERT_NO_FATAL_FAILURE(startLedger());
  TALLY_ASSIGN_OR_FAIL(AuditReport after, auditLedger(*client_, one_subject));
  ASSERT_TRUE(after.conserved) << describe(after);
  ASSERT_EQ(after.accounts.size(), 1u);
  EXPECT_EQ(after.accounts[0].balances, before.accounts[0].balances);

  TALLY_ASSIGN_OR_FAIL(wire::Response whole, client_->call(wire::AuditRequest{}, 10'000));
  const auto* error = std::get_if<wire::ErrorReply>(&whole.body);
  ASSERT_NE(error, nullptr) << "an audit of " << kSubjects << " accounts fit in one frame";
  EXPECT_EQ(error->code, wire::ErrorCode::kFrameTooLarge);
  EXPECT_NE(error->message.find("--subject"), std::string::npos) << error->message;
  TALLY_ASSIGN_OR_FAIL(
      ReservationReply served,
      callReservation(
          *client_, makeReserve({.id = "after-too-large", .subject = "tenant-after", .units = 1})));
  EXPECT_EQ(served.code, ReplyCode::kOk) << describe(served);
}

TEST_F(LedgerServiceTest, RestartRestoresIdenticalAuditAndReceipts) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(
      publish({makeBudget({.subject = "tenant-1", .burst = 10'000, .max_overdraft = 10}),
               makeBudget({.subject = "tenant-2", .burst = 5'000})}));
  std::vector<std::string> ids;
  auto reserve = [&](const std::string& id, const std::string& subject, Units units) {
    ids.push_back(id);
    return callReservation(*client_, makeReserve({.id = id, .subject = subject, .units = units}));
  };
  auto expectOk = [](const Result<ReservationReply>& reply) {
    ASSERT_TRUE(reply.isOk()) << reply.status().toString();
    ASSERT_EQ(reply.value().code, ReplyCode::kOk) << describe(reply.value());
  };
  auto start = [&](const std::string& id) {
    return callReservation(*client_,
                           StartRequest{.reservation_id = id, .operation_id = "op-" + id});
  };
  auto settle = [&](const std::string& id, Units actual) {
    return callReservation(
        *client_,
        SettleRequest{.reservation_id = id, .operation_id = "op-" + id, .actual_units = actual});
  };
  for (int i = 0; i < 10; ++i) {
    const std::string id = "t1-" + std::to_string(i);
    ASSERT_NO_FATAL_FAILURE(expectOk(reserve(id, "tenant-1", 100 + i)));
    if (i % 5 == 0) continue;  // stays RESERVED
    if (i % 5 == 1) {
      ASSERT_NO_FATAL_FAILURE(
          expectOk(callReservation(*client_, ReleaseRequest{.reservation_id = id})));
      continue;
    }
    ASSERT_NO_FATAL_FAILURE(expectOk(start(id)));
    if (i % 5 == 2) continue;  // stays STARTED
    if (i % 5 == 3) {
      ASSERT_NO_FATAL_FAILURE(expectOk(callReservation(
          *client_, MarkUnknownRequest{.reservation_id = id, .operation_id = "op-" + id})));
      continue;
    }
    ASSERT_NO_FATAL_FAILURE(expectOk(settle(id, 50)));
  }
  // tenant-2: a rejection and an overdraft that refill 0 never repays.
  TALLY_ASSIGN_OR_FAIL(ReservationReply too_big, reserve("t2-big", "tenant-2", 6'000));
  EXPECT_EQ(too_big.code, ReplyCode::kRejected) << describe(too_big);
  ASSERT_NO_FATAL_FAILURE(expectOk(reserve("t2-debt", "tenant-2", 5'000)));
  ASSERT_NO_FATAL_FAILURE(expectOk(start("t2-debt")));
  TALLY_ASSIGN_OR_FAIL(ReservationReply overdraft, settle("t2-debt", 5'300));
  EXPECT_EQ(overdraft.receipt.state, ReservationState::kSettledWithDebt) << describe(overdraft);
  // A second generation: tenant-1's first generation drains with a STARTED reservation in it.
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget({.subject = "tenant-1", .burst = 8'000}),
                                   makeBudget({.subject = "tenant-2", .burst = 5'000})}));
  ASSERT_NO_FATAL_FAILURE(expectOk(reserve("t1-gen2", "tenant-1", 10)));

  AuditReport before;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&before));
  std::vector<wire::RequestBody> queries;
  for (const std::string& id : ids) queries.push_back(QueryRequest{.reservation_id = id});
  const std::vector<Result<ReservationReply>> receipts_before = callPipelined(*client_, queries);

  ASSERT_EQ(ledger_.terminate(kExitTimeoutMs), 0);
  ASSERT_NO_FATAL_FAILURE(startLedger());
  AuditReport after;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&after));
  ASSERT_EQ(after.accounts.size(), before.accounts.size()) << describe(before) << describe(after);
  for (size_t i = 0; i < before.accounts.size(); ++i) {
    const AccountView& b = before.accounts[i];
    const AccountView& a = after.accounts[i];
    EXPECT_EQ(a.key, b.key);
    EXPECT_EQ(a.balances, b.balances) << describe(before) << describe(after);
    EXPECT_EQ(a.debt, b.debt);
    EXPECT_EQ(a.generation_state, b.generation_state);
  }
  const std::vector<Result<ReservationReply>> receipts_after = callPipelined(*client_, queries);
  for (size_t i = 0; i < ids.size(); ++i) {
    ASSERT_TRUE(receipts_before[i].isOk() && receipts_after[i].isOk()) << ids[i];
    EXPECT_EQ(receipts_after[i].value().code, ReplyCode::kOk) << ids[i];
    EXPECT_EQ(receipts_after[i].value().receipt, receipts_before[i].value().receipt)
        << describe(receipts_before[i].value()) << " became "
        << describe(receipts_after[i].value());
  }

  // The restored ledger keeps working: closing every live reservation of tenant-1's first
  // generation empties it. Generation 1 as a whole still drains: tenant-2 owes debt there that
  // refill 0 never repays, and a draining generation keeps collecting debt until it is zero.
  ASSERT_NO_FATAL_FAILURE(expectOk(settle("t1-2", 100)));
  ASSERT_NO_FATAL_FAILURE(expectOk(settle("t1-7", 100)));
  ASSERT_NO_FATAL_FAILURE(
      expectOk(callReservation(*client_, ReleaseRequest{.reservation_id = "t1-0"})));
  ASSERT_NO_FATAL_FAILURE(
      expectOk(callReservation(*client_, ReleaseRequest{.reservation_id = "t1-5"})));
  for (const char* id : {"t1-3", "t1-8"}) {
    ASSERT_NO_FATAL_FAILURE(expectOk(callReservation(
        *client_,
        ReportOperationRequest{
            .reservation_id = id, .operation_id = std::string("op-") + id, .actual_units = 10})));
  }
  AuditReport closed;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&closed));
  const AccountView* tenant1 = findAccount(closed, {"tenant-1", "chat", 1});
  const AccountView* tenant2 = findAccount(closed, {"tenant-2", "chat", 1});
  ASSERT_NE(tenant1, nullptr) << describe(closed);
  ASSERT_NE(tenant2, nullptr) << describe(closed);
  EXPECT_EQ(tenant1->balances.reserved, 0u) << describe(closed);
  EXPECT_EQ(tenant2->debt, 300u) << describe(closed);
  EXPECT_EQ(tenant1->generation_state, GenerationState::kDraining) << describe(closed);
}

// Deadlines are durable state: a hold that runs out while the ledger is down expires after the
// restart, and a USAGE_UNKNOWN past its hard execution limit is closed as fully consumed; a later
// receipt above the reservation is still charged (SPEC §5).
TEST_F(LedgerServiceTest, HoldAndHardLimitDeadlinesSurviveAKill) {
  constexpr Units kBurst = 1000;
  constexpr uint64_t kDeadlineMs = 300;
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publish({makeBudget(
      {.burst = kBurst, .hold_ttl_ms = kDeadlineMs, .hard_execution_limit_ms = kDeadlineMs})}));
  TALLY_ASSIGN_OR_FAIL(ReservationReply hold,
                       callReservation(*client_, makeReserve({.id = "hold", .units = 100})));
  ASSERT_EQ(hold.code, ReplyCode::kOk) << describe(hold);
  TALLY_ASSIGN_OR_FAIL(ReservationReply unknown,
                       callReservation(*client_, makeReserve({.id = "unknown", .units = 200})));
  ASSERT_EQ(unknown.code, ReplyCode::kOk) << describe(unknown);
  TALLY_ASSIGN_OR_FAIL(
      ReservationReply started,
      callReservation(*client_, StartRequest{.reservation_id = "unknown", .operation_id = "op"}));
  ASSERT_EQ(started.code, ReplyCode::kOk) << describe(started);
  TALLY_ASSIGN_OR_FAIL(ReservationReply marked,
                       callReservation(*client_, MarkUnknownRequest{.reservation_id = "unknown",
                                                                    .operation_id = "op"}));
  ASSERT_EQ(marked.code, ReplyCode::kOk) << describe(marked);
  ASSERT_EQ(marked.receipt.state, ReservationState::kUsageUnknown);
  ledger_.kill9();
  // Both deadlines pass while the ledger is down (pacing: the outcome is polled for below).
  waitUntilWallMs(
      std::max(hold.receipt.expires_at_ms, started.receipt.started_at_ms + kDeadlineMs) + 50);
  ASSERT_NO_FATAL_FAILURE(startLedger());

  const steady_clock::time_point deadline = steady_clock::now() + std::chrono::seconds(5);
  ReservationReply expired;
  ReservationReply closed;
  for (;;) {
    TALLY_ASSIGN_OR_FAIL(expired,
                         callReservation(*client_, QueryRequest{.reservation_id = "hold"}));
    TALLY_ASSIGN_OR_FAIL(closed,
                         callReservation(*client_, QueryRequest{.reservation_id = "unknown"}));
    if (isTerminal(expired.receipt.state) && isTerminal(closed.receipt.state)) break;
    ASSERT_LT(steady_clock::now(), deadline)
        << "not closed after the restart: " << describe(expired) << "; " << describe(closed);
    pauseMs(10);  // pacing between polls
  }
  EXPECT_EQ(expired.receipt.state, ReservationState::kExpired) << describe(expired);
  EXPECT_EQ(expired.receipt.refunded_units, 100u) << describe(expired);
  EXPECT_EQ(closed.receipt.state, ReservationState::kSettled) << describe(closed);
  EXPECT_TRUE(closed.receipt.closed_by_hard_limit) << describe(closed);
  EXPECT_EQ(closed.receipt.actual_units, 200u) << describe(closed);
  AuditReport audit;
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  EXPECT_EQ(sumBalances(audit, {"tenant-1", "chat"}),
            (Balances{.opening = kBurst, .available = kBurst - 200, .spent = 200}))
      << describe(audit);

  TALLY_ASSIGN_OR_FAIL(ReservationReply late,
                       callReservation(*client_, ReportOperationRequest{.reservation_id = "unknown",
                                                                        .operation_id = "op",
                                                                        .actual_units = 250}));
  EXPECT_EQ(late.code, ReplyCode::kOk) << describe(late);
  EXPECT_EQ(late.receipt.state, ReservationState::kSettledWithDebt) << describe(late);
  EXPECT_EQ(late.receipt.actual_units, 250u) << describe(late);
  ASSERT_NO_FATAL_FAILURE(auditConserved(&audit));
  EXPECT_EQ(sumBalances(audit, {"tenant-1", "chat"}),
            (Balances{.opening = kBurst, .available = kBurst - 250, .spent = 250}))
      << describe(audit);
}

// docs/LEDGER.md "Restart time and the allocator": a release build's ledger runs on jemalloc and
// leaves GLIBC_TUNABLES alone; a build on glibc's malloc runs with its huge-page malloc, by
// re-executing itself once under its own name, unless the operator set GLIBC_TUNABLES (even
// empty). Either way, on the allocator this build links.
TEST_F(LedgerServiceTest, RunsOnTheAllocatorOfItsBuildUnderItsOwnName) {
  constexpr bool kOnJemalloc = TALLY_DAEMONS_ON_JEMALLOC == 1;
  {
    ScopedTunables unset(std::nullopt);
    ASSERT_NO_FATAL_FAILURE(startLedger());
  }
  std::string environment = procFile(ledger_.pid(), "environ");
  EXPECT_EQ(procFile(ledger_.pid(), "maps").find("libjemalloc") != std::string::npos, kOnJemalloc);
  EXPECT_EQ(environment.find(std::string("GLIBC_TUNABLES=glibc.malloc.hugetlb=1") + '\0') !=
                std::string::npos,
            !kOnJemalloc);
  EXPECT_EQ(procFile(ledger_.pid(), "comm"), "tally-ledger\n");
  TALLY_ASSIGN_OR_FAIL(wire::HealthReply serving, health(*client_));
  EXPECT_EQ(ledger_.terminate(), 0);

  {
    ScopedTunables operators_choice("");
    ASSERT_NO_FATAL_FAILURE(startLedger());
  }
  environment = procFile(ledger_.pid(), "environ");
  EXPECT_NE(environment.find(std::string("GLIBC_TUNABLES=") + '\0'), std::string::npos);
  EXPECT_EQ(environment.find("glibc.malloc.hugetlb"), std::string::npos);
  TALLY_ASSIGN_OR_FAIL(serving, health(*client_));
  EXPECT_EQ(ledger_.terminate(), 0);
}

}  // namespace
}  // namespace tally::testing
