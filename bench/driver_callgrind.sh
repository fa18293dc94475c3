#!/usr/bin/env bash
# Instructions of the driver, tally-bench, under callgrind: per cycle it settled, against this
# tree's tally-ledger (run normally), K=64, S=1000 for SECONDS. The count is load-independent;
# what it leaves out is what valgrind's CPU lacks: OpenSSL's SHA-256 runs its SSE/AVX code under
# valgrind, not the SHA extensions it uses on a CPU that has them (docs/PERFORMANCE.md).
# Output /tmp/cgl/driver-LABEL.out. Needs valgrind and a release build.
#   bench/driver_callgrind.sh LABEL [SECONDS [TALLY_BENCH]]
#   bench/driver_callgrind.sh new 6 && bench/driver_callgrind.sh old 6 /tmp/old/tally-bench
set -euo pipefail
cd "$(dirname "$0")/.."
label="$1"
seconds="${2:-6}"
bench="${3:-build/release/bin/tally-bench}"
BIN=build/release/bin
source bench/lib.sh
mkdir -p /tmp/cgl
start_ledger "/tmp/cgl/driver-$label.ledger.log"
valgrind --tool=callgrind --callgrind-out-file="/tmp/cgl/driver-$label.out" "$bench" \
  --ledger "127.0.0.1:$LEDGER_PORT" -K 64 -S 1000 -d "$seconds" -w 1 --prefix cg \
  >"/tmp/cgl/driver-$label.txt" 2>"/tmp/cgl/driver-$label.err" || true
stop_ledger "$LEDGER_PID" "$LEDGER_DATA"
# Every cycle the driver made, the warm-up's and the verify's reads included (they are a fixed
# few hundred thousand instructions against the run's hundreds of millions).
cycles=$(awk '/^verify: / {print $2}' "/tmp/cgl/driver-$label.txt")
total=$(callgrind_annotate "/tmp/cgl/driver-$label.out" 2>/dev/null |
  awk '!done && /PROGRAM TOTALS/ {gsub(",", "", $1); print $1; done = 1}')
awk -v t="$total" -v c="${cycles:-0}" -v l="$label" 'BEGIN {
  if (c == 0) { print l ": no cycles settled (see /tmp/cgl/driver-" l ".txt)"; exit 1 }
  printf "%s: %d instructions over %d cycles settled: %.0f per cycle\n", l, t, c, t / c }'
