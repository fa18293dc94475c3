#pragma once

#include <string>

#include "core/ledger_types.h"

// How tallyctl prints `audit --period EPOCH` and `audit --periods` (core/period_close.h): the
// closed accounting periods of every account. Field names are part of the JSON contract
// (usageText() in args.cc); balances use the audit's names.

namespace tally::ctl {

std::string renderPeriodAudit(const AuditReport& report, bool json);

}  // namespace tally::ctl
