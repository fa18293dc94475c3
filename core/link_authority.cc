#include "core/link_authority.h"

#include <iterator>
#include <string_view>
#include <type_traits>
#include <variant>

namespace tally {
namespace {

// What a request kind asks of a gateway.
enum class Access : uint8_t {
  kAnyPeer,      // any admitted peer: reservations, health, audit, show-policy
  kOwnGateway,   // a gateway may send it for its own gateway only (gatewayNamed says which)
  kOperatorOnly  // operator requests
};

// What each request kind asks: of a gateway (Access) and of an operator (the role it needs).
// Every request kind is classified here: a new kind fails to compile until it is.
struct Rule {
  Access access;
  OperatorRole role;
};

// The requests on one reservation, each naming it by reservation_id (reservationNamed).
template <typename T>
constexpr bool kNamesReservation =
    std::is_same_v<T, ReserveRequest> || std::is_same_v<T, StartRequest> ||
    std::is_same_v<T, SettleRequest> || std::is_same_v<T, ReleaseRequest> ||
    std::is_same_v<T, MarkUnknownRequest> || std::is_same_v<T, ReportOperationRequest> ||
    std::is_same_v<T, ExtendRequest> || std::is_same_v<T, QueryRequest>;

template <typename T>
constexpr Rule ruleOf() {
  if constexpr (std::is_same_v<T, UnknownMessage> || std::is_same_v<T, QueryRequest> ||
                std::is_same_v<T, AuditRequest> || std::is_same_v<T, HealthRequest> ||
                std::is_same_v<T, ShowPolicyRequest>) {
    return {Access::kAnyPeer, OperatorRole::kAudit};
  } else if constexpr (kNamesReservation<T>) {        // but the query, a read (above)
    return {Access::kAnyPeer, OperatorRole::kAdmin};  // a gateway's traffic
  } else if constexpr (std::is_same_v<T, ShardStatusRequest> ||
                       std::is_same_v<T, ListShardsRequest>) {
    return {Access::kOwnGateway, OperatorRole::kAudit};
  } else if constexpr (std::is_same_v<T, ShardIssueRequest> || std::is_same_v<T, ShardReport>) {
    return {Access::kOwnGateway, OperatorRole::kAdmin};  // a gateway's traffic
  } else if constexpr (std::is_same_v<T, ListGatewaysRequest> ||
                       std::is_same_v<T, ListOperatorsRequest> ||
                       std::is_same_v<T, AuditLogRequest>) {
    return {Access::kOperatorOnly, OperatorRole::kAudit};
  } else if constexpr (std::is_same_v<T, PublishPolicyRequest> ||
                       std::is_same_v<T, RollbackPolicyRequest>) {
    return {Access::kOperatorOnly, OperatorRole::kPolicy};
  } else if constexpr (std::is_same_v<T, RevokeShardsRequest> ||
                       std::is_same_v<T, WriteOffShardRequest>) {
    return {Access::kOperatorOnly, OperatorRole::kShards};
  } else {
    static_assert(std::is_same_v<T, EnrollGatewayRequest> ||
                      std::is_same_v<T, SetGatewayEnabledRequest> ||
                      std::is_same_v<T, EnrollOperatorRequest> ||
                      std::is_same_v<T, SetOperatorEnabledRequest>,
                  "every request kind has an access rule");
    return {Access::kOperatorOnly, OperatorRole::kAdmin};
  }
}

// The gateway a kOwnGateway request acts for ("" for a status poll or list of every gateway).
const std::string& gatewayNamed(const ShardIssueRequest& request) { return request.gateway_name; }
const std::string& gatewayNamed(const ShardReport& report) { return report.shard.gateway_name; }
const std::string& gatewayNamed(const ShardStatusRequest& request) { return request.gateway_name; }
const std::string& gatewayNamed(const ListShardsRequest& request) { return request.gateway_name; }

std::string quoted(const std::string& text) { return "'" + text + "'"; }

}  // namespace

const char* linkRoleName(LinkRole role) {
  switch (role) {
    case LinkRole::kUnauthenticated: return "unauthenticated";
    case LinkRole::kOperator: return "operator";
    case LinkRole::kGateway: return "gateway";
    case LinkRole::kNobody: return "nobody";
  }
  return "?";
}

const char* linkRequestName(const LedgerRequest& request) {
  static constexpr const char* kNames[] = {"unknown request",
                                           "reserve",
                                           "start",
                                           "settle",
                                           "release",
                                           "query",
                                           "mark unknown",
                                           "operation receipt",
                                           "audit",
                                           "health",
                                           "policy publish",
                                           "policy rollback",
                                           "policy show",
                                           "gateway enroll",
                                           "gateway list",
                                           "gateway enable/disable",
                                           "shard issue",
                                           "shard report",
                                           "shard status",
                                           "shard list",
                                           "shard revoke",
                                           "shard write-off",
                                           "extend",
                                           "operator enroll",
                                           "operator enable/disable",
                                           "operator list",
                                           "audit log"};
  static_assert(std::size(kNames) == std::variant_size_v<LedgerRequest>);
  return kNames[request.index()];
}

bool operatorRoleAllows(OperatorRole held, OperatorRole needed) {
  return held == OperatorRole::kAdmin || needed == OperatorRole::kAudit || held == needed;
}

bool isPrivilegedAction(const LedgerRequest& request) {
  return std::visit(
      [](const auto& r) {
        constexpr Rule rule = ruleOf<std::decay_t<decltype(r)>>();
        return rule.access == Access::kOperatorOnly && rule.role != OperatorRole::kAudit;
      },
      request);
}

OperatorRole operatorRoleNeeded(const LedgerRequest& request) {
  return std::visit([](const auto& r) { return ruleOf<std::decay_t<decltype(r)>>().role; },
                    request);
}

bool gatewayHoldsKey(const GatewayRecord& gateway, const PublicKey& key, uint64_t now_ms) {
  if (gateway.public_key == key) return true;
  return gateway.previous_public_key == key && gateway.previous_public_key != PublicKey{} &&
         now_ms < gateway.previous_key_until_ms;
}

LinkPeer identifyLinkPeer(const ShardRegistry& registry, const PublicKey& operator_key,
                          const PublicKey& key, uint64_t now_ms, const std::string& gateway_hint) {
  return identifyLinkPeer(registry, std::vector<OperatorRecord>{firstOperator(operator_key)}, key,
                          now_ms, gateway_hint);
}

LinkPeer identifyLinkPeer(const ShardRegistry& registry,
                          const std::vector<OperatorRecord>& operators, const PublicKey& key,
                          uint64_t now_ms, const std::string& gateway_hint) {
  for (const OperatorRecord& op : operators) {
    if (op.public_key != key || key == PublicKey{}) continue;
    if (!op.enabled) {
      return LinkPeer{.role = LinkRole::kNobody,
                      .operator_name = op.name,
                      .why_nobody = "operator " + quoted(op.name) + " is disabled"};
    }
    return LinkPeer{
        .role = LinkRole::kOperator, .operator_name = op.name, .operator_role = op.role};
  }
  const GatewayRecord* gateway = nullptr;
  if (const GatewayRecord* hinted = registry.findGateway(gateway_hint);
      hinted != nullptr && gatewayHoldsKey(*hinted, key, now_ms)) {
    gateway = hinted;
  } else {
    for (const auto& [gateway_name, record] : registry.gateways()) {
      if (gatewayHoldsKey(record, key, now_ms)) {
        gateway = &record;
        break;
      }
    }
  }
  if (gateway == nullptr) {
    return LinkPeer{.role = LinkRole::kNobody,
                    .gateway_name = gateway_hint,
                    .why_nobody = gateway_hint.empty() ? "the key is not an enrolled gateway's"
                                                       : "the key is no longer that of gateway " +
                                                             quoted(gateway_hint)};
  }
  if (!gateway->enabled) {
    return LinkPeer{.role = LinkRole::kNobody,
                    .gateway_name = gateway->gateway_name,
                    .why_nobody = "gateway " + quoted(gateway->gateway_name) + " is disabled"};
  }
  return LinkPeer{.role = LinkRole::kGateway,
                  .gateway_name = gateway->gateway_name,
                  .previous_key = gateway->public_key != key};
}

bool endsKeyOverlap(const ShardRegistry& registry, const LinkPeer& peer, uint64_t now_ms) {
  if (peer.role != LinkRole::kGateway || peer.previous_key) return false;
  const GatewayRecord* gateway = registry.findGateway(peer.gateway_name);
  return gateway != nullptr && gateway->previous_public_key != PublicKey{} &&
         now_ms < gateway->previous_key_until_ms;
}

const std::string* reservationNamed(const LedgerRequest& request) {
  return std::visit(
      [](const auto& r) -> const std::string* {
        using T = std::decay_t<decltype(r)>;
        if constexpr (kNamesReservation<T>) {
          return &r.reservation_id;
        } else {
          return nullptr;
        }
      },
      request);
}

std::optional<std::string> reservationRefusal(const std::string& gateway_name,
                                              const Reservation& reservation,
                                              const LedgerRequest& request) {
  if (gateway_name.empty() || reservation.gateway_name.empty() ||
      reservation.gateway_name == gateway_name) {
    return std::nullopt;
  }
  return std::string(linkRequestName(request)) + " refused: reservation " +
         quoted(reservation.reservation_id) + " belongs to gateway " +
         quoted(reservation.gateway_name) + ", and this connection is gateway " +
         quoted(gateway_name);
}

std::optional<std::string> linkRefusal(const LinkPeer& peer, const LedgerRequest& request) {
  if (peer.role == LinkRole::kUnauthenticated) return std::nullopt;
  const std::string what = linkRequestName(request);
  if (peer.role == LinkRole::kNobody) {
    return what + " refused: " + peer.why_nobody;
  }
  if (peer.role == LinkRole::kOperator) {
    const OperatorRole needed = operatorRoleNeeded(request);
    if (operatorRoleAllows(peer.operator_role, needed)) return std::nullopt;
    return what + " refused: operator " + quoted(peer.operator_name) + " has role " +
           operatorRoleName(peer.operator_role) + ", and it needs role " +
           operatorRoleName(needed) +
           (needed == OperatorRole::kAdmin ? std::string() : std::string(" or admin"));
  }
  return std::visit(
      [&](const auto& r) -> std::optional<std::string> {
        using T = std::decay_t<decltype(r)>;
        constexpr Access access = ruleOf<T>().access;
        if constexpr (access == Access::kAnyPeer) {
          return std::nullopt;
        } else if constexpr (access == Access::kOwnGateway) {
          const std::string& named = gatewayNamed(r);
          if (named == peer.gateway_name) return std::nullopt;
          return what + " refused: gateway " + quoted(peer.gateway_name) +
                 " may act only for itself, and this request names " +
                 (named.empty() ? std::string("every gateway") : "gateway " + quoted(named));
        } else {
          return what + " refused: an operator request, and this connection is gateway " +
                 quoted(peer.gateway_name) + " (use the operator key: tallyctl --key)";
        }
      },
      request);
}

}  // namespace tally
