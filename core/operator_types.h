#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/ledger_types.h"
#include "core/shard_types.h"

// Operator identities and the audit log of privileged actions (docs/security.md "Operators",
// "Audit log"): the records the ledger keeps and the answers it gives about them.

namespace tally {

// An operator's role. Not ordered: admin may do everything, every role may read, policy and
// shards each add their own requests only.
enum class OperatorRole : uint8_t { kAudit, kPolicy, kShards, kAdmin };
const char* operatorRoleName(OperatorRole role);  // "audit", "policy", "shards", "admin"
std::optional<OperatorRole> parseOperatorRole(std::string_view name);

// One operator identity: tallyctl authenticates with its Ed25519 key.
struct OperatorRecord {
  std::string name;
  PublicKey public_key{};
  OperatorRole role = OperatorRole::kAudit;
  bool enabled = true;
  uint64_t enrolled_at_ms = 0;

  bool operator==(const OperatorRecord&) const = default;
};

// An answer about operators: enroll, enable/disable and list.
struct OperatorReply {
  ReplyCode code = ReplyCode::kOk;
  std::string message;
  std::vector<OperatorRecord> operators;  // enroll, enable/disable: the one; list: all, by name
  bool duplicate = false;                 // an enroll of what is enrolled already: nothing changed
};

using RequestDigest = std::array<uint8_t, 32>;  // SHA-256 of the request's frame (wire::sha256)

// One privileged action, or a refused attempt at one. Append-only: never changed once written.
struct AuditLogEntry {
  uint64_t sequence = 0;   // 1, 2, 3, … in the order the ledger applied them
  uint64_t at_ms = 0;      // the ledger clock
  std::string actor;       // operator or gateway name; "" on an --insecure connection
  std::string actor_kind;  // "operator", "gateway", "nobody" or "unauthenticated"
  std::string actor_role;  // an operator's role; "" otherwise
  std::string action;      // linkRequestName: "policy publish", "gateway enroll", …
  std::string target;      // what it named: a gateway, operator, shard, generation; "" if none
  std::string outcome;     // "ok", "refused" (permission), or the reply's code name
  std::string detail;      // the refusal's or the reply's message
  RequestDigest request_digest{};

  bool operator==(const AuditLogEntry&) const = default;
};

struct AuditLogReply {
  std::vector<AuditLogEntry> entries;  // ascending sequence
  bool more = false;                   // entries after the last one remain
  uint64_t first_kept_sequence = 0;    // older entries were dropped past retention (0: none kept)
  uint64_t last_sequence = 0;          // the newest entry's sequence (0: none written yet)
};

}  // namespace tally
