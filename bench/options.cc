#include "bench/options.h"

#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdlib>

#include "bench/bench_limits.h"

namespace tally::bench {
namespace {

constexpr const char* kUsage =
    "usage: tally-bench (--ledger HOST:PORT | --agent SOCKET) [-K 64] [-S 1000] [-d 10] [-w 2]\n"
    "                   [-c CONNECTIONS] [--prefix NAME] [--no-publish] [--seed N]\n"
    "                   [--sample N] [--label TEXT] [--rate CYCLES_PER_S]\n"
    "\n"
    "Closed-loop load on the tally ledger (or agent): K reserve -> start -> settle cycles always\n"
    "in flight over C pipelined connections, S subjects, d seconds measured after w seconds of\n"
    "warm-up. Then it drains, audits conservation and queries a sample of reservations, and\n"
    "prints a RESULT line in the format of ../shared/peers/driver (summarize.sh reads it).\n"
    "With --rate, an open loop instead: a new cycle is due every 1/rate seconds whatever the\n"
    "replies do, and the latencies of the cycles due in the window are measured from the time\n"
    "each was due (no coordinated omission).\n"
    "\n"
    "  --ledger HOST:PORT   the ledger's TCP address\n"
    "  --agent SOCKET       an agent's Unix socket (same protocol)\n"
    "  -K N                 cycles in flight (default 64)\n"
    "  -S N                 subjects <prefix>-0 .. <prefix>-(N-1) (default 1000; 1 = hot)\n"
    "  -d SEC               measured seconds (default 10)\n"
    "  -w SEC               warm-up seconds (default 2)\n"
    "  -c N                 connections the K cycles are spread over (default 1)\n"
    "  --prefix NAME        subject and reservation id prefix (default bench-<pid>)\n"
    "  --no-publish         use the active policy as it is (it must cover <prefix>-*, route\n"
    "                       bench); default: publish the active policy plus the bench budget\n"
    "  --seed N             workload PRNG seed (default 42, as the peers' driver)\n"
    "  --sample N           reservations checked with a query after the run (default 100)\n"
    "  --label TEXT         label of the RESULT line (default tally-S<S>-K<K>, or\n"
    "                       tally-S<S>-R<rate> with --rate)\n"
    "  --rate N             open loop: N cycles/s offered (1..10000000); -K is then the most\n"
    "                       cycles in flight (default 4096): a due cycle that finds K in flight\n"
    "                       waits, and the wait counts in its latency\n"
    "\n"
    "Exit: 0 verify PASS and no errors, 1 verify FAIL or errors, 2 usage, 3 setup failed.\n";

Status badValue(std::string_view flag, std::string_view why) {
  return Status::invalidArgument(std::string(flag) + ": " + std::string(why));
}

template <typename T>
Status parseUnsigned(std::string_view flag, std::string_view text, T min, T max, T* out) {
  T value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) {
    return badValue(flag, "'" + std::string(text) + "' is not a whole number");
  }
  if (value < min || value > max) {
    return badValue(flag, "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  *out = value;
  return Status::ok();
}

Status parseSeconds(std::string_view flag, const std::string& text, double min, double* out) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value)) {
    return badValue(flag, "'" + text + "' is not a number of seconds");
  }
  if (value < min || value > limits::kDurationSecondsMax) {
    return badValue(flag, "must be in [" + std::to_string(min) + ", " +
                              std::to_string(limits::kDurationSecondsMax) + "] seconds");
  }
  *out = value;
  return Status::ok();
}

Status parseRate(std::string_view flag, const std::string& text, double* out) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value)) {
    return badValue(flag, "'" + text + "' is not a number of cycles per second");
  }
  if (value < 1 || value > limits::kArrivalRatePerSecondMax) {
    return badValue(flag, "must be in [1, " +
                              std::to_string(std::llround(limits::kArrivalRatePerSecondMax)) +
                              "] cycles/s");
  }
  *out = value;
  return Status::ok();
}

Status validate(const BenchOptions& o, bool have_endpoint) {
  if (!have_endpoint) return Status::invalidArgument("one of --ledger or --agent is required");
  if (o.connections > o.cycles_in_flight) {
    return badValue("-c", "more connections than cycles in flight (-K)");
  }
  // Each cycle has one request in flight at a time.
  const uint64_t per_connection = (o.cycles_in_flight + o.connections - 1) / o.connections;
  if (per_connection > limits::kRequestsInFlightPerConnectionMax) {
    return badValue("-K", "more than " + std::to_string(limits::kRequestsInFlightPerConnectionMax) +
                              " cycles per connection; raise -c");
  }
  if (o.prefix.empty() || o.prefix.size() > limits::kPrefixBytesMax ||
      o.prefix.find('*') != std::string::npos) {
    return badValue("--prefix",
                    "1.." + std::to_string(limits::kPrefixBytesMax) + " bytes without '*'");
  }
  return Status::ok();
}

}  // namespace

