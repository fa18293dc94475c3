#!/usr/bin/env bash
# Interleaved A/B of tally-ledger builds or environments: each round runs every variant once,
# each against a fresh ledger and data dir, so that the disk's minute-to-minute speed hits all
# of them alike. One closed-loop shape; tally-bench is this tree's unless the variant's BINDIR
# holds one (to compare drivers: the same tally-ledger in both dirs). Prints one line per run:
# variant, cycles/s, cycle p50/p99 (µs), the ledger's CPU (user+system s) and that CPU per cycle
# (µs, warm-up and drain included in the CPU), and the driver's CPU per cycle of the window (µs).
#   VARIANTS="NAME=BINDIR[=VAR=VALUE] ..." bench/ab.sh
#   VARIANTS="base=/tmp/base new=build/release/bin" ROUNDS=4 bench/ab.sh
#   VARIANTS="disk=build/release/bin null=/tmp/null=TALLY_NULL_STORE=1" bench/ab.sh
#   SHAPE="-K 64 -S 1" bench/ab.sh          (default "-K 64 -S 1000"; D=10 W=2 ROUNDS=3)
# BINDIR holds a tally-ledger (copy a build's binary there to keep it across rebuilds), and may
# hold a tally-bench; VAR=VALUE is set in that ledger's environment only. Results: /tmp/tally-ab/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${ROUNDS:-3}"
D="${D:-10}"
W="${W:-2}"
SHAPE="${SHAPE:--K 64 -S 1000}"
VARIANTS="${VARIANTS:?set VARIANTS=\"NAME=BINDIR[=VAR=VALUE] ...\"}"
OUT=/tmp/tally-ab
source bench/lib.sh
mkdir -p "$OUT"
rm -f "$OUT"/*

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg); shape: $SHAPE"
printf '%-10s %9s %9s %9s %14s %9s %9s\n' variant cycles/s p50_us p99_us cpu_user+sys us/cycle driver_us
for round in $(seq 1 "$ROUNDS"); do
  for variant in $VARIANTS; do
    IFS="=" read -r name BIN assignment <<<"$variant"  # BIN: start_ledger runs $BIN/tally-ledger
    # Exported for this ledger only: start_ledger runs it in this shell, to stop and wait for.
    [[ -z "$assignment" ]] || export "${assignment?}"
    start_ledger "$OUT/ledger.log"
    [[ -z "$assignment" ]] || unset "${assignment%%=*}"
    BENCH=build/release/bin/tally-bench
    [[ -x "$BIN/tally-bench" ]] && BENCH="$BIN/tally-bench"
    closed_loop_run "$OUT/round$round-$name.txt" "$SHAPE"
    # shellcheck disable=SC2086  # the columns are words
    printf '%-10s %9s %9s %9s %14s %9s %9s\n' "$name" $RUN_COLUMNS "$RUN_DRIVER_US"
  done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
