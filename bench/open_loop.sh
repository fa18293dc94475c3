#!/usr/bin/env bash
# Open-loop latency of tally-ledger (issue 13): first the closed-loop peak (K=64, fsync before
# every reply), then a fixed arrival rate at 50% and 80% of that peak, each latency measured
# from the time its cycle was due (tally-bench --rate: no coordinated omission). A fresh ledger
# and data dir per run. Prints one line per run: rate, cycles/s, and p50/p99/p99.9 of reserve
# and of the whole cycle.
#   bench/open_loop.sh                 (S=1000, 10 s measured, 2 s warm-up)
#   S=1 D=30 FRACTIONS="0.5 0.8 0.9" bench/open_loop.sh
#   RATES="12000 20000" LEDGER_CONFIG=thread.toml bench/open_loop.sh   (fixed rates, so that two
#                                      configurations are offered the same load; a ledger config)
# Needs a release build (scripts/build release). Results: /tmp/tally-open-loop/.
# The peers' driver (../shared/peers/driver) has only a closed loop, so their rows are not here.
set -euo pipefail
cd "$(dirname "$0")/.."
S="${S:-1000}"
D="${D:-10}"
W="${W:-2}"
FRACTIONS="${FRACTIONS:-0.5 0.8}"
RATES="${RATES:-}"
LEDGER_CONFIG="${LEDGER_CONFIG:-}"
OUT=/tmp/tally-open-loop
BIN=build/release/bin
source bench/lib.sh
mkdir -p "$OUT"
rm -f "$OUT"/*.txt

# run_bench NAME ARGS...: a fresh ledger, one tally-bench run, its output in $OUT/NAME.txt.
run_bench() {
  local name="$1"
  shift
  start_ledger "$OUT/ledger.log" "$LEDGER_CONFIG"
  timeout 300 "$BIN/tally-bench" --ledger "127.0.0.1:$LEDGER_PORT" -S "$S" -d "$D" -w "$W" \
    --label "$name" "$@" >"$OUT/$name.txt" 2>&1 || echo "run failed" >>"$OUT/$name.txt"
  stop_ledger "$LEDGER_PID" "$LEDGER_DATA"
}

run_bench closed-K64 -K 64
peak=$(field "$OUT/closed-K64.txt" cps)
[[ -n "$peak" ]] || { echo "the closed-loop run failed: $OUT/closed-K64.txt" >&2; exit 1; }
if [[ -n "$RATES" ]]; then
  for rate in $RATES; do run_bench "open-$rate" --rate "$rate"; done
else
  for fraction in $FRACTIONS; do
    rate=$(awk -v p="$peak" -v f="$fraction" 'BEGIN {printf "%d", p * f}')
    run_bench "open-$fraction" --rate "$rate"
  done
fi

printf '%-12s %9s %10s %28s %28s %8s %s\n' run offered cycles/s \
  "reserve p50/p99/p99.9 (us)" "cycle p50/p99/p99.9 (us)" waiting verify
for file in "$OUT"/closed-K64.txt "$OUT"/open-*.txt; do
  printf '%-12s %9s %10s %28s %28s %8s %s\n' "$(basename "$file" .txt)" \
    "$(field "$file" offered_cps)" "$(field "$file" cps)" \
    "$(field "$file" reserve_p50)/$(field "$file" reserve_p99)/$(field "$file" reserve_p999)" \
    "$(field "$file" cycle_p50)/$(field "$file" cycle_p99)/$(field "$file" cycle_p999)" \
    "$(field "$file" due_waiting_max)" "$(field "$file" verify)"
done
