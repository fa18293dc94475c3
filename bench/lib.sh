# Shared by the benchmark scripts that start fresh ledgers (bench/scaling.sh, bench/open_loop.sh,
# bench/partitions.sh): source it after setting BIN (the release build's bin directory). Every
# ledger it started is stopped, and its data dir removed, when the script exits, even on an error.

bench_ledger_pids=()
bench_ledger_dirs=()
stop_every_ledger() {
  local pid dir
  for pid in "${bench_ledger_pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${bench_ledger_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  for dir in "${bench_ledger_dirs[@]}"; do rm -rf "$dir" "$dir.ready"; done
}
trap stop_every_ledger EXIT

# start_ledger LOG [CONFIG]: a fresh tally-ledger on a fresh data dir, loopback, any port, no
# metrics listener (several may run at once), with --config CONFIG when given; waits for its
# ready line. Sets LEDGER_PID, LEDGER_PORT and LEDGER_DATA; stop it with stop_ledger PID DATA.
start_ledger() {
  local log="$1" fifo word config_args=()
  [[ -n "${2:-}" ]] && config_args=(--config "$2")
  LEDGER_DATA=$(mktemp -d)
  bench_ledger_dirs+=("$LEDGER_DATA")
  fifo="$LEDGER_DATA.ready"
  mkfifo "$fifo"
  "$BIN/tally-ledger" --insecure --data-dir "$LEDGER_DATA" --listen 127.0.0.1:0 --metrics "" \
    --log-level warn "${config_args[@]}" --ready-fd 3 3>"$fifo" 2>>"$log" &
  LEDGER_PID=$!
  bench_ledger_pids+=("$LEDGER_PID")
  read -r -t 30 word LEDGER_PORT _ <"$fifo"
  rm -f "$fifo"
  [[ "$word" == ready ]]
}

# stop_ledger PID DATA: SIGTERM, wait for the exit, remove the data dir.
stop_ledger() {
  local pid kept=()
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" || true
  rm -rf "$2"
  for pid in "${bench_ledger_pids[@]}"; do [[ "$pid" == "$1" ]] || kept+=("$pid"); done
  bench_ledger_pids=("${kept[@]}")
}

# cpu_seconds PID: user and system CPU seconds of PID so far (fields 14 and 15 of
# /proc/PID/stat), as "USER SYSTEM".
cpu_seconds() {
  awk -v hz="$(getconf CLK_TCK)" '{printf "%.3f %.3f\n", $14 / hz, $15 / hz}' "/proc/$1/stat"
}

# field FILE KEY: KEY's value on tally-bench's RESULT line in FILE.
field() { grep '^RESULT ' "$1" | tr ' ' '\n' | awk -F= -v k="$2" '$1 == k {print $2}'; }
