// Who a ledger connection is and what it may ask (core/link_authority.h): identification of a
// TLS key against the gateway registry, and the rule that a gateway acts only as itself and sends
// no operator request, without sockets or TLS.

#include "core/link_authority.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/ledger.h"
#include "core/limits.h"

namespace tally {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kT0 = 1'700'000'000'000;

PublicKey linkKey(uint8_t fill) {
  PublicKey key{};
  key.fill(fill);
  return key;
}

const PublicKey kOperatorKey = linkKey(9);

template <size_t... I>
std::vector<LedgerRequest> everyKindOf(std::index_sequence<I...> /*kinds*/) {
  return {LedgerRequest(std::in_place_index<I>)...};
}
// One default value of every request kind of the protocol.
std::vector<LedgerRequest> everyKind() {
  return everyKindOf(std::make_index_sequence<std::variant_size_v<LedgerRequest>>());
}

bool isOperatorKind(const LedgerRequest& request) {
  return std::holds_alternative<PublishPolicyRequest>(request) ||
         std::holds_alternative<RollbackPolicyRequest>(request) ||
         std::holds_alternative<EnrollGatewayRequest>(request) ||
         std::holds_alternative<ListGatewaysRequest>(request) ||
         std::holds_alternative<SetGatewayEnabledRequest>(request) ||
         std::holds_alternative<RevokeShardsRequest>(request) ||
         std::holds_alternative<WriteOffShardRequest>(request) ||
         std::holds_alternative<EnrollOperatorRequest>(request) ||
         std::holds_alternative<SetOperatorEnabledRequest>(request) ||
         std::holds_alternative<ListOperatorsRequest>(request) ||
         std::holds_alternative<AuditLogRequest>(request);
}
bool namesAGateway(const LedgerRequest& request) {
  return std::holds_alternative<ShardIssueRequest>(request) ||
         std::holds_alternative<ShardReport>(request) ||
         std::holds_alternative<ShardStatusRequest>(request) ||
         std::holds_alternative<ListShardsRequest>(request);
}

// The same request, naming `gateway` wherever it names one.
LedgerRequest naming(LedgerRequest request, const std::string& gateway) {
  std::visit(
      [&](auto& r) {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, ShardReport>) {
          r.shard.gateway_name = gateway;
        } else if constexpr (std::is_same_v<T, ShardIssueRequest> ||
                             std::is_same_v<T, ShardStatusRequest> ||
                             std::is_same_v<T, ListShardsRequest>) {
          r.gateway_name = gateway;
        }
      },
      request);
  return request;
}

class LinkAuthorityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(ledger_.enrollGateway("gw-a", linkKey(1), kT0).code, ReplyCode::kOk);
    ASSERT_EQ(ledger_.enrollGateway("gw-b", linkKey(2), kT0).code, ReplyCode::kOk);
  }

  LinkPeer identify(const PublicKey& key, const std::string& hint = {}) const {
    return identifyLinkPeer(ledger_.shards(), kOperatorKey, key, now_ms_, hint);
  }

  Ledger ledger_;
  uint64_t now_ms_ = kT0;
};

TEST_F(LinkAuthorityTest, TheOperatorKeyIsTheOperatorAndAGatewayKeyItsGateway) {
  EXPECT_EQ(identify(kOperatorKey).role, LinkRole::kOperator);
  const LinkPeer a = identify(linkKey(1));
  EXPECT_EQ(a.role, LinkRole::kGateway);
  EXPECT_EQ(a.gateway_name, "gw-a");
  const LinkPeer b = identify(linkKey(2), "gw-a");  // a wrong hint is not believed
  EXPECT_EQ(b.role, LinkRole::kGateway);
  EXPECT_EQ(b.gateway_name, "gw-b");
  EXPECT_EQ(identify(linkKey(1), "gw-a"), a);  // the hint's lookup says the same
}

