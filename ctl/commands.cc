#include "ctl/commands.h"

#include <utility>

#include "central-client/blocking_client.h"
#include "ctl/json.h"
#include "ctl/policy_toml.h"
#include "ctl/render.h"
#include "ctl/render_periods.h"
#include "shard/identity.h"
#include "tally/version.h"
#include "wire/digest.h"

namespace tally::ctl {
namespace {

// The JSON error code of a bad command line or policy file (exit 2; nothing was sent).
constexpr std::string_view kUsageErrorCode = "USAGE";

// {"NAME":"TEXT"} and a newline.
std::string jsonObject(std::string_view name, std::string_view text) {
  JsonWriter w;
  w.beginObject();
  w.field(name, text);
  w.endObject();
  return w.take() + "\n";
}

CommandOutput failure(const Invocation& inv, int exit_code, std::string_view code,
                      const std::string& message) {
  return {.exit_code = exit_code,
          .out = renderError(code, message, inv.json),
          .err = "tallyctl: " + std::string(commandName(inv.command)) + ": " + message + "\n"};
}

int exitCodeForStatus(StatusCode code) {
  switch (code) {
    case StatusCode::kUnavailable: return kExitUnavailable;
    case StatusCode::kCorruption: return kExitProtocol;
    case StatusCode::kInvalidArgument:
    case StatusCode::kResourceExhausted: return kExitUsage;  // e.g. a request above one frame
    default: return kExitInternal;
  }
}

int exitCodeForError(wire::ErrorCode code) {
  switch (code) {
    case wire::ErrorCode::kInvalidArgument:
    case wire::ErrorCode::kFrameTooLarge: return kExitUsage;  // e.g. an audit above one frame
    case wire::ErrorCode::kUnavailable:
    case wire::ErrorCode::kNotPrimary: return kExitUnavailable;  // no primary among the addresses
    case wire::ErrorCode::kNotFound: return kExitNotFound;
    // The ledger refused the request for the key we presented (a gateway key sending an
    // operator request or acting for another gateway), or an agent refused our uid.
    case wire::ErrorCode::kPermissionDenied: return kExitPermissionDenied;
    default: return kExitProtocol;
  }
}

enum class Expect : uint8_t {
  kReservation,
  kPolicy,
  kAudit,
  kHealth,
  kGateway,
  kShard,
  kOperator,
  kAuditLog
};

Expect expectedAnswer(Command command) {
  switch (command) {
    case Command::kPolicyPublish:
    case Command::kPolicyRollback:
    case Command::kPolicyShow: return Expect::kPolicy;
    case Command::kAudit: return Expect::kAudit;
    case Command::kHealth: return Expect::kHealth;
    case Command::kGatewayEnroll:
    case Command::kGatewayRotate:
    case Command::kGatewayList:
    case Command::kGatewayDisable:
    case Command::kGatewayEnable: return Expect::kGateway;
    case Command::kShardList:
    case Command::kShardRevoke:
    case Command::kShardWriteOff: return Expect::kShard;
    case Command::kOperatorEnroll:
    case Command::kOperatorList:
    case Command::kOperatorDisable:
    case Command::kOperatorEnable: return Expect::kOperator;
    case Command::kAuditLog: return Expect::kAuditLog;
    default: return Expect::kReservation;
  }
}

CommandOutput renderBody(const Invocation& inv, const wire::ResponseBody& body) {
  const Expect expect = expectedAnswer(inv.command);
  if (const auto* reply = std::get_if<ReservationReply>(&body);
      reply != nullptr && expect == Expect::kReservation) {
    const ReservationView view{.reply = *reply,
                               .requested_id = inv.reservation_id,
                               .is_query = inv.command == Command::kQuery};
    return {.exit_code = exitCodeFor(reply->code), .out = renderReservation(view, inv.json)};
  }
  if (const auto* answer = std::get_if<wire::PolicyAnswer>(&body);
      answer != nullptr && expect == Expect::kPolicy) {
    return {.exit_code = exitCodeFor(answer->reply.code),
            .out = renderPolicy(*answer, inv.command == Command::kPolicyShow, inv.json)};
  }
  if (const auto* report = std::get_if<AuditReport>(&body);
      report != nullptr && expect == Expect::kAudit) {
    const bool periods = inv.period || inv.list_periods;
    return {.exit_code = auditConserved(*report) ? kExitOk : kExitAuditFailed,
            .out = periods ? renderPeriodAudit(*report, inv.json) : renderAudit(*report, inv.json)};
  }
  if (const auto* health = std::get_if<wire::HealthReply>(&body);
      health != nullptr && expect == Expect::kHealth) {
    return {.exit_code = kExitOk, .out = renderHealth(*health, inv.json)};
  }
  if (const auto* reply = std::get_if<GatewayReply>(&body);
      reply != nullptr && expect == Expect::kGateway) {
    return {.exit_code = exitCodeFor(reply->code), .out = renderGateways(*reply, inv.json)};
  }
  if (const auto* reply = std::get_if<ShardReply>(&body);
      reply != nullptr && expect == Expect::kShard) {
    return {.exit_code = exitCodeFor(*reply), .out = renderShards(*reply, inv.json)};
  }
  if (const auto* reply = std::get_if<OperatorReply>(&body);
      reply != nullptr && expect == Expect::kOperator) {
    return {.exit_code = exitCodeFor(reply->code), .out = renderOperators(*reply, inv.json)};
  }
  if (const auto* reply = std::get_if<AuditLogReply>(&body);
      reply != nullptr && expect == Expect::kAuditLog) {
    return {.exit_code = kExitOk, .out = renderAuditLog(*reply, inv.json)};
  }
  if (const auto* error = std::get_if<wire::ErrorReply>(&body); error != nullptr) {
    return failure(inv, exitCodeForError(error->code), errorCodeConstant(error->code),
                   "peer answered " + std::string(errorCodeConstant(error->code)) +
                       (error->message.empty() ? std::string() : ": " + error->message));
  }
  return failure(
      inv, kExitProtocol, "PROTOCOL_ERROR",
      "unexpected kind of answer (response variant " + std::to_string(body.index()) + ")");
}

}  // namespace

Result<wire::RequestBody> buildRequest(const Invocation& inv) {
  switch (inv.command) {
    case Command::kHelp:
    case Command::kVersion: return Status::invalidArgument("no request for this command");
    case Command::kHealth: return wire::RequestBody(wire::HealthRequest{});
    case Command::kPolicyPublish: {
      Result<Policy> policy = parsePolicyFile(inv.policy_file);
      if (!policy.isOk()) return policy.status();
      return wire::RequestBody(
          wire::PublishPolicyRequest{.budgets = std::move(policy).value().budgets});
    }
    case Command::kPolicyRollback: return wire::RequestBody(wire::RollbackPolicyRequest{});
    case Command::kPolicyShow:
      return wire::RequestBody(wire::ShowPolicyRequest{.generation = inv.generation});
    case Command::kReserve: {
      ReserveRequest request{.reservation_id = inv.reservation_id,
                             .subject = inv.subject,
                             .route = inv.route,
                             .units = inv.units,
                             .priority = inv.priority,
                             .region = inv.region};
      request.request_digest = inv.digest ? *inv.digest : wire::canonicalRequestDigest(request);
      return wire::RequestBody(std::move(request));
    }
    case Command::kStart:
      return wire::RequestBody(
          StartRequest{.reservation_id = inv.reservation_id, .operation_id = inv.operation_id});
    case Command::kSettle:
      return wire::RequestBody(SettleRequest{.reservation_id = inv.reservation_id,
                                             .operation_id = inv.operation_id,
                                             .actual_units = inv.actual_units});
    case Command::kExtend:
      return wire::RequestBody(ExtendRequest{.reservation_id = inv.reservation_id,
                                             .operation_id = inv.operation_id,
                                             .reserved_units_total = inv.total_units});
    case Command::kRelease:
      return wire::RequestBody(ReleaseRequest{.reservation_id = inv.reservation_id});
    case Command::kMarkUnknown:
      return wire::RequestBody(MarkUnknownRequest{.reservation_id = inv.reservation_id,
                                                  .operation_id = inv.operation_id});
    case Command::kReport:
      return wire::RequestBody(ReportOperationRequest{.reservation_id = inv.reservation_id,
                                                      .operation_id = inv.operation_id,
                                                      .actual_units = inv.actual_units});
    case Command::kQuery:
      return wire::RequestBody(QueryRequest{.reservation_id = inv.reservation_id});
    case Command::kAudit:
      return wire::RequestBody(wire::AuditRequest{.subject = inv.subject,
                                                  .route = inv.route,
                                                  .period = inv.period,
                                                  .list_periods = inv.list_periods});
    case Command::kGatewayEnroll:
      return wire::RequestBody(wire::EnrollGatewayRequest{
          .gateway_name = inv.gateway_name, .public_key = inv.public_key.value_or(PublicKey{})});
    case Command::kGatewayRotate:
      return wire::RequestBody(
          wire::EnrollGatewayRequest{.gateway_name = inv.gateway_name,
                                     .public_key = inv.public_key.value_or(PublicKey{}),
                                     .rotate = true,
                                     .rotate_overlap_ms = inv.overlap_ms});
    case Command::kGatewayList: return wire::RequestBody(wire::ListGatewaysRequest{});
    case Command::kGatewayDisable:
    case Command::kGatewayEnable:
      return wire::RequestBody(wire::SetGatewayEnabledRequest{
          .gateway_name = inv.gateway_name, .enabled = inv.command == Command::kGatewayEnable});
    case Command::kShardList:
      return wire::RequestBody(
          wire::ListShardsRequest{.gateway_name = inv.gateway_name, .state = inv.shard_state});
    case Command::kShardRevoke:
      return wire::RequestBody(
          wire::RevokeShardsRequest{.shard_id = inv.shard_id, .gateway_name = inv.gateway_name});
    case Command::kShardWriteOff:
      return wire::RequestBody(wire::WriteOffShardRequest{.shard_id = inv.shard_id});
    case Command::kOperatorEnroll:
      return wire::RequestBody(
          EnrollOperatorRequest{.operator_name = inv.operator_name,
                                .public_key = inv.public_key.value_or(PublicKey{}),
                                .role = inv.operator_role});
    case Command::kOperatorList: return wire::RequestBody(ListOperatorsRequest{});
    case Command::kOperatorDisable:
    case Command::kOperatorEnable:
      return wire::RequestBody(SetOperatorEnabledRequest{
          .operator_name = inv.operator_name, .enabled = inv.command == Command::kOperatorEnable});
    case Command::kOperatorKeygen: return Status::invalidArgument("no request for this command");
    case Command::kAuditLog:
      return wire::RequestBody(
          AuditLogRequest{.after_sequence = inv.after_sequence, .entries_max = inv.entries_max});
  }
  TALLY_UNREACHABLE();
}

CommandOutput renderAnswer(const Invocation& inv, const Result<wire::Response>& answer) {
  if (!answer.isOk()) {
    const Status& status = answer.status();
    if (status.message().starts_with("TLS: ") ||  // the link's authentication failed
        status.message().starts_with(client::kPermissionDeniedPrefix)) {  // EACCES on connect
      return failure(inv, kExitPermissionDenied, "PERMISSION_DENIED", status.message());
    }
    return failure(inv, exitCodeForStatus(status.code()), statusCodeName(status.code()),
                   status.message());
  }
  return renderBody(inv, answer.value().body);
}

// `operator keygen --key FILE`: a new operator's key, created 0600 if absent (an existing one is
// kept), and its public key to give the admin for `operator enroll --public-key`.
CommandOutput operatorKeygen(const Invocation& inv) {
  Result<identity::KeyPair> key = identity::loadOrCreateKeyPair(inv.key_file);
  if (!key.isOk()) {
    return failure(inv, exitCodeForStatus(key.status().code()), statusCodeName(key.status().code()),
                   inv.key_file + ": " + key.status().message());
  }
  const std::string public_key = identity::encodePublicKey(key.value().public_key);
  if (inv.json) {
    JsonWriter w;
    w.beginObject();
    w.field("keyFile", inv.key_file);
    w.field("publicKey", public_key);
    w.endObject();
    return {.exit_code = kExitOk, .out = w.take() + "\n"};
  }
  return {.exit_code = kExitOk,
          .out = public_key + "\n",
          .err = "key file " + inv.key_file +
                 " (mode 0600); enroll it with: tallyctl --key ADMIN_KEY operator enroll --id NAME "
                 "--public-key " +
                 public_key + " --role ROLE\n"};
}

CommandOutput runCommand(const Invocation& inv, const CallFn& call) {
  if (inv.command == Command::kHelp) {
    return {.exit_code = kExitOk, .out = inv.json ? jsonObject("usage", usageText()) : usageText()};
  }
  if (inv.command == Command::kVersion) {
    return {.exit_code = kExitOk,
            .out = inv.json ? jsonObject("version", kVersion)
                            : std::string("tallyctl ") + kVersion + "\n"};
  }
  if (inv.command == Command::kOperatorKeygen) return operatorKeygen(inv);
  Result<wire::RequestBody> request = buildRequest(inv);
  if (!request.isOk()) {
    // Only usage-level problems get here (a bad policy file); nothing was sent.
    return failure(inv, kExitUsage, kUsageErrorCode, request.status().message());
  }
  return renderAnswer(inv, call(request.value()));
}

CommandOutput renderUsageError(const Status& status, bool json) {
  return {.exit_code = kExitUsage,
          .out = renderError(kUsageErrorCode, status.message(), json),
          .err = "tallyctl: " + status.message() + "\nTry 'tallyctl --help'.\n"};
}

}  // namespace tally::ctl
