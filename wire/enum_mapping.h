#pragma once

#include <optional>

#include "core/ledger_types.h"
#include "core/policy.h"
#include "core/reservation.h"
#include "core/shard_types.h"
#include "core/types.h"
#include "schemas/admission_budget.capnp.h"
#include "schemas/limit_reservation.capnp.h"
#include "schemas/protocol.capnp.h"
#include "wire/codec.h"

// One mapping per enum between the schema and the core type. The switches have no `default`, so
// -Wswitch (an error under -Werror) flags an enumerant added on either side without its
// counterpart. enumToCore() returns nullopt for a raw value beyond the schema (a newer peer or
// garbage); enumFromCore() is total.

namespace tally::wire {

std::optional<ReservationState> enumToCore(schema::ReservationState value);
std::optional<LimitingDimension> enumToCore(schema::LimitingDimension value);
std::optional<ReplyCode> enumToCore(schema::ReplyCode value);
std::optional<GenerationState> enumToCore(schema::GenerationState value);
std::optional<RolloutMode> enumToCore(schema::RolloutMode value);
std::optional<EpochPeriod> enumToCore(schema::EpochPeriod value);
std::optional<ErrorCode> enumToCore(schema::ErrorCode value);
std::optional<ShardState> enumToCore(schema::ShardState value);

schema::ReservationState enumFromCore(ReservationState value);
schema::LimitingDimension enumFromCore(LimitingDimension value);
schema::ReplyCode enumFromCore(ReplyCode value);
schema::GenerationState enumFromCore(GenerationState value);
schema::RolloutMode enumFromCore(RolloutMode value);
schema::EpochPeriod enumFromCore(EpochPeriod value);
schema::ErrorCode enumFromCore(ErrorCode value);
schema::ShardState enumFromCore(ShardState value);

}  // namespace tally::wire
