#include "core/ledger.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <ostream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/limits.h"

namespace tally {

// Readable failures for EXPECT_EQ on whole balance sets (internal linkage on purpose).
static void PrintTo(const Balances& b, std::ostream* os) {
  *os << "{opening " << b.opening << ", minted " << b.minted << ", overdraftIssued "
      << b.overdraft_issued << ", available " << b.available << ", reserved " << b.reserved
      << ", spent " << b.spent << ", retired " << b.retired_for_emergency << ", overdraftRepaid "
      << b.overdraft_repaid << ", transferredOut " << b.transferred_out << "}";
}
static void PrintTo(const AccountKey& key, std::ostream* os) {
  *os << key.subject << "/" << key.route << "@" << key.generation;
}
static void PrintTo(ReservationState state, std::ostream* os) {
  *os << reservationStateName(state);
}
static void PrintTo(LimitingDimension dimension, std::ostream* os) {
  *os << limitingDimensionName(dimension);
}
static void PrintTo(ReplyCode code, std::ostream* os) { *os << replyCodeName(code); }

namespace {

using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using S = ReservationState;

// Ledger clock: an arbitrary Unix time. Its hourly accounting period starts at kEpochStartMs.
constexpr uint64_t kT0 = 1'700'000'000'000;
constexpr uint64_t kEpochStartMs = 1'699'999'200'000;
constexpr uint64_t kHoldTtlMs = 30'000;
constexpr uint64_t kHardLimitMs = 60'000;
const std::string kSubject = "tenant-7";
const std::string kRoute = "/v1/chat";

// burst 1000, refill 10/s, max single 1000, hold TTL 30 s, hard limit 60 s, max overdraft 500.
Budget testBudget() {
  return Budget{
      .subject_pattern = kSubject,
      .route = kRoute,
      .unit = "tokens",
      .refill_per_second = 10,
      .burst = 1000,
      .max_single_reservation = 1000,
      .hold_ttl_ms = kHoldTtlMs,
      .hard_execution_limit_ms = kHardLimitMs,
      .max_overdraft = 500,
  };
}

Policy testPolicy() { return Policy{.budgets = {testBudget()}}; }

Digest digestOf(uint8_t seed) {
  Digest digest{};
  digest.fill(seed);
  return digest;
}

ReserveRequest reserveRequest(const std::string& id, Units units, uint8_t digest_seed,
                              Generation pinned_generation = 0,
                              const std::string& subject = kSubject) {
  return ReserveRequest{.reservation_id = id,
                        .request_digest = digestOf(digest_seed),
                        .subject = subject,
                        .route = kRoute,
                        .units = units,
                        .policy_generation = pinned_generation};
}

AccountKey keyOf(Generation generation) { return AccountKey{kSubject, kRoute, generation}; }

// `ledger.audit(now).conserved`, printing every violation when it fails.
::testing::AssertionResult audited(const Ledger& ledger, uint64_t now_ms) {
  const AuditReport report = ledger.audit(now_ms);
  if (report.conserved && report.violations.empty()) return ::testing::AssertionSuccess();
  ::testing::AssertionResult failure = ::testing::AssertionFailure();
  failure << "audit at " << now_ms << " is not conserved:";
  for (const std::string& violation : report.violations) failure << "\n  " << violation;
  return failure;
}

Balances balancesOf(const Ledger& ledger, Generation generation) {
  const AccountEntry* entry = ledger.accounts().find(keyOf(generation));
  if (entry == nullptr) {
    ADD_FAILURE() << "no account for generation " << generation;
    return {};
  }
  return entry->account.balances();
}

struct RouteTotals {
  Units sources = 0;  // Σ opening + minted + overdraftIssued − transferredOut
  Units uses = 0;     // Σ available + reserved + spent + retired + overdraftRepaid
};

// Sums the equation over every generation of (kSubject, kRoute): the transfer terms cancel.
RouteTotals routeTotals(const Ledger& ledger, uint64_t now_ms) {
  RouteTotals totals;
  Units transferred_out = 0;
  for (const AccountView& view : ledger.audit(now_ms).accounts) {
    if (view.key.subject != kSubject || view.key.route != kRoute) continue;
    const Balances& b = view.balances;
    totals.sources += b.opening + b.minted + b.overdraft_issued;
    transferred_out += b.transferred_out;
    totals.uses +=
        b.available + b.reserved + b.spent + b.retired_for_emergency + b.overdraft_repaid;
  }
  EXPECT_GE(totals.sources, transferred_out);
  totals.sources -= transferred_out;
  return totals;
}

class LedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const PolicyReply reply = ledger_.publishPolicy(testPolicy(), kT0);
    ASSERT_EQ(reply.code, ReplyCode::kOk) << reply.message;
    ASSERT_EQ(reply.generation, 1u);
  }

  ReservationReply reserve(const std::string& id, Units units, uint64_t now_ms = kT0,
                           uint8_t digest_seed = 1) {
    return ledger_.reserve(reserveRequest(id, units, digest_seed), now_ms);
  }
  ReservationReply start(const std::string& id, const std::string& op, uint64_t now_ms = kT0) {
    return ledger_.start({.reservation_id = id, .operation_id = op}, now_ms);
  }
  ReservationReply settle(const std::string& id, const std::string& op, Units actual,
                          uint64_t now_ms = kT0) {
    return ledger_.settle({.reservation_id = id, .operation_id = op, .actual_units = actual},
                          now_ms);
  }
  ReservationReply release(const std::string& id, uint64_t now_ms = kT0) {
    return ledger_.release({.reservation_id = id}, now_ms);
  }
  ReservationReply markUnknown(const std::string& id, const std::string& op,
                               uint64_t now_ms = kT0) {
    return ledger_.markUnknown({.reservation_id = id, .operation_id = op}, now_ms);
  }
  ReservationReply report(const std::string& id, const std::string& op, Units actual,
                          uint64_t now_ms = kT0) {
    return ledger_.reportOperation(
        {.reservation_id = id, .operation_id = op, .actual_units = actual}, now_ms);
  }
  ReservationReply query(const std::string& id) const {
    return ledger_.query({.reservation_id = id});
  }
  Balances balances(Generation generation = 1) const { return balancesOf(ledger_, generation); }
  ::testing::AssertionResult audited(uint64_t now_ms) const {
    return tally::audited(ledger_, now_ms);
  }
  ::testing::AssertionResult accountsConserved(uint64_t now_ms) const {
    for (const AccountView& view : ledger_.accounts().view(now_ms)) {
      if (!view.conserved) return ::testing::AssertionFailure() << view.key.subject << " broken";
    }
    return ::testing::AssertionSuccess();
  }

  Ledger ledger_;
};

// ---- the article's scenario -------------------------------------------------------------------

TEST_F(LedgerTest, ArticleScenarioThreeGatewaysOneBucket) {
  const ReservationReply r1 = reserve("r1", 600, kT0, 1);
  ASSERT_EQ(r1.code, ReplyCode::kOk);
  EXPECT_FALSE(r1.duplicate);
  EXPECT_EQ(r1.receipt.reservation_id, "r1");
  EXPECT_EQ(r1.receipt.state, S::kReserved);
  EXPECT_EQ(r1.receipt.reserved_units, 600u);
  EXPECT_EQ(r1.receipt.policy_generation, 1u);
  EXPECT_EQ(r1.receipt.accounting_epoch_ms, kEpochStartMs);
  EXPECT_EQ(r1.receipt.created_at_ms, kT0);
  EXPECT_EQ(r1.receipt.expires_at_ms, kT0 + 30'000);
  EXPECT_EQ(r1.receipt.limiting_dimension, LimitingDimension::kNone);
  EXPECT_TRUE(r1.receipt.origin.empty());
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0));

  // Two more gateways ask for 600 at the same instant: 400 left, 200 short at 10/s = 20 s.
  for (const auto& [id, seed] : {std::pair{"r2", 2}, std::pair{"r3", 3}}) {
    const ReservationReply rejected = reserve(id, 600, kT0, static_cast<uint8_t>(seed));
    EXPECT_EQ(rejected.code, ReplyCode::kRejected) << id;
    EXPECT_EQ(rejected.receipt.state, S::kRejected) << id;
    EXPECT_EQ(rejected.receipt.limiting_dimension, LimitingDimension::kCapacity) << id;
    EXPECT_EQ(rejected.receipt.retry_after_ms, 20'000) << id;
    EXPECT_EQ(rejected.receipt.policy_generation, 1u) << id;
    EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600})) << id;
    EXPECT_TRUE(audited(kT0));
  }
  int reserved_count = 0;
  for (const char* id : {"r1", "r2", "r3"}) {
    if (query(id).receipt.state == S::kReserved) ++reserved_count;
  }
  EXPECT_EQ(reserved_count, 1);

  const ReservationReply started = start("r1", "op1");
  ASSERT_EQ(started.code, ReplyCode::kOk);
  EXPECT_EQ(started.receipt.state, S::kStarted);
  EXPECT_EQ(started.receipt.operation_id, "op1");
  EXPECT_EQ(started.receipt.started_at_ms, kT0);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0));

  // Actual 200: 400 refunded; 1000 − 600 + 400 = 800 available (no time passed, no refill).
  const ReservationReply settled = settle("r1", "op1", 200);
  ASSERT_EQ(settled.code, ReplyCode::kOk);
  EXPECT_FALSE(settled.duplicate);
  EXPECT_EQ(settled.refunded_units, 400u);
  EXPECT_EQ(settled.receipt.state, S::kSettled);
  EXPECT_EQ(settled.receipt.actual_units, 200u);
  EXPECT_EQ(settled.receipt.refunded_units, 400u);
  EXPECT_EQ(settled.receipt.debt_units, 0u);
  EXPECT_EQ(settled.receipt.closed_at_ms, kT0);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 800, .spent = 200}));
  EXPECT_TRUE(audited(kT0));

  // The gateway lost the first answer and retries with the same id and digest.
  const ReservationReply retried = reserve("r1", 600, kT0, 1);
  EXPECT_EQ(retried.code, ReplyCode::kOk);
  EXPECT_TRUE(retried.duplicate);
  EXPECT_EQ(retried.refunded_units, 0u);
  EXPECT_EQ(retried.receipt.reservation_id, "r1");
  EXPECT_EQ(retried.receipt.request_digest, r1.receipt.request_digest);
  EXPECT_EQ(retried.receipt.reserved_units, r1.receipt.reserved_units);
  EXPECT_EQ(retried.receipt.policy_generation, r1.receipt.policy_generation);
  EXPECT_EQ(retried.receipt.accounting_epoch_ms, r1.receipt.accounting_epoch_ms);
  EXPECT_EQ(retried.receipt.created_at_ms, r1.receipt.created_at_ms);
  EXPECT_EQ(retried.receipt.expires_at_ms, r1.receipt.expires_at_ms);
  EXPECT_EQ(retried.receipt, settled.receipt);  // the receipt as it stands now
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 800, .spent = 200}));
  EXPECT_TRUE(audited(kT0));

  // Same id, different request: refused, nothing debited.
  const ReservationReply conflict = reserve("r1", 600, kT0, 9);
  EXPECT_EQ(conflict.code, ReplyCode::kIdempotencyConflict);
  EXPECT_FALSE(conflict.duplicate);
  EXPECT_EQ(conflict.receipt.reservation_id, "r1");
  EXPECT_EQ(conflict.receipt.request_digest, digestOf(1));
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 800, .spent = 200}));
  EXPECT_TRUE(audited(kT0));

  // A rejected request retried with its digest gets the same rejection, not a new admission.
  const ReservationReply rejected_again = reserve("r2", 600, kT0, 2);
  EXPECT_EQ(rejected_again.code, ReplyCode::kRejected);
  EXPECT_TRUE(rejected_again.duplicate);
  EXPECT_EQ(rejected_again.receipt.retry_after_ms, 20'000);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 800, .spent = 200}));
  EXPECT_TRUE(audited(kT0));
}

TEST_F(LedgerTest, RejectionIsStampedWithTheAccountingEpoch) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  const ReservationReply rejected = reserve("r2", 600, kT0, 2);
  ASSERT_EQ(rejected.code, ReplyCode::kRejected);
  // SPEC: §4 "admission locks it for the current accountingEpoch, which every reservation and
  // ledger entry is stamped with" (and §5 lists the accounting epoch among the fields). The
  // rejected receipt is a reservation record, but reject() leaves accounting_epoch_ms at 0.
  EXPECT_EQ(rejected.receipt.accounting_epoch_ms, kEpochStartMs);
  EXPECT_TRUE(audited(kT0));
}

// ---- start: the compare-and-set --------------------------------------------------------------

