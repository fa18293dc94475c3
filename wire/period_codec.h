#pragma once

#include "core/period_close.h"
#include "core/status.h"
#include "schemas/protocol.capnp.h"

// Cap'n Proto <-> core for the accounting-period records (core/period_close.h): the audit's
// `periodSnapshots` / `closedPeriods` and the store's period snapshot rows, which share
// PeriodSnapshotV1. Readers validate like every wire reader (over-long text, unknown enumerant,
// a balance above limits::kBalanceUnitsMax, epochFirst > epochLast: kInvalidArgument) and may
// throw kj::Exception on malformed bytes: callers catch it (wire::toCore, the store's decoder).

namespace tally::wire {

void fromCore(const Balances& balances, schema::BalancesV1::Builder builder);
void fromCore(const PeriodSnapshot& snapshot, schema::PeriodSnapshotV1::Builder builder);
void fromCore(const PeriodSpan& span, schema::ClosedPeriodV1::Builder builder);

Status readBalances(schema::BalancesV1::Reader reader, Balances* out);
Status readPeriodSnapshot(schema::PeriodSnapshotV1::Reader reader, PeriodSnapshot* out);
Status readClosedPeriod(schema::ClosedPeriodV1::Reader reader, PeriodSpan* out);

}  // namespace tally::wire
