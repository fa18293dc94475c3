#include "ctl/commands.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ctl/json.h"
#include "ctl/render.h"
#include "shard/identity.h"
#include "tally/version.h"
#include "tests/ctl/ctl_test_support.h"
#include "wire/digest.h"

namespace tally::ctl {
namespace {

using test_support::FakePeer;
using test_support::invocation;
using test_support::kRfc8032PublicKey;
using test_support::run;

Reservation receipt(ReservationState state) {
  return Reservation{.reservation_id = "r-1",
                     .subject = "tenant-7",
                     .route = "chat.generate",
                     .policy_generation = 3,
                     .accounting_epoch_ms = 1784469600000,
                     .reserved_units = 600,
                     .actual_units = 200,
                     .refunded_units = 400,
                     .operation_id = "op-1",
                     .expires_at_ms = 1784469630250,
                     .state = state};
}

wire::Response reservationAnswer(ReplyCode code, Reservation r, Units refunded = 0,
                                 bool duplicate = false) {
  return wire::Response{.request_id = 1,
                        .body = ReservationReply{.code = code,
                                                 .duplicate = duplicate,
                                                 .refunded_units = refunded,
                                                 .receipt = std::move(r)}};
}

const std::vector<std::string_view> kReserve = {"--json",    "reserve",  "--id",    "r-1",
                                                "--subject", "tenant-7", "--route", "chat.generate",
                                                "--units",   "600"};

TEST(Rfc3339Test, FormatsUtc) {
  EXPECT_EQ(rfc3339FromUnixMs(0), "1970-01-01T00:00:00Z");
  EXPECT_EQ(rfc3339FromUnixMs(1784469600000), "2026-07-19T14:00:00Z");
  EXPECT_EQ(rfc3339FromUnixMs(1709251199250), "2024-02-29T23:59:59.250Z");
  EXPECT_EQ(rfc3339FromUnixMs(951868800000), "2000-03-01T00:00:00Z");
  EXPECT_EQ(rfc3339FromUnixMs(946684799999), "1999-12-31T23:59:59.999Z");
}

TEST(JsonWriterTest, EscapesAndNests) {
  JsonWriter w;
  w.beginObject();
  w.field("s", std::string_view("a\"b\\c\n\x01"));
  w.field("n", uint64_t{18446744073709551615u});
  w.field("i", int64_t{-1});
  w.field("b", false);
  w.key("z").null();
  w.key("a").beginArray().value("x").value(uint64_t{2}).beginObject().endObject().endArray();
  w.endObject();
  EXPECT_EQ(w.take(),
            R"({"s":"a\"b\\c\n\u0001","n":18446744073709551615,"i":-1,"b":false,"z":null,)"
            R"("a":["x",2,{}]})");
}

TEST(JsonWriterTest, InvalidUtf8BecomesReplacementCharacter) {
  EXPECT_EQ(jsonQuote("ü"), "\"ü\"");
  EXPECT_EQ(jsonQuote(std::string_view("\xff", 1)), "\"\xEF\xBF\xBD\"");
  EXPECT_EQ(jsonQuote(std::string_view("\xC3", 1)), "\"\xEF\xBF\xBD\"");  // truncated
  EXPECT_EQ(jsonQuote(std::string_view("\xC0\xAF", 2)),
            "\"\xEF\xBF\xBD\xEF\xBF\xBD\"");  // overlong
}

TEST(CommandsTest, ReserveComputesCanonicalDigest) {
  FakePeer peer;
  peer.answer = reservationAnswer(ReplyCode::kOk, receipt(ReservationState::kReserved));
  const CommandOutput out = run(peer, kReserve);
  EXPECT_EQ(out.exit_code, kExitOk) << out.err;
  ASSERT_TRUE(peer.request.has_value());
  const auto* request = std::get_if<ReserveRequest>(&*peer.request);
  ASSERT_NE(request, nullptr);
  EXPECT_EQ(request->reservation_id, "r-1");
  EXPECT_EQ(request->units, 600u);
  EXPECT_EQ(request->request_digest, wire::canonicalRequestDigest(*request));
}

TEST(CommandsTest, ReserveSendsItsRegionAndItsDigestCoversIt) {
  FakePeer peer;
  peer.answer = reservationAnswer(ReplyCode::kOk, receipt(ReservationState::kReserved));
  std::vector<std::string_view> args = kReserve;
  args.push_back("--region");
  args.push_back("eu-west-1");
  EXPECT_EQ(run(peer, args).exit_code, kExitOk);
  ASSERT_TRUE(peer.request.has_value());
  const ReserveRequest& request = std::get<ReserveRequest>(*peer.request);
  EXPECT_EQ(request.region, "eu-west-1");
  EXPECT_EQ(request.request_digest, wire::canonicalRequestDigest(request));
  ReserveRequest without = request;
  without.region.clear();
  EXPECT_NE(request.request_digest, wire::canonicalRequestDigest(without));
}

TEST(CommandsTest, ReserveSendsGivenDigest) {
  FakePeer peer;
  peer.answer = reservationAnswer(ReplyCode::kOk, receipt(ReservationState::kReserved));
  std::vector<std::string_view> args = kReserve;
  const std::string hex(64, 'c');
  args.push_back("--digest");
  args.push_back(hex);
  EXPECT_EQ(run(peer, args).exit_code, kExitOk);
  EXPECT_EQ(wire::digestHex(std::get<ReserveRequest>(*peer.request).request_digest), hex);
}

TEST(CommandsTest, ReservationJsonHasContractFields) {
  FakePeer peer;
  peer.answer = reservationAnswer(ReplyCode::kOk, receipt(ReservationState::kSettled), 400);
  const CommandOutput out =
      run(peer, {"--json", "settle", "--id", "r-1", "--operation", "op-1", "--actual", "200"});
  EXPECT_EQ(out.exit_code, kExitOk);
  EXPECT_EQ(out.out.back(), '\n');
  EXPECT_EQ(out.out.find('\n'), out.out.size() - 1);  // exactly one line, one object
  for (const char* field :
       {R"("reservationId":"r-1")", R"("state":"SETTLED")", R"("reservedUnits":600)",
        R"("actualUnits":200)", R"("refundedUnits":400)", R"("policyGeneration":3)",
        R"("accountingEpoch":"2026-07-19T14:00:00Z")", R"("accountingEpochMs":1784469600000)",
        R"("expiresAt":"2026-07-19T14:00:30.250Z")", R"("expiresAtMs":1784469630250)",
        R"("code":"OK")", R"("duplicate":false)", R"("rejected":false)", R"("subject":"tenant-7")",
        R"("route":"chat.generate")", R"("operationId":"op-1")", R"("debtUnits":0)",
        R"("origin":"central")"}) {
    EXPECT_CONTAINS(out.out, field);
  }
  EXPECT_EQ(out.out.find("limitingDimension"), std::string::npos);
}

TEST(CommandsTest, ExtendSendsTheNewTotalAndPrintsTheReceipt) {
  FakePeer peer;
  peer.answer = reservationAnswer(ReplyCode::kOk, receipt(ReservationState::kStarted));
  const CommandOutput out =
      run(peer, {"--json", "extend", "--id", "r-1", "--operation", "op-1", "--total", "900"});
  EXPECT_EQ(out.exit_code, kExitOk);
  const auto& request = std::get<ExtendRequest>(*peer.request);
  EXPECT_EQ(request.reservation_id, "r-1");
  EXPECT_EQ(request.operation_id, "op-1");
  EXPECT_EQ(request.reserved_units_total, 900u);
  EXPECT_CONTAINS(out.out, R"("state":"STARTED")");
  EXPECT_CONTAINS(out.out, R"("code":"OK")");
}

TEST(CommandsTest, RefusedExtendExitsAsARejection) {
  FakePeer peer;
  Reservation started = receipt(ReservationState::kStarted);
  started.limiting_dimension = LimitingDimension::kCapacity;
  started.retry_after_ms = 2'000;
  peer.answer = reservationAnswer(ReplyCode::kRejected, started);
  const CommandOutput out =
      run(peer, {"--json", "extend", "--id", "r-1", "--operation", "op-1", "--total", "900"});
  EXPECT_EQ(out.exit_code, kExitRejected);
  EXPECT_CONTAINS(out.out, R"("code":"REJECTED")");
  EXPECT_CONTAINS(out.out, R"("limitingDimension":"capacity")");
  EXPECT_CONTAINS(out.out, R"("retryAfterMs":2000)");
}

TEST(CommandsTest, DuplicateSettleShowsZeroRefund) {
  FakePeer peer;
  peer.answer =
      reservationAnswer(ReplyCode::kOk, receipt(ReservationState::kSettled), 0, /*dup=*/true);
  const CommandOutput out =
      run(peer, {"--json", "settle", "--id", "r-1", "--operation", "op-1", "--actual", "200"});
  EXPECT_EQ(out.exit_code, kExitOk);
  EXPECT_CONTAINS(out.out, R"("refundedUnits":0)");
  EXPECT_CONTAINS(out.out, R"("duplicate":true)");
}

TEST(CommandsTest, QueryShowsTheReservationsRefund) {
  FakePeer peer;
  peer.answer = reservationAnswer(ReplyCode::kOk, receipt(ReservationState::kSettled), 0);
  const CommandOutput out = run(peer, {"--json", "query", "--id", "r-1"});
  EXPECT_CONTAINS(out.out, R"("refundedUnits":400)");
  EXPECT_TRUE(std::holds_alternative<QueryRequest>(*peer.request));
}

TEST(CommandsTest, ARegionFencedRejectionShowsTheRegionAndWhy) {
  Reservation r = receipt(ReservationState::kRejected);
  r.region = "us-east-1";
  r.limiting_dimension = LimitingDimension::kNoBudget;
  r.retry_after_ms = kRetryNever;
  FakePeer peer;
  wire::Response answer = reservationAnswer(ReplyCode::kRejected, r);
  std::get<ReservationReply>(answer.body).message =
      "no budget for subject/route in region 'us-east-1': fenced to region 'eu-west-1'";
  peer.answer = std::move(answer);
  std::vector<std::string_view> args = kReserve;
  args.push_back("--region");
  args.push_back("us-east-1");
  const CommandOutput out = run(peer, args);
  EXPECT_EQ(out.exit_code, kExitRejected);
  EXPECT_CONTAINS(out.out, R"("region":"us-east-1")");
  EXPECT_CONTAINS(out.out, R"("limitingDimension":"no-budget")");
  EXPECT_CONTAINS(out.out, "region 'eu-west-1'");
  std::vector<std::string_view> human(args.begin() + 1, args.end());
  const CommandOutput text = run(peer, human);
  EXPECT_EQ(text.exit_code, kExitRejected);
  EXPECT_CONTAINS(text.out, "region us-east-1");
  EXPECT_CONTAINS(text.out, "fenced to region 'eu-west-1'");
}

TEST(CommandsTest, RejectionExitsFour) {
  Reservation r = receipt(ReservationState::kRejected);
  r.limiting_dimension = LimitingDimension::kCapacity;
  r.retry_after_ms = 20000;
  FakePeer peer;
  peer.answer = reservationAnswer(ReplyCode::kRejected, r);
  const CommandOutput out = run(peer, kReserve);
  EXPECT_EQ(out.exit_code, kExitRejected);
  EXPECT_CONTAINS(out.out, R"("rejected":true)");
  EXPECT_CONTAINS(out.out, R"("limitingDimension":"capacity")");
  EXPECT_CONTAINS(out.out, R"("retryAfterMs":20000)");
  EXPECT_CONTAINS(out.out, R"("policyGeneration":3)");

  std::vector<std::string_view> human(kReserve.begin() + 1, kReserve.end());
  const CommandOutput text = run(peer, human);
  EXPECT_EQ(text.exit_code, kExitRejected);
  EXPECT_CONTAINS(text.out, "REJECTED r-1");
  EXPECT_CONTAINS(text.out, "capacity");
}

TEST(CommandsTest, ReplyCodesMapToExitCodes) {
  const std::pair<ReplyCode, int> cases[] = {
      {ReplyCode::kOk, 0},
      {ReplyCode::kRejected, 4},
      {ReplyCode::kIdempotencyConflict, 5},
      {ReplyCode::kOperationConflict, 5},
      {ReplyCode::kExpired, 5},
      {ReplyCode::kNotFound, 7},
      {ReplyCode::kInvalidState, 8},
      {ReplyCode::kInvalidArgument, 2},
      {ReplyCode::kResourceExhausted, 9},
      {ReplyCode::kArithmeticOverflow, 9},
  };
  for (const auto& [code, exit_code] : cases) {
    FakePeer peer;
    peer.answer = reservationAnswer(code, receipt(ReservationState::kStarted));
    const CommandOutput out = run(peer, {"--json", "start", "--id", "r-1", "--operation", "op-9"});
    EXPECT_EQ(out.exit_code, exit_code) << replyCodeName(code);
    EXPECT_CONTAINS(out.out, std::string(R"("code":")") + replyCodeName(code) + "\"");
  }
}

TEST(CommandsTest, NotFoundHasNoReceipt) {
  FakePeer peer;
  peer.answer = wire::Response{
      .request_id = 1,
      .body = ReservationReply{.code = ReplyCode::kNotFound, .message = "no reservation 'zz'"}};
  CommandOutput out = run(peer, {"--json", "query", "--id", "zz"});
  EXPECT_EQ(out.exit_code, kExitNotFound);
  EXPECT_CONTAINS(out.out, R"("reservationId":"zz")");
  EXPECT_EQ(out.out.find("\"state\""), std::string::npos);
  out = run(peer, {"query", "--id", "zz"});
  EXPECT_CONTAINS(out.out, "NOT_FOUND zz");
}

TEST(CommandsTest, EachCommandSendsItsRequest) {
  FakePeer peer;
  peer.answer = reservationAnswer(ReplyCode::kOk, receipt(ReservationState::kStarted));
  (void)run(peer, {"start", "--id", "a", "--operation", "o"});
  EXPECT_EQ(std::get<StartRequest>(*peer.request).operation_id, "o");
  (void)run(peer, {"settle", "--id", "a", "--operation", "o", "--actual", "7"});
  EXPECT_EQ(std::get<SettleRequest>(*peer.request).actual_units, 7u);
  (void)run(peer, {"release", "--id", "a"});
  EXPECT_EQ(std::get<ReleaseRequest>(*peer.request).reservation_id, "a");
  (void)run(peer, {"unknown", "--id", "a", "--operation", "o"});
  EXPECT_EQ(std::get<MarkUnknownRequest>(*peer.request).operation_id, "o");
  (void)run(peer, {"report", "--id", "a", "--operation", "o", "--actual", "9"});
  EXPECT_EQ(std::get<ReportOperationRequest>(*peer.request).actual_units, 9u);
  (void)run(peer, {"audit", "--subject", "t"});
  EXPECT_EQ(std::get<wire::AuditRequest>(*peer.request).subject, "t");
  (void)run(peer, {"health"});
  EXPECT_TRUE(std::holds_alternative<wire::HealthRequest>(*peer.request));
  (void)run(peer, {"policy", "rollback"});
  EXPECT_TRUE(std::holds_alternative<wire::RollbackPolicyRequest>(*peer.request));
  (void)run(peer, {"policy", "show", "--generation", "4"});
  EXPECT_EQ(std::get<wire::ShowPolicyRequest>(*peer.request).generation, 4u);
}

TEST(CommandsTest, UnavailableExitsSix) {
  FakePeer peer;  // answers "connection refused"
  CommandOutput out = run(peer, {"--json", "health"});
  EXPECT_EQ(out.exit_code, kExitUnavailable);
  EXPECT_CONTAINS(out.out, R"("error":true)");
  EXPECT_CONTAINS(out.out, R"("code":"UNAVAILABLE")");
  EXPECT_CONTAINS(out.err, "connection refused");
  out = run(peer, {"health"});
  EXPECT_EQ(out.exit_code, kExitUnavailable);
  EXPECT_TRUE(out.out.empty());
}

TEST(CommandsTest, PeerErrorsAndWrongAnswers) {
  FakePeer peer;
  peer.answer = wire::Response{
      .request_id = 1,
      .body = wire::ErrorReply{.code = wire::ErrorCode::kUnavailable, .message = "partitioned"}};
  EXPECT_EQ(run(peer, {"health"}).exit_code, kExitUnavailable);
  peer.answer = wire::Response{.request_id = 1,
                               .body = wire::ErrorReply{.code = wire::ErrorCode::kInvalidArgument}};
  EXPECT_EQ(run(peer, {"health"}).exit_code, kExitUsage);
  peer.answer =
      wire::Response{.request_id = 1, .body = wire::ErrorReply{.code = wire::ErrorCode::kInternal}};
  EXPECT_EQ(run(peer, {"health"}).exit_code, kExitProtocol);
  // No address was the primary: unavailable (6), the message naming the primary.
  peer.answer = wire::Response{
      .request_id = 1,
      .body = wire::ErrorReply{.code = wire::ErrorCode::kNotPrimary,
                               .message = "not the primary; the primary is 10.0.0.5:7411"}};
  const CommandOutput not_primary = run(peer, {"health"});
  EXPECT_EQ(not_primary.exit_code, kExitUnavailable);
  EXPECT_CONTAINS(not_primary.out + not_primary.err, "NOT_PRIMARY");
  EXPECT_CONTAINS(not_primary.out + not_primary.err, "the primary is 10.0.0.5:7411");
  // A reservation reply to an audit request.
  peer.answer = reservationAnswer(ReplyCode::kOk, receipt(ReservationState::kReserved));
  EXPECT_EQ(run(peer, {"audit"}).exit_code, kExitProtocol);
  peer.answer = Status::corruption("bad frame");
  EXPECT_EQ(run(peer, {"audit"}).exit_code, kExitProtocol);
}

AuditReport sampleAudit(bool conserved) {
  AccountView account{
      .key = {.subject = "tenant-7", .route = "chat.generate", .generation = 3},
      .balances = {.opening = 1000, .available = 400, .spent = 600},
      .accounting_epoch_ms = 1784469600000,
      .conserved = conserved,
  };
  AuditReport report{.accounts = {account}, .conserved = conserved};
  if (!conserved) report.violations.push_back("tenant-7/chat.generate does not conserve");
  return report;
}

TEST(CommandsTest, AuditJson) {
  FakePeer peer;
  peer.answer = wire::Response{.request_id = 1, .body = sampleAudit(true)};
  CommandOutput out = run(peer, {"--json", "audit"});
  EXPECT_EQ(out.exit_code, kExitOk);
  for (const char* field :
       {R"("conservation":true)", R"("accounts":[{)", R"("subject":"tenant-7")",
        R"("route":"chat.generate")", R"("policyGeneration":3)",
        R"("accountingEpoch":"2026-07-19T14:00:00Z")", R"("debt":0)", R"("opening":1000)",
        R"("minted":0)", R"("overdraftIssued":0)", R"("available":400)", R"("reserved":0)",
        R"("spent":600)", R"("retiredForEmergency":0)", R"("overdraftRepaid":0)",
        R"("transferredOut":0)", R"("generationState":"ACTIVE")", R"("violations":[])"}) {
    EXPECT_CONTAINS(out.out, field);
  }
  peer.answer = wire::Response{.request_id = 1, .body = sampleAudit(false)};
  out = run(peer, {"--json", "audit"});
  EXPECT_EQ(out.exit_code, kExitAuditFailed);
  EXPECT_CONTAINS(out.out, R"("conservation":false)");
  EXPECT_CONTAINS(out.out, "does not conserve");
  out = run(peer, {"audit"});
  EXPECT_EQ(out.exit_code, kExitAuditFailed);
  EXPECT_CONTAINS(out.out, "conservation: FAILED");
}

// Issue 9: the audit says which time its balances are as of, and shows overdraft breaches per
// account, in JSON and in text.
TEST(CommandsTest, AuditShowsItsTimeAndOverdraftBreaches) {
  AuditReport report = sampleAudit(true);
  report.as_of_ms = 1784469603200;
  report.accounts[0].overdraft_breaches = {.count = 2, .units = 800};
  FakePeer peer;
  peer.answer = wire::Response{.request_id = 1, .body = report};
  CommandOutput out = run(peer, {"--json", "audit"});
  EXPECT_EQ(out.exit_code, kExitOk);
  for (const char* field : {R"("asOf":"2026-07-19T14:00:03.200Z")", R"("asOfMs":1784469603200)",
                            R"("overdraftBreaches":2)", R"("overdraftBreachUnits":800)"}) {
    EXPECT_CONTAINS(out.out, field);
  }
  out = run(peer, {"audit"});
  EXPECT_EQ(out.exit_code, kExitOk);
  EXPECT_CONTAINS(out.out, "balances as of 2026-07-19T14:00:03.200Z (refill applied)");
  EXPECT_CONTAINS(out.out, "overdraft breaches 2 (800 units beyond max overdraft)");
}

TEST(CommandsTest, AuditFailsOnAnyAccount) {
  AuditReport report = sampleAudit(true);
  report.accounts[0].conserved = false;  // the report-level flag alone must not hide it
  FakePeer peer;
  peer.answer = wire::Response{.request_id = 1, .body = report};
  EXPECT_EQ(run(peer, {"audit"}).exit_code, kExitAuditFailed);
}

TEST(CommandsTest, PublishParsesLocallyFirst) {
  FakePeer peer;
  peer.answer = wire::Response{
      .request_id = 1,
      .body = wire::PolicyAnswer{.reply = {.code = ReplyCode::kOk, .generation = 5}}};
  CommandOutput out =
      run(peer, {"--json", "policy", "publish", TALLY_SOURCE_DIR "/examples/policy.toml"});
  EXPECT_EQ(out.exit_code, kExitOk) << out.err;
  EXPECT_CONTAINS(out.out, R"("policyGeneration":5)");
  ASSERT_TRUE(peer.request.has_value());
  EXPECT_EQ(std::get<wire::PublishPolicyRequest>(*peer.request).budgets.size(), 3u);
  out = run(peer, {"policy", "publish", TALLY_SOURCE_DIR "/examples/policy.toml"});
  EXPECT_CONTAINS(out.out, "policy generation 5");

  FakePeer untouched;
  out = run(untouched, {"policy", "publish", "/nonexistent/policy.toml"});
  EXPECT_EQ(out.exit_code, kExitUsage);
  EXPECT_FALSE(untouched.request.has_value());
  EXPECT_CONTAINS(out.err, "/nonexistent/policy.toml");
}

TEST(CommandsTest, PolicyShowPrintsToml) {
  Budget budget{.subject_pattern = "tenant-7",
                .route = "chat.generate",
                .unit = "tokens",
                .refill_per_second = 10,
                .burst = 1000,
                .max_single_reservation = 1000,
                .hold_ttl_ms = 30000,
                .hard_execution_limit_ms = 600000};
  FakePeer peer;
  peer.answer = wire::Response{
      .request_id = 1,
      .body = wire::PolicyAnswer{.reply = {.code = ReplyCode::kOk, .generation = 2},
                                 .policy = Policy{.generation = 2, .budgets = {budget}}}};
  CommandOutput out = run(peer, {"policy", "show"});
  EXPECT_EQ(out.exit_code, kExitOk);
  EXPECT_CONTAINS(out.out, "[[budget]]");
  EXPECT_CONTAINS(out.out, "subject = \"tenant-7\"");
  EXPECT_CONTAINS(out.out, "generation 2");
  out = run(peer, {"--json", "policy", "show"});
  EXPECT_CONTAINS(out.out, R"("budgets":[{"subject":"tenant-7")");
}

TEST(CommandsTest, UsageErrorsAreOneJsonObjectWithJson) {
  const CommandOutput json = renderUsageError(Status::invalidArgument("unknown command 'x'"), true);
  EXPECT_EQ(json.exit_code, kExitUsage);
  EXPECT_EQ(json.out, R"({"error":true,"code":"USAGE","message":"unknown command 'x'"})"
                      "\n");
  EXPECT_EQ(json.err, "tallyctl: unknown command 'x'\nTry 'tallyctl --help'.\n");
  const CommandOutput text =
      renderUsageError(Status::invalidArgument("unknown command 'x'"), false);
  EXPECT_EQ(text.exit_code, kExitUsage);
  EXPECT_EQ(text.out, "");
  EXPECT_EQ(text.err, json.err);
}

TEST(CommandsTest, ABadPolicyFileIsAJsonUsageErrorAndSendsNothing) {
  FakePeer peer;
  const CommandOutput out = run(peer, {"policy", "publish", "/nonexistent/policy.toml", "--json"});
  EXPECT_EQ(out.exit_code, kExitUsage);
  EXPECT_CONTAINS(out.out, R"({"error":true,"code":"USAGE","message":")");
  EXPECT_CONTAINS(out.err, "tallyctl: policy publish: ");
  EXPECT_FALSE(peer.request.has_value());
  EXPECT_EQ(run(peer, {"policy", "publish", "/nonexistent/policy.toml"}).out, "");
}

TEST(CommandsTest, HelpAndVersionAreJsonWithJson) {
  FakePeer peer;
  CommandOutput out = run(peer, {"--json", "--help"});
  EXPECT_EQ(out.exit_code, kExitOk);
  EXPECT_EQ(out.out, "{\"usage\":" + jsonQuote(usageText()) + "}\n");
  out = run(peer, {"version", "--json"});
  EXPECT_EQ(out.exit_code, kExitOk);
  EXPECT_EQ(out.out, std::string(R"({"version":")") + kVersion + "\"}\n");
}

TEST(CommandsTest, HelpAndVersionNeedNoPeer) {
  FakePeer peer;
  CommandOutput out = run(peer, {"--help"});
  EXPECT_EQ(out.exit_code, kExitOk);
  EXPECT_CONTAINS(out.out, "usage: tallyctl");
  out = run(peer, {"--version"});
  EXPECT_EQ(out.exit_code, kExitOk);
  EXPECT_CONTAINS(out.out, "tallyctl ");
  EXPECT_FALSE(peer.request.has_value());
}

// --- Gateways and emergency shards ------------------------------------------------------------

PublicKey rfcKey() {
  Result<PublicKey> key = identity::decodePublicKey(kRfc8032PublicKey);
  EXPECT_TRUE(key.isOk());
  return key.value();
}

ShardLedgerView sampleShard() {
  ShardLedgerView view;
  view.grant = ShardGrant{.shard_id = "shard-17",
                          .subject = "tenant-7",
                          .route = "chat.generate",
                          .policy_generation = 3,
                          .gateway_id = rfcKey(),
                          .gateway_name = "gw-eu-1",
                          .gateway_boot_epoch = 4,
                          .fence = 2,
                          .allocated_units = 500,
                          .issued_at_ms = 1784469600000,
                          .expires_at_ms = 1784469720000,
                          .ledger_key_id = "21fe31dfa154a261"};
  view.state = ShardState::kReconciling;
  view.current_fence = 3;
  view.spent_units = 80;
  view.reminted_units = 300;
  view.retired_units = 120;
  view.debt_units = 0;
  view.reported = true;
  view.last_reported = {.allocated = 500,
                        .local_available = 0,
                        .local_reserved = 120,
                        .local_spent = 80,
                        .local_retired = 300,
                        .overspent = 0};
  return view;
}

wire::Response shardAnswer(ShardReply reply) {
  return wire::Response{.request_id = 1, .body = std::move(reply)};
}

TEST(CommandsTest, GatewayAndShardCommandsSendTheirRequests) {
  FakePeer peer;
  peer.answer = wire::Response{.request_id = 1, .body = GatewayReply{}};
  EXPECT_EQ(
      run(peer, {"gateway", "enroll", "--id", "gw-1", "--public-key", kRfc8032PublicKey}).exit_code,
      kExitOk);
  const auto& enroll = std::get<wire::EnrollGatewayRequest>(*peer.request);
  EXPECT_EQ(enroll.gateway_name, "gw-1");
  EXPECT_EQ(enroll.public_key, rfcKey());
  run(peer, {"gateway", "list"});
  EXPECT_TRUE(std::holds_alternative<wire::ListGatewaysRequest>(*peer.request));
  run(peer, {"gateway", "disable", "--id", "gw-1"});
  EXPECT_EQ(std::get<wire::SetGatewayEnabledRequest>(*peer.request).gateway_name, "gw-1");
  EXPECT_FALSE(std::get<wire::SetGatewayEnabledRequest>(*peer.request).enabled);
  run(peer, {"gateway", "enable", "--id", "gw-1"});
  EXPECT_TRUE(std::get<wire::SetGatewayEnabledRequest>(*peer.request).enabled);

  peer.answer = shardAnswer(ShardReply{});
  EXPECT_EQ(run(peer, {"shard", "list", "--gateway", "gw-1", "--state", "ISSUED"}).exit_code,
            kExitOk);
  const auto& list = std::get<wire::ListShardsRequest>(*peer.request);
  EXPECT_EQ(list.gateway_name, "gw-1");
  EXPECT_EQ(list.state, ShardState::kIssued);
  run(peer, {"shard", "revoke", "--gateway", "gw-1"});
  EXPECT_EQ(std::get<wire::RevokeShardsRequest>(*peer.request).gateway_name, "gw-1");
  EXPECT_EQ(std::get<wire::RevokeShardsRequest>(*peer.request).shard_id, "");
  run(peer, {"shard", "revoke", "--id", "shard-2"});
  EXPECT_EQ(std::get<wire::RevokeShardsRequest>(*peer.request).shard_id, "shard-2");
  run(peer, {"shard", "write-off", "--id", "shard-2"});
  EXPECT_EQ(std::get<wire::WriteOffShardRequest>(*peer.request).shard_id, "shard-2");
}

TEST(CommandsTest, GatewayListJsonAndText) {
  FakePeer peer;
  peer.answer = wire::Response{
      .request_id = 1,
      .body = GatewayReply{.gateways = {GatewayRecord{.gateway_name = "gw-eu-1",
                                                      .public_key = rfcKey(),
                                                      .enabled = false,
                                                      .enrolled_at_ms = 1784469600000}}}};
  CommandOutput out = run(peer, {"--json", "gateway", "list"});
  EXPECT_EQ(out.exit_code, kExitOk);
  EXPECT_EQ(
      out.out,
      std::string(R"({"code":"OK","duplicate":false,"gateways":[{"gatewayId":"gw-eu-1",)") +
          R"("publicKey":")" + kRfc8032PublicKey +
          R"(","enabled":false,"enrolledAt":"2026-07-19T14:00:00Z","enrolledAtMs":1784469600000}]})" +
          "\n");
  out = run(peer, {"gateway", "list"});
  EXPECT_EQ(out.out, std::string("gw-eu-1  ") + kRfc8032PublicKey +
                         "  DISABLED  enrolled 2026-07-19T14:00:00Z\n");
  peer.answer = wire::Response{.request_id = 1, .body = GatewayReply{}};
  EXPECT_EQ(run(peer, {"gateway", "list"}).out, "no gateways\n");
}

