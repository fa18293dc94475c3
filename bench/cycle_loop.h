#pragma once

#include <uv.h>

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench/connection.h"
#include "bench/latency.h"
#include "bench/loop.h"
#include "bench/workload.h"
#include "core/status.h"

// The timed phase. A cycle is reserve -> start -> settle, each request sent when the previous
// reply arrived. Two shapes:
//  * closed loop (arrival_rate_per_s == 0), as the peers' driver
//    (../shared/peers/driver/ledger_driver.cc): K cycles always in flight, a finished cycle
//    starts a new one. After the warm-up, the cycles that complete inside the measured window
//    are counted and every reply inside it records its send -> reply latency (and a finished
//    cycle its whole duration). When the window closes no new cycle starts.
//  * open loop (arrival_rate_per_s > 0): cycle n is due at start + n / rate, whatever the
//    replies do; at most K are in flight, and a due cycle that finds no free slot waits for one
//    (the wait is counted in its latency). The measured cycles are those *due* inside the
//    window: each is run to completion, and its reserve and cycle latencies are measured from
//    the time it was due, not the time it could be sent, so a slow server cannot hide its
//    queueing by slowing the load (no coordinated omission). start and settle are sent on the
//    previous reply, so theirs are send -> reply.
// Either way the cycles in flight when the window closes finish within a bounded drain.

namespace tally::bench {

enum Stage : uint8_t { kReserveStage = 0, kStartStage = 1, kSettleStage = 2, kCycleSeries = 3 };
inline constexpr int kSeriesCount = 4;
const char* seriesName(int series);

struct CycleLoopOptions {
  uint32_t cycles_in_flight = 64;
  uint32_t subjects = 1000;
  uint64_t seed = 42;
  std::string prefix;
  uint64_t warmup_ms = 2000;
  uint64_t duration_ms = 10000;
  uint64_t drain_timeout_ms = 30000;
  double arrival_rate_per_s = 0;  // > 0: open loop at this rate; cycles_in_flight caps it
};

struct CycleLoopResult {
  uint64_t cycles_measured = 0;  // completed inside the window
  double measured_s = 0;
  std::array<LatencySeries, kSeriesCount> latency;
  std::map<std::string, uint64_t> errors;  // "<op>:<what>" -> count
  std::vector<std::string> error_details;  // the first few, for humans
  std::vector<Units> settled_actual;       // per subject: sum of `actual` settled OK
  uint64_t cycles_created = 0;
  uint64_t cycles_settled = 0;
  double driver_cpu_s = 0;  // this process's user+system CPU inside the window
  // Open loop: the most cycles that were due and waiting for a free slot at one time (0: the
  // cap never held the load back), and the cycles due inside the window.
  uint64_t due_waiting_max = 0;
  uint64_t cycles_due_in_window = 0;

  uint64_t errorCount() const;
};

// CycleLoop borrows the loop, the connections (cycle i uses connection i % C), the warm-up and
// end timers and the deadline timer (all initialized and idle); they must outlive it. It is
// every connection's listener while run() runs.
class CycleLoop : public ConnectionListener {
 public:
  struct Timers {
    Timer* warmup;
    Timer* end;
    Timer* deadline;
    Timer* pacer;  // open loop only (may be null for a closed loop)
  };

  CycleLoop(uv_loop_t* loop, std::vector<Connection*> connections, Timers timers,
            CycleLoopOptions options);
  CycleLoop(const CycleLoop&) = delete;
  CycleLoop& operator=(const CycleLoop&) = delete;

  // Runs warm-up, window and drain. The result holds every error; the Status is for failures
  // to drive the loop at all.
  [[nodiscard]] Status run();
  CycleLoopResult& result() { return result_; }

  void onResponse(Connection* connection, uint64_t tag, const wire::Response& response) override;
  void onFailed(Connection* connection, const Status& status,
                const std::vector<uint64_t>& lost_tags) override;

 private:
  struct Cycle {
    CycleParams params;
    Stage stage = kReserveStage;
    uint64_t op_sent_ns = 0;
    uint64_t cycle_start_ns = 0;
    Connection* connection = nullptr;
    bool due_in_window = false;  // open loop: measured
    std::string id;
    std::string operation;
  };

  void beginCycle(uint64_t slot, uint64_t now_ns);
  void sendStage(uint64_t slot, uint64_t now_ns);
  // Empty if the reply is what `stage` expects; else the error key suffix and a detail line.
  std::string checkReply(const Cycle& cycle, const wire::Response& response,
                         std::string* detail) const;
  void recordError(const std::string& key, const std::string& detail);
  // The cycle in `slot` is over (settled or failed): start the next one, or wind down.
  void endCycle(uint64_t slot, uint64_t now_ns);
  void openWindow();
  void closeWindow();
  bool openLoop() const { return options_.arrival_rate_per_s > 0; }
  bool measured(const Cycle& cycle) const;
  // Open loop: when cycle number `n` is due, and starting every due cycle a free slot takes.
  uint64_t dueNs(uint64_t n) const;
  void startDueCycles(uint64_t now_ns);
  bool arrivalsOver() const;
  Status armPacer();

  uv_loop_t* loop_;
  std::vector<Connection*> connections_;
  Timers timers_;
  CycleLoopOptions options_;
  Workload workload_;
  std::vector<std::string> subject_names_;
  std::vector<Cycle> cycles_;
  uint64_t in_flight_ = 0;
  bool measuring_ = false;
  bool stopping_ = false;
  uint64_t window_start_ns_ = 0;
  uint64_t window_end_ns_ = 0;
  double cpu_at_window_start_s_ = 0;
  uint64_t run_start_ns_ = 0;
  uint64_t cycles_begun_ = 0;
  std::vector<uint64_t> free_slots_;  // open loop
  CycleLoopResult result_;
};

}  // namespace tally::bench