TEST_F(LinkAuthorityTest, AnUnknownKeyAndADisabledGatewayAreNobodyAndMaySendNothing) {
  const LinkPeer stranger = identify(linkKey(3));
  EXPECT_EQ(stranger.role, LinkRole::kNobody);
  EXPECT_THAT(stranger.why_nobody, HasSubstr("not an enrolled gateway's"));

  ASSERT_EQ(ledger_.setGatewayEnabled("gw-a", false, kT0).code, ReplyCode::kOk);
  const LinkPeer disabled = identify(linkKey(1), "gw-a");
  EXPECT_EQ(disabled.role, LinkRole::kNobody);
  EXPECT_EQ(disabled.gateway_name, "gw-a");
  EXPECT_THAT(disabled.why_nobody, HasSubstr("gateway 'gw-a' is disabled"));
  for (const LedgerRequest& request : everyKind()) {
    const std::optional<std::string> refusal = linkRefusal(disabled, naming(request, "gw-a"));
    ASSERT_TRUE(refusal.has_value()) << linkRequestName(request);
    EXPECT_THAT(*refusal, HasSubstr("is disabled"));
  }
  // Enabled again: its gateway again.
  ASSERT_EQ(ledger_.setGatewayEnabled("gw-a", true, kT0).code, ReplyCode::kOk);
  EXPECT_EQ(identify(linkKey(1), "gw-a").role, LinkRole::kGateway);
}

TEST_F(LinkAuthorityTest, TheOperatorAndAPlaintextPeerMaySendEveryRequest) {
  const LinkPeer plaintext{.role = LinkRole::kUnauthenticated};
  for (const LedgerRequest& request : everyKind()) {
    EXPECT_EQ(linkRefusal(identify(kOperatorKey), naming(request, "gw-a")), std::nullopt)
        << linkRequestName(request);
    EXPECT_EQ(linkRefusal(plaintext, naming(request, "gw-b")), std::nullopt)
        << linkRequestName(request);
  }
}

TEST_F(LinkAuthorityTest, AGatewaySendsNoOperatorRequest) {
  const LinkPeer a = identify(linkKey(1));
  int refused = 0;
  for (const LedgerRequest& request : everyKind()) {
    if (!isOperatorKind(request)) continue;
    const std::optional<std::string> refusal = linkRefusal(a, request);
    ASSERT_TRUE(refusal.has_value()) << linkRequestName(request);
    EXPECT_THAT(*refusal, HasSubstr("an operator request"));
    EXPECT_THAT(*refusal, HasSubstr("gateway 'gw-a'"));
    ++refused;
  }
  EXPECT_EQ(refused, 11);
  EXPECT_THAT(linkRefusal(a, PublishPolicyRequest{}).value_or(""),
              HasSubstr("policy publish refused"));
}

TEST_F(LinkAuthorityTest, AGatewaySendsReservationsHealthAuditAndShowPolicy) {
  const LinkPeer a = identify(linkKey(1));
  int allowed = 0;
  for (const LedgerRequest& request : everyKind()) {
    if (isOperatorKind(request) || namesAGateway(request)) continue;
    EXPECT_EQ(linkRefusal(a, request), std::nullopt) << linkRequestName(request);
    ++allowed;
  }
  EXPECT_EQ(allowed, 12);  // unknown kinds (answered as such), 8 reservation kinds, 3 reads
}

TEST_F(LinkAuthorityTest, AGatewayActsOnlyForItselfWhereARequestNamesAGateway) {
  const LinkPeer a = identify(linkKey(1));
  int checked = 0;
  for (const LedgerRequest& request : everyKind()) {
    if (!namesAGateway(request)) continue;
    EXPECT_EQ(linkRefusal(a, naming(request, "gw-a")), std::nullopt) << linkRequestName(request);
    const std::optional<std::string> other = linkRefusal(a, naming(request, "gw-b"));
    ASSERT_TRUE(other.has_value()) << linkRequestName(request);
    EXPECT_THAT(*other, HasSubstr("gateway 'gw-a' may act only for itself"));
    EXPECT_THAT(*other, HasSubstr("names gateway 'gw-b'"));
    // Every gateway at once (a status poll or list without a name) is not its own either.
    const std::optional<std::string> every = linkRefusal(a, naming(request, ""));
    ASSERT_TRUE(every.has_value()) << linkRequestName(request);
    EXPECT_THAT(*every, HasSubstr("every gateway"));
    ++checked;
  }
  EXPECT_EQ(checked, 4);
}

