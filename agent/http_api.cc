#include "agent/http_api.h"

#include <nlohmann/json.hpp>

#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "ctl/json.h"
#include "ctl/render.h"
#include "wire/digest.h"
#include "wire/frame.h"

namespace tally::agent {
namespace {

using Json = nlohmann::json;

constexpr std::string_view kReservations = "/v1/reservations";

HttpReply badRequest(std::string_view message) {
  return httpError(400, "INVALID_ARGUMENT", message);
}

// "%2F" and friends in a path segment; nullopt if an escape is malformed.
std::optional<std::string> percentDecode(std::string_view text) {
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    if (i + 2 >= text.size()) return std::nullopt;
    const int high = hex(text[i + 1]);
    const int low = hex(text[i + 2]);
    if (high < 0 || low < 0) return std::nullopt;
    out += static_cast<char>(high * 16 + low);
    i += 2;
  }
  return out;
}

// The JSON object of a request body ("" reads as {}), or the reply refusing it. Only `allowed`
// keys may appear.
std::variant<Json, HttpReply> bodyObject(const std::string& body,
                                         const std::set<std::string_view>& allowed) {
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) return Json::object();
  Json parsed = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (parsed.is_discarded()) return badRequest("the body is not valid JSON");
  if (!parsed.is_object()) return badRequest("the body must be a JSON object");
  for (const auto& [key, value] : parsed.items()) {
    if (!allowed.contains(key)) return badRequest("unknown field '" + key + "'");
  }
  return parsed;
}

// Field `name` or its alias of `object` in `*found` (nullptr when absent); an error reply for a
// field given under both names.
std::optional<HttpReply> findField(const Json& object, std::string_view name,
                                   std::string_view alias, const Json** found) {
  *found = nullptr;
  for (std::string_view key : {name, alias}) {
    if (key.empty()) continue;
    auto it = object.find(std::string(key));
    if (it == object.end()) continue;
    if (*found != nullptr) {
      return badRequest("'" + std::string(name) + "' and '" + std::string(alias) +
                        "' name the same field: give one");
    }
    *found = &*it;
  }
  return std::nullopt;
}

// Reads field `name` (or its alias) of `object` into `*out`; an error reply for a wrong type or
// a field given under both names.
std::optional<HttpReply> readString(const Json& object, std::string_view name,
                                    std::string_view alias, std::string* out) {
  const Json* found = nullptr;
  if (auto error = findField(object, name, alias, &found)) return error;
  if (found == nullptr) return std::nullopt;
  if (!found->is_string()) return badRequest("'" + std::string(name) + "' must be a string");
  *out = found->get<std::string>();
  return std::nullopt;
}

std::optional<HttpReply> readUnsigned(const Json& object, std::string_view name,
                                      std::string_view alias, uint64_t max, uint64_t* out) {
  const Json* found = nullptr;
  if (auto error = findField(object, name, alias, &found)) return error;
  if (found == nullptr) return std::nullopt;
  // Negative numbers are integers but not unsigned; 1e3, 1.5 and numbers above 2^64 are floats.
  if (!found->is_number_unsigned()) {
    return badRequest("'" + std::string(name) + "' must be a non-negative integer");
  }
  const uint64_t value = found->get<uint64_t>();
  if (value > max) {
    return badRequest("'" + std::string(name) + "' must be at most " + std::to_string(max));
  }
  *out = value;
  return std::nullopt;
}

// Passes `body` through the native socket's decode boundary: the request the agent serves is
// exactly what wire::decodeRequest makes of its encoding, or the error it gives.
std::variant<HttpCall, HttpReply> throughWire(HttpCallKind kind, std::string reservation_id,
                                              wire::RequestBody body) {
  Result<std::vector<uint8_t>> frame =
      wire::encodeRequestFrame(wire::Request{.request_id = 1, .body = std::move(body)});
  if (!frame.isOk()) return httpError(413, "FRAME_TOO_LARGE", frame.status().message());
  const wire::Frame payload(frame.value().begin() + wire::kFrameHeaderBytes, frame.value().end());
  wire::DecodedRequest decoded = wire::decodeRequest(payload);
  if (!decoded.body.isOk()) {
    const wire::ErrorReply error = wire::errorReplyFor(decoded.body.status());
    return httpError(400, ctl::errorCodeConstant(error.code), error.message);
  }
  return HttpCall{.kind = kind,
                  .reservation_id = std::move(reservation_id),
                  .body = std::move(decoded.body).value()};
}

