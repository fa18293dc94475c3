#include "tests/sim/checks.h"

#include <algorithm>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <variant>

#include "core/assert.h"
#include "core/checked_math.h"
#include "core/receipt_archive.h"
#include "ledger/restore.h"
#include "tests/sim/describe.h"

namespace tally::sim {
namespace {

using S = ReservationState;
using u128 = unsigned __int128;

// reach[from][to]: `to` is `from` or follows it through canTransition.
struct Reach {
  bool table[kReservationStateCount][kReservationStateCount] = {};

  Reach() {
    for (int from = 0; from < kReservationStateCount; ++from) {
      table[from][from] = true;
      for (bool grew = true; grew;) {
        grew = false;
        for (int mid = 0; mid < kReservationStateCount; ++mid) {
          if (!table[from][mid]) continue;
          for (int to = 0; to < kReservationStateCount; ++to) {
            if (!table[from][to] && canTransition(static_cast<S>(mid), static_cast<S>(to))) {
              table[from][to] = true;
              grew = true;
            }
          }
        }
      }
    }
  }
};

const Reach& reach() {
  static const Reach table;
  return table;
}

// The gateway job a reservation id belongs to: a gateway names a job's reservation
// "g<gateway>-j<job>"; a retry under a new id (a bug the can-fail test injects) appends "-r<n>".
std::string_view jobOf(std::string_view reservation_id) {
  return reservation_id.substr(0, reservation_id.find("-r"));
}

// Why `r` shows UNKNOWN treated as unconsumed on its own: it refunded while USAGE_UNKNOWN or
// closed by the hard limit.
std::optional<std::string> unknownRefundOf(const Reservation& r) {
  if ((r.state != S::kUsageUnknown && !r.closed_by_hard_limit) || r.refunded_units == 0) {
    return std::nullopt;
  }
  return r.reservation_id + " refunded " + std::to_string(r.refunded_units) + " while " +
         reservationStateName(r.state);
}

AccountKey keyOf(const Reservation& r) {
  return AccountKey{.subject = r.subject, .route = r.route, .generation = r.policy_generation};
}

}  // namespace

const char* checkName(Check check) {
  switch (check) {
    case Check::kConservation: return "conservation";
    case Check::kOverspend: return "overspend";
    case Check::kSecondReservation: return "second reservation";
    case Check::kDuplicateShardConsumption: return "duplicate shard consumption";
    case Check::kUnrecordedDebt: return "unrecorded debt";
    case Check::kDuplicateRefund: return "duplicate refund";
    case Check::kUnknownTreatedAsUnconsumed: return "unknown treated as unconsumed";
    case Check::kLostAcknowledged: return "lost acknowledged";
    case Check::kUnknownUnresolved: return "unknown unresolved";
    case Check::kShardUnreconciled: return "shard unreconciled";
    case Check::kOutboxUndrained: return "outbox undrained";
    case Check::kFairnessOverBudget: return "fairness over budget";
    case Check::kFairScheduling: return "fair scheduling";
    case Check::kCount: break;
  }
  return "?";
}

bool reachable(ReservationState from, ReservationState to) {
  return reach().table[static_cast<int>(from)][static_cast<int>(to)];
}

Units consumedBy(const Reservation& r) {
  if (r.state != S::kSettled && r.state != S::kSettledWithDebt) return 0;
  // A hard-limit close spends every reserved unit; a later, larger receipt charges the rest.
  if (r.closed_by_hard_limit) return std::max(r.reserved_units, r.actual_units);
  return r.actual_units;
}

void Checker::fail(Check check, const std::string& detail, uint64_t now_ms) {
  findings_.push_back(Finding{.check = check, .detail = detail, .now_ms = now_ms});
  if (trace_->on())
    trace_->add(now_ms, std::string("CHECK FAILED: ") + checkName(check) + ": " + detail);
}

std::array<bool, kCheckCount> Checker::failedChecks() const {
  std::array<bool, kCheckCount> failed{};
  for (const Finding& finding : findings_) failed[static_cast<size_t>(finding.check)] = true;
  return failed;
}

void Checker::onCommitted(const CommittedReply& committed, uint64_t now_ms) {
  if (const auto* shard_reply = std::get_if<ShardReply>(&committed.response.body)) {
    for (const ShardLedgerView& view : shard_reply->shards) {
      if (view.state == ShardState::kConflict) {
        conflicted_reminted_.try_emplace(view.grant.shard_id, view.reminted_units);
      }
    }
    return;
  }
  const auto* reply = std::get_if<ReservationReply>(&committed.response.body);
  if (reply == nullptr) return;
  const std::string& id = reply->receipt.reservation_id;
  if (committed.admitted_in_debt) {
    fail(Check::kOverspend, "admitted " + id + " while its subject/route owed debt", now_ms);
  }
  if (std::holds_alternative<ReserveRequest>(committed.request) && reply->code == ReplyCode::kOk &&
      !reply->duplicate && ++admissions_[id] > 1) {
    fail(Check::kSecondReservation, id + " admitted a second time", now_ms);
  }
  if (std::holds_alternative<MarkUnknownRequest>(committed.request) &&
      reply->code == ReplyCode::kOk) {
    unknown_since_ms_.try_emplace(id, now_ms);
  }
  if (reply->refunded_units > 0) {
    if (reply->duplicate) {
      fail(Check::kDuplicateRefund,
           "a duplicate refunded " + std::to_string(reply->refunded_units) + " on " + id, now_ms);
    } else if (++refunds_[id] > 1) {
      fail(Check::kDuplicateRefund, id + " refunded a second time", now_ms);
    }
    if (std::holds_alternative<MarkUnknownRequest>(committed.request)) {
      fail(Check::kUnknownTreatedAsUnconsumed,
           "markUnknown refunded " + std::to_string(reply->refunded_units) + " on " + id, now_ms);
    }
  }
}

void Checker::onAcknowledged(const std::string& reservation_id, const ReservationReply& reply,
                             bool actual_known, uint64_t now_ms) {
  const Reservation& receipt = reply.receipt;
  if (trace_->on()) trace_->add(now_ms, "acknowledged: " + describe(receipt));
  if (auto gone = compacted_created_at_ms_.find(reservation_id);
      gone != compacted_created_at_ms_.end() && receipt.created_at_ms <= gone->second) {
    return;  // a late reply about an incarnation compacted since: history
  }
  auto [it, inserted] = facts_.try_emplace(reservation_id);
  Fact& fact = it->second;
  if (!inserted) {
    if (!reachable(fact.state, receipt.state)) {
      fail(Check::kLostAcknowledged,
           reservation_id + " was acknowledged " + reservationStateName(fact.state) +
               ", a later reply says " + reservationStateName(receipt.state),
           now_ms);
      return;
    }
    if (fact.actual_known && receipt.actual_units != fact.actual_units) {
      fail(Check::kLostAcknowledged,
           reservation_id + " settled with actual " + std::to_string(fact.actual_units) + ", now " +
               std::to_string(receipt.actual_units),
           now_ms);
      return;
    }
  }
  fresh_facts_.push_back(reservation_id);
  fact.archived_ok = 0;  // to be compared with its receipt again
  fact.archived_packed.clear();
  fact.state = receipt.state;
  fact.reserved_units = receipt.reserved_units;
  fact.created_at_ms = receipt.created_at_ms;
  if (actual_known) {
    fact.actual_known = true;
    fact.actual_units = receipt.actual_units;
  }
}

void Checker::onQueried(const std::string& reservation_id, const ReservationReply& reply,
                        ReservationState known, uint64_t now_ms) {
  // Once compacted, an id may hold a new incarnation: the gateway's knowledge is history.
  if (compacted_ids_.contains(reservation_id)) return;
  if (reply.code == ReplyCode::kNotFound) {
    if (known != S::kRequested) {
      fail(Check::kLostAcknowledged,
           "a query does not find " + reservation_id + ", acknowledged " +
               reservationStateName(known),
           now_ms);
    }
    return;
  }
  if (reply.code == ReplyCode::kOk && !reachable(known, reply.receipt.state)) {
    fail(Check::kLostAcknowledged,
         reply.receipt.reservation_id + " was acknowledged " + reservationStateName(known) +
             ", a query says " + reservationStateName(reply.receipt.state),
         now_ms);
  }
}

void Checker::Horizon::saw(uint64_t now_ms) {
  known = true;
  seen_at_ms = now_ms;
  closed_ms_min = ~uint64_t{0};
  expires_ms_min = ~uint64_t{0};
}

bool Checker::Horizon::nothingCompactable(uint64_t now_ms, uint64_t retention_ms) const {
  // A reservation terminal when the ledger was last seen closed at closed_ms_min or later; one
  // that closed since, at seen_at_ms or later (closedAt is the ledger's clock when it closed).
  // A shard's expiry is fixed when it is issued, in the future of the moment it is issued.
  // Both can be compacted only `retention_ms` after those moments (Ledger::tick).
  return known && saturatingAdd(std::min(closed_ms_min, seen_at_ms), retention_ms) > now_ms &&
         saturatingAdd(std::min(expires_ms_min, seen_at_ms), retention_ms) > now_ms;
}

void Checker::beforeTick(const Ledger& ledger, uint64_t now_ms, uint64_t retention_ms) {
  before_tick_.clear();
  // Shards too: one reconciled and compacted within a batch was never durable reconciled.
  before_tick_shards_.clear();
  // A tick that can compact nothing needs no final images (only compacted ones are looked up).
  if (horizon_.nothingCompactable(now_ms, retention_ms)) return;
  horizon_.saw(now_ms);
  for (const ShardLedgerView& view : ledger.listShards("", std::nullopt).shards) {
    horizon_.expires_ms_min = std::min(horizon_.expires_ms_min, view.grant.expires_at_ms);
    if (view.state == ShardState::kReconciled || view.state == ShardState::kWrittenOff ||
        view.state == ShardState::kConflict) {
      before_tick_shards_[view.grant.shard_id] =
          Image{.key = {view.grant.subject, view.grant.route, view.grant.policy_generation},
                .sums = {.consumed = view.spent_units + view.debt_units, .debt = view.debt_units}};
    }
  }
  auto visit = [&](const Reservation& r) {
    if (isTerminal(r.state)) {
      horizon_.closed_ms_min = std::min(horizon_.closed_ms_min, r.closed_at_ms);
    }
    // Only those the tick may compact: terminal since at least the retention window (the
    // ledger's deadline counts from when it became terminal, never before closed_at_ms).
    if (isTerminal(r.state) && saturatingAdd(r.closed_at_ms, retention_ms) <= now_ms) {
      before_tick_[r.reservation_id] =
          Image{.key = keyOf(r),
                .sums = {.consumed = consumedBy(r), .debt = r.debt_units},
                .created_at_ms = r.created_at_ms};
    }
  };
  ledger.forEachLiveReservation(visit);
  // Every receipt is terminal: the archive needs a visit only if its earliest close is due.
  refreshArchive(ledger);
  horizon_.closed_ms_min = std::min(horizon_.closed_ms_min, archive_.closed_ms_min);
  if (saturatingAdd(archive_.closed_ms_min, retention_ms) <= now_ms) ledger.forEachReceipt(visit);
}

void Checker::onCompacted(const std::vector<Reservation>& deleted) {
  for (const Reservation& r : deleted) {
    auto image = before_tick_.find(r.reservation_id);
    const Image last = image != before_tick_.end()
                           ? image->second
                           : Image{.key = keyOf(r),
                                   .sums = {.consumed = consumedBy(r), .debt = r.debt_units},
                                   .created_at_ms = r.created_at_ms};
    Sums& sums = compacted_[last.key];
    sums.consumed += last.sums.consumed;
    sums.debt += last.sums.debt;
    compacted_ids_.insert(r.reservation_id);
    uint64_t& created = compacted_created_at_ms_[r.reservation_id];
    created = std::max(created, last.created_at_ms);
    // Past the idempotency window the id is free again: what was said about it is history.
    facts_.erase(r.reservation_id);
    admissions_.erase(r.reservation_id);
    refunds_.erase(r.reservation_id);
  }
}

void Checker::refreshArchive(const Ledger& ledger) {
  if (archive_.serial != 0 && archive_.ledger == &ledger &&
      archive_.version == ledger.receiptsVersion() && archive_.receipts == ledger.receiptCount()) {
    return;
  }
  // packed_ holds the receipts of archive_.ledger (none after onLedgerRestarted).
  if (archive_.ledger != &ledger) packed_.clear();
  archive_ = ArchiveCache{.ledger = &ledger,
                          .version = ledger.receiptsVersion(),
                          .serial = ++archive_serial_,
                          .receipts = ledger.receiptCount()};
  // Each receipt's contribution is a function of its bytes and of this Ledger's account
  // entries (which never move): a receipt seen before is not decoded again.
  Reservation scratch;
  ledger.forEachPackedReceipt([&](std::string_view bytes) {
    auto it = packed_.find(bytes);
    if (it == packed_.end()) {
      const bool decoded = ReceiptArchive::decode(bytes, &scratch);
      TALLY_ASSERT(decoded);
      const Reservation& r = scratch;
      PackedReceipt receipt{
          .entry = ledger.accounts().find(r.subject, r.route, r.policy_generation),
          .sums = {.consumed = consumedBy(r), .debt = r.debt_units},
          .closed_at_ms = r.closed_at_ms,
          .debits = r.state != S::kRejected,
          .id = r.reservation_id};
      receipt.job_length = jobOf(receipt.id).size();
      receipt.unknown_refund = unknownRefundOf(r);
      it = packed_.emplace(std::string(bytes), std::move(receipt)).first;
    }
    PackedReceipt& receipt = it->second;
    receipt.serial = archive_.serial;
    archive_.closed_ms_min = std::min(archive_.closed_ms_min, receipt.closed_at_ms);
    if (receipt.debits) {
      const std::string_view id = receipt.id;
      auto [job, inserted] = archive_.jobs.try_emplace(id.substr(0, receipt.job_length), id);
      if (!inserted && job->second != id) {
        archive_.failures.emplace_back(
            Check::kSecondReservation,
            "one job holds two reservations: " + std::string(job->second) + " and " + receipt.id);
      }
    }
    Sums& account = archive_.sums[receipt.entry];
    account.consumed += receipt.sums.consumed;
    account.debt += receipt.sums.debt;
    if (receipt.unknown_refund.has_value()) {
      archive_.failures.emplace_back(Check::kUnknownTreatedAsUnconsumed, *receipt.unknown_refund);
    }
  });
  // Receipts gone from the archive (compacted, or taken back live): forgotten once they are
  // as many as the ones kept, so that the cache stays O(receipts).
  if (packed_.size() > 2 * archive_.receipts + 64) {
    std::erase_if(packed_, [&](const auto& item) { return item.second.serial != archive_.serial; });
  }
}

void Checker::afterStep(const Ledger& ledger, uint64_t now_ms) {
  const AuditReport audit = ledger.audit(now_ms);
  if (!audit.conserved) {
    fail(Check::kConservation,
         audit.violations.empty() ? "audit not conserved" : audit.violations.front(), now_ms);
  }

  // The live table is scanned at every call; what the receipts of the archive contribute (their
  // sums, jobs, earliest close and failures) is kept in archive_ while the archive is unchanged.
  // Sums by account entry (entries never move), jobs by views into the ledger's own strings
  // (the live table's records stay put during the scan): this runs after every step. Jobs by
  // jobOf.
  refreshArchive(ledger);
  std::unordered_map<const AccountEntry*, Sums> sums;
  std::unordered_map<std::string_view, std::string_view> debited_by_job;
  // Each acknowledged fact is checked against its reservation as the scan meets it; the
  // failures are reported after the sums, by id, as a lookup of each fact would report them.
  std::map<std::string, std::string> fact_failures;
  size_t facts_met = 0;
  size_t unknown_met = 0;                    // unknown_since_ms_ entries the scan met USAGE_UNKNOWN
  const AccountEntry* last_entry = nullptr;  // the account of the last reservation scanned
  Sums* last_sums = nullptr;                 // its sums (stable: an unordered_map's nodes stay)
  ++facts_pass_;
  horizon_.saw(now_ms);
  horizon_.closed_ms_min = archive_.closed_ms_min;
  ledger.forEachLiveReservation([&](const Reservation& r) {
    if (isTerminal(r.state)) {
      horizon_.closed_ms_min = std::min(horizon_.closed_ms_min, r.closed_at_ms);
    }
    if (r.state != S::kRejected) {
      const std::string_view id = r.reservation_id;
      const std::string_view job_id = jobOf(id);
      auto [job, inserted] = debited_by_job.try_emplace(job_id, id);
      if (!inserted && job->second != id) {
        fail(Check::kSecondReservation,
             "one job holds two reservations: " + std::string(job->second) + " and " +
                 r.reservation_id,
             now_ms);
      }
      if (inserted && !archive_.jobs.empty()) {
        if (auto receipt = archive_.jobs.find(job_id);
            receipt != archive_.jobs.end() && receipt->second != id) {
          fail(Check::kSecondReservation,
               "one job holds two reservations: " + r.reservation_id + " and " +
                   std::string(receipt->second),
               now_ms);
        }
      }
    }
    if (!facts_.empty()) {
      if (auto it = facts_.find(r.reservation_id); it != facts_.end()) {
        ++facts_met;
        it->second.pass = facts_pass_;
        if (std::optional<std::string> failure = factFailure(r, it->second)) {
          fact_failures.emplace(r.reservation_id, std::move(*failure));
        }
      }
    }
    // Neighbouring reservations mostly share an account: look it up only when it changes.
    if (last_entry == nullptr || last_entry->key.generation != r.policy_generation ||
        last_entry->key.subject != r.subject || last_entry->key.route != r.route) {
      last_entry = ledger.accounts().find(r.subject, r.route, r.policy_generation);
      last_sums = &sums[last_entry];
    }
    Sums& account = *last_sums;
    account.consumed += consumedBy(r);
    account.debt += r.debt_units;
    if (std::optional<std::string> refund = unknownRefundOf(r)) {
      fail(Check::kUnknownTreatedAsUnconsumed, *refund, now_ms);
    }
    if (r.state == S::kUsageUnknown) {
      unknown_since_ms_.try_emplace(r.reservation_id, now_ms);
      ++unknown_met;
    } else if (!unknown_since_ms_.empty() && isTerminal(r.state)) {
      if (auto it = unknown_since_ms_.find(r.reservation_id); it != unknown_since_ms_.end()) {
        convergence_ms_.push_back(std::max(r.closed_at_ms, it->second) - it->second);
        unknown_since_ms_.erase(it);
      }
    }
  });
  for (const auto& [check, detail] : archive_.failures) fail(check, detail, now_ms);
  // Sightings of USAGE_UNKNOWN whose reservation the live scan did not meet so: a receipt
  // (every receipt is terminal) closes them.
  if (unknown_since_ms_.size() > unknown_met) {
    for (auto it = unknown_since_ms_.begin(); it != unknown_since_ms_.end();) {
      const Reservation* r = ledger.findReservation(it->first);
      if (r != nullptr && isTerminal(r->state)) {
        convergence_ms_.push_back(std::max(r->closed_at_ms, it->second) - it->second);
        it = unknown_since_ms_.erase(it);
      } else {
        ++it;
      }
    }
  }
  // What shard reports charged: spent taken from the shard, and overspend as debt, both on the
  // shard's source account (its grant's subject, route and generation).
  for (const ShardLedgerView& view : audit.shards) {
    horizon_.expires_ms_min = std::min(horizon_.expires_ms_min, view.grant.expires_at_ms);
    if (!view.conserved) {
      fail(Check::kConservation, "shard " + view.grant.shard_id + " does not conserve", now_ms);
    }
    // After a conflict nothing more is reminted, and the last report is the conflicting one
    // (e.g. a stale report, replayed or reordered, after the latest): it proves nothing.
    // conflicted_reminted_ knows the conflict even once a write-off ended it within one round.
    auto conflicted = conflicted_reminted_.find(view.grant.shard_id);
    if (conflicted != conflicted_reminted_.end() || view.state == ShardState::kConflict) {
      if (conflicted != conflicted_reminted_.end() && view.reminted_units > conflicted->second) {
        fail(Check::kConservation,
             "shard " + view.grant.shard_id + " reminted " + std::to_string(view.reminted_units) +
                 " after its conflict (" + std::to_string(conflicted->second) + " before)",
             now_ms);
      }
    } else if (view.reported &&
               u128{view.reminted_units} + view.spent_units + view.last_reported.local_reserved >
                   view.grant.allocated_units) {
      // Only units proven unused are reminted: what the agent's holding receipts (RESERVED,
      // STARTED, USAGE_UNKNOWN) still hold stays retired until a terminal receipt says.
      fail(Check::kConservation,
           "shard " + view.grant.shard_id + " reminted " + std::to_string(view.reminted_units) +
               " of " + std::to_string(view.grant.allocated_units) + " while its receipts hold " +
               std::to_string(view.last_reported.local_reserved) + " and spent " +
               std::to_string(view.spent_units),
           now_ms);
    }
    Sums& account = sums[ledger.accounts().find(view.grant.subject, view.grant.route,
                                                view.grant.policy_generation)];
    account.consumed += view.spent_units + view.debt_units;  // overspend is spent too
    account.debt += view.debt_units;
  }
  // The audit lists every account sorted by key, and accounts are never removed: the entry at
  // the same position as at the last call is looked up again only when its key differs.
  if (entries_.ledger != &ledger) entries_ = {.ledger = &ledger, .by_position = {}};
  entries_.by_position.resize(audit.accounts.size(), nullptr);
  for (size_t position = 0; position < audit.accounts.size(); ++position) {
    const AccountView& view = audit.accounts[position];
    Sums expected;
    const AccountEntry*& entry = entries_.by_position[position];
    if (entry == nullptr || !(entry->key == view.key)) entry = ledger.accounts().find(view.key);
    if (auto it = sums.find(entry); it != sums.end()) expected = it->second;
    if (auto it = archive_.sums.find(entry); it != archive_.sums.end()) {
      expected.consumed += it->second.consumed;
      expected.debt += it->second.debt;
    }
    if (!compacted_.empty()) {
      if (auto it = compacted_.find(view.key); it != compacted_.end()) {
        expected.consumed += it->second.consumed;
        expected.debt += it->second.debt;
      }
    }
    if (view.balances.spent != expected.consumed ||
        view.balances.overdraft_issued != expected.debt) {
      fail(Check::kUnrecordedDebt,
           view.key.subject + "/" + view.key.route + "#" + std::to_string(view.key.generation) +
               ": spent " + std::to_string(view.balances.spent) + " vs receipts " +
               std::to_string(expected.consumed) + ", overdraft issued " +
               std::to_string(view.balances.overdraft_issued) + " vs receipts' debt " +
               std::to_string(expected.debt),
           now_ms);
    }
  }

  // Facts whose reservation the live scan did not meet: their receipt in the archive (compared
  // once per fact and archive: a receipt never changes while archived), or gone.
  if (facts_met < facts_.size()) {
    for (auto& [id, fact] : facts_) {
      if (fact.pass == facts_pass_ || fact.archived_ok == archive_.serial) continue;
      // The same bytes it agreed with before: it agrees (a receipt is a function of its bytes).
      const std::optional<std::string_view> packed = ledger.findPackedReceipt(id);
      if (packed.has_value() && !fact.archived_packed.empty() && *packed == fact.archived_packed) {
        fact.archived_ok = archive_.serial;
        continue;
      }
      // Not met by the live scan: archived (decoded from the bytes just found), or gone.
      Reservation archived;
      const Reservation* r = nullptr;
      if (packed.has_value()) {
        const bool decoded = ReceiptArchive::decode(*packed, &archived);
        TALLY_ASSERT(decoded);
        r = &archived;
      }
      if (r == nullptr) {
        if (!compacted_ids_.contains(id)) {
          fact_failures.emplace(
              id, id + " was acknowledged " + reservationStateName(fact.state) + " and is gone");
        }
      } else if (std::optional<std::string> failure = factFailure(*r, fact)) {
        fact_failures.emplace(id, std::move(*failure));
      } else {
        fact.archived_ok = archive_.serial;
        fact.archived_packed.assign(*packed);
      }
    }
  }
  for (const auto& [id, failure] : fact_failures) fail(Check::kLostAcknowledged, failure, now_ms);
  fresh_facts_.clear();
}

std::optional<std::string> Checker::factFailure(const Reservation& r, const Fact& fact) {
  if (!reachable(fact.state, r.state) || r.reserved_units != fact.reserved_units ||
      (fact.actual_known && r.actual_units != fact.actual_units)) {
    return r.reservation_id + " was acknowledged " + reservationStateName(fact.state) +
           ", ledger holds " + describe(r);
  }
  return std::nullopt;
}

void Checker::afterAcknowledgements(const Ledger& ledger, uint64_t now_ms) {
  for (const std::string& id : fresh_facts_) {
    if (auto it = facts_.find(id); it != facts_.end()) checkFact(ledger, id, it->second, now_ms);
  }
  fresh_facts_.clear();
}

void Checker::checkFact(const Ledger& ledger, const std::string& id, const Fact& fact,
                        uint64_t now_ms) {
  const Reservation* r = ledger.findReservation(id);
  if (r == nullptr) {
    if (!compacted_ids_.contains(id)) {
      fail(Check::kLostAcknowledged,
           id + " was acknowledged " + reservationStateName(fact.state) + " and is gone", now_ms);
    }
    return;
  }
  if (std::optional<std::string> failure = factFailure(*r, fact)) {
    fail(Check::kLostAcknowledged, *failure, now_ms);
  }
}

void Checker::checkDurable(const Ledger& live, SimStore* store, const LedgerOptions& options,
                           uint64_t now_ms) {
  Ledger rebuilt(options);
  Result<ledger::StoreContents> contents = store->load();
  if (!contents.isOk()) {
    fail(Check::kLostAcknowledged, "durable rows unreadable: " + contents.status().toString(),
         now_ms);
    return;
  }
  Result<ledger::RestoreSummary> restored =
      ledger::restoreLedger(std::move(contents).value(), &rebuilt, now_ms);
  if (!restored.isOk()) {
    fail(Check::kLostAcknowledged, "durable rows refused: " + restored.status().toString(), now_ms);
    return;
  }
  std::vector<Reservation> a;
  std::vector<Reservation> b;
  live.forEachReservation([&](const Reservation& r) { a.push_back(r); });
  rebuilt.forEachReservation([&](const Reservation& r) { b.push_back(r); });
  auto by_id = [](const Reservation& x, const Reservation& y) {
    return x.reservation_id < y.reservation_id;
  };
  std::sort(a.begin(), a.end(), by_id);
  std::sort(b.begin(), b.end(), by_id);
  if (a != b) {
    std::string detail = "live and durable reservations differ";
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      if (!(a[i] == b[i])) {
        detail += ": live " + describe(a[i]) + ", durable " + describe(b[i]);
        break;
      }
    }
    if (a.size() != b.size()) {
      detail +=
          " (" + std::to_string(a.size()) + " live, " + std::to_string(b.size()) + " durable)";
    }
    fail(Check::kLostAcknowledged, detail, now_ms);
    return;
  }
  const AuditReport live_audit = live.audit(now_ms);
  const AuditReport durable_audit = rebuilt.audit(now_ms);
  if (live_audit.accounts != durable_audit.accounts) {
    fail(Check::kLostAcknowledged, "live and durable accounts differ", now_ms);
    return;
  }
  if (live.accounts().generations() != rebuilt.accounts().generations() ||
      live.accounts().activeGeneration() != rebuilt.accounts().activeGeneration()) {
    fail(Check::kLostAcknowledged, "live and durable policy generations differ", now_ms);
    return;
  }
  checkPeriods(live, rebuilt, now_ms);
}

