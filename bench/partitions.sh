#!/usr/bin/env bash
# Two partitions against one (issue 14): the durable closed-loop cycles/s of one tally-ledger
# under one tally-bench, then of two tally-ledgers (two partitions' primaries, each its own data
# dir) under one tally-bench each, run at the same time; the sum is the fleet's rate. Also the
# ledgers' CPU per cycle (user + system from /proc/PID/stat over each ledger's life, divided by
# the cycles of warm-up and window): on 2 cores the two partitions share the CPU with both
# drivers, so the sum is CPU-bound here and grows with cores (and disks) in a real fleet.
# Ledgers are driven directly: an agent's routing by subject (docs/scale-out.md) costs the same
# per request whatever the number of partitions.
#   bench/partitions.sh                   K=64 S=1000 D=10 W=2 RUNS=2
# Needs a release build (scripts/build release). Results: /tmp/tally-partitions/. A benchmark,
# never a test.
set -euo pipefail
cd "$(dirname "$0")/.."
K="${K:-64}"
S="${S:-1000}"
D="${D:-10}"
W="${W:-2}"
RUNS="${RUNS:-2}"
OUT=/tmp/tally-partitions
BIN="${BIN:-build/release/bin}"
source bench/lib.sh
mkdir -p "$OUT"
rm -f "$OUT"/*.txt

# run NAME N: N fresh ledgers, one tally-bench on each at once; prints one line.
run() {
  local name="$1" n="$2" i sum=0 cpu=0 cps verdicts=""
  local ports=() ledgers=() datas=() benches=()
  for ((i = 0; i < n; i++)); do
    start_ledger "$OUT/ledger.log"
    ledgers+=("$LEDGER_PID")
    ports+=("$LEDGER_PORT")
    datas+=("$LEDGER_DATA")
  done
  for ((i = 0; i < n; i++)); do
    timeout 600 "$BIN/tally-bench" --ledger "127.0.0.1:${ports[$i]}" -K "$K" -S "$S" -d "$D" \
      -w "$W" --prefix "p$i" --label "$name-p$i" >"$OUT/$name-p$i.txt" 2>&1 &
    benches+=($!)
  done
  for pid in "${benches[@]}"; do wait "$pid" || true; done
  for ((i = 0; i < n; i++)); do
    cps=$(field "$OUT/$name-p$i.txt" cps)
    verdicts+="$(field "$OUT/$name-p$i.txt" verify) "
    sum=$(awk -v a="$sum" -v b="${cps:-0}" 'BEGIN {print a + b}')
    cpu=$(cpu_seconds "${ledgers[$i]}" | awk -v a="$cpu" '{print a + $1 + $2}')
    stop_ledger "${ledgers[$i]}" "${datas[$i]}"
  done
  printf '%-14s %10s %14s %s\n' "$name" "$sum" \
    "$(awk -v c="$cpu" -v n="$sum" -v t="$((D + W))" 'BEGIN {if (n > 0) printf "%.1f", c * 1e6 / (n * t)}')" \
    "$verdicts"
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg); K=$K S=$S per partition, D=$D s, W=$W s"
printf '%-14s %10s %14s %s\n' run "cycles/s" "ledger us/cyc" verify
for r in $(seq 1 "$RUNS"); do
  run "one-$r" 1
  run "two-$r" 2
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