std::variant<HttpCall, HttpReply> reserveCall(const std::string& body) {
  auto object =
      bodyObject(body, {"reservationId", "id", "subject", "route", "units", "reservedUnits",
                        "region", "priority", "policyGeneration", "requestDigest"});
  if (auto* reply = std::get_if<HttpReply>(&object)) return std::move(*reply);
  const Json& json = std::get<Json>(object);
  ReserveRequest request;
  uint64_t priority = 0;
  std::string digest;
  std::optional<HttpReply> error;
  if ((error = readString(json, "reservationId", "id", &request.reservation_id)) ||
      (error = readString(json, "subject", "", &request.subject)) ||
      (error = readString(json, "route", "", &request.route)) ||
      (error = readString(json, "region", "", &request.region)) ||
      (error = readString(json, "requestDigest", "", &digest)) ||
      (error = readUnsigned(json, "units", "reservedUnits", std::numeric_limits<uint64_t>::max(),
                            &request.units)) ||
      (error =
           readUnsigned(json, "priority", "", std::numeric_limits<uint32_t>::max(), &priority)) ||
      (error = readUnsigned(json, "policyGeneration", "", std::numeric_limits<uint64_t>::max(),
                            &request.policy_generation))) {
    return std::move(*error);
  }
  request.priority = static_cast<uint32_t>(priority);
  if (digest.empty()) {
    request.request_digest = wire::canonicalRequestDigest(request);  // as tallyctl does
  } else {
    Result<Digest> parsed = wire::parseDigestHex(digest);
    if (!parsed.isOk()) {
      return badRequest("'requestDigest' must be 64 hexadecimal characters (a sha256)");
    }
    request.request_digest = parsed.value();
  }
  std::string id = request.reservation_id;
  return throughWire(HttpCallKind::kReserve, std::move(id), std::move(request));
}

std::variant<HttpCall, HttpReply> followUpCall(const std::string& id, std::string_view verb,
                                               const std::string& body) {
  const bool has_operation = verb != "release";
  const bool has_actual = verb == "settle" || verb == "report";
  const bool has_total = verb == "extend";
  std::set<std::string_view> allowed = {"reservationId"};
  if (has_operation) allowed.insert("operationId");
  if (has_actual) allowed.insert("actualUnits");
  if (has_total) allowed.insert("reservedUnitsTotal");
  auto object = bodyObject(body, allowed);
  if (auto* reply = std::get_if<HttpReply>(&object)) return std::move(*reply);
  const Json& json = std::get<Json>(object);
  std::string body_id = id;
  std::string operation_id;
  uint64_t actual = 0;
  uint64_t total = 0;
  std::optional<HttpReply> error;
  if ((error = readString(json, "reservationId", "", &body_id)) ||
      (error = readString(json, "operationId", "", &operation_id)) ||
      (error =
           readUnsigned(json, "actualUnits", "", std::numeric_limits<uint64_t>::max(), &actual)) ||
      (error = readUnsigned(json, "reservedUnitsTotal", "", std::numeric_limits<uint64_t>::max(),
                            &total))) {
    return std::move(*error);
  }
  if (body_id != id) {
    return badRequest("'reservationId' in the body differs from the id in the path");
  }
  wire::RequestBody request;
  if (verb == "start") {
    request = StartRequest{.reservation_id = id, .operation_id = operation_id};
  } else if (verb == "settle") {
    request =
        SettleRequest{.reservation_id = id, .operation_id = operation_id, .actual_units = actual};
  } else if (verb == "release") {
    request = ReleaseRequest{.reservation_id = id};
  } else if (verb == "unknown") {
    request = MarkUnknownRequest{.reservation_id = id, .operation_id = operation_id};
  } else if (verb == "extend") {
    request = ExtendRequest{
        .reservation_id = id, .operation_id = operation_id, .reserved_units_total = total};
  } else {
    request = ReportOperationRequest{
        .reservation_id = id, .operation_id = operation_id, .actual_units = actual};
  }
  return throughWire(HttpCallKind::kFollowUp, id, std::move(request));
}

