#!/usr/bin/env bash
# Runs tally-ledger and (optionally) the peers in ../shared/peers side by side, one at a time,
# with the same closed-loop shape (K=64, S=1000 and S=1, 2 s warm-up, 10 s measured), then
# prints one table of medians with the peers' summarize.sh.
#   RUNS=3 PEERS=1 bench/side_by_side.sh        (defaults)
#   PEERS=0 bench/side_by_side.sh               (tally only)
# Needs a release build (scripts/build release). Results: /tmp/tally-side-by-side/.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-3}"
PEERS="${PEERS:-1}"
K="${K:-64}"
OUT=/tmp/tally-side-by-side
BIN=build/release/bin
mkdir -p "$OUT"
rm -f "$OUT"/*.txt

if [[ "$PEERS" == 1 ]]; then
  RUNS="$RUNS" FSYNC="everysec always" bash ../shared/peers/redis/run.sh >"$OUT/redis-console.log" 2>&1
  cp /tmp/peers/redis/results.txt "$OUT/redis.txt"
  RUNS="$RUNS" bash ../shared/peers/postgres/run.sh >"$OUT/postgres-console.log" 2>&1
  cp /tmp/peers/postgres/results.txt "$OUT/postgres.txt"
fi

for S in 1000 1; do
  for run in $(seq 1 "$RUNS"); do
    data=$(mktemp -d)
    fifo="$data.ready"
    mkfifo "$fifo"
    "$BIN/tally-ledger" --data-dir "$data" --listen 127.0.0.1:0 --log-level warn --ready-fd 3 \
      3>"$fifo" 2>>"$OUT/ledger.log" &
    ledger=$!
    read -r -t 10 word port _ <"$fifo"
    [[ "$word" == ready ]]
    timeout 120 "$BIN/tally-bench" --ledger "127.0.0.1:$port" -K "$K" -S "$S" -d 10 -w 2 \
      --label "tally-durable-S$S-run$run" >>"$OUT/tally.txt" 2>&1 || echo "run failed" >>"$OUT/tally.txt"
    kill -TERM "$ledger"
    wait "$ledger" || true
    rm -rf "$data" "$fifo"
  done
done

bash ../shared/peers/driver/summarize.sh "$OUT"/*.txt
