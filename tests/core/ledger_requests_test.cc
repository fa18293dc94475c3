// LedgerRequests (core/ledger_requests.h): every request kind of the protocol, its answer and the
// events the shell reports, without sockets, files or clocks.

#include "core/ledger_requests.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "core/ledger.h"
#include "core/link_authority.h"
#include "tests/core/shard_fake_crypto.h"

namespace tally {

static void PrintTo(ReplyCode code, std::ostream* os) { *os << replyCodeName(code); }
static void PrintTo(ErrorCode code, std::ostream* os) { *os << errorCodeName(code); }

namespace {

using ::testing::ElementsAre;
using testing::FakeShardCrypto;
using ::testing::HasSubstr;
using testing::signIssue;
using testing::signReport;

constexpr uint64_t kT0 = 1'700'000'000'000;
constexpr uint64_t kShardTtlMs = 60'000;
const std::string kSubject = "tenant-7";
const std::string kRoute = "/v1/chat";
const std::string kGateway = "gw-a";

Budget budget(const std::string& subject = kSubject, const std::string& route = kRoute) {
  return Budget{
      .subject_pattern = subject,
      .route = route,
      .unit = "tokens",
      .refill_per_second = 0,
      .burst = 1000,
      .max_single_reservation = 1000,
      .hold_ttl_ms = 30'000,
      .hard_execution_limit_ms = 60'000,
      .max_overdraft = 5,
      .emergency = {.enabled = true, .shard_units = 100, .shard_ttl_ms = kShardTtlMs},
  };
}

PublicKey keyOf(uint8_t seed) {
  PublicKey key{};
  key.fill(seed);
  return key;
}

template <typename T>
const T& replyAs(const LedgerOutcome& outcome) {
  const T* reply = std::get_if<T>(&outcome.reply);
  if (reply == nullptr) {
    ADD_FAILURE() << "reply alternative " << outcome.reply.index();
    static const T empty{};
    return empty;
  }
  return *reply;
}

template <typename T>
std::vector<T> eventsOf(const LedgerOutcome& outcome) {
  std::vector<T> found;
  for (const LedgerEvent& event : outcome.events) {
    if (const T* e = std::get_if<T>(&event)) found.push_back(*e);
  }
  return found;
}

class LedgerRequestsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ledger_.setShardCrypto(&crypto_);
    const LedgerOutcome published =
        requests_.apply(PublishPolicyRequest{.budgets = {budget(), budget("tenant-8")}}, kT0);
    ASSERT_EQ(replyAs<PolicyAnswer>(published).reply.code, ReplyCode::kOk);
    (void)ledger_.takeChangedRows();
  }

  LedgerOutcome reserve(const std::string& id, Units units, const std::string& subject = kSubject,
                        uint64_t now_ms = kT0) {
    return requests_.apply(
        ReserveRequest{.reservation_id = id, .subject = subject, .route = kRoute, .units = units},
        now_ms);
  }

  ShardIssueRequest issueRequest(const std::string& request_id, const std::string& gateway,
                                 uint8_t key) {
    ShardIssueRequest r{.request_id = request_id,
                        .gateway_name = gateway,
                        .gateway_id = keyOf(key),
                        .gateway_boot_epoch = 1,
                        .subject = kSubject,
                        .route = kRoute};
    signIssue(&r);
    return r;
  }

  ShardGrant enrolledAndIssued() {
    EXPECT_EQ(replyAs<GatewayReply>(
                  requests_.apply(
                      EnrollGatewayRequest{.gateway_name = kGateway, .public_key = keyOf(1)}, kT0))
                  .code,
              ReplyCode::kOk);
    const LedgerOutcome issued = requests_.apply(issueRequest("req-1", kGateway, 1), kT0);
    const ShardReply& reply = replyAs<ShardReply>(issued);
    EXPECT_EQ(reply.code, ReplyCode::kOk) << reply.message;
    return reply.shards.empty() ? ShardGrant{} : reply.shards.front().grant;
  }

  static ShardReport report(const ShardGrant& grant, ShardBalances balances,
                            std::vector<Reservation> receipts) {
    balances.allocated = grant.allocated_units;
    ShardReport r{.shard = grant,
                  .balances = balances,
                  .receipts = std::move(receipts),
                  .gateway_boot_epoch = 1,
                  .reported_at_ms = kT0};
    signReport(&r);
    return r;
  }

