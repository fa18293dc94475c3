// tallyctl: the operator's and scripts' client of tally-ledger and tally-agent. The command
// line, JSON fields and exit codes are an external contract: see usageText() in args.cc.

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "central-client/blocking_client.h"
#include "central-client/ledger_addresses.h"
#include "ctl/args.h"
#include "ctl/commands.h"

namespace {

void write(std::FILE* stream, const std::string& text) {
  if (!text.empty()) std::fwrite(text.data(), 1, text.size(), stream);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace tally;
  const std::vector<std::string_view> args(argv + 1, argv + argc);
  Result<ctl::Invocation> parsed = ctl::parseArgs(args);
  if (!parsed.isOk()) {
    const ctl::CommandOutput output =
        ctl::renderUsageError(parsed.status(), ctl::jsonRequested(args));
    write(stdout, output.out);
    write(stderr, output.err);
    (void)std::fflush(stdout);  // the exit code already says the command failed
    return output.exit_code;
  }
  const ctl::Invocation& invocation = parsed.value();

  // One connection per invocation, opened only once the request is known to be valid. The
  // timeout covers connecting and the call together.
  const ctl::CallFn call = [&invocation](const wire::RequestBody& body) -> Result<wire::Response> {
    if (!invocation.ledgers.empty()) {
      return client::callThePrimary(invocation.ledgers, body, invocation.timeout_ms);
    }
    const auto started = std::chrono::steady_clock::now();
    Result<std::unique_ptr<client::BlockingClient>> connection =
        client::BlockingClient::connect(invocation.endpoint, invocation.timeout_ms);
    if (!connection.isOk()) return connection.status();
    const auto spent_ms =
        static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                  std::chrono::steady_clock::now() - started)
                                  .count());
    const uint64_t left_ms =
        spent_ms < invocation.timeout_ms ? invocation.timeout_ms - spent_ms : 1;
    return connection.value()->call(body, left_ms);
  };

  const ctl::CommandOutput output = ctl::runCommand(invocation, call);
  write(stdout, output.out);
  write(stderr, output.err);
  if (std::fflush(stdout) != 0 && output.exit_code == ctl::kExitOk) return ctl::kExitInternal;
  return output.exit_code;
}