TEST_F(LinkAuthorityTest, AReportIsBoundByTheGatewayOfItsShard) {
  const LinkPeer b = identify(linkKey(2));
  ShardReport report;
  report.shard.gateway_name = "gw-a";
  report.shard.gateway_id = linkKey(1);
  const std::optional<std::string> refusal = linkRefusal(b, report);
  ASSERT_TRUE(refusal.has_value());
  EXPECT_THAT(*refusal, HasSubstr("shard report refused: gateway 'gw-b' may act only for itself"));
  report.shard.gateway_name = "gw-b";
  EXPECT_EQ(linkRefusal(b, report), std::nullopt);
}

TEST_F(LinkAuthorityTest, DuringARotationBothKeysAreTheGatewayUntilTheWindowEnds) {
  ASSERT_EQ(ledger_.rotateGatewayKey("gw-a", linkKey(5), 60'000, kT0).code, ReplyCode::kOk);
  const GatewayRecord* record = ledger_.shards().findGateway("gw-a");
  ASSERT_NE(record, nullptr);
  EXPECT_EQ(record->public_key, linkKey(5));
  EXPECT_EQ(record->previous_public_key, linkKey(1));
  EXPECT_EQ(record->previous_key_until_ms, kT0 + 60'000);

  const LinkPeer old_key = identify(linkKey(1));
  EXPECT_EQ(old_key.role, LinkRole::kGateway);
  EXPECT_EQ(old_key.gateway_name, "gw-a");
  EXPECT_TRUE(old_key.previous_key);
  EXPECT_FALSE(endsKeyOverlap(ledger_.shards(), old_key, now_ms_));
  const LinkPeer new_key = identify(linkKey(5));
  EXPECT_EQ(new_key.role, LinkRole::kGateway);
  EXPECT_EQ(new_key.gateway_name, "gw-a");
  EXPECT_FALSE(new_key.previous_key);
  EXPECT_TRUE(endsKeyOverlap(ledger_.shards(), new_key, now_ms_));

  // The window ends: the old key is nobody, the new one needs no overlap to end.
  now_ms_ = kT0 + 60'000;
  EXPECT_EQ(identify(linkKey(1), "gw-a").role, LinkRole::kNobody);
  EXPECT_THAT(identify(linkKey(1), "gw-a").why_nobody,
              HasSubstr("no longer that of gateway 'gw-a'"));
  EXPECT_EQ(identify(linkKey(5), "gw-a").role, LinkRole::kGateway);
  EXPECT_FALSE(endsKeyOverlap(ledger_.shards(), identify(linkKey(5)), now_ms_));
}

TEST_F(LinkAuthorityTest, TheFirstUseOfTheNewKeyEndsTheOverlap) {
  ASSERT_EQ(ledger_.rotateGatewayKey("gw-a", linkKey(5), 60'000, kT0).code, ReplyCode::kOk);
  (void)ledger_.takeChangedRows();
  EXPECT_EQ(ledger_.shards().endKeyOverlap("gw-a", kT0 + 10), linkKey(1));
  EXPECT_EQ(ledger_.takeChangedRows().shards.gateways.size(), 1u);  // durable
  EXPECT_EQ(identify(linkKey(1), "gw-a").role, LinkRole::kNobody);
  EXPECT_EQ(identify(linkKey(5)).role, LinkRole::kGateway);
  EXPECT_EQ(ledger_.shards().endKeyOverlap("gw-a", kT0 + 20), std::nullopt);  // nothing left
}

TEST_F(LinkAuthorityTest, ARotationIsValidatedAndARepeatIsADuplicate) {
  EXPECT_EQ(ledger_.rotateGatewayKey("gw-x", linkKey(5), 1'000, kT0).code, ReplyCode::kNotFound);
  EXPECT_EQ(ledger_.rotateGatewayKey("gw-a", PublicKey{}, 1'000, kT0).code,
            ReplyCode::kInvalidArgument);
  EXPECT_EQ(
      ledger_.rotateGatewayKey("gw-a", linkKey(5), limits::kGatewayKeyOverlapMsMax + 1, kT0).code,
      ReplyCode::kInvalidArgument);
  const GatewayReply taken = ledger_.rotateGatewayKey("gw-a", linkKey(2), 1'000, kT0);
  EXPECT_EQ(taken.code, ReplyCode::kInvalidArgument);  // gw-b's key
  EXPECT_THAT(taken.message, HasSubstr("gateway 'gw-b'"));

  ASSERT_EQ(ledger_.rotateGatewayKey("gw-a", linkKey(5), 1'000, kT0).code, ReplyCode::kOk);
  const GatewayReply repeat = ledger_.rotateGatewayKey("gw-a", linkKey(5), 1'000, kT0 + 5);
  EXPECT_EQ(repeat.code, ReplyCode::kOk);
  EXPECT_TRUE(repeat.duplicate);
  EXPECT_EQ(ledger_.shards().findGateway("gw-a")->previous_key_until_ms, kT0 + 1'000);
  // A second rotation within the window keeps the key the gateway has been using as previous.
  ASSERT_EQ(ledger_.rotateGatewayKey("gw-a", linkKey(6), 1'000, kT0 + 10).code, ReplyCode::kOk);
  EXPECT_EQ(ledger_.shards().findGateway("gw-a")->previous_public_key, linkKey(1));
  EXPECT_EQ(identify(linkKey(5)).role, LinkRole::kNobody);
  // No overlap at all: the old key is refused at once.
  ASSERT_EQ(ledger_.rotateGatewayKey("gw-b", linkKey(7), 0, kT0).code, ReplyCode::kOk);
  EXPECT_EQ(identify(linkKey(2)).role, LinkRole::kNobody);
  EXPECT_EQ(identify(linkKey(7)).gateway_name, "gw-b");
}

// --- Operators: identities with roles --------------------------------------------------------

const std::vector<OperatorRecord> kOperators = {
    firstOperator(kOperatorKey),
    {.name = "ro", .public_key = linkKey(20), .role = OperatorRole::kAudit},
    {.name = "pol", .public_key = linkKey(21), .role = OperatorRole::kPolicy},
    {.name = "sh", .public_key = linkKey(22), .role = OperatorRole::kShards},
    {.name = "adm2", .public_key = linkKey(23), .role = OperatorRole::kAdmin},
    {.name = "gone", .public_key = linkKey(24), .role = OperatorRole::kAdmin, .enabled = false},
};

bool isPolicyKind(const LedgerRequest& request) {
  return std::holds_alternative<PublishPolicyRequest>(request) ||
         std::holds_alternative<RollbackPolicyRequest>(request);
}
bool isShardsKind(const LedgerRequest& request) {
  return std::holds_alternative<RevokeShardsRequest>(request) ||
         std::holds_alternative<WriteOffShardRequest>(request);
}
bool isReadKind(const LedgerRequest& request) {
  return std::holds_alternative<UnknownMessage>(request) ||
         std::holds_alternative<QueryRequest>(request) ||
         std::holds_alternative<AuditRequest>(request) ||
         std::holds_alternative<HealthRequest>(request) ||
         std::holds_alternative<ShowPolicyRequest>(request) ||
         std::holds_alternative<ListGatewaysRequest>(request) ||
         std::holds_alternative<ShardStatusRequest>(request) ||
         std::holds_alternative<ListShardsRequest>(request) ||
         std::holds_alternative<ListOperatorsRequest>(request) ||
         std::holds_alternative<AuditLogRequest>(request);
}

class OperatorAuthorityTest : public LinkAuthorityTest {
 protected:
  LinkPeer identifyOperator(const PublicKey& key) const {
    return identifyLinkPeer(ledger_.shards(), kOperators, key, now_ms_);
  }
  // The kinds `key`'s operator may send (each refusal names the operator and its role).
  std::vector<std::string> allowedKinds(const PublicKey& key) const {
    const LinkPeer peer = identifyOperator(key);
    EXPECT_EQ(peer.role, LinkRole::kOperator);
    std::vector<std::string> allowed;
    for (const LedgerRequest& request : everyKind()) {
      const std::optional<std::string> refusal = linkRefusal(peer, naming(request, "gw-a"));
      if (!refusal.has_value()) {
        allowed.emplace_back(linkRequestName(request));
        continue;
      }
      EXPECT_THAT(*refusal, HasSubstr(std::string(linkRequestName(request)) + " refused"));
      EXPECT_THAT(*refusal, HasSubstr("operator '" + peer.operator_name + "' has role " +
                                      operatorRoleName(peer.operator_role)));
    }
    return allowed;
  }
  static std::vector<std::string> kindsWhere(bool (*pick)(const LedgerRequest&)) {
    std::vector<std::string> kinds;
    for (const LedgerRequest& request : everyKind()) {
      if (pick(request)) kinds.emplace_back(linkRequestName(request));
    }
    return kinds;
  }
};

TEST_F(OperatorAuthorityTest, TheLedgersOperatorKeyIsTheFirstOperatorNamedAdminWithRoleAdmin) {
  const LinkPeer first = identify(kOperatorKey);
  EXPECT_EQ(first.role, LinkRole::kOperator);
  EXPECT_EQ(first.operator_name, "admin");
  EXPECT_EQ(first.operator_role, OperatorRole::kAdmin);
  EXPECT_EQ(identifyOperator(kOperatorKey), first);
  EXPECT_EQ(allowedKinds(kOperatorKey).size(), std::variant_size_v<LedgerRequest>);
}

TEST(PrivilegedActionTest, TheOperatorWritesArePrivilegedAndNothingElse) {
  std::vector<std::string> privileged;
  for (size_t kind = 0; kind < std::variant_size_v<LedgerRequest>; ++kind) {
    LedgerRequest request;
    [&]<size_t... I>(std::index_sequence<I...>) {
      ((kind == I ? (void)request.emplace<I>() : void()), ...);
    }
    (std::make_index_sequence<std::variant_size_v<LedgerRequest>>{});
    if (isPrivilegedAction(request)) privileged.emplace_back(linkRequestName(request));
  }
  EXPECT_EQ(privileged,
            (std::vector<std::string>{"policy publish", "policy rollback", "gateway enroll",
                                      "gateway enable/disable", "shard revoke", "shard write-off",
                                      "operator enroll", "operator enable/disable"}));
}

TEST_F(OperatorAuthorityTest, AnAuditOperatorMayOnlyRead) {
  const LinkPeer ro = identifyOperator(linkKey(20));
  EXPECT_EQ(ro.operator_name, "ro");
  EXPECT_EQ(ro.operator_role, OperatorRole::kAudit);
  EXPECT_EQ(allowedKinds(linkKey(20)), kindsWhere(isReadKind));
  EXPECT_EQ(kindsWhere(isReadKind).size(), 10u);
  EXPECT_EQ(linkRefusal(ro, PublishPolicyRequest{}).value_or(""),
            "policy publish refused: operator 'ro' has role audit, and it needs role policy or "
            "admin");
  EXPECT_THAT(linkRefusal(ro, ReserveRequest{}).value_or(""), HasSubstr("needs role admin"));
}

TEST_F(OperatorAuthorityTest, APolicyOperatorMayPublishAndRollBackButNotEnrollAGateway) {
  std::vector<std::string> expected;
  for (const LedgerRequest& request : everyKind()) {
    if (isReadKind(request) || isPolicyKind(request)) {
      expected.emplace_back(linkRequestName(request));
    }
  }
  EXPECT_EQ(allowedKinds(linkKey(21)), expected);
  const LinkPeer pol = identifyOperator(linkKey(21));
  EXPECT_EQ(linkRefusal(pol, EnrollGatewayRequest{}).value_or(""),
            "gateway enroll refused: operator 'pol' has role policy, and it needs role admin");
  EXPECT_TRUE(linkRefusal(pol, EnrollGatewayRequest{.rotate = true}).has_value());
  EXPECT_TRUE(linkRefusal(pol, SetGatewayEnabledRequest{}).has_value());
  EXPECT_TRUE(linkRefusal(pol, RevokeShardsRequest{}).has_value());
}

TEST_F(OperatorAuthorityTest, AShardsOperatorMayRevokeAndWriteOffButNotPublish) {
  std::vector<std::string> expected;
  for (const LedgerRequest& request : everyKind()) {
    if (isReadKind(request) || isShardsKind(request)) {
      expected.emplace_back(linkRequestName(request));
    }
  }
  EXPECT_EQ(allowedKinds(linkKey(22)), expected);
  EXPECT_THAT(linkRefusal(identifyOperator(linkKey(22)), PublishPolicyRequest{}).value_or(""),
              HasSubstr("operator 'sh' has role shards, and it needs role policy or admin"));
}

TEST_F(OperatorAuthorityTest, EveryAdminOperatorMaySendEveryRequest) {
  EXPECT_EQ(identifyOperator(linkKey(23)).operator_name, "adm2");
  EXPECT_EQ(allowedKinds(linkKey(23)).size(), std::variant_size_v<LedgerRequest>);
}

TEST_F(OperatorAuthorityTest, ADisabledOperatorsKeyIsNobodyAndMaySendNothing) {
  const LinkPeer gone = identifyOperator(linkKey(24));
  EXPECT_EQ(gone.role, LinkRole::kNobody);
  EXPECT_EQ(gone.operator_name, "gone");
  EXPECT_EQ(gone.why_nobody, "operator 'gone' is disabled");
  for (const LedgerRequest& request : everyKind()) {
    const std::optional<std::string> refusal = linkRefusal(gone, request);
    ASSERT_TRUE(refusal.has_value()) << linkRequestName(request);
    EXPECT_THAT(*refusal, HasSubstr("operator 'gone' is disabled"));
  }
}

TEST_F(OperatorAuthorityTest, GatewayKeysAreStillGatewaysAndTheZeroKeyIsNoOperator) {
  EXPECT_EQ(identifyOperator(linkKey(1)).role, LinkRole::kGateway);
  std::vector<OperatorRecord> unset = {OperatorRecord{.name = "unset"}};  // zero key
  EXPECT_EQ(identifyLinkPeer(ledger_.shards(), unset, PublicKey{}, now_ms_).role,
            LinkRole::kNobody);
}

TEST(OperatorRoleTest, RolesHaveNamesThatParseBack) {
  for (OperatorRole role :
       {OperatorRole::kAudit, OperatorRole::kPolicy, OperatorRole::kShards, OperatorRole::kAdmin}) {
    EXPECT_EQ(parseOperatorRole(operatorRoleName(role)), role);
    EXPECT_TRUE(operatorRoleAllows(role, OperatorRole::kAudit));
    EXPECT_TRUE(operatorRoleAllows(OperatorRole::kAdmin, role));
  }
  EXPECT_EQ(parseOperatorRole("root"), std::nullopt);
  EXPECT_EQ(parseOperatorRole("Admin"), std::nullopt);
  EXPECT_EQ(parseOperatorRole(""), std::nullopt);
  EXPECT_FALSE(operatorRoleAllows(OperatorRole::kPolicy, OperatorRole::kShards));
  EXPECT_FALSE(operatorRoleAllows(OperatorRole::kShards, OperatorRole::kPolicy));
  EXPECT_FALSE(operatorRoleAllows(OperatorRole::kAudit, OperatorRole::kPolicy));
  EXPECT_FALSE(operatorRoleAllows(OperatorRole::kPolicy, OperatorRole::kAdmin));
}

}  // namespace
}  // namespace tally
