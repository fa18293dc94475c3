# Shared by the benchmark scripts that start fresh ledgers (bench/scaling.sh, bench/open_loop.sh,
# bench/partitions.sh, bench/commit_mode.sh, bench/ab.sh): source it after setting BIN (the
# release build's bin directory). Every ledger it started is stopped, and its data dir removed,
# when the script exits, even on an error.

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

# closed_loop_run RESULT SHAPE: one tally-bench run of SHAPE (several flags, D and W seconds)
# against the ledger start_ledger started, its output in RESULT; then stops that ledger. Sets
# RUN_COLUMNS to "cycles/s p50_us p99_us user+sys us_per_cycle" (the ledger's CPU over the whole
# run, per cycle of the run), and RUN_DRIVER_US to tally-bench's own CPU per cycle of the window
# (µs); says so on stderr when the run did not verify. Not in a subshell: stop_ledger must wait
# for its own child.
closed_loop_run() {
  local result="$1" shape="$2" user sys cps cycles
  # shellcheck disable=SC2086  # the shape is several flags
  "${BENCH:-$BIN/tally-bench}" --ledger "127.0.0.1:$LEDGER_PORT" $shape -d "$D" -w "$W" \
    >"$result" 2>&1 || echo "run failed" >>"$result"
  read -r user sys < <(cpu_seconds "$LEDGER_PID")
  stop_ledger "$LEDGER_PID" "$LEDGER_DATA"
  cps=$(field "$result" cps)
  cycles=$(awk -v c="$cps" -v d="$D" -v w="$W" 'BEGIN {printf "%d", c * (d + w)}')
  RUN_COLUMNS="$cps $(field "$result" cycle_p50) $(field "$result" cycle_p99) $user+$sys"
  RUN_COLUMNS+=" $(awk -v u="$user" -v s="$sys" -v n="$cycles" 'BEGIN {if (n > 0) printf "%.1f", (u + s) * 1e6 / n}')"
  RUN_DRIVER_US=$(awk -v d="$(field "$result" driver_cpu)" -v c="$cps" 'BEGIN {if (c > 0) printf "%.1f", d * 1e6 / c}')
  grep -q 'verify=PASS' "$result" || echo "verify did not pass: $result" >&2
}
