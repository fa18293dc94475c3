#include "ctl/args.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <map>
#include <vector>

#include "central-client/ledger_addresses.h"
#include "core/limits.h"
#include "core/partition_map.h"
#include "shard/identity.h"
#include "wire/codec.h"
#include "wire/digest.h"

namespace tally::ctl {
namespace {

// Command flags; every one takes a value.
enum class Flag : uint8_t {
  kId,
  kSubject,
  kRoute,
  kUnits,
  kDigest,
  kPriority,
  kOperation,
  kActual,
  kGeneration,
  kPublicKey,
  kGateway,
  kState,
  kRegion,
  kPeriod,
  kPeriods,  // the one command flag without a value (audit --periods)
  kTotal,
  kOverlapMs,
  kRole,
  kAfter,
  kLimit,
};

struct FlagName {
  std::string_view name;
  Flag flag;
};
constexpr FlagName kFlags[] = {
    {"id", Flag::kId},
    {"subject", Flag::kSubject},
    {"route", Flag::kRoute},
    {"units", Flag::kUnits},
    {"digest", Flag::kDigest},
    {"priority", Flag::kPriority},
    {"operation", Flag::kOperation},
    {"actual", Flag::kActual},
    {"generation", Flag::kGeneration},
    {"public-key", Flag::kPublicKey},
    {"gateway", Flag::kGateway},
    {"state", Flag::kState},
    {"region", Flag::kRegion},
    {"period", Flag::kPeriod},
    {"periods", Flag::kPeriods},
    {"total", Flag::kTotal},
    {"overlap-ms", Flag::kOverlapMs},
    {"role", Flag::kRole},
    {"after", Flag::kAfter},
    {"limit", Flag::kLimit},
};

struct CommandSpec {
  Command command;
  std::vector<Flag> required;
  std::vector<Flag> optional;
};

const CommandSpec& specFor(Command command) {
  using F = Flag;
  static const CommandSpec kSpecs[] = {
      {Command::kHelp, {}, {}},
      {Command::kVersion, {}, {}},
      {Command::kHealth, {}, {}},
      {Command::kPolicyPublish, {}, {}},
      {Command::kPolicyRollback, {}, {}},
      {Command::kPolicyShow, {}, {F::kGeneration}},
      {Command::kReserve,
       {F::kId, F::kSubject, F::kRoute, F::kUnits},
       {F::kDigest, F::kPriority, F::kRegion}},
      {Command::kStart, {F::kId, F::kOperation}, {}},
      {Command::kSettle, {F::kId, F::kOperation, F::kActual}, {}},
      {Command::kRelease, {F::kId}, {}},
      {Command::kMarkUnknown, {F::kId, F::kOperation}, {}},
      {Command::kReport, {F::kId, F::kOperation, F::kActual}, {}},
      {Command::kQuery, {F::kId}, {}},
      {Command::kAudit, {}, {F::kSubject, F::kRoute, F::kPeriod, F::kPeriods}},
      {Command::kGatewayEnroll, {F::kId, F::kPublicKey}, {}},
      {Command::kGatewayList, {}, {}},
      {Command::kGatewayDisable, {F::kId}, {}},
      {Command::kGatewayEnable, {F::kId}, {}},
      {Command::kShardList, {}, {F::kGateway, F::kState}},
      {Command::kShardRevoke, {}, {F::kId, F::kGateway}},  // exactly one: checkShardRevoke()
      {Command::kShardWriteOff, {F::kId}, {}},
      {Command::kExtend, {F::kId, F::kOperation, F::kTotal}, {}},
      {Command::kGatewayRotate, {F::kId, F::kPublicKey}, {F::kOverlapMs}},
      {Command::kOperatorEnroll, {F::kId, F::kPublicKey, F::kRole}, {}},
      {Command::kOperatorList, {}, {}},
      {Command::kOperatorDisable, {F::kId}, {}},
      {Command::kOperatorEnable, {F::kId}, {}},
      {Command::kOperatorKeygen, {}, {}},
      {Command::kAuditLog, {}, {F::kAfter, F::kLimit}},
  };
  for (const CommandSpec& spec : kSpecs) {
    if (spec.command == command) return spec;
  }
  TALLY_UNREACHABLE();
}

std::string flagText(Flag flag) {
  for (const FlagName& entry : kFlags) {
    if (entry.flag == flag) return "--" + std::string(entry.name);
  }
  TALLY_UNREACHABLE();
}

Status usage(std::string message) { return Status::invalidArgument(std::move(message)); }

// A decimal integer in [min, max]; no sign, no spaces, no hex.
Status parseNumber(std::string_view flag, std::string_view text, uint64_t min, uint64_t max,
                   uint64_t* out) {
  const std::string quoted = "'" + std::string(text) + "'";
  if (!text.empty() && text.front() == '-') {
    return usage(std::string(flag) + " must not be negative, got " + quoted);
  }
  uint64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || end != text.data() + text.size() ||
      (error != std::errc() && error != std::errc::result_out_of_range)) {
    return usage(std::string(flag) + " must be a non-negative integer, got " + quoted);
  }
  if (error == std::errc::result_out_of_range || value > max) {
    return usage(std::string(flag) + " is too large: " + quoted + " (maximum " +
                 std::to_string(max) + ")");
  }
  if (value < min) {
    return usage(std::string(flag) + " must be at least " + std::to_string(min) + ", got " +
                 quoted);
  }
  *out = value;
  return Status::ok();
}

Status checkText(std::string_view flag, const std::string& value, uint64_t bytes_max) {
  if (value.empty()) return usage(std::string(flag) + " must not be empty");
  if (value.size() > bytes_max) {
    return usage(std::string(flag) + " is longer than " + std::to_string(bytes_max) + " bytes");
  }
  return Status::ok();
}

bool isGatewayCommand(Command command) {
  return command == Command::kGatewayEnroll || command == Command::kGatewayList ||
         command == Command::kGatewayDisable || command == Command::kGatewayEnable ||
         command == Command::kGatewayRotate;
}

bool isShardCommand(Command command) {
  return command == Command::kShardList || command == Command::kShardRevoke ||
         command == Command::kShardWriteOff;
}

bool isOperatorCommand(Command command) {
  return command == Command::kOperatorEnroll || command == Command::kOperatorDisable ||
         command == Command::kOperatorEnable;
}

Status applyGatewayName(std::string_view flag, const std::string& value, Invocation* inv) {
  inv->gateway_name = value;
  if (Status valid = identity::validateGatewayName(value); !valid.isOk()) {
    return usage(std::string(flag) + ": " + valid.message());
  }
  return Status::ok();
}

Status applyShardState(const std::string& value, Invocation* inv) {
  std::string upper = value;
  std::transform(upper.begin(), upper.end(), upper.begin(),
                 [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  ShardState state = ShardState::kIssued;
  if (!parseShardState(upper, &state)) {
    std::string names;
    for (int i = 0; i < kShardStateCount; ++i) {
      names += std::string(i == 0 ? "" : ", ") + shardStateName(static_cast<ShardState>(i));
    }
    return usage("--state must be one of " + names + ", got '" + value + "'");
  }
  inv->shard_state = state;
  return Status::ok();
}

// --id names a reservation, a gateway or a shard, depending on the command.
Status applyId(const std::string& value, Invocation* inv) {
  if (isGatewayCommand(inv->command)) return applyGatewayName("--id", value, inv);
  if (isOperatorCommand(inv->command)) {
    inv->operator_name = value;
    return checkText("--id", value, limits::kOperatorNameBytesMax);
  }
  if (isShardCommand(inv->command)) {
    inv->shard_id = value;
    return checkText("--id", value, wire::kOriginBytesMax);
  }
  inv->reservation_id = value;
  return checkText("--id", value, limits::kReservationIdBytesMax);
}

// Stores one command flag's value in the invocation, checking it.
Status applyFlag(Flag flag, const std::string& value, Invocation* inv) {
  const std::string name = flagText(flag);
  uint64_t number = 0;
  switch (flag) {
    case Flag::kId: return applyId(value, inv);
    case Flag::kGateway: return applyGatewayName(name, value, inv);
    case Flag::kState: return applyShardState(value, inv);
    case Flag::kPublicKey: {
      Result<PublicKey> key = identity::decodePublicKey(value);
      if (!key.isOk()) return usage("--public-key: " + key.status().message());
      inv->public_key = key.value();
      return Status::ok();
    }
    case Flag::kSubject:
      inv->subject = value;
      return checkText(name, value, limits::kSubjectBytesMax);
    case Flag::kRoute: inv->route = value; return checkText(name, value, limits::kRouteBytesMax);
    case Flag::kRegion: inv->region = value; return checkText(name, value, limits::kRegionBytesMax);
    case Flag::kOperation:
      inv->operation_id = value;
      return checkText(name, value, limits::kOperationIdBytesMax);
    case Flag::kUnits: return parseNumber(name, value, 1, UINT64_MAX, &inv->units);
    case Flag::kActual: return parseNumber(name, value, 0, UINT64_MAX, &inv->actual_units);
    case Flag::kTotal: return parseNumber(name, value, 1, UINT64_MAX, &inv->total_units);
    case Flag::kOverlapMs:
      return parseNumber(name, value, 0, limits::kGatewayKeyOverlapMsMax, &inv->overlap_ms);
    case Flag::kRole: {
      std::optional<OperatorRole> role = parseOperatorRole(value);
      if (!role)
        return usage("--role must be one of audit, policy, shards, admin, got '" + value + "'");
      inv->operator_role = *role;
      return Status::ok();
    }
    case Flag::kAfter: return parseNumber(name, value, 0, UINT64_MAX, &inv->after_sequence);
    case Flag::kLimit: {
      Status s = parseNumber(name, value, 1, limits::kAuditLogEntriesPerReplyMax, &number);
      inv->entries_max = static_cast<uint32_t>(number);
      return s;
    }
    case Flag::kGeneration: return parseNumber(name, value, 0, UINT64_MAX, &inv->generation);
    case Flag::kPeriod: {
      Status s = parseNumber(name, value, 0, UINT64_MAX, &number);
      inv->period = number;
      return s;
    }
    case Flag::kPeriods: inv->list_periods = true; return Status::ok();
    case Flag::kPriority: {
      Status s = parseNumber(name, value, 0, UINT32_MAX, &number);
      inv->priority = static_cast<uint32_t>(number);
      return s;
    }
    case Flag::kDigest: {
      Result<Digest> digest = wire::parseDigestHex(value);
      if (!digest.isOk()) {
        return usage("--digest must be exactly 64 hexadecimal characters (a sha256), got '" +
                     value + "'");
      }
      inv->digest = digest.value();
      return Status::ok();
    }
  }
  TALLY_UNREACHABLE();
}

// What a first pass over argv collects.
struct Scanned {
  bool help = false;
  bool version = false;
  bool json = false;
  std::optional<std::string> ledger;
  std::optional<std::string> partitions;
  std::optional<std::string> agent;
  std::optional<std::string> timeout_ms;
  std::optional<std::string> key;
  std::optional<std::string> ledger_key;
  bool insecure = false;
  std::vector<std::string> positionals;
  std::vector<std::pair<Flag, std::string>> flags;  // in order
};

bool isGlobalValueFlag(std::string_view name) {
  return name == "ledger" || name == "agent" || name == "timeout-ms" || name == "key" ||
         name == "ledger-key" || name == "partitions";
}

const FlagName* commandFlag(std::string_view name) {
  for (const FlagName& entry : kFlags) {
    if (entry.name == name) return &entry;
  }
  return nullptr;
}

Status setOnce(std::optional<std::string>* slot, std::string_view name, std::string value) {
  if (slot->has_value()) return usage("--" + std::string(name) + " given twice");
  *slot = std::move(value);
  return Status::ok();
}

// One flag at args[*i] (advanced past its value, if it takes one).
Status scanFlag(std::span<const std::string_view> args, size_t* i, Scanned* out) {
  const std::string_view arg = args[*i];
  if (arg == "-h") {
    out->help = true;
    return Status::ok();
  }
  if (!arg.starts_with("--")) return usage("unknown flag '" + std::string(arg) + "'");
  const size_t equals = arg.find('=');
  const std::string_view name =
      arg.substr(2, equals == std::string_view::npos ? arg.npos : equals - 2);
  const bool has_inline = equals != std::string_view::npos;
  if (name == "insecure") {
    if (has_inline) return usage("--insecure takes no value");
    out->insecure = true;
    return Status::ok();
  }
  if (name == "help" || name == "version" || name == "json") {
    if (has_inline) return usage("--" + std::string(name) + " takes no value");
    (name == "help" ? out->help : name == "version" ? out->version : out->json) = true;
    return Status::ok();
  }
  const FlagName* command_flag = commandFlag(name);
  if (!isGlobalValueFlag(name) && command_flag == nullptr) {
    return usage("unknown flag '--" + std::string(name) + "'");
  }
  std::string value;
  if (command_flag != nullptr && command_flag->flag == Flag::kPeriods) {
    if (has_inline) return usage("--periods takes no value");
    out->flags.emplace_back(Flag::kPeriods, std::string());
    return Status::ok();
  }
  if (has_inline) {
    value = std::string(arg.substr(equals + 1));
  } else if (*i + 1 < args.size()) {
    value = std::string(args[++*i]);
  } else {
    return usage("--" + std::string(name) + " needs a value");
  }
  if (name == "ledger") {
    if (Status s = setOnce(&out->ledger, name, value); !s.isOk()) return s;
  } else if (name == "agent") {
    if (Status s = setOnce(&out->agent, name, value); !s.isOk()) return s;
  } else if (name == "partitions") {
    if (Status s = setOnce(&out->partitions, name, value); !s.isOk()) return s;
  } else if (name == "timeout-ms") {
    if (Status s = setOnce(&out->timeout_ms, name, value); !s.isOk()) return s;
  } else if (name == "key") {
    if (Status s = setOnce(&out->key, name, value); !s.isOk()) return s;
  } else if (name == "ledger-key") {
    if (Status s = setOnce(&out->ledger_key, name, value); !s.isOk()) return s;
  } else {
    out->flags.emplace_back(command_flag->flag, std::move(value));
  }
  return Status::ok();
}

// Reads the whole line even past a mistake (so that a --json after it still counts) and returns
// the first mistake.
Status scan(std::span<const std::string_view> args, Scanned* out) {
  Status first_error;
  bool only_positionals = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string_view arg = args[i];
    if (only_positionals || arg == "-" || arg.empty() || arg.front() != '-') {
      out->positionals.emplace_back(arg);
    } else if (arg == "--") {
      only_positionals = true;
    } else if (Status s = scanFlag(args, &i, out); !s.isOk() && first_error.isOk()) {
      first_error = std::move(s);
    }
  }
  return first_error;
}

// --partitions MAP: each partition's addresses as endpoints; the first partition's first address
// is the endpoint (the TLS options are the same for every address).
Status applyPartitions(const std::string& text, Invocation* inv) {
  Result<PartitionMap> map = parsePartitionMap(text);
  if (!map.isOk()) return usage("--partitions: " + map.status().message());
  for (size_t i = 0; i < map.value().partitions.size(); ++i) {
    std::vector<client::Endpoint>& endpoints = inv->partitions.emplace_back();
    for (const std::string& address : map.value().partitions[i]) {
      Result<client::Endpoint> endpoint = client::parseTcpEndpoint(address);
      if (!endpoint.isOk()) {
        return usage("--partitions: partition " + std::to_string(i) + ": " +
                     endpoint.status().message());
      }
      endpoints.push_back(std::move(endpoint).value());
    }
  }
  inv->ledgers = inv->partitions.front();
  inv->endpoint = inv->ledgers.front();
  return Status::ok();
}

Status applyGlobals(const Scanned& scanned, Invocation* inv) {
  inv->json = scanned.json;
  inv->insecure = scanned.insecure;
  inv->key_file = scanned.key.value_or("");
  inv->ledger_key = scanned.ledger_key.value_or("");
  if (scanned.ledger && scanned.agent) return usage("--ledger and --agent exclude each other");
  if (scanned.partitions && (scanned.ledger || scanned.agent)) {
    return usage("--partitions excludes --ledger and --agent");
  }
  if (scanned.partitions) {
    if (Status s = applyPartitions(*scanned.partitions, inv); !s.isOk()) return s;
  } else if (scanned.agent) {
    Result<client::Endpoint> endpoint = client::unixEndpoint(*scanned.agent);
    if (!endpoint.isOk()) return usage("--agent: " + endpoint.status().message());
    inv->endpoint = std::move(endpoint).value();
  } else {
    Result<std::vector<client::Endpoint>> ledgers = client::parseLedgerAddresses(
        scanned.ledger ? *scanned.ledger : std::string(kDefaultLedger));
    if (!ledgers.isOk()) return usage("--ledger: " + ledgers.status().message());
    inv->ledgers = std::move(ledgers).value();
    inv->endpoint = inv->ledgers.front();
  }
  if (scanned.timeout_ms) {
    return parseNumber("--timeout-ms", *scanned.timeout_ms, 1, kTimeoutMsMax, &inv->timeout_ms);
  }
  return Status::ok();
}

// The command named by the positionals; publish also takes its FILE.
Status resolveCommand(const std::vector<std::string>& words, Invocation* inv) {
  if (words.empty()) return usage("no command given");
  static const std::map<std::string_view, Command> kSimple = {
      {"help", Command::kHelp},          {"version", Command::kVersion},
      {"health", Command::kHealth},      {"reserve", Command::kReserve},
      {"start", Command::kStart},        {"settle", Command::kSettle},
      {"release", Command::kRelease},    {"unknown", Command::kMarkUnknown},
      {"report", Command::kReport},      {"query", Command::kQuery},
      {"audit", Command::kAudit},        {"extend", Command::kExtend},
      {"audit-log", Command::kAuditLog},
  };
  size_t used = 1;
  static const std::map<std::string_view, Command> kGateway = {
      {"enroll", Command::kGatewayEnroll},   {"list", Command::kGatewayList},
      {"disable", Command::kGatewayDisable}, {"enable", Command::kGatewayEnable},
      {"rotate", Command::kGatewayRotate},
  };
  static const std::map<std::string_view, Command> kShard = {
      {"list", Command::kShardList},
      {"revoke", Command::kShardRevoke},
      {"write-off", Command::kShardWriteOff},
  };
  static const std::map<std::string_view, Command> kOperator = {
      {"enroll", Command::kOperatorEnroll},   {"list", Command::kOperatorList},
      {"disable", Command::kOperatorDisable}, {"enable", Command::kOperatorEnable},
      {"keygen", Command::kOperatorKeygen},
  };
  if (words[0] == "gateway" || words[0] == "shard" || words[0] == "operator") {
    const bool gateway = words[0] == "gateway";
    const bool op = words[0] == "operator";
    const char* expected = gateway ? "enroll, list, disable, enable or rotate"
                           : op    ? "enroll, list, disable, enable or keygen"
                                   : "list, revoke or write-off";
    if (words.size() < 2) return usage("'" + words[0] + "' needs a subcommand: " + expected);
    const auto& table = gateway ? kGateway : op ? kOperator : kShard;
    const auto it = table.find(words[1]);
    if (it == table.end()) {
      return usage("unknown " + words[0] + " subcommand '" + words[1] + "' (expected " + expected +
                   ")");
    }
    inv->command = it->second;
    used = 2;
  } else if (words[0] == "policy") {
    if (words.size() < 2) return usage("'policy' needs a subcommand: publish, rollback or show");
    if (words[1] == "publish") {
      if (words.size() < 3) return usage("'policy publish' needs a FILE.toml");
      inv->command = Command::kPolicyPublish;
      inv->policy_file = words[2];
      used = 3;
    } else if (words[1] == "rollback") {
      inv->command = Command::kPolicyRollback;
      used = 2;
    } else if (words[1] == "show") {
      inv->command = Command::kPolicyShow;
      used = 2;
    } else {
      return usage("unknown policy subcommand '" + words[1] +
                   "' (expected publish, rollback or show)");
    }
  } else if (auto it = kSimple.find(words[0]); it != kSimple.end()) {
    inv->command = it->second;
  } else {
    return usage("unknown command '" + words[0] + "'");
  }
  if (words.size() > used) {
    return usage("unexpected argument '" + words[used] + "' after '" + commandName(inv->command) +
                 "'");
  }
  return Status::ok();
}

Status applyCommandFlags(const Scanned& scanned, Invocation* inv) {
  const CommandSpec& spec = specFor(inv->command);
  std::vector<Flag> seen;
  for (const auto& [flag, value] : scanned.flags) {
    const bool allowed =
        std::find(spec.required.begin(), spec.required.end(), flag) != spec.required.end() ||
        std::find(spec.optional.begin(), spec.optional.end(), flag) != spec.optional.end();
    if (!allowed) {
      return usage("'" + std::string(commandName(inv->command)) + "' takes no " + flagText(flag));
    }
    if (std::find(seen.begin(), seen.end(), flag) != seen.end()) {
      return usage(flagText(flag) + " given twice");
    }
    seen.push_back(flag);
    if (Status s = applyFlag(flag, value, inv); !s.isOk()) return s;
  }
  for (Flag flag : spec.required) {
    if (std::find(seen.begin(), seen.end(), flag) == seen.end()) {
      return usage("'" + std::string(commandName(inv->command)) + "' needs " + flagText(flag));
    }
  }
  if (inv->command == Command::kOperatorKeygen && inv->key_file.empty()) {
    return usage("'operator keygen' needs --key FILE: the key file to create");
  }
  if (inv->command == Command::kShardRevoke && inv->shard_id.empty() == inv->gateway_name.empty()) {
    return usage("'shard revoke' needs exactly one of --id and --gateway");
  }
  return Status::ok();
}

}  // namespace

const char* commandName(Command command) {
  switch (command) {
    case Command::kHelp: return "help";
    case Command::kVersion: return "version";
    case Command::kHealth: return "health";
    case Command::kPolicyPublish: return "policy publish";
    case Command::kPolicyRollback: return "policy rollback";
    case Command::kPolicyShow: return "policy show";
    case Command::kReserve: return "reserve";
    case Command::kStart: return "start";
    case Command::kSettle: return "settle";
    case Command::kRelease: return "release";
    case Command::kMarkUnknown: return "unknown";
    case Command::kReport: return "report";
    case Command::kQuery: return "query";
    case Command::kAudit: return "audit";
    case Command::kGatewayEnroll: return "gateway enroll";
    case Command::kGatewayList: return "gateway list";
    case Command::kGatewayDisable: return "gateway disable";
    case Command::kGatewayEnable: return "gateway enable";
    case Command::kShardList: return "shard list";
    case Command::kShardRevoke: return "shard revoke";
    case Command::kShardWriteOff: return "shard write-off";
    case Command::kExtend: return "extend";
    case Command::kGatewayRotate: return "gateway rotate";
    case Command::kOperatorEnroll: return "operator enroll";
    case Command::kOperatorList: return "operator list";
    case Command::kOperatorDisable: return "operator disable";
    case Command::kOperatorEnable: return "operator enable";
    case Command::kOperatorKeygen: return "operator keygen";
    case Command::kAuditLog: return "audit-log";
  }
  return "?";
}

bool jsonRequested(std::span<const std::string_view> args) {
  Scanned scanned;
  (void)scan(args, &scanned);  // a mistake elsewhere on the line does not hide --json
  return scanned.json;
}

Result<Invocation> parseArgs(std::span<const std::string_view> args) {
  Invocation inv;
  inv.json = jsonRequested(args);
  // --help and --version win over everything else on the line, even a mistake.
  for (std::string_view arg : args) {
    if (arg == "--") break;
    if (arg == "--help" || arg == "-h") return inv;
    if (arg == "--version") {
      inv.command = Command::kVersion;
      return inv;
    }
  }
  Scanned scanned;
  if (Status s = scan(args, &scanned); !s.isOk()) return s;
  if (scanned.help) return inv;
  if (scanned.version) {
    inv.command = Command::kVersion;
    return inv;
  }
  if (Status s = applyGlobals(scanned, &inv); !s.isOk()) return s;
  if (Status s = resolveCommand(scanned.positionals, &inv); !s.isOk()) return s;
  if (Status s = applyCommandFlags(scanned, &inv); !s.isOk()) return s;
  if (!inv.partitions.empty() && inv.command != Command::kHelp &&
      inv.command != Command::kVersion &&
      (inv.command != Command::kAudit || inv.period.has_value() || inv.list_periods)) {
    return usage("--partitions: only 'audit' of current balances sums the fleet; for '" +
                 std::string(commandName(inv.command)) +
                 "' give the partition's addresses with --ledger (docs/scale-out.md)");
  }
  return inv;
}

std::string usageText() {
  return R"(usage: tallyctl [--ledger HOST:PORT | --agent SOCKET | --partitions MAP] [--json]
                [--timeout-ms N]
                [--key FILE] [--ledger-key BASE64|FILE] [--insecure] COMMAND ...

Commands:
  policy publish FILE.toml        parse FILE locally (errors name the key; nothing is sent),
                                  publish it; prints the assigned policy generation
  policy rollback                 republish the previous policy as a new generation
  policy show [--generation G]    print the active (or generation G's) policy as TOML
  reserve --id ID --subject S --route R --units N [--digest HEX] [--priority P]
          [--region REGION]       reserve N units; without --digest the canonical request
                                  digest is computed from these fields; REGION is the
                                  gateway's region: a budget fenced to another one refuses it
  start   --id ID --operation OP  RESERVED -> STARTED, binding operation OP
  settle  --id ID --operation OP --actual N
                                  record actual usage N; the unused part is refunded
  extend  --id ID --operation OP --total N
                                  streaming top-up: a STARTED reservation now holds N units
                                  in all (a new total, not an increment); the difference is
                                  admitted like a reserve, or REJECTED (stop the work); a
                                  total it already holds is a duplicate and charges nothing
  release --id ID                 give back a reservation that never started
  unknown --id ID --operation OP  mark USAGE_UNKNOWN (the outcome of OP is not known)
  report  --id ID --operation OP --actual N
                                  operation receipt: resolves USAGE_UNKNOWN
  query   --id ID                 show a reservation
  audit   [--subject S] [--route R]
                                  every account's balances and the conservation check, and
                                  every emergency shard's: allocated = spent + reminted +
                                  retired (and the agent's last reported local equation)
  audit   --period EPOCH [--subject S] [--route R] [--periods]
                                  the closed accounting period covering EPOCH (hourly or
                                  daily: floor(Unix ms / period), UTC) of every account: its
                                  balances at the period's opening and close, its activity
                                  and the period's conservation check
  audit   --periods               the closed accounting periods kept
  health                          ask the peer whether it is serving

Operators and the audit log (ledger only; docs/security.md "Operators"):
  operator keygen --key FILE      create an operator key FILE (0600) if absent; print its
                                  public key for the admin to enroll
  operator enroll --id NAME --public-key BASE64 --role audit|policy|shards|admin
                                  let NAME's key connect with that role (role admin)
  operator list                   the first operator (the ledger's operator key) and the
                                  enrolled ones
  operator disable --id NAME      refuse NAME's key from now on; its connections are cut
  operator enable --id NAME       undo disable
  audit-log [--after N] [--limit N]
                                  the privileged actions recorded (who, what, when, the
                                  request's sha256, served or refused), oldest first

Gateways and emergency shards (ledger only; an agent refuses these):
  gateway enroll --id NAME --public-key BASE64
                                  let gateway NAME (its Ed25519 public key, as printed by
                                  `tally-agent identity`) have emergency shards
  gateway list                    every enrolled gateway
  gateway disable --id NAME       no more shards for NAME; its reports are refused
  gateway enable --id NAME        undo disable
  gateway rotate --id NAME --public-key BASE64 [--overlap-ms N]
                                  NAME's key becomes BASE64 at once; its old key stays admitted
                                  on the link for N ms (default 3600000, at most 604800000) or
                                  until the new key is first used, whichever comes first
  shard list [--gateway NAME] [--state S]
                                  shards and their central equations; S is one of ISSUED,
                                  REVOKED, RECONCILING, RECONCILED, CONFLICT, WRITTEN_OFF
  shard revoke (--id ID | --gateway NAME)
                                  revoke one shard, or every live shard of a gateway (the
                                  fence is bumped; agents stop using them at next contact)
  shard write-off --id ID         after its expiry, give up on an unreported shard: its
                                  units stay retired for ever

Global flags (before or after the command):
  --ledger HOST:PORT  the ledger to talk to (default 127.0.0.1:7411; [IPv6]:PORT works); a
                      list HOST:PORT,HOST:PORT (a primary and its standbys) is tried in turn,
                      moving on at a refused connect or a NOT_PRIMARY answer (exit 6 if no
                      address is the primary: the message names the primary)
  --agent SOCKET      talk to a tally-agent on this Unix socket instead
  --partitions MAP    a partitioned fleet (docs/scale-out.md): MAP is every partition's
                      address list in partition order, partitions separated by ';'
                      (A1,A2;B1,B2); `audit` asks every partition and prints their sum,
                      checking that each subject is on its own partition (audit --subject:
                      only its partition); other commands take the partition's --ledger
  --json              print exactly one JSON object on stdout, whatever the outcome
                      (usage errors included); it may stand anywhere on the line
  --timeout-ms N      give up after N ms, connecting included (default 5000)
  --key FILE          the operator key for the TLS link to the ledger: the ledger creates
                      DATA_DIR/operator.key at first start (required with --ledger)
  --ledger-key BASE64|FILE
                      the ledger's public key to pin (`tally-ledger identity` prints it), or
                      a file holding it or the ledger's key; default: DIR/ledger.key beside
                      --key (the ledger's data dir)
  --insecure          plaintext to a ledger started with --insecure (no TLS, no key)
  --help, --version
Flags take their value as the next argument or after '=' (--units=600).

JSON fields:
  reservation  code, duplicate, rejected, reservationId, state, subject, route, operationId,
               reservedUnits, actualUnits, refundedUnits (returned to available by this call;
               0 for duplicates; for query, by the reservation's settle/release/expiry),
               debtUnits, policyGeneration, accountingEpoch, accountingEpochMs, expiresAt,
               expiresAtMs, origin ("central" or a shard id), message;
               rejections add limitingDimension and retryAfterMs (-1: never under this policy)
  audit        conservation, asOf, asOfMs (the ledger time the balances are as of: refill
               earned up to it is applied), accounts[] (subject, route, policyGeneration,
               generationState, accountingEpoch, accountingEpochMs, debt, opening, minted,
               overdraftIssued, available, reserved, spent, retiredForEmergency,
               overdraftRepaid, transferredOut, conserved, overdraftBreaches (settles that left
               debt above max overdraft), overdraftBreachUnits (the debt beyond it, summed)),
               violations[]; with --period: period, periodSnapshots[] (subject, route,
               policyGeneration, accountingEpoch, epochFirst, epochLast (more than one epoch
               after a ledger outage), openedAt, openedAtMs, closedAt, closedAtMs, conserved,
               opening{}, closing{} (the balances above), activity{} (opened, minted, spent,
               debtIssued, debtRepaid, transferredOut), debtOpening, debtClosing); with
               --periods: closedPeriods[] (accountingEpoch, epochFirst, epochLast, accounts,
               conserved)
  policy       code, policyGeneration, message (show adds budgets[] with the TOML keys)
  gateway      code, duplicate, message, gateways[] (gatewayId (the name), publicKey (base64),
               enabled, enrolledAt, enrolledAtMs; during a rotation previousPublicKey,
               previousKeyUntil, previousKeyUntilMs)
  shard        code, duplicate, permissionDenied, message, remintedUnits, spentUnits,
               debtUnits (changed by this call), limitingDimension (refusals), shards[]
               (shardId, gatewayId (the name), publicKey (the gateway's, base64), subject,
               route, policyGeneration, state, allocatedUnits, spentUnits, remintedUnits,
               retiredUnits, debtUnits, writtenOff, conserved, fence, currentFence,
               gatewayBootEpoch, issuedAt, issuedAtMs, expiresAt, expiresAtMs, ledgerKeyId, reported,
               local (the agent's last report: available, reserved, spent, retired,
               overspent) when reported)
               audit adds shards[] with the same fields but fence/currentFence/times/keys
  errors       error: true, code, message; code is USAGE for a bad command line or policy
               file (exit 2, nothing sent), else the status or peer error constant
  help/version usage (this text) / version
Times are RFC 3339 UTC strings (e.g. "2026-07-19T14:00:00Z") plus *Ms Unix milliseconds,
except in gateway and shard objects, where they are Unix milliseconds only.

Exit codes:
  0   success (including a duplicate that returned the first answer)
  2   usage error: unknown command or flag, missing or malformed value, bad policy file;
      also INVALID_ARGUMENT from the ledger
  3   audit: conservation fails somewhere
  4   REJECTED: admission refused (see limitingDimension, retryAfterMs)
  5   conflict: IDEMPOTENCY_CONFLICT (same id, other digest), OPERATION_CONFLICT (bound to
      another operation), EXPIRED (the expiry won the race against start/release)
  6   unavailable: cannot connect, timed out, connection lost, peer answered "unavailable"
  7   NOT_FOUND: no such reservation (never seen, or compacted after retention); audit
      --period: no closed period covers EPOCH (the open one, or older than retention)
  8   INVALID_STATE: not allowed in the reservation's current state
  9   RESOURCE_EXHAUSTED or ARITHMETIC_OVERFLOW: the ledger refused and changed nothing
  10  protocol error: malformed or unexpected answer, or another error reply from the peer
  11  permission denied: the gateway is unknown or disabled, or a signature did not verify;
      or the TLS link failed: the ledger refused our key, its key is not the pinned one, or
      one side runs with --insecure and the other does not; or the agent's socket refused
      us: its file mode or owner (EACCES on connect), or the agent's allowed_uids/gids; or
      PERMISSION_DENIED: the key given with --key may not send this request (a gateway's key
      sends no operator request and acts only for its own gateway: use the operator key)
  1   internal error in tallyctl
)";
}

}  // namespace tally::ctl
