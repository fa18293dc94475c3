#!/usr/bin/env bash
# Scaling curves of tally-ledger (issue 13): durable closed-loop cycles/s against the cycles in
# flight K (over several connections as K grows) at S=1000, and against the number of subjects S
# at K=64. A fresh ledger and data dir per run; one tally-bench run each (every run verified).
# Prints one line per run: K, connections, S, cycles/s, cycle p50/p99, and the ledger's CPU per
# cycle, user and system apart (of the ledger process over its whole life, from /proc/PID/stat:
# setup, warm-up, window, drain and the closing audit, divided by the cycles of warm-up and
# window; an upper bound, and system time includes the kernel's share of every fsync).
#   bench/scaling.sh                                        (D=10 s measured, W=2 s warm-up)
#   KS="1 64" SUBJECTS="1000" bench/scaling.sh              a subset
# Needs a release build (scripts/build release). Results: /tmp/tally-scaling/. A benchmark,
# never a test.
set -euo pipefail
cd "$(dirname "$0")/.."
D="${D:-10}"
W="${W:-2}"
KS="${KS:-1 8 64 512 4096}"
SUBJECTS="${SUBJECTS:-1 1000 100000 1000000}"
OUT=/tmp/tally-scaling
BIN="${BIN:-build/release/bin}"
source bench/lib.sh
mkdir -p "$OUT"
rm -f "$OUT"/*.txt

# connections K: one up to 64 in flight, then one per 512 (at most 8).
connections() {
  local k="$1"
  if ((k <= 64)); then echo 1; elif ((k / 512 >= 8)); then echo 8; else echo $(((k + 511) / 512)); fi
}

# run NAME K S: a fresh ledger, one tally-bench run; output in $OUT/NAME.txt, the ledger's user
# and system seconds in $OUT/NAME.cpu.
run() {
  local name="$1" k="$2" s="$3"
  start_ledger "$OUT/ledger.log"
  timeout 600 "$BIN/tally-bench" --ledger "127.0.0.1:$LEDGER_PORT" -K "$k" \
    -c "$(connections "$k")" -S "$s" -d "$D" -w "$W" --label "$name" >"$OUT/$name.txt" 2>&1 ||
    echo "run failed" >>"$OUT/$name.txt"
  cpu_seconds "$LEDGER_PID" >"$OUT/$name.cpu"
  stop_ledger "$LEDGER_PID" "$LEDGER_DATA"
}

for k in $KS; do run "K$k-S1000" "$k" 1000; done
for s in $SUBJECTS; do
  [[ "$s" == 1000 && " $KS " == *" 64 "* ]] || run "K64-S$s" 64 "$s"
done

printf '%-14s %6s %6s %8s %10s %20s %22s %s\n' run K conns S cycles/s "cycle p50/p99 (us)" \
  "ledger usr+sys us/cyc" verify
for file in "$OUT"/K*.txt; do
  name=$(basename "$file" .txt)
  # The cycles of warm-up and window (warm-up at the window's rate, an estimate). Setup and
  # drain add CPU but no cycles, hence the upper bound.
  cycles=$(awk -v c="$(field "$file" cps)" -v d="$D" -v w="$W" 'BEGIN {print c * (d + w)}')
  printf '%-14s %6s %6s %8s %10s %20s %22s %s\n' "$name" "$(field "$file" K)" \
    "$(field "$file" conns)" "$(field "$file" S)" "$(field "$file" cps)" \
    "$(field "$file" cycle_p50)/$(field "$file" cycle_p99)" \
    "$(awk -v n="$cycles" '{if (n > 0) printf "%.1f+%.1f", $1 * 1e6 / n, $2 * 1e6 / n}' "$OUT/$name.cpu")" \
    "$(field "$file" verify)"
done | sort -t' ' -k1,1V
