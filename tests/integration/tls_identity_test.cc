// Who a TLS connection to the ledger is (docs/security.md "The link", core/link_authority.h),
// with the real tally-ledger: every request is checked against the key the connection
// presented — a gateway acts only as itself and sends no operator request; the operator key may
// do everything.

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "shard/crypto.h"
#include "shard/identity.h"
#include "tests/integration/ledger_harness.h"
#include "tests/integration/tls_link_fixture.h"

namespace tally::testing {
namespace {

identity::KeyPair seededKey(uint8_t fill) {
  identity::Seed seed{};
  seed.fill(fill);
  return identity::keyPairFromSeed(seed);
}

// The answer to `body` on `client`, or a failed expectation and a default answer.
wire::ResponseBody answerTo(client::BlockingClient& client, const wire::RequestBody& body) {
  Result<wire::Response> response = client.call(body, kCallTimeoutMs);
  EXPECT_TRUE(response.isOk()) << response.status().toString();
  return response.isOk() ? response.value().body : wire::ResponseBody{};
}

// The permission-denied message of `body`, or "" (with a failed expectation) if it is another
// answer.
std::string refusalOf(const wire::ResponseBody& body) {
  const auto* error = std::get_if<wire::ErrorReply>(&body);
  if (error == nullptr || error->code != wire::ErrorCode::kPermissionDenied) {
    ADD_FAILURE() << "expected PERMISSION_DENIED, got " << wire::describe(body);
    return {};
  }
  return error->message;
}

// Enrolls gw-a with `key_a` and gw-b with `key_b` on the operator's connection.
void enrollGateways(client::BlockingClient& as_operator, const identity::KeyPair& key_a,
                    const identity::KeyPair& key_b) {
  for (const auto& [name, key] : {std::pair{"gw-a", key_a}, std::pair{"gw-b", key_b}}) {
    const wire::ResponseBody enrolled =
        answerTo(as_operator,
                 wire::EnrollGatewayRequest{.gateway_name = name, .public_key = key.public_key});
    ASSERT_TRUE(std::holds_alternative<GatewayReply>(enrolled)) << wire::describe(enrolled);
    ASSERT_EQ(std::get<GatewayReply>(enrolled).code, ReplyCode::kOk);
  }
}

class TlsIdentityTest : public TlsLinkFixture {};

TEST_F(TlsIdentityTest, AGatewayPresentingItsOwnKeyCannotReconcileAnotherGatewaysShard) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  TALLY_ASSIGN_OR_FAIL(identity::KeyPair operator_key, identity::loadKeyPair(operatorKey()));
  const identity::KeyPair key_a = seededKey(11);
  const identity::KeyPair key_b = seededKey(12);
  TALLY_ASSIGN_OR_FAIL(std::unique_ptr<client::BlockingClient> as_operator,
                       tlsClient(operator_key));
  Budget budget = makeBudget({.subject = "tenant-1", .route = "chat", .burst = 1000});
  budget.emergency = {.enabled = true, .shard_units = 100, .shard_ttl_ms = 600'000};
  TALLY_ASSIGN_OR_FAIL(PolicyReply published, testing::publishPolicy(*as_operator, {budget}));
  ASSERT_EQ(published.code, ReplyCode::kOk) << published.message;
  ASSERT_NO_FATAL_FAILURE(enrollGateways(*as_operator, key_a, key_b));
  TALLY_ASSIGN_OR_FAIL(std::unique_ptr<client::BlockingClient> as_a, tlsClient(key_a));
  TALLY_ASSIGN_OR_FAIL(std::unique_ptr<client::BlockingClient> as_b, tlsClient(key_b));

  // gw-a is issued a shard on its own connection.
  auto issueRequestOfA = [&](const std::string& request_id) {
    ShardIssueRequest request{.request_id = request_id,
                              .gateway_name = "gw-a",
                              .gateway_id = key_a.public_key,
                              .gateway_boot_epoch = 1,
                              .subject = "tenant-1",
                              .route = "chat"};
    wire::signIssueRequest(key_a, &request);
    return request;
  };
  const wire::ResponseBody issued = answerTo(*as_a, issueRequestOfA("q1"));
  ASSERT_TRUE(std::holds_alternative<ShardReply>(issued)) << wire::describe(issued);
  ASSERT_EQ(std::get<ShardReply>(issued).code, ReplyCode::kOk);
  const ShardGrant grant = std::get<ShardReply>(issued).shards.at(0).grant;

  // A report of that shard, as gw-a signs it: 30 spent, 70 proven unused.
  ShardReport report{.shard = grant,
                     .balances = {.allocated = 100, .local_spent = 30, .local_retired = 70},
                     .receipts = {Reservation{.reservation_id = "s1",
                                              .subject = "tenant-1",
                                              .route = "chat",
                                              .reserved_units = 40,
                                              .actual_units = 30,
                                              .operation_id = "op-s1",
                                              .state = ReservationState::kSettled,
                                              .origin = grant.shard_id}},
                     .gateway_boot_epoch = 1,
                     .reported_at_ms = wallNowMs()};
  wire::signReport(key_a, &report);

  // gw-b, presenting its own enrolled key, sends it (as a relay of gw-a's bytes would): refused
  // before the ledger looks at it, and so is every other request naming gw-a.
  const std::string refused_report = refusalOf(answerTo(*as_b, report));
  EXPECT_NE(refused_report.find("shard report refused: gateway 'gw-b' may act only for itself"),
            std::string::npos)
      << refused_report;
  EXPECT_NE(refused_report.find("names gateway 'gw-a'"), std::string::npos) << refused_report;
  (void)refusalOf(answerTo(
      *as_b, wire::ShardStatusRequest{.gateway_name = "gw-a", .shard_ids = {grant.shard_id}}));
  (void)refusalOf(answerTo(*as_b, issueRequestOfA("q2")));
  (void)refusalOf(answerTo(*as_b, wire::ListShardsRequest{}));  // every gateway's shards
  EXPECT_NE(ledger_->log().find("event=request_refused"), std::string::npos) << ledger_->log();
  EXPECT_NE(ledger_->log().find("gateway=gw-b request=\"shard report\""), std::string::npos)
      << ledger_->log();

  // Nothing was reconciled: the shard is still ISSUED.
  const wire::ResponseBody listed = answerTo(*as_operator, wire::ListShardsRequest{});
  ASSERT_TRUE(std::holds_alternative<ShardReply>(listed)) << wire::describe(listed);
  ASSERT_EQ(std::get<ShardReply>(listed).shards.size(), 1u);
  EXPECT_EQ(std::get<ShardReply>(listed).shards[0].state, ShardState::kIssued);

  // The same report on gw-a's own connection reconciles: only the binding refused it.
  const wire::ResponseBody reconciled = answerTo(*as_a, report);
  ASSERT_TRUE(std::holds_alternative<ShardReply>(reconciled)) << wire::describe(reconciled);
  EXPECT_EQ(std::get<ShardReply>(reconciled).code, ReplyCode::kOk);
  EXPECT_EQ(std::get<ShardReply>(reconciled).reminted_units, 70u);
  EXPECT_EQ(std::get<ShardReply>(reconciled).shards.at(0).state, ShardState::kReconciled);
}

// A reservation is bound to the gateway whose connection reserved it: another enrolled gateway,
// presenting its own key, can neither act on it nor read it, before or after a kill -9.
TEST_F(TlsIdentityTest, AGatewayCannotActOnAnotherGatewaysReservationEvenAfterARestart) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  TALLY_ASSIGN_OR_FAIL(identity::KeyPair operator_key, identity::loadKeyPair(operatorKey()));
  const identity::KeyPair key_a = seededKey(21);
  const identity::KeyPair key_b = seededKey(22);
  {
    TALLY_ASSIGN_OR_FAIL(std::unique_ptr<client::BlockingClient> as_operator,
                         tlsClient(operator_key));
    TALLY_ASSIGN_OR_FAIL(
        PolicyReply published,
        testing::publishPolicy(
            *as_operator, {makeBudget({.subject = "tenant-1", .route = "chat", .burst = 1000})}));
    ASSERT_EQ(published.code, ReplyCode::kOk) << published.message;
    ASSERT_NO_FATAL_FAILURE(enrollGateways(*as_operator, key_a, key_b));
  }
  const ReserveRequest reserve = makeReserve({.id = "r1", .units = 100});
  const StartRequest start_as_b{.reservation_id = "r1", .operation_id = "op-b"};
  const SettleRequest settle_as_b{
      .reservation_id = "r1", .operation_id = "op-b", .actual_units = 1};
  {
    TALLY_ASSIGN_OR_FAIL(std::unique_ptr<client::BlockingClient> as_a, tlsClient(key_a));
    TALLY_ASSIGN_OR_FAIL(ReservationReply reserved, callReservation(*as_a, reserve));
    ASSERT_EQ(reserved.code, ReplyCode::kOk) << describe(reserved);
    EXPECT_EQ(reserved.receipt.gateway_name, "gw-a");
    TALLY_ASSIGN_OR_FAIL(std::unique_ptr<client::BlockingClient> as_b, tlsClient(key_b));
    const std::string refused = refusalOf(answerTo(*as_b, start_as_b));
    EXPECT_NE(refused.find("start refused: reservation 'r1' belongs to gateway 'gw-a', and this "
                           "connection is gateway 'gw-b'"),
              std::string::npos)
        << refused;
    (void)refusalOf(answerTo(*as_b, settle_as_b));
    (void)refusalOf(answerTo(*as_b, ReleaseRequest{.reservation_id = "r1"}));
    (void)refusalOf(answerTo(*as_b, QueryRequest{.reservation_id = "r1"}));
    (void)refusalOf(answerTo(*as_b, reserve));  // not even its repeat
  }
  EXPECT_NE(ledger_->log().find("event=reservation_refused gateway=gw-b reservation_id=r1 "
                                "bound_gateway=gw-a"),
            std::string::npos)
      << ledger_->log();

