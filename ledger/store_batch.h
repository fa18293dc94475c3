#pragma once

#include <cstdint>

#include "core/ledger.h"
#include "ledger/store.h"

// What the ledger persists after a batch of operations: the full images of every row that
// `rows` (from Ledger::takeChangedRows) names, copied out of `ledger`, stamped with the ledger
// clock. Moves the deleted ids out of `rows`. Call before the ledger's next mutating call.

namespace tally::ledger {

StoreBatch storeBatchOf(const Ledger& ledger, LedgerChangedRows* rows, uint64_t now_ms);

}  // namespace tally::ledger
