#include "core/types.h"

namespace tally {

const char* limitingDimensionName(LimitingDimension dimension) {
  switch (dimension) {
    case LimitingDimension::kNone: return "none";
    case LimitingDimension::kCapacity: return "capacity";
    case LimitingDimension::kDebt: return "debt";
    case LimitingDimension::kFrozenRoute: return "frozen-route";
    case LimitingDimension::kMaxSingleReservation: return "max-single-reservation";
    case LimitingDimension::kGenerationDraining: return "generation-draining";
    case LimitingDimension::kNoBudget: return "no-budget";
    case LimitingDimension::kLedgerUnavailable: return "ledger-unavailable";
  }
  return "unknown";
}

}  // namespace tally
