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
         std::holds_alternative<WriteOffShardRequest>(request);
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
    return identifyLinkPeer(ledger_.shards(), kOperatorKey, key, hint);
  }

  Ledger ledger_;
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
  EXPECT_EQ(refused, 7);
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

}  // namespace
}  // namespace tally
