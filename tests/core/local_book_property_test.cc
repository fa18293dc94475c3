// Property test for the one reservation lifecycle (core/reservation_lifecycle.h), driven through
// each of its three holders: the central Ledger (an Account), the agent's ShardBook (a
// ShardAccount) and local admission (LocalBook, nothing). The same random sequences of reserve,
// start, settle, receipt, release, mark-unknown and time must, whatever holds the units:
//  * refund 0 on every duplicate, and never refund a reservation more than its units;
//  * never let both the start and the expiry win;
//  * change a reservation's state only along canTransition (a path of it within one call);
//  * answer the same request under a known id as a duplicate and any other as a conflict;
//  * close a USAGE_UNKNOWN reservation as fully consumed by the tick at startedAt + the hard
//    execution limit, never before (the Ledger and local admission; a shard keeps it until a
//    receipt, docs/SHARDS.md).
//
// Sequences: RC_PARAMS (ctest sets max_success=10000; 1000 under the sanitizers). A failure prints
// the seed; replay with RC_PARAMS="reproduce=…" as RapidCheck prints it.

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/ledger.h"
#include "core/local_book.h"
#include "core/shard_book.h"
#include "tests/core/fake_shard_crypto.h"

namespace tally {
namespace {

constexpr uint64_t kStartMs = 1'800'000'000'000;
constexpr uint64_t kHoldTtlMs = 800;
constexpr uint64_t kHardLimitMs = 2'000;
constexpr int kReservationIds = 6;
const std::string kSubject = "tenant";
const std::string kRoute = "chat";

// One of the three owners of a reservation table, behind the operations the property uses.
class Book {
 public:
  virtual ~Book() = default;
  virtual std::optional<ReservationReply> reserve(const ReserveRequest& request, uint64_t now) = 0;
  virtual ReservationReply start(const StartRequest& request, uint64_t now) = 0;
  virtual ReservationReply settle(const SettleRequest& request, uint64_t now) = 0;
  virtual ReservationReply report(const ReportOperationRequest& request, uint64_t now) = 0;
  virtual ReservationReply release(const ReleaseRequest& request, uint64_t now) = 0;
  virtual ReservationReply markUnknown(const MarkUnknownRequest& request, uint64_t now) = 0;
  virtual const Reservation* find(const std::string& id) const = 0;
  virtual void tick(uint64_t now) = 0;
  // Whether tick() closes USAGE_UNKNOWN at startedAt + kHardLimitMs.
  virtual bool closesUnknownAtHardLimit() const = 0;
};

class LedgerBook final : public Book {
 public:
  explicit LedgerBook(LedgerFaults faults = {}) : ledger_({.retention_ms = uint64_t{1} << 40}) {
    ledger_.setFaultsForTesting(faults);
    Budget budget{.subject_pattern = kSubject,
                  .route = kRoute,
                  .unit = "tokens",
                  .refill_per_second = 50,
                  .burst = 600,
                  .max_single_reservation = 400,
                  .hold_ttl_ms = kHoldTtlMs,
                  .hard_execution_limit_ms = kHardLimitMs,
                  .max_overdraft = 200};
    const PolicyReply reply = ledger_.publishPolicy(Policy{.budgets = {budget}}, kStartMs);
    RC_ASSERT(reply.code == ReplyCode::kOk);
  }
  std::optional<ReservationReply> reserve(const ReserveRequest& r, uint64_t now) override {
    return ledger_.reserve(r, now);
  }
  ReservationReply start(const StartRequest& r, uint64_t now) override {
    return ledger_.start(r, now);
  }
  ReservationReply settle(const SettleRequest& r, uint64_t now) override {
    return ledger_.settle(r, now);
  }
  ReservationReply report(const ReportOperationRequest& r, uint64_t now) override {
    return ledger_.reportOperation(r, now);
  }
  ReservationReply release(const ReleaseRequest& r, uint64_t now) override {
    return ledger_.release(r, now);
  }
  ReservationReply markUnknown(const MarkUnknownRequest& r, uint64_t now) override {
    return ledger_.markUnknown(r, now);
  }
  const Reservation* find(const std::string& id) const override {
    return ledger_.findReservation(id);
  }
  void tick(uint64_t now) override {
    (void)ledger_.tick(now);
    RC_ASSERT(ledger_.audit(now).conserved);
  }
  bool closesUnknownAtHardLimit() const override { return true; }

