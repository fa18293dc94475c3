#pragma once

#include <functional>
#include <string>

#include "core/status.h"
#include "ctl/args.h"
#include "ctl/exit_codes.h"
#include "wire/codec.h"

// Running one tallyctl invocation: the request it sends, and what it prints and exits with for
// the answer. The transport is passed in (`CallFn`), so everything here runs in tests without a
// ledger.

namespace tally::ctl {

// Sends one request and returns its response (or kUnavailable/kCorruption/…).
using CallFn = std::function<Result<wire::Response>(const wire::RequestBody&)>;

struct CommandOutput {
  int exit_code = kExitOk;
  std::string out;  // for stdout
  std::string err;  // for stderr
};

// The request a network command sends. `policy publish` reads and parses its file here, so a
// bad file is an error (kInvalidArgument/kIoError, exit 2) before anything is sent. `reserve`
// without --digest gets wire::canonicalRequestDigest() of its fields.
Result<wire::RequestBody> buildRequest(const Invocation& invocation);

// What to print and exit with for `answer`, the outcome of sending `invocation`'s request.
CommandOutput renderAnswer(const Invocation& invocation, const Result<wire::Response>& answer);

// The whole command: help/version locally; otherwise buildRequest(), `call`, renderAnswer().
// With --json every outcome, help and version included, is exactly one JSON object on stdout.
CommandOutput runCommand(const Invocation& invocation, const CallFn& call);

// A command line parseArgs() refused (`status`): exit 2, the message on stderr and, with `json`
// (jsonRequested()), {"error":true,"code":"USAGE","message":…} on stdout.
CommandOutput renderUsageError(const Status& status, bool json);

}  // namespace tally::ctl
