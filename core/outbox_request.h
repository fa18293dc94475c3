#pragma once

#include "core/ledger_protocol.h"
#include "core/outbox.h"

namespace tally {

// The ledger request that delivers an outbox entry: the one translation the agent's shell, the
// simulator's agent node and the agent fuzzer all use.
LedgerRequest outboxRequest(const OutboxEntry& entry);

}  // namespace tally