 private:
  Ledger ledger_;
};

PublicKey gatewayKey() {
  PublicKey key{};
  key.fill(4);
  return key;
}

class ShardBookBook final : public Book {
 public:
  explicit ShardBookBook(ShardBookFaults faults = {})
      : book_({.gateway_id = gatewayKey(),
               .boot_epoch = 1,
               .crypto = &crypto_,
               .hold_ttl_ms = kHoldTtlMs}) {
    ShardGrant grant{.shard_id = "shard-1",
                     .subject = kSubject,
                     .route = kRoute,
                     .policy_generation = 1,
                     .gateway_id = gatewayKey(),
                     .gateway_boot_epoch = 1,
                     .fence = 1,
                     .allocated_units = 900,
                     .issued_at_ms = kStartMs,
                     .expires_at_ms = kStartMs + (uint64_t{1} << 40)};
    crypto_.signGrant(&grant);
    RC_ASSERT(book_.addShard(grant, kStartMs) == ShardAddCode::kOk);
    book_.setFaultsForTesting(faults);
  }
  std::optional<ReservationReply> reserve(const ReserveRequest& r, uint64_t now) override {
    return book_.reserve(r, now);
  }
  ReservationReply start(const StartRequest& r, uint64_t now) override {
    return book_.start(r, now);
  }
  ReservationReply settle(const SettleRequest& r, uint64_t now) override {
    return book_.settle(r, now);
  }
  ReservationReply report(const ReportOperationRequest& r, uint64_t now) override {
    return book_.reportOperation(r, now);
  }
  ReservationReply release(const ReleaseRequest& r, uint64_t now) override {
    return book_.release(r, now);
  }
  ReservationReply markUnknown(const MarkUnknownRequest& r, uint64_t now) override {
    return book_.markUnknown(r, now);
  }
  const Reservation* find(const std::string& id) const override {
    return book_.findReservation(id);
  }
  void tick(uint64_t now) override {
    (void)book_.tick(now);
    RC_ASSERT(book_.audit().empty());
  }
  bool closesUnknownAtHardLimit() const override { return false; }

 private:
  testing::KeyedFakeShardCrypto crypto_;
  ShardBook book_;
};

class LocalBookBook final : public Book {
 public:
  LocalBookBook()
      : book_({.entries_max = 1'000,
               .hold_ttl_ms = kHoldTtlMs,
               .hard_execution_limit_ms = kHardLimitMs}) {}
  std::optional<ReservationReply> reserve(const ReserveRequest& r, uint64_t now) override {
    return book_.admit(r, kOriginOff, now);
  }
  ReservationReply start(const StartRequest& r, uint64_t now) override {
    return book_.start(r, now);
  }
  ReservationReply settle(const SettleRequest& r, uint64_t now) override {
    return book_.settle(r, now);
  }
  ReservationReply report(const ReportOperationRequest& r, uint64_t now) override {
    return book_.reportOperation(r, now);
  }
  ReservationReply release(const ReleaseRequest& r, uint64_t now) override {
    return book_.release(r, now);
  }
  ReservationReply markUnknown(const MarkUnknownRequest& r, uint64_t now) override {
    return book_.markUnknown(r, now);
  }
  const Reservation* find(const std::string& id) const override {
    const ReservationReply reply = book_.query({id});
    if (reply.code != ReplyCode::kOk) return nullptr;
    last_ = reply.receipt;
    return &last_;
  }
  void tick(uint64_t now) override { (void)book_.tick(now); }
  bool closesUnknownAtHardLimit() const override { return true; }

 private:
  LocalBook book_;
  mutable Reservation last_;
};

// reachable[from][to]: a path of canTransition edges leads from `from` to `to`.
std::array<std::array<bool, kReservationStateCount>, kReservationStateCount> reachability() {
  std::array<std::array<bool, kReservationStateCount>, kReservationStateCount> r{};
  for (int a = 0; a < kReservationStateCount; ++a) {
    for (int b = 0; b < kReservationStateCount; ++b) {
      r[a][b] = a == b ||
                canTransition(static_cast<ReservationState>(a), static_cast<ReservationState>(b));
    }
  }
  for (int k = 0; k < kReservationStateCount; ++k) {
    for (int a = 0; a < kReservationStateCount; ++a) {
      for (int b = 0; b < kReservationStateCount; ++b) r[a][b] = r[a][b] || (r[a][k] && r[k][b]);
    }
  }
  return r;
}

struct Step {
  uint8_t kind = 0;
  uint32_t a = 0;
  uint32_t b = 0;
};

enum StepKind : uint8_t {
  kReserve,
  kStart,
  kSettle,
  kReport,
  kRelease,
  kMarkUnknown,
  kAdvance,
  kStepKinds,
};

void showValue(const Step& step, std::ostream& os) {
  os << "{kind=" << int{step.kind} << " a=" << step.a << " b=" << step.b << "}";
}

// What the property remembers of one id.
struct Seen {
  bool known = false;
  ReservationState state = ReservationState::kRequested;
  Units reserved_units = 0;
  Units refunded_total = 0;
  bool start_won = false;
};

class Harness {
 public:
  explicit Harness(std::unique_ptr<Book> book) : book_(std::move(book)) {}