TEST(CommandsTest, ShardListJsonHasContractFields) {
  FakePeer peer;
  peer.answer = shardAnswer(ShardReply{.shards = {sampleShard()}});
  CommandOutput out = run(peer, {"--json", "shard", "list"});
  EXPECT_EQ(out.exit_code, kExitOk) << out.err;
  for (const std::string& field : std::vector<std::string>{
           R"("code":"OK")",
           R"("permissionDenied":false)",
           R"("shards":[{"shardId":"shard-17")",
           R"("gatewayId":"gw-eu-1")",
           std::string(R"("publicKey":")") + kRfc8032PublicKey + "\"",
           R"("subject":"tenant-7")",
           R"("route":"chat.generate")",
           R"("policyGeneration":3)",
           R"("state":"RECONCILING")",
           R"("allocatedUnits":500)",
           R"("spentUnits":80)",
           R"("remintedUnits":300)",
           R"("retiredUnits":120)",
           R"("debtUnits":0)",
           R"("writtenOff":false)",
           R"("conserved":true)",
           R"("fence":2)",
           R"("currentFence":3)",
           R"("gatewayBootEpoch":4)",
           R"("issuedAt":"2026-07-19T14:00:00Z")",
           R"("issuedAtMs":1784469600000)",
           R"("expiresAt":"2026-07-19T14:02:00Z")",
           R"("expiresAtMs":1784469720000)",
           R"("ledgerKeyId":"21fe31dfa154a261")",
           R"("reported":true)",
           R"("local":{"available":0,"reserved":120,"spent":80,"retired":300,"overspent":0})"}) {
    EXPECT_CONTAINS(out.out, field);
  }
  EXPECT_EQ(out.out.back(), '\n');
  EXPECT_EQ(out.out.find('\n'), out.out.size() - 1);  // one JSON object, one line

  ShardLedgerView unreported = sampleShard();
  unreported.reported = false;
  peer.answer = shardAnswer(ShardReply{.shards = {unreported}});
  out = run(peer, {"--json", "shard", "list"});
  EXPECT_CONTAINS(out.out, R"("reported":false})");
  EXPECT_EQ(out.out.find("\"local\""), std::string::npos);
}

