#include "tally/client.h"

#include <chrono>
#include <random>
#include <thread>
#include <utility>
#include <variant>

#include "central-client/blocking_client.h"
#include "core/ledger_types.h"
#include "core/status.h"
#include "wire/codec.h"
#include "wire/digest.h"

namespace tally {

const char* outcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kOk: return "ok";
    case Outcome::kQueued: return "queued";
    case Outcome::kRejected: return "rejected";
    case Outcome::kConflict: return "conflict";
    case Outcome::kNotFound: return "notFound";
    case Outcome::kInvalid: return "invalid";
    case Outcome::kUnavailable: return "unavailable";
    case Outcome::kError: return "error";
  }
  return "error";
}

namespace {

using Clock = std::chrono::steady_clock;

Receipt receiptOf(const Reservation& r, Units refunded) {
  return Receipt{.reservation_id = r.reservation_id,
                 .state = reservationStateName(r.state),
                 .subject = r.subject,
                 .route = r.route,
                 .operation_id = r.operation_id,
                 .reserved_units = r.reserved_units,
                 .actual_units = r.actual_units,
                 .refunded_units = refunded,
                 .debt_units = r.debt_units,
                 .policy_generation = r.policy_generation,
                 .expires_at_ms = r.expires_at_ms,
                 // A rejected reserve, or a refused extend (its reservation stays STARTED).
                 .limiting_dimension = r.limiting_dimension != LimitingDimension::kNone
                                           ? limitingDimensionName(r.limiting_dimension)
                                           : "",
                 .retry_after_ms = r.retry_after_ms};
}

Outcome outcomeOf(const ReservationReply& reply) {
  if (reply.receipt.state == ReservationState::kRejected) return Outcome::kRejected;
  switch (reply.code) {
    case ReplyCode::kOk: return Outcome::kOk;
    case ReplyCode::kQueued: return Outcome::kQueued;
    case ReplyCode::kRejected: return Outcome::kRejected;
    case ReplyCode::kIdempotencyConflict:
    case ReplyCode::kOperationConflict:
    case ReplyCode::kExpired:
    case ReplyCode::kInvalidState: return Outcome::kConflict;
    case ReplyCode::kNotFound: return Outcome::kNotFound;
    case ReplyCode::kInvalidArgument:
    case ReplyCode::kArithmeticOverflow: return Outcome::kInvalid;
    case ReplyCode::kResourceExhausted: return Outcome::kUnavailable;
  }
  return Outcome::kError;
}

Answer answerOf(const wire::ResponseBody& body) {
  Answer answer;
  if (const auto* reply = std::get_if<ReservationReply>(&body)) {
    answer.outcome = outcomeOf(*reply);
    answer.code = replyCodeName(reply->code);
    answer.duplicate = reply->duplicate;
    if (!reply->receipt.reservation_id.empty()) {
      answer.receipt = receiptOf(reply->receipt, reply->refunded_units);
    }
    answer.message = reply->message;
    return answer;
  }
  if (const auto* error = std::get_if<wire::ErrorReply>(&body)) {
    answer.code = errorCodeName(error->code);
    answer.message = error->message;
    switch (error->code) {
      case wire::ErrorCode::kUnavailable: answer.outcome = Outcome::kUnavailable; break;
      case wire::ErrorCode::kInvalidArgument:
      case wire::ErrorCode::kFrameTooLarge:
      case wire::ErrorCode::kMalformedFrame: answer.outcome = Outcome::kInvalid; break;
      default: answer.outcome = Outcome::kError; break;
    }
    return answer;
  }
  answer.code = "UNEXPECTED_ANSWER";
  answer.message = "the agent answered with another message kind";
  return answer;
}

}  // namespace

class Client::Impl {
 public:
  explicit Impl(ClientOptions options)
      : options_(std::move(options)), rng_(std::random_device{}()) {}

