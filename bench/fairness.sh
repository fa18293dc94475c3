#!/usr/bin/env bash
# Fair scheduling, measured (docs/PERFORMANCE.md "Fair scheduling"): a fresh tally-ledger and a
# tally-agent with `[scheduling] started_max = { "chat" = SLOTS }`, then tally-fairness-bench:
# TENANTS (name:weight) each with CLIENTS closed-loop gateways competing for the SLOTS execution
# slots. Prints the bench's table and RESULT line, then the agent's own fairness metrics.
#   SLOTS=4 CLIENTS=6 SERVICE_MS=5 WARMUP_S=2 DURATION_S=20 TENANTS=a:1,b:2,c:4,d:8 bench/fairness.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SLOTS="${SLOTS:-4}"; CLIENTS="${CLIENTS:-6}"; SERVICE_MS="${SERVICE_MS:-5}"
WARMUP_S="${WARMUP_S:-2}"; DURATION_S="${DURATION_S:-20}"; TENANTS="${TENANTS:-a:1,b:2,c:4,d:8}"
WINDOW="${WINDOW:-1000}"
BIN=build/release/bin
work=$(mktemp -d)
cleanup() { kill -TERM "${agent:-}" "${ledger:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
mkfifo "$work/ledger.ready" "$work/agent.ready"
"$BIN/tally-ledger" --insecure --data-dir "$work/ledger" --listen 127.0.0.1:0 --log-level warn --ready-fd 3 \
  3>"$work/ledger.ready" 2>>"$work/ledger.log" &
ledger=$!
read -r -t 10 _ port _ <"$work/ledger.ready"
printf '[scheduling]\nstarted_max = { "chat" = %s }\nfairness_window = %s\n' "$SLOTS" "$WINDOW" \
  >"$work/agent.toml"
# The bench publishes the policy (one budget per tenant, its weight) before the agent starts,
# so the agent's first policy fetch already has the weights.
"$BIN/tally-fairness-bench" --ledger "127.0.0.1:$port" --agent /dev/null --tenants "$TENANTS" \
  --clients 1 --duration-s 0 --warmup-s 0 --publish-only 1 >/dev/null
"$BIN/tally-agent" --insecure --data-dir "$work/agent" --ledger "127.0.0.1:$port" --socket "$work/agent.sock" \
  --config "$work/agent.toml" --metrics 127.0.0.1:0 --log-level warn --ready-fd 3 \
  3>"$work/agent.ready" 2>>"$work/agent.log" &
agent=$!
read -r -t 10 _ mport _ <"$work/agent.ready"
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
"$BIN/tally-fairness-bench" --ledger "127.0.0.1:$port" --agent "$work/agent.sock" \
  --tenants "$TENANTS" --clients "$CLIENTS" --service-ms "$SERVICE_MS" --warmup-s "$WARMUP_S" \
  --duration-s "$DURATION_S" --publish-only 0
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
curl -s "http://127.0.0.1:$mport/metrics" | grep -E '^tally_agent_(fair|fairness)' || true
