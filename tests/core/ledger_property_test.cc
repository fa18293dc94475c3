// Property tests for the central ledger: random sequences of every operation (including
// duplicates, out-of-order calls, expiry halves, generation switches, carve and remint) over
// several accounts, with the invariants of SPEC §8 checked after every single step.
//
// Sequences per property: RC_PARAMS (ctest sets max_success=10000; 1000 under the sanitizers). A
// failure prints the seed; replay with RC_PARAMS="reproduce=…" as RapidCheck prints it.

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "core/ledger.h"
#include "core/shard_account.h"
#include "tests/core/shard_fake_crypto.h"

namespace tally {
namespace {

constexpr uint64_t kStartMs = 1'800'000'000'000;  // an arbitrary Unix time
constexpr int kSubjects = 3;
constexpr int kReservationIds = 6;
const char* const kRoute = "chat.generate";
const char* const kGateway = "gw-1";
constexpr uint64_t kShardTtlMs = 5'000;

Policy makePolicy(Units burst) {
  Policy policy;
  for (int i = 0; i < kSubjects; ++i) {
    policy.budgets.push_back(Budget{
        .subject_pattern = "tenant-" + std::to_string(i),
        .route = kRoute,
        .unit = "tokens",
        .refill_per_second = 100,
        .burst = burst,
        .max_single_reservation = burst * 4 / 5,
        .hold_ttl_ms = 1'000,
        .hard_execution_limit_ms = 3'000,
        .max_overdraft = 200,
        .emergency = {.enabled = true, .shard_units = 100, .shard_ttl_ms = kShardTtlMs},
    });
  }
  return policy;
}

// One step of a sequence, as raw numbers the interpreter maps onto an operation.
struct Step {
  uint8_t kind = 0;
  uint32_t a = 0;
  uint32_t b = 0;
  uint32_t c = 0;
};

enum StepKind : uint8_t {
  kReserve,
  kStart,
  kSettle,
  kRelease,
  kMarkUnknown,
  kReport,
  kAdvance,
  kBeginExpiry,
  kCompleteExpiry,
  kIssueShard,
  kShardOp,  // the model agent admits, starts, settles, releases or marks unknown locally
  kReportShard,
  kRestartAgent,
  kRevokeShard,
  kWriteOffShard,
  kPublish,
  kRollback,
  kStepKinds,
};

void showValue(const Step& step, std::ostream& os) {
  os << "{kind=" << int{step.kind % kStepKinds} << " a=" << step.a << " b=" << step.b
     << " c=" << step.c << "}";
}

Digest digestOf(const std::string& id, const std::string& subject, Units units) {
  // Stand-in for the canonical sha256 (which lives in wire/): any injective-enough function
  // of the identifying fields does here, since the ledger only compares digests.
  Digest digest{};
  uint64_t h = 1469598103934665603ull;
  const std::string text = id + "|" + subject + "|" + std::to_string(units);
  for (unsigned char ch : text) h = (h ^ ch) * 1099511628211ull;
  for (size_t i = 0; i < digest.size(); ++i) digest[i] = static_cast<uint8_t>(h >> (8 * (i % 8)));
  return digest;
}

// How often each interesting path was reached, over every sequence of a run. The coverage test
// asserts each is reached, so a generator that silently stops exercising a path fails.
std::map<std::string, uint64_t>& reached() {
  static std::map<std::string, uint64_t> counts;
  return counts;
}

void note(const std::string& event) { ++reached()[event]; }

struct Track {
  bool start_won = false;
  bool expiry_won = false;
  Units refunded_total = 0;
};

// The model agent's side of one shard: its local account and receipts, and what the ledger
// last accepted from it.
struct ModelShard {
  ShardGrant grant;
  ShardAccount account = ShardAccount::allocate(0);
  std::map<std::string, Reservation> receipts;
  int next_receipt = 0;
  std::optional<ShardReport> last_sent;
  std::optional<ShardReport> accepted;
};

PublicKey gatewayKey() {
  PublicKey key{};
  key.fill(7);
  return key;
}

// Same boot epoch, balances and receipts: what the ledger treats as a repeat.
bool sameReport(const ShardReport& a, const ShardReport& b) {
  return a.gateway_boot_epoch == b.gateway_boot_epoch && a.balances == b.balances &&
         a.receipts == b.receipts;
}

// Drives a Ledger with Steps and checks every invariant after each one.
class Harness {
 public:
  explicit Harness(LedgerFaults faults) {
    ledger_.setFaultsForTesting(faults);
    ledger_.setShardCrypto(&crypto_);
    RC_ASSERT(ledger_.publishPolicy(makePolicy(1'000), now_).code == ReplyCode::kOk);
    RC_ASSERT(ledger_.enrollGateway(kGateway, gatewayKey(), now_).code == ReplyCode::kOk);
  }

  void apply(const Step& step) {
    const std::string id = "r" + std::to_string(step.a % kReservationIds);
    // One subject more than the policy has budgets for.
    const std::string subject = "tenant-" + std::to_string(step.b % (kSubjects + 1));
    // Mostly the right operation id, sometimes a stranger's.
    const std::string op = step.b % 5 == 0 ? "stranger" : "op-" + id;
    const std::vector<AccountView> before = ledger_.accounts().view(now_);
    const Reservation* existing = ledger_.findReservation(id);
    const Units held = existing == nullptr ? 0 : existing->reserved_units;
    const bool was_reserved = existing != nullptr && existing->state == ReservationState::kReserved;

    switch (step.kind % kStepKinds) {
      case kReserve: {
        const Units units = 1 + step.c % 1'100;
        // Usually the request the id was first used for (a retry), sometimes another one.
        const Units digest_units =
            (existing != nullptr && step.c % 7 != 0) ? existing->reserved_units : units;
        const std::string digest_subject =
            (existing != nullptr && step.c % 7 != 0) ? existing->subject : subject;
        ReserveRequest request{.reservation_id = id,
                               .request_digest = digestOf(id, digest_subject, digest_units),
                               .subject = digest_subject,
                               .route = kRoute,
                               .units = digest_units};
        // Now and then pin the first generation, which drains after a publish.
        if (step.c % 11 == 0) request.policy_generation = 1;
        const ReservationReply reply = ledger_.reserve(request, now_);
        checkReply(id, reply, before);
        if (reply.code == ReplyCode::kRejected && !reply.duplicate) {
          note(std::string("rejected:") + limitingDimensionName(reply.receipt.limiting_dimension));
        }
        if (reply.code == ReplyCode::kOk && !reply.duplicate) {
          // Admission is 0 while the subject/route owes debt.
          RC_ASSERT(ledger_.accounts().debt({digest_subject, kRoute}) == 0u);
          RC_ASSERT(reply.receipt.state == ReservationState::kReserved);
        }
        break;
      }
      case kStart: {
        const ReservationReply reply = ledger_.start({id, op}, now_);
        checkReply(id, reply, before);
        if (reply.code == ReplyCode::kOk && !reply.duplicate) {
          tracks_[id].start_won = true;
          note("started");
        }
        if (reply.code == ReplyCode::kExpired && was_reserved) {
          tracks_[id].expiry_won = true;
          note("expired-by-start");
        }
        break;
      }
      case kSettle:
      case kReport: {
        // Mostly within twice the reservation; one in four far above it, to make debt.
        const Units actual = step.c % 4 == 0 ? held + step.c % 1'500 : step.c % (2 * held + 50);
        const ReservationReply reply = step.kind % kStepKinds == kSettle
                                           ? ledger_.settle({id, op, actual}, now_)
                                           : ledger_.reportOperation({id, op, actual}, now_);
        checkReply(id, reply, before);
        break;
      }
      case kRelease: checkReply(id, ledger_.release({id}, now_), before); break;
      case kMarkUnknown: {
        const ReservationReply reply = ledger_.markUnknown({id, op}, now_);
        checkReply(id, reply, before);
        // UNKNOWN is never treated as unconsumed: marking returns nothing and moves nothing.
        RC_ASSERT(reply.refunded_units == 0u);
        RC_ASSERT(ledger_.accounts().view(now_) == before);
        break;
      }
      case kAdvance: {
        now_ += step.c % 700;
        if (step.b % 3 != 0) break;  // time passes without the expiry task running
        const TickOutcome outcome = ledger_.tick(now_);
        if (outcome.expired > 0) note("expired-by-tick");
        if (outcome.closed_by_hard_limit > 0) note("closed-by-hard-limit");
        if (outcome.shards_reminted > 0) note("shard-deferred-remint");
        break;
      }
      case kBeginExpiry:
        if (ledger_.beginExpiry(id, now_)) {
          RC_ASSERT(!tracks_[id].start_won);
          tracks_[id].expiry_won = true;
          note("begin-expiry");
        }
        break;
      case kCompleteExpiry: {
        const bool was_expiring =
            existing != nullptr && existing->state == ReservationState::kExpiring;
        RC_ASSERT(ledger_.completeExpiry(id, now_) == was_expiring);
        if (was_expiring) tracks_[id].refunded_total += held;
        break;
      }
      case kIssueShard: issueShard(step, subject, before); break;
      case kShardOp:
        if (!shards_.empty()) shardOp(step, &shards_[step.a % shards_.size()]);
        break;
      case kReportShard:
        if (!shards_.empty()) reportShard(step, &shards_[step.a % shards_.size()], before);
        break;
      case kRestartAgent:
        // A new boot epoch: every shard of the earlier one is closed at boot.
        ++boot_epoch_;
        for (ModelShard& shard : shards_) shard.account.close();
        break;
      case kRevokeShard: {
        const bool by_gateway = step.c % 3 == 0 || shards_.empty();
        const ShardReply reply =
            by_gateway
                ? ledger_.revokeShards("", kGateway, now_)
                : ledger_.revokeShards(shards_[step.a % shards_.size()].grant.shard_id, "", now_);
        RC_ASSERT(reply.code == ReplyCode::kOk || reply.code == ReplyCode::kInvalidState);
        if (reply.code == ReplyCode::kOk && !reply.duplicate && !reply.shards.empty()) {
          note("shard-revoked");
        }
        break;
      }
      case kWriteOffShard: {
        if (shards_.empty()) break;
        const ModelShard& shard = shards_[step.a % shards_.size()];
        const ShardReply reply = ledger_.writeOffShard(shard.grant.shard_id, now_);
        RC_ASSERT(reply.code == ReplyCode::kOk || reply.code == ReplyCode::kInvalidState);
        if (reply.code == ReplyCode::kOk) {
          RC_ASSERT(now_ >= shard.grant.expires_at_ms);
          if (!reply.duplicate) note("shard-written-off");
        }
        break;
      }
      case kPublish:
        RC_ASSERT(ledger_.publishPolicy(makePolicy(step.c % 2 == 0 ? 1'000 : 400), now_).code ==
                  ReplyCode::kOk);
        break;
      case kRollback: {
        const ReplyCode code = ledger_.rollbackPolicy(now_).code;
        RC_ASSERT(code == ReplyCode::kOk || code == ReplyCode::kInvalidState);
        if (code == ReplyCode::kOk) note("rolled-back");
        break;
      }
    }
    checkInvariants();
  }

 private:
  void issueShard(const Step& step, const std::string& subject,
                  const std::vector<AccountView>& before) {
    // Usually a new request id, sometimes a retry of an earlier one (same or other fields).
    const bool retry = issue_requests_ > 0 && step.c % 4 == 0;
    const std::string request_id =
        "q" + std::to_string(retry ? step.a % issue_requests_ : issue_requests_++);
    ShardIssueRequest request{.request_id = request_id,
                              .gateway_name = kGateway,
                              .gateway_id = gatewayKey(),
                              .gateway_boot_epoch = boot_epoch_,
                              .subject = subject,
                              .route = kRoute};
    testing::signIssue(&request);
    const ShardReply reply = ledger_.issueShard(request, now_);
    note(std::string("issue:") + replyCodeName(reply.code) + (reply.duplicate ? ":duplicate" : ""));
    if (reply.duplicate) RC_ASSERT(ledger_.accounts().view(now_) == before);
    if (reply.code != ReplyCode::kOk || reply.duplicate) return;
    RC_ASSERT(ledger_.accounts().debt({subject, kRoute}) == 0u);
    const ShardGrant& grant = reply.shards.front().grant;
    ModelShard shard{.grant = grant, .account = ShardAccount::allocate(grant.allocated_units)};
    shards_.push_back(std::move(shard));
    note("shard-issued");
  }

  // Picks one receipt of `shard` in one of `states`, or null.
  Reservation* pick(ModelShard* shard, uint32_t seed,
                    std::initializer_list<ReservationState> states) {
    std::vector<Reservation*> candidates;
    for (auto& [id, receipt] : shard->receipts) {
      for (ReservationState state : states) {
        if (receipt.state == state) candidates.push_back(&receipt);
      }
    }
    return candidates.empty() ? nullptr : candidates[seed % candidates.size()];
  }

  void shardOp(const Step& step, ModelShard* shard) {
    using S = ReservationState;
    switch (step.c % 6) {
      case 0:
      case 1: {
        const Units units = 1 + step.b % 60;
        if (shard->account.reserve(units) != ShardCode::kOk) return;
        const std::string id = shard->grant.shard_id + "-r" + std::to_string(shard->next_receipt++);
        shard->receipts[id] = Reservation{.reservation_id = id,
                                          .subject = shard->grant.subject,
                                          .route = shard->grant.route,
                                          .reserved_units = units,
                                          .operation_id = "op-" + id,
                                          .state = S::kReserved,
                                          .origin = shard->grant.shard_id};
        return;
      }
      case 2:
        if (Reservation* r = pick(shard, step.b, {S::kReserved})) r->state = S::kStarted;
        return;
      case 3:
        if (Reservation* r = pick(shard, step.b, {S::kStarted, S::kUsageUnknown})) {
          const Units actual =
              step.b % 5 == 0 ? r->reserved_units + step.b % 40 : step.b % (r->reserved_units + 1);
          RC_ASSERT(shard->account.settle(r->reserved_units, actual).code == ShardCode::kOk);
          r->actual_units = actual;
          r->state = actual > r->reserved_units ? S::kSettledWithDebt : S::kSettled;
        }
        return;
      case 4:
        if (Reservation* r = pick(shard, step.b, {S::kReserved})) {
          RC_ASSERT(shard->account.release(r->reserved_units) == ShardCode::kOk);
          r->state = S::kReleased;
        }
        return;
      default:
        if (Reservation* r = pick(shard, step.b, {S::kStarted})) r->state = S::kUsageUnknown;
        return;
    }
  }

  void reportShard(const Step& step, ModelShard* shard, const std::vector<AccountView>& before) {
    shard->account.close();  // the agent stops admitting from a shard before reporting it
    ShardReport report;
    if (step.c % 4 == 0 && shard->last_sent.has_value()) {
      report = *shard->last_sent;  // a retry after a lost ACK: the very same report
    } else {
      report.shard = shard->grant;
      report.balances = shard->account.balances();
      for (const auto& [id, receipt] : shard->receipts) report.receipts.push_back(receipt);
      report.gateway_boot_epoch = boot_epoch_;
      report.reported_at_ms = now_;
      testing::signReport(&report);
    }
    const bool repeat = shard->accepted.has_value() && sameReport(report, *shard->accepted);
    const ShardReply reply = ledger_.reportShard(report, now_);
    shard->last_sent = report;
    RC_ASSERT(!reply.permission_denied);
    RC_ASSERT(reply.code == ReplyCode::kOk || reply.code == ReplyCode::kInvalidState);
    if (repeat) {
      // A duplicate recovery remints 0 and moves nothing.
      RC_ASSERT(reply.reminted_units == 0u);
      RC_ASSERT(reply.spent_units == 0u);
      RC_ASSERT(ledger_.accounts().view(now_) == before);
      note("shard-duplicate-report");
    }
    if (reply.code != ReplyCode::kOk) return;
    shard->accepted = report;  // whether or not the agent hears the answer (c % 4 == 1: lost)
    note(std::string("shard:") + shardStateName(reply.shards.front().state));
    if (reply.reminted_units > 0) note("reminted");
  }

  // Checks every reply: duplicates change nothing and refund 0; a reservation never returns
  // more units than it held; start and expiry never both win.
  void checkReply(const std::string& id, const ReservationReply& reply,
                  const std::vector<AccountView>& before) {
    Track& track = tracks_[id];
    note(std::string("reply:") + replyCodeName(reply.code) + (reply.duplicate ? ":duplicate" : ""));
    if (!reply.duplicate && reply.code == ReplyCode::kOk) {
      note(std::string("state:") + reservationStateName(reply.receipt.state));
      if (reply.receipt.late_receipt_applied) note("late-receipt");
    }
    if (reply.duplicate) {
      RC_ASSERT(reply.refunded_units == 0u);
      RC_ASSERT(ledger_.accounts().view(now_) == before);
    }
    track.refunded_total += reply.refunded_units;
    const Reservation* reservation = ledger_.findReservation(id);
    if (reservation != nullptr) {
      RC_ASSERT(track.refunded_total <= reservation->reserved_units);
      if (reservation->state == ReservationState::kStarted ||
          reservation->state == ReservationState::kUsageUnknown) {
        RC_ASSERT(!track.expiry_won);
      }
      if (reservation->state == ReservationState::kExpired) RC_ASSERT(!track.start_won);
    }
  }

  // What takeChanges() names must be enough to rebuild the ledger: apply it to a shadow copy
  // of the durable record and compare that with the live state.
  void checkChangesAreComplete() {
    const LedgerChanges changes = ledger_.takeChanges();
    for (const std::string& id : changes.reservations_upserted) {
      const Reservation* live = ledger_.findReservation(id);
      RC_ASSERT(live != nullptr);
      stored_reservations_[id] = *live;
    }
    for (const std::string& id : changes.reservations_deleted) stored_reservations_.erase(id);
    for (const AccountKey& key : changes.accounts) {
      const AccountEntry* entry = ledger_.accounts().find(key);
      RC_ASSERT(entry != nullptr);
      stored_accounts_.insert_or_assign(key, entry->account);
    }
    for (const std::string& id : changes.shards) {
      const ShardRecord* live = ledger_.shards().find(id);
      RC_ASSERT(live != nullptr);
      stored_shards_[id] = *live;
    }
    if (changes.shard_sequence) stored_shard_sequence_ = ledger_.shards().shardSequence();
    RC_ASSERT(stored_shard_sequence_ == ledger_.shards().shardSequence());
    for (const std::string& id : changes.shards_deleted) stored_shards_.erase(id);
    for (const ModelShard& shard : shards_) {
      const ShardRecord* live = ledger_.shards().find(shard.grant.shard_id);
      auto stored = stored_shards_.find(shard.grant.shard_id);
      RC_ASSERT((live == nullptr) == (stored == stored_shards_.end()));
      if (live != nullptr) RC_ASSERT(stored->second == *live);
    }
    for (int i = 0; i < kReservationIds; ++i) {
      const std::string id = "r" + std::to_string(i);
      const Reservation* live = ledger_.findReservation(id);
      auto stored = stored_reservations_.find(id);
      RC_ASSERT((live == nullptr) == (stored == stored_reservations_.end()));
      if (live != nullptr) RC_ASSERT(*live == stored->second);
    }
    for (const AccountView& view : ledger_.accounts().view(now_)) {
      auto stored = stored_accounts_.find(view.key);
      RC_ASSERT(stored != stored_accounts_.end());
      const Account& live = ledger_.accounts().find(view.key)->account;
      RC_ASSERT(stored->second.balances() == live.balances());
      RC_ASSERT(stored->second.refillClockMs() == live.refillClockMs());
      RC_ASSERT(stored->second.refillCarry() == live.refillCarry());
    }
  }

  void checkInvariants() {
    checkChangesAreComplete();
    const AuditReport report = ledger_.audit(now_);
    if (!report.conserved) {
      std::string all;
      for (const std::string& violation : report.violations) all += violation + "; ";
      RC_FAIL("audit failed at t=" + std::to_string(now_ - kStartMs) + ": " + all);
    }
    Units spent_by_accounts = 0;
    for (const AccountView& view : report.accounts) {
      const Balances& b = view.balances;
      // No balance may have wrapped below zero.
      for (Units value : {b.available, b.reserved, b.spent, b.retired_for_emergency, b.minted,
                          b.overdraft_issued, b.overdraft_repaid, b.transferred_out}) {
        RC_ASSERT(value < (Units{1} << 60));
      }
      RC_ASSERT(b.overdraft_repaid <= b.overdraft_issued);
      spent_by_accounts += b.spent;
      if (b.transferred_out > 0) note("transferred-between-accounts");
    }
    // What accounts call spent is exactly what settled receipts say was used.
    Units spent_by_receipts = 0;
    for (int i = 0; i < kReservationIds; ++i) {
      const Reservation* r = ledger_.findReservation("r" + std::to_string(i));
      if (r == nullptr) continue;
      if (r->state == ReservationState::kSettled ||
          r->state == ReservationState::kSettledWithDebt) {
        spent_by_receipts += r->actual_units;
      }
      if (holdsUnits(r->state)) RC_ASSERT(r->refunded_units == 0u);
    }
    // ... plus what shard reports recorded (from retired units, or as debt).
    for (const ShardLedgerView& view : report.shards) {
      spent_by_receipts += view.spent_units + view.debt_units;
      if (view.debt_units > 0) note("shard-debt");
    }
    RC_ASSERT(spent_by_accounts == spent_by_receipts);
    // Only what the agent proves unused is ever reminted: never units of a receipt that is
    // still RESERVED, STARTED or USAGE_UNKNOWN.
    for (const ModelShard& shard : shards_) {
      const ShardRecord* record = ledger_.shards().find(shard.grant.shard_id);
      if (record == nullptr) continue;  // compacted after retention
      const ShardBalances& local = shard.account.balances();
      RC_ASSERT(record->reminted_units <= local.local_available + local.local_retired);
    }
  }

 private:
  testing::FakeShardCrypto crypto_;  // outlives ledger_
  Ledger ledger_;
  uint64_t now_ = kStartMs;
  std::vector<ModelShard> shards_;
  uint64_t boot_epoch_ = 1;
  uint64_t issue_requests_ = 0;
  std::map<std::string, ShardRecord> stored_shards_;
  uint64_t stored_shard_sequence_ = 0;
  std::map<std::string, Reservation> stored_reservations_;
  std::map<AccountKey, Account> stored_accounts_;
  std::map<std::string, Track> tracks_;
};

rc::Gen<Step> genStep() {
  // Weighted so that reservations usually get far enough to be started and settled.
  const rc::Gen<uint8_t> kind = rc::gen::weightedOneOf<uint8_t>({
      {8, rc::gen::just<uint8_t>(kReserve)},
      {8, rc::gen::just<uint8_t>(kStart)},
      {6, rc::gen::just<uint8_t>(kSettle)},
      {2, rc::gen::just<uint8_t>(kReport)},
      {2, rc::gen::just<uint8_t>(kRelease)},
      {2, rc::gen::just<uint8_t>(kMarkUnknown)},
      {5, rc::gen::just<uint8_t>(kAdvance)},
      {1, rc::gen::just<uint8_t>(kBeginExpiry)},
      {1, rc::gen::just<uint8_t>(kCompleteExpiry)},
      {2, rc::gen::just<uint8_t>(kIssueShard)},
      {5, rc::gen::just<uint8_t>(kShardOp)},
      {2, rc::gen::just<uint8_t>(kReportShard)},
      {1, rc::gen::just<uint8_t>(kRestartAgent)},
      {1, rc::gen::just<uint8_t>(kRevokeShard)},
      {1, rc::gen::just<uint8_t>(kWriteOffShard)},
      {1, rc::gen::just<uint8_t>(kPublish)},
      {1, rc::gen::just<uint8_t>(kRollback)},
  });
  return rc::gen::build<Step>(rc::gen::set(&Step::kind, kind),
                              rc::gen::set(&Step::a, rc::gen::arbitrary<uint32_t>()),
                              rc::gen::set(&Step::b, rc::gen::arbitrary<uint32_t>()),
                              rc::gen::set(&Step::c, rc::gen::arbitrary<uint32_t>()));
}

rc::Gen<std::vector<Step>> genSteps() {
  return rc::gen::mapcat(rc::gen::inRange<size_t>(1, 250), [](size_t count) {
    return rc::gen::container<std::vector<Step>>(count, genStep());
  });
}

void runSequence(const std::vector<Step>& steps, LedgerFaults faults) {
  Harness harness(faults);
  for (const Step& step : steps) harness.apply(step);
}

RC_GTEST_PROP(LedgerProperty, InvariantsHoldAfterEveryStep, ()) {
  runSequence(*genSteps(), LedgerFaults{});
}

// The suite above must be able to fail: with a deliberately broken ledger it must find a
// counterexample. If these pass, the properties are not checking what they claim.
bool propertyFindsFault(LedgerFaults faults) {
  return !rc::check("broken ledger", [faults] { runSequence(*genSteps(), faults); });
}

TEST(LedgerPropertyCanFail, RefundOnUnknownIsCaught) {
  EXPECT_TRUE(propertyFindsFault(LedgerFaults{.refund_usage_unknown = true}));
}

TEST(LedgerPropertyCanFail, DoubleRefundOnDuplicateReleaseIsCaught) {
  EXPECT_TRUE(propertyFindsFault(LedgerFaults{.double_refund_release = true}));
}

TEST(LedgerPropertyCanFail, RemintOfHoldingShardReceiptsIsCaught) {
  EXPECT_TRUE(propertyFindsFault(LedgerFaults{.remint_holding_receipts = true}));
}

}  // namespace
}  // namespace tally

namespace tally {
namespace {

// The generator must keep reaching every path the invariants are about; otherwise the
// property passes vacuously. Runs after InvariantsHoldAfterEveryStep in the same binary, but
// does not rely on it: it runs its own sequences.
TEST(LedgerPropertyCoverage, EveryInterestingPathIsReached) {
  reached().clear();
  // Fixed seeds and sizes, independent of RC_PARAMS, so the check is deterministic.
  for (uint64_t seed = 1; seed <= 2'000; ++seed) {
    const std::vector<Step> steps =
        genSteps()(rc::Random(seed), static_cast<int>(seed % 101)).value();
    runSequence(steps, LedgerFaults{});
  }
  const char* const required[] = {
      "started",
      "expired-by-start",
      "expired-by-tick",
      "closed-by-hard-limit",
      "begin-expiry",
      "shard-issued",
      "reminted",
      "shard-duplicate-report",
      "shard-deferred-remint",
      "shard-revoked",
      "shard-written-off",
      "shard-debt",
      "shard:RECONCILING",
      "shard:RECONCILED",
      "shard:CONFLICT",
      "issue:OK:duplicate",
      "issue:IDEMPOTENCY_CONFLICT",
      "rolled-back",
      "transferred-between-accounts",
      "late-receipt",
      "state:SETTLED",
      "state:SETTLED_WITH_DEBT",
      "state:USAGE_UNKNOWN",
      "state:RELEASED",
      "rejected:capacity",
      "rejected:debt",
      "rejected:generation-draining",
      "rejected:max-single-reservation",
      "rejected:no-budget",
      "reply:IDEMPOTENCY_CONFLICT",
      "reply:OPERATION_CONFLICT",
      "reply:OK:duplicate",
      "reply:REJECTED:duplicate",
  };
  for (const char* event : required) {
    EXPECT_GT(reached()[event], 0u) << "the generator never reached " << event;
  }
}

}  // namespace
}  // namespace tally
