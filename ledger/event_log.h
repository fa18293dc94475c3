#pragma once

#include "common/log.h"
#include "core/ledger_requests.h"

// The ledger's log line for each event a request reports (core/ledger_requests.h):
// overdraft_breach, policy_published, policy_rolled_back, gateway_enrolled,
// gateway_enabled / gateway_disabled, shard_issued, shard_issue_denied, shard_report_refused,
// shard_conflict (error level, with the details), shard_reconciled, shard_revoked and
// shard_written_off. An audit's verdict is a metric, not a line. Runs on the loop thread.

namespace tally::ledger {

void logLedgerEvent(Logger* logger, const LedgerEvent& event);

}  // namespace tally::ledger