  void apply(const Step& step) {
    const int index = static_cast<int>(step.a % kReservationIds);
    const std::string id = "r" + std::to_string(index);
    const std::string op = step.b % 5 == 0 ? "stranger" : "op-" + id;
    const Units actual = step.b % 700;
    std::optional<ReservationReply> reply;
    switch (step.kind % kStepKinds) {
      case kReserve: {
        // Two variants per id: the second differs in units, priority or pin (never both kinds
        // of request succeed under one id).
        ReserveRequest request{.reservation_id = id,
                               .subject = kSubject,
                               .route = kRoute,
                               .units = 1 + step.a % 5 * 60};
        request.request_digest.fill(static_cast<uint8_t>(index));
        switch (step.b % 4) {
          case 1: request.priority = 1; break;
          case 2: request.policy_generation = 1; break;
          case 3: request.request_digest[0] ^= 1; break;
          default: break;
        }
        reply = book_->reserve(request, now_);
        if (reply.has_value()) checkRepeat(index, request, *reply);
        break;
      }
      case kStart: {
        reply = book_->start({id, op}, now_);
        if (reply->code == ReplyCode::kOk && !reply->duplicate) seen_[index].start_won = true;
        break;
      }
      case kSettle: reply = book_->settle({id, op, actual}, now_); break;
      case kReport: reply = book_->report({id, op, actual}, now_); break;
      case kRelease: reply = book_->release({id}, now_); break;
      case kMarkUnknown: reply = book_->markUnknown({id, op}, now_); break;
      case kAdvance:
        now_ = step.b % 3 == 0 ? nearHardLimit(step.b / 3 % 2) : now_ + step.b % 1'500;
        book_->tick(now_);
        ticked_ = true;
        break;
      default: break;
    }
    if (reply.has_value()) {
      if (reply->duplicate) RC_ASSERT(reply->refunded_units == 0u);
      seen_[index].refunded_total += reply->refunded_units;
    }
    for (int i = 0; i < kReservationIds; ++i) checkRecord(i);
    ticked_ = false;
  }

 private:
  // The first hard-limit deadline of a USAGE_UNKNOWN reservation still ahead, or 1 ms before it
  // (`early`), so that ticks land on the boundary; now_ if there is none.
  uint64_t nearHardLimit(bool early) const {
    uint64_t next = now_;
    for (int i = 0; i < kReservationIds; ++i) {
      const Reservation* reservation = book_->find("r" + std::to_string(i));
      if (reservation == nullptr || reservation->state != ReservationState::kUsageUnknown) continue;
      const uint64_t at = reservation->started_at_ms + kHardLimitMs - (early ? 1 : 0);
      if (at > now_ && (next == now_ || at < next)) next = at;
    }
    return next;
  }

  // The same request again under a known id is a duplicate; any other, a conflict.
  void checkRepeat(int index, const ReserveRequest& request, const ReservationReply& reply) {
    if (!seen_[index].known) return;
    const Reservation* stored = book_->find(request.reservation_id);
    RC_ASSERT(stored != nullptr);
    // An extend (only ever of a started reservation) grows the record past the units its
    // reserve asked for: that reserve again is still the same request (lifecycle::sameRequest).
    const bool same_units =
        stored->reserved_units == request.units ||
        (!stored->operation_id.empty() && request.units < stored->reserved_units);
    const bool same = stored->request_digest == request.request_digest && same_units &&
                      stored->priority == request.priority &&
                      stored->requested_generation == request.policy_generation;
    if (same) {
      RC_ASSERT(reply.duplicate);
    } else {
      RC_ASSERT(reply.code == ReplyCode::kIdempotencyConflict);
    }
  }