std::string Endpoint::name() const {
  if (kind == Kind::kUnix) return "unix:" + path;
  const bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

Result<Endpoint> parseHostPort(std::string_view host_port) {
  const size_t colon = host_port.rfind(':');
  if (colon == std::string_view::npos || colon == 0) {
    return Status::invalidArgument("'" + std::string(host_port) + "' is not HOST:PORT");
  }
  std::string_view host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  Endpoint endpoint{.kind = Endpoint::Kind::kTcp, .host = std::string(host)};
  if (endpoint.host.empty()) {
    return Status::invalidArgument("'" + std::string(host_port) + "' has no host");
  }
  if (Status s =
          parseUnsigned<uint16_t>("port", host_port.substr(colon + 1), 1, 65535, &endpoint.port);
      !s.isOk()) {
    return s;
  }
  return endpoint;
}

Result<ParsedOptions> parseOptions(int argc, char** argv) {
  ParsedOptions parsed;
  BenchOptions& o = parsed.options;
  bool have_endpoint = false;
  bool cycles_in_flight_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      parsed.help = true;
      return parsed;
    }
    if (flag == "--no-publish") {
      o.publish = false;
      continue;
    }
    if (i + 1 >= argc) return badValue(flag, "needs a value (see --help)");
    const std::string value = argv[++i];
    Status s = Status::ok();
    if (flag == "--ledger" || flag == "--agent") {
      if (have_endpoint) return badValue(flag, "give exactly one of --ledger and --agent");
      have_endpoint = true;
      if (flag == "--ledger") {
        Result<Endpoint> endpoint = parseHostPort(value);
        if (!endpoint.isOk()) return badValue(flag, endpoint.status().message());
        o.endpoint = std::move(endpoint).value();
      } else if (value.empty() || value.size() > 107) {
        return badValue(flag, "a Unix socket path of 1..107 bytes");
      } else {
        o.endpoint = Endpoint{.kind = Endpoint::Kind::kUnix, .path = value};
      }
    } else if (flag == "-K") {
      cycles_in_flight_given = true;
      s = parseUnsigned<uint32_t>(flag, value, 1, limits::kCyclesInFlightMax, &o.cycles_in_flight);
    } else if (flag == "-S") {
      s = parseUnsigned<uint32_t>(flag, value, 1, limits::kSubjectsMax, &o.subjects);
    } else if (flag == "-c") {
      s = parseUnsigned<uint32_t>(flag, value, 1, limits::kConnectionsMax, &o.connections);
    } else if (flag == "-d") {
      s = parseSeconds(flag, value, 0.001, &o.duration_s);
    } else if (flag == "-w") {
      s = parseSeconds(flag, value, 0.0, &o.warmup_s);
    } else if (flag == "--prefix") {
      o.prefix = value;
    } else if (flag == "--seed") {
      s = parseUnsigned<uint64_t>(flag, value, 0, UINT64_MAX, &o.seed);
    } else if (flag == "--sample") {
      s = parseUnsigned<uint32_t>(flag, value, 0, limits::kSampleQueriesMax, &o.sample_queries);
    } else if (flag == "--label") {
      o.label = value;
    } else if (flag == "--rate") {
      s = parseRate(flag, value, &o.arrival_rate_per_s);
    } else {
      return Status::invalidArgument("unknown option '" + flag + "' (see --help)");
    }
    if (!s.isOk()) return s;
  }
  if (o.prefix.empty()) o.prefix = "bench-" + std::to_string(::getpid());
  const bool open_loop = o.arrival_rate_per_s > 0;
  if (open_loop && !cycles_in_flight_given) {
    o.cycles_in_flight = limits::kOpenLoopCyclesInFlightDefault;
  }
  if (o.label.empty()) {
    o.label = "tally-S" + std::to_string(o.subjects) +
              (open_loop ? "-R" + std::to_string(std::llround(o.arrival_rate_per_s))
                         : "-K" + std::to_string(o.cycles_in_flight));
  }
  if (Status s = validate(o, have_endpoint); !s.isOk()) return s;
  return parsed;
}

const char* usage() { return kUsage; }

}  // namespace tally::bench
