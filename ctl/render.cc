#include "ctl/render.h"

#include <cstdio>

#include "ctl/json.h"
#include "ctl/policy_toml.h"
#include "ctl/render_shards.h"
#include "wire/digest.h"

namespace tally::ctl {
namespace {

constexpr uint64_t kMsPerDay = 86'400'000;

// Proleptic Gregorian date of a day count since 1970-01-01 (H. Hinnant's civil_from_days).
void civilFromDays(int64_t days, int64_t* year, unsigned* month, unsigned* day) {
  const int64_t z = days + 719468;
  const int64_t era = (z >= 0 ? z : z - 146096) / 146097;
  const auto doe = static_cast<unsigned>(z - era * 146097);
  const unsigned yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  const unsigned doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  const unsigned mp = (5 * doy + 2) / 153;
  *day = doy - (153 * mp + 2) / 5 + 1;
  *month = mp < 10 ? mp + 3 : mp - 9;
  *year = static_cast<int64_t>(yoe) + era * 400 + (*month <= 2 ? 1 : 0);
}

}  // namespace

void timeField(JsonWriter& w, std::string_view name, uint64_t unix_ms) {
  w.key(name);
  if (unix_ms == 0) {
    w.null();
  } else {
    w.value(rfc3339FromUnixMs(unix_ms));
  }
  w.field(std::string(name) + "Ms", unix_ms);
}

void balanceFields(JsonWriter& w, const Balances& b) {
  w.field("opening", b.opening);
  w.field("minted", b.minted);
  w.field("overdraftIssued", b.overdraft_issued);
  w.field("available", b.available);
  w.field("reserved", b.reserved);
  w.field("spent", b.spent);
  w.field("retiredForEmergency", b.retired_for_emergency);
  w.field("overdraftRepaid", b.overdraft_repaid);
  w.field("transferredOut", b.transferred_out);
}

std::string timeText(uint64_t unix_ms) {
  return unix_ms == 0 ? std::string("-") : rfc3339FromUnixMs(unix_ms);
}

namespace {

bool isRejection(const ReservationReply& reply) {
  return reply.code == ReplyCode::kRejected || reply.receipt.state == ReservationState::kRejected;
}

bool hasReceipt(const ReservationReply& reply) { return !reply.receipt.reservation_id.empty(); }

Units refundedShown(const ReservationView& view) {
  return view.is_query ? view.reply.receipt.refunded_units : view.reply.refunded_units;
}

std::string retryText(int64_t retry_after_ms) {
  if (retry_after_ms < 0) return "never under this policy";
  return "after " + std::to_string(retry_after_ms) + " ms";
}

// For people reading a reply that came without a message.
std::string codeExplanation(ReplyCode code) {
  switch (code) {
    case ReplyCode::kIdempotencyConflict:
      return "this id was reserved with a different request digest; the original receipt:";
    case ReplyCode::kOperationConflict: return "bound to another operation id:";
    case ReplyCode::kExpired: return "the hold expired first:";
    case ReplyCode::kInvalidState: return "not allowed in the reservation's current state:";
    default: return "";
  }
}

std::string reservationJson(const ReservationView& view) {
  const ReservationReply& reply = view.reply;
  const Reservation& r = reply.receipt;
  JsonWriter w;
  w.beginObject();
  w.field("code", replyCodeName(reply.code));
  w.field("duplicate", reply.duplicate);
  w.field("rejected", isRejection(reply));
  if (!hasReceipt(reply)) {
    w.field("reservationId", view.requested_id);
    w.field("message", reply.message);
    w.endObject();
    return w.take();
  }
  w.field("reservationId", r.reservation_id);
  w.field("state", reservationStateName(r.state));
  w.field("subject", r.subject);
  w.field("route", r.route);
  w.field("region", r.region);
  w.field("operationId", r.operation_id);
  w.field("reservedUnits", r.reserved_units);
  w.field("actualUnits", r.actual_units);
  w.field("refundedUnits", refundedShown(view));
  w.field("debtUnits", r.debt_units);
  w.field("policyGeneration", r.policy_generation);
  timeField(w, "accountingEpoch", r.accounting_epoch_ms);
  timeField(w, "expiresAt", r.expires_at_ms);
  w.field("origin", r.origin.empty() ? std::string("central") : r.origin);
  w.field("gateway", r.gateway_name);
  w.field("requestDigest", wire::digestHex(r.request_digest));
  w.field("overdraftBreach", r.overdraft_breach);
  w.field("closedByHardLimit", r.closed_by_hard_limit);
  if (isRejection(reply)) {
    w.field("limitingDimension", limitingDimensionName(r.limiting_dimension));
    w.field("retryAfterMs", r.retry_after_ms);
  }
  if (!reply.message.empty()) w.field("message", reply.message);
  w.endObject();
  return w.take();
}

std::string reservationHuman(const ReservationView& view) {
  const ReservationReply& reply = view.reply;
  const Reservation& r = reply.receipt;
  std::string out;
  if (!hasReceipt(reply)) {
    out = std::string(replyCodeName(reply.code)) + " " + std::string(view.requested_id);
    if (!reply.message.empty()) out += ": " + reply.message;
    return out + "\n";
  }
  if (reply.code != ReplyCode::kOk && reply.code != ReplyCode::kRejected) {
    const std::string why = reply.message.empty() ? codeExplanation(reply.code) : reply.message;
    out += std::string(replyCodeName(reply.code)) + (why.empty() ? "" : ": " + why) + "\n";
  }
  out += std::string(reservationStateName(r.state)) + " " + r.reservation_id + "  " + r.subject +
         " / " + r.route + (r.region.empty() ? "" : "  region " + r.region) +
         (reply.duplicate ? "  (duplicate: nothing changed)" : "") + "\n";
  if (isRejection(reply)) {
    out += "  limited by " + std::string(limitingDimensionName(r.limiting_dimension)) + "; retry " +
           retryText(r.retry_after_ms) + "; policy generation " +
           std::to_string(r.policy_generation) + "\n";
    if (!reply.message.empty()) out += "  " + reply.message + "\n";
    return out;
  }
  out += "  reserved " + std::to_string(r.reserved_units) + "  actual " +
         std::to_string(r.actual_units) + "  refunded " + std::to_string(refundedShown(view)) +
         "  debt " + std::to_string(r.debt_units) + (r.overdraft_breach ? " (breach)" : "") + "\n";
  out += "  generation " + std::to_string(r.policy_generation) + "  epoch " +
         timeText(r.accounting_epoch_ms) + "  expires " + timeText(r.expires_at_ms) + "  origin " +
         (r.origin.empty() ? std::string("central") : r.origin);
  if (!r.operation_id.empty()) out += "  operation " + r.operation_id;
  return out + "\n";
}

void budgetJson(JsonWriter& w, const Budget& b) {
  w.beginObject();
  w.field("subject", b.subject_pattern);
  w.field("route", b.route);
  w.field("region", b.region);
  w.field("unit", b.unit);
  w.field("refill_per_second", b.refill_per_second);
  w.field("burst", b.burst);
  w.field("max_single_reservation", b.max_single_reservation);
  w.field("hold_ttl_ms", b.hold_ttl_ms);
  w.field("hard_execution_limit_ms", b.hard_execution_limit_ms);
  w.field("max_overdraft", b.max_overdraft);
  w.field("weight", b.weight);
  w.field("priority", b.priority);
  w.field("fairness_budget", b.fairness_budget_permille);
  w.field("estimator_digest", b.estimator_digest);
  w.field("accounting_epoch", epochPeriodName(b.accounting_epoch));
  w.key("emergency").beginObject();
  w.field("enabled", b.emergency.enabled);
  w.field("shard_units", b.emergency.shard_units);
  w.field("shard_ttl_ms", b.emergency.shard_ttl_ms);
  w.endObject();
  w.key("rollout").beginObject();
  w.field("mode", rolloutModeName(b.rollout.mode));
  w.field("percent", b.rollout.percent);
  w.endObject();
  w.endObject();
}

void accountJson(JsonWriter& w, const AccountView& a) {
  const Balances& b = a.balances;
  w.beginObject();
  w.field("subject", a.key.subject);
  w.field("route", a.key.route);
  w.field("policyGeneration", a.key.generation);
  w.field("generationState", generationStateName(a.generation_state));
  timeField(w, "accountingEpoch", a.accounting_epoch_ms);
  w.field("debt", a.debt);
  balanceFields(w, b);
  w.field("conserved", a.conserved);
  w.field("overdraftBreaches", a.overdraft_breaches.count);
  w.field("overdraftBreachUnits", a.overdraft_breaches.units);
  w.endObject();
}

std::string breachesHuman(const OverdraftBreaches& breaches) {
  if (breaches.count == 0) return "";
  return "  overdraft breaches " + std::to_string(breaches.count) + " (" +
         std::to_string(breaches.units) + " units beyond max overdraft)";
}

std::string accountHuman(const AccountView& a) {
  const Balances& b = a.balances;
  return a.key.subject + " / " + a.key.route + "  generation " + std::to_string(a.key.generation) +
         " " + generationStateName(a.generation_state) + "  epoch " +
         timeText(a.accounting_epoch_ms) + (a.conserved ? "" : "  NOT CONSERVED") + "\n" +
         "  opening " + std::to_string(b.opening) + " + minted " + std::to_string(b.minted) +
         " + overdraftIssued " + std::to_string(b.overdraft_issued) + "\n  = available " +
         std::to_string(b.available) + " + reserved " + std::to_string(b.reserved) + " + spent " +
         std::to_string(b.spent) + " + retiredForEmergency " +
         std::to_string(b.retired_for_emergency) + " + overdraftRepaid " +
         std::to_string(b.overdraft_repaid) + " + transferredOut " +
         std::to_string(b.transferred_out) + "\n  debt " + std::to_string(a.debt) +
         breachesHuman(a.overdraft_breaches) + "\n";
}

}  // namespace

std::string rfc3339FromUnixMs(uint64_t unix_ms) {
  int64_t year = 0;
  unsigned month = 0;
  unsigned day = 0;
  civilFromDays(static_cast<int64_t>(unix_ms / kMsPerDay), &year, &month, &day);
  const uint64_t in_day = unix_ms % kMsPerDay;
  const auto seconds = static_cast<unsigned>(in_day / 1000 % 60);
  const auto minutes = static_cast<unsigned>(in_day / 60'000 % 60);
  const auto hours = static_cast<unsigned>(in_day / 3'600'000);
  const auto millis = static_cast<unsigned>(in_day % 1000);
  char text[48];
  int n = std::snprintf(text, sizeof(text), "%04lld-%02u-%02uT%02u:%02u:%02u",
                        static_cast<long long>(year), month, day, hours, minutes, seconds);
  if (millis != 0) {
    n += std::snprintf(text + n, sizeof(text) - static_cast<size_t>(n), ".%03u", millis);
  }
  return std::string(text, static_cast<size_t>(n)) + "Z";
}

std::string renderReservation(const ReservationView& view, bool json) {
  return json ? reservationJson(view) + "\n" : reservationHuman(view);
}

std::string renderPolicy(const wire::PolicyAnswer& answer, bool show_policy, bool json) {
  const PolicyReply& reply = answer.reply;
  if (json) {
    JsonWriter w;
    w.beginObject();
    w.field("code", replyCodeName(reply.code));
    w.field("policyGeneration", reply.generation);
    if (!reply.message.empty()) w.field("message", reply.message);
    if (show_policy && answer.policy) {
      w.key("budgets").beginArray();
      for (const Budget& budget : answer.policy->budgets) budgetJson(w, budget);
      w.endArray();
    }
    w.endObject();
    return w.take() + "\n";
  }
  if (reply.code != ReplyCode::kOk) {
    return std::string(replyCodeName(reply.code)) +
           (reply.message.empty() ? std::string() : ": " + reply.message) + "\n";
  }
  if (show_policy) {
    if (!answer.policy) return "no policy published\n";
    Policy policy = *answer.policy;
    if (policy.generation == 0) policy.generation = reply.generation;
    return policyToToml(policy);
  }
  return "policy generation " + std::to_string(reply.generation) + " is active\n";
}

bool auditConserved(const AuditReport& report) {
  if (!report.conserved || !report.violations.empty()) return false;
  for (const AccountView& account : report.accounts) {
    if (!account.conserved) return false;
  }
  for (const ShardLedgerView& shard : report.shards) {
    if (!shard.conserved) return false;
  }
  return true;
}

std::string renderAudit(const AuditReport& report, bool json) {
  const bool conserved = auditConserved(report);
  if (json) {
    JsonWriter w;
    w.beginObject();
    w.field("conservation", conserved);
    timeField(w, "asOf", report.as_of_ms);
    w.key("accounts").beginArray();
    for (const AccountView& account : report.accounts) accountJson(w, account);
    w.endArray();
    w.key("violations").beginArray();
    for (const std::string& violation : report.violations) w.value(violation);
    w.endArray();
    w.key("shards").beginArray();
    for (const ShardLedgerView& shard : report.shards) shardJson(w, shard, false);
    w.endArray();
    w.endObject();
    return w.take() + "\n";
  }
  std::string out = std::string("conservation: ") + (conserved ? "OK" : "FAILED") + " (" +
                    std::to_string(report.accounts.size()) +
                    (report.accounts.size() == 1 ? " account)" : " accounts)") +
                    "  balances as of " + timeText(report.as_of_ms) + " (refill applied)\n";
  for (const AccountView& account : report.accounts) out += accountHuman(account);
  if (!report.shards.empty()) {
    out += std::to_string(report.shards.size()) +
           (report.shards.size() == 1 ? " emergency shard:\n" : " emergency shards:\n");
  }
  for (const ShardLedgerView& shard : report.shards) out += shardHuman(shard, false);
  for (const std::string& violation : report.violations) out += "violation: " + violation + "\n";
  return out;
}

std::string renderHealth(const wire::HealthReply& reply, bool json) {
  if (json) {
    JsonWriter w;
    w.beginObject();
    w.field("status", reply.status);
    w.field("version", reply.version);
    timeField(w, "now", reply.now_ms);
    w.endObject();
    return w.take() + "\n";
  }
  return reply.status + "  version " + reply.version + "  peer time " + timeText(reply.now_ms) +
         "\n";
}

std::string renderError(std::string_view code, std::string_view message, bool json) {
  if (!json) return std::string();
  JsonWriter w;
  w.beginObject();
  w.field("error", true);
  w.field("code", code);
  w.field("message", message);
  w.endObject();
  return w.take() + "\n";
}

const char* errorCodeConstant(wire::ErrorCode code) {
  switch (code) {
    case wire::ErrorCode::kUnspecified: return "UNSPECIFIED";
    case wire::ErrorCode::kMalformedFrame: return "MALFORMED_FRAME";
    case wire::ErrorCode::kFrameTooLarge: return "FRAME_TOO_LARGE";
    case wire::ErrorCode::kUnknownMessage: return "UNKNOWN_MESSAGE";
    case wire::ErrorCode::kInvalidArgument: return "INVALID_ARGUMENT";
    case wire::ErrorCode::kUnavailable: return "UNAVAILABLE";
    case wire::ErrorCode::kInternal: return "INTERNAL";
    case wire::ErrorCode::kPermissionDenied: return "PERMISSION_DENIED";
    case wire::ErrorCode::kNotFound: return "NOT_FOUND";
    case wire::ErrorCode::kNotPrimary: return "NOT_PRIMARY";
  }
  return "UNKNOWN_ERROR";
}

}  // namespace tally::ctl