  static Reservation receipt(const ShardGrant& grant, const std::string& id, ReservationState state,
                             Units reserved_units, Units actual_units) {
    return Reservation{.reservation_id = id,
                       .subject = kSubject,
                       .route = kRoute,
                       .reserved_units = reserved_units,
                       .actual_units = actual_units,
                       .operation_id = "op-" + id,
                       .state = state,
                       .origin = grant.shard_id};
  }

  FakeShardCrypto crypto_;
  Ledger ledger_;
  LedgerRequests requests_{&ledger_, "9.9.9-test"};
};

// ---- every kind is answered -------------------------------------------------------------------

TEST_F(LedgerRequestsTest, EveryRequestKindIsAnsweredEvenWhenEmpty) {
  // A default-constructed request of each kind is what a peer sending an empty message of that
  // kind gets decoded to: each is a typed answer (never an assertion), and the right one.
  const std::vector<size_t> expected_reply = {
      4,                    // UnknownMessage → ErrorReply
      0, 0, 0, 0, 0, 0, 0,  // the reservation requests → ReservationReply
      2,                    // audit → AuditReport
      3,                    // health → HealthReply
      1, 1, 1,              // publish, rollback, show → PolicyAnswer
      5, 5, 5,              // enroll, list, enable → GatewayReply
      6, 6, 6, 6, 6, 6,     // the shard requests → ShardReply
      0,                    // extend → ReservationReply
      7, 7, 7,              // operator enroll, enable, list → OperatorReply
      8,                    // audit log → AuditLogReply
  };
  ASSERT_EQ(expected_reply.size(), std::variant_size_v<LedgerRequest>);
  for (size_t kind = 0; kind < std::variant_size_v<LedgerRequest>; ++kind) {
    LedgerRequest request;
    [&]<size_t... I>(std::index_sequence<I...>) {
      ((I == kind ? (void)request.emplace<I>() : (void)0), ...);
    }
    (std::make_index_sequence<std::variant_size_v<LedgerRequest>>{});
    const LedgerOutcome outcome = requests_.apply(request, kT0);
    EXPECT_EQ(outcome.reply.index(), expected_reply[kind]) << "request kind " << kind;
  }
  EXPECT_TRUE(ledger_.audit(kT0).conserved);
}

TEST_F(LedgerRequestsTest, AnUnknownKindIsATypedErrorNamingIt) {
  const LedgerOutcome outcome = requests_.apply(UnknownMessage{.which = 77}, kT0);
  const ErrorReply& error = replyAs<ErrorReply>(outcome);
  EXPECT_EQ(error.code, ErrorCode::kUnknownMessage);
  EXPECT_EQ(error.message, "unknown request kind 77");
  EXPECT_TRUE(outcome.events.empty());
  EXPECT_TRUE(ledger_.takeChangedRows().empty());
}

