// tally-bench: closed-loop reserve -> start -> settle load on tally-ledger (or tally-agent),
// measured and reported as the peers' driver in ../shared/peers/driver/ does. See README.md.

#include <signal.h>
#include <uv.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <vector>

#include "bench/bench_limits.h"
#include "bench/connection.h"
#include "bench/cycle_loop.h"
#include "bench/loop.h"
#include "bench/options.h"
#include "bench/report.h"
#include "bench/rpc.h"
#include "bench/setup.h"
#include "bench/verify.h"

namespace tally::bench {
namespace {

constexpr int kExitPass = 0;
constexpr int kExitFail = 1;
constexpr int kExitUsage = 2;
constexpr int kExitSetup = 3;

// Listens while connecting and between phases: nothing is in flight then.
class IdleListener : public ConnectionListener {
 public:
  void onResponse(Connection*, uint64_t, const wire::Response&) override {}
  void onFailed(Connection*, const Status&, const std::vector<uint64_t>&) override {}
};

// Every libuv handle of the run. shutdown() closes them all and lets their close callbacks run,
// so they may be destroyed after it.
struct Handles {
  explicit Handles(uv_loop_t* loop) : deadline(loop), warmup(loop), end(loop), pacer(loop) {}

  Status init() {
    for (Timer* timer : {&deadline, &warmup, &end, &pacer}) {
      if (Status s = timer->init(); !s.isOk()) return s;
    }
    return Status::ok();
  }

  void shutdown(uv_loop_t* loop) {
    for (auto& connection : connections) connection->close();
    warmup.close();
    end.close();
    pacer.close();
    auto all_closed = [this] {
      for (auto& connection : connections) {
        if (!connection->closed()) return false;
      }
      return warmup.closed() && end.closed() && pacer.closed();
    };
    if (!deadline.closed()) {
      if (!runUntil(loop, &deadline, limits::kCloseTimeoutMs, all_closed)) {
        std::fprintf(stderr, "tally-bench: handles still open after %llu ms\n",
                     static_cast<unsigned long long>(limits::kCloseTimeoutMs));
      }
      deadline.close();
    }
    // Runs the remaining close callbacks; returns once no handle is active.
    (void)uv_run(loop, UV_RUN_DEFAULT);
  }

