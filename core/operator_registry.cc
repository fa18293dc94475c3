#include "core/operator_registry.h"

#include <utility>

#include "core/limits.h"

namespace tally {
namespace {

// 1..kOperatorNameBytesMax bytes of [A-Za-z0-9._-].
bool validOperatorName(const std::string& name) {
  return isIdentityName(name, limits::kOperatorNameBytesMax);
}

OperatorReply operatorError(ReplyCode code, std::string message) {
  return {.code = code, .message = std::move(message)};
}

std::string quoted(const std::string& text) { return "'" + text + "'"; }

}  // namespace

const char* operatorRoleName(OperatorRole role) {
  switch (role) {
    case OperatorRole::kAudit: return "audit";
    case OperatorRole::kPolicy: return "policy";
    case OperatorRole::kShards: return "shards";
    case OperatorRole::kAdmin: return "admin";
  }
  return "?";
}

std::optional<OperatorRole> parseOperatorRole(std::string_view name) {
  for (OperatorRole role :
       {OperatorRole::kAudit, OperatorRole::kPolicy, OperatorRole::kShards, OperatorRole::kAdmin}) {
    if (name == operatorRoleName(role)) return role;
  }
  return std::nullopt;
}

OperatorRecord firstOperator(const PublicKey& operator_key) {
  return OperatorRecord{
      .name = kFirstOperatorName, .public_key = operator_key, .role = OperatorRole::kAdmin};
}

void OperatorRegistry::setFirstOperatorKey(const PublicKey& key) {
  first_key_ = key;
  rebuildAll();
}

bool OperatorRegistry::holdsKey(const PublicKey& key) const {
  if (key == PublicKey{}) return false;
  for (const OperatorRecord& record : all_) {
    if (record.public_key == key) return true;
  }
  return false;
}

OperatorReply OperatorRegistry::enroll(const std::string& name, const PublicKey& public_key,
                                       OperatorRole role, bool is_gateway_key, uint64_t now_ms) {
  if (!validOperatorName(name)) {
    return operatorError(ReplyCode::kInvalidArgument,
                         "operator name must be 1.." +
                             std::to_string(limits::kOperatorNameBytesMax) +
                             " bytes of [A-Za-z0-9._-]");
  }
  if (name == kFirstOperatorName) {
    return operatorError(ReplyCode::kInvalidArgument,
                         "operator name 'admin' is the first operator's (the ledger's operator "
                         "key): choose another name");
  }
  if (public_key == PublicKey{}) {
    return operatorError(ReplyCode::kInvalidArgument, "public key must be set");
  }
  if (auto it = enrolled_.find(name); it != enrolled_.end()) {
    const OperatorRecord& record = it->second;
    if (record.public_key != public_key || record.role != role) {
      return operatorError(ReplyCode::kIdempotencyConflict,
                           "operator " + quoted(name) + " is enrolled with another key or role (" +
                               operatorRoleName(record.role) +
                               "): enroll a new name, and disable this one if it is replaced");
    }
    return {.code = ReplyCode::kOk, .operators = {record}, .duplicate = true};
  }
  if (holdsKey(public_key)) {
    return operatorError(ReplyCode::kInvalidArgument,
                         "that key is already another operator's: one key, one identity");
  }
  if (is_gateway_key) {
    return operatorError(ReplyCode::kInvalidArgument,
                         "that key is an enrolled gateway's: an operator needs a key of its own "
                         "(tallyctl operator keygen)");
  }
  if (enrolled_.size() >= limits::kOperatorsMax) {
    return operatorError(ReplyCode::kResourceExhausted, "operator table is full");
  }
  const OperatorRecord& record = enrolled_
                                     .emplace(name, OperatorRecord{.name = name,
                                                                   .public_key = public_key,
                                                                   .role = role,
                                                                   .enabled = true,
                                                                   .enrolled_at_ms = now_ms})
                                     .first->second;
  changed_.insert(name);
  rebuildAll();
  return {.code = ReplyCode::kOk, .operators = {record}};
}

OperatorReply OperatorRegistry::setEnabled(const std::string& name, bool enabled) {
  if (name == kFirstOperatorName) {
    return operatorError(ReplyCode::kInvalidArgument,
                         "the first operator 'admin' is the ledger's operator key: to revoke it, "
                         "replace DATA_DIR/operator.key and restart the ledger");
  }
  auto it = enrolled_.find(name);
  if (it == enrolled_.end()) {
    return operatorError(ReplyCode::kNotFound, "no operator " + quoted(name));
  }
  OperatorRecord& record = it->second;
  if (record.enabled == enabled) {
    return {.code = ReplyCode::kOk, .operators = {record}, .duplicate = true};
  }
  record.enabled = enabled;
  changed_.insert(name);
  rebuildAll();
  return {.code = ReplyCode::kOk, .operators = {record}};
}

OperatorReply OperatorRegistry::list() const { return {.code = ReplyCode::kOk, .operators = all_}; }

Status OperatorRegistry::restore(const OperatorRecord& record) {
  if (!validOperatorName(record.name) || record.name == kFirstOperatorName) {
    return Status::corruption("stored operator has an invalid name '" + record.name + "'");
  }
  if (record.public_key == PublicKey{}) {
    return Status::corruption("stored operator '" + record.name + "' has no key");
  }
  if (!enrolled_.emplace(record.name, record).second) {
    return Status::corruption("operator '" + record.name + "' stored twice");
  }
  rebuildAll();
  return Status::ok();
}

std::vector<const OperatorRecord*> OperatorRegistry::takeChanged() {
  std::vector<const OperatorRecord*> rows;
  rows.reserve(changed_.size());
  for (const std::string& name : changed_) rows.push_back(&enrolled_.at(name));
  changed_.clear();
  return rows;
}

void OperatorRegistry::rebuildAll() {
  all_.clear();
  all_.reserve(enrolled_.size() + 1);
  if (first_key_ != PublicKey{}) all_.push_back(firstOperator(first_key_));
  for (const auto& [name, record] : enrolled_) all_.push_back(record);
}

}  // namespace tally