  // The binding is durable: after a kill -9, gw-b is still refused and gw-a still served.
  ledger_->kill9();
  ASSERT_NO_FATAL_FAILURE(startLedger());
  TALLY_ASSIGN_OR_FAIL(std::unique_ptr<client::BlockingClient> as_a, tlsClient(key_a));
  TALLY_ASSIGN_OR_FAIL(std::unique_ptr<client::BlockingClient> as_b, tlsClient(key_b));
  (void)refusalOf(answerTo(*as_b, settle_as_b));
  TALLY_ASSIGN_OR_FAIL(ReservationReply queried,
                       callReservation(*as_a, QueryRequest{.reservation_id = "r1"}));
  EXPECT_EQ(queried.receipt.state, ReservationState::kReserved) << describe(queried);
  TALLY_ASSIGN_OR_FAIL(
      ReservationReply started,
      callReservation(*as_a, StartRequest{.reservation_id = "r1", .operation_id = "op-a"}));
  EXPECT_EQ(started.receipt.state, ReservationState::kStarted) << describe(started);
  TALLY_ASSIGN_OR_FAIL(ReservationReply settled,
                       callReservation(*as_a, SettleRequest{.reservation_id = "r1",
                                                            .operation_id = "op-a",
                                                            .actual_units = 40}));
  EXPECT_EQ(settled.receipt.state, ReservationState::kSettled) << describe(settled);
  EXPECT_EQ(settled.refunded_units, 60u);
}

TEST_F(TlsIdentityTest, AGatewayKeyCannotPublishAPolicyNorSendAnyOtherOperatorRequest) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publishPolicy());  // generation 1, as the operator
  const std::string agent_dir = dir_.file("agent");
  const std::string gateway_key = agentIdentity(agent_dir, "gw-1");
  ASSERT_EQ(asOperator({"gateway", "enroll", "--id", "gw-1", "--public-key", gateway_key}).code, 0);
  const std::string ledger_key = ledgerPublicKey();
  auto asGateway = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--ledger", address_, "--key", agent_dir + "/gateway.key",
                               "--ledger-key", ledger_key, "--json"});
    return tallyctl(args);
  };

  // Admitted: what a gateway may ask is served.
  const CtlRun health = asGateway({"health"});
  EXPECT_EQ(health.code, 0) << health.output;

  const CtlRun published = asGateway({"policy", "publish", dir_.file("policy.toml")});
  EXPECT_EQ(published.code, 11) << published.output;
  EXPECT_NE(published.output.find("PERMISSION_DENIED"), std::string::npos) << published.output;
  EXPECT_NE(published.output.find("policy publish refused: an operator request, and this "
                                  "connection is gateway 'gw-1'"),
            std::string::npos)
      << published.output;
  for (const std::vector<std::string>& operator_request : std::vector<std::vector<std::string>>{
           {"policy", "rollback"},
           {"gateway", "enroll", "--id", "gw-2", "--public-key", gateway_key},
           {"gateway", "list"},
           {"gateway", "disable", "--id", "gw-1"},
           {"shard", "revoke", "--gateway", "gw-1"},
           {"shard", "write-off", "--id", "no-such-shard"}}) {
    const CtlRun refused = asGateway(operator_request);
    EXPECT_EQ(refused.code, 11) << operator_request[0] << " " << operator_request[1] << ": "
                                << refused.output;
    EXPECT_NE(refused.output.find("an operator request"), std::string::npos) << refused.output;
  }
  EXPECT_NE(ledger_->log().find("event=request_refused"), std::string::npos) << ledger_->log();
  EXPECT_NE(ledger_->log().find("role=gateway gateway=gw-1 request=\"policy publish\""),
            std::string::npos)
      << ledger_->log();

  // Nothing changed: generation 1 is still the active policy, gw-1 still enabled.
  const CtlRun shown = asOperator({"policy", "show"});
  ASSERT_EQ(shown.code, 0) << shown.output;
  EXPECT_NE(shown.output.find("\"policyGeneration\":1"), std::string::npos) << shown.output;
  const CtlRun gateways = asOperator({"gateway", "list"});
  ASSERT_EQ(gateways.code, 0) << gateways.output;
  EXPECT_NE(gateways.output.find("\"enabled\":true"), std::string::npos) << gateways.output;
}