TEST(CommandsTest, ShardListTextShowsBothEquations) {
  FakePeer peer;
  ShardLedgerView written_off = sampleShard();
  written_off.grant.shard_id = "shard-18";
  written_off.state = ShardState::kWrittenOff;
  written_off.written_off = true;
  written_off.reported = false;
  peer.answer = shardAnswer(ShardReply{.shards = {sampleShard(), written_off}});
  const CommandOutput out = run(peer, {"shard", "list"});
  EXPECT_EQ(out.exit_code, kExitOk);
  EXPECT_EQ(out.out,
            "shard-17  RECONCILING  gateway gw-eu-1  tenant-7 / chat.generate  generation 3\n"
            "  allocated 500 = spent 80 + reminted 300 + retired 120  debt 0\n"
            "  fence 2 (current 3)  boot epoch 4  issued 2026-07-19T14:00:00Z  expires "
            "2026-07-19T14:02:00Z\n"
            "  agent: allocated 500 = available 0 + reserved 120 + spent 80 + retired 300  "
            "overspent 0\n"
            "shard-18  WRITTEN_OFF  gateway gw-eu-1  tenant-7 / chat.generate  generation 3\n"
            "  allocated 500 = spent 80 + reminted 300 + retired 120  debt 0  written off\n"
            "  fence 2 (current 3)  boot epoch 4  issued 2026-07-19T14:00:00Z  expires "
            "2026-07-19T14:02:00Z\n"
            "  agent: not reported\n");
  peer.answer = shardAnswer(ShardReply{});
  EXPECT_EQ(run(peer, {"shard", "list"}).out, "no shards\n");
}

