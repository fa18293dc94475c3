#pragma once

#include "core/ledger_types.h"

// tallyctl's exit codes. 0-6 are an external contract (scripts and outside checks rely on
// them); 7 and up are tallyctl's own, documented in `tallyctl --help`.

namespace tally::ctl {

enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,      // a bug in tallyctl itself
  kExitUsage = 2,         // bad command line or policy file; INVALID_ARGUMENT from the peer
  kExitAuditFailed = 3,   // audit: conservation fails somewhere
  kExitRejected = 4,      // REJECTED: admission refused
  kExitConflict = 5,      // IDEMPOTENCY_CONFLICT, OPERATION_CONFLICT, EXPIRED (a lost CAS)
  kExitUnavailable = 6,   // cannot connect, timeout, connection lost, peer says unavailable
  kExitNotFound = 7,      // NOT_FOUND
  kExitInvalidState = 8,  // INVALID_STATE
  kExitRefused = 9,       // RESOURCE_EXHAUSTED or ARITHMETIC_OVERFLOW: the ledger changed nothing
  kExitProtocol = 10,     // malformed or unexpected answer; peer error other than the above
  // ShardReply.permission_denied (unknown/disabled gateway, bad key), a refused TLS link, an
  // agent socket that refuses the connect (EACCES) or the peer (PERMISSION_DENIED reply).
  kExitPermissionDenied = 11,
};

// The exit code for a ledger reply code.
constexpr ExitCode exitCodeFor(ReplyCode code) {
  switch (code) {
    case ReplyCode::kOk: return kExitOk;
    case ReplyCode::kRejected: return kExitRejected;
    case ReplyCode::kIdempotencyConflict:
    case ReplyCode::kOperationConflict:
    case ReplyCode::kExpired: return kExitConflict;
    case ReplyCode::kInvalidState: return kExitInvalidState;
    case ReplyCode::kNotFound: return kExitNotFound;
    case ReplyCode::kInvalidArgument: return kExitUsage;
    case ReplyCode::kResourceExhausted:
    case ReplyCode::kArithmeticOverflow: return kExitRefused;
    case ReplyCode::kQueued: return kExitOk;  // durably queued at the agent
  }
  return kExitProtocol;
}

// A shard answer: permission denied (exit 11) whatever its code, else by its code.
inline ExitCode exitCodeFor(const ShardReply& reply) {
  return reply.permission_denied ? kExitPermissionDenied : exitCodeFor(reply.code);
}

}  // namespace tally::ctl