TEST_F(LedgerTest, StartBindsTheOperationOnce) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  const ReservationReply first = start("r1", "op1", kT0 + 1'000);
  ASSERT_EQ(first.code, ReplyCode::kOk);
  EXPECT_FALSE(first.duplicate);
  EXPECT_EQ(first.receipt.state, S::kStarted);
  EXPECT_EQ(first.receipt.operation_id, "op1");
  EXPECT_EQ(first.receipt.started_at_ms, kT0 + 1'000);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0 + 1'000));

  const ReservationReply again = start("r1", "op1", kT0 + 2'000);
  EXPECT_EQ(again.code, ReplyCode::kOk);
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.receipt.started_at_ms, kT0 + 1'000);

  const ReservationReply other = start("r1", "op2", kT0 + 2'000);
  EXPECT_EQ(other.code, ReplyCode::kOperationConflict);
  EXPECT_EQ(other.receipt.operation_id, "op1");
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0 + 2'000));
}

TEST_F(LedgerTest, StartOneMillisecondBeforeExpiryWins) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  const ReservationReply started = start("r1", "op1", kT0 + 29'999);
  EXPECT_EQ(started.code, ReplyCode::kOk);
  EXPECT_EQ(started.receipt.state, S::kStarted);
  EXPECT_EQ(ledger_.tick(kT0 + 30'000).expired, 0u);
  EXPECT_EQ(query("r1").receipt.state, S::kStarted);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0 + 30'000));
}

TEST_F(LedgerTest, StartAtExpiresAtLosesAndTheUnitsComeBack) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  const ReservationReply late = start("r1", "op1", kT0 + 30'000);
  EXPECT_EQ(late.code, ReplyCode::kExpired);
  EXPECT_EQ(late.receipt.state, S::kExpired);
  EXPECT_EQ(late.refunded_units, 600u);  // this call returned them
  EXPECT_EQ(late.receipt.refunded_units, 600u);
  EXPECT_TRUE(late.receipt.operation_id.empty());
  // Released first, then refilled: the bucket is full, nothing more is minted.
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 1000}));
  EXPECT_TRUE(audited(kT0 + 30'000));
  // The queued expiry finds nothing left to do; a retry of start still says expired.
  EXPECT_EQ(ledger_.tick(kT0 + 30'000).expired, 0u);
  EXPECT_EQ(start("r1", "op1", kT0 + 30'001).code, ReplyCode::kExpired);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 1000}));
  EXPECT_TRUE(audited(kT0 + 30'001));
}

TEST_F(LedgerTest, BeginExpiryThenStartLoses) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  EXPECT_FALSE(ledger_.beginExpiry("r1", kT0 + 29'999));  // not yet due
  EXPECT_EQ(query("r1").receipt.state, S::kReserved);
  ASSERT_TRUE(ledger_.beginExpiry("r1", kT0 + 30'000));
  EXPECT_EQ(query("r1").receipt.state, S::kExpiring);
  // EXPIRING still holds its units.
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0 + 30'000));

  const ReservationReply started = start("r1", "op1", kT0 + 30'000);
  EXPECT_EQ(started.code, ReplyCode::kExpired);
  EXPECT_EQ(started.receipt.state, S::kExpiring);
  EXPECT_EQ(release("r1", kT0 + 30'000).code, ReplyCode::kExpired);
  EXPECT_EQ(settle("r1", "op1", 10, kT0 + 30'000).code, ReplyCode::kInvalidState);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0 + 30'000));

  EXPECT_FALSE(ledger_.beginExpiry("r1", kT0 + 30'000));  // already EXPIRING
  ASSERT_TRUE(ledger_.completeExpiry("r1", kT0 + 30'000));
  EXPECT_EQ(query("r1").receipt.state, S::kExpired);
  EXPECT_EQ(query("r1").receipt.refunded_units, 600u);
  EXPECT_EQ(query("r1").receipt.closed_at_ms, kT0 + 30'000);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 1000}));
  EXPECT_TRUE(audited(kT0 + 30'000));

  // Exactly once: neither half acts again.
  EXPECT_FALSE(ledger_.completeExpiry("r1", kT0 + 30'000));
  EXPECT_FALSE(ledger_.beginExpiry("r1", kT0 + 30'000));
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 1000}));
  EXPECT_TRUE(audited(kT0 + 30'000));
}

TEST_F(LedgerTest, StartThenBeginExpiryLoses) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1", kT0 + 1'000).code, ReplyCode::kOk);
  EXPECT_FALSE(ledger_.beginExpiry("r1", kT0 + 30'000));
  EXPECT_FALSE(ledger_.completeExpiry("r1", kT0 + 30'000));
  EXPECT_EQ(ledger_.tick(kT0 + 30'000).expired, 0u);
  EXPECT_EQ(query("r1").receipt.state, S::kStarted);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0 + 30'000));
}

TEST_F(LedgerTest, CompleteExpiryWithoutBeginDoesNothing) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  EXPECT_FALSE(ledger_.completeExpiry("r1", kT0 + 30'000));
  EXPECT_EQ(query("r1").receipt.state, S::kReserved);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_FALSE(ledger_.beginExpiry("nope", kT0 + 30'000));
  EXPECT_FALSE(ledger_.completeExpiry("nope", kT0 + 30'000));
  EXPECT_TRUE(audited(kT0 + 30'000));
}

TEST_F(LedgerTest, StartInTerminalOrRejectedStates) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(reserve("r2", 600, kT0, 2).code, ReplyCode::kRejected);
  ASSERT_EQ(release("r1").code, ReplyCode::kOk);
  EXPECT_EQ(start("r1", "op1").code, ReplyCode::kInvalidState);
  EXPECT_EQ(start("r2", "op1").code, ReplyCode::kInvalidState);
  EXPECT_EQ(start("nope", "op1").code, ReplyCode::kNotFound);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 1000}));
  EXPECT_TRUE(audited(kT0));
}

// ---- release ----------------------------------------------------------------------------------

TEST_F(LedgerTest, ReleaseReturnsUnitsExactlyOnce) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  const ReservationReply first = release("r1");
  ASSERT_EQ(first.code, ReplyCode::kOk);
  EXPECT_FALSE(first.duplicate);
  EXPECT_EQ(first.refunded_units, 600u);
  EXPECT_EQ(first.receipt.state, S::kReleased);
  EXPECT_EQ(first.receipt.refunded_units, 600u);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 1000}));
  EXPECT_TRUE(audited(kT0));

  const ReservationReply second = release("r1");
  EXPECT_EQ(second.code, ReplyCode::kOk);
  EXPECT_TRUE(second.duplicate);
  EXPECT_EQ(second.refunded_units, 0u);
  EXPECT_EQ(second.receipt.state, S::kReleased);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 1000}));
  EXPECT_TRUE(audited(kT0));
}

TEST_F(LedgerTest, ReleaseAfterStartIsRefused) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  const ReservationReply refused = release("r1");
  EXPECT_EQ(refused.code, ReplyCode::kInvalidState);
  EXPECT_EQ(refused.refunded_units, 0u);
  EXPECT_EQ(refused.receipt.state, S::kStarted);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0));
}

TEST_F(LedgerTest, ReleaseOfExpiredSaysExpired) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(ledger_.tick(kT0 + 30'000).expired, 1u);
  const ReservationReply refused = release("r1", kT0 + 30'000);
  EXPECT_EQ(refused.code, ReplyCode::kExpired);
  EXPECT_EQ(refused.refunded_units, 0u);
  EXPECT_EQ(refused.receipt.state, S::kExpired);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 1000}));
  EXPECT_TRUE(audited(kT0 + 30'000));
}

TEST_F(LedgerTest, ReleaseOfRejectedOrSettledIsRefused) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(reserve("r2", 600, kT0, 2).code, ReplyCode::kRejected);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  ASSERT_EQ(settle("r1", "op1", 600).code, ReplyCode::kOk);
  EXPECT_EQ(release("r1").code, ReplyCode::kInvalidState);
  EXPECT_EQ(release("r2").code, ReplyCode::kInvalidState);
  EXPECT_EQ(release("nope").code, ReplyCode::kNotFound);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .spent = 600}));
  EXPECT_TRUE(audited(kT0));
}

// ---- settle -----------------------------------------------------------------------------------

TEST_F(LedgerTest, SettleBeforeStartIsRefused) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  const ReservationReply refused = settle("r1", "op1", 200);
  EXPECT_EQ(refused.code, ReplyCode::kInvalidState);
  EXPECT_EQ(refused.receipt.state, S::kReserved);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_EQ(settle("nope", "op1", 200).code, ReplyCode::kNotFound);
  EXPECT_TRUE(audited(kT0));
}

TEST_F(LedgerTest, SettleWithAnotherOperationIsRefused) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  const ReservationReply refused = settle("r1", "op2", 200);
  EXPECT_EQ(refused.code, ReplyCode::kOperationConflict);
  EXPECT_EQ(refused.receipt.state, S::kStarted);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0));
}

TEST_F(LedgerTest, SettleExactlyEqual) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  const ReservationReply settled = settle("r1", "op1", 600);
  ASSERT_EQ(settled.code, ReplyCode::kOk);
  EXPECT_EQ(settled.refunded_units, 0u);
  EXPECT_EQ(settled.receipt.state, S::kSettled);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .spent = 600}));
  EXPECT_TRUE(audited(kT0));
}

TEST_F(LedgerTest, DuplicateSettleReturnsTheFirstResultAndRefundsNothing) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  const ReservationReply first = settle("r1", "op1", 200);
  ASSERT_EQ(first.code, ReplyCode::kOk);
  EXPECT_EQ(first.refunded_units, 400u);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 800, .spent = 200}));

  const ReservationReply again = settle("r1", "op1", 200);
  EXPECT_EQ(again.code, ReplyCode::kOk);
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.refunded_units, 0u);
  EXPECT_EQ(again.receipt, first.receipt);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 800, .spent = 200}));
  EXPECT_TRUE(audited(kT0));

  // A duplicate with another actual still answers the first result.
  const ReservationReply different = settle("r1", "op1", 500);
  EXPECT_EQ(different.code, ReplyCode::kOk);
  EXPECT_TRUE(different.duplicate);
  EXPECT_EQ(different.refunded_units, 0u);
  EXPECT_EQ(different.receipt.actual_units, 200u);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 800, .spent = 200}));
  // And the wrong operation is still a conflict after settling.
  EXPECT_EQ(settle("r1", "op2", 200).code, ReplyCode::kOperationConflict);
  // start with the bound operation is a harmless duplicate; another one conflicts.
  EXPECT_TRUE(start("r1", "op1").duplicate);
  EXPECT_EQ(start("r1", "op2").code, ReplyCode::kOperationConflict);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 800, .spent = 200}));
  EXPECT_TRUE(audited(kT0));
}

TEST_F(LedgerTest, SettleAboveReservationTakesAvailableThenDebtAndFreezesAdmission) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  // 1200 used of 600 reserved: 600 excess; 400 from available, 200 of debt.
  const ReservationReply settled = settle("r1", "op1", 1200);
  ASSERT_EQ(settled.code, ReplyCode::kOk);
  EXPECT_EQ(settled.refunded_units, 0u);
  EXPECT_EQ(settled.receipt.state, S::kSettledWithDebt);
  EXPECT_EQ(settled.receipt.actual_units, 1200u);
  EXPECT_EQ(settled.receipt.debt_units, 200u);
  EXPECT_FALSE(settled.receipt.overdraft_breach);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .overdraft_issued = 200, .spent = 1200}));
  EXPECT_EQ(ledger_.accounts().find(keyOf(1))->account.debt(), 200u);
  EXPECT_TRUE(audited(kT0));

  // Admission is frozen while debt is outstanding: 100 asked + 200 owed at 10/s = 30 s.
  const ReservationReply frozen = reserve("r2", 100, kT0, 2);
  EXPECT_EQ(frozen.code, ReplyCode::kRejected);
  EXPECT_EQ(frozen.receipt.limiting_dimension, LimitingDimension::kDebt);
  EXPECT_EQ(frozen.receipt.retry_after_ms, 30'000);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .overdraft_issued = 200, .spent = 1200}));
  EXPECT_TRUE(audited(kT0));

  // 20 s later refill has minted exactly the debt, all of it repaid: no longer debt, but
  // nothing available yet either.
  const ReservationReply repaid = reserve("r3", 100, kT0 + 20'000, 3);
  EXPECT_EQ(repaid.code, ReplyCode::kRejected);
  EXPECT_EQ(repaid.receipt.limiting_dimension, LimitingDimension::kCapacity);
  EXPECT_EQ(repaid.receipt.retry_after_ms, 10'000);
  EXPECT_EQ(balances(), (Balances{.opening = 1000,
                                  .minted = 200,
                                  .overdraft_issued = 200,
                                  .spent = 1200,
                                  .overdraft_repaid = 200}));
  EXPECT_EQ(ledger_.accounts().find(keyOf(1))->account.debt(), 0u);
  EXPECT_TRUE(audited(kT0 + 20'000));

  // 10 s more: 100 available, admitted.
  const ReservationReply admitted = reserve("r4", 100, kT0 + 30'000, 4);
  EXPECT_EQ(admitted.code, ReplyCode::kOk);
  EXPECT_EQ(admitted.receipt.state, S::kReserved);
  EXPECT_EQ(balances(), (Balances{.opening = 1000,
                                  .minted = 300,
                                  .overdraft_issued = 200,
                                  .available = 0,
                                  .reserved = 100,
                                  .spent = 1200,
                                  .overdraft_repaid = 200}));
  EXPECT_TRUE(audited(kT0 + 30'000));
}

TEST_F(LedgerTest, DebtBeyondMaxOverdraftIsRecordedInFullAndFlagged) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  const ReservationReply settled = settle("r1", "op1", 1600);  // debt 600 > max 500
  ASSERT_EQ(settled.code, ReplyCode::kOk);
  EXPECT_EQ(settled.receipt.state, S::kSettledWithDebt);
  EXPECT_EQ(settled.receipt.debt_units, 600u);
  EXPECT_TRUE(settled.receipt.overdraft_breach);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .overdraft_issued = 600, .spent = 1600}));
  EXPECT_TRUE(audited(kT0));
  // The duplicate adds no second debt.
  EXPECT_TRUE(settle("r1", "op1", 1600).duplicate);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .overdraft_issued = 600, .spent = 1600}));
  EXPECT_TRUE(audited(kT0));
}

TEST_F(LedgerTest, SettleAboveCoveredByAvailable) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  // 300 excess, all of it covered by the 400 available: no debt.
  const ReservationReply settled = settle("r1", "op1", 900);
  ASSERT_EQ(settled.code, ReplyCode::kOk);
  EXPECT_EQ(settled.refunded_units, 0u);
  EXPECT_EQ(settled.receipt.debt_units, 0u);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 100, .spent = 900}));
  EXPECT_TRUE(audited(kT0));
  EXPECT_EQ(reserve("r2", 100, kT0, 2).code, ReplyCode::kOk);  // no debt, no freeze
  // SPEC: §4 "settle a > u … state SETTLED_WITH_DEBT" and the article "If actual usage exceeds
  // the reservation … set the state to SETTLED_WITH_DEBT": the table does not make the state
  // depend on d > 0. The ledger answers SETTLED when the excess fits in available.
  EXPECT_EQ(settled.receipt.state, S::kSettledWithDebt);
}

