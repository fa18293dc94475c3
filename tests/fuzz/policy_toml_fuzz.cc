// The policy TOML loader (ctl/policy_toml.h): any text → a validated Policy or an error naming
// where. Checks: no crash or assertion; an accepted policy passes validatePolicy() and survives
// policyToToml() → parsePolicyToml() unchanged (what tallyctl writes, it reads back); and the
// ledger accepts what the loader accepted (publishPolicy answers OK).

#include <string_view>

#include "core/ledger.h"
#include "ctl/policy_toml.h"
#include "tests/fuzz/fuzz_support.h"

using namespace tally;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  Result<Policy> policy = ctl::parsePolicyToml(text, "fuzz.toml");
  if (!policy.isOk()) {
    if (policy.status().message().empty()) fuzz::fail("an error without a message");
    return 0;
  }
  if (Status valid = validatePolicy(policy.value()); !valid.isOk()) {
    fuzz::fail("the loader accepted an invalid policy", valid.toString());
  }
  const std::string written = ctl::policyToToml(policy.value());
  Result<Policy> again = ctl::parsePolicyToml(written, "written.toml");
  if (!again.isOk())
    fuzz::fail("policyToToml wrote what the loader refuses", again.status().toString());
  if (!(again.value() == policy.value())) fuzz::fail("policyToToml does not round-trip", written);
  Ledger ledger;
  const PolicyReply reply = ledger.publishPolicy(policy.value(), fuzz::kT0Ms);
  if (reply.code != ReplyCode::kOk)
    fuzz::fail("the ledger refuses an accepted policy", reply.message);
  return 0;
}
