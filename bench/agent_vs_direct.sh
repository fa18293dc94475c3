#!/usr/bin/env bash
# Interleaved pairs: tally-bench directly against a ledger, then through a tally-agent in front
# of the same ledger, PAIRS times, so disk noise hits both sides alike. Prints RESULT lines and a
# median table (the peers' summarize.sh).  K=1 PAIRS=5 D=3 bench/agent_vs_direct.sh
set -euo pipefail
cd "$(dirname "$0")/.."
K="${K:-1}"; PAIRS="${PAIRS:-5}"; D="${D:-3}"; S="${S:-1000}"; BUSY_POLL_US="${BUSY_POLL_US:-0}"
BIN=build/release/bin
OUT=/tmp/tally-agent-vs-direct
# For cpu_seconds and field. Its EXIT trap (ledgers of start_ledger: none here) is replaced below.
source bench/lib.sh
mkdir -p "$OUT"; rm -f "$OUT"/*.txt
work=$(mktemp -d)
cleanup() { kill -TERM "${agent:-}" "${ledger:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
mkfifo "$work/ledger.ready" "$work/agent.ready"
"$BIN/tally-ledger" --insecure --data-dir "$work/ledger" --listen 127.0.0.1:0 --log-level warn --ready-fd 3 \
  3>"$work/ledger.ready" 2>>"$OUT/ledger.log" &
ledger=$!
read -r -t 10 _ port _ <"$work/ledger.ready"
# The agent does not forward policy publication (an operator request): one short direct run
# publishes the budget avd-*, which every run's subjects (avd-direct-N-…, avd-agent-N-…) match.
# Before the agent starts, so that the policy it fetches at start has it.
"$BIN/tally-bench" --ledger "127.0.0.1:$port" -K 1 -S "$S" -d 1 -w 0 --prefix avd \
  --label setup >"$OUT/setup.txt" 2>&1
printf 'busy_poll_us = %s\n' "$BUSY_POLL_US" >"$work/agent.toml"
"$BIN/tally-agent" --insecure --data-dir "$work/agent" --ledger "127.0.0.1:$port" --socket "$work/agent.sock" \
  --config "$work/agent.toml" --metrics 127.0.0.1:0 --log-level warn --ready-fd 3 \
  3>"$work/agent.ready" 2>>"$OUT/agent.log" &
agent=$!
read -r -t 10 _ _ <"$work/agent.ready"
agent_cpu_s() { cpu_seconds "$agent" | awk '{print $1 + $2}'; }
for pair in $(seq 1 "$PAIRS"); do
  "$BIN/tally-bench" --ledger "127.0.0.1:$port" -K "$K" -S "$S" -d "$D" -w 1 --no-publish \
    --prefix "avd-direct-$pair" --label "direct-K$K-run$pair" >>"$OUT/direct.txt" 2>&1
  cpu_before=$(agent_cpu_s)
  "$BIN/tally-bench" --agent "$work/agent.sock" -K "$K" -S "$S" -d "$D" -w 1 --no-publish \
    --prefix "avd-agent-$pair" --label "agent-K$K-run$pair" >"$OUT/agent-run.txt" 2>&1
  cpu_after=$(agent_cpu_s)
  cat "$OUT/agent-run.txt" >>"$OUT/agent.txt"
  # Cycles of warm-up (at the window's rate, an estimate) and window; setup adds CPU, no cycles.
  cps=$(field "$OUT/agent-run.txt" cps)
  awk -v b="$cpu_before" -v a="$cpu_after" -v c="${cps:-0}" -v d="$D" -v p="$pair" -v poll="$BUSY_POLL_US" \
    'BEGIN {n = c * (d + 1); printf "agent run %s (busy_poll_us %s): %.0f cycles/s, agent CPU %.1f us per cycle\n", p, poll, c, (n > 0 ? (a - b) * 1e6 / n : 0)}'
done
bash ../shared/peers/driver/summarize.sh "$OUT"/direct.txt "$OUT"/agent.txt