  // Sends `body` until a definitive answer or the deadline (the rules in client.h).
  Answer call(const wire::RequestBody& body) {
    const auto deadline = Clock::now() + std::chrono::milliseconds(options_.deadline_ms);
    uint64_t backoff_ms = options_.backoff_first_ms;
    Answer last{.outcome = Outcome::kUnavailable, .code = "UNAVAILABLE"};
    int attempts = 0;
    bool lost_reserve = false;  // a reserve whose answer was lost: query before re-sending
    const auto* reserve = std::get_if<ReserveRequest>(&body);
    while (true) {
      ++attempts;
      if (lost_reserve) {
        Result<wire::Response> found =
            send(QueryRequest{.reservation_id = reserve->reservation_id});
        if (found.isOk()) {
          Answer queried = answerOf(found.value().body);
          if (queried.outcome != Outcome::kNotFound && queried.outcome != Outcome::kUnavailable &&
              !queried.receipt.reservation_id.empty()) {
            queried.duplicate = true;  // the lost reserve had landed: its receipt
            queried.receipt.refunded_units = 0;
            queried.attempts = attempts;
            return queried;
          }
          if (queried.outcome == Outcome::kNotFound) lost_reserve = false;  // send it again
        } else {
          last.message = found.status().toString();
        }
      }
      if (!lost_reserve) {
        Result<wire::Response> response = send(body);
        if (response.isOk()) {
          Answer answer = answerOf(response.value().body);
          answer.attempts = attempts;
          if (answer.outcome != Outcome::kUnavailable) return answer;
          last = std::move(answer);
        } else {
          // Sent or not, we cannot tell: the outcome is unknown.
          last = Answer{.outcome = Outcome::kUnavailable,
                        .code = "UNAVAILABLE",
                        .message = response.status().toString()};
          if (reserve != nullptr) lost_reserve = true;
        }
      }
      last.attempts = attempts;
      const auto now = Clock::now();
      if (now >= deadline) return last;
      std::uniform_int_distribution<uint64_t> jitter(backoff_ms / 2, backoff_ms);
      std::this_thread::sleep_for(
          std::min<Clock::duration>(std::chrono::milliseconds(jitter(rng_)), deadline - now));
      backoff_ms = std::min(backoff_ms * 2, options_.backoff_max_ms);
    }
  }

 private:
  Result<wire::Response> send(const wire::RequestBody& body) {
    if (connection_ == nullptr) {
      Result<client::Endpoint> endpoint = client::unixEndpoint(options_.socket_path);
      if (!endpoint.isOk()) return endpoint.status();
      Result<std::unique_ptr<client::BlockingClient>> connected =
          client::BlockingClient::connect(endpoint.value(), options_.attempt_timeout_ms);
      if (!connected.isOk()) return connected.status();
      connection_ = std::move(connected).value();
    }
    Result<wire::Response> response = connection_->call(body, options_.attempt_timeout_ms);
    if (!response.isOk()) connection_.reset();  // a fresh connection for the next attempt
    return response;
  }

  ClientOptions options_;
  std::mt19937_64 rng_;
  std::unique_ptr<client::BlockingClient> connection_;
};

Client::Client(ClientOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Client::~Client() = default;

Answer Client::reserve(const ReserveArgs& args) {
  ReserveRequest request{.reservation_id = args.reservation_id,
                         .subject = args.subject,
                         .route = args.route,
                         .units = args.units,
                         .policy_generation = args.policy_generation,
                         .priority = args.priority,
                         .region = args.region};
  request.request_digest = wire::canonicalRequestDigest(request);
  return impl_->call(request);
}

Answer Client::start(const std::string& reservation_id, const std::string& operation_id) {
  return impl_->call(StartRequest{.reservation_id = reservation_id, .operation_id = operation_id});
}

Answer Client::settle(const std::string& reservation_id, const std::string& operation_id,
                      uint64_t actual_units) {
  return impl_->call(SettleRequest{.reservation_id = reservation_id,
                                   .operation_id = operation_id,
                                   .actual_units = actual_units});
}

Answer Client::release(const std::string& reservation_id) {
  return impl_->call(ReleaseRequest{.reservation_id = reservation_id});
}

Answer Client::markUnknown(const std::string& reservation_id, const std::string& operation_id) {
  return impl_->call(
      MarkUnknownRequest{.reservation_id = reservation_id, .operation_id = operation_id});
}

Answer Client::report(const std::string& reservation_id, const std::string& operation_id,
                      uint64_t actual_units) {
  return impl_->call(ReportOperationRequest{.reservation_id = reservation_id,
                                            .operation_id = operation_id,
                                            .actual_units = actual_units});
}

Answer Client::extend(const std::string& reservation_id, const std::string& operation_id,
                      uint64_t reserved_units_total) {
  return impl_->call(ExtendRequest{.reservation_id = reservation_id,
                                   .operation_id = operation_id,
                                   .reserved_units_total = reserved_units_total});
}

Answer Client::query(const std::string& reservation_id) {
  return impl_->call(QueryRequest{.reservation_id = reservation_id});
}

}  // namespace tally