HttpReply methodNotAllowed(std::string_view allow) {
  HttpReply reply = httpError(405, "METHOD_NOT_ALLOWED", "use " + std::string(allow));
  reply.allow = std::string(allow);
  return reply;
}

bool isRejection(const ReservationReply& reply) {
  return reply.code == ReplyCode::kRejected || reply.receipt.state == ReservationState::kRejected;
}

int statusOf(ReplyCode code) {
  switch (code) {
    case ReplyCode::kOk: return 200;
    case ReplyCode::kRejected: return 429;
    case ReplyCode::kIdempotencyConflict:
    case ReplyCode::kOperationConflict:
    case ReplyCode::kExpired:
    case ReplyCode::kInvalidState: return 409;
    case ReplyCode::kNotFound: return 404;
    case ReplyCode::kInvalidArgument: return 400;
    case ReplyCode::kResourceExhausted: return 503;
    case ReplyCode::kArithmeticOverflow: return 422;
    case ReplyCode::kQueued: return 202;
  }
  return 500;
}

int statusOf(wire::ErrorCode code) {
  switch (code) {
    case wire::ErrorCode::kMalformedFrame:
    case wire::ErrorCode::kInvalidArgument: return 400;
    case wire::ErrorCode::kFrameTooLarge: return 413;
    case wire::ErrorCode::kUnknownMessage:
    case wire::ErrorCode::kNotFound: return 404;
    case wire::ErrorCode::kUnavailable:
    case wire::ErrorCode::kNotPrimary: return 503;
    case wire::ErrorCode::kPermissionDenied: return 403;
    case wire::ErrorCode::kUnspecified:
    case wire::ErrorCode::kInternal: return 500;
  }
  return 500;
}

int64_t secondsRoundedUp(int64_t ms) { return ms <= 0 ? 0 : (ms + 999) / 1000; }

HttpReply reservationReply(const HttpCall& call, const ReservationReply& reply) {
  HttpReply out;
  const bool query = call.kind == HttpCallKind::kQuery;
  out.body = ctl::renderReservation(
      ctl::ReservationView{.reply = reply, .requested_id = call.reservation_id, .is_query = query},
      /*json=*/true);
  if (!out.body.empty() && out.body.back() != '\n') out.body += '\n';
  out.status = statusOf(reply.code);
  // A refused extend (the one follow-up that can be REJECTED) is a 429 like a refused reserve.
  if ((call.kind == HttpCallKind::kReserve && isRejection(reply)) ||
      (!query && reply.code == ReplyCode::kRejected)) {
    out.status = 429;
    // -1: never under this policy, so no time to name.
    if (reply.receipt.retry_after_ms >= 0) {
      out.retry_after_seconds = secondsRoundedUp(reply.receipt.retry_after_ms);
    }
  } else if (query && reply.code == ReplyCode::kOk) {
    out.status = 200;  // a query of a rejected reservation succeeded
  }
  if (reply.code == ReplyCode::kResourceExhausted) out.retry_after_seconds = 1;
  return out;
}

HttpReply errorReply(const wire::ErrorReply& error) {
  HttpReply out =
      httpError(statusOf(error.code), ctl::errorCodeConstant(error.code), error.message);
  if (error.code == wire::ErrorCode::kUnavailable) out.retry_after_seconds = 1;
  return out;
}

}  // namespace

HttpReply httpError(int status, std::string_view code, std::string_view message) {
  ctl::JsonWriter w;
  w.beginObject();
  w.field("error", true);
  w.field("code", code);
  w.field("message", message);
  if (status == 503) w.field("retry", kRetrySameId);
  w.endObject();
  return HttpReply{.status = status, .body = w.take() + "\n"};
}

