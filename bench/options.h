#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"

// tally-bench's command line. parseOptions() validates every value against bench_limits.h and
// fills in defaults; it reads no environment except the process id (for the default prefix).

namespace tally::bench {

// Where the ledger (TCP) or the agent (Unix socket) listens.
struct Endpoint {
  enum class Kind : uint8_t { kTcp, kUnix };
  Kind kind = Kind::kTcp;
  std::string host;  // kTcp: IP literal or host name
  uint16_t port = 0;
  std::string path;  // kUnix

  std::string name() const;
};

// "HOST:PORT" or "[IPV6]:PORT".
Result<Endpoint> parseHostPort(std::string_view host_port);

struct BenchOptions {
  Endpoint endpoint;
  uint32_t cycles_in_flight = 64;  // -K
  uint32_t subjects = 1000;        // -S
  double duration_s = 10.0;        // -d
  double warmup_s = 2.0;           // -w
  uint32_t connections = 1;        // -c
  std::string prefix;              // --prefix; default "bench-<pid>"
  bool publish = true;             // --no-publish clears it
  uint64_t seed = 42;              // --seed
  uint32_t sample_queries = 100;   // --sample
  std::string label;               // --label; default "tally-S<S>-K<K>" or "tally-S<S>-R<rate>"
  double arrival_rate_per_s = 0;   // --rate: > 0 is an open loop
};

struct ParsedOptions {
  BenchOptions options;
  bool help = false;  // --help: print usage() and exit 0
};

// kInvalidArgument naming the flag for anything unknown, missing or out of range.
Result<ParsedOptions> parseOptions(int argc, char** argv);

const char* usage();

}  // namespace tally::bench
