#!/usr/bin/env bash
# The agent's HTTP/JSON interface against its native socket (docs/PERFORMANCE.md "HTTP/JSON on
# the agent"). For each K, back to back, each on a fresh ledger + agent (the agent with --http
# on loopback TCP, since wrk speaks TCP only):
#   native: tally-bench --agent SOCKET -K K -c K        (closed loop, Unix socket, Cap'n Proto)
#   http:   wrk -t K -c K -s bench/http_cycle.lua       (closed loop, reserve -> start -> settle
#           as HTTP/1.1 + JSON, one request at a time per connection)
#   KS="1 8" D=5 bench/http_vs_native.sh
set -euo pipefail
cd "$(dirname "$0")/.."
KS="${KS:-1 8}"; D="${D:-5}"
BIN=build/release/bin
work=$(mktemp -d)
ledger=""; agent=""
stop_stack() {
  kill -TERM $agent $ledger 2>/dev/null || true
  wait 2>/dev/null || true
  ledger=""; agent=""
}
trap 'stop_stack; rm -rf "$work"' EXIT

# start_stack NAME: a ledger and an agent on $work/NAME; sets port, http_port, sock.
start_stack() {
  local dir="$work/$1"
  mkdir -p "$dir"
  mkfifo "$dir/ledger.ready" "$dir/agent.ready"
  "$BIN/tally-ledger" --insecure --data-dir "$dir/ledger" --listen 127.0.0.1:0 --metrics 127.0.0.1:0 \
    --log-level warn --ready-fd 3 3>"$dir/ledger.ready" 2>>"$dir/ledger.log" &
  ledger=$!
  read -r -t 10 _ port _ <"$dir/ledger.ready"
  cat >"$dir/policy.toml" <<'POLICY'
[[budget]]
subject = "wrk-*"
route = "bench"
unit = "tokens"
refill_per_second = 1000000
burst = 1000000000
max_single_reservation = 1000
hold_ttl_ms = 60000
hard_execution_limit_ms = 600000
POLICY
  "$BIN/tallyctl" --insecure --ledger "127.0.0.1:$port" policy publish "$dir/policy.toml" >/dev/null
  http_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  sock="$dir/agent.sock"
  "$BIN/tally-agent" --insecure --data-dir "$dir/agent" --ledger "127.0.0.1:$port" --socket "$sock" \
    --http "127.0.0.1:$http_port" --metrics "" --log-level warn --ready-fd 3 \
    3>"$dir/agent.ready" 2>>"$dir/agent.log" &
  agent=$!
  read -r -t 10 _ _ <"$dir/agent.ready"
  for _ in $(seq 1 100); do  # until the agent reaches its ledger
    curl -sf "http://127.0.0.1:$http_port/readyz" >/dev/null && break
    sleep 0.05
  done
}

echo "load before: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
for k in $KS; do
  start_stack "native$k"
  "$BIN/tally-bench" --agent "$sock" -K "$k" -c "$k" -S 1000 -d "$D" -w 1 \
    --prefix "native$k" --label "native-K$k" 2>&1 | grep -E '^RESULT|setup' || true
  stop_stack
  start_stack "http$k"
  wrk -t "$k" -c "$k" -d "${D}s" --latency -s bench/http_cycle.lua "http://127.0.0.1:$http_port" \
    2>&1 | grep -E 'RESULT-HTTP' | sed "s/^/K=$k /"
  stop_stack
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