// ---- USAGE_UNKNOWN and the hard execution limit ---------------------------------------------

TEST_F(LedgerTest, UsageUnknownKeepsUnitsUntilAReceipt) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  const ReservationReply unknown = markUnknown("r1", "op1");
  ASSERT_EQ(unknown.code, ReplyCode::kOk);
  EXPECT_EQ(unknown.refunded_units, 0u);  // a timeout is not a refund
  EXPECT_EQ(unknown.receipt.state, S::kUsageUnknown);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0));

  EXPECT_TRUE(markUnknown("r1", "op1").duplicate);
  EXPECT_EQ(markUnknown("r1", "op2").code, ReplyCode::kOperationConflict);
  EXPECT_EQ(release("r1").code, ReplyCode::kInvalidState);
  EXPECT_EQ(report("r1", "op2", 100).code, ReplyCode::kOperationConflict);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0));

  const ReservationReply resolved = report("r1", "op1", 100);
  ASSERT_EQ(resolved.code, ReplyCode::kOk);
  EXPECT_EQ(resolved.refunded_units, 500u);
  EXPECT_EQ(resolved.receipt.state, S::kSettled);
  EXPECT_EQ(resolved.receipt.actual_units, 100u);
  EXPECT_FALSE(resolved.receipt.closed_by_hard_limit);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 900, .spent = 100}));
  EXPECT_TRUE(audited(kT0));

  // Once resolved, the hard limit has nothing to close.
  EXPECT_EQ(ledger_.tick(kT0 + kHardLimitMs).closed_by_hard_limit, 0u);
  EXPECT_EQ(query("r1").receipt.state, S::kSettled);
  EXPECT_TRUE(audited(kT0 + kHardLimitMs));
}

TEST_F(LedgerTest, MarkUnknownOnlyFromStarted) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  EXPECT_EQ(markUnknown("r1", "op1").code, ReplyCode::kInvalidState);
  EXPECT_EQ(markUnknown("nope", "op1").code, ReplyCode::kNotFound);
  EXPECT_EQ(query("r1").receipt.state, S::kReserved);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0));
}

TEST_F(LedgerTest, HardLimitClosesAsFullyConsumedAndALateReceiptRecordsTheExtraOnce) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  ASSERT_EQ(markUnknown("r1", "op1", kT0 + 1'000).code, ReplyCode::kOk);

  // The limit runs from started_at (kT0), not from the mark.
  TickOutcome ticked = ledger_.tick(kT0 + kHardLimitMs - 1);
  EXPECT_EQ(ticked.closed_by_hard_limit, 0u);
  EXPECT_EQ(ticked.expired, 0u);
  EXPECT_EQ(query("r1").receipt.state, S::kUsageUnknown);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0 + kHardLimitMs - 1));

  ticked = ledger_.tick(kT0 + kHardLimitMs);
  EXPECT_EQ(ticked.closed_by_hard_limit, 1u);
  const Reservation closed = query("r1").receipt;
  EXPECT_EQ(closed.state, S::kSettled);
  EXPECT_EQ(closed.actual_units, 600u);
  EXPECT_EQ(closed.refunded_units, 0u);
  EXPECT_TRUE(closed.closed_by_hard_limit);
  EXPECT_EQ(closed.closed_at_ms, kT0 + kHardLimitMs);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .spent = 600}));
  EXPECT_TRUE(audited(kT0 + kHardLimitMs));
  EXPECT_EQ(ledger_.tick(kT0 + kHardLimitMs).closed_by_hard_limit, 0u);

  // The receipt finally arrives: 1100 used. 500 extra: 400 from available, 100 of debt.
  const ReservationReply late = report("r1", "op1", 1100, kT0 + kHardLimitMs);
  EXPECT_EQ(late.code, ReplyCode::kOk);
  EXPECT_FALSE(late.duplicate);
  EXPECT_EQ(late.refunded_units, 0u);
  EXPECT_EQ(late.receipt.state, S::kSettledWithDebt);
  EXPECT_EQ(late.receipt.actual_units, 1100u);
  EXPECT_EQ(late.receipt.debt_units, 100u);
  EXPECT_TRUE(late.receipt.late_receipt_applied);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .overdraft_issued = 100, .spent = 1100}));
  EXPECT_TRUE(audited(kT0 + kHardLimitMs));

  // A second late receipt changes nothing.
  const ReservationReply second = report("r1", "op1", 2000, kT0 + kHardLimitMs);
  EXPECT_EQ(second.code, ReplyCode::kOk);
  EXPECT_TRUE(second.duplicate);
  EXPECT_EQ(second.receipt.actual_units, 1100u);
  EXPECT_EQ(settle("r1", "op1", 5000, kT0 + kHardLimitMs).receipt.actual_units, 1100u);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .overdraft_issued = 100, .spent = 1100}));
  EXPECT_TRUE(audited(kT0 + kHardLimitMs));
}

TEST_F(LedgerTest, LateSmallerReceiptRefundsNothing) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  ASSERT_EQ(markUnknown("r1", "op1").code, ReplyCode::kOk);
  ASSERT_EQ(ledger_.tick(kT0 + kHardLimitMs).closed_by_hard_limit, 1u);
  const ReservationReply late = report("r1", "op1", 100, kT0 + kHardLimitMs);
  EXPECT_EQ(late.code, ReplyCode::kOk);
  EXPECT_EQ(late.refunded_units, 0u);
  EXPECT_EQ(late.receipt.state, S::kSettled);
  EXPECT_EQ(late.receipt.actual_units, 600u);  // treated as spent
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .spent = 600}));
  // That was the receipt; a larger one after it is a duplicate.
  EXPECT_TRUE(report("r1", "op1", 1100, kT0 + kHardLimitMs).duplicate);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .spent = 600}));
  EXPECT_TRUE(audited(kT0 + kHardLimitMs));
}

TEST_F(LedgerTest, StartedWithoutMarkUnknownIsNeverClosedByTheHardLimit) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  EXPECT_EQ(ledger_.tick(kT0 + 10 * kHardLimitMs).closed_by_hard_limit, 0u);
  EXPECT_EQ(query("r1").receipt.state, S::kStarted);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0 + 10 * kHardLimitMs));
}

// ---- tick: expiry and compaction --------------------------------------------------------------

TEST_F(LedgerTest, TickExpiresAtExpiresAtExactly) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  EXPECT_EQ(ledger_.tick(kT0 + kHoldTtlMs - 1).expired, 0u);
  EXPECT_EQ(query("r1").receipt.state, S::kReserved);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  EXPECT_TRUE(audited(kT0 + kHoldTtlMs - 1));

  EXPECT_EQ(ledger_.tick(kT0 + kHoldTtlMs).expired, 1u);
  const Reservation expired = query("r1").receipt;
  EXPECT_EQ(expired.state, S::kExpired);
  EXPECT_EQ(expired.refunded_units, 600u);
  EXPECT_EQ(expired.closed_at_ms, kT0 + kHoldTtlMs);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 1000}));
  EXPECT_TRUE(audited(kT0 + kHoldTtlMs));

  EXPECT_EQ(ledger_.tick(kT0 + kHoldTtlMs + 1).expired, 0u);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 1000}));
}