// The agent's socket is no side door: a gateway peer of it may use the reservation requests and
// the reads, not the operator requests, which the agent refuses before they reach its link.
TEST_F(TlsIdentityTest, GatewayPeersOfTheAgentSocketCannotPublishOrRollBackAPolicy) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publishPolicy());  // generation 1, as the operator
  const std::string agent_dir = dir_.file("agent");
  const std::string gateway_key = agentIdentity(agent_dir, "gw-1");
  ASSERT_EQ(asOperator({"gateway", "enroll", "--id", "gw-1", "--public-key", gateway_key}).code, 0);
  ASSERT_NO_FATAL_FAILURE(startAgent(agent_dir, ledgerPublicKey()));
  auto viaAgent = [&](std::vector<std::string> args) {
    args.insert(args.begin(), {"--agent", agent_socket_, "--json"});
    return tallyctl(args);
  };

  // Served through the agent: reserve (once the agent has fetched the policy), query, release,
  // and the reads.
  CtlRun reserved;
  ASSERT_TRUE(eventually([&] {
    reserved = viaAgent(
        {"reserve", "--id", "r1", "--subject", "tenant-1", "--route", "chat", "--units", "10"});
    return reserved.code == 0;
  })) << reserved.output;
  EXPECT_EQ(viaAgent({"query", "--id", "r1"}).code, 0);
  EXPECT_EQ(viaAgent({"release", "--id", "r1"}).code, 0);
  EXPECT_EQ(viaAgent({"policy", "show"}).code, 0);
  EXPECT_EQ(viaAgent({"audit"}).code, 0);

  // Refused by the agent: publish and rollback (permission denied), as enroll, revoke and
  // write-off already were (not served).
  for (const std::vector<std::string>& change : std::vector<std::vector<std::string>>{
           {"policy", "publish", dir_.file("policy.toml")}, {"policy", "rollback"}}) {
    const CtlRun refused = viaAgent(change);
    EXPECT_EQ(refused.code, 11) << change[1] << ": " << refused.output;
    EXPECT_NE(refused.output.find("PERMISSION_DENIED"), std::string::npos) << refused.output;
    EXPECT_NE(refused.output.find("not served on the agent's socket"), std::string::npos)
        << refused.output;
  }
  for (const std::vector<std::string>& operator_request : std::vector<std::vector<std::string>>{
           {"gateway", "enroll", "--id", "gw-2", "--public-key", gateway_key},
           {"shard", "revoke", "--gateway", "gw-1"},
           {"shard", "write-off", "--id", "no-such-shard"}}) {
    const CtlRun refused = viaAgent(operator_request);
    EXPECT_NE(refused.code, 0) << refused.output;
    EXPECT_NE(refused.output.find("not served by the agent"), std::string::npos) << refused.output;
  }
  // The ledger never saw them: generation 1 is still the active policy, and the agent's link was
  // never refused anything.
  const CtlRun shown = asOperator({"policy", "show"});
  ASSERT_EQ(shown.code, 0) << shown.output;
  EXPECT_NE(shown.output.find("\"policyGeneration\":1"), std::string::npos) << shown.output;
  EXPECT_EQ(ledger_->log().find("event=request_refused"), std::string::npos) << ledger_->log();
}

