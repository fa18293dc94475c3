#pragma once

#include <functional>
#include <string>
#include <vector>

// Which store the tally-ledger processes of the integration tests use. By default none is named
// (the ledger's default, SQLite under the data dir). A test binary that runs the same tests
// against another store (tests/integration/postgres_environment.cc) installs a provider once,
// before any test starts; LedgerInstance appends what it returns for its data dir to every
// start's arguments, so one data dir keeps its own store across restarts.

namespace tally::testing {

using LedgerStoreArgsProvider =
    std::function<std::vector<std::string>(const std::string& data_dir)>;

void setLedgerStoreArgsProvider(LedgerStoreArgsProvider provider);
// The provider's arguments for `data_dir`, or none.
std::vector<std::string> ledgerStoreArgs(const std::string& data_dir);

}  // namespace tally::testing
