// tally-agent's config loader (agent/config.h): any file → a config or an error naming the key.
// Checks: no crash or assertion; an error has a message; the defaults and validateConfig() of
// whatever was applied answer without crashing.

#include "agent/config.h"
#include "tests/fuzz/fuzz_support.h"

using namespace tally;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  agent::AgentConfig config;
  config.data_dir = "/nonexistent/fuzz";
  const Status status = agent::applyConfigFile(fuzz::memoryFile({data, size}), &config);
  if (!status.isOk()) {
    if (status.message().empty()) fuzz::fail("an error without a message");
    return 0;
  }
  agent::applyDefaultPeers(&config, 1000, 1000);
  (void)agent::validateConfig(config);
  return 0;
}