// `tallyctl gateway disable` cuts the gateway's open connections once the disable is durable,
// not only its next handshake: the agent sees its link lost, and its reconnect refused.
TEST_F(TlsIdentityTest, ADisabledGatewaysOpenConnectionIsCut) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publishPolicy());
  const std::string agent_dir = dir_.file("agent");
  const std::string gateway_key = agentIdentity(agent_dir, "gw-1");
  ASSERT_EQ(asOperator({"gateway", "enroll", "--id", "gw-1", "--public-key", gateway_key}).code, 0);
  ASSERT_NO_FATAL_FAILURE(startAgent(agent_dir, ledgerPublicKey()));
  CtlRun reserved;
  ASSERT_TRUE(eventually([&] {
    reserved = tallyctl({"--agent", agent_socket_, "--json", "reserve", "--id", "r1", "--subject",
                         "tenant-1", "--route", "chat", "--units", "10"});
    return reserved.code == 0;
  })) << reserved.output;
  ASSERT_EQ(agent_->log().find("ledger_link_lost"), std::string::npos) << agent_->log();
  ASSERT_EQ(ledger_->log().find("event=tls_refused"), std::string::npos) << ledger_->log();

  const CtlRun disabled = asOperator({"gateway", "disable", "--id", "gw-1"});
  ASSERT_EQ(disabled.code, 0) << disabled.output;
  EXPECT_TRUE(eventually([&] {
    return ledger_->log().find("event=connection_cut") != std::string::npos &&
           agent_->log().find("ledger_link_lost") != std::string::npos;
  })) << "ledger:\n"
      << ledger_->log() << "\nagent:\n"
      << agent_->log();
  const std::string ledger_log = ledger_->log();
  const size_t cut = ledger_log.find("event=connection_cut");
  ASSERT_NE(cut, std::string::npos);
  EXPECT_NE(ledger_log.find("gateway=gw-1 reason=\"gateway 'gw-1' was disabled\"", cut),
            std::string::npos)
      << ledger_log;
  // Its reconnect is refused at the handshake; nothing more of it is served.
  EXPECT_TRUE(eventually([&] {
    const std::string log = ledger_->log();
    return log.find("event=tls_refused", log.find("event=connection_cut")) != std::string::npos;
  })) << ledger_->log();
  const CtlRun after = tallyctl({"--agent", agent_socket_, "--json", "reserve", "--id", "r2",
                                 "--subject", "tenant-1", "--route", "chat", "--units", "10"});
  EXPECT_NE(after.code, 0) << after.output;
  const CtlRun audit = asOperator({"query", "--id", "r2"});
  EXPECT_EQ(audit.code, 7) << audit.output;  // NOT_FOUND: the ledger never saw r2
}

