#include "core/shard_book.h"

#include <algorithm>
#include <utility>

#include "core/assert.h"
#include "core/checked_math.h"
#include "core/reservation_replies.h"

namespace tally {

using replies::validId;

const char* shardCloseReasonName(ShardCloseReason reason) {
  switch (reason) {
    case ShardCloseReason::kNone: return "none";
    case ShardCloseReason::kReconnect: return "reconnect";
    case ShardCloseReason::kBootEpoch: return "boot-epoch";
    case ShardCloseReason::kFence: return "fence";
    case ShardCloseReason::kExpiry: return "expiry";
    case ShardCloseReason::kRevoked: return "revoked";
    case ShardCloseReason::kQuarantined: return "quarantined";
  }
  return "unknown";
}

const char* shardAddCodeName(ShardAddCode code) {
  switch (code) {
    case ShardAddCode::kOk: return "ok";
    case ShardAddCode::kDuplicate: return "duplicate";
    case ShardAddCode::kInvalid: return "invalid";
    case ShardAddCode::kIdConflict: return "id-conflict";
    case ShardAddCode::kBadSignature: return "bad-signature";
    case ShardAddCode::kNotOurGateway: return "not-our-gateway";
    case ShardAddCode::kWrongBootEpoch: return "wrong-boot-epoch";
    case ShardAddCode::kFenceBelowSeen: return "fence-below-seen";
    case ShardAddCode::kExpired: return "expired";
    case ShardAddCode::kResourceExhausted: return "resource-exhausted";
  }
  return "unknown";
}

const char* shardUnreconcilableName(ShardUnreconcilable reason) {
  switch (reason) {
    case ShardUnreconcilable::kNo: return "no";
    case ShardUnreconcilable::kForgotten: return "forgotten";
    case ShardUnreconcilable::kWrittenOff: return "written-off";
  }
  return "unknown";
}

uint64_t refreshWindowMs(const ShardGrant& grant, uint64_t refresh_before_ms) {
  const uint64_t lifetime_ms =
      grant.expires_at_ms > grant.issued_at_ms ? grant.expires_at_ms - grant.issued_at_ms : 0;
  return std::min(refresh_before_ms, lifetime_ms / 2);
}

bool isFinalShardState(ShardState state) {
  return state == ShardState::kReconciled || state == ShardState::kConflict ||
         state == ShardState::kWrittenOff;
}

bool isFinalShard(const HeldShardRecord& record) {
  return record.unreconcilable != ShardUnreconcilable::kNo ||
         (record.ledger_known && isFinalShardState(record.ledger_state));
}

ShardBook::ShardBook(ShardBookOptions options) : options_(options) {
  TALLY_ASSERT(options_.crypto != nullptr);
  TALLY_ASSERT(options_.reservations_per_shard_max > 0);
}

// --- lookups -------------------------------------------------------------------------------------

ShardBook::Shard* ShardBook::lookupShard(const std::string& shard_id) {
  ++version_;  // the caller may change what it finds
  auto it = shards_.find(shard_id);
  return it == shards_.end() ? nullptr : &it->second;
}

const ShardBook::Shard* ShardBook::findShard(const std::string& shard_id) const {
  auto it = shards_.find(shard_id);
  return it == shards_.end() ? nullptr : &it->second;
}

Reservation* ShardBook::lookup(const std::string& reservation_id) {
  ++version_;  // the caller may change what it finds
  auto it = reservations_.find(reservation_id);
  return it == reservations_.end() ? nullptr : &it->second;
}

const Reservation* ShardBook::findReservation(const std::string& reservation_id) const {
  auto it = reservations_.find(reservation_id);
  return it == reservations_.end() ? nullptr : &it->second;
}

ShardBook::Shard& ShardBook::shardOf(const Reservation& reservation) {
  Shard* shard = lookupShard(reservation.origin);
  TALLY_ASSERT(shard != nullptr);  // a reservation never outlives its shard
  return *shard;
}

bool ShardBook::ownsReservation(const std::string& reservation_id) const {
  return reservations_.contains(reservation_id);
}

uint64_t ShardBook::highestFence(const SubjectRoute& subject_route) const {
  auto it = fences_.find(subject_route);
  return it == fences_.end() ? 0 : it->second;
}

void ShardBook::forEachShard(
    const std::function<void(const std::string&, const Shard&)>& fn) const {
  for (const auto& [id, shard] : shards_) fn(id, shard);
}

bool ShardBook::isUsable(const Shard& shard, uint64_t now_ms) const {
  const ShardGrant& grant = shard.record.grant;
  bool ours = grant.gateway_boot_epoch == options_.boot_epoch;
#ifdef TALLY_TEST_FAULTS
  if (faults_.reuse_after_restart) ours = true;  // deliberately wrong: any boot epoch's shard
#endif
  return !shard.account.closed() && !shard.record.quarantined && ours &&
         now_ms < grant.expires_at_ms && grant.fence >= highestFence({grant.subject, grant.route});
}

void ShardBook::indexOpen(const std::string& shard_id, const ShardGrant& grant) {
  ++version_;
  open_by_account_[{grant.subject, grant.route}].insert(shard_id);
}

void ShardBook::unindexOpen(const std::string& shard_id, const ShardGrant& grant) {
  ++version_;
  auto it = open_by_account_.find({grant.subject, grant.route});
  if (it == open_by_account_.end()) return;
  it->second.erase(shard_id);
  if (it->second.empty()) open_by_account_.erase(it);
}

std::vector<std::string> ShardBook::openShardsOf(const SubjectRoute& subject_route) const {
  auto it = open_by_account_.find(subject_route);
  if (it == open_by_account_.end()) return {};
  return std::vector<std::string>(it->second.begin(), it->second.end());
}

size_t ShardBook::usableShardCount(const SubjectRoute& subject_route, uint64_t now_ms) const {
  size_t count = 0;
  for (const std::string& id : openShardsOf(subject_route)) {
    if (isUsable(*findShard(id), now_ms)) ++count;
  }
  return count;
}

Units ShardBook::usableUnits(const SubjectRoute& subject_route, uint64_t now_ms) const {
  Units units = 0;
  for (const std::string& id : openShardsOf(subject_route)) {
    const Shard& shard = *findShard(id);
    if (isUsable(shard, now_ms)) {
      units = saturatingAdd(units, shard.account.balances().local_available);
    }
  }
  return units;
}

std::vector<std::string> ShardBook::shardsNeedingReport() const {
  std::vector<std::string> ids;
  for (const auto& [id, shard] : shards_) {
    if (shard.account.closed() && !shard.record.quarantined && shard.record.report_pending) {
      ids.push_back(id);
    }
  }
  return ids;
}

std::vector<std::string> ShardBook::openShards() const {
  std::vector<std::string> ids;
  for (const auto& [id, shard] : shards_) {
    if (!shard.account.closed()) ids.push_back(id);
  }
  return ids;
}

// --- invariants and changes ------------------------------------------------------------------

void ShardBook::checkShard(const Shard& shard) const {
  const ShardBalances& b = shard.account.balances();
  TALLY_ASSERT(isConserved(b));
  TALLY_ASSERT(b.allocated == shard.record.grant.allocated_units || shard.record.quarantined);
  TALLY_ASSERT(shard.held_units == b.local_reserved);
  TALLY_ASSERT(!shard.account.closed() || b.local_available == 0);
  TALLY_ASSERT(!shard.record.quarantined || shard.account.closed());
}

std::vector<std::string> ShardBook::audit() const {
  std::vector<std::string> violations;
  std::map<std::string, Units> held;
  for (const auto& [id, reservation] : reservations_) {
    if (!shards_.contains(reservation.origin)) {
      violations.push_back("reservation " + id + " names missing shard " + reservation.origin);
      continue;
    }
    if (holdsUnits(reservation.state)) {
      held[reservation.origin] =
          saturatingAdd(held[reservation.origin], reservation.reserved_units);
    }
  }
  for (const auto& [id, shard] : shards_) {
    const ShardBalances& b = shard.account.balances();
    if (!isConserved(b)) violations.push_back(id + ": local equation does not hold");
    if (held[id] != b.local_reserved) {
      violations.push_back(id + ": localReserved " + std::to_string(b.local_reserved) +
                           " but its reservations hold " + std::to_string(held[id]));
    }
    const std::vector<std::string> open =
        openShardsOf({shard.record.grant.subject, shard.record.grant.route});
    const bool indexed = std::find(open.begin(), open.end(), id) != open.end();
    if (indexed == shard.account.closed()) {
      violations.push_back(id + (indexed ? ": closed but indexed as open" : ": open, not indexed"));
    }
    if (shard.account.closed() && b.local_available != 0) {
      violations.push_back(id + ": closed with localAvailable " +
                           std::to_string(b.local_available));
    }
  }
  return violations;
}

void ShardBook::touchReservation(const std::string& id) {
  ++version_;
  reservations_changed_.insert(id);
  reservations_deleted_.erase(id);
}

ShardBookChanges ShardBook::takeChanges() {
  ShardBookChanges changes;
  changes.shards_upserted.assign(shards_changed_.begin(), shards_changed_.end());
  changes.shards_deleted.assign(shards_deleted_.begin(), shards_deleted_.end());
  changes.reservations_upserted.assign(reservations_changed_.begin(), reservations_changed_.end());
  changes.reservations_deleted.assign(reservations_deleted_.begin(), reservations_deleted_.end());
  changes.fences.assign(fences_changed_.begin(), fences_changed_.end());
  shards_changed_.clear();
  shards_deleted_.clear();
  reservations_changed_.clear();
  reservations_deleted_.clear();
  fences_changed_.clear();
  return changes;
}

// --- boot ----------------------------------------------------------------------------------------

void ShardBook::restoreFence(const SubjectRoute& subject_route, uint64_t fence) {
  ++version_;
  uint64_t& highest = fences_[subject_route];
  highest = std::max(highest, fence);
}

Status ShardBook::restoreShard(StoredShard stored) {
  if (!validId(stored.shard_id, kShardIdBytesMax))
    return Status::corruption("stored shard has an invalid id");
  if (shards_.contains(stored.shard_id)) {
    return Status::corruption("shard '" + stored.shard_id + "' stored twice");
  }
  bool conserved = false;
  ShardAccount account = ShardAccount::restore(stored.balances, stored.closed, &conserved);
  if (!conserved) {
    return Status::corruption("shard '" + stored.shard_id + "' does not conserve");
  }
  const ShardGrant& grant = stored.record.grant;
  stored.record.quarantined = !stored.grant_decoded || grant.shard_id != stored.shard_id ||
                              grant.gateway_id != options_.gateway_id ||
                              grant.allocated_units != stored.balances.allocated ||
                              !options_.crypto->verifyGrant(grant);
  if (!stored.closed && stored.record.unreconcilable != ShardUnreconcilable::kNo) {
    return Status::corruption("shard '" + stored.shard_id + "' is unreconcilable but open");
  }
  if (!stored.closed) indexOpen(stored.shard_id, stored.record.grant);
  ++version_;
  shards_.emplace(stored.shard_id, Shard{.record = std::move(stored.record),
                                         .account = account,
                                         .reservation_ids = {},
                                         .held_units = 0});
  return Status::ok();
}

Status ShardBook::restoreReservation(const Reservation& reservation) {
  const std::string& id = reservation.reservation_id;
  if (!validId(id, limits::kReservationIdBytesMax)) {
    return Status::corruption("stored shard reservation has an invalid id");
  }
  if (reservations_.contains(id))
    return Status::corruption("reservation '" + id + "' stored twice");
  Shard* shard = lookupShard(reservation.origin);
  if (shard == nullptr) {
    return Status::corruption("reservation '" + id + "' names unknown shard '" +
                              reservation.origin + "'");
  }
  if (reservation.state == ReservationState::kRequested ||
      reservation.state == ReservationState::kReservationUnknown ||
      reservation.state == ReservationState::kRejected) {
    return Status::corruption("reservation '" + id + "' stored in state " +
                              reservationStateName(reservation.state));
  }
  shard->reservation_ids.insert(id);
  if (holdsUnits(reservation.state)) {
    shard->held_units = saturatingAdd(shard->held_units, reservation.reserved_units);
  }
  ++version_;
  reservations_.emplace(id, reservation);
  return Status::ok();
}

Result<ShardRestoreReport> ShardBook::finishRestore(uint64_t now_ms) {
  ++version_;
  ShardRestoreReport report;
  for (auto& [id, shard] : shards_) {
    if (shard.held_units != shard.account.balances().local_reserved) {
      return Status::corruption("shard '" + id + "': localReserved " +
                                std::to_string(shard.account.balances().local_reserved) +
                                " but its reservations hold " + std::to_string(shard.held_units));
    }
    if (shard.record.quarantined) {
      report.quarantined.push_back(id);
      shard.record.report_pending = false;
      if (!shard.account.closed()) {
        unindexOpen(id, shard.record.grant);
        shard.account.close();
        shard.record.close_reason = ShardCloseReason::kQuarantined;
        shard.record.closed_at_ms = now_ms;
        touchShard(id);
      }
    } else if (shard.record.grant.gateway_boot_epoch != options_.boot_epoch &&
               !shard.account.closed()
#ifdef TALLY_TEST_FAULTS
               && !faults_.reuse_after_restart  // deliberately wrong: left open at boot
#endif
    ) {
      closeShard(id, &shard, ShardCloseReason::kBootEpoch, now_ms);
      report.closed_at_boot.push_back(id);
    }
    checkShard(shard);
  }
  for (const auto& [id, reservation] : reservations_) {
    if (reservation.state == ReservationState::kReserved ||
        reservation.state == ReservationState::kExpiring) {
      expiry_.emplace(reservation.expires_at_ms, id);
    }
  }
  return report;
}

// --- shards --------------------------------------------------------------------------------------

ShardAddCode ShardBook::addShard(const ShardGrant& grant, uint64_t now_ms) {
  if (!validId(grant.shard_id, kShardIdBytesMax) || grant.subject.empty() || grant.route.empty() ||
      grant.allocated_units == 0) {
    return ShardAddCode::kInvalid;
  }
  if (const Shard* existing = findShard(grant.shard_id)) {
    return existing->record.grant == grant ? ShardAddCode::kDuplicate : ShardAddCode::kIdConflict;
  }
  // SPEC §6 rule 2, in the order docs/SHARDS.md lists it.
  if (!options_.crypto->verifyGrant(grant)) return ShardAddCode::kBadSignature;
  if (grant.gateway_id != options_.gateway_id) return ShardAddCode::kNotOurGateway;
  if (grant.gateway_boot_epoch != options_.boot_epoch) return ShardAddCode::kWrongBootEpoch;
  const SubjectRoute subject_route{grant.subject, grant.route};
  if (grant.fence < highestFence(subject_route)) return ShardAddCode::kFenceBelowSeen;
  if (now_ms >= grant.expires_at_ms) return ShardAddCode::kExpired;
  if (shards_.size() >= options_.shards_max) return ShardAddCode::kResourceExhausted;

  auto [it, inserted] = shards_.emplace(
      grant.shard_id, Shard{.record = HeldShardRecord{.grant = grant, .added_at_ms = now_ms},
                            .account = ShardAccount::allocate(grant.allocated_units),
                            .reservation_ids = {},
                            .held_units = 0});
  TALLY_ASSERT(inserted);
  indexOpen(grant.shard_id, grant);
  touchShard(grant.shard_id);
  checkShard(it->second);
  (void)noteFence(subject_route, grant.fence, now_ms);
  return ShardAddCode::kOk;
}

std::vector<std::string> ShardBook::noteFence(const SubjectRoute& subject_route, uint64_t fence,
                                              uint64_t now_ms) {
  std::vector<std::string> closed;
  uint64_t& highest = fences_[subject_route];
  if (fence > highest) {
    highest = fence;
    fences_changed_.insert(subject_route);
  }
  for (const std::string& id : openShardsOf(subject_route)) {
    Shard* shard = lookupShard(id);
    if (shard->record.grant.fence < highest) {
      closeShard(id, shard, ShardCloseReason::kFence, now_ms);
      closed.push_back(id);
    }
  }
  return closed;
}

void ShardBook::closeShard(const std::string& shard_id, Shard* shard, ShardCloseReason reason,
                           uint64_t now_ms) {
  if (shard->account.closed()) return;
  unindexOpen(shard_id, shard->record.grant);
  shard->account.close();
  shard->record.close_reason = reason;
  shard->record.closed_at_ms = now_ms;
  shard->record.report_pending = !shard->record.quarantined && !isFinalShard(shard->record);
  touchShard(shard_id);
  checkShard(*shard);
}

bool ShardBook::close(const std::string& shard_id, ShardCloseReason reason, uint64_t now_ms) {
  Shard* shard = lookupShard(shard_id);
  if (shard == nullptr) return false;
  closeShard(shard_id, shard, reason, now_ms);
  return true;
}

std::vector<std::string> ShardBook::closeForReconnect(uint64_t now_ms, uint64_t refresh_before_ms) {
  ++version_;
  std::vector<std::string> closed;
  for (auto& [id, shard] : shards_) {
    if (shard.account.closed()) continue;
    const ShardGrant& grant = shard.record.grant;
    ShardCloseReason reason = ShardCloseReason::kNone;
    if (shard.record.used) {
      reason = ShardCloseReason::kReconnect;
    } else if (saturatingAdd(now_ms, refreshWindowMs(grant, refresh_before_ms)) >=
               grant.expires_at_ms) {
      reason = ShardCloseReason::kExpiry;
    } else if (grant.fence < highestFence({grant.subject, grant.route})) {
      reason = ShardCloseReason::kFence;
    } else if (grant.gateway_boot_epoch != options_.boot_epoch) {
      reason = ShardCloseReason::kBootEpoch;
    }
    if (reason == ShardCloseReason::kNone) continue;
    closeShard(id, &shard, reason, now_ms);
    closed.push_back(id);
  }
  return closed;
}

std::optional<ShardReport> ShardBook::buildReport(const std::string& shard_id,
                                                  uint64_t now_ms) const {
  const Shard* shard = findShard(shard_id);
  if (shard == nullptr || !shard->account.closed() || shard->record.quarantined) {
    return std::nullopt;
  }
  ShardReport report{.shard = shard->record.grant,
                     .balances = shard->account.balances(),
                     .receipts = {},
                     .gateway_boot_epoch = options_.boot_epoch,
                     .reported_at_ms = now_ms};
  report.receipts.reserve(shard->reservation_ids.size());
  for (const std::string& id : shard->reservation_ids) {  // a std::set: sorted by id
    const Reservation* reservation = findReservation(id);
    TALLY_ASSERT(reservation != nullptr);
    report.receipts.push_back(*reservation);
  }
  return report;
}

ShardAnswerOutcome ShardBook::onLedgerAnswer(const std::string& shard_id,
                                             const ShardLedgerView& view, uint64_t now_ms) {
  ShardAnswerOutcome outcome;
  Shard* shard = lookupShard(shard_id);
  if (shard == nullptr || shard->record.quarantined) return outcome;
  outcome.known = true;
  HeldShardRecord& record = shard->record;
  const bool was_final = record.ledger_known && isFinalShardState(record.ledger_state);
  record.ledger_known = true;
  record.ledger_state = view.state;
  record.ledger_spent_units = view.spent_units;
  record.ledger_reminted_units = view.reminted_units;
  record.ledger_debt_units = view.debt_units;
  const bool closed_before = shard->account.closed();
  if (view.state == ShardState::kRevoked) {
    closeShard(shard_id, shard, ShardCloseReason::kRevoked, now_ms);
  }
  if (view.current_fence > record.grant.fence) {
    const ShardGrant& grant = record.grant;
    (void)noteFence({grant.subject, grant.route}, view.current_fence, now_ms);
  }
  if (isFinalShardState(view.state)) {
    // The ledger will never take another report: nothing is pending any more.
    if (!shard->account.closed()) closeShard(shard_id, shard, ShardCloseReason::kRevoked, now_ms);
    record.report_pending = false;
    if (!was_final) {
      record.final_at_ms = now_ms;
      outcome.became_final = true;
    }
  } else if (view.reported && view.last_reported == shard->account.balances() &&
             shard->account.closed()) {
    record.report_pending = false;
  }
  outcome.closed_now = !closed_before && shard->account.closed();
  outcome.acknowledged = shard->account.closed() && !record.report_pending;
  touchShard(shard_id);
  checkShard(*shard);
  return outcome;
}

bool ShardBook::markUnreconcilable(const std::string& shard_id, ShardUnreconcilable reason,
                                   uint64_t now_ms) {
  Shard* shard = lookupShard(shard_id);
  if (shard == nullptr || shard->record.quarantined || !shard->account.closed() ||
      reason == ShardUnreconcilable::kNo ||
      shard->record.unreconcilable != ShardUnreconcilable::kNo) {
    return false;
  }
  HeldShardRecord& record = shard->record;
  record.unreconcilable = reason;
  record.report_pending = false;
  record.final_at_ms = now_ms;  // retention counts from here, even if the ledger state was final
  touchShard(shard_id);
  checkShard(*shard);
  return true;
}

// --- time ----------------------------------------------------------------------------------------

void ShardBook::forget(const std::string& shard_id) {
  Shard* shard = lookupShard(shard_id);
  TALLY_ASSERT(shard != nullptr && shard->held_units == 0);
  for (const std::string& id : shard->reservation_ids) {
    const size_t erased = reservations_.erase(id);
    TALLY_ASSERT(erased == 1);
    reservations_changed_.erase(id);
    reservations_deleted_.insert(id);
  }
  unindexOpen(shard_id, shard->record.grant);
  shards_.erase(shard_id);
  shards_changed_.erase(shard_id);
  shards_deleted_.insert(shard_id);
}

ShardTickOutcome ShardBook::tick(uint64_t now_ms) {
  ShardTickOutcome outcome;
  outcome.reservations_expired = expireDue(now_ms);
  std::vector<std::string> forgettable;
  for (auto& [id, shard] : shards_) {
    if (!shard.account.closed() && now_ms >= shard.record.grant.expires_at_ms) {
      closeShard(id, &shard, ShardCloseReason::kExpiry, now_ms);
      outcome.shards_closed.push_back(id);
    }
    const HeldShardRecord& record = shard.record;
    if (isFinalShard(record) && shard.held_units == 0 &&
        now_ms >= saturatingAdd(record.final_at_ms, options_.retention_ms)) {
      forgettable.push_back(id);
    }
  }
  for (const std::string& id : forgettable) forget(id);
  outcome.shards_forgotten = std::move(forgettable);
  return outcome;
}

}  // namespace tally
