// Property test for the agent's shard book: random sequences of shard grants (some invalid),
// local reservation operations, closes, fences, ledger answers and time, with the local
// equation and "Σ admitted units ≤ allocated" checked after every single step.
//
// Sequences: RC_PARAMS (ctest sets max_success=10000; 1000 under the sanitizers). A failure prints
// the seed; replay with RC_PARAMS="reproduce=…" as RapidCheck prints it.

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/shard_book.h"
#include "tests/core/fake_shard_crypto.h"

namespace tally {
namespace {

constexpr uint64_t kStartMs = 1'800'000'000'000;
constexpr uint64_t kBootEpoch = 3;
constexpr int kShardIds = 4;
constexpr int kReservationIds = 8;

struct Step {
  uint8_t kind = 0;
  uint32_t a = 0;
  uint32_t b = 0;
  uint32_t c = 0;
};

enum StepKind : uint8_t {
  kAddShard,
  kReserve,
  kStart,
  kSettle,
  kReport,
  kRelease,
  kMarkUnknown,
  kClose,
  kFence,
  kAnswer,
  kAdvance,
  kStepKinds,
};

void showValue(const Step& step, std::ostream& os) {
  os << "{kind=" << int{step.kind % kStepKinds} << " a=" << step.a << " b=" << step.b
     << " c=" << step.c << "}";
}

PublicKey ourKey() {
  PublicKey key{};
  key.fill(9);
  return key;
}

class Harness {
 public:
  explicit Harness(ShardBookFaults faults = {})
      : book_({.gateway_id = ourKey(),
               .boot_epoch = kBootEpoch,
               .crypto = &crypto_,
               .retention_ms = 5'000,
               .hold_ttl_ms = 800,
               .reservations_per_shard_max = 6}) {
    book_.setFaultsForTesting(faults);
  }

