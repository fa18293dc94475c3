#include "bench/report.h"

#include <cinttypes>
#include <cstdio>

namespace tally::bench {

bool printReport(const BenchOptions& o, const SetupOutcome& setup, CycleLoopResult* result,
                 const VerifyReport& verify) {
  const double cps = result->measured_s > 0
                         ? static_cast<double>(result->cycles_measured) / result->measured_s
                         : 0;
  std::printf(
      "== %s  backend=tally endpoint=%s server=%s K=%u S=%u conns=%u duration=%.1fs "
      "warmup=%.1fs units=1..%" PRIu64 " burst=%" PRIu64 " rate=%" PRIu64
      "/s prefix=%s seed=%" PRIu64 "\n",
      o.label.c_str(), o.endpoint.name().c_str(), setup.server_version.c_str(), o.cycles_in_flight,
      o.subjects, o.connections, o.duration_s, o.warmup_s, kUnitsMax, kBenchBurst,
      kBenchRefillPerSecond, o.prefix.c_str(), o.seed);
  if (!setup.published) {
    std::printf("policy: active generation %" PRIu64 " used as it is (--no-publish)\n",
                setup.generation);
  } else {
    std::printf("policy: published generation %" PRIu64
                " (%zu other budgets kept, %zu earlier "
                "bench budgets dropped)\n",
                setup.generation, setup.budgets_kept, setup.budgets_dropped);
  }
  const bool open_loop = o.arrival_rate_per_s > 0;
  if (open_loop) {
    std::printf("open loop: %.1f cycles/s offered, %" PRIu64
                " cycles due in the window, at most %u in flight; most due cycles waiting "
                "for a free slot at once: %" PRIu64 "\n",
                o.arrival_rate_per_s, result->cycles_due_in_window, o.cycles_in_flight,
                result->due_waiting_max);
  }
  std::printf("cycles in window: %" PRIu64 " in %.3f s  ->  %.1f cycles/s  (%.1f ops/s)\n",
              result->cycles_measured, result->measured_s, cps, 3 * cps);
  std::printf("%-8s %10s %10s %10s %10s %10s\n", "op", "count", "p50_us", "p99_us", "p99.9_us",
              "mean_us");
  LatencySummary summary[kSeriesCount];
  for (int i = 0; i < kSeriesCount; ++i) {
    summary[i] = result->latency[i].summarize();
    std::printf("%-8s %10" PRIu64 " %10.1f %10.1f %10.1f %10.1f\n", seriesName(i), summary[i].count,
                summary[i].p50_us, summary[i].p99_us, summary[i].p999_us, summary[i].mean_us);
    if (result->latency[i].dropped() > 0) {
      std::printf("  (%s: %" PRIu64 " samples beyond the cap were not kept)\n", seriesName(i),
                  result->latency[i].dropped());
    }
  }
  const double driver_cpu = result->measured_s > 0 ? result->driver_cpu_s / result->measured_s : 0;
  std::printf("driver cpu: %.2f cores during the window\n", driver_cpu);
  const uint64_t errors = result->errorCount();
  std::printf("errors: %" PRIu64, errors);
  for (const auto& [key, count] : result->errors) std::printf("  %s=%" PRIu64, key.c_str(), count);
  std::printf("\n");
  for (const std::string& detail : result->error_details) std::printf("  %s\n", detail.c_str());

  std::printf("verify: %" PRIu64 " reservations created, %" PRIu64 " cycles settled\n",
              result->cycles_created, result->cycles_settled);
  for (const std::string& note : verify.notes) std::printf("  %s\n", note.c_str());
  size_t failures = verify.failures.size();
  if (errors > 0) {
    ++failures;
    std::printf("  FAIL  %" PRIu64 " operations did not return the expected reply\n", errors);
  }
  for (const std::string& failure : verify.failures) std::printf("  FAIL  %s\n", failure.c_str());
  const char* verdict = failures == 0 ? "PASS" : "FAIL";
  std::printf("VERIFY: %s (%zu failure%s)\n", verdict, failures, failures == 1 ? "" : "s");
  // The peers' keys first, in their order; tally's extras after.
  std::printf(
      "RESULT label=%s backend=tally S=%u K=%u conns=%u cps=%.1f reserve_p50=%.1f "
      "reserve_p99=%.1f start_p50=%.1f start_p99=%.1f settle_p50=%.1f settle_p99=%.1f "
      "cycle_p50=%.1f cycle_p99=%.1f errors=%" PRIu64
      " verify=%s d=%g w=%g transport=%s "
      "driver_cpu=%.2f loop=%s offered_cps=%.1f due_waiting_max=%" PRIu64
      " reserve_p999=%.1f cycle_p999=%.1f\n",
      o.label.c_str(), o.subjects, o.cycles_in_flight, o.connections, cps, summary[0].p50_us,
      summary[0].p99_us, summary[1].p50_us, summary[1].p99_us, summary[2].p50_us, summary[2].p99_us,
      summary[3].p50_us, summary[3].p99_us, errors, verdict, o.duration_s, o.warmup_s,
      o.endpoint.kind == Endpoint::Kind::kTcp ? "tcp" : "unix", driver_cpu,
      open_loop ? "open" : "closed", o.arrival_rate_per_s, result->due_waiting_max,
      summary[0].p999_us, summary[3].p999_us);
  std::fflush(stdout);
  return failures == 0;
}

}  // namespace tally::bench