// Closed accounting periods (SPEC §4): each conserves, and the durable record holds exactly the
// snapshots the live ledger closed.
void Checker::checkPeriods(const Ledger& live, const Ledger& rebuilt, uint64_t now_ms) {
  const PeriodAudit live_spans = live.auditPeriods({.list = true}, now_ms);
  const PeriodAudit durable_spans = rebuilt.auditPeriods({.list = true}, now_ms);
  if (live_spans.report.closed_periods != durable_spans.report.closed_periods) {
    fail(Check::kLostAcknowledged, "live and durable closed periods differ", now_ms);
    return;
  }
  for (const PeriodSpan& span : live_spans.report.closed_periods) {
    ++periods_checked_;
    if (!span.conserved) {
      fail(Check::kConservation,
           "closed period from epoch " + std::to_string(span.epoch_first) + " does not conserve",
           now_ms);
    }
    const PeriodAudit a = live.auditPeriods({.epoch = span.epoch_first}, now_ms);
    const PeriodAudit b = rebuilt.auditPeriods({.epoch = span.epoch_first}, now_ms);
    if (a.report.period_snapshots != b.report.period_snapshots) {
      fail(Check::kLostAcknowledged,
           "live and durable snapshots of epoch " + std::to_string(span.epoch_first) + " differ",
           now_ms);
    }
  }
}