TEST_F(LedgerRequestsTest, InvalidReservationRequestsAreDomainAnswers) {
  EXPECT_EQ(replyAs<ReservationReply>(reserve("", 5)).code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(replyAs<ReservationReply>(reserve("r0", 0)).code, ReplyCode::kInvalidArgument);
  EXPECT_EQ(
      replyAs<ReservationReply>(
          requests_.apply(SettleRequest{.reservation_id = "never", .operation_id = "op"}, kT0))
          .code,
      ReplyCode::kNotFound);
}

// ---- the reservation lifecycle ------------------------------------------------------------------

TEST_F(LedgerRequestsTest, TheLifecycleGoesToTheLedger) {
  ReservationReply reply = replyAs<ReservationReply>(reserve("r1", 10));
  ASSERT_EQ(reply.code, ReplyCode::kOk) << reply.message;
  EXPECT_EQ(reply.receipt.state, ReservationState::kReserved);
  reply = replyAs<ReservationReply>(
      requests_.apply(StartRequest{.reservation_id = "r1", .operation_id = "op-1"}, kT0 + 1));
  EXPECT_EQ(reply.receipt.state, ReservationState::kStarted);
  reply = replyAs<ReservationReply>(
      requests_.apply(MarkUnknownRequest{.reservation_id = "r1", .operation_id = "op-1"}, kT0 + 2));
  EXPECT_EQ(reply.receipt.state, ReservationState::kUsageUnknown);
  const LedgerOutcome receipt = requests_.apply(
      ReportOperationRequest{.reservation_id = "r1", .operation_id = "op-1", .actual_units = 4},
      kT0 + 3);
  EXPECT_EQ(replyAs<ReservationReply>(receipt).receipt.state, ReservationState::kSettled);
  EXPECT_TRUE(receipt.events.empty());  // no breach
  reply = replyAs<ReservationReply>(requests_.apply(QueryRequest{.reservation_id = "r1"}, kT0 + 4));
  EXPECT_EQ(reply.receipt.actual_units, 4u);

  ASSERT_EQ(replyAs<ReservationReply>(reserve("r2", 10)).code, ReplyCode::kOk);
  reply = replyAs<ReservationReply>(requests_.apply(ReleaseRequest{.reservation_id = "r2"}, kT0));
  EXPECT_EQ(reply.receipt.state, ReservationState::kReleased);
  EXPECT_EQ(reply.refunded_units, 10u);
  EXPECT_FALSE(ledger_.takeChangedRows().empty());
}

TEST_F(LedgerRequestsTest, ABreachIsReportedOnceWhenApplied) {
  ASSERT_EQ(replyAs<ReservationReply>(reserve("r1", 10)).code, ReplyCode::kOk);
  ASSERT_EQ(replyAs<ReservationReply>(
                requests_.apply(StartRequest{.reservation_id = "r1", .operation_id = "op"}, kT0))
                .code,
            ReplyCode::kOk);
  // max overdraft 5: settling at 1000 + 10 over the remaining 990 leaves debt far above it.
  const SettleRequest settle{.reservation_id = "r1", .operation_id = "op", .actual_units = 2000};
  const LedgerOutcome first = requests_.apply(settle, kT0);
  ASSERT_EQ(replyAs<ReservationReply>(first).receipt.state, ReservationState::kSettledWithDebt);
  const std::vector<OverdraftBreached> breaches = eventsOf<OverdraftBreached>(first);
  ASSERT_EQ(breaches.size(), 1u);
  EXPECT_EQ(breaches.front().receipt.reservation_id, "r1");
  EXPECT_EQ(breaches.front().receipt.actual_units, 2000u);
  const LedgerOutcome again = requests_.apply(settle, kT0 + 1);
  EXPECT_TRUE(replyAs<ReservationReply>(again).duplicate);
  EXPECT_TRUE(again.events.empty());
}

// ---- reservations bound to a gateway -------------------------------------------------------

TEST_F(LedgerRequestsTest, AReservationIsItsGatewaysAloneAndAnOperatorMayActOnAny) {
  const ReserveRequest reserve_r1{
      .reservation_id = "r1", .subject = kSubject, .route = kRoute, .units = 10};
  const LedgerOutcome reserved = requests_.apply(reserve_r1, kT0, "gw-a");
  ASSERT_EQ(replyAs<ReservationReply>(reserved).code, ReplyCode::kOk);
  EXPECT_EQ(replyAs<ReservationReply>(reserved).receipt.gateway_name, "gw-a");
  (void)ledger_.takeChangedRows();

  // Another gateway: every request on r1 is refused, changing nothing, and reported.
  const std::vector<LedgerRequest> foreign = {
      reserve_r1,
      StartRequest{.reservation_id = "r1", .operation_id = "op-b"},
      SettleRequest{.reservation_id = "r1", .operation_id = "op-b", .actual_units = 1},
      ReleaseRequest{.reservation_id = "r1"},
      MarkUnknownRequest{.reservation_id = "r1", .operation_id = "op-b"},
      ReportOperationRequest{.reservation_id = "r1", .operation_id = "op-b", .actual_units = 1},
      ExtendRequest{.reservation_id = "r1", .operation_id = "op-b", .reserved_units_total = 20},
      QueryRequest{.reservation_id = "r1"}};
  for (const LedgerRequest& request : foreign) {
    const LedgerOutcome refused = requests_.apply(request, kT0 + 1, "gw-b");
    const ErrorReply& error = replyAs<ErrorReply>(refused);
    EXPECT_EQ(error.code, ErrorCode::kPermissionDenied) << linkRequestName(request);
    EXPECT_THAT(error.message, HasSubstr("reservation 'r1' belongs to gateway 'gw-a'"));
    const std::vector<ReservationRefused> events = eventsOf<ReservationRefused>(refused);
    ASSERT_EQ(events.size(), 1u) << linkRequestName(request);
    EXPECT_EQ(events.front().gateway_name, "gw-b");
    EXPECT_EQ(events.front().bound_gateway_name, "gw-a");
  }
  EXPECT_TRUE(ledger_.takeChangedRows().empty());
  EXPECT_EQ(ledger_.findReservation("r1")->state, ReservationState::kReserved);

  // Its own gateway starts it; an operator (no gateway) may settle it.
  ReservationReply reply = replyAs<ReservationReply>(requests_.apply(
      StartRequest{.reservation_id = "r1", .operation_id = "op-a"}, kT0 + 2, "gw-a"));
  EXPECT_EQ(reply.receipt.state, ReservationState::kStarted) << reply.message;
  reply = replyAs<ReservationReply>(requests_.apply(
      SettleRequest{.reservation_id = "r1", .operation_id = "op-a", .actual_units = 4}, kT0 + 3));
  EXPECT_EQ(reply.receipt.state, ReservationState::kSettled) << reply.message;
  // A terminal receipt stays bound.
  EXPECT_EQ(
      replyAs<ErrorReply>(requests_.apply(QueryRequest{.reservation_id = "r1"}, kT0 + 4, "gw-b"))
          .code,
      ErrorCode::kPermissionDenied);
  EXPECT_EQ(replyAs<ReservationReply>(
                requests_.apply(QueryRequest{.reservation_id = "r1"}, kT0 + 4, "gw-a"))
                .receipt.actual_units,
            4u);
}

TEST_F(LedgerRequestsTest, AnUnboundReservationIsAnyGatewaysAndAnUnknownIdIsNotFound) {
  // Reserved with no gateway (an operator, an --insecure link, or a record from before binding).
  ASSERT_EQ(replyAs<ReservationReply>(reserve("r1", 10)).receipt.gateway_name, "");
  const ReservationReply started = replyAs<ReservationReply>(
      requests_.apply(StartRequest{.reservation_id = "r1", .operation_id = "op"}, kT0 + 1, "gw-b"));
  EXPECT_EQ(started.receipt.state, ReservationState::kStarted) << started.message;
  EXPECT_EQ(replyAs<ReservationReply>(
                requests_.apply(QueryRequest{.reservation_id = "nope"}, kT0 + 1, "gw-b"))
                .code,
            ReplyCode::kNotFound);
  // A rejection is bound too: its repeat by another gateway is refused.
  const ReserveRequest too_big{
      .reservation_id = "r2", .subject = kSubject, .route = kRoute, .units = 1000};
  ASSERT_EQ(replyAs<ReservationReply>(requests_.apply(too_big, kT0 + 2, "gw-a")).code,
            ReplyCode::kRejected);
  EXPECT_EQ(replyAs<ErrorReply>(requests_.apply(too_big, kT0 + 3, "gw-b")).code,
            ErrorCode::kPermissionDenied);
  const ReservationReply repeat =
      replyAs<ReservationReply>(requests_.apply(too_big, kT0 + 3, "gw-a"));
  EXPECT_EQ(repeat.code, ReplyCode::kRejected);
  EXPECT_TRUE(repeat.duplicate);
}

// ---- audit, health, policies ----------------------------------------------------------------

TEST_F(LedgerRequestsTest, AuditFiltersAccountsButReportsTheWholeVerdict) {
  ASSERT_EQ(replyAs<ReservationReply>(reserve("a", 1)).code, ReplyCode::kOk);
  ASSERT_EQ(replyAs<ReservationReply>(reserve("b", 1, "tenant-8")).code, ReplyCode::kOk);
  const LedgerOutcome all = requests_.apply(AuditRequest{}, kT0 + 5);
  EXPECT_EQ(replyAs<AuditReport>(all).accounts.size(), 2u);
  EXPECT_EQ(replyAs<AuditReport>(all).as_of_ms, kT0 + 5);
  const LedgerOutcome one = requests_.apply(AuditRequest{.subject = "tenant-8"}, kT0 + 5);
  const AuditReport& report = replyAs<AuditReport>(one);
  ASSERT_EQ(report.accounts.size(), 1u);
  EXPECT_EQ(report.accounts.front().key.subject, "tenant-8");
  EXPECT_TRUE(report.conserved);
  const std::vector<Audited> audited = eventsOf<Audited>(one);
  ASSERT_EQ(audited.size(), 1u);
  EXPECT_TRUE(audited.front().conserved);
  EXPECT_EQ(audited.front().violations, 0u);
  EXPECT_TRUE(
      replyAs<AuditReport>(requests_.apply(AuditRequest{.route = "/v2"}, kT0)).accounts.empty());
  EXPECT_EQ(
      replyAs<AuditReport>(requests_.apply(AuditRequest{.subject = kSubject, .route = kRoute}, kT0))
          .accounts.size(),
      1u);
}

TEST_F(LedgerRequestsTest, AnAuditChangesNothing) {
  ASSERT_EQ(replyAs<ReservationReply>(reserve("a", 1)).code, ReplyCode::kOk);
  (void)ledger_.takeChangedRows();
  (void)requests_.apply(AuditRequest{}, kT0 + 10'000);
  EXPECT_TRUE(ledger_.takeChangedRows().empty());
}

TEST_F(LedgerRequestsTest, HealthReportsVersionTimeAndAFailedCommit) {
  HealthReply health = replyAs<HealthReply>(requests_.apply(HealthRequest{}, kT0 + 7));
  EXPECT_EQ(health.status, "ok");
  EXPECT_EQ(health.version, "9.9.9-test");
  EXPECT_EQ(health.now_ms, kT0 + 7);
  requests_.markFailed();
  health = replyAs<HealthReply>(requests_.apply(HealthRequest{}, kT0 + 8));
  EXPECT_EQ(health.status, "failed");
}

TEST_F(LedgerRequestsTest, PublishAndRollbackReportTheirGeneration) {
  LedgerOutcome outcome = requests_.apply(PublishPolicyRequest{.budgets = {budget()}}, kT0 + 1);
  ASSERT_EQ(replyAs<PolicyAnswer>(outcome).reply.code, ReplyCode::kOk);
  EXPECT_EQ(replyAs<PolicyAnswer>(outcome).reply.generation, 2u);
  std::vector<PolicyPublished> published = eventsOf<PolicyPublished>(outcome);
  ASSERT_EQ(published.size(), 1u);
  EXPECT_EQ(published.front().generation, 2u);
  EXPECT_EQ(published.front().budgets, 1u);

  outcome = requests_.apply(RollbackPolicyRequest{}, kT0 + 2);
  ASSERT_EQ(replyAs<PolicyAnswer>(outcome).reply.code, ReplyCode::kOk);
  const std::vector<PolicyRolledBack> rolled_back = eventsOf<PolicyRolledBack>(outcome);
  ASSERT_EQ(rolled_back.size(), 1u);
  EXPECT_EQ(rolled_back.front().generation, replyAs<PolicyAnswer>(outcome).reply.generation);

  // An invalid policy is refused and reports nothing.
  outcome = requests_.apply(PublishPolicyRequest{}, kT0 + 3);
  EXPECT_NE(replyAs<PolicyAnswer>(outcome).reply.code, ReplyCode::kOk);
  EXPECT_TRUE(outcome.events.empty());
}

TEST_F(LedgerRequestsTest, ShowPolicyDefaultsToTheActiveGeneration) {
  ASSERT_EQ(
      replyAs<PolicyAnswer>(requests_.apply(PublishPolicyRequest{.budgets = {budget()}}, kT0 + 1))
          .reply.code,
      ReplyCode::kOk);
  PolicyAnswer answer = replyAs<PolicyAnswer>(requests_.apply(ShowPolicyRequest{}, kT0));
  EXPECT_EQ(answer.reply.code, ReplyCode::kOk);
  EXPECT_EQ(answer.reply.generation, 2u);
  ASSERT_TRUE(answer.policy.has_value());
  EXPECT_EQ(answer.policy->budgets.size(), 1u);

  answer = replyAs<PolicyAnswer>(requests_.apply(ShowPolicyRequest{.generation = 1}, kT0));
  ASSERT_TRUE(answer.policy.has_value());
  EXPECT_EQ(answer.policy->budgets.size(), 2u);

  // An agent's refresh naming the generation it holds: OK, no document; any other, the document.
  answer = replyAs<PolicyAnswer>(requests_.apply(ShowPolicyRequest{.unless_generation = 2}, kT0));
  EXPECT_EQ(answer.reply.code, ReplyCode::kOk);
  EXPECT_EQ(answer.reply.generation, 2u);
  EXPECT_FALSE(answer.policy.has_value());
  answer = replyAs<PolicyAnswer>(requests_.apply(ShowPolicyRequest{.unless_generation = 1}, kT0));
  ASSERT_TRUE(answer.policy.has_value());
  EXPECT_EQ(answer.policy->budgets.size(), 1u);

  answer = replyAs<PolicyAnswer>(requests_.apply(ShowPolicyRequest{.generation = 9}, kT0));
  EXPECT_EQ(answer.reply.code, ReplyCode::kNotFound);
  EXPECT_EQ(answer.reply.generation, 9u);
  EXPECT_EQ(answer.reply.message, "no policy generation 9");
  EXPECT_FALSE(answer.policy.has_value());
}

TEST(LedgerRequestsEmptyTest, ShowPolicyWithNoPolicyIsNotFound) {
  Ledger ledger;
  LedgerRequests requests(&ledger, "v");
  const LedgerOutcome outcome = requests.apply(ShowPolicyRequest{}, kT0);
  EXPECT_EQ(replyAs<PolicyAnswer>(outcome).reply.code, ReplyCode::kNotFound);
  EXPECT_EQ(replyAs<PolicyAnswer>(outcome).reply.message, "no policy generation 0");
}

// ---- gateways and shards ----------------------------------------------------------------------

TEST_F(LedgerRequestsTest, GatewaysEnrollListAndToggleOnce) {
  const EnrollGatewayRequest enroll{.gateway_name = kGateway, .public_key = keyOf(1)};
  LedgerOutcome outcome = requests_.apply(enroll, kT0);
  ASSERT_EQ(replyAs<GatewayReply>(outcome).code, ReplyCode::kOk);
  const std::vector<GatewayEnrolled> enrolled = eventsOf<GatewayEnrolled>(outcome);
  ASSERT_EQ(enrolled.size(), 1u);
  EXPECT_EQ(enrolled.front().gateway_name, kGateway);
  EXPECT_EQ(enrolled.front().public_key, keyOf(1));
  EXPECT_TRUE(requests_.apply(enroll, kT0 + 1).events.empty());  // a duplicate

  EXPECT_EQ(replyAs<GatewayReply>(requests_.apply(ListGatewaysRequest{}, kT0)).gateways.size(), 1u);

  outcome = requests_.apply(SetGatewayEnabledRequest{.gateway_name = kGateway, .enabled = false},
                            kT0 + 2);
  ASSERT_EQ(replyAs<GatewayReply>(outcome).code, ReplyCode::kOk);
  const std::vector<GatewayEnabledSet> set = eventsOf<GatewayEnabledSet>(outcome);
  ASSERT_EQ(set.size(), 1u);
  EXPECT_FALSE(set.front().enabled);
  EXPECT_TRUE(
      requests_.apply(SetGatewayEnabledRequest{.gateway_name = kGateway, .enabled = false}, kT0 + 3)
          .events.empty());
  outcome =
      requests_.apply(SetGatewayEnabledRequest{.gateway_name = "nobody", .enabled = true}, kT0);
  EXPECT_NE(replyAs<GatewayReply>(outcome).code, ReplyCode::kOk);
  EXPECT_TRUE(outcome.events.empty());
}

TEST_F(LedgerRequestsTest, IssueReportsTheGrantOrTheDenial) {
  const ShardGrant grant = enrolledAndIssued();
  EXPECT_EQ(grant.allocated_units, 100u);
  const LedgerOutcome again = requests_.apply(issueRequest("req-1", kGateway, 1), kT0);
  EXPECT_TRUE(replyAs<ShardReply>(again).duplicate);
  EXPECT_TRUE(again.events.empty());

  const LedgerOutcome denied = requests_.apply(issueRequest("req-2", "gw-unknown", 2), kT0);
  EXPECT_TRUE(replyAs<ShardReply>(denied).permission_denied);
  const std::vector<ShardIssueDenied> denials = eventsOf<ShardIssueDenied>(denied);
  ASSERT_EQ(denials.size(), 1u);
  EXPECT_EQ(denials.front().gateway_name, "gw-unknown");
  EXPECT_EQ(denials.front().reason, replyAs<ShardReply>(denied).message);
}

TEST_F(LedgerRequestsTest, TheFirstIssueEventCarriesTheGrant) {
  ASSERT_EQ(replyAs<GatewayReply>(
                requests_.apply(
                    EnrollGatewayRequest{.gateway_name = kGateway, .public_key = keyOf(1)}, kT0))
                .code,
            ReplyCode::kOk);
  const LedgerOutcome issued = requests_.apply(issueRequest("req-1", kGateway, 1), kT0);
  const std::vector<ShardIssued> events = eventsOf<ShardIssued>(issued);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events.front().grant, replyAs<ShardReply>(issued).shards.front().grant);
  EXPECT_EQ(events.front().grant.expires_at_ms, kT0 + kShardTtlMs);
}

TEST_F(LedgerRequestsTest, AReportReconcilesOnce) {
  const ShardGrant grant = enrolledAndIssued();
  const ShardReport r = report(grant, {.local_spent = 30, .local_retired = 70},
                               {receipt(grant, "s1", ReservationState::kSettled, 30, 30)});
  const LedgerOutcome first = requests_.apply(r, kT0);
  ASSERT_EQ(replyAs<ShardReply>(first).code, ReplyCode::kOk) << replyAs<ShardReply>(first).message;
  const std::vector<ShardReconciled> reconciled = eventsOf<ShardReconciled>(first);
  ASSERT_EQ(reconciled.size(), 1u);
  EXPECT_EQ(reconciled.front().view.grant.shard_id, grant.shard_id);
  EXPECT_EQ(reconciled.front().spent_units, 30u);
  EXPECT_EQ(reconciled.front().reminted_units, replyAs<ShardReply>(first).reminted_units);
  EXPECT_EQ(reconciled.front().report_boot_epoch, 1u);
  EXPECT_TRUE(requests_.apply(r, kT0 + 1).events.empty());  // a duplicate
}

TEST_F(LedgerRequestsTest, AnOverspentReportIsAConflict) {
  const ShardGrant grant = enrolledAndIssued();
  const LedgerOutcome outcome =
      requests_.apply(report(grant, {.local_spent = 100, .overspent = 5},
                             {receipt(grant, "s1", ReservationState::kSettledWithDebt, 100, 105)}),
                      kT0);
  ASSERT_EQ(replyAs<ShardReply>(outcome).code, ReplyCode::kOk);
  const std::vector<ShardConflicted> conflicts = eventsOf<ShardConflicted>(outcome);
  ASSERT_EQ(conflicts.size(), 1u);
  EXPECT_EQ(conflicts.front().view.state, ShardState::kConflict);
  EXPECT_EQ(conflicts.front().debt_units, 5u);
  EXPECT_EQ(conflicts.front().spent_units, 100u);
  EXPECT_EQ(conflicts.front().overspent_units, 5u);
  EXPECT_TRUE(eventsOf<ShardReconciled>(outcome).empty());
}

TEST_F(LedgerRequestsTest, ABadlySignedReportIsRefusedAndReported) {
  const ShardGrant grant = enrolledAndIssued();
  ShardReport r = report(grant, {.local_retired = 100}, {});
  r.balances.local_retired = 99;  // tampered after signing
  r.balances.local_available = 1;
  const LedgerOutcome outcome = requests_.apply(r, kT0);
  EXPECT_NE(replyAs<ShardReply>(outcome).code, ReplyCode::kOk);
  const std::vector<ShardReportRefused> refused = eventsOf<ShardReportRefused>(outcome);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_EQ(refused.front().shard_id, grant.shard_id);
  EXPECT_EQ(refused.front().gateway_name, kGateway);
  EXPECT_EQ(refused.front().code, replyAs<ShardReply>(outcome).code);
}

TEST_F(LedgerRequestsTest, StatusAndListAreReads) {
  const ShardGrant grant = enrolledAndIssued();
  (void)ledger_.takeChangedRows();
  LedgerOutcome outcome = requests_.apply(
      ShardStatusRequest{.gateway_name = kGateway, .shard_ids = {grant.shard_id}}, kT0);
  ASSERT_EQ(replyAs<ShardReply>(outcome).shards.size(), 1u);
  outcome = requests_.apply(ListShardsRequest{.state = ShardState::kIssued}, kT0);
  EXPECT_EQ(replyAs<ShardReply>(outcome).shards.size(), 1u);
  outcome = requests_.apply(ListShardsRequest{.state = ShardState::kReconciled}, kT0);
  EXPECT_TRUE(replyAs<ShardReply>(outcome).shards.empty());
  EXPECT_TRUE(outcome.events.empty());
  EXPECT_TRUE(ledger_.takeChangedRows().empty());
}

TEST_F(LedgerRequestsTest, RevokeReportsEachShardOnce) {
  const ShardGrant grant = enrolledAndIssued();
  const RevokeShardsRequest revoke{.gateway_name = kGateway};
  const LedgerOutcome outcome = requests_.apply(revoke, kT0 + 1);
  ASSERT_EQ(replyAs<ShardReply>(outcome).code, ReplyCode::kOk);
  const std::vector<ShardRevoked> revoked = eventsOf<ShardRevoked>(outcome);
  ASSERT_EQ(revoked.size(), 1u);
  EXPECT_EQ(revoked.front().shard_id, grant.shard_id);
  EXPECT_EQ(revoked.front().gateway_name, kGateway);
  EXPECT_EQ(revoked.front().fence, replyAs<ShardReply>(outcome).shards.front().current_fence);
  // Both or neither named: an invalid request, no event.
  const LedgerOutcome invalid = requests_.apply(RevokeShardsRequest{}, kT0 + 2);
  EXPECT_EQ(replyAs<ShardReply>(invalid).code, ReplyCode::kInvalidArgument);
  EXPECT_TRUE(invalid.events.empty());
}

TEST_F(LedgerRequestsTest, WriteOffOnlyAfterExpiryReportsOnce) {
  const ShardGrant grant = enrolledAndIssued();
  const WriteOffShardRequest write_off{.shard_id = grant.shard_id};
  LedgerOutcome outcome = requests_.apply(write_off, kT0 + kShardTtlMs - 1);
  EXPECT_EQ(replyAs<ShardReply>(outcome).code, ReplyCode::kInvalidState);
  EXPECT_TRUE(outcome.events.empty());
  outcome = requests_.apply(write_off, kT0 + kShardTtlMs);
  ASSERT_EQ(replyAs<ShardReply>(outcome).code, ReplyCode::kOk);
  EXPECT_THAT(eventsOf<ShardWrittenOff>(outcome),
              ElementsAre(::testing::Field(&ShardWrittenOff::retired_units, 100u)));
  EXPECT_EQ(eventsOf<ShardWrittenOff>(outcome).front().shard_id, grant.shard_id);
  EXPECT_TRUE(requests_.apply(write_off, kT0 + kShardTtlMs).events.empty());  // a duplicate
  outcome = requests_.apply(WriteOffShardRequest{.shard_id = "no-such"}, kT0);
  EXPECT_EQ(replyAs<ShardReply>(outcome).code, ReplyCode::kNotFound);
  EXPECT_THAT(replyAs<ShardReply>(outcome).message, HasSubstr("no-such"));
}

// ---- the tick ---------------------------------------------------------------------------------

TEST_F(LedgerRequestsTest, ATickSaysWhetherItChangedDurableState) {
  ASSERT_EQ(replyAs<ReservationReply>(reserve("r1", 10)).code, ReplyCode::kOk);
  (void)ledger_.takeChangedRows();
  TickOutcome outcome = ledger_.tick(kT0 + 1);
  EXPECT_FALSE(outcome.changed());
  EXPECT_TRUE(ledger_.takeChangedRows().empty());
  outcome = ledger_.tick(kT0 + 30'000);  // the hold TTL: r1 expires
  EXPECT_EQ(outcome.expired, 1u);
  EXPECT_TRUE(outcome.changed());
  EXPECT_FALSE(ledger_.takeChangedRows().empty());
}

TEST_F(LedgerRequestsTest, ATickThatOnlyRemintsAShardChangedDurableState) {
  // A report from another boot epoch defers the remint of what the shard retired until the
  // grant expires; the tick that performs it changed accounts and the shard, with no request
  // in sight. The shell commits a tick only when changed() says so.
  const ShardGrant grant = enrolledAndIssued();
  ShardReport r = report(grant, {.local_spent = 30, .local_retired = 70},
                         {receipt(grant, "s1", ReservationState::kSettled, 30, 30)});
  r.gateway_boot_epoch = 2;
  signReport(&r);
  ASSERT_EQ(replyAs<ShardReply>(requests_.apply(r, kT0 + 1'000)).reminted_units, 0u);
  (void)ledger_.takeChangedRows();
  const TickOutcome outcome = ledger_.tick(kT0 + kShardTtlMs);
  ASSERT_EQ(outcome.shards_reminted, 1u);
  EXPECT_EQ(outcome.expired + outcome.closed_by_hard_limit + outcome.compacted, 0u);
  EXPECT_FALSE(ledger_.takeChangedRows().empty());
  EXPECT_TRUE(outcome.changed());
}

TEST(TickOutcomeTest, EveryCounterIsAChange) {
  EXPECT_FALSE(TickOutcome{}.changed());
  EXPECT_TRUE(TickOutcome{.expired = 1}.changed());
  EXPECT_TRUE(TickOutcome{.closed_by_hard_limit = 1}.changed());
  EXPECT_TRUE(TickOutcome{.compacted = 1}.changed());
  EXPECT_TRUE(TickOutcome{.shards_reminted = 1}.changed());
  EXPECT_TRUE(TickOutcome{.shards_compacted = 1}.changed());
  EXPECT_TRUE(TickOutcome{.periods_closed = 1}.changed());
}

}  // namespace
}  // namespace tally
