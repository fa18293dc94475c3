#include "tests/support/ledger_store_args.h"

#include <utility>

namespace tally::testing {

namespace {

LedgerStoreArgsProvider& provider() {
  static LedgerStoreArgsProvider installed;
  return installed;
}

}  // namespace

void setLedgerStoreArgsProvider(LedgerStoreArgsProvider installed) {
  provider() = std::move(installed);
}

std::vector<std::string> ledgerStoreArgs(const std::string& data_dir) {
  return provider() ? provider()(data_dir) : std::vector<std::string>{};
}

}  // namespace tally::testing
