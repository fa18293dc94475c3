#!/usr/bin/env bash
# Soak: tally-ledger under tally-bench's full closed-loop rate for MINUTES minutes (default 30),
# printing each minute the ledger's RSS, its data dir's size, cycles/s and cycle p99. All four
# should be flat once the first idempotency window (RETENTION_MS) has passed (docs/LEDGER.md
# "Retention"; results in docs/PERFORMANCE.md "Soak"). A benchmark, never a test.
#
#   bench/soak.sh                                  30 min, K=64, S=1000, window 60 s
#   MINUTES=5 bench/soak.sh                        a short run
#   MINUTES=5 RETENTION_MS=900000 bench/soak.sh    the default window (flat only after 15 min)
#
# Each minute is one tally-bench run (-d 55 -w 2 plus its setup and verification). The runs
# alternate between PREFIXES id prefixes (soak-p0, soak-p1, …) under one policy published by a short first
# run (prefix soak, budget soak-*), so the same 2 x S accounts serve the whole soak and an id
# comes back only after two minutes, past a 60 s window. A longer window than ~60 s would have
# to be compacted before a prefix repeats: set PREFIXES to more (e.g. PREFIXES=20 for 15 min).
# Needs a release build (scripts/build release). Output: stdout and /tmp/tally-soak/.
set -euo pipefail
cd "$(dirname "$0")/.."
MINUTES="${MINUTES:-30}"
K="${K:-64}"
S="${S:-1000}"
RETENTION_MS="${RETENTION_MS:-60000}"
PREFIXES="${PREFIXES:-2}"
BIN="${BIN:-build/release/bin}"
OUT="${OUT:-/tmp/tally-soak}"
mkdir -p "$OUT"
rm -f "$OUT"/*.txt "$OUT"/*.log

data=$(mktemp -d)
fifo="$data.ready"
mkfifo "$fifo"
printf 'retention_ms = %s\n' "$RETENTION_MS" >"$data.toml"
"$BIN/tally-ledger" --insecure --data-dir "$data/dir" --config "$data.toml" --listen 127.0.0.1:0 \
  --metrics "" --log-level warn --ready-fd 3 3>"$fifo" 2>>"$OUT/ledger.log" &
ledger=$!
cleanup() {
  kill -TERM "$ledger" 2>/dev/null || true
  wait "$ledger" 2>/dev/null || true
  rm -rf "$data" "$fifo" "$data.toml"
}
trap cleanup EXIT
read -r -t 30 word port _ <"$fifo"
[[ "$word" == ready ]]

rss_mb() { awk '/^VmRSS/ { printf "%.0f", $2 / 1024 }' "/proc/$ledger/status"; }
dir_mb() { du -sm "$data/dir" | cut -f1; }
field() { tr ' ' '\n' <<<"$1" | sed -n "s/^$2=//p"; }

echo "soak: K=$K S=$S retention_ms=$RETENTION_MS minutes=$MINUTES ledger pid $ledger; load: $(cut -d' ' -f1-3 /proc/loadavg)"
# The policy (budget soak-*), published once.
"$BIN/tally-bench" --ledger "127.0.0.1:$port" -K "$K" -S "$S" -d 2 -w 1 --prefix soak \
  --label soak-setup >"$OUT/setup.txt" 2>&1
start=$(date +%s)
printf '%-6s %-8s %-9s %-10s %-12s %-8s %s\n' minute rss_mb data_mb cycles/s cycle_p99_us errors load1
for minute in $(seq 1 "$MINUTES"); do
  prefix="soak-p$(((minute - 1) % PREFIXES))"
  result=$(timeout 120 "$BIN/tally-bench" --ledger "127.0.0.1:$port" -K "$K" -S "$S" -d 55 -w 2 \
    --no-publish --prefix "$prefix" --label "soak-m$minute" 2>&1 | tee -a "$OUT/bench.txt" |
    grep '^RESULT' || echo "RESULT cps=failed")
  printf '%-6s %-8s %-9s %-10s %-12s %-8s %s\n' "$minute" "$(rss_mb)" "$(dir_mb)" \
    "$(field "$result" cps)" "$(field "$result" cycle_p99)" "$(field "$result" errors)" \
    "$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$OUT/soak.txt"
done
echo "soak: $(($(date +%s) - start)) s; load: $(cut -d' ' -f1-3 /proc/loadavg)"
