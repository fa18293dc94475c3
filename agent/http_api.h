#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <variant>

#include "wire/codec.h"

// HTTP/1.1 + JSON on the agent (docs/protocol.md "HTTP"): pure translation between an HTTP
// request and the agent's own request path, and between the agent's answer and an HTTP reply.
// No decision is made here: a request becomes the wire::RequestBody a gateway would send on the
// native socket, passed through the native socket's own decode boundary (encoded, then
// wire::decodeRequest: the same field checks, the same errors), and handed to the same
// AgentService::handle. The answer's JSON is tallyctl's (`tallyctl --json`), so the field
// names are one contract.
//
//   POST /v1/reservations                    reserve   {"reservationId" (or "id"), "subject",
//                                            "route", "units" (or "reservedUnits"), "region",
//                                            "priority", "policyGeneration", "requestDigest"}
//   POST /v1/reservations/{id}/start         {"operationId"}
//   POST /v1/reservations/{id}/settle        {"operationId", "actualUnits"}
//   POST /v1/reservations/{id}/release       {} (or no body)
//   POST /v1/reservations/{id}/unknown       {"operationId"}
//   POST /v1/reservations/{id}/report        {"operationId", "actualUnits"}
//   POST /v1/reservations/{id}/extend        {"operationId", "reservedUnitsTotal"}: streaming
//                                            top-up of a STARTED reservation (a new total);
//                                            refused: 429 with Retry-After, as a reserve
//   GET  /v1/reservations/{id}               query
//   GET  /healthz                            the agent answers (200) with its link's health
//   GET  /readyz                             200 while the link to the ledger is usable, else 503
//
// Status codes: 200 ok; 202 queued (durably in the outbox); 429 rejected, with Retry-After
// (seconds, rounded up) unless the rejection is "never under this policy" (retryAfterMs -1);
// 409 idempotency/operation conflict, expired, invalid state; 404 not found (and unknown
// paths); 400 a bad request (JSON, a field, the wire's bounds); 405 wrong method; 413 body too
// large; 431 headers too large; 503 unavailable ("retry with the same id"; Retry-After: 1) and
// resource exhausted; 422 arithmetic overflow; 403 a peer not allowed; 500 internal.

namespace tally::agent {

inline constexpr std::string_view kRetrySameId = "retry with the same id";

struct HttpRequest {
  std::string method;  // "GET", "POST", …
  std::string target;  // the request target, e.g. "/v1/reservations/r-1/start?x=y"
  std::string body;
};

struct HttpReply {
  int status = 200;
  std::string body;                  // JSON, newline-terminated
  int64_t retry_after_seconds = -1;  // >= 0: a Retry-After header
  std::string allow;                 // non-empty: an Allow header (405)
};

enum class HttpCallKind : uint8_t { kReserve, kFollowUp, kQuery, kHealth, kReady };

// A request for the agent's request path, and what to make of its answer.
struct HttpCall {
  HttpCallKind kind = HttpCallKind::kHealth;
  std::string reservation_id;  // the id asked about (shown when a reply carries no receipt)
  wire::RequestBody body;
};

// The call an HTTP request makes, or the reply it gets without one (a bad request, an unknown
// path, a wrong method).
std::variant<HttpCall, HttpReply> routeHttpRequest(const HttpRequest& request);

// The HTTP reply to the agent's answer to `call`.
HttpReply httpReplyFor(const HttpCall& call, const wire::ResponseBody& answer);

// An error reply: {"error": true, "code": CODE, "message": MESSAGE} (tallyctl's error object).
HttpReply httpError(int status, std::string_view code, std::string_view message);

// "OK", "Too Many Requests", …
const char* httpStatusText(int status);

// The bytes of the response: status line, Content-Type, Content-Length, Retry-After and Allow
// when set, Connection: close when `close`, then the body.
std::string renderHttpResponse(const HttpReply& reply, bool close);

}  // namespace tally::agent