TEST(CommandsTest, ShardAndGatewayRepliesMapToExitCodes) {
  FakePeer peer;
  const std::vector<std::pair<ShardReply, int>> cases = {
      {ShardReply{.code = ReplyCode::kOk}, kExitOk},
      {ShardReply{.code = ReplyCode::kNotFound, .message = "no shard x"}, kExitNotFound},
      {ShardReply{.code = ReplyCode::kInvalidState, .message = "not expired"}, kExitInvalidState},
      {ShardReply{.code = ReplyCode::kRejected, .limiting_dimension = LimitingDimension::kCapacity},
       kExitRejected},
      {ShardReply{.code = ReplyCode::kRejected, .permission_denied = true}, kExitPermissionDenied},
      {ShardReply{.code = ReplyCode::kOk, .permission_denied = true}, kExitPermissionDenied},
  };
  for (const auto& [reply, exit_code] : cases) {
    peer.answer = shardAnswer(reply);
    EXPECT_EQ(run(peer, {"shard", "write-off", "--id", "x"}).exit_code, exit_code)
        << replyCodeName(reply.code);
  }
  peer.answer = shardAnswer(ShardReply{.code = ReplyCode::kRejected, .permission_denied = true});
  CommandOutput out = run(peer, {"--json", "shard", "revoke", "--id", "x"});
  EXPECT_CONTAINS(out.out, R"("permissionDenied":true)");
  out = run(peer, {"shard", "revoke", "--id", "x"});
  EXPECT_CONTAINS(out.out, "permission denied");
  peer.answer = shardAnswer(
      ShardReply{.code = ReplyCode::kRejected, .limiting_dimension = LimitingDimension::kCapacity});
  EXPECT_CONTAINS(run(peer, {"--json", "shard", "list"}).out, R"("limitingDimension":"capacity")");

  peer.answer = wire::Response{
      .request_id = 1,
      .body = GatewayReply{.code = ReplyCode::kIdempotencyConflict, .message = "other key"}};
  out = run(peer, {"gateway", "enroll", "--id", "gw", "--public-key", kRfc8032PublicKey});
  EXPECT_EQ(out.exit_code, kExitConflict);
  EXPECT_CONTAINS(out.out, "IDEMPOTENCY_CONFLICT: other key");
  peer.answer = wire::Response{.request_id = 1, .body = GatewayReply{.code = ReplyCode::kNotFound}};
  EXPECT_EQ(run(peer, {"gateway", "disable", "--id", "gw"}).exit_code, kExitNotFound);

  // The wrong kind of answer, and an agent refusing the verb.
  peer.answer = shardAnswer(ShardReply{});
  EXPECT_EQ(run(peer, {"gateway", "list"}).exit_code, kExitProtocol);
  peer.answer = wire::Response{.request_id = 1, .body = GatewayReply{}};
  EXPECT_EQ(run(peer, {"shard", "list"}).exit_code, kExitProtocol);
  peer.answer =
      wire::Response{.request_id = 1,
                     .body = wire::ErrorReply{.code = wire::ErrorCode::kUnknownMessage,
                                              .message = "request kind not served by the agent"}};
  out = run(peer, {"--json", "shard", "list"});
  EXPECT_EQ(out.exit_code, kExitProtocol);
  EXPECT_CONTAINS(out.out, R"("code":"UNKNOWN_MESSAGE")");
}

