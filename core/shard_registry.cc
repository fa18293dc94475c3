#include "core/shard_registry.h"

#include <algorithm>
#include <utility>

#include "core/assert.h"
#include "core/checked_math.h"
#include "core/limits.h"
#include "core/policy.h"

namespace tally {
namespace {

bool validName(const std::string& name, uint64_t bytes_max) {
  return !name.empty() && name.size() <= bytes_max;
}

bool isLive(ShardState state) {
  return state == ShardState::kIssued || state == ShardState::kRevoked;
}

// Every field but the signature (Ed25519 is deterministic, so equal fields sign equally; the
// signature was verified already).
bool sameIssue(const ShardIssueRequest& a, const ShardIssueRequest& b) {
  return a.request_id == b.request_id && a.gateway_name == b.gateway_name &&
         a.gateway_id == b.gateway_id && a.gateway_boot_epoch == b.gateway_boot_epoch &&
         a.subject == b.subject && a.route == b.route;
}

ShardReply shardError(ReplyCode code, std::string message) {
  return {.code = code, .message = std::move(message)};
}

}  // namespace

bool isShardConserved(const ShardRecord& r) {
  using u128 = unsigned __int128;
  return u128{r.grant.allocated_units} == u128{r.spent_units} + r.reminted_units + r.retired_units;
}

#ifdef TALLY_TEST_FAULTS
void ShardRegistry::setFaultsForTesting(ShardRegistryFaults faults) { faults_ = faults; }
#endif

ShardReply ShardRegistry::permissionDenied(std::string message) {
  return {.code = ReplyCode::kRejected, .message = std::move(message), .permission_denied = true};
}

// ---- issue ------------------------------------------------------------------------------------

ShardReply ShardRegistry::issue(const ShardIssueRequest& request, uint64_t now_ms) {
  if (!validName(request.request_id, limits::kShardRequestIdBytesMax)) {
    return shardError(
        ReplyCode::kInvalidArgument,
        "request id must be 1.." + std::to_string(limits::kShardRequestIdBytesMax) + " bytes");
  }
  if (!validName(request.subject, limits::kSubjectBytesMax) ||
      !validName(request.route, limits::kRouteBytesMax)) {
    return shardError(ReplyCode::kInvalidArgument, "subject and route must be set and bounded");
  }
  if (crypto_ == nullptr) return shardError(ReplyCode::kInvalidState, "no ledger signing key");
  // Rule 1: only an enrolled, enabled gateway, proven by its signature.
  if (!crypto_->verifyIssueRequest(request)) {
    return permissionDenied("issue request signature does not verify");
  }
  const GatewayRecord* gateway = findGateway(request.gateway_name);
  if (gateway == nullptr || gateway->public_key != request.gateway_id) {
    return permissionDenied("gateway '" + request.gateway_name + "' is not enrolled with this key");
  }
  if (!gateway->enabled) {
    return permissionDenied("gateway '" + request.gateway_name + "' is disabled");
  }
  // Rule 2: idempotency per request id.
  if (auto it = by_request_id_.find(request.request_id); it != by_request_id_.end()) {
    const ShardRecord& existing = shards_.at(it->second);
    if (!sameIssue(existing.issue_request, request)) {
      return answer(ReplyCode::kIdempotencyConflict, &existing,
                    "request id '" + request.request_id + "' was used for another request");
    }
    ShardReply reply = answer(ReplyCode::kOk, &existing);
    reply.duplicate = true;
    return reply;
  }
  return refuseIssue(request, now_ms);
}

ShardReply ShardRegistry::refuseIssue(const ShardIssueRequest& request, uint64_t now_ms) {
  // Rule 3: the active generation's budget, with emergency mode on.
  const Policy* policy = accounts_->policy(accounts_->activeGeneration());
  const Budget* budget =
      policy == nullptr ? nullptr : matchBudget(*policy, request.subject, request.route);
  if (budget == nullptr) {
    ShardReply reply = shardError(ReplyCode::kRejected, "no budget for subject/route");
    reply.limiting_dimension = LimitingDimension::kNoBudget;
    return reply;
  }
  if (!budget->emergency.enabled || budget->emergency.shard_units == 0) {
    return shardError(ReplyCode::kInvalidState, "emergency mode is off");
  }
  // Rule 4: the account admits (no debt, not draining), and the per-gateway cap.
  bool table_full = false;
  Admission admission = accounts_->admit(request.subject, request.route, 0, now_ms, &table_full);
  if (table_full) return shardError(ReplyCode::kResourceExhausted, "account table is full");
  if (admission.refused != LimitingDimension::kNone) {
    ShardReply reply = shardError(ReplyCode::kRejected, "the account admits nothing now");
    reply.limiting_dimension = admission.refused;
    return reply;
  }
  if (shards_.size() >= limits::kShardsMax) {
    return shardError(ReplyCode::kResourceExhausted, "shard table is full");
  }
  if (liveShardsOf(request.gateway_name, admission.entry->key) >=
      limits::kShardsPerGatewayAccountMax) {
    return shardError(ReplyCode::kResourceExhausted,
                      "gateway already holds " +
                          std::to_string(limits::kShardsPerGatewayAccountMax) +
                          " live shards of this account");
  }
  return carveAndGrant(request, admission.entry, *budget, now_ms);
}

ShardReply ShardRegistry::carveAndGrant(const ShardIssueRequest& request, AccountEntry* entry,
                                        const Budget& budget, uint64_t now_ms) {
  // Rule 5: the carve.
  const Units units = budget.emergency.shard_units;
  const AccountCode code = accounts_->carve(entry->key, units, now_ms);
  if (code == AccountCode::kInsufficientAvailable || code == AccountCode::kDebtOutstanding) {
    ShardReply reply = shardError(ReplyCode::kRejected,
                                  "available is short of " + std::to_string(units) + " units");
    reply.limiting_dimension = code == AccountCode::kDebtOutstanding ? LimitingDimension::kDebt
                                                                     : LimitingDimension::kCapacity;
    return reply;
  }
  if (code == AccountCode::kOverflow) {
    return shardError(ReplyCode::kArithmeticOverflow, "retired units overflow");
  }
  TALLY_ASSERT(code == AccountCode::kOk);
  // Point of no return: the units are retired; the shard record persists with the account.
  ++shard_sequence_;
  sequence_changed_ = true;
  ShardGrant grant{
      .shard_id = "shard-" + std::to_string(shard_sequence_),
      .subject = request.subject,
      .route = request.route,
      .policy_generation = entry->key.generation,
      .accounting_epoch_ms = accountingEpochStartMs(now_ms, budget.accounting_epoch),
      .gateway_id = request.gateway_id,
      .gateway_name = request.gateway_name,
      .gateway_boot_epoch = request.gateway_boot_epoch,
      .fence = fenceOf(request.subject, request.route),
      .allocated_units = units,
      .issued_at_ms = now_ms,
      .expires_at_ms = saturatingAdd(now_ms, budget.emergency.shard_ttl_ms),
  };
  crypto_->signGrant(&grant);
  const std::string shard_id = grant.shard_id;
  auto [it, inserted] = shards_.emplace(shard_id, ShardRecord{.grant = std::move(grant),
                                                              .issue_request = request,
                                                              .state = ShardState::kIssued,
                                                              .retired_units = units});
  TALLY_ASSERT(inserted);
  by_request_id_.emplace(request.request_id, shard_id);
  assertConserved(it->second);
  touched(it->second);
  return answer(ReplyCode::kOk, &it->second);
}

size_t ShardRegistry::liveShardsOf(const std::string& gateway_name,
                                   const AccountKey& source) const {
  size_t live = 0;
  for (const auto& [id, record] : shards_) {
    const ShardGrant& grant = record.grant;
    if (isLive(record.state) && grant.gateway_name == gateway_name &&
        grant.policy_generation == source.generation && grant.subject == source.subject &&
        grant.route == source.route) {
      ++live;
    }
  }
  return live;
}

// ---- revoke, write off, status ----------------------------------------------------------------

ShardReply ShardRegistry::revoke(const std::string& shard_id, const std::string& gateway_name) {
  if (shard_id.empty() == gateway_name.empty()) {
    return shardError(ReplyCode::kInvalidArgument, "name exactly one of shard id and gateway");
  }
  if (!shard_id.empty()) {
    auto it = shards_.find(shard_id);
    if (it == shards_.end()) return shardError(ReplyCode::kNotFound, "no shard '" + shard_id + "'");
    ShardRecord& record = it->second;
    if (record.state == ShardState::kRevoked || record.state == ShardState::kReconciling) {
      ShardReply reply = answer(ReplyCode::kOk, &record);
      reply.duplicate = true;
      return reply;
    }
    if (record.state != ShardState::kIssued) {
      return answer(ReplyCode::kInvalidState, &record,
                    std::string("cannot revoke a shard in state ") + shardStateName(record.state));
    }
    record.state = ShardState::kRevoked;
    touched(record);
    const SubjectRoute key{record.grant.subject, record.grant.route};
    fences_[key] = fenceOf(key.subject, key.route) + 1;
    changed_fences_.insert(key);
    return answer(ReplyCode::kOk, &record);
  }
  if (findGateway(gateway_name) == nullptr) {
    return shardError(ReplyCode::kNotFound, "no gateway '" + gateway_name + "'");
  }
  std::set<SubjectRoute> bumped;
  std::vector<ShardRecord*> revoked;
  for (auto& [id, record] : shards_) {
    if (record.grant.gateway_name != gateway_name || record.state != ShardState::kIssued) continue;
    record.state = ShardState::kRevoked;
    touched(record);
    bumped.insert(SubjectRoute{record.grant.subject, record.grant.route});
    revoked.push_back(&record);
  }
  for (const SubjectRoute& key : bumped) {
    fences_[key] = fenceOf(key.subject, key.route) + 1;
    changed_fences_.insert(key);
  }
  ShardReply reply;
  for (const ShardRecord* record : revoked) reply.shards.push_back(viewOf(*record));
  return reply;
}

ShardReply ShardRegistry::writeOff(const std::string& shard_id, uint64_t now_ms) {
  auto it = shards_.find(shard_id);
  if (it == shards_.end()) return shardError(ReplyCode::kNotFound, "no shard '" + shard_id + "'");
  ShardRecord& record = it->second;
  if (record.state == ShardState::kWrittenOff) {
    ShardReply reply = answer(ReplyCode::kOk, &record);
    reply.duplicate = true;
    return reply;
  }
  if (record.state == ShardState::kReconciled) {
    return answer(ReplyCode::kInvalidState, &record, "a reconciled shard cannot be written off");
  }
  if (now_ms < record.grant.expires_at_ms) {
    return answer(ReplyCode::kInvalidState, &record,
                  "the shard expires at " + std::to_string(record.grant.expires_at_ms) +
                      " ms; it may be written off only then");
  }
  // Its retired units stay retired for ever; a pending deferred remint is dropped with it.
  if (record.remint_due_at_ms != 0) {
    deferred_.erase({record.remint_due_at_ms, shard_id});
    record.remint_due_at_ms = 0;
    record.remint_target_units = 0;
  }
  record.state = ShardState::kWrittenOff;
  touched(record);
  return answer(ReplyCode::kOk, &record);
}

ShardReply ShardRegistry::status(const std::string& gateway_name,
                                 const std::vector<std::string>& ids) const {
  ShardReply reply;
  for (const std::string& id : ids) {
    const ShardRecord* record = find(id);
    if (record == nullptr) continue;
    if (!gateway_name.empty() && record->grant.gateway_name != gateway_name) continue;
    reply.shards.push_back(viewOf(*record));
  }
  return reply;
}

ShardReply ShardRegistry::list(const std::string& gateway_name,
                               std::optional<ShardState> state) const {
  ShardReply reply;
  for (const auto& [id, record] : shards_) {
    if (!gateway_name.empty() && record.grant.gateway_name != gateway_name) continue;
    if (state.has_value() && record.state != *state) continue;
    reply.shards.push_back(viewOf(record));
  }
  return reply;
}

const ShardRecord* ShardRegistry::find(const std::string& shard_id) const {
  auto it = shards_.find(shard_id);
  return it == shards_.end() ? nullptr : &it->second;
}

uint64_t ShardRegistry::fenceOf(const std::string& subject, const std::string& route) const {
  auto it = fences_.find(SubjectRoute{subject, route});
  return it == fences_.end() ? 1 : it->second;
}

ShardLedgerView ShardRegistry::viewOf(const ShardRecord& record) const {
  return ShardLedgerView{
      .grant = record.grant,
      .state = record.state,
      .current_fence = fenceOf(record.grant.subject, record.grant.route),
      .spent_units = record.spent_units,
      .reminted_units = record.reminted_units,
      .retired_units = record.retired_units,
      .debt_units = record.debt_units,
      .written_off = record.state == ShardState::kWrittenOff,
      .conserved = isShardConserved(record),
      .reported = record.reported,
      .last_reported = record.last_reported,
  };
}

ShardReply ShardRegistry::answer(ReplyCode code, const ShardRecord* record,
                                 std::string message) const {
  ShardReply reply{.code = code, .message = std::move(message)};
  if (record != nullptr) reply.shards.push_back(viewOf(*record));
  return reply;
}

void ShardRegistry::touched(const ShardRecord& record) {
  changed_shards_.insert(record.grant.shard_id);
}

void ShardRegistry::touchedGateway(const std::string& gateway_name) {
  changed_gateways_.insert(gateway_name);
}

void ShardRegistry::assertConserved(const ShardRecord& record) const {
  TALLY_ASSERT(isShardConserved(record));
}

void ShardRegistry::maybeQueueCompaction(const ShardRecord& record) {
  if (record.state != ShardState::kReconciled || record.retired_units != 0 ||
      record.remint_due_at_ms != 0) {
    return;
  }
  compaction_.insert(
      {saturatingAdd(record.grant.expires_at_ms, shard_retention_ms_), record.grant.shard_id});
}

}  // namespace tally
