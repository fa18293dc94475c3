// tally-ledger's config loader (ledger/config.h): any file → a config or an error naming the key.
// Checks: no crash or assertion; an error has a message; validateConfig() of whatever was applied
// answers without crashing.

#include "ledger/config.h"
#include "tests/fuzz/fuzz_support.h"

using namespace tally;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ledger::LedgerConfig config;
  config.data_dir = "/nonexistent/fuzz";
  const Status status = ledger::applyConfigFile(fuzz::memoryFile({data, size}), &config);
  if (!status.isOk()) {
    if (status.message().empty()) fuzz::fail("an error without a message");
    return 0;
  }
  (void)ledger::validateConfig(config);
  return 0;
}
