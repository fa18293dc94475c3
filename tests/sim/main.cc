// tally-sim: the release gate (issue 10, docs/SIMULATION.md).
//
//   tally-sim --interleavings N [--seed S] [--jobs J] [--json]
//   tally-sim --replay SEED
//
// Exit 0 when every count is 0 and the UNKNOWN convergence p99 is within 10 minutes of
// simulated time; 1 when the gate fails; 2 on a usage error.

#include <charconv>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <string_view>

#include "tests/sim/batch.h"
#include "tests/sim/runner.h"

namespace {

constexpr const char* kUsage =
    "usage: tally-sim --interleavings N [--seed S] [--jobs J] [--json]\n"
    "       tally-sim --replay SEED\n";

bool parseNumber(std::string_view text, uint64_t* out) {
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(text.data(), end, *out);
  return ec == std::errc() && ptr == end && !text.empty();
}

int usage(const std::string& error) {
  std::fprintf(stderr, "tally-sim: %s\n%s", error.c_str(), kUsage);
  return 2;
}

int replay(uint64_t seed) {
  tally::sim::RunResult result = tally::sim::runOne({.seed = seed, .trace = true});
  for (const std::string& line : result.trace) std::printf("%s\n", line.c_str());
  if (result.ok()) {
    std::printf("seed %llu: %llu steps, every check passed\n",
                static_cast<unsigned long long>(seed),
                static_cast<unsigned long long>(result.steps));
    return 0;
  }
  const tally::sim::Finding& first = result.findings.front();
  std::printf("seed %llu: FIRST FAILED CHECK at step %llu: %s: %s\n",
              static_cast<unsigned long long>(seed), static_cast<unsigned long long>(result.steps),
              tally::sim::checkName(first.check), first.detail.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t interleavings = 0;
  uint64_t seed = 1;
  uint64_t jobs = 1;
  bool json = false;
  bool have_interleavings = false;
  std::optional<uint64_t> replay_seed;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    auto value = [&](uint64_t* out) {
      if (i + 1 >= argc || !parseNumber(argv[i + 1], out)) return false;
      ++i;
      return true;
    };
    if (arg == "--json") {
      json = true;
    } else if (arg == "--interleavings") {
      if (!value(&interleavings)) return usage("--interleavings needs a number");
      have_interleavings = true;
    } else if (arg == "--seed") {
      if (!value(&seed)) return usage("--seed needs a number");
    } else if (arg == "--jobs") {
      if (!value(&jobs) || jobs == 0 || jobs > 256) return usage("--jobs needs 1..256");
    } else if (arg == "--replay") {
      uint64_t s = 0;
      if (!value(&s)) return usage("--replay needs a seed");
      replay_seed = s;
    } else if (arg == "--help" || arg == "-h") {
      std::printf("%s", kUsage);
      return 0;
    } else {
      return usage("unknown argument " + std::string(arg));
    }
  }
  if (replay_seed.has_value()) {
    if (have_interleavings) return usage("--replay runs one seed; drop --interleavings");
    return replay(*replay_seed);
  }
  if (!have_interleavings) return usage("--interleavings or --replay is required");

  const auto started = std::chrono::steady_clock::now();
  const tally::sim::GateSummary summary =
      tally::sim::runSeeds(seed, interleavings, static_cast<unsigned>(jobs));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  if (json) {
    std::printf("%s\n", summary.json().c_str());
  } else {
    std::printf("%s", summary.text().c_str());
    std::printf("seeds %llu..%llu, %.1f s, %.0f interleavings/s\n",
                static_cast<unsigned long long>(seed),
                static_cast<unsigned long long>(seed + interleavings - 1), seconds,
                seconds > 0 ? static_cast<double>(interleavings) / seconds : 0.0);
  }
  // Wall time on stderr in both modes, so that a --json consumer can still read the rate.
  if (json) {
    std::fprintf(stderr, "tally-sim: %llu interleavings in %.1f s\n",
                 static_cast<unsigned long long>(interleavings), seconds);
    for (const tally::sim::FailedRun& run : summary.failedRuns()) {
      std::fprintf(stderr, "FAILED seed %llu: %s\n  replay: tally-sim --replay %llu\n",
                   static_cast<unsigned long long>(run.seed),
                   tally::sim::checkName(run.first.check),
                   static_cast<unsigned long long>(run.seed));
    }
  }
  return summary.passes() ? 0 : 1;
}
