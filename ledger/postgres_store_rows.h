#pragma once

#include <cstdint>
#include <vector>

#include "core/status.h"
#include "ledger/postgres_store_connection.h"
#include "ledger/store.h"

// What the PostgreSQL store writes and reads (ledger/postgres_store_schema.h), below
// PostgresStore: a batch as prepared-statement steps, and the tables read back as StoreContents.
// No transactions here: the store wraps them.

namespace tally::ledger::postgres_rows {

// The steps that apply `batch` (without BEGIN/COMMIT): deletions before the upserts of the same
// table, one statement per non-empty list, and the meta update. A row named twice in one batch
// keeps its last image (one statement may not upsert a key twice).
std::vector<pg::Step> batchSteps(const StoreBatch& batch);

// Every table, decoded and checked (a body must decode and hold its row's key; kCorruption
// naming the table and key otherwise), in StoreContents' orders. Inside the caller's read
// transaction.
Status readContents(pg::Connection& connection, uint64_t body_bytes_max, StoreContents* out);

}  // namespace tally::ledger::postgres_rows
