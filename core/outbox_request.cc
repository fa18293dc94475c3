#include "core/outbox_request.h"

#include "core/assert.h"

namespace tally {

LedgerRequest outboxRequest(const OutboxEntry& entry) {
  switch (entry.kind) {
    case OutboxKind::kSettle:
      return SettleRequest{.reservation_id = entry.reservation_id,
                           .operation_id = entry.operation_id,
                           .actual_units = entry.actual_units};
    case OutboxKind::kRelease: return ReleaseRequest{.reservation_id = entry.reservation_id};
    case OutboxKind::kMarkUnknown:
      return MarkUnknownRequest{.reservation_id = entry.reservation_id,
                                .operation_id = entry.operation_id};
    case OutboxKind::kReportOperation:
      return ReportOperationRequest{.reservation_id = entry.reservation_id,
                                    .operation_id = entry.operation_id,
                                    .actual_units = entry.actual_units};
  }
  TALLY_UNREACHABLE();
}

}  // namespace tally