void Checker::atEnd(const Ledger& ledger, uint64_t now_ms) {
  ledger.forEachReservation([&](const Reservation& r) {
    if (r.state == S::kUsageUnknown) {
      fail(Check::kUnknownUnresolved, r.reservation_id + " still USAGE_UNKNOWN", now_ms);
    }
  });
  for (const ShardLedgerView& view : ledger.audit(now_ms).shards) {
    if (view.state == ShardState::kReconciled || view.state == ShardState::kWrittenOff) continue;
    // Detected, and every unit the agent reported using is charged: from the shard, and beyond
    // it as debt on its account.
    if (view.state == ShardState::kConflict &&
        u128{view.spent_units} + view.debt_units >=
            u128{view.last_reported.local_spent} + view.last_reported.overspent) {
      continue;
    }
    fail(Check::kShardUnreconciled,
         "shard " + view.grant.shard_id + " of " + view.grant.gateway_name + " ends " +
             shardStateName(view.state) + " (spent " + std::to_string(view.spent_units) +
             ", debt " + std::to_string(view.debt_units) + "; reported spent " +
             std::to_string(view.last_reported.local_spent) + ", overspent " +
             std::to_string(view.last_reported.overspent) + ")",
         now_ms);
  }
}

void Checker::afterAgentStep(const std::string& gateway_name, uint64_t boot_epoch,
                             const ShardBook& book, uint64_t now_ms) {
  // Both checks below are functions of the book and the boot epoch alone (and of what they
  // recorded the last time): an unchanged book passes as it did.
  BookSeen& seen_book = books_seen_[gateway_name];
  const BookSeen now_book{.boot_epoch = boot_epoch, .book = &book, .version = book.version()};
  if (seen_book.book == now_book.book && seen_book.boot_epoch == now_book.boot_epoch &&
      seen_book.version == now_book.version) {
    return;
  }
  seen_book = now_book;
  if (std::vector<std::string> violations = book.audit(); !violations.empty()) {
    fail(Check::kConservation, gateway_name + "'s shard book: " + violations.front(), now_ms);
  }
  book.forEachShard([&](const std::string& shard_id, const ShardBook::Shard& shard) {
    // A shard's reservations only grow until the shard is forgotten: look again only when
    // their number changed.
    size_t& seen = shard_reservations_counted_[gateway_name + "/" + shard_id];
    if (seen == shard.reservation_ids.size()) return;
    seen = shard.reservation_ids.size();
    for (const std::string& id : shard.reservation_ids) {
      if (!shard_reservations_seen_.insert(gateway_name + "/" + id).second) continue;
      const ShardGrant& grant = shard.record.grant;
      if (grant.gateway_name != gateway_name || grant.gateway_boot_epoch != boot_epoch) {
        fail(Check::kDuplicateShardConsumption,
             gateway_name + " (boot epoch " + std::to_string(boot_epoch) + ") admitted " + id +
                 " from shard " + shard_id + ", issued to " + grant.gateway_name + " boot epoch " +
                 std::to_string(grant.gateway_boot_epoch),
             now_ms);
      }
    }
  });
}

