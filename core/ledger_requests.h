#pragma once

#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "core/ledger.h"
#include "core/ledger_protocol.h"

// tally-ledger's answer to every request of the protocol (core/ledger_protocol.h): which Ledger
// call a request is, what it answers, and what of it the shell reports (a log line, a metric).
// The shell decodes bytes into a LedgerRequest, reads its clock once, calls apply(), logs or
// counts the events, persists what the Ledger's takeChangedRows() names and, once that is
// durable, sends the reply. Every reply of a batch waits for the batch's commit (a read may
// have seen a change of that batch), so no request needs a rule of its own for that.
//
// Every kind of request is answered: one this build does not know (UnknownMessage) with a
// typed ErrorReply, never an assertion.
//
// Borrows the Ledger, which must outlive it. Single-threaded, like the Ledger.

namespace tally {

// --- Events: what a request did that the shell reports ----------------------------------------

// A settle or operation receipt left debt above the budget's max overdraft (first answer only;
// a duplicate reports nothing).
struct OverdraftBreached {
  Reservation receipt;
};
struct PolicyPublished {
  Generation generation = 0;
  uint64_t budgets = 0;
};
struct PolicyRolledBack {
  Generation generation = 0;
};
// The verdict of an audit over the whole ledger, before any subject/route filter.
struct Audited {
  bool conserved = true;
  uint64_t violations = 0;
};
struct GatewayEnrolled {
  std::string gateway_name;
  PublicKey public_key{};
  // A rotation (EnrollGatewayRequest::rotate): public_key replaced previous_public_key, which is
  // admitted until previous_key_until_ms (zero key: not at all).
  bool rotated = false;
  PublicKey previous_public_key{};
  uint64_t previous_key_until_ms = 0;
};
struct GatewayEnabledSet {
  std::string gateway_name;
  bool enabled = false;
};
struct OperatorEnrolled {
  std::string operator_name;
  PublicKey public_key{};
  OperatorRole role = OperatorRole::kAudit;
};
struct OperatorEnabledSet {
  std::string operator_name;
  bool enabled = false;
};
struct ShardIssued {
  ShardGrant grant;
};
struct ShardIssueDenied {  // an unknown or disabled gateway, or a bad signature
  std::string gateway_name;
  std::string reason;
};
struct ShardReportRefused {  // permission denied or an invalid report
  std::string shard_id;
  std::string gateway_name;
  ReplyCode code = ReplyCode::kOk;
  std::string reason;
};
// A report that put its shard in CONFLICT (two gateways or boot epochs, or overspend).
struct ShardConflicted {
  ShardLedgerView view;
  uint64_t report_boot_epoch = 0;
  std::string reason;
  Units spent_units = 0;  // by this report
  Units debt_units = 0;   // by this report
  Units overspent_units = 0;
};
struct ShardReconciled {
  ShardLedgerView view;
  uint64_t report_boot_epoch = 0;
  Units spent_units = 0;     // by this report
  Units reminted_units = 0;  // by this report
};
struct ShardRevoked {
  std::string shard_id;
  std::string gateway_name;
  uint64_t fence = 0;
};
// A gateway's request on a reservation bound to another gateway, refused (reservationRefusal).
struct ReservationRefused {
  std::string gateway_name;  // who asked
  std::string reservation_id;
  std::string bound_gateway_name;  // whose it is
};
struct ShardWrittenOff {
  std::string shard_id;
  Units retired_units = 0;
};

using LedgerEvent =
    std::variant<OverdraftBreached, PolicyPublished, PolicyRolledBack, Audited, GatewayEnrolled,
                 GatewayEnabledSet, ShardIssued, ShardIssueDenied, ShardReportRefused,
                 ShardConflicted, ShardReconciled, ShardRevoked, ShardWrittenOff, OperatorEnrolled,
                 OperatorEnabledSet, ReservationRefused>;

struct LedgerOutcome {
  LedgerReply reply;
  std::vector<LedgerEvent> events;  // in the order they happened; usually none
};

// --- The requests -----------------------------------------------------------------------------

class LedgerRequests {
 public:
  // `version` is what a health request reports.
  LedgerRequests(Ledger* ledger, std::string version);

  // `gateway_name`: the enrolled gateway whose connection sent `request` ("" = none: an operator
  // or an --insecure link). A reservation request on a reservation bound to another gateway is
  // answered kPermissionDenied, changing nothing (core/link_authority.h reservationRefusal); a
  // new reservation is bound to `gateway_name`.
  LedgerOutcome apply(const LedgerRequest& request, uint64_t now_ms,
                      const std::string& gateway_name = {});

  // The audit (SPEC §4): every account's balances as of `now_ms`, with the conservation
  // verdict and the shard equations of the whole ledger; accounts filtered by the request's
  // subject and route when set. The Audited event carries the unfiltered verdict.
  LedgerOutcome audit(const AuditRequest& request, uint64_t now_ms) const;

  // The shell could not make a batch durable: memory is ahead of disk and it stops serving.
  // Health answers "failed" from now on.
  void markFailed() { failed_ = true; }

 private:
  LedgerOutcome showPolicy(const ShowPolicyRequest& request) const;
  LedgerOutcome issueShard(const ShardIssueRequest& request, uint64_t now_ms);
  LedgerOutcome reportShard(const ShardReport& report, uint64_t now_ms);

  Ledger* ledger_;
  std::string version_;
  bool failed_ = false;
};

}  // namespace tally
