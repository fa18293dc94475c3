#!/usr/bin/env bash
# Runs tally-ledger and (optionally) the peers in ../shared/peers side by side, one at a time,
# with the same closed-loop shape (K=64, S=1000 and S=1, 2 s warm-up, 10 s measured), then
# prints one table of medians with the peers' summarize.sh, and the ratios the targets are
# stated in (docs/PERFORMANCE.md).
#   RUNS=3 PEERS=1 bench/side_by_side.sh        (defaults)
#   PEERS=0 bench/side_by_side.sh               (tally only)
#   STORES="sqlite postgres" bench/side_by_side.sh  (tally's stores; default both: postgres
#                                               starts its own PostgreSQL 15 as the peer's does)
#   LEDGER_CONFIG=FILE bench/side_by_side.sh    (tally-ledger --config FILE, e.g. commit_mode)
#   ORDER=interleaved (default) | blocks        interleaved: RUNS rounds, each running every
#                                               configuration once (Redis, PL/pgSQL, tally), so that
#                                               the disk's minute-to-minute speed falls on all of
#                                               them alike, and ratios are printed per round too;
#                                               blocks: the peers' RUNS runs, then tally's (the
#                                               order before 2026-12-07 08:00)
# Needs a release build (scripts/build release). Results: /tmp/tally-side-by-side/.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${RUNS:-3}"
PEERS="${PEERS:-1}"
PEERS_DIR="${PEERS_DIR:-../shared/peers}"  # the peers' folder (../shared/peers from a checkout)
K="${K:-64}"
OUT=/tmp/tally-side-by-side
BIN=build/release/bin
mkdir -p "$OUT"
rm -f "$OUT"/*.txt "$OUT"/*.log

ORDER="${ORDER:-interleaved}"
[[ "$ORDER" == interleaved || "$ORDER" == blocks ]] || { echo "ORDER: interleaved or blocks" >&2; exit 2; }

# run_peers N TAG: N runs of each peer configuration; results appended to $OUT/TAG-redis.txt and
# $OUT/TAG-postgres.txt.
run_peers() {
  RUNS="$1" FSYNC="everysec always" bash "$PEERS_DIR"/redis/run.sh >>"$OUT/redis-console.log" 2>&1
  cat /tmp/peers/redis/results.txt >>"$OUT/$2-redis.txt"
  RUNS="$1" bash "$PEERS_DIR"/postgres/run.sh >>"$OUT/postgres-console.log" 2>&1
  cat /tmp/peers/postgres/results.txt >>"$OUT/$2-postgres.txt"
}

STORES="${STORES:-sqlite postgres}"
LEDGER_CONFIG="${LEDGER_CONFIG:-}"
config_args=()
[[ -n "$LEDGER_CONFIG" ]] && config_args=(--config "$LEDGER_CONFIG")
PG_BIN="${PG_BIN:-/usr/lib/postgresql/15/bin}"
PG_PORT="${PG_PORT:-55433}"
PG_DIR=/tmp/tally-side-by-side-pg

# The PostgreSQL behind `--store postgres`: configured like the peer's (shared_buffers, fsync and
# synchronous_commit on, 127.0.0.1), run as the postgres user (initdb refuses root), stopped at exit.
start_postgres() {
  rm -rf "$PG_DIR"
  mkdir -p "$PG_DIR"
  local as=()
  if [[ "$(id -u)" -eq 0 ]]; then
    chown postgres: "$PG_DIR"
    as=(runuser -u postgres --)
  fi
  "${as[@]}" "$PG_BIN/initdb" -D "$PG_DIR/data" -U postgres -A trust -E UTF8 --locale=C >/dev/null
  cat >>"$PG_DIR/data/postgresql.conf" <<CONF
listen_addresses = '127.0.0.1'
port = $PG_PORT
unix_socket_directories = '$PG_DIR'
shared_buffers = 1GB
synchronous_commit = on
fsync = on
full_page_writes = on
max_wal_size = 4GB
CONF
  "${as[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/pg.log" -w -t 60 start >/dev/null
  PG_AS=("${as[@]}")
}
stop_postgres() {
  "${PG_AS[@]}" "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w -t 30 stop >/dev/null || true
  rm -rf "$PG_DIR"
}

db=0
# run_tally FIRST LAST TAG: tally's runs FIRST..LAST of every store and S; results appended to
# $OUT/TAG-tally-STORE.txt.
run_tally() {
  local store S run data fifo label ledger word port
  for store in $STORES; do
    if [[ "$store" == postgres ]]; then
      start_postgres
      trap stop_postgres EXIT
    fi
    for S in 1000 1; do
      for run in $(seq "$1" "$2"); do
        # The peers' and the previous run's dirty pages reach the disk first, not during this run.
        sync
        data=$(mktemp -d)
        fifo="$data.ready"
        mkfifo "$fifo"
        store_args=()
        label="tally-durable-S$S-run$run"
        if [[ "$store" == postgres ]]; then
          db=$((db + 1))
          "$PG_BIN/psql" -X -q -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "CREATE DATABASE tally$db"
          store_args=(--store postgres
            --postgres "host=127.0.0.1 port=$PG_PORT user=postgres dbname=tally$db")
          label="tally-postgres-S$S-run$run"
        fi
        "$BIN/tally-ledger" --insecure --data-dir "$data" --listen 127.0.0.1:0 --log-level warn --ready-fd 3 \
          "${store_args[@]}" "${config_args[@]}" 3>"$fifo" 2>>"$OUT/ledger.log" &
        ledger=$!
        read -r -t 10 word port _ <"$fifo"
        [[ "$word" == ready ]]
        timeout 120 "$BIN/tally-bench" --ledger "127.0.0.1:$port" -K "$K" -S "$S" -d 10 -w 2 \
          --label "$label" >>"$OUT/$3-tally-$store.txt" 2>&1 || echo "run failed" >>"$OUT/$3-tally-$store.txt"
        kill -TERM "$ledger"
        wait "$ledger" || true
        rm -rf "$data" "$fifo"
      done
    done
    if [[ "$store" == postgres ]]; then
      stop_postgres
      trap - EXIT
    fi
  done
}

# ratios FILE...: the targets' ratios of the medians summarize.sh gives for these RESULT lines
# (its table: the configuration, then the runs, then the median cycles/s).
ratios() {
  bash "$PEERS_DIR"/driver/summarize.sh "$@" | awk '
    NR > 2 { cps[$1] = $3 }
    function ratio(a, b) { return (a in cps) && (b in cps) && cps[b] > 0 ? sprintf("%.2fx", cps[a] / cps[b]) : "-" }
    END {
      for (S = 1000; S >= 1; S = (S == 1000 ? 1 : 0)) {
        printf "  S=%-5d tally/Redis everysec %s (target 3x)  tally/PL-pgSQL %s (target 20x)  PostgreSQL store/PL-pgSQL %s (target 5x)\n",
          S, ratio("tally-durable-S" S, "redis-everysec-S" S), ratio("tally-durable-S" S, "postgres-S" S),
          ratio("tally-postgres-S" S, "postgres-S" S)
      }
    }'
}

if [[ "$ORDER" == blocks ]]; then
  [[ "$PEERS" == 1 ]] && run_peers "$RUNS" all
  run_tally 1 "$RUNS" all
else
  for round in $(seq 1 "$RUNS"); do
    echo "round $round: $(date -u +%H:%M:%S) UTC, load average $(cut -d' ' -f1-3 /proc/loadavg)"
    [[ "$PEERS" == 1 ]] && run_peers 1 "round$round"
    run_tally "$round" "$round" "round$round"
    ratios "$OUT"/round"$round"-*.txt
  done
fi

echo "all runs (load average at the end $(cut -d' ' -f1-3 /proc/loadavg)):"
bash "$PEERS_DIR"/driver/summarize.sh "$OUT"/*.txt
ratios "$OUT"/*.txt
