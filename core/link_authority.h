#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/ledger_protocol.h"
#include "core/operator_registry.h"
#include "core/shard_registry.h"
#include "core/shard_types.h"

// Who a connection to the ledger is, and what it may ask (docs/security.md "The link"). Pure:
// the shell (ledger/server.cc) identifies the key a TLS connection presented with
// identifyLinkPeer() before each request and answers a request linkRefusal() refuses with
// ErrorCode::kPermissionDenied, without applying it.
//
//  * kOperator (the key of an enrolled, enabled operator): what its role allows
//    (operatorRoleAllows): every role the reads (health, audit, show-policy, query, gateway
//    list, shard status and list); `policy` also policy publish and rollback; `shards` also
//    shard revoke and write-off; `admin` every request (gateway enroll, enable, disable and
//    rotate, and the gateway-side requests: reservations, shard issue and report). The ledger's
//    own operator key (DATA_DIR/operator.key, created at first start) is the first operator,
//    kFirstOperatorName with role admin, as a database creates its superuser.
//  * kGateway (the key of an enrolled, enabled gateway): the reservation requests (reserve,
//    start, settle, release, extend, mark unknown, operation receipts, query), health, audit and
//    show-policy, and the shard requests of its own gateway only: an issue request, a report, a
//    status poll or a shard list must name the connection's gateway. No operator request:
//    publishing or rolling back a policy, enrolling, listing, enabling or disabling gateways,
//    revoking or writing off shards.
//  * kNobody (a key not admitted: unknown, its gateway or operator was disabled, or its key is
//    no longer the gateway's): nothing.
//  * kUnauthenticated (a plaintext --insecure connection: no key at all): every request, as
//    before TLS. --insecure is refused off loopback (ledger/main.cc).
//
// A reservation is bound to the gateway whose connection reserved it (Reservation::
// gateway_name): only that gateway may act on it (reservationRefusal, checked by
// LedgerRequests::apply with the record the request names).

namespace tally {

enum class LinkRole : uint8_t { kUnauthenticated, kOperator, kGateway, kNobody };
const char* linkRoleName(LinkRole role);  // "unauthenticated", "operator", "gateway", "nobody"

// Whether an operator of role `held` may send what needs role `needed` (kAudit: a read).
bool operatorRoleAllows(OperatorRole held, OperatorRole needed);

struct LinkPeer {
  LinkRole role = LinkRole::kNobody;
  std::string gateway_name;   // kGateway; kNobody when the key was (or names) a gateway's
  std::string operator_name;  // kOperator; kNobody when the key is a disabled operator's
  OperatorRole operator_role = OperatorRole::kAudit;  // kOperator
  std::string why_nobody;                             // kNobody: why the key is not admitted now
  bool previous_key = false;  // kGateway: the key a rotation is replacing (still admitted)

  bool operator==(const LinkPeer&) const = default;
};

// The peer `key` is at `now_ms`: the operator whose key it is (nobody if that operator is
// disabled), else the enrolled gateway whose key it is — its current key, or during a rotation its
// previous key (before previous_key_until_ms) — if that gateway is enabled, else nobody.
// `gateway_hint` (the gateway the same key was earlier on the connection) is looked up first, so a
// connection that stays who it was costs one lookup per request; without it, or if the hint no
// longer holds the key, every gateway is scanned.
LinkPeer identifyLinkPeer(const ShardRegistry& registry,
                          const std::vector<OperatorRecord>& operators, const PublicKey& key,
                          uint64_t now_ms, const std::string& gateway_hint = {});
// The same with the ledger's operator key as the only operator (firstOperator).
LinkPeer identifyLinkPeer(const ShardRegistry& registry, const PublicKey& operator_key,
                          const PublicKey& key, uint64_t now_ms,
                          const std::string& gateway_hint = {});

// Whether `gateway` holds `key` at `now_ms` (its current key, or its admitted previous key).
bool gatewayHoldsKey(const GatewayRecord& gateway, const PublicKey& key, uint64_t now_ms);
// Whether `peer`'s request is the first use of its gateway's new key during a rotation: the
// shell then ends the overlap (ShardRegistry::endKeyOverlap) and cuts the connections of the
// previous key.
bool endsKeyOverlap(const ShardRegistry& registry, const LinkPeer& peer, uint64_t now_ms);

// Whether `peer` may send `request`: nullopt if it may, else why not (a message for the
// kPermissionDenied answer, naming the request and who asked).
std::optional<std::string> linkRefusal(const LinkPeer& peer, const LedgerRequest& request);
// Whether `request` is a privileged action, written to the audit log served or refused: an
// operator request that changes something (policy publish and rollback, gateway and operator
// enroll, rotate, enable and disable, shard revoke and write-off).
bool isPrivilegedAction(const LedgerRequest& request);
// The role an operator needs for `request` (kAudit: a read every operator may send).
OperatorRole operatorRoleNeeded(const LedgerRequest& request);

// The reservation id a reservation request names (reserve, start, settle, release, mark unknown,
// operation receipt, extend, query); nullptr for any other request.
const std::string* reservationNamed(const LedgerRequest& request);
// Whether a connection of gateway `gateway_name` ("" = not a gateway: an operator, or an
// --insecure link) may send `request` on `reservation`, the record it names: nullopt if it may,
// else why not (a message for the kPermissionDenied answer). A reservation bound to a gateway
// is that gateway's alone: no other gateway may repeat its reserve, start, settle, release or
// extend it, mark it unknown, report its operation or query it. Operators may act on any
// reservation; an unbound one (Reservation::gateway_name "") is any peer's.
std::optional<std::string> reservationRefusal(const std::string& gateway_name,
                                              const Reservation& reservation,
                                              const LedgerRequest& request);

// "reserve", "policy publish", "shard report", … as a message names the request's kind.
const char* linkRequestName(const LedgerRequest& request);

}  // namespace tally