  void apply(const Step& step) {
    const std::string shard_id = "shard-" + std::to_string(step.a % kShardIds);
    const std::string id = "r" + std::to_string(step.a % kReservationIds);
    const std::string op = step.b % 6 == 0 ? "stranger" : "op-" + id;
    const std::string route = step.b % 2 == 0 ? "chat" : "embed";
    const Reservation* existing = book_.findReservation(id);
    const Units held = existing == nullptr ? 0 : existing->reserved_units;
    switch (step.kind % kStepKinds) {
      case kAddShard: {
        ShardGrant grant{.shard_id = shard_id,
                         .subject = "tenant",
                         .route = route,
                         .policy_generation = 1,
                         .gateway_id = ourKey(),
                         .gateway_boot_epoch = kBootEpoch,
                         .fence = 1 + step.c % 3,
                         .allocated_units = 1 + step.c % 200,
                         .issued_at_ms = now_,
                         .expires_at_ms = now_ + 1 + step.b % 4'000};
        // Sometimes break one rule of rule 2.
        switch (step.c % 9) {
          case 0: grant.gateway_id[0] ^= 1; break;
          case 1: grant.gateway_boot_epoch = kBootEpoch - 1; break;
          default: break;
        }
        crypto_.signGrant(&grant);
        if (step.c % 9 == 2) grant.allocated_units += 1;  // tampered after signing
        const uint64_t fence_before = book_.highestFence({"tenant", route});
        const ShardAddCode code = book_.addShard(grant, now_);
        if (code == ShardAddCode::kOk) {
          RC_ASSERT(step.c % 9 > 2);
          RC_ASSERT(grant.fence >= fence_before);
        }
        break;
      }
      case kReserve: {
        ReserveRequest request{.reservation_id = id,
                               .request_digest = Digest{static_cast<uint8_t>(step.c % 2)},
                               .subject = "tenant",
                               .route = route,
                               .units = 1 + step.c % 120};
        std::map<std::string, bool> usable;
        book_.forEachShard([&](const std::string& sid, const ShardBook::Shard& shard) {
          usable[sid] = book_.isUsable(shard, now_);
        });
        const std::optional<ReservationReply> reply = book_.reserve(request, now_);
        if (reply.has_value() && reply->code == ReplyCode::kOk && !reply->duplicate) {
          RC_ASSERT(existing == nullptr);
          RC_ASSERT(usable[reply->receipt.origin]);  // never from a closed/expired/fenced one
          RC_ASSERT(reply->receipt.reserved_units == request.units);
        }
        if (existing != nullptr) RC_ASSERT(reply.has_value());  // a known id is always answered
        break;
      }
      case kStart: (void)book_.start({id, op}, now_); break;
      case kSettle:
      case kReport: {
        const Units actual = step.c % (2 * held + 30);
        const ReservationReply reply = step.kind % kStepKinds == kSettle
                                           ? book_.settle({id, op, actual}, now_)
                                           : book_.reportOperation({id, op, actual}, now_);
        if (reply.duplicate) RC_ASSERT(reply.refunded_units == 0u);
        break;
      }
      case kRelease: {
        const ReservationReply reply = book_.release({id}, now_);
        if (reply.duplicate) RC_ASSERT(reply.refunded_units == 0u);
        break;
      }
      case kMarkUnknown: {
        const ShardBalances before = balancesOfReservation(id);
        const ReservationReply reply = book_.markUnknown({id, op}, now_);
        RC_ASSERT(reply.refunded_units == 0u);
        RC_ASSERT(balancesOfReservation(id) == before);  // UNKNOWN keeps its units
        break;
      }
      case kClose:
        (void)book_.close(shard_id, ShardCloseReason::kReconnect, now_);
        if (const ShardBook::Shard* shard = book_.findShard(shard_id)) {
          RC_ASSERT(shard->account.closed());
          RC_ASSERT(book_.buildReport(shard_id, now_).has_value());
        }
        break;
      case kFence: (void)book_.noteFence({"tenant", route}, 1 + step.c % 4, now_); break;
      case kAnswer: {
        const ShardBook::Shard* shard = book_.findShard(shard_id);
        if (shard == nullptr) break;
        ShardLedgerView view{.grant = shard->record.grant,
                             .state = static_cast<ShardState>(step.c % kShardStateCount),
                             .current_fence = shard->record.grant.fence + step.b % 2,
                             .reported = true,
                             .last_reported = shard->account.balances()};
        (void)book_.onLedgerAnswer(shard_id, view, now_);
        break;
      }
      case kAdvance:
        now_ += step.c % 1'500;
        if (step.b % 3 != 0) (void)book_.tick(now_);  // time may pass without the tick
        break;
      default: break;
    }
    (void)book_.takeChanges();
    check();
  }

 private:
  ShardBalances balancesOfReservation(const std::string& id) const {
    const Reservation* reservation = book_.findReservation(id);
    if (reservation == nullptr) return {};
    return book_.findShard(reservation->origin)->account.balances();
  }

  void check() const {
    const std::vector<std::string> violations = book_.audit();
    RC_ASSERT(violations.empty());
    std::map<std::string, Units> held;
    std::map<std::string, Units> settled;
    std::map<std::string, Units> debt;
    for (int i = 0; i < kReservationIds; ++i) {
      const Reservation* r = book_.findReservation("r" + std::to_string(i));
      if (r == nullptr) continue;
      if (holdsUnits(r->state)) held[r->origin] += r->reserved_units;
      if (r->state == ReservationState::kSettled ||
          r->state == ReservationState::kSettledWithDebt) {
        settled[r->origin] += r->actual_units;
        debt[r->origin] += r->debt_units;
      }
    }
    book_.forEachShard([&](const std::string& id, const ShardBook::Shard& shard) {
      const ShardBalances& b = shard.account.balances();
      RC_ASSERT(isConserved(b));
      // Σ admitted units still held or consumed never exceeds what was allocated; only usage
      // beyond what the shard could cover (overspent) goes past it, and it is recorded.
      RC_ASSERT(held[id] + settled[id] <= b.allocated + b.overspent);
      RC_ASSERT(held[id] == b.local_reserved);
      RC_ASSERT(settled[id] == b.local_spent + b.overspent);
      RC_ASSERT(debt[id] == b.overspent);
      if (shard.account.closed()) RC_ASSERT(b.local_available == 0u);
    });
  }

  testing::KeyedFakeShardCrypto crypto_;
  ShardBook book_;
  uint64_t now_ = kStartMs;
};

rc::Gen<Step> genStep() {
  const rc::Gen<uint8_t> kind = rc::gen::weightedOneOf<uint8_t>({
      {3, rc::gen::just<uint8_t>(kAddShard)},
      {8, rc::gen::just<uint8_t>(kReserve)},
      {6, rc::gen::just<uint8_t>(kStart)},
      {4, rc::gen::just<uint8_t>(kSettle)},
      {2, rc::gen::just<uint8_t>(kReport)},
      {2, rc::gen::just<uint8_t>(kRelease)},
      {2, rc::gen::just<uint8_t>(kMarkUnknown)},
      {1, rc::gen::just<uint8_t>(kClose)},
      {1, rc::gen::just<uint8_t>(kFence)},
      {1, rc::gen::just<uint8_t>(kAnswer)},
      {3, rc::gen::just<uint8_t>(kAdvance)},
  });
  return rc::gen::build<Step>(rc::gen::set(&Step::kind, kind),
                              rc::gen::set(&Step::a, rc::gen::arbitrary<uint32_t>()),
                              rc::gen::set(&Step::b, rc::gen::arbitrary<uint32_t>()),
                              rc::gen::set(&Step::c, rc::gen::arbitrary<uint32_t>()));
}

rc::Gen<std::vector<Step>> genSteps() {
  return rc::gen::mapcat(rc::gen::inRange<size_t>(1, 200), [](size_t n) {
    return rc::gen::container<std::vector<Step>>(n, genStep());
  });
}

RC_GTEST_PROP(ShardBookProperty, LocalEquationAndAdmissionHoldAfterEveryStep, ()) {
  Harness harness;
  for (const Step& step : *genSteps()) harness.apply(step);
}

// The property is able to fail: with a deliberately broken book it finds a counterexample.
bool propertyFindsFault(ShardBookFaults faults) {
  return !rc::check("broken shard book", [faults] {
    Harness harness(faults);
    for (const Step& step : *genSteps()) harness.apply(step);
  });
}

TEST(ShardBookPropertyCanFail, AdmissionFromAnExpiredOrFencedShardIsCaught) {
  EXPECT_TRUE(propertyFindsFault(ShardBookFaults{.admit_from_unusable = true}));
}

TEST(ShardBookPropertyCanFail, ARefundOnADuplicateReleaseIsCaught) {
  EXPECT_TRUE(propertyFindsFault(ShardBookFaults{.refund_duplicate_release = true}));
}

}  // namespace
}  // namespace tally