TEST_F(LedgerTest, TickHonoursItemsMax) {
  ASSERT_EQ(reserve("r1", 100).code, ReplyCode::kOk);
  ASSERT_EQ(reserve("r2", 200, kT0 + 1, 2).code, ReplyCode::kOk);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 700, .reserved = 300}));
  // r1 is due at kT0 + 30'000, r2 at kT0 + 30'001; one item per tick.
  EXPECT_EQ(ledger_.tick(kT0 + 30'001, 1).expired, 1u);
  EXPECT_EQ(query("r1").receipt.state, S::kExpired);
  EXPECT_EQ(query("r2").receipt.state, S::kReserved);
  // r1's 100 came back (800), then 30 s of refill filled the bucket: 200 minted.
  EXPECT_EQ(balances(),
            (Balances{.opening = 1000, .minted = 200, .available = 1000, .reserved = 200}));
  EXPECT_TRUE(audited(kT0 + 30'001));
  EXPECT_EQ(ledger_.tick(kT0 + 30'001, 1).expired, 1u);
  EXPECT_EQ(query("r2").receipt.state, S::kExpired);
  // Refunds are not capped by burst (SPEC §4 release: available += u): the 200 that r2 held
  // while the bucket refilled come back on top of a full bucket.
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .minted = 200, .available = 1200}));
  EXPECT_TRUE(audited(kT0 + 30'001));
  EXPECT_EQ(ledger_.tick(kT0 + 30'001, 1).expired, 0u);
}

TEST(LedgerCompactionTest, TerminalReservationsAreForgottenAfterRetention) {
  Ledger ledger(LedgerOptions{.retention_ms = 5'000});
  ASSERT_EQ(ledger.publishPolicy(testPolicy(), kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger.reserve(reserveRequest("r1", 600, 1), kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger.reserve(reserveRequest("r2", 600, 2), kT0).code, ReplyCode::kRejected);
  ASSERT_EQ(ledger.reserve(reserveRequest("held", 100, 3), kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger.release({.reservation_id = "r1"}, kT0 + 1'000).code, ReplyCode::kOk);
  (void)ledger.takeChanges();
  EXPECT_EQ(ledger.reservationCount(), 3u);
  // The release at kT0 + 1'000 also refilled 1 s: 10 minted.
  EXPECT_EQ(balancesOf(ledger, 1),
            (Balances{.opening = 1000, .minted = 10, .available = 910, .reserved = 100}));
  EXPECT_TRUE(audited(ledger, kT0 + 1'000));

  // r2 was rejected at kT0: gone at kT0 + 5'000. r1 was released at kT0 + 1'000.
  TickOutcome ticked = ledger.tick(kT0 + 4'999);
  EXPECT_EQ(ticked.compacted, 0u);
  ticked = ledger.tick(kT0 + 5'000);
  EXPECT_EQ(ticked.compacted, 1u);
  EXPECT_EQ(ledger.query({.reservation_id = "r2"}).code, ReplyCode::kNotFound);
  EXPECT_EQ(ledger.query({.reservation_id = "r1"}).code, ReplyCode::kOk);
  ticked = ledger.tick(kT0 + 6'000);
  EXPECT_EQ(ticked.compacted, 1u);
  const ReservationReply gone = ledger.query({.reservation_id = "r1"});
  EXPECT_EQ(gone.code, ReplyCode::kNotFound);
  EXPECT_EQ(ledger.findReservation("r1"), nullptr);
  // The live reservation is never compacted.
  EXPECT_EQ(ledger.query({.reservation_id = "held"}).receipt.state, S::kReserved);
  EXPECT_EQ(ledger.reservationCount(), 1u);
  EXPECT_TRUE(audited(ledger, kT0 + 6'000));

  const LedgerChanges changes = ledger.takeChanges();
  EXPECT_THAT(changes.reservations_deleted, ElementsAre("r2", "r1"));
  EXPECT_TRUE(changes.reservations_upserted.empty());

  // Past the idempotency window the id is free again: a new reservation, even with another
  // digest, and no conflict.
  const ReservationReply fresh = ledger.reserve(reserveRequest("r1", 600, 7), kT0 + 6'000);
  EXPECT_EQ(fresh.code, ReplyCode::kOk);
  EXPECT_FALSE(fresh.duplicate);
  EXPECT_EQ(fresh.receipt.created_at_ms, kT0 + 6'000);
  EXPECT_EQ(fresh.receipt.request_digest, digestOf(7));
  // 5 s more of refill (50) before the 600 are reserved.
  EXPECT_EQ(balancesOf(ledger, 1),
            (Balances{.opening = 1000, .minted = 60, .available = 360, .reserved = 700}));
  EXPECT_TRUE(audited(ledger, kT0 + 6'000));
  // The stale expiry entry of the first r1 (due kT0 + 30'000) must not expire the new one early.
  EXPECT_EQ(ledger.tick(kT0 + 30'000).expired, 1u);  // only "held"
  EXPECT_EQ(ledger.query({.reservation_id = "r1"}).receipt.state, S::kReserved);
  EXPECT_EQ(ledger.tick(kT0 + 36'000).expired, 1u);
  EXPECT_EQ(ledger.query({.reservation_id = "r1"}).receipt.state, S::kExpired);
  EXPECT_TRUE(audited(ledger, kT0 + 36'000));
}

// ---- policy generations -----------------------------------------------------------------------

// A filtered audit (tallyctl audit --subject/--route) lists what the whole audit lists for the
// selected accounts, with the same verdict and the same draining state of each generation,
// though the accounts left out are never copied into views.
TEST(LedgerAuditFilterTest, AFilteredAuditIsTheWholeAuditNarrowedToTheFilter) {
  Ledger ledger;
  Policy policy;
  for (const char* route : {"chat", "batch"}) {
    Budget budget = testBudget();
    budget.subject_pattern = "tenant-*";
    budget.route = route;
    policy.budgets.push_back(budget);
  }
  ASSERT_EQ(ledger.publishPolicy(policy, kT0).code, ReplyCode::kOk);
  auto reserve = [&](const std::string& id, const std::string& subject, const std::string& route,
                     Units units) {
    ReserveRequest request = reserveRequest(id, units, 1, 0, subject);
    request.route = route;
    return ledger.reserve(request, kT0).code;
  };
  ASSERT_EQ(reserve("a", "tenant-1", "chat", 100), ReplyCode::kOk);  // holds generation 1
  ASSERT_EQ(reserve("b", "tenant-2", "chat", 50), ReplyCode::kOk);
  ASSERT_EQ(reserve("c", "tenant-2", "batch", 70), ReplyCode::kOk);
  ASSERT_EQ(ledger.release({.reservation_id = "b"}, kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger.release({.reservation_id = "c"}, kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger.publishPolicy(policy, kT0 + 10).code, ReplyCode::kOk);  // generation 2
  ASSERT_EQ(reserve("d", "tenant-3", "batch", 10), ReplyCode::kOk);

  const uint64_t now = kT0 + 5'000;
  const AuditReport whole = ledger.audit(now);
  ASSERT_TRUE(whole.conserved);
  ASSERT_GE(whole.accounts.size(), 4u);
  const std::vector<AccountFilter> filters = {{},
                                              {.subject = "tenant-2"},
                                              {.route = "chat"},
                                              {.subject = "tenant-1", .route = "chat"},
                                              {.subject = "tenant-9"}};
  for (const AccountFilter& filter : filters) {
    std::vector<AccountView> expected;
    for (const AccountView& view : whole.accounts) {
      if (filter.matches(SubjectRoute{view.key.subject, view.key.route})) expected.push_back(view);
    }
    const AuditReport filtered = ledger.audit(now, filter);
    EXPECT_EQ(filtered.accounts, expected) << filter.subject << "/" << filter.route;
    EXPECT_EQ(filtered.conserved, whole.conserved);
    EXPECT_EQ(filtered.violations, whole.violations);
    EXPECT_EQ(filtered.shards, whole.shards);
  }
  // tenant-1's generation 1 still holds "a": every generation-1 account is draining, whichever
  // accounts the filter lists.
  const AuditReport tenant2 = ledger.audit(now, {.subject = "tenant-2"});
  bool saw_generation_1 = false;
  for (const AccountView& view : tenant2.accounts) {
    if (view.key.generation != 1) continue;
    saw_generation_1 = true;
    EXPECT_EQ(view.generation_state, GenerationState::kDraining) << view.key.route;
  }
  EXPECT_TRUE(saw_generation_1);
}

// Paged audits (routes_max) list the whole audit's accounts in key order, a page at a time,
// each page with the whole verdict; `more` is false only on the last.
TEST(LedgerAuditFilterTest, PagesOfAnAuditConcatenateToTheWholeListing) {
  Ledger ledger;
  Budget budget = testBudget();
  budget.subject_pattern = "tenant-*";
  ASSERT_EQ(ledger.publishPolicy(Policy{.budgets = {budget}}, kT0).code, ReplyCode::kOk);
  for (int i = 0; i < 23; ++i) {
    const std::string subject = "tenant-" + std::to_string(i);
    ASSERT_EQ(ledger.reserve(reserveRequest("r" + std::to_string(i), 5, 1, 0, subject), kT0).code,
              ReplyCode::kOk);
    if (i == 7) {
      ASSERT_EQ(ledger.publishPolicy(Policy{.budgets = {budget}}, kT0).code, ReplyCode::kOk);
    }
  }
  // tenant-0 and tenant-1 now have an account in each generation.
  for (const char* subject : {"tenant-0", "tenant-1"}) {
    ASSERT_EQ(
        ledger.reserve(reserveRequest(std::string("again-") + subject, 5, 1, 0, subject), kT0).code,
        ReplyCode::kOk);
  }
  const AuditReport whole = ledger.audit(kT0 + 1);
  ASSERT_EQ(whole.accounts.size(), 25u);
  EXPECT_FALSE(whole.more);
  std::vector<AccountView> listed;
  AccountFilter page{.routes_max = 5};
  std::string after_subject;
  std::string after_route;
  for (int pages = 1;; ++pages) {
    ASSERT_LE(pages, 5);  // 23 routes, 5 a page
    page.after_subject = after_subject;
    page.after_route = after_route;
    const AuditReport report = ledger.audit(kT0 + 1, page);
    EXPECT_EQ(report.conserved, whole.conserved);
    EXPECT_EQ(report.violations, whole.violations);
    ASSERT_FALSE(report.accounts.empty());
    listed.insert(listed.end(), report.accounts.begin(), report.accounts.end());
    after_subject = report.accounts.back().key.subject;
    after_route = report.accounts.back().key.route;
    if (!report.more) {
      EXPECT_EQ(pages, 5);
      break;
    }
  }
  EXPECT_EQ(listed, whole.accounts);
}

// The accounts a filter leaves out are checked without a projection unless they owe debt: a
// draining generation whose only holding is debt that refill repays by `now` is DRAINED in the
// filtered audit exactly when it is in the whole one.
TEST(LedgerAuditFilterTest, DebtRepaidByProjectionDrainsTheGenerationInAFilteredAuditToo) {
  Ledger ledger;
  Budget budget = testBudget();
  budget.subject_pattern = "tenant-*";
  ASSERT_EQ(ledger.publishPolicy(Policy{.budgets = {budget}}, kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger.reserve(reserveRequest("owes", 1000, 1, 0, "tenant-4"), kT0).code,
            ReplyCode::kOk);
  ASSERT_EQ(ledger.start({.reservation_id = "owes", .operation_id = "op"}, kT0).code,
            ReplyCode::kOk);
  ASSERT_EQ(
      ledger.settle({.reservation_id = "owes", .operation_id = "op", .actual_units = 1200}, kT0)
          .receipt.debt_units,
      200u);
  ASSERT_EQ(ledger.reserve(reserveRequest("free", 10, 1, 0, "tenant-6"), kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger.release({.reservation_id = "free"}, kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger.publishPolicy(Policy{.budgets = {budget}}, kT0).code, ReplyCode::kOk);
  // tenant-4's first request in generation 2 opens its account there (refused: it owes debt);
  // refill of that account is what repays generation 1's debt.
  (void)ledger.reserve(reserveRequest("after", 1, 1, 0, "tenant-4"), kT0);
  const AccountFilter tenant6{.subject = "tenant-6"};
  for (const uint64_t now : {kT0 + 1'000, kT0 + 60'000}) {  // 10/s repays 200 in 20 s
    const AuditReport whole = ledger.audit(now);
    std::vector<AccountView> expected;
    for (const AccountView& view : whole.accounts) {
      if (tenant6.matches(SubjectRoute{view.key.subject, view.key.route})) expected.push_back(view);
    }
    const AuditReport filtered = ledger.audit(now, tenant6);
    ASSERT_EQ(filtered.accounts, expected) << now;
    EXPECT_EQ(filtered.conserved, whole.conserved);
    ASSERT_FALSE(filtered.accounts.empty());
    EXPECT_EQ(filtered.accounts[0].generation_state,
              now == kT0 + 1'000 ? GenerationState::kDraining : GenerationState::kDrained)
        << now;
  }
}

TEST_F(LedgerTest, GenerationSwitchHandsCapacityOverAndRollbackRepublishes) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  EXPECT_EQ(balances(1), (Balances{.opening = 1000, .available = 400, .reserved = 600}));

  Policy second = testPolicy();
  second.budgets[0].max_overdraft = 100;  // a different policy, same bucket
  const PolicyReply published = ledger_.publishPolicy(second, kT0);
  ASSERT_EQ(published.code, ReplyCode::kOk);
  EXPECT_EQ(published.generation, 2u);
  EXPECT_EQ(ledger_.accounts().activeGeneration(), 2u);
  EXPECT_EQ(ledger_.accounts().generationState(1), GenerationState::kDraining);
  EXPECT_EQ(ledger_.accounts().generationState(2), GenerationState::kActive);
  EXPECT_TRUE(audited(kT0));

  // The next reservation lands in generation 2, which opened empty and received generation 1's
  // 400 available as one paired transfer.
  const ReservationReply r2 = reserve("r2", 100, kT0, 2);
  ASSERT_EQ(r2.code, ReplyCode::kOk);
  EXPECT_EQ(r2.receipt.policy_generation, 2u);
  EXPECT_EQ(balances(1),
            (Balances{.opening = 1000, .available = 0, .reserved = 600, .transferred_out = 400}));
  EXPECT_EQ(balances(2),
            (Balances{.opening = 0, .minted = 400, .available = 300, .reserved = 100}));
  EXPECT_EQ(balances(1).transferred_out, balances(2).minted);
  EXPECT_TRUE(audited(kT0));
  RouteTotals totals = routeTotals(ledger_, kT0);
  EXPECT_EQ(totals.sources, 1000u);
  EXPECT_EQ(totals.uses, 1000u);

  // Pinned to the draining generation: refused.
  const ReservationReply pinned = ledger_.reserve(reserveRequest("r3", 10, 3, 1), kT0);
  EXPECT_EQ(pinned.code, ReplyCode::kRejected);
  EXPECT_EQ(pinned.receipt.limiting_dimension, LimitingDimension::kGenerationDraining);
  EXPECT_EQ(pinned.receipt.policy_generation, 1u);
  // Pinned to a generation that never existed.
  const ReservationReply unknown = ledger_.reserve(reserveRequest("r3b", 10, 4, 99), kT0);
  EXPECT_EQ(unknown.code, ReplyCode::kRejected);
  EXPECT_EQ(unknown.receipt.limiting_dimension, LimitingDimension::kNoBudget);
  // Pinned to the active one: fine.
  const ReservationReply active = ledger_.reserve(reserveRequest("r3c", 10, 5, 2), kT0);
  EXPECT_EQ(active.code, ReplyCode::kOk);
  ASSERT_EQ(release("r3c").code, ReplyCode::kOk);
  EXPECT_EQ(balances(2),
            (Balances{.opening = 0, .minted = 400, .available = 300, .reserved = 100}));
  EXPECT_TRUE(audited(kT0));

  // Settling in generation 1 after the switch: the 400 refund moves on to generation 2.
  const ReservationReply settled = settle("r1", "op1", 200);
  ASSERT_EQ(settled.code, ReplyCode::kOk);
  EXPECT_EQ(settled.refunded_units, 400u);
  EXPECT_EQ(balances(1), (Balances{.opening = 1000, .spent = 200, .transferred_out = 800}));
  EXPECT_EQ(balances(2), (Balances{.minted = 800, .available = 700, .reserved = 100}));
  EXPECT_EQ(ledger_.accounts().generationState(1), GenerationState::kDrained);
  EXPECT_TRUE(audited(kT0));
  totals = routeTotals(ledger_, kT0);
  EXPECT_EQ(totals.sources, 1000u);
  EXPECT_EQ(totals.uses, 1000u);

  // Rollback: generation 1's budgets come back as generation 3; generation 2 drains.
  const PolicyReply rolled = ledger_.rollbackPolicy(kT0);
  ASSERT_EQ(rolled.code, ReplyCode::kOk);
  EXPECT_EQ(rolled.generation, 3u);
  EXPECT_EQ(ledger_.accounts().activeGeneration(), 3u);
  ASSERT_NE(ledger_.accounts().policy(3), nullptr);
  EXPECT_EQ(ledger_.accounts().policy(3)->generation, 3u);
  EXPECT_EQ(ledger_.accounts().policy(3)->budgets, ledger_.accounts().policy(1)->budgets);
  EXPECT_NE(ledger_.accounts().policy(3)->budgets, ledger_.accounts().policy(2)->budgets);
  EXPECT_EQ(ledger_.accounts().generationState(2), GenerationState::kDraining);
  EXPECT_TRUE(audited(kT0));

  const ReservationReply r4 = reserve("r4", 50, kT0, 6);
  ASSERT_EQ(r4.code, ReplyCode::kOk);
  EXPECT_EQ(r4.receipt.policy_generation, 3u);
  EXPECT_EQ(balances(2), (Balances{.minted = 800, .reserved = 100, .transferred_out = 700}));
  EXPECT_EQ(balances(3), (Balances{.minted = 700, .available = 650, .reserved = 50}));
  EXPECT_TRUE(audited(kT0));

  // Releasing in draining generation 2 hands the refund to generation 3.
  ASSERT_EQ(release("r2").code, ReplyCode::kOk);
  EXPECT_EQ(balances(1), (Balances{.opening = 1000, .spent = 200, .transferred_out = 800}));
  EXPECT_EQ(balances(2), (Balances{.minted = 800, .transferred_out = 800}));
  EXPECT_EQ(balances(3), (Balances{.minted = 800, .available = 750, .reserved = 50}));
  EXPECT_EQ(ledger_.accounts().generationState(2), GenerationState::kDrained);
  EXPECT_TRUE(audited(kT0));
  totals = routeTotals(ledger_, kT0);
  EXPECT_EQ(totals.sources, 1000u);
  EXPECT_EQ(totals.uses, 1000u);
  // Σ transferredOut = Σ minted: no transfer term is left over.
  EXPECT_EQ(balances(1).transferred_out + balances(2).transferred_out,
            balances(2).minted + balances(3).minted);

  // A second rollback would bounce back to generation 2's source: refused.
  EXPECT_EQ(ledger_.rollbackPolicy(kT0).code, ReplyCode::kInvalidState);
  EXPECT_EQ(ledger_.accounts().activeGeneration(), 3u);
  const std::vector<AccountView> views = ledger_.audit(kT0).accounts;
  ASSERT_EQ(views.size(), 3u);
  EXPECT_EQ(views[0].generation_state, GenerationState::kDrained);
  EXPECT_EQ(views[1].generation_state, GenerationState::kDrained);
  EXPECT_EQ(views[2].generation_state, GenerationState::kActive);
  EXPECT_EQ(views[2].accounting_epoch_ms, kEpochStartMs);
}

TEST_F(LedgerTest, SwitchToASmallerBurstMovesOnlyWhatFits) {
  ASSERT_EQ(reserve("r1", 100).code, ReplyCode::kOk);
  Policy smaller = testPolicy();
  smaller.budgets[0].burst = 500;
  smaller.budgets[0].max_single_reservation = 500;
  ASSERT_EQ(ledger_.publishPolicy(smaller, kT0).generation, 2u);

  // Generation 1 holds 900 available; generation 2 takes 500 (its burst), 400 stay behind.
  ASSERT_EQ(reserve("r2", 100, kT0, 2).code, ReplyCode::kOk);
  EXPECT_EQ(balances(1),
            (Balances{.opening = 1000, .available = 400, .reserved = 100, .transferred_out = 500}));
  EXPECT_EQ(balances(2), (Balances{.minted = 500, .available = 400, .reserved = 100}));
  EXPECT_TRUE(audited(kT0));

  // r1's refund lands in generation 1; only the 100 of room generation 2 has left moves on.
  ASSERT_EQ(release("r1").code, ReplyCode::kOk);
  EXPECT_EQ(balances(1), (Balances{.opening = 1000, .available = 400, .transferred_out = 600}));
  EXPECT_EQ(balances(2), (Balances{.minted = 600, .available = 500, .reserved = 100}));
  EXPECT_TRUE(audited(kT0));
  RouteTotals totals = routeTotals(ledger_, kT0);
  EXPECT_EQ(totals.sources, 1000u);
  EXPECT_EQ(totals.uses, 1000u);

  // 10 s later: the draining account never refills; the active one is full, so nothing mints.
  ASSERT_EQ(reserve("r3", 50, kT0 + 10'000, 3).code, ReplyCode::kOk);
  EXPECT_EQ(balances(1), (Balances{.opening = 1000, .available = 400, .transferred_out = 600}));
  EXPECT_EQ(balances(2), (Balances{.minted = 600, .available = 450, .reserved = 150}));
  EXPECT_TRUE(audited(kT0 + 10'000));
  // The next admission finds 50 of room: 50 more move over before it is admitted.
  ASSERT_EQ(reserve("r4", 10, kT0 + 10'000, 4).code, ReplyCode::kOk);
  EXPECT_EQ(balances(1), (Balances{.opening = 1000, .available = 350, .transferred_out = 650}));
  EXPECT_EQ(balances(2), (Balances{.minted = 650, .available = 490, .reserved = 160}));
  totals = routeTotals(ledger_, kT0 + 10'000);
  EXPECT_EQ(totals.sources, 1000u);
  EXPECT_EQ(totals.uses, 1000u);
  EXPECT_TRUE(audited(kT0 + 10'000));
}

TEST(LedgerPolicyTest, PublishAndRollbackRefusals) {
  Ledger ledger;
  EXPECT_EQ(ledger.rollbackPolicy(kT0).code, ReplyCode::kInvalidState);
  Policy bad = testPolicy();
  bad.budgets[0].burst = 0;
  const PolicyReply refused = ledger.publishPolicy(bad, kT0);
  EXPECT_EQ(refused.code, ReplyCode::kInvalidArgument);
  EXPECT_THAT(refused.message, HasSubstr("'burst'"));
  EXPECT_EQ(ledger.accounts().activeGeneration(), 0u);
  ASSERT_EQ(ledger.publishPolicy(testPolicy(), kT0).generation, 1u);
  EXPECT_EQ(ledger.rollbackPolicy(kT0).code, ReplyCode::kInvalidState);  // nothing before 1
  EXPECT_EQ(ledger.accounts().activeGeneration(), 1u);
  EXPECT_TRUE(audited(ledger, kT0));
}

TEST_F(LedgerTest, SubjectOnlyInADrainingGenerationIsRefusedAsDraining) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  Budget other = testBudget();
  other.subject_pattern = "tenant-8";
  ASSERT_EQ(ledger_.publishPolicy(Policy{.budgets = {other}}, kT0).generation, 2u);
  const ReservationReply refused = reserve("r2", 100, kT0, 2);
  EXPECT_EQ(refused.code, ReplyCode::kRejected);
  EXPECT_EQ(refused.receipt.limiting_dimension, LimitingDimension::kGenerationDraining);
  EXPECT_EQ(refused.receipt.policy_generation, 1u);
  // Nothing moves: there is no generation-2 account to hand capacity to.
  ASSERT_EQ(release("r1").code, ReplyCode::kOk);
  EXPECT_EQ(balances(1), (Balances{.opening = 1000, .available = 1000}));
  EXPECT_EQ(ledger_.accounts().find(keyOf(2)), nullptr);
  EXPECT_TRUE(audited(kT0));
}

TEST_F(LedgerTest, DebtInADrainingGenerationFreezesTheRoute) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  ASSERT_EQ(ledger_.publishPolicy(testPolicy(), kT0).generation, 2u);
  ASSERT_EQ(reserve("r2", 400, kT0, 2).code, ReplyCode::kOk);  // all of generation 1's 400
  EXPECT_EQ(balances(1), (Balances{.opening = 1000, .reserved = 600, .transferred_out = 400}));
  EXPECT_EQ(balances(2), (Balances{.minted = 400, .reserved = 400}));

  // Generation 1 settles 1000 of 600: nothing available there, 400 of debt.
  const ReservationReply settled = settle("r1", "op1", 1000);
  ASSERT_EQ(settled.code, ReplyCode::kOk);
  EXPECT_EQ(settled.receipt.state, S::kSettledWithDebt);
  EXPECT_EQ(settled.receipt.debt_units, 400u);
  EXPECT_EQ(
      balances(1),
      (Balances{.opening = 1000, .overdraft_issued = 400, .spent = 1000, .transferred_out = 400}));
  EXPECT_EQ(ledger_.accounts().debt({kSubject, kRoute}), 400u);
  EXPECT_TRUE(audited(kT0));

  // Generation 2 owes nothing itself, but the route is frozen: 100 + 400 at 10/s = 50 s.
  const ReservationReply frozen = reserve("r3", 100, kT0, 3);
  EXPECT_EQ(frozen.code, ReplyCode::kRejected);
  EXPECT_EQ(frozen.receipt.limiting_dimension, LimitingDimension::kFrozenRoute);
  EXPECT_EQ(frozen.receipt.policy_generation, 2u);
  EXPECT_EQ(frozen.receipt.retry_after_ms, 50'000);
  EXPECT_TRUE(audited(kT0));

  // Releasing r2 gives generation 2 400 available, which pays generation 1's debt.
  ASSERT_EQ(release("r2").code, ReplyCode::kOk);
  EXPECT_EQ(balances(1), (Balances{.opening = 1000,
                                   .minted = 400,
                                   .overdraft_issued = 400,
                                   .spent = 1000,
                                   .overdraft_repaid = 400,
                                   .transferred_out = 400}));
  EXPECT_EQ(balances(2), (Balances{.minted = 400, .transferred_out = 400}));
  EXPECT_EQ(ledger_.accounts().debt({kSubject, kRoute}), 0u);
  EXPECT_TRUE(audited(kT0));
  const RouteTotals totals = routeTotals(ledger_, kT0);
  EXPECT_EQ(totals.sources, 1400u);  // 1000 opened + 400 overdraft
  EXPECT_EQ(totals.uses, 1400u);     // 1000 spent + 400 repaid

  const ReservationReply thawed = reserve("r4", 100, kT0, 4);
  EXPECT_EQ(thawed.code, ReplyCode::kRejected);
  EXPECT_EQ(thawed.receipt.limiting_dimension, LimitingDimension::kCapacity);
  EXPECT_TRUE(audited(kT0));
}

// ---- refused admissions and malformed requests ------------------------------------------------

TEST_F(LedgerTest, SubjectWithoutBudgetIsRejectedForever) {
  const ReservationReply refused = ledger_.reserve(reserveRequest("r1", 10, 1, 0, "stranger"), kT0);
  EXPECT_EQ(refused.code, ReplyCode::kRejected);
  EXPECT_EQ(refused.receipt.state, S::kRejected);
  EXPECT_EQ(refused.receipt.limiting_dimension, LimitingDimension::kNoBudget);
  EXPECT_EQ(refused.receipt.retry_after_ms, kRetryNever);
  EXPECT_EQ(refused.receipt.policy_generation, 1u);
  EXPECT_EQ(ledger_.accounts().accountCount(), 0u);
  EXPECT_TRUE(audited(kT0));
}

// ---- the region fence (docs/LEDGER.md "Regions") ----------------------------------------------

ReserveRequest fromRegion(ReserveRequest request, const std::string& region) {
  request.region = region;
  return request;
}

Policy regionPolicy(const std::string& region) {
  Budget budget = testBudget();
  budget.region = region;
  return Policy{.budgets = {budget}};
}

TEST(LedgerRegionTest, ABudgetOfARegionAdmitsItAndRequestsThatSayNone) {
  Ledger ledger;
  ASSERT_EQ(ledger.publishPolicy(regionPolicy("eu-west-1"), kT0).code, ReplyCode::kOk);
  const ReservationReply eu =
      ledger.reserve(fromRegion(reserveRequest("eu", 10, 1), "eu-west-1"), kT0);
  EXPECT_EQ(eu.code, ReplyCode::kOk) << eu.message;
  EXPECT_EQ(eu.receipt.region, "eu-west-1");
  const ReservationReply none = ledger.reserve(reserveRequest("none", 10, 2), kT0);
  EXPECT_EQ(none.code, ReplyCode::kOk) << none.message;
  EXPECT_EQ(none.receipt.region, "");
  // Both draw on the one account of the subject/route: the region does not key accounts.
  EXPECT_EQ(ledger.accounts().accountCount(), 1u);
  EXPECT_EQ(balancesOf(ledger, 1), (Balances{.opening = 1000, .available = 980, .reserved = 20}));
  EXPECT_TRUE(audited(ledger, kT0));
}

TEST(LedgerRegionTest, AnotherRegionIsRefusedAsNoBudgetNamingBothRegions) {
  Ledger ledger;
  ASSERT_EQ(ledger.publishPolicy(regionPolicy("eu-west-1"), kT0).code, ReplyCode::kOk);
  // Before and after the account exists: the fence holds either way, and opens nothing.
  for (const auto& [id, accounts] : {std::pair<const char*, uint64_t>{"us-first", 0},
                                     std::pair<const char*, uint64_t>{"us-again", 1}}) {
    const ReservationReply us =
        ledger.reserve(fromRegion(reserveRequest(id, 10, 1), "us-east-1"), kT0);
    EXPECT_EQ(us.code, ReplyCode::kRejected) << id;
    EXPECT_EQ(us.receipt.state, S::kRejected) << id;
    EXPECT_EQ(us.receipt.limiting_dimension, LimitingDimension::kNoBudget) << id;
    EXPECT_EQ(us.receipt.retry_after_ms, kRetryNever) << id;
    EXPECT_EQ(us.receipt.reserved_units, 10u) << id;
    EXPECT_THAT(us.message, HasSubstr("region 'us-east-1'")) << id;
    EXPECT_THAT(us.message, HasSubstr("region 'eu-west-1'")) << id;
    EXPECT_EQ(ledger.accounts().accountCount(), accounts) << id;
    ASSERT_EQ(ledger.reserve(reserveRequest(std::string(id) + "-none", 1, 2), kT0).code,
              ReplyCode::kOk);
    EXPECT_EQ(ledger.accounts().accountCount(), 1u);
  }
  EXPECT_EQ(balancesOf(ledger, 1), (Balances{.opening = 1000, .available = 998, .reserved = 2}));
  EXPECT_TRUE(audited(ledger, kT0));
}

TEST(LedgerRegionTest, ABudgetWithoutARegionAdmitsEveryRegion) {
  Ledger ledger;
  ASSERT_EQ(ledger.publishPolicy(regionPolicy(""), kT0).code, ReplyCode::kOk);
  EXPECT_EQ(ledger.reserve(fromRegion(reserveRequest("a", 1, 1), "eu-west-1"), kT0).code,
            ReplyCode::kOk);
  EXPECT_EQ(ledger.reserve(fromRegion(reserveRequest("b", 1, 1), "us-east-1"), kT0).code,
            ReplyCode::kOk);
  EXPECT_EQ(ledger.reserve(reserveRequest("c", 1, 1), kT0).code, ReplyCode::kOk);
  EXPECT_EQ(ledger.accounts().accountCount(), 1u);
}

TEST(LedgerRegionTest, TheSameIdFromAnotherRegionIsAnIdempotencyConflict) {
  // Same id and the same (client-supplied) digest: the ledger compares the region itself.
  Ledger ledger;
  ASSERT_EQ(ledger.publishPolicy(testPolicy(), kT0).code, ReplyCode::kOk);
  ASSERT_EQ(ledger.reserve(fromRegion(reserveRequest("q", 5, 1), "eu-west-1"), kT0).code,
            ReplyCode::kOk);
  for (const char* region : {"us-east-1", ""}) {
    const ReservationReply reply =
        ledger.reserve(fromRegion(reserveRequest("q", 5, 1), region), kT0);
    EXPECT_EQ(reply.code, ReplyCode::kIdempotencyConflict) << "'" << region << "'";
    EXPECT_EQ(reply.receipt.region, "eu-west-1");
  }
  EXPECT_TRUE(ledger.reserve(fromRegion(reserveRequest("q", 5, 1), "eu-west-1"), kT0).duplicate);
  // A record restored from a row written before regions (no region, request fields unknown)
  // was a request without a region: a repeat naming one is another request.
  const ReservationReply admitted = ledger.reserve(reserveRequest("old", 5, 1), kT0);
  ASSERT_EQ(admitted.code, ReplyCode::kOk);
  Reservation old = admitted.receipt;
  old.request_fields_known = false;
  Ledger restored;
  ASSERT_TRUE(restored.restoreReservation(old).isOk());
  EXPECT_TRUE(restored.reserve(reserveRequest("old", 5, 1), kT0).duplicate);
  EXPECT_EQ(restored.reserve(fromRegion(reserveRequest("old", 5, 1), "eu-west-1"), kT0).code,
            ReplyCode::kIdempotencyConflict);
}

TEST(LedgerRegionTest, ARegionLongerThanTheMaximumIsInvalid) {
  Ledger ledger;
  ASSERT_EQ(ledger.publishPolicy(testPolicy(), kT0).code, ReplyCode::kOk);
  const std::string too_long(limits::kRegionBytesMax + 1, 'r');
  EXPECT_EQ(ledger.reserve(fromRegion(reserveRequest("r", 1, 1), too_long), kT0).code,
            ReplyCode::kInvalidArgument);
  EXPECT_EQ(ledger.accounts().accountCount(), 0u);
  const std::string longest(limits::kRegionBytesMax, 'r');
  EXPECT_EQ(ledger.reserve(fromRegion(reserveRequest("r", 1, 1), longest), kT0).code,
            ReplyCode::kOk);
}

TEST(LedgerNoPolicyTest, NothingPublishedMeansNoBudget) {
  Ledger ledger;
  const ReservationReply refused = ledger.reserve(reserveRequest("r1", 10, 1), kT0);
  EXPECT_EQ(refused.code, ReplyCode::kRejected);
  EXPECT_EQ(refused.receipt.limiting_dimension, LimitingDimension::kNoBudget);
  EXPECT_EQ(refused.receipt.retry_after_ms, kRetryNever);
  EXPECT_EQ(refused.receipt.policy_generation, 0u);
  EXPECT_TRUE(audited(ledger, kT0));
}

TEST_F(LedgerTest, AboveMaxSingleReservationIsRejectedForever) {
  const ReservationReply refused = reserve("r1", 1001);
  EXPECT_EQ(refused.code, ReplyCode::kRejected);
  EXPECT_EQ(refused.receipt.limiting_dimension, LimitingDimension::kMaxSingleReservation);
  EXPECT_EQ(refused.receipt.retry_after_ms, kRetryNever);
  EXPECT_EQ(refused.receipt.reserved_units, 1001u);  // what was asked; nothing is held
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 1000}));
  EXPECT_TRUE(audited(kT0));
  // Exactly the maximum (= burst) is fine.
  EXPECT_EQ(reserve("r2", 1000, kT0, 2).code, ReplyCode::kOk);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .reserved = 1000}));
  EXPECT_TRUE(audited(kT0));
}

TEST_F(LedgerTest, MalformedRequestsAreInvalidArgumentsAndChangeNothing) {
  EXPECT_EQ(reserve("r1", 0).code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(reserve("", 10).code, ReplyCode::kInvalidArgument);
  const std::string id_129(limits::kReservationIdBytesMax + 1, 'x');
  const std::string id_128(limits::kReservationIdBytesMax, 'x');
  const ReservationReply too_long = reserve(id_129, 10);
  EXPECT_EQ(too_long.code, ReplyCode::kInvalidArgument);
  EXPECT_THAT(too_long.message, HasSubstr("reservation id"));
  EXPECT_EQ(too_long.receipt, Reservation{});
  EXPECT_EQ(ledger_.reserve(reserveRequest("r1", 10, 1, 0, ""), kT0).code,
            ReplyCode::kInvalidArgument);
  EXPECT_EQ(ledger_.reserve(reserveRequest("r1", 10, 1, 0, std::string(257, 's')), kT0).code,
            ReplyCode::kInvalidArgument);
  ReserveRequest no_route = reserveRequest("r1", 10, 1);
  no_route.route = "";
  EXPECT_EQ(ledger_.reserve(no_route, kT0).code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(ledger_.reservationCount(), 0u);
  EXPECT_EQ(ledger_.accounts().accountCount(), 0u);

  ASSERT_EQ(reserve(id_128, 10).code, ReplyCode::kOk);  // 128 bytes is the maximum
  EXPECT_EQ(start(id_128, "").code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(start(id_128, std::string(limits::kOperationIdBytesMax + 1, 'o')).code,
            ReplyCode::kInvalidArgument);
  EXPECT_EQ(start("", "op1").code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(query(id_128).receipt.state, S::kReserved);
  ASSERT_EQ(start(id_128, "op1").code, ReplyCode::kOk);
  EXPECT_EQ(settle(id_128, "", 5).code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(markUnknown(id_128, "").code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(report(id_128, "", 5).code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(release("").code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(query("").code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(query(id_129).code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(query(id_128).receipt.state, S::kStarted);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 990, .reserved = 10}));
  EXPECT_TRUE(audited(kT0));
}

TEST_F(LedgerTest, QueryOfUnknownIdIsNotFound) {
  const ReservationReply missing = query("never-seen");
  EXPECT_EQ(missing.code, ReplyCode::kNotFound);
  EXPECT_EQ(missing.receipt, Reservation{});
  EXPECT_THAT(missing.message, HasSubstr("never-seen"));
  EXPECT_EQ(report("never-seen", "op1", 1).code, ReplyCode::kNotFound);
}

TEST(LedgerLimitsTest, ReservationTableLimitIsATypedRefusal) {
  Ledger small(LedgerOptions{.reservations_max = 1});
  ASSERT_EQ(small.publishPolicy(testPolicy(), kT0).code, ReplyCode::kOk);
  ASSERT_EQ(small.reserve(reserveRequest("r1", 10, 1), kT0).code, ReplyCode::kOk);
  const ReservationReply full = small.reserve(reserveRequest("r2", 10, 2), kT0);
  EXPECT_EQ(full.code, ReplyCode::kResourceExhausted);
  EXPECT_EQ(small.reservationCount(), 1u);
  // A duplicate still answers: it needs no new row.
  EXPECT_TRUE(small.reserve(reserveRequest("r1", 10, 1), kT0).duplicate);
  EXPECT_EQ(balancesOf(small, 1), (Balances{.opening = 1000, .available = 990, .reserved = 10}));
  EXPECT_TRUE(audited(small, kT0));
}

// ---- carve and remint through the account book -----------------------------------------------
// Carving here bypasses the shard registry, so the full audit would (rightly) report retired
// units no shard accounts for; these tests check the account book's equations only.

TEST_F(LedgerTest, CarveAndRemintInTheSameGeneration) {
  ASSERT_EQ(reserve("r1", 100).code, ReplyCode::kOk);
  AccountBook& book = ledger_.accounts();
  EXPECT_EQ(book.carve(keyOf(1), 100, kT0), AccountCode::kOk);
  EXPECT_EQ(
      balances(),
      (Balances{.opening = 1000, .available = 800, .reserved = 100, .retired_for_emergency = 100}));
  EXPECT_TRUE(accountsConserved(kT0));

  Units reminted = 0;
  EXPECT_EQ(book.remint(keyOf(1), 60, kT0, &reminted), AccountCode::kOk);
  EXPECT_EQ(reminted, 60u);
  EXPECT_EQ(balances(), (Balances{.opening = 1000,
                                  .minted = 60,
                                  .available = 860,
                                  .reserved = 100,
                                  .retired_for_emergency = 40,
                                  .transferred_out = 60}));
  EXPECT_TRUE(accountsConserved(kT0));

  // Under the burst cap only what fits moves. Release r1 (available 960), let 3 s refill 30
  // (available 990): 10 of room left for a remint of 40.
  ASSERT_EQ(release("r1").code, ReplyCode::kOk);
  EXPECT_EQ(balances().available, 960u);
  EXPECT_EQ(book.remint(keyOf(1), 40, kT0 + 3'000, &reminted), AccountCode::kOk);
  EXPECT_EQ(reminted, 10u);
  EXPECT_EQ(balances(), (Balances{.opening = 1000,
                                  .minted = 100,  // 60 + 30 refill + 10
                                  .available = 1000,
                                  .retired_for_emergency = 30,
                                  .transferred_out = 70}));
  EXPECT_TRUE(accountsConserved(kT0 + 3'000));
  // A full bucket takes nothing; what does not fit stays retired.
  EXPECT_EQ(book.remint(keyOf(1), 30, kT0 + 3'000, &reminted), AccountCode::kOk);
  EXPECT_EQ(reminted, 0u);
  EXPECT_EQ(balances().retired_for_emergency, 30u);
  EXPECT_EQ(balances().transferred_out, 70u);
  EXPECT_TRUE(accountsConserved(kT0 + 3'000));
}

TEST_F(LedgerTest, CarveAndRemintRefusals) {
  AccountBook& book = ledger_.accounts();
  Units reminted = 99;
  EXPECT_EQ(book.carve(keyOf(1), 100, kT0), AccountCode::kInsufficientAvailable);  // no account
  EXPECT_EQ(book.remint(keyOf(1), 1, kT0, &reminted), AccountCode::kInsufficientRetired);
  EXPECT_EQ(reminted, 0u);
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  EXPECT_EQ(book.carve(keyOf(1), 0, kT0), AccountCode::kZeroUnits);
  EXPECT_EQ(book.carve(keyOf(1), 401, kT0), AccountCode::kInsufficientAvailable);
  ASSERT_EQ(book.carve(keyOf(1), 100, kT0), AccountCode::kOk);
  EXPECT_EQ(book.remint(keyOf(1), 101, kT0, &reminted), AccountCode::kInsufficientRetired);
  EXPECT_EQ(
      balances(),
      (Balances{.opening = 1000, .available = 300, .reserved = 600, .retired_for_emergency = 100}));
  // With debt outstanding nothing is carved.
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  ASSERT_EQ(settle("r1", "op1", 1000).code, ReplyCode::kOk);  // 300 taken, 100 debt
  EXPECT_EQ(book.carve(keyOf(1), 1, kT0), AccountCode::kDebtOutstanding);
  EXPECT_EQ(
      balances(),
      (Balances{
          .opening = 1000, .overdraft_issued = 100, .spent = 1000, .retired_for_emergency = 100}));
  EXPECT_TRUE(accountsConserved(kT0));
}

TEST_F(LedgerTest, RemintGoesToTheCurrentGeneration) {
  ASSERT_EQ(reserve("r1", 100).code, ReplyCode::kOk);
  AccountBook& book = ledger_.accounts();
  ASSERT_EQ(book.carve(keyOf(1), 100, kT0), AccountCode::kOk);
  ASSERT_EQ(ledger_.publishPolicy(testPolicy(), kT0).generation, 2u);
  Units reminted = 0;
  EXPECT_EQ(book.remint(keyOf(1), 100, kT0, &reminted), AccountCode::kOk);
  EXPECT_EQ(reminted, 100u);
  EXPECT_EQ(balances(1),
            (Balances{.opening = 1000, .available = 800, .reserved = 100, .transferred_out = 100}));
  EXPECT_EQ(balances(2), (Balances{.minted = 100, .available = 100}));
  EXPECT_TRUE(audited(kT0));
  // The next admission moves generation 1's available over as well.
  ASSERT_EQ(reserve("r2", 50, kT0, 2).code, ReplyCode::kOk);
  EXPECT_EQ(balances(1), (Balances{.opening = 1000, .reserved = 100, .transferred_out = 900}));
  EXPECT_EQ(balances(2), (Balances{.minted = 900, .available = 850, .reserved = 50}));
  const RouteTotals totals = routeTotals(ledger_, kT0);
  EXPECT_EQ(totals.sources, 1000u);
  EXPECT_EQ(totals.uses, 1000u);
  EXPECT_TRUE(audited(kT0));
}

// ---- idempotency compares the request's own fields (issue 9) ---------------------------------

TEST_F(LedgerTest, SameIdAndDigestWithOtherFieldsIsAnIdempotencyConflict) {
  ASSERT_EQ(reserve("q", 5).code, ReplyCode::kOk);
  const Balances before = balances();
  ReserveRequest more_units = reserveRequest("q", 600, 1);
  ReserveRequest other_subject = reserveRequest("q", 5, 1, 0, "tenant-8");
  ReserveRequest other_priority = reserveRequest("q", 5, 1);
  other_priority.priority = 3;
  ReserveRequest pinned = reserveRequest("q", 5, 1, /*pinned_generation=*/1);
  for (const ReserveRequest& request : {more_units, other_subject, other_priority, pinned}) {
    const ReservationReply reply = ledger_.reserve(request, kT0);
    EXPECT_EQ(reply.code, ReplyCode::kIdempotencyConflict) << request.units << request.subject;
    EXPECT_FALSE(reply.duplicate);
    EXPECT_EQ(reply.receipt.reserved_units, 5u);  // the stored receipt, unchanged
  }
  ReserveRequest other_route = reserveRequest("q", 5, 1);
  other_route.route = "/v1/other";
  EXPECT_EQ(ledger_.reserve(other_route, kT0).code, ReplyCode::kIdempotencyConflict);
  EXPECT_TRUE(reserve("q", 5).duplicate);  // the same request is still a duplicate
  EXPECT_EQ(balances(), before);
  EXPECT_TRUE(audited(kT0));
}

TEST_F(LedgerTest, ARecordFromBeforePriorityWasStoredComparesTheFieldsItHas) {
  const ReservationReply admitted = ledger_.reserve(reserveRequest("old", 5, 1), kT0);
  ASSERT_EQ(admitted.code, ReplyCode::kOk);
  EXPECT_TRUE(admitted.receipt.request_fields_known);
  Reservation old = admitted.receipt;
  old.request_fields_known = false;  // as a row written before the fields existed loads
  Ledger restored;
  ASSERT_TRUE(restored.restoreReservation(old).isOk());
  ReserveRequest other_priority = reserveRequest("old", 5, 1);
  other_priority.priority = 9;
  EXPECT_TRUE(restored.reserve(other_priority, kT0).duplicate);
  EXPECT_EQ(restored.reserve(reserveRequest("old", 6, 1), kT0).code,
            ReplyCode::kIdempotencyConflict);
}

// ---- bounded units (issue 9) ------------------------------------------------------------------

TEST_F(LedgerTest, UnitsAboveThePerRequestMaximumAreInvalidAndChangeNothing) {
  EXPECT_EQ(reserve("big", limits::kUnitsPerRequestMax + 1).code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(query("big").code, ReplyCode::kNotFound);
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  const Balances before = balances();
  for (const Units actual : {std::numeric_limits<Units>::max(), limits::kUnitsPerRequestMax + 1}) {
    EXPECT_EQ(settle("r1", "op1", actual).code, ReplyCode::kInvalidArgument);
    EXPECT_EQ(report("r1", "op1", actual).code, ReplyCode::kInvalidArgument);
  }
  EXPECT_EQ(query("r1").receipt.state, S::kStarted);
  EXPECT_EQ(balances(), before);
  EXPECT_TRUE(ledger_.takeChanges().reservations_upserted.size() <= 1u);
  EXPECT_TRUE(audited(kT0));
  EXPECT_EQ(settle("r1", "op1", limits::kUnitsPerRequestMax).code, ReplyCode::kOk);
}

TEST_F(LedgerTest, TheIssuesPoisonSequenceNoLongerReachesAnAssertion) {
  // settle --actual 18446744073709551615, then `unknown` on another reservation, then the tick
  // at the hard limit: it used to abort in closeByHardLimit.
  ASSERT_EQ(reserve("a", 10).code, ReplyCode::kOk);
  ASSERT_EQ(start("a", "op").code, ReplyCode::kOk);
  EXPECT_EQ(settle("a", "op", std::numeric_limits<Units>::max()).code, ReplyCode::kInvalidArgument);
  ASSERT_EQ(reserve("b", 10, kT0, 2).code, ReplyCode::kOk);
  ASSERT_EQ(start("b", "op").code, ReplyCode::kOk);
  ASSERT_EQ(markUnknown("b", "op").code, ReplyCode::kOk);
  EXPECT_EQ(ledger_.tick(kT0 + kHardLimitMs).closed_by_hard_limit, 1u);
  EXPECT_TRUE(audited(kT0 + kHardLimitMs));
}

TEST_F(LedgerTest, MarkingASettledReservationUnknownIsADuplicate) {
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  ASSERT_EQ(settle("r1", "op1", 100).code, ReplyCode::kOk);
  const ReservationReply again = markUnknown("r1", "op1");
  EXPECT_EQ(again.code, ReplyCode::kOk);
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.receipt.state, S::kSettled);
  EXPECT_EQ(markUnknown("r1", "other").code, ReplyCode::kOperationConflict);
}

// ---- the audit can fail ---------------------------------------------------------------------

TEST_F(LedgerTest, AuditCatchesARefundOnTimeout) {
  ledger_.setFaultsForTesting({.refund_usage_unknown = true});
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  EXPECT_TRUE(audited(kT0));
  const ReservationReply broken = markUnknown("r1", "op1");
  EXPECT_EQ(broken.code, ReplyCode::kOk);
  EXPECT_EQ(broken.refunded_units, 600u);
  const AuditReport audit = ledger_.audit(kT0);
  EXPECT_FALSE(audit.conserved);
  ASSERT_EQ(audit.violations.size(), 1u);
  EXPECT_THAT(audit.violations[0], HasSubstr("reserved 0 but live reservations hold 600"));
  EXPECT_FALSE(audited(kT0));
}

TEST_F(LedgerTest, DoubleRefundFaultIsVisibleInTheReplyBalancesAndAudit) {
  ASSERT_EQ(reserve("r1", 300).code, ReplyCode::kOk);
  ASSERT_EQ(reserve("r2", 600, kT0, 2).code, ReplyCode::kOk);
  ASSERT_EQ(release("r1").code, ReplyCode::kOk);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 400, .reserved = 600}));
  ledger_.setFaultsForTesting({.double_refund_release = true});
  const ReservationReply again = release("r1");
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.refunded_units, 300u);  // wrong on purpose
  // r2's units are handed out a second time: `reserved` no longer covers r2.
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 700, .reserved = 300}));
  const AuditReport report = ledger_.audit(kT0);
  EXPECT_FALSE(report.conserved);
  ASSERT_EQ(report.violations.size(), 1u);
  EXPECT_NE(report.violations[0].find("reserved 300 but live reservations hold 600"),
            std::string::npos);
}

// ---- takeChanges --------------------------------------------------------------------------------

TEST_F(LedgerTest, TakeChangesNamesTouchedReservationsAndAccounts) {
  LedgerChanges changes = ledger_.takeChanges();
  EXPECT_TRUE(changes.policies);
  EXPECT_TRUE(changes.reservations_upserted.empty());
  EXPECT_TRUE(changes.accounts.empty());
  EXPECT_TRUE(ledger_.takeChanges().empty());

  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  changes = ledger_.takeChanges();
  EXPECT_FALSE(changes.policies);
  EXPECT_THAT(changes.reservations_upserted, ElementsAre("r1"));
  EXPECT_THAT(changes.accounts, ElementsAre(keyOf(1)));
  EXPECT_TRUE(changes.reservations_deleted.empty());
  EXPECT_TRUE(ledger_.takeChanges().empty());

  ASSERT_EQ(reserve("r2", 600, kT0, 2).code, ReplyCode::kRejected);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  changes = ledger_.takeChanges();
  EXPECT_THAT(changes.reservations_upserted, ElementsAre("r1", "r2"));

  // Every call that moves balances must name the account, or the shell never persists them.
  ASSERT_EQ(settle("r1", "op1", 200).code, ReplyCode::kOk);
  changes = ledger_.takeChanges();
  EXPECT_THAT(changes.reservations_upserted, ElementsAre("r1"));
  // BUG: settle changes reserved/spent/available but the account is not named.
  EXPECT_THAT(changes.accounts, Contains(keyOf(1)));

  ASSERT_EQ(reserve("r3", 100, kT0, 3).code, ReplyCode::kOk);
  changes = ledger_.takeChanges();
  EXPECT_THAT(changes.reservations_upserted, ElementsAre("r3"));
  // BUG: a reserve on an existing account (no refill in between) is not named either.
  EXPECT_THAT(changes.accounts, Contains(keyOf(1)));

  ASSERT_EQ(release("r3").code, ReplyCode::kOk);
  changes = ledger_.takeChanges();
  EXPECT_THAT(changes.reservations_upserted, ElementsAre("r3"));
  // BUG: same for release (and expiry, hard-limit close, late receipts).
  EXPECT_THAT(changes.accounts, Contains(keyOf(1)));

  ASSERT_EQ(ledger_.publishPolicy(testPolicy(), kT0).code, ReplyCode::kOk);
  EXPECT_TRUE(ledger_.takeChanges().policies);
  ASSERT_EQ(reserve("r4", 100, kT0, 4).code, ReplyCode::kOk);
  changes = ledger_.takeChanges();
  EXPECT_THAT(changes.reservations_upserted, ElementsAre("r4"));
  EXPECT_THAT(changes.accounts, ElementsAre(keyOf(1), keyOf(2)));  // the transfer touched both
  EXPECT_TRUE(audited(kT0));
}

// The account index and the change lists are unordered inside; what they hand out is sorted by
// key, whatever order the accounts were opened and touched in, and takeChangedRows() names the
// very rows takeChanges() names.
TEST(LedgerOrderTest, AuditAndChangesAreInKeyOrderAndBothTakeFormsAgree) {
  Budget any_chat = testBudget();
  any_chat.subject_pattern = "*";
  Budget any_embed = any_chat;
  any_embed.route = "/v1/embed";
  const Policy policy{.budgets = {any_chat, any_embed}};
  Ledger by_id;
  Ledger by_row;
  const std::vector<std::pair<std::string, std::string>> scrambled = {
      {"zeta", kRoute},  {"alpha", "/v1/embed"}, {"mid", kRoute},
      {"alpha", kRoute}, {"zeta", "/v1/embed"},  {"beta", kRoute}};
  int n = 0;
  auto apply = [&](Ledger& ledger) {
    for (const auto& [subject, route] : scrambled) {
      ReserveRequest request = reserveRequest("r" + std::to_string(n++ % 100), 10, 1);
      request.subject = subject;
      request.route = route;
      ASSERT_EQ(ledger.reserve(request, kT0).code, ReplyCode::kOk);
    }
  };
  for (Ledger* ledger : {&by_id, &by_row}) {
    n = 0;
    ASSERT_EQ(ledger->publishPolicy(policy, kT0).code, ReplyCode::kOk);
    apply(*ledger);
    ASSERT_EQ(ledger->publishPolicy(policy, kT0).code, ReplyCode::kOk);  // generation 2
    n = 50;
    apply(*ledger);
  }
  const LedgerChanges changes = by_id.takeChanges();
  const LedgerChangedRows rows = by_row.takeChangedRows();
  EXPECT_TRUE(changes.policies && rows.policies);
  ASSERT_EQ(changes.accounts.size(), 12u);  // 6 subject/routes × 2 generations
  EXPECT_TRUE(std::is_sorted(changes.accounts.begin(), changes.accounts.end()));
  ASSERT_EQ(rows.accounts.size(), changes.accounts.size());
  for (size_t i = 0; i < rows.accounts.size(); ++i) {
    EXPECT_EQ(rows.accounts[i]->key, changes.accounts[i]);
  }
  ASSERT_EQ(changes.reservations_upserted.size(), 12u);
  EXPECT_TRUE(
      std::is_sorted(changes.reservations_upserted.begin(), changes.reservations_upserted.end()));
  ASSERT_EQ(rows.reservations_upserted.size(), changes.reservations_upserted.size());
  for (size_t i = 0; i < rows.reservations_upserted.size(); ++i) {
    EXPECT_EQ(*rows.reservations_upserted[i],
              *by_id.findReservation(changes.reservations_upserted[i]));
  }
  EXPECT_TRUE(by_id.takeChanges().empty());
  EXPECT_TRUE(by_row.takeChangedRows().empty());

  const std::vector<AccountView> views = by_id.audit(kT0).accounts;
  ASSERT_EQ(views.size(), 12u);
  EXPECT_TRUE(
      std::is_sorted(views.begin(), views.end(),
                     [](const AccountView& a, const AccountView& b) { return a.key < b.key; }));
  EXPECT_EQ(views, by_row.audit(kT0).accounts);
  EXPECT_EQ(views.front().key, (AccountKey{"alpha", "/v1/chat", 1}));
  EXPECT_EQ(views.back().key, (AccountKey{"zeta", "/v1/embed", 2}));
}

// A durable store that keeps exactly what takeChanges() names, as the ledger shell does, and
// rebuilds a ledger from it through the restore API.
struct Store {
  struct StoredAccount {
    Balances balances;
    uint64_t refill_clock_ms = 0;
    uint64_t refill_carry = 0;
  };
  std::map<Generation, std::pair<Policy, Generation>> policies;
  std::map<AccountKey, StoredAccount> accounts;
  std::map<std::string, Reservation> reservations;

  void persist(Ledger& ledger) {
    const LedgerChanges changes = ledger.takeChanges();
    const AccountBook& book = ledger.accounts();
    if (changes.policies) {
      for (Generation generation : book.generations()) {
        policies[generation] = {*book.policy(generation), book.republishedFrom(generation)};
      }
    }
    for (const AccountKey& key : changes.accounts) {
      const Account& account = book.find(key)->account;
      accounts[key] = {account.balances(), account.refillClockMs(), account.refillCarry()};
    }
    for (const std::string& id : changes.reservations_upserted) {
      reservations[id] = *ledger.findReservation(id);
    }
    for (const std::string& id : changes.reservations_deleted) reservations.erase(id);
  }

  Status restoreInto(Ledger& ledger, uint64_t now_ms) const {
    for (const auto& [generation, stored] : policies) {
      if (Status s = ledger.accounts().restorePolicy(stored.first, stored.second); !s.isOk()) {
        return s;
      }
    }
    for (const auto& [key, stored] : accounts) {
      if (Status s = ledger.accounts().restoreAccount(key, stored.balances, stored.refill_clock_ms,
                                                      stored.refill_carry);
          !s.isOk()) {
        return s;
      }
    }
    for (const auto& [id, reservation] : reservations) {
      if (Status s = ledger.restoreReservation(reservation); !s.isOk()) return s;
    }
    return ledger.finishRestore(now_ms);
  }
};

TEST_F(LedgerTest, WhatTakeChangesNamesIsEnoughToRebuildTheLedger) {
  Store store;
  store.persist(ledger_);
  ASSERT_EQ(reserve("r1", 600).code, ReplyCode::kOk);
  store.persist(ledger_);
  {
    Ledger rebuilt;
    const Status status = store.restoreInto(rebuilt, kT0);
    ASSERT_TRUE(status.isOk()) << status.toString();
    EXPECT_EQ(balancesOf(rebuilt, 1), balances());
    EXPECT_EQ(*rebuilt.findReservation("r1"), *ledger_.findReservation("r1"));
  }
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  ASSERT_EQ(settle("r1", "op1", 200).code, ReplyCode::kOk);
  store.persist(ledger_);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 800, .spent = 200}));
  EXPECT_TRUE(audited(kT0));

  Ledger rebuilt;
  const Status status = store.restoreInto(rebuilt, kT0);
  // BUG: settle moved the account's balances without naming the account in takeChanges(), so
  // the store still holds {available 400, reserved 600} next to a SETTLED r1: the rebuilt
  // ledger fails its audit ("reserved 600 but live reservations hold 0").
  EXPECT_TRUE(status.isOk()) << status.toString();
  if (status.isOk()) {
    EXPECT_EQ(balancesOf(rebuilt, 1), balances());
    EXPECT_TRUE(tally::audited(rebuilt, kT0));
  }
}

// finishRestore() audits before it queues deadlines: a USAGE_UNKNOWN reservation whose account
// is missing (its hard limit is read from that account) is refused as corruption, never an
// assertion; so is a RESERVED one.
TEST_F(LedgerTest, RestoreRefusesLiveReservationsOfAMissingAccountBeforeQueueingThem) {
  ASSERT_EQ(reserve("u", 300).code, ReplyCode::kOk);
  ASSERT_EQ(start("u", "op-u").code, ReplyCode::kOk);
  ASSERT_EQ(markUnknown("u", "op-u").code, ReplyCode::kOk);
  ASSERT_EQ(reserve("r", 200).code, ReplyCode::kOk);
  for (const char* id : {"u", "r"}) {
    SCOPED_TRACE(id);
    Ledger rebuilt;
    ASSERT_EQ(rebuilt.publishPolicy(testPolicy(), kT0).code, ReplyCode::kOk);  // no account
    ASSERT_TRUE(rebuilt.restoreReservation(*ledger_.findReservation(id)).isOk());
    const Status status = rebuilt.finishRestore(kT0 + 1);
    EXPECT_EQ(status.code(), StatusCode::kCorruption);
    EXPECT_THAT(status.message(), HasSubstr("fails its audit"));
    EXPECT_THAT(status.message(), HasSubstr("units but there is no account"));
  }
}

TEST(LedgerNamesTest, ReplyCodeAndGenerationStateNames) {
  EXPECT_STREQ(replyCodeName(ReplyCode::kOk), "OK");
  EXPECT_STREQ(replyCodeName(ReplyCode::kRejected), "REJECTED");
  EXPECT_STREQ(replyCodeName(ReplyCode::kIdempotencyConflict), "IDEMPOTENCY_CONFLICT");
  EXPECT_STREQ(replyCodeName(ReplyCode::kOperationConflict), "OPERATION_CONFLICT");
  EXPECT_STREQ(replyCodeName(ReplyCode::kExpired), "EXPIRED");
  EXPECT_STREQ(replyCodeName(ReplyCode::kInvalidState), "INVALID_STATE");
  EXPECT_STREQ(replyCodeName(ReplyCode::kNotFound), "NOT_FOUND");
  EXPECT_STREQ(replyCodeName(ReplyCode::kInvalidArgument), "INVALID_ARGUMENT");
  EXPECT_STREQ(replyCodeName(ReplyCode::kResourceExhausted), "RESOURCE_EXHAUSTED");
  EXPECT_STREQ(replyCodeName(ReplyCode::kArithmeticOverflow), "ARITHMETIC_OVERFLOW");
  EXPECT_STREQ(generationStateName(GenerationState::kActive), "ACTIVE");
  EXPECT_STREQ(generationStateName(GenerationState::kDraining), "DRAINING");
  EXPECT_STREQ(generationStateName(GenerationState::kDrained), "DRAINED");
}

}  // namespace
}  // namespace tally

// ---- extend: the streaming top-up ---------------------------------------------------------------

namespace tally {
namespace {

ExtendRequest extendRequest(const std::string& id, const std::string& op, Units total) {
  return {.reservation_id = id, .operation_id = op, .reserved_units_total = total};
}

TEST_F(LedgerTest, ExtendOfAStartedReservationAdmitsTheDifference) {
  ASSERT_EQ(reserve("r1", 300).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  (void)ledger_.takeChanges();
  const ReservationReply extended = ledger_.extend(extendRequest("r1", "op1", 500), kT0);
  ASSERT_EQ(extended.code, ReplyCode::kOk) << extended.message;
  EXPECT_FALSE(extended.duplicate);
  EXPECT_EQ(extended.receipt.state, S::kStarted);
  EXPECT_EQ(extended.receipt.reserved_units, 500u);
  EXPECT_EQ(extended.receipt.limiting_dimension, LimitingDimension::kNone);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 500, .reserved = 500}));
  EXPECT_TRUE(audited(kT0));
  // The grown reservation and its account are what the store must write.
  const LedgerChanges changes = ledger_.takeChanges();
  EXPECT_THAT(changes.reservations_upserted, ElementsAre("r1"));
  EXPECT_THAT(changes.accounts, ElementsAre(keyOf(1)));
  EXPECT_EQ(query("r1").receipt.reserved_units, 500u);
}

TEST_F(LedgerTest, RepeatedExtendIsANoOp) {
  ASSERT_EQ(reserve("r1", 300).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  ASSERT_EQ(ledger_.extend(extendRequest("r1", "op1", 500), kT0).code, ReplyCode::kOk);
  (void)ledger_.takeChanges();
  for (const Units total : {Units{500}, Units{400}, Units{300}, Units{1}}) {
    const ReservationReply again = ledger_.extend(extendRequest("r1", "op1", total), kT0 + 10);
    EXPECT_EQ(again.code, ReplyCode::kOk) << total;
    EXPECT_TRUE(again.duplicate) << total;
    EXPECT_EQ(again.receipt.reserved_units, 500u) << total;
    EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 500, .reserved = 500}));
    EXPECT_TRUE(audited(kT0 + 10));
  }
  EXPECT_TRUE(ledger_.takeChanges().empty());
  // A repeat of the reserve that began it is still the same request.
  const ReservationReply reserve_again = reserve("r1", 300);
  EXPECT_EQ(reserve_again.code, ReplyCode::kOk);
  EXPECT_TRUE(reserve_again.duplicate);
}

TEST_F(LedgerTest, RefusedExtendChangesNothing) {
  ASSERT_EQ(reserve("r1", 300).code, ReplyCode::kOk);
  ASSERT_EQ(reserve("r2", 600, kT0, 2).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  (void)ledger_.takeChanges();
  const Balances before = balances();
  ASSERT_EQ(before, (Balances{.opening = 1000, .available = 100, .reserved = 900}));

  // 200 more where 100 are available: refused like a reserve of 200, with its Retry-After.
  const ReservationReply capacity = ledger_.extend(extendRequest("r1", "op1", 500), kT0);
  EXPECT_EQ(capacity.code, ReplyCode::kRejected);
  EXPECT_FALSE(capacity.duplicate);
  EXPECT_EQ(capacity.receipt.state, S::kStarted);
  EXPECT_EQ(capacity.receipt.reserved_units, 300u);
  EXPECT_EQ(capacity.receipt.limiting_dimension, LimitingDimension::kCapacity);
  EXPECT_EQ(capacity.receipt.retry_after_ms, 10'000);  // 100 units at 10/s
  // Above max single reservation (1000) as a total, though the difference would fit later.
  const ReservationReply too_big = ledger_.extend(extendRequest("r1", "op1", 1001), kT0);
  EXPECT_EQ(too_big.code, ReplyCode::kRejected);
  EXPECT_EQ(too_big.receipt.limiting_dimension, LimitingDimension::kMaxSingleReservation);
  EXPECT_EQ(too_big.receipt.retry_after_ms, kRetryNever);

  EXPECT_EQ(balances(), before);
  EXPECT_TRUE(audited(kT0));
  EXPECT_TRUE(ledger_.takeChanges().reservations_upserted.empty());
  const ReservationReply stored = query("r1");
  EXPECT_EQ(stored.receipt.reserved_units, 300u);
  EXPECT_EQ(stored.receipt.limiting_dimension, LimitingDimension::kNone);

  // Once refill has earned the difference, the same extend is admitted.
  const ReservationReply later = ledger_.extend(extendRequest("r1", "op1", 500), kT0 + 10'000);
  EXPECT_EQ(later.code, ReplyCode::kOk) << later.message;
  EXPECT_EQ(later.receipt.reserved_units, 500u);
  EXPECT_TRUE(audited(kT0 + 10'000));
}

TEST_F(LedgerTest, ExtendIsRefusedWhileTheRouteOwesDebt) {
  ASSERT_EQ(reserve("r1", 100).code, ReplyCode::kOk);
  ASSERT_EQ(reserve("r2", 900, kT0, 2).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  ASSERT_EQ(start("r2", "op2").code, ReplyCode::kOk);
  ASSERT_EQ(settle("r2", "op2", 1'200).receipt.state, S::kSettledWithDebt);  // 300 debt
  const Balances before = balances();
  const ReservationReply refused = ledger_.extend(extendRequest("r1", "op1", 150), kT0);
  EXPECT_EQ(refused.code, ReplyCode::kRejected);
  EXPECT_EQ(refused.receipt.limiting_dimension, LimitingDimension::kDebt);
  EXPECT_GT(refused.receipt.retry_after_ms, 0);
  EXPECT_EQ(refused.receipt.reserved_units, 100u);
  EXPECT_EQ(balances(), before);
  EXPECT_TRUE(audited(kT0));
}

TEST_F(LedgerTest, ExtendIsRefusedOnceItsGenerationDrains) {
  ASSERT_EQ(reserve("r1", 100).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  ASSERT_EQ(ledger_.publishPolicy(testPolicy(), kT0 + 1).code, ReplyCode::kOk);
  const ReservationReply refused = ledger_.extend(extendRequest("r1", "op1", 150), kT0 + 2);
  EXPECT_EQ(refused.code, ReplyCode::kRejected);
  EXPECT_EQ(refused.receipt.limiting_dimension, LimitingDimension::kGenerationDraining);
  EXPECT_EQ(refused.receipt.retry_after_ms, kRetryNever);
  EXPECT_EQ(refused.receipt.reserved_units, 100u);
  EXPECT_TRUE(audited(kT0 + 2));
}

TEST_F(LedgerTest, SettleAfterExtendRefundsAgainstTheExtendedTotalOnce) {
  ASSERT_EQ(reserve("r1", 300).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1").code, ReplyCode::kOk);
  ASSERT_EQ(ledger_.extend(extendRequest("r1", "op1", 500), kT0).code, ReplyCode::kOk);
  const ReservationReply settled = settle("r1", "op1", 450, kT0 + 1);
  ASSERT_EQ(settled.code, ReplyCode::kOk);
  EXPECT_EQ(settled.receipt.state, S::kSettled);
  EXPECT_EQ(settled.refunded_units, 50u);
  EXPECT_EQ(settled.receipt.debt_units, 0u);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 550, .spent = 450}));
  EXPECT_TRUE(audited(kT0 + 1));
  const ReservationReply again = settle("r1", "op1", 450, kT0 + 2);
  EXPECT_TRUE(again.duplicate);
  EXPECT_EQ(again.refunded_units, 0u);
  // An extend retried after the settle: covered, a duplicate; a larger one is refused.
  EXPECT_TRUE(ledger_.extend(extendRequest("r1", "op1", 500), kT0 + 3).duplicate);
  EXPECT_EQ(ledger_.extend(extendRequest("r1", "op1", 600), kT0 + 3).code,
            ReplyCode::kInvalidState);
  EXPECT_EQ(balances(), (Balances{.opening = 1000, .available = 550, .spent = 450}));
  EXPECT_TRUE(audited(kT0 + 3));
}

TEST_F(LedgerTest, ExtendOfANonStartedReservationIsRefused) {
  ASSERT_EQ(reserve("reserved", 100).code, ReplyCode::kOk);
  ASSERT_EQ(reserve("unknown", 100, kT0, 2).code, ReplyCode::kOk);
  ASSERT_EQ(start("unknown", "op").code, ReplyCode::kOk);
  ASSERT_EQ(markUnknown("unknown", "op").code, ReplyCode::kOk);
  ASSERT_EQ(reserve("released", 100, kT0, 3).code, ReplyCode::kOk);
  ASSERT_EQ(release("released").code, ReplyCode::kOk);
  ASSERT_EQ(reserve("started", 100, kT0, 4).code, ReplyCode::kOk);
  ASSERT_EQ(start("started", "op").code, ReplyCode::kOk);
  (void)ledger_.takeChanges();
  const Balances before = balances();

  EXPECT_EQ(ledger_.extend(extendRequest("reserved", "op", 200), kT0).code,
            ReplyCode::kInvalidState);
  EXPECT_EQ(ledger_.extend(extendRequest("unknown", "op", 200), kT0).code,
            ReplyCode::kInvalidState);
  EXPECT_EQ(ledger_.extend(extendRequest("released", "op", 200), kT0).code,
            ReplyCode::kInvalidState);
  EXPECT_EQ(ledger_.extend(extendRequest("nobody", "op", 200), kT0).code, ReplyCode::kNotFound);
  EXPECT_EQ(ledger_.extend(extendRequest("started", "other-op", 200), kT0).code,
            ReplyCode::kOperationConflict);
  EXPECT_EQ(ledger_.extend(extendRequest("started", "op", 0), kT0).code,
            ReplyCode::kInvalidArgument);
  EXPECT_EQ(
      ledger_.extend(extendRequest("started", "op", limits::kUnitsPerRequestMax + 1), kT0).code,
      ReplyCode::kInvalidArgument);
  EXPECT_EQ(ledger_.extend(extendRequest("", "op", 200), kT0).code, ReplyCode::kInvalidArgument);

  EXPECT_EQ(balances(), before);
  EXPECT_TRUE(audited(kT0));
  EXPECT_TRUE(ledger_.takeChanges().empty());
}

TEST_F(LedgerTest, ExtendAddsUnitsNotTimeAndTheHardLimitConsumesTheTotal) {
  ASSERT_EQ(reserve("r1", 300).code, ReplyCode::kOk);
  ASSERT_EQ(start("r1", "op1", kT0 + 1'000).code, ReplyCode::kOk);
  const ReservationReply extended = ledger_.extend(extendRequest("r1", "op1", 500), kT0 + 5'000);
  ASSERT_EQ(extended.code, ReplyCode::kOk);
  EXPECT_EQ(extended.receipt.started_at_ms, kT0 + 1'000);
  EXPECT_EQ(extended.receipt.expires_at_ms, kT0 + kHoldTtlMs);
  ASSERT_EQ(markUnknown("r1", "op1", kT0 + 6'000).code, ReplyCode::kOk);
  EXPECT_EQ(ledger_.tick(kT0 + 1'000 + kHardLimitMs - 1).closed_by_hard_limit, 0u);
  EXPECT_EQ(ledger_.tick(kT0 + 1'000 + kHardLimitMs).closed_by_hard_limit, 1u);
  const ReservationReply closed = query("r1");
  EXPECT_EQ(closed.receipt.state, S::kSettled);
  EXPECT_EQ(closed.receipt.actual_units, 500u);
  EXPECT_TRUE(audited(kT0 + 1'000 + kHardLimitMs));
}

}  // namespace
}  // namespace tally