std::variant<HttpCall, HttpReply> routeHttpRequest(const HttpRequest& request) {
  std::string_view path = request.target;
  if (const size_t query = path.find('?'); query != std::string_view::npos) {
    path = path.substr(0, query);
  }
  const bool get = request.method == "GET";
  const bool post = request.method == "POST";
  if (path == "/healthz" || path == "/readyz") {
    if (!get) return methodNotAllowed("GET");
    return HttpCall{.kind = path == "/healthz" ? HttpCallKind::kHealth : HttpCallKind::kReady,
                    .body = wire::HealthRequest{}};
  }
  if (path == kReservations) {
    if (!post) return methodNotAllowed("POST");
    return reserveCall(request.body);
  }
  if (!path.starts_with(kReservations) || path.size() == kReservations.size() ||
      path[kReservations.size()] != '/') {
    return httpError(404, "NOT_FOUND", "no such path: " + std::string(path));
  }
  std::string_view rest = path.substr(kReservations.size() + 1);
  std::string_view verb;
  if (const size_t slash = rest.find('/'); slash != std::string_view::npos) {
    verb = rest.substr(slash + 1);
    rest = rest.substr(0, slash);
  }
  std::optional<std::string> id = percentDecode(rest);
  if (!id.has_value()) return badRequest("the reservation id in the path has a bad %-escape");
  if (id->empty()) return badRequest("the reservation id in the path is empty");
  if (verb.empty()) {
    if (!get) return methodNotAllowed("GET");
    std::string asked = *id;
    return throughWire(HttpCallKind::kQuery, std::move(asked), QueryRequest{.reservation_id = *id});
  }
  static const std::set<std::string_view> kVerbs = {"start",   "settle", "release",
                                                    "unknown", "report", "extend"};
  if (!kVerbs.contains(verb)) {
    return httpError(404, "NOT_FOUND", "no such path: " + std::string(path));
  }
  if (!post) return methodNotAllowed("POST");
  return followUpCall(*id, verb, request.body);
}

HttpReply httpReplyFor(const HttpCall& call, const wire::ResponseBody& answer) {
  if (const auto* error = std::get_if<wire::ErrorReply>(&answer)) return errorReply(*error);
  if (call.kind == HttpCallKind::kHealth || call.kind == HttpCallKind::kReady) {
    const auto* health = std::get_if<wire::HealthReply>(&answer);
    if (health == nullptr) return httpError(500, "INTERNAL", "unexpected answer to health");
    HttpReply out{.status = 200, .body = ctl::renderHealth(*health, /*json=*/true)};
    // Ready: the agent can forward to the ledger (connected, not PARTITIONED).
    if (call.kind == HttpCallKind::kReady &&
        (health->status == "DISCONNECTED" || health->status == "PARTITIONED")) {
      out.status = 503;
    }
    return out;
  }
  const auto* reply = std::get_if<ReservationReply>(&answer);
  if (reply == nullptr) return httpError(500, "INTERNAL", "unexpected answer to a reservation");
  return reservationReply(call, *reply);
}

const char* httpStatusText(int status) {
  switch (status) {
    case 200: return "OK";
    case 202: return "Accepted";
    case 400: return "Bad Request";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 409: return "Conflict";
    case 413: return "Content Too Large";
    case 422: return "Unprocessable Content";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    default: return "Unknown";
  }
}

std::string renderHttpResponse(const HttpReply& reply, bool close) {
  std::string out =
      "HTTP/1.1 " + std::to_string(reply.status) + " " + httpStatusText(reply.status) +
      "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(reply.body.size()) +
      "\r\n";
  if (reply.retry_after_seconds >= 0) {
    out += "Retry-After: " + std::to_string(reply.retry_after_seconds) + "\r\n";
  }
  if (!reply.allow.empty()) out += "Allow: " + reply.allow + "\r\n";
  if (close) out += "Connection: close\r\n";
  out += "\r\n";
  out += reply.body;
  return out;
}

}  // namespace tally::agent
