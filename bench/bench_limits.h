#pragma once

#include <cstdint>

// Every bound tally-bench keeps, in one place. Command-line values are checked against these.

namespace tally::bench::limits {

inline constexpr uint32_t kCyclesInFlightMax = 65'536;          // -K
inline constexpr uint32_t kSubjectsMax = 1'000'000;             // -S
inline constexpr uint32_t kConnectionsMax = 1'024;              // -c
inline constexpr uint32_t kSampleQueriesMax = 100'000;          // --sample
inline constexpr double kDurationSecondsMax = 24.0 * 3600.0;    // -d, -w
inline constexpr uint64_t kPrefixBytesMax = 64;                 // ids stay far below 128 bytes
inline constexpr double kArrivalRatePerSecondMax = 10'000'000;  // --rate
// -K with --rate when -K is not given: far above what a ~2 ms cycle at 100k cycles/s needs.
inline constexpr uint32_t kOpenLoopCyclesInFlightDefault = 4'096;

// Latency samples kept per series (reserve, start, settle, cycle): 16 Mi samples of 8 bytes.
// A run that produces more keeps the first ones and says so.
inline constexpr uint64_t kLatencySamplesMax = uint64_t{1} << 24;

// Requests one connection may have in flight; the ledger stops reading a client above
// core/limits.h kRequestsInFlightPerConnectionMax, so stay at it.
inline constexpr uint64_t kRequestsInFlightPerConnectionMax = 4'096;
// Bytes queued for writing on one connection before send() refuses.
inline constexpr uint64_t kWriteQueueBytesMax = 64u << 20;
// Pipelined requests in flight during setup and verification.
inline constexpr uint64_t kVerifyWindow = 256;
// Subject/routes per audit page during verification: ~130 bytes an account, so ~0.3 MiB a
// page, well inside one frame.
inline constexpr uint32_t kAuditRoutesPerPage = 2'000;

// Every wait is bounded.
inline constexpr uint64_t kConnectTimeoutMs = 5'000;
inline constexpr uint64_t kSetupCallTimeoutMs = 10'000;
inline constexpr uint64_t kVerifyTimeoutMs = 60'000;
inline constexpr uint64_t kDrainTimeoutMs = 30'000;  // in-flight cycles after the window
inline constexpr uint64_t kCloseTimeoutMs = 5'000;

// Error details printed (all errors are counted).
inline constexpr uint64_t kErrorsShownMax = 5;

}  // namespace tally::bench::limits
