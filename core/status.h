#pragma once

#include <string>
#include <utility>
#include <variant>

#include "core/assert.h"

// Operating errors (I/O, malformed bytes, peer gone, resource limits): LevelDB-style Status and
// Result<T>. Domain outcomes (rejected, conflict, already settled) are not errors; they are
// result codes in the return types of the state machines.

namespace tally {

enum class StatusCode : uint8_t {
  kOk = 0,
  kInvalidArgument,
  kCorruption,
  kIoError,
  kUnavailable,
  kResourceExhausted,
  kNotFound,
  kFailedPrecondition,
};

const char* statusCodeName(StatusCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  static Status ok() { return Status(); }
  static Status invalidArgument(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  static Status corruption(std::string message) {
    return Status(StatusCode::kCorruption, std::move(message));
  }
  static Status ioError(std::string message) {
    return Status(StatusCode::kIoError, std::move(message));
  }
  static Status unavailable(std::string message) {
    return Status(StatusCode::kUnavailable, std::move(message));
  }
  static Status resourceExhausted(std::string message) {
    return Status(StatusCode::kResourceExhausted, std::move(message));
  }
  static Status notFound(std::string message) {
    return Status(StatusCode::kNotFound, std::move(message));
  }
  static Status failedPrecondition(std::string message) {
    return Status(StatusCode::kFailedPrecondition, std::move(message));
  }

  bool isOk() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  std::string toString() const;

 private:
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {
    TALLY_ASSERT(code != StatusCode::kOk);
  }

  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

template <typename T>
class [[nodiscard]] Result {
 public:
  // By reference, not by value: a value taken by value would be moved twice on its way in.
  Result(T&& value) : state_(std::move(value)) {}      // NOLINT: implicit by design
  Result(const T& value) : state_(value) {}            // NOLINT: implicit by design
  Result(Status status) : state_(std::move(status)) {  // NOLINT: implicit by design
    TALLY_ASSERT(!std::get<Status>(state_).isOk());
  }

  bool isOk() const { return std::holds_alternative<T>(state_); }
  const Status& status() const {
    TALLY_ASSERT(!isOk());
    return std::get<Status>(state_);
  }
  T& value() & {
    TALLY_ASSERT(isOk());
    return std::get<T>(state_);
  }
  const T& value() const& {
    TALLY_ASSERT(isOk());
    return std::get<T>(state_);
  }
  T&& value() && {
    TALLY_ASSERT(isOk());
    return std::get<T>(std::move(state_));
  }

 private:
  std::variant<T, Status> state_;
};

}  // namespace tally
