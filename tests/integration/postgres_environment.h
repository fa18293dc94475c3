#pragma once

#include <string>

#include "tests/support/postgres_server.h"

// The PostgreSQL behind tally_postgres_integration_tests: one server for the whole binary
// (started before the first test, stopped after the last), and a fresh database for every
// ledger data dir the tests use, so each test starts from an empty store as it would with
// SQLite. Installed as the ledger store provider (tests/support/ledger_store_args.h): every
// LedgerInstance of this binary runs with --store postgres.

namespace tally::testing {

PostgresServer& sharedPostgres();
// The connection string the ledger on `data_dir` uses (creating its database the first time).
std::string conninfoFor(const std::string& data_dir);
// Points `data_dir`'s ledger at `conninfo` instead (before its first start).
void assignConninfo(const std::string& data_dir, const std::string& conninfo);

}  // namespace tally::testing
