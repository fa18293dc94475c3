#!/usr/bin/env bash
# Restart time: how long tally-ledger takes from exec to serving (its ready line, after the load,
# the replay of the log, the rebuild and the full audit) over a data dir holding LIVE live
# reservations over ACCOUNTS accounts and RECEIPTS receipts of the window (issue 13: 1,000,000
# live and 100,000 accounts, <= 5 s). Also prints the ledger's RSS once serving. A benchmark,
# never a test. Results: docs/PERFORMANCE.md "Restart".
#
#   bench/restart.sh                           LIVE=1000000 ACCOUNTS=100000 RECEIPTS=0 RUNS=3
#   LIVE=200000 ACCOUNTS=20000 bench/restart.sh
# Needs a release build (scripts/build release).
set -euo pipefail
cd "$(dirname "$0")/.."
LIVE="${LIVE:-1000000}"
ACCOUNTS="${ACCOUNTS:-100000}"
RECEIPTS="${RECEIPTS:-0}"
RUNS="${RUNS:-3}"
BIN="${BIN:-build/release/bin}"

data=$(mktemp -d)
trap 'rm -rf "$data"' EXIT
echo "load before fill: $(cut -d' ' -f1-3 /proc/loadavg)"
"$BIN/tally-restart-fill" "$data/dir" "$LIVE" "$ACCOUNTS" "$RECEIPTS"
echo "data dir: $(du -sm "$data/dir" | cut -f1) MB"
# COMPARE_BIN=DIR: also time DIR/tally-ledger over the same data dir, interleaved (before/after).
for run in $(seq 1 "$RUNS"); do
 for bin in "$BIN" ${COMPARE_BIN:+"$COMPARE_BIN"}; do
  starts=$((${starts:-0} + 1))
  fifo="$data/ready.$starts"
  mkfifo "$fifo"
  load=$(cut -d' ' -f1 /proc/loadavg)
  begin=$(date +%s%N)
  "$bin/tally-ledger" --data-dir "$data/dir" --listen 127.0.0.1:0 --metrics "" --log-level info \
    --ready-fd 3 3>"$fifo" 2>>"$data/ledger.log" &
  ledger=$!
  read -r -t 120 word _ <"$fifo"
  end=$(date +%s%N)
  [[ "$word" == ready ]]
  rss=$(awk '/^VmRSS/ { printf "%.0f", $2 / 1024 }' "/proc/$ledger/status")
  # CPU the ledger used to get there (user + system, all threads): unlike the wall time, it
  # barely moves with the machine's load. The phases are the `restored` line's (ledger/restore.h).
  cpu=$(awk -v hz="$(getconf CLK_TCK)" '{ printf "%.2f", ($14 + $15) / hz }' "/proc/$ledger/stat")
  phases=$(grep -o 'load_ms=[0-9]* apply_ms=[0-9]* finish_ms=[0-9]*' "$data/ledger.log" | tail -1)
  printf 'run %s %s: %.2f s to serving, CPU %s s, RSS %s MB (load1 %s) %s\n' "$run" "$bin" \
    "$(echo "($end - $begin) / 1000000000" | bc -l)" "$cpu" "$rss" "$load" "$phases"
  kill -TERM "$ledger"
  wait "$ledger" || true
 done
done