void Checker::atEndAgent(const std::string& gateway_name, const ShardBook& book,
                         size_t outbox_depth, size_t outbox_rows, uint64_t now_ms) {
  if (outbox_depth != 0 || outbox_rows != 0) {
    fail(Check::kOutboxUndrained,
         gateway_name + " ends with " + std::to_string(outbox_depth) + " outbox entries (" +
             std::to_string(outbox_rows) + " durable rows)",
         now_ms);
  }
  for (const std::string& id : book.shardsNeedingReport()) {
    // Reconciled and compacted at the ledger before the agent heard so: it answers "no shard"
    // for ever (the agent keeps retrying; see docs/SIMULATION.md).
    if (compacted_shards_.contains(id)) continue;
    fail(Check::kShardUnreconciled, gateway_name + " never had its report of " + id + " accepted",
         now_ms);
  }
}

void Checker::onCompactedShards(const std::vector<ShardRecord>& deleted) {
  for (const ShardRecord& record : deleted) {
    compacted_shards_.insert(record.grant.shard_id);
    conflicted_reminted_.erase(record.grant.shard_id);
    Image last{
        .key = {record.grant.subject, record.grant.route, record.grant.policy_generation},
        .sums = {.consumed = record.spent_units + record.debt_units, .debt = record.debt_units}};
    if (auto image = before_tick_shards_.find(record.grant.shard_id);
        image != before_tick_shards_.end()) {
      last = image->second;
    }
    Sums& sums = compacted_[last.key];
    sums.consumed += last.sums.consumed;
    sums.debt += last.sums.debt;
  }
}

}  // namespace tally::sim
