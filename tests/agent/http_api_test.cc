// agent/http_api.h: HTTP requests become the native protocol's requests (through its decode
// boundary), and the agent's answers become HTTP replies with tallyctl's JSON.

#include "agent/http_api.h"

#include <gtest/gtest.h>

#include <string>

#include "wire/digest.h"

namespace tally::agent {
namespace {

HttpCall callOf(const std::variant<HttpCall, HttpReply>& routed) {
  EXPECT_TRUE(std::holds_alternative<HttpCall>(routed))
      << std::get<HttpReply>(routed).status << " " << std::get<HttpReply>(routed).body;
  return std::holds_alternative<HttpCall>(routed) ? std::get<HttpCall>(routed) : HttpCall{};
}

HttpReply replyOf(const std::variant<HttpCall, HttpReply>& routed) {
  EXPECT_TRUE(std::holds_alternative<HttpReply>(routed));
  return std::holds_alternative<HttpReply>(routed) ? std::get<HttpReply>(routed) : HttpReply{};
}

std::variant<HttpCall, HttpReply> route(std::string method, std::string target,
                                        std::string body = "") {
  return routeHttpRequest(HttpRequest{
      .method = std::move(method), .target = std::move(target), .body = std::move(body)});
}

TEST(HttpApiTest, ReserveBodyBecomesTheReserveTallyctlWouldSend) {
  const HttpCall call = callOf(route(
      "POST", "/v1/reservations",
      R"({"id":"r-1","subject":"tenant-a","route":"chat","units":600,"priority":3,"region":"eu"})"));
  EXPECT_EQ(call.kind, HttpCallKind::kReserve);
  EXPECT_EQ(call.reservation_id, "r-1");
  const auto* reserve = std::get_if<ReserveRequest>(&call.body);
  ASSERT_NE(reserve, nullptr);
  EXPECT_EQ(reserve->reservation_id, "r-1");
  EXPECT_EQ(reserve->subject, "tenant-a");
  EXPECT_EQ(reserve->route, "chat");
  EXPECT_EQ(reserve->units, 600u);
  EXPECT_EQ(reserve->priority, 3u);
  EXPECT_EQ(reserve->region, "eu");
  // Without requestDigest the canonical digest of the fields, as tallyctl computes it.
  EXPECT_EQ(reserve->request_digest, wire::canonicalRequestDigest(*reserve));

  // tallyctl's output names (reservationId, reservedUnits) are accepted too.
  const HttpCall same = callOf(route(
      "POST", "/v1/reservations",
      R"({"reservationId":"r-1","subject":"tenant-a","route":"chat","reservedUnits":600,"priority":3,"region":"eu"})"));
  EXPECT_EQ(std::get<ReserveRequest>(same.body).request_digest, reserve->request_digest);
}

TEST(HttpApiTest, FollowUpsTakeTheIdFromThePath) {
  const HttpCall settle = callOf(route("POST", "/v1/reservations/r%2F1/settle",
                                       R"({"operationId":"op-1","actualUnits":420})"));
  EXPECT_EQ(settle.kind, HttpCallKind::kFollowUp);
  const auto* request = std::get_if<SettleRequest>(&settle.body);
  ASSERT_NE(request, nullptr);
  EXPECT_EQ(request->reservation_id, "r/1");
  EXPECT_EQ(request->operation_id, "op-1");
  EXPECT_EQ(request->actual_units, 420u);

  EXPECT_TRUE(std::holds_alternative<ReleaseRequest>(
      callOf(route("POST", "/v1/reservations/r-1/release")).body));
  EXPECT_TRUE(std::holds_alternative<StartRequest>(
      callOf(route("POST", "/v1/reservations/r-1/start", R"({"operationId":"op"})")).body));
  EXPECT_TRUE(std::holds_alternative<MarkUnknownRequest>(
      callOf(route("POST", "/v1/reservations/r-1/unknown", R"({"operationId":"op"})")).body));
  EXPECT_TRUE(std::holds_alternative<ReportOperationRequest>(
      callOf(
          route("POST", "/v1/reservations/r-1/report", R"({"operationId":"op","actualUnits":1})"))
          .body));
  const HttpCall query = callOf(route("GET", "/v1/reservations/r-1"));
  EXPECT_EQ(query.kind, HttpCallKind::kQuery);
  EXPECT_EQ(std::get<QueryRequest>(query.body).reservation_id, "r-1");
  EXPECT_EQ(callOf(route("GET", "/healthz")).kind, HttpCallKind::kHealth);
  EXPECT_EQ(callOf(route("GET", "/readyz?verbose=1")).kind, HttpCallKind::kReady);
}

TEST(HttpApiTest, BadRequestsAreAnsweredWithoutACall) {
  EXPECT_EQ(replyOf(route("POST", "/v1/reservations", "{not json")).status, 400);
  EXPECT_EQ(replyOf(route("POST", "/v1/reservations", "[1,2]")).status, 400);
  EXPECT_EQ(replyOf(route("POST", "/v1/reservations", R"({"id":"r","unitz":5})")).status, 400);
  EXPECT_EQ(replyOf(route("POST", "/v1/reservations", R"({"id":"r","units":-5})")).status, 400);
  EXPECT_EQ(replyOf(route("POST", "/v1/reservations", R"({"id":"r","units":1.5})")).status, 400);
  EXPECT_EQ(replyOf(route("POST", "/v1/reservations", R"({"id":7})")).status, 400);
  EXPECT_EQ(replyOf(route("POST", "/v1/reservations", R"({"id":"a","reservationId":"b"})")).status,
            400);
  EXPECT_EQ(
      replyOf(route("POST", "/v1/reservations", R"({"id":"r","priority":4294967296})")).status,
      400);
  EXPECT_EQ(replyOf(route("POST", "/v1/reservations", R"({"id":"r","requestDigest":"ab"})")).status,
            400);
  // The native decode boundary's bounds: an id over 128 bytes, units above 2^40.
  const HttpReply long_id = replyOf(
      route("POST", "/v1/reservations", R"({"id":")" + std::string(129, 'x') + R"(","units":1})"));
  EXPECT_EQ(long_id.status, 400);
  EXPECT_NE(long_id.body.find("reservationId"), std::string::npos) << long_id.body;
  EXPECT_EQ(
      replyOf(route("POST", "/v1/reservations", R"({"id":"r","units":1099511627777})")).status,
      400);
  EXPECT_EQ(replyOf(route("POST", "/v1/reservations/r-1/settle", R"({"actualUnits":"5"})")).status,
            400);
  EXPECT_EQ(replyOf(route("POST", "/v1/reservations/r-1/release", R"({"operationId":"x"})")).status,
            400);
  EXPECT_EQ(
      replyOf(route("POST", "/v1/reservations/r-1/start", R"({"reservationId":"r-2"})")).status,
      400);
  EXPECT_EQ(replyOf(route("POST", "/v1/reservations/r%zz/start")).status, 400);
  EXPECT_EQ(replyOf(route("POST", "/v1/reservations/r-1/explode")).status, 404);
  EXPECT_EQ(replyOf(route("GET", "/v2/anything")).status, 404);
  const HttpReply wrong = replyOf(route("GET", "/v1/reservations"));
  EXPECT_EQ(wrong.status, 405);
  EXPECT_EQ(wrong.allow, "POST");
  EXPECT_EQ(replyOf(route("POST", "/v1/reservations/r-1")).status, 405);
  EXPECT_EQ(replyOf(route("POST", "/healthz")).status, 405);
}

ReservationReply rejection(int64_t retry_after_ms) {
  ReservationReply reply;
  reply.code = ReplyCode::kRejected;
  reply.receipt.reservation_id = "r-1";
  reply.receipt.state = ReservationState::kRejected;
  reply.receipt.limiting_dimension = LimitingDimension::kCapacity;
  reply.receipt.retry_after_ms = retry_after_ms;
  reply.receipt.policy_generation = 7;
  return reply;
}

TEST(HttpApiTest, RejectionsAre429WithRetryAfterAndTheLimitingDimension) {
  const HttpCall call{.kind = HttpCallKind::kReserve, .reservation_id = "r-1"};
  HttpReply reply = httpReplyFor(call, rejection(1'200));
  EXPECT_EQ(reply.status, 429);
  EXPECT_EQ(reply.retry_after_seconds, 2);  // rounded up
  EXPECT_NE(reply.body.find(R"("limitingDimension":"capacity")"), std::string::npos) << reply.body;
  EXPECT_NE(reply.body.find(R"("policyGeneration":7)"), std::string::npos) << reply.body;
  EXPECT_NE(reply.body.find(R"("retryAfterMs":1200)"), std::string::npos) << reply.body;
  // Never under this policy: 429 without a time.
  reply = httpReplyFor(call, rejection(-1));
  EXPECT_EQ(reply.status, 429);
  EXPECT_EQ(reply.retry_after_seconds, -1);
  const std::string bytes = renderHttpResponse(httpReplyFor(call, rejection(1)), false);
  EXPECT_TRUE(bytes.starts_with("HTTP/1.1 429 Too Many Requests\r\n")) << bytes;
  EXPECT_NE(bytes.find("\r\nRetry-After: 1\r\n"), std::string::npos) << bytes;
  // A query of a rejected reservation is a successful query.
  EXPECT_EQ(httpReplyFor(HttpCall{.kind = HttpCallKind::kQuery},
                         [] {
                           ReservationReply r = rejection(5);
                           r.code = ReplyCode::kOk;
                           return r;
                         }())
                .status,
            200);
}

TEST(HttpApiTest, ExtendTakesTheNewTotalAndARefusalIsA429WithRetryAfter) {
  const HttpCall extend = callOf(route("POST", "/v1/reservations/r-1/extend",
                                       R"({"operationId":"op-1","reservedUnitsTotal":900})"));
  EXPECT_EQ(extend.kind, HttpCallKind::kFollowUp);
  const auto* request = std::get_if<ExtendRequest>(&extend.body);
  ASSERT_NE(request, nullptr);
  EXPECT_EQ(request->reservation_id, "r-1");
  EXPECT_EQ(request->operation_id, "op-1");
  EXPECT_EQ(request->reserved_units_total, 900u);
  // Only its own fields: actualUnits is a settle's.
  EXPECT_EQ(replyOf(route("POST", "/v1/reservations/r-1/extend",
                          R"({"operationId":"op-1","actualUnits":900})"))
                .status,
            400);
  EXPECT_EQ(replyOf(route("GET", "/v1/reservations/r-1/extend")).status, 405);
  // Refused: the reservation stays STARTED; 429 and Retry-After as for a reserve.
  ReservationReply refused = rejection(2'500);
  refused.receipt.state = ReservationState::kStarted;
  const HttpReply reply = httpReplyFor(extend, refused);
  EXPECT_EQ(reply.status, 429);
  EXPECT_EQ(reply.retry_after_seconds, 3);
  EXPECT_NE(reply.body.find(R"("state":"STARTED")"), std::string::npos) << reply.body;
  ReservationReply grown = refused;
  grown.code = ReplyCode::kOk;
  EXPECT_EQ(httpReplyFor(extend, grown).status, 200);
}

TEST(HttpApiTest, UnknownOutcomesAre503RetryWithTheSameId) {
  const HttpReply reply =
      httpReplyFor(HttpCall{.kind = HttpCallKind::kReserve, .reservation_id = "r-1"},
                   wire::ErrorReply{.code = wire::ErrorCode::kUnavailable,
                                    .message = "outcome unknown; retry with the same id"});
  EXPECT_EQ(reply.status, 503);
  EXPECT_EQ(reply.retry_after_seconds, 1);
  EXPECT_NE(reply.body.find(R"("code":"UNAVAILABLE")"), std::string::npos) << reply.body;
  EXPECT_NE(reply.body.find(R"("retry":"retry with the same id")"), std::string::npos)
      << reply.body;
}

TEST(HttpApiTest, ReplyCodesMapToStatuses) {
  const HttpCall follow{.kind = HttpCallKind::kFollowUp, .reservation_id = "r-1"};
  auto status = [&](ReplyCode code) {
    ReservationReply reply;
    reply.code = code;
    return httpReplyFor(follow, reply).status;
  };
  EXPECT_EQ(status(ReplyCode::kOk), 200);
  EXPECT_EQ(status(ReplyCode::kQueued), 202);
  EXPECT_EQ(status(ReplyCode::kIdempotencyConflict), 409);
  EXPECT_EQ(status(ReplyCode::kOperationConflict), 409);
  EXPECT_EQ(status(ReplyCode::kExpired), 409);
  EXPECT_EQ(status(ReplyCode::kInvalidState), 409);
  EXPECT_EQ(status(ReplyCode::kNotFound), 404);
  EXPECT_EQ(status(ReplyCode::kInvalidArgument), 400);
  EXPECT_EQ(status(ReplyCode::kResourceExhausted), 503);
  EXPECT_EQ(status(ReplyCode::kArithmeticOverflow), 422);
  // Without a receipt the id asked about is shown.
  ReservationReply missing;
  missing.code = ReplyCode::kNotFound;
  EXPECT_NE(httpReplyFor(follow, missing).body.find(R"("reservationId":"r-1")"), std::string::npos);
}

TEST(HttpApiTest, ReadyzFollowsTheLinkHealthzAlwaysAnswers) {
  const HttpCall ready{.kind = HttpCallKind::kReady};
  const HttpCall live{.kind = HttpCallKind::kHealth};
  for (const char* status : {"HEALTHY", "DEGRADED"}) {
    EXPECT_EQ(httpReplyFor(ready, wire::HealthReply{.status = status}).status, 200) << status;
  }
  for (const char* status : {"PARTITIONED", "DISCONNECTED"}) {
    EXPECT_EQ(httpReplyFor(ready, wire::HealthReply{.status = status}).status, 503) << status;
    EXPECT_EQ(httpReplyFor(live, wire::HealthReply{.status = status}).status, 200) << status;
  }
}

}  // namespace
}  // namespace tally::agent