TEST(CommandsTest, AuditShowsEveryShardsEquations) {
  AuditReport report = sampleAudit(true);
  report.shards = {sampleShard()};
  FakePeer peer;
  peer.answer = wire::Response{.request_id = 1, .body = report};
  CommandOutput out = run(peer, {"--json", "audit"});
  EXPECT_EQ(out.exit_code, kExitOk);
  for (const char* field :
       {R"("shards":[{"shardId":"shard-17","gatewayId":"gw-eu-1")", R"("allocatedUnits":500)",
        R"("spentUnits":80)", R"("remintedUnits":300)", R"("retiredUnits":120)",
        R"("writtenOff":false)", R"("conserved":true)",
        R"("local":{"available":0,"reserved":120,"spent":80,"retired":300,"overspent":0})"}) {
    EXPECT_CONTAINS(out.out, field);
  }
  out = run(peer, {"audit"});
  EXPECT_CONTAINS(out.out, "1 emergency shard:\nshard-17  RECONCILING");
  EXPECT_CONTAINS(out.out, "allocated 500 = spent 80 + reminted 300 + retired 120");
  EXPECT_CONTAINS(out.out, "agent: allocated 500 = available 0 + reserved 120");

  report.shards[0].conserved = false;  // a shard alone fails the audit
  peer.answer = wire::Response{.request_id = 1, .body = report};
  out = run(peer, {"audit"});
  EXPECT_EQ(out.exit_code, kExitAuditFailed);
  EXPECT_CONTAINS(out.out, "NOT CONSERVED");
}

TEST(CommandsTest, HelpDocumentsShardVerbsAndExitCode11) {
  const std::string help = usageText();
  for (const char* text :
       {"gateway enroll --id NAME --public-key BASE64", "gateway list", "gateway disable --id NAME",
        "gateway enable --id NAME", "shard list [--gateway NAME] [--state S]",
        "shard revoke (--id ID | --gateway NAME)", "shard write-off --id ID",
        "11  permission denied"}) {
    EXPECT_CONTAINS(help, text);
  }
}

}  // namespace
}  // namespace tally::ctl