// `tallyctl gateway rotate`: the new key is the gateway's at once and the old one stays admitted
// during the overlap; the first use of the new key ends the overlap and cuts the old key's
// connections.
TEST_F(TlsIdentityTest, ARotatedGatewayKeepsItsOldKeyUntilTheNewOneIsUsed) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  ASSERT_NO_FATAL_FAILURE(publishPolicy());
  const std::string agent_dir = dir_.file("agent");
  const std::string old_key = agentIdentity(agent_dir, "gw-1");
  ASSERT_EQ(asOperator({"gateway", "enroll", "--id", "gw-1", "--public-key", old_key}).code, 0);
  ASSERT_NO_FATAL_FAILURE(startAgent(agent_dir, ledgerPublicKey()));
  CtlRun reserved;
  ASSERT_TRUE(eventually([&] {
    reserved = tallyctl({"--agent", agent_socket_, "--json", "reserve", "--id", "r1", "--subject",
                         "tenant-1", "--route", "chat", "--units", "10"});
    return reserved.code == 0;
  })) << reserved.output;
  const std::string new_dir = dir_.file("agent-new");
  const std::string new_key = agentIdentity(new_dir, "gw-1");
  const std::string ledger_key = ledgerPublicKey();
  auto withKey = [&](const std::string& dir, std::vector<std::string> args) {
    args.insert(args.begin(), {"--ledger", address_, "--key", dir + "/gateway.key", "--ledger-key",
                               ledger_key, "--json"});
    return tallyctl(args);
  };

  const CtlRun rotated = asOperator(
      {"gateway", "rotate", "--id", "gw-1", "--public-key", new_key, "--overlap-ms", "600000"});
  ASSERT_EQ(rotated.code, 0) << rotated.output;
  EXPECT_NE(rotated.output.find("\"publicKey\":\"" + new_key + "\""), std::string::npos)
      << rotated.output;
  EXPECT_NE(rotated.output.find("\"previousPublicKey\":\"" + old_key + "\""), std::string::npos)
      << rotated.output;
  EXPECT_NE(ledger_->log().find("event=gateway_key_rotated gateway=gw-1"), std::string::npos);

  // During the overlap the old key is still the gateway: its open link is served, and so is a
  // new connection presenting it.
  const CtlRun during = tallyctl({"--agent", agent_socket_, "--json", "reserve", "--id", "r2",
                                  "--subject", "tenant-1", "--route", "chat", "--units", "10"});
  EXPECT_EQ(during.code, 0) << during.output;
  EXPECT_EQ(withKey(agent_dir, {"health"}).code, 0);

  // The new key's first use ends the overlap: the old key's connections are cut, and it is
  // refused from then on.
  const CtlRun first_use = withKey(new_dir, {"health"});
  EXPECT_EQ(first_use.code, 0) << first_use.output;
  EXPECT_TRUE(eventually([&] {
    return ledger_->log().find("event=connection_cut") != std::string::npos &&
           agent_->log().find("ledger_link_lost") != std::string::npos;
  })) << "ledger:\n"
      << ledger_->log() << "\nagent:\n"
      << agent_->log();
  const std::string log = ledger_->log();
  EXPECT_NE(log.find("event=gateway_key_overlap_ended gateway=gw-1"), std::string::npos) << log;
  EXPECT_NE(log.find("reason=\"gateway 'gw-1' was rotated to a new key, now in use\""),
            std::string::npos)
      << log;
  const CtlRun old_after = withKey(agent_dir, {"health"});
  EXPECT_EQ(old_after.code, 11) << old_after.output;
  EXPECT_EQ(withKey(new_dir, {"health"}).code, 0);
  const CtlRun listed = asOperator({"gateway", "list"});
  ASSERT_EQ(listed.code, 0) << listed.output;
  EXPECT_NE(listed.output.find("\"publicKey\":\"" + new_key + "\""), std::string::npos)
      << listed.output;
  EXPECT_EQ(listed.output.find("previousPublicKey"), std::string::npos) << listed.output;
}