  Timer deadline;
  Timer warmup;
  Timer end;
  Timer pacer;
  IdleListener idle;
  std::vector<std::unique_ptr<Connection>> connections;
};

Status connectAll(uv_loop_t* loop, const BenchOptions& options, Handles* handles) {
  for (uint32_t i = 0; i < options.connections; ++i) {
    handles->connections.push_back(std::make_unique<Connection>(loop, &handles->idle, i));
    if (Status s = handles->connections.back()->connect(options.endpoint); !s.isOk()) return s;
  }
  auto settled = [handles] {
    for (auto& connection : handles->connections) {
      if (connection->failed()) return true;
      if (!connection->connected()) return false;
    }
    return true;
  };
  const bool done = runUntil(loop, &handles->deadline, limits::kConnectTimeoutMs, settled);
  for (auto& connection : handles->connections) {
    if (connection->failed()) {
      return Status::unavailable(options.endpoint.name() + ": " + connection->failure().toString());
    }
  }
  if (!done) {
    return Status::unavailable(options.endpoint.name() + ": not connected within " +
                               std::to_string(limits::kConnectTimeoutMs) + " ms");
  }
  return Status::ok();
}

int runPhases(uv_loop_t* loop, const BenchOptions& options, Handles* handles) {
  if (Status s = connectAll(loop, options, handles); !s.isOk()) {
    std::fprintf(stderr, "tally-bench: connect: %s\n", s.toString().c_str());
    return kExitSetup;
  }
  Rpc rpc(loop, handles->connections.front().get(), &handles->deadline);
  Result<SetupOutcome> setup = setUp(&rpc, options);
  if (!setup.isOk()) {
    std::fprintf(stderr, "tally-bench: setup: %s\n", setup.status().toString().c_str());
    return kExitSetup;
  }
  Result<BenchAudit> baseline = auditBench(&rpc, options.prefix, options.subjects);
  if (!baseline.isOk()) {
    std::fprintf(stderr, "tally-bench: baseline audit: %s\n", baseline.status().toString().c_str());
    return kExitSetup;
  }
  std::fprintf(
      stderr, "tally-bench: %s: K=%u S=%u c=%u, warm-up %gs, measuring %gs, %s\n",
      options.endpoint.name().c_str(), options.cycles_in_flight, options.subjects,
      options.connections, options.warmup_s, options.duration_s,
      options.arrival_rate_per_s > 0
          ? ("open loop at " + std::to_string(options.arrival_rate_per_s) + " cycles/s").c_str()
          : "closed loop");

  std::vector<Connection*> connections;
  for (auto& connection : handles->connections) connections.push_back(connection.get());
  CycleLoop cycle_loop(
      loop, connections,
      {.warmup = &handles->warmup,
       .end = &handles->end,
       .deadline = &handles->deadline,
       .pacer = &handles->pacer},
      CycleLoopOptions{
          .cycles_in_flight = options.cycles_in_flight,
          .subjects = options.subjects,
          .seed = options.seed,
          .prefix = options.prefix,
          .warmup_ms = static_cast<uint64_t>(std::llround(options.warmup_s * 1000)),
          .duration_ms = static_cast<uint64_t>(std::llround(options.duration_s * 1000)),
          .drain_timeout_ms = limits::kDrainTimeoutMs,
          .arrival_rate_per_s = options.arrival_rate_per_s,
      });
  const Status ran = cycle_loop.run();
  for (Connection* connection : connections) connection->setListener(&handles->idle);
  if (!ran.isOk()) {
    std::fprintf(stderr, "tally-bench: run: %s\n", ran.toString().c_str());
    return kExitSetup;
  }

  CycleLoopResult& result = cycle_loop.result();
  VerifyReport verify;
  if (handles->connections.front()->failed()) {
    verify.failures.push_back("cannot verify: the connection failed");
  } else {
    verify = verifyRun(
        &rpc, VerifyInput{
                  .prefix = options.prefix,
                  .subjects = options.subjects,
                  .seed = options.seed,
                  .cycles_created = result.cycles_created,
                  .sample_queries = options.sample_queries,
                  .baseline_consumed = baseline.value().consumedPerSubject(options.subjects),
                  .settled_actual = result.settled_actual,
              });
  }
  const bool pass = printReport(options, setup.value(), &result, verify);
  return pass ? kExitPass : kExitFail;
}

int run(const BenchOptions& options) {
  uv_loop_t loop;
  if (int rc = uv_loop_init(&loop); rc != 0) {
    std::fprintf(stderr, "tally-bench: uv_loop_init: %s\n", uv_strerror(rc));
    return kExitSetup;
  }
  int code = kExitSetup;
  {
    Handles handles(&loop);
    if (Status s = handles.init(); !s.isOk()) {
      std::fprintf(stderr, "tally-bench: %s\n", s.toString().c_str());
    } else {
      code = runPhases(&loop, options, &handles);
    }
    handles.shutdown(&loop);
  }
  if (int rc = uv_loop_close(&loop); rc != 0) {
    std::fprintf(stderr, "tally-bench: uv_loop_close: %s\n", uv_strerror(rc));
    if (code == kExitPass) code = kExitFail;
  }
  return code;
}

}  // namespace
}  // namespace tally::bench

int main(int argc, char** argv) {
  using namespace tally::bench;
  ::signal(SIGPIPE, SIG_IGN);
  tally::Result<ParsedOptions> parsed = parseOptions(argc, argv);
  if (!parsed.isOk()) {
    std::fprintf(stderr, "tally-bench: %s (see tally-bench --help)\n",
                 parsed.status().message().c_str());
    return kExitUsage;
  }
  if (parsed.value().help) {
    std::fputs(usage(), stdout);
    return kExitPass;
  }
  return run(parsed.value().options);
}
