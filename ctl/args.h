#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "central-client/blocking_client.h"
#include "core/limits.h"
#include "core/shard_types.h"
#include "core/status.h"
#include "core/types.h"

// tallyctl's command line (the contract is in usageText()). Parsing is pure: it reads no file
// and opens no socket, so every usage error is found before anything is sent.

namespace tally::ctl {

inline constexpr std::string_view kDefaultLedger = "127.0.0.1:7411";
inline constexpr uint64_t kDefaultTimeoutMs = 5000;
inline constexpr uint64_t kTimeoutMsMax = 24ull * 3600 * 1000;

enum class Command : uint8_t {
  kHelp = 0,
  kVersion,
  kHealth,
  kPolicyPublish,
  kPolicyRollback,
  kPolicyShow,
  kReserve,
  kStart,
  kSettle,
  kRelease,
  kMarkUnknown,  // `unknown`: STARTED -> USAGE_UNKNOWN
  kReport,       // `report`: an operation receipt
  kQuery,
  kAudit,
  kGatewayEnroll,
  kGatewayList,
  kGatewayDisable,
  kGatewayEnable,
  kShardList,
  kShardRevoke,
  kShardWriteOff,
  kExtend,         // `extend`: a STARTED reservation grows to a new total (streaming top-up)
  kGatewayRotate,  // `gateway rotate`: a new key, the old one admitted for an overlap window
  kOperatorEnroll,
  kOperatorList,
  kOperatorDisable,
  kOperatorEnable,
  kOperatorKeygen,  // no request: creates the --key FILE if absent and prints its public key
  kAuditLog,        // `audit-log`: the privileged actions the ledger recorded
};

// The command word(s) as typed, e.g. "policy publish", "unknown".
const char* commandName(Command command);

struct Invocation {
  client::Endpoint endpoint;  // --ledger (default kDefaultLedger) or --agent
  // --ledger HOST:PORT,HOST:PORT: every address (endpoint is the first); empty with --agent.
  std::vector<client::Endpoint> ledgers;
  // --partitions MAP (core/partition_map.h, "A1,A2;B1,B2"): every partition's ledger addresses,
  // in partition order; `audit` sums the fleet (ctl/partitioned.h). Empty otherwise.
  std::vector<std::vector<client::Endpoint>> partitions;
  bool json = false;
  uint64_t timeout_ms = kDefaultTimeoutMs;
  Command command = Command::kHelp;
  // The link to a ledger (--ledger) is TLS: key_file is the operator key (--key FILE: the
  // ledger's DIR/operator.key), ledger_key pins the ledger (--ledger-key BASE64|FILE; default
  // the public half of ledger.key beside key_file). --insecure: plaintext. --agent: neither.
  bool insecure = false;
  std::string key_file;
  std::string ledger_key;

  std::string policy_file;    // policy publish FILE
  Generation generation = 0;  // policy show --generation (0: active)
  std::string reservation_id;
  std::string subject;  // reserve; audit filter (empty: all)
  std::string route;    // reserve; audit filter (empty: all)
  std::string operation_id;
  Units units = 0;
  Units actual_units = 0;
  Units total_units = 0;         // extend --total: the reservation's new total
  std::optional<Digest> digest;  // reserve --digest; absent: computed from the request
  uint32_t priority = 0;
  std::string region;  // reserve --region; "" = none

  // gateway enroll/disable/enable --id NAME; shard list/revoke --gateway NAME.
  std::string gateway_name;
  std::optional<PublicKey> public_key;  // gateway enroll/rotate --public-key BASE64
  uint64_t overlap_ms = limits::kGatewayKeyOverlapMsDefault;  // gateway rotate --overlap-ms
  std::string shard_id;                                       // shard revoke/write-off --id ID
  std::optional<ShardState> shard_state;                      // shard list --state S

  std::string operator_name;                          // operator enroll/disable/enable --id NAME
  OperatorRole operator_role = OperatorRole::kAudit;  // operator enroll --role ROLE
  uint64_t after_sequence = 0;                        // audit-log --after N
  uint32_t entries_max = 0;  // audit-log --limit N (0: the ledger's maximum)

  std::optional<uint64_t> period;  // audit --period EPOCH: that closed accounting period
  bool list_periods = false;       // audit --periods: the closed accounting periods kept
};

// Parses the arguments after argv[0]. Global flags (--ledger, --agent, --json, --timeout-ms)
// may stand before or after the command; `--flag=value` and `--flag value` are both accepted.
// --help anywhere yields Command::kHelp, --version Command::kVersion. Every usage error is
// kInvalidArgument with a message fit for stderr.
Result<Invocation> parseArgs(std::span<const std::string_view> args);

// Whether --json stands anywhere among the flags (not as another flag's value, not after "--"),
// even on a line parseArgs() refuses: how a usage error is to be printed.
bool jsonRequested(std::span<const std::string_view> args);

// The text `tallyctl --help` prints: synopsis, commands, flags, JSON fields, exit codes.
std::string usageText();

}  // namespace tally::ctl
