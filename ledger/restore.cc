#include "ledger/restore.h"

#include <algorithm>
#include <utility>

namespace tally::ledger {

Result<RestoreSummary> restoreLedger(Store* store, Ledger* ledger, uint64_t wall_now_ms) {
  Result<StoreContents> loaded = store->load();
  if (!loaded.isOk()) return loaded.status();
  StoreContents contents = std::move(loaded).value();
  RestoreSummary summary;
  for (PolicyRecord& record : contents.policies) {
    if (Status s =
            ledger->accounts().restorePolicy(std::move(record.policy), record.republished_from);
        !s.isOk()) {
      return s;
    }
    ++summary.policies;
  }
  for (const AccountRecord& record : contents.accounts) {
    if (Status s = ledger->accounts().restoreAccount(record.key, record.balances,
                                                     record.refill_clock_ms, record.refill_carry);
        !s.isOk()) {
      return s;
    }
    ++summary.accounts;
  }
  for (const Reservation& reservation : contents.reservations) {
    if (Status s = ledger->restoreReservation(reservation); !s.isOk()) return s;
    ++summary.reservations;
  }
  ShardRegistry& shards = ledger->shards();
  for (const GatewayRecord& gateway : contents.gateways) {
    if (Status s = shards.restoreGateway(gateway); !s.isOk()) return s;
    ++summary.gateways;
  }
  for (const ShardRecord& shard : contents.shards) {
    if (Status s = shards.restoreShard(shard); !s.isOk()) return s;
    ++summary.shards;
  }
  for (const FenceRecord& fence : contents.fences) {
    if (Status s = shards.restoreFence(fence); !s.isOk()) return s;
  }
  shards.restoreShardSequence(contents.shard_sequence);
  summary.ledger_clock_ms = std::max(contents.ledger_clock_ms, wall_now_ms);
  if (Status s = ledger->finishRestore(summary.ledger_clock_ms); !s.isOk()) return s;
  return summary;
}

}  // namespace tally::ledger