// The overlap is durable (a restarted ledger still admits the old key), and once its window ends
// the old key is refused even if the new one was never used.
TEST_F(TlsIdentityTest, TheOldKeyIsRefusedWhenTheOverlapWindowEndsAndTheWindowSurvivesARestart) {
  ASSERT_NO_FATAL_FAILURE(startLedger());
  const std::string old_dir = dir_.file("gw-old");
  const std::string old_key = agentIdentity(old_dir, "gw-1");
  const std::string second_dir = dir_.file("gw-second");
  const std::string second_key = agentIdentity(second_dir, "gw-1");
  const std::string third_dir = dir_.file("gw-third");
  const std::string third_key = agentIdentity(third_dir, "gw-1");
  ASSERT_EQ(asOperator({"gateway", "enroll", "--id", "gw-1", "--public-key", old_key}).code, 0);
  ASSERT_EQ(asOperator({"gateway", "rotate", "--id", "gw-1", "--public-key", second_key,
                        "--overlap-ms", "600000"})
                .code,
            0);
  const std::string ledger_key = ledgerPublicKey();
  auto health = [&](const std::string& dir) {
    return tallyctl({"--ledger", address_, "--key", dir + "/gateway.key", "--ledger-key",
                     ledger_key, "health"});
  };

  ledger_->kill9();
  ASSERT_NO_FATAL_FAILURE(startLedger());
  const CtlRun listed = asOperator({"gateway", "list"});
  ASSERT_EQ(listed.code, 0) << listed.output;
  EXPECT_NE(listed.output.find("\"previousPublicKey\":\"" + old_key + "\""), std::string::npos)
      << listed.output;
  EXPECT_EQ(health(old_dir).code, 0);

  // A second rotation within the window: the old key stays the previous one (it is the key the
  // gateway has been using), now for 300 ms; the unused second key is nobody at once.
  ASSERT_EQ(asOperator({"gateway", "rotate", "--id", "gw-1", "--public-key", third_key,
                        "--overlap-ms", "300"})
                .code,
            0);
  EXPECT_EQ(health(second_dir).code, 11);
  CtlRun refused;
  EXPECT_TRUE(eventually([&] {
    refused = health(old_dir);
    return refused.code == 11;
  })) << refused.output;
  EXPECT_EQ(health(third_dir).code, 0);
}

}  // namespace
}  // namespace tally::testing