  void checkRecord(int index) {
    static const auto reachable = reachability();
    const Reservation* reservation = book_->find("r" + std::to_string(index));
    Seen& seen = seen_[index];
    if (reservation == nullptr) {
      RC_ASSERT(!seen.known);  // nothing is compacted or evicted in these tables
      return;
    }
    if (!seen.known) {
      seen.known = true;
      seen.reserved_units = reservation->reserved_units;
    }
    RC_ASSERT(reachable[static_cast<int>(seen.state)][static_cast<int>(reservation->state)]);
    seen.state = reservation->state;
    RC_ASSERT(seen.refunded_total <= seen.reserved_units);
    RC_ASSERT(reservation->refunded_units <= reservation->reserved_units);
    // The start-vs-expiry CAS has one winner.
    const bool expired = reservation->state == ReservationState::kExpiring ||
                         reservation->state == ReservationState::kExpired;
    RC_ASSERT(!(expired && seen.start_won));
    // The hard-limit close: at startedAt + the limit (once a tick has seen it), never before.
    const uint64_t hard_limit_at = reservation->started_at_ms + kHardLimitMs;
    if (reservation->closed_by_hard_limit) {
      RC_ASSERT(book_->closesUnknownAtHardLimit());
      RC_ASSERT(reservation->closed_at_ms >= hard_limit_at);
    }
    if (ticked_ && book_->closesUnknownAtHardLimit() &&
        reservation->state == ReservationState::kUsageUnknown) {
      RC_ASSERT(now_ < hard_limit_at);
    }
  }

  std::unique_ptr<Book> book_;
  uint64_t now_ = kStartMs;
  bool ticked_ = false;  // the step being checked was a tick
  std::array<Seen, kReservationIds> seen_{};
};

rc::Gen<std::vector<Step>> genSteps() {
  const rc::Gen<uint8_t> kind = rc::gen::weightedOneOf<uint8_t>({
      {6, rc::gen::just<uint8_t>(kReserve)},
      {5, rc::gen::just<uint8_t>(kStart)},
      {3, rc::gen::just<uint8_t>(kSettle)},
      {2, rc::gen::just<uint8_t>(kReport)},
      {2, rc::gen::just<uint8_t>(kRelease)},
      {2, rc::gen::just<uint8_t>(kMarkUnknown)},
      {3, rc::gen::just<uint8_t>(kAdvance)},
  });
  const rc::Gen<Step> step = rc::gen::build<Step>(
      rc::gen::set(&Step::kind, kind), rc::gen::set(&Step::a, rc::gen::arbitrary<uint32_t>()),
      rc::gen::set(&Step::b, rc::gen::arbitrary<uint32_t>()));
  return rc::gen::mapcat(rc::gen::inRange<size_t>(1, 120), [step](size_t n) {
    return rc::gen::container<std::vector<Step>>(n, step);
  });
}

RC_GTEST_PROP(LifecycleProperty, ThroughTheLedgersAccounts, ()) {
  Harness harness(std::make_unique<LedgerBook>());
  for (const Step& step : *genSteps()) harness.apply(step);
}

RC_GTEST_PROP(LifecycleProperty, ThroughAShard, ()) {
  Harness harness(std::make_unique<ShardBookBook>());
  for (const Step& step : *genSteps()) harness.apply(step);
}

RC_GTEST_PROP(LifecycleProperty, ThroughLocalAdmission, ()) {
  Harness harness(std::make_unique<LocalBookBook>());
  for (const Step& step : *genSteps()) harness.apply(step);
}

// The property is able to fail: a holder that refunds a duplicate release is caught, whichever
// holder it is.
template <typename MakeBook>
bool propertyFindsFault(MakeBook make_book) {
  return !rc::check("broken holder", [make_book] {
    Harness harness(make_book());
    for (const Step& step : *genSteps()) harness.apply(step);
  });
}

TEST(LifecyclePropertyCanFail, ADuplicateRefundIsCaughtThroughEachHolder) {
  EXPECT_TRUE(propertyFindsFault(
      [] { return std::make_unique<LedgerBook>(LedgerFaults{.double_refund_release = true}); }));
  EXPECT_TRUE(propertyFindsFault([] {
    return std::make_unique<ShardBookBook>(ShardBookFaults{.refund_duplicate_release = true});
  }));
}

}  // namespace
}  // namespace tally
