#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/ledger_types.h"
#include "wire/codec.h"

// How tallyctl prints answers: one JSON object (--json) or a short human-readable form. Pure
// functions of the answer; each returns the complete text for stdout, newline-terminated. The
// JSON field names are an external contract (see usageText() in args.cc).

namespace tally::ctl {

// RFC 3339 UTC, e.g. "2026-07-19T14:00:00Z"; milliseconds appear only when non-zero
// ("2026-07-19T14:00:00.250Z").
std::string rfc3339FromUnixMs(uint64_t unix_ms);
// "-" for 0 (unset), else rfc3339FromUnixMs.
std::string timeText(uint64_t unix_ms);
class JsonWriter;
// Writes `name` as RFC 3339 (null when 0) and `nameMs` as Unix milliseconds: every time field in
// tallyctl's JSON comes as this pair.
void timeField(JsonWriter& w, std::string_view name, uint64_t unix_ms);

// The nine balances of SPEC §4 as fields of the object being written (same names everywhere).
void balanceFields(JsonWriter& w, const Balances& b);

struct ReservationView {
  const ReservationReply& reply;
  std::string_view requested_id;  // shown when the reply carries no receipt (NOT_FOUND …)
  bool is_query = false;          // refundedUnits then shows the receipt's refund
};
std::string renderReservation(const ReservationView& view, bool json);

// publish / rollback (`show_policy` false) or show (`show_policy` true).
std::string renderPolicy(const wire::PolicyAnswer& answer, bool show_policy, bool json);
std::string renderAudit(const AuditReport& report, bool json);
std::string renderHealth(const wire::HealthReply& reply, bool json);
// gateway enroll / list / disable / enable.
std::string renderGateways(const GatewayReply& reply, bool json);
// ctl/render_operators.cc
std::string renderOperators(const OperatorReply& reply, bool json);
std::string renderAuditLog(const AuditLogReply& reply, bool json);
// shard list / revoke / write-off: each shard with its central equation and, when reported,
// the agent's local one.
std::string renderShards(const ShardReply& reply, bool json);
// An answer that is an error (transport failure, peer error reply): `code` is an
// UPPER_SNAKE name.
std::string renderError(std::string_view code, std::string_view message, bool json);

// True when the audit found no violation in any account or shard.
bool auditConserved(const AuditReport& report);

// UPPER_SNAKE name of a peer error code, e.g. "FRAME_TOO_LARGE".
const char* errorCodeConstant(wire::ErrorCode code);

}  // namespace tally::ctl
