#include "wire/enum_mapping.h"

#include "core/assert.h"

namespace tally::wire {

std::optional<ReservationState> enumToCore(schema::ReservationState value) {
  using W = schema::ReservationState;
  switch (value) {
    case W::REQUESTED: return ReservationState::kRequested;
    case W::RESERVED: return ReservationState::kReserved;
    case W::STARTED: return ReservationState::kStarted;
    case W::SETTLED: return ReservationState::kSettled;
    case W::SETTLED_WITH_DEBT: return ReservationState::kSettledWithDebt;
    case W::REJECTED: return ReservationState::kRejected;
    case W::RELEASED: return ReservationState::kReleased;
    case W::EXPIRING: return ReservationState::kExpiring;
    case W::EXPIRED: return ReservationState::kExpired;
    case W::USAGE_UNKNOWN: return ReservationState::kUsageUnknown;
    case W::RESERVATION_UNKNOWN: return ReservationState::kReservationUnknown;
  }
  return std::nullopt;  // a raw value beyond the schema
}

std::optional<LimitingDimension> enumToCore(schema::LimitingDimension value) {
  using W = schema::LimitingDimension;
  switch (value) {
    case W::NONE: return LimitingDimension::kNone;
    case W::CAPACITY: return LimitingDimension::kCapacity;
    case W::DEBT: return LimitingDimension::kDebt;
    case W::FROZEN_ROUTE: return LimitingDimension::kFrozenRoute;
    case W::MAX_SINGLE_RESERVATION: return LimitingDimension::kMaxSingleReservation;
    case W::GENERATION_DRAINING: return LimitingDimension::kGenerationDraining;
    case W::NO_BUDGET: return LimitingDimension::kNoBudget;
    case W::LEDGER_UNAVAILABLE: return LimitingDimension::kLedgerUnavailable;
  }
  return std::nullopt;  // a raw value beyond the schema
}

std::optional<ReplyCode> enumToCore(schema::ReplyCode value) {
  using W = schema::ReplyCode;
  switch (value) {
    case W::OK: return ReplyCode::kOk;
    case W::REJECTED: return ReplyCode::kRejected;
    case W::IDEMPOTENCY_CONFLICT: return ReplyCode::kIdempotencyConflict;
    case W::OPERATION_CONFLICT: return ReplyCode::kOperationConflict;
    case W::EXPIRED: return ReplyCode::kExpired;
    case W::INVALID_STATE: return ReplyCode::kInvalidState;
    case W::NOT_FOUND: return ReplyCode::kNotFound;
    case W::INVALID_ARGUMENT: return ReplyCode::kInvalidArgument;
    case W::RESOURCE_EXHAUSTED: return ReplyCode::kResourceExhausted;
    case W::ARITHMETIC_OVERFLOW: return ReplyCode::kArithmeticOverflow;
    case W::QUEUED: return ReplyCode::kQueued;
  }
  return std::nullopt;  // a raw value beyond the schema
}

std::optional<GenerationState> enumToCore(schema::GenerationState value) {
  using W = schema::GenerationState;
  switch (value) {
    case W::ACTIVE: return GenerationState::kActive;
    case W::DRAINING: return GenerationState::kDraining;
    case W::DRAINED: return GenerationState::kDrained;
  }
  return std::nullopt;  // a raw value beyond the schema
}

std::optional<RolloutMode> enumToCore(schema::RolloutMode value) {
  using W = schema::RolloutMode;
  switch (value) {
    case W::OFF: return RolloutMode::kOff;
    case W::SHADOW: return RolloutMode::kShadow;
    case W::ENFORCE: return RolloutMode::kEnforce;
  }
  return std::nullopt;  // a raw value beyond the schema
}

std::optional<EpochPeriod> enumToCore(schema::EpochPeriod value) {
  using W = schema::EpochPeriod;
  switch (value) {
    case W::HOUR: return EpochPeriod::kHour;
    case W::DAY: return EpochPeriod::kDay;
  }
  return std::nullopt;  // a raw value beyond the schema
}

std::optional<ErrorCode> enumToCore(schema::ErrorCode value) {
  using W = schema::ErrorCode;
  switch (value) {
    case W::UNSPECIFIED: return ErrorCode::kUnspecified;
    case W::MALFORMED_FRAME: return ErrorCode::kMalformedFrame;
    case W::FRAME_TOO_LARGE: return ErrorCode::kFrameTooLarge;
    case W::UNKNOWN_MESSAGE: return ErrorCode::kUnknownMessage;
    case W::INVALID_ARGUMENT: return ErrorCode::kInvalidArgument;
    case W::UNAVAILABLE: return ErrorCode::kUnavailable;
    case W::INTERNAL: return ErrorCode::kInternal;
    case W::PERMISSION_DENIED: return ErrorCode::kPermissionDenied;
    case W::NOT_FOUND: return ErrorCode::kNotFound;
    case W::NOT_PRIMARY: return ErrorCode::kNotPrimary;
  }
  return std::nullopt;  // a raw value beyond the schema
}

std::optional<ShardState> enumToCore(schema::ShardState value) {
  using W = schema::ShardState;
  switch (value) {
    case W::ISSUED: return ShardState::kIssued;
    case W::REVOKED: return ShardState::kRevoked;
    case W::RECONCILING: return ShardState::kReconciling;
    case W::RECONCILED: return ShardState::kReconciled;
    case W::CONFLICT: return ShardState::kConflict;
    case W::WRITTEN_OFF: return ShardState::kWrittenOff;
  }
  return std::nullopt;  // a raw value beyond the schema
}

schema::ReservationState enumFromCore(ReservationState value) {
  using W = schema::ReservationState;
  switch (value) {
    case ReservationState::kRequested: return W::REQUESTED;
    case ReservationState::kReserved: return W::RESERVED;
    case ReservationState::kStarted: return W::STARTED;
    case ReservationState::kSettled: return W::SETTLED;
    case ReservationState::kSettledWithDebt: return W::SETTLED_WITH_DEBT;
    case ReservationState::kRejected: return W::REJECTED;
    case ReservationState::kReleased: return W::RELEASED;
    case ReservationState::kExpiring: return W::EXPIRING;
    case ReservationState::kExpired: return W::EXPIRED;
    case ReservationState::kUsageUnknown: return W::USAGE_UNKNOWN;
    case ReservationState::kReservationUnknown: return W::RESERVATION_UNKNOWN;
  }
  TALLY_UNREACHABLE();
}

schema::LimitingDimension enumFromCore(LimitingDimension value) {
  using W = schema::LimitingDimension;
  switch (value) {
    case LimitingDimension::kNone: return W::NONE;
    case LimitingDimension::kCapacity: return W::CAPACITY;
    case LimitingDimension::kDebt: return W::DEBT;
    case LimitingDimension::kFrozenRoute: return W::FROZEN_ROUTE;
    case LimitingDimension::kMaxSingleReservation: return W::MAX_SINGLE_RESERVATION;
    case LimitingDimension::kGenerationDraining: return W::GENERATION_DRAINING;
    case LimitingDimension::kNoBudget: return W::NO_BUDGET;
    case LimitingDimension::kLedgerUnavailable: return W::LEDGER_UNAVAILABLE;
  }
  TALLY_UNREACHABLE();
}

schema::ReplyCode enumFromCore(ReplyCode value) {
  using W = schema::ReplyCode;
  switch (value) {
    case ReplyCode::kOk: return W::OK;
    case ReplyCode::kRejected: return W::REJECTED;
    case ReplyCode::kIdempotencyConflict: return W::IDEMPOTENCY_CONFLICT;
    case ReplyCode::kOperationConflict: return W::OPERATION_CONFLICT;
    case ReplyCode::kExpired: return W::EXPIRED;
    case ReplyCode::kInvalidState: return W::INVALID_STATE;
    case ReplyCode::kNotFound: return W::NOT_FOUND;
    case ReplyCode::kInvalidArgument: return W::INVALID_ARGUMENT;
    case ReplyCode::kResourceExhausted: return W::RESOURCE_EXHAUSTED;
    case ReplyCode::kArithmeticOverflow: return W::ARITHMETIC_OVERFLOW;
    case ReplyCode::kQueued: return W::QUEUED;
  }
  TALLY_UNREACHABLE();
}

schema::GenerationState enumFromCore(GenerationState value) {
  using W = schema::GenerationState;
  switch (value) {
    case GenerationState::kActive: return W::ACTIVE;
    case GenerationState::kDraining: return W::DRAINING;
    case GenerationState::kDrained: return W::DRAINED;
  }
  TALLY_UNREACHABLE();
}

schema::RolloutMode enumFromCore(RolloutMode value) {
  using W = schema::RolloutMode;
  switch (value) {
    case RolloutMode::kOff: return W::OFF;
    case RolloutMode::kShadow: return W::SHADOW;
    case RolloutMode::kEnforce: return W::ENFORCE;
  }
  TALLY_UNREACHABLE();
}

schema::EpochPeriod enumFromCore(EpochPeriod value) {
  using W = schema::EpochPeriod;
  switch (value) {
    case EpochPeriod::kHour: return W::HOUR;
    case EpochPeriod::kDay: return W::DAY;
  }
  TALLY_UNREACHABLE();
}

schema::ErrorCode enumFromCore(ErrorCode value) {
  using W = schema::ErrorCode;
  switch (value) {
    case ErrorCode::kUnspecified: return W::UNSPECIFIED;
    case ErrorCode::kMalformedFrame: return W::MALFORMED_FRAME;
    case ErrorCode::kFrameTooLarge: return W::FRAME_TOO_LARGE;
    case ErrorCode::kUnknownMessage: return W::UNKNOWN_MESSAGE;
    case ErrorCode::kInvalidArgument: return W::INVALID_ARGUMENT;
    case ErrorCode::kUnavailable: return W::UNAVAILABLE;
    case ErrorCode::kInternal: return W::INTERNAL;
    case ErrorCode::kPermissionDenied: return W::PERMISSION_DENIED;
    case ErrorCode::kNotFound: return W::NOT_FOUND;
    case ErrorCode::kNotPrimary: return W::NOT_PRIMARY;
  }
  TALLY_UNREACHABLE();
}

schema::ShardState enumFromCore(ShardState value) {
  using W = schema::ShardState;
  switch (value) {
    case ShardState::kIssued: return W::ISSUED;
    case ShardState::kRevoked: return W::REVOKED;
    case ShardState::kReconciling: return W::RECONCILING;
    case ShardState::kReconciled: return W::RECONCILED;
    case ShardState::kConflict: return W::CONFLICT;
    case ShardState::kWrittenOff: return W::WRITTEN_OFF;
  }
  TALLY_UNREACHABLE();
}

}  // namespace tally::wire
