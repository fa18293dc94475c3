// tally-restart-fill: writes a ledger data dir holding LIVE live (RESERVED, 7-day hold)
// reservations over ACCOUNTS accounts, plus RECEIPTS settled ones (the idempotency window's
// receipts), through the real Store, so that `bench/restart.sh` can time a tally-ledger start
// over it (issue 13: 1,000,000 live and 100,000 accounts, <= 5 s to serving). A benchmark tool,
// never a test.
//
//   tally-restart-fill DIR [LIVE=1000000] [ACCOUNTS=100000] [RECEIPTS=0]

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "core/ledger.h"
#include "core/limits.h"
#include "ledger/sqlite_store.h"
#include "ledger/store_batch.h"

namespace {

using tally::Ledger;
using tally::ReplyCode;

uint64_t wallMs() {
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                   std::chrono::system_clock::now().time_since_epoch())
                                   .count());
}

double secondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

bool commit(Ledger* ledger, tally::ledger::SqliteStore* store, uint64_t now_ms) {
  tally::LedgerChangedRows rows = ledger->takeChangedRows();
  const tally::Status status = store->commit(tally::ledger::storeBatchOf(*ledger, &rows, now_ms));
  if (!status.isOk()) std::fprintf(stderr, "commit: %s\n", status.toString().c_str());
  return status.isOk();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || argc > 5) {
    std::fprintf(stderr, "usage: tally-restart-fill DIR [LIVE] [ACCOUNTS] [RECEIPTS]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const uint64_t live = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1'000'000;
  const uint64_t accounts = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 100'000;
  const uint64_t receipts = argc > 4 ? std::strtoull(argv[4], nullptr, 10) : 0;
  if (accounts == 0) {
    std::fprintf(stderr, "ACCOUNTS must be at least 1\n");
    return 2;
  }
  const auto start = std::chrono::steady_clock::now();
  auto opened = tally::ledger::SqliteStore::open(dir);
  if (!opened.isOk()) {
    std::fprintf(stderr, "open %s: %s\n", dir.c_str(), opened.status().toString().c_str());
    return 1;
  }
  std::unique_ptr<tally::ledger::SqliteStore> store = std::move(opened).value();
  Ledger ledger;
  const uint64_t now = wallMs();
  const tally::Budget budget{.subject_pattern = "restart-*",
                             .route = "bench",
                             .unit = "units",
                             .refill_per_second = 0,
                             .burst = uint64_t{1} << 40,
                             .max_single_reservation = 1000,
                             .hold_ttl_ms = tally::limits::kHoldTtlMsMax,
                             .hard_execution_limit_ms = 600'000,
                             .max_overdraft = 0};
  if (ledger.publishPolicy(tally::Policy{.budgets = {budget}}, now).code != ReplyCode::kOk) {
    std::fprintf(stderr, "publish failed\n");
    return 1;
  }
  if (!commit(&ledger, store.get(), now)) return 1;
  constexpr uint64_t kBatch = 20'000;
  for (uint64_t n = 0; n < live + receipts; ++n) {
    tally::ReserveRequest request{.reservation_id = "restart-r" + std::to_string(n),
                                  .subject = "restart-" + std::to_string(n % accounts),
                                  .route = "bench",
                                  .units = 1 + n % 100};
    request.request_digest.fill(static_cast<uint8_t>(n));
    const tally::ReservationReply reply = ledger.reserve(request, now);
    if (reply.code != ReplyCode::kOk) {
      std::fprintf(stderr, "reserve %s: %s %s\n", request.reservation_id.c_str(),
                   tally::replyCodeName(reply.code), reply.message.c_str());
      return 1;
    }
    if (n >= live) {  // a receipt: released at once
      (void)ledger.release({.reservation_id = request.reservation_id}, now);
    }
    if ((n + 1) % kBatch == 0 && !commit(&ledger, store.get(), now)) return 1;
  }
  if (!commit(&ledger, store.get(), now)) return 1;
  const double filled_s = secondsSince(start);
  if (tally::Status status = store->checkpoint(); !status.isOk()) {
    std::fprintf(stderr, "checkpoint: %s\n", status.toString().c_str());
    return 1;
  }
  std::printf("filled %s: %llu live, %llu accounts, %llu receipts in %.1f s (+%.1f s fold)\n",
              dir.c_str(), static_cast<unsigned long long>(live),
              static_cast<unsigned long long>(accounts), static_cast<unsigned long long>(receipts),
              filled_s, secondsSince(start) - filled_s);
  return 0;
}
