#!/usr/bin/env bash
# Interleaved pairs: tally-bench directly against a ledger, then through a tally-agent in front
# of the same ledger, PAIRS times, so disk noise hits both sides alike. Prints RESULT lines and a
# median table (the peers' summarize.sh).  K=1 PAIRS=5 D=3 bench/agent_vs_direct.sh
set -euo pipefail
cd "$(dirname "$0")/.."
K="${K:-1}"; PAIRS="${PAIRS:-5}"; D="${D:-3}"; S="${S:-1000}"
BIN=build/release/bin
OUT=/tmp/tally-agent-vs-direct
mkdir -p "$OUT"; rm -f "$OUT"/*.txt
work=$(mktemp -d)
cleanup() { kill -TERM "${agent:-}" "${ledger:-}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
mkfifo "$work/ledger.ready" "$work/agent.ready"
"$BIN/tally-ledger" --insecure --data-dir "$work/ledger" --listen 127.0.0.1:0 --log-level warn --ready-fd 3 \
  3>"$work/ledger.ready" 2>>"$OUT/ledger.log" &
ledger=$!
read -r -t 10 _ port _ <"$work/ledger.ready"
"$BIN/tally-agent" --insecure --data-dir "$work/agent" --ledger "127.0.0.1:$port" --socket "$work/agent.sock" \
  --metrics 127.0.0.1:0 --log-level warn --ready-fd 3 3>"$work/agent.ready" 2>>"$OUT/agent.log" &
agent=$!
read -r -t 10 _ _ <"$work/agent.ready"
for pair in $(seq 1 "$PAIRS"); do
  "$BIN/tally-bench" --ledger "127.0.0.1:$port" -K "$K" -S "$S" -d "$D" -w 1 \
    --prefix "direct-$pair" --label "direct-K$K-run$pair" >>"$OUT/direct.txt" 2>&1
  "$BIN/tally-bench" --agent "$work/agent.sock" -K "$K" -S "$S" -d "$D" -w 1 \
    --prefix "agent-$pair" --label "agent-K$K-run$pair" >>"$OUT/agent.txt" 2>&1
done
bash ../shared/peers/driver/summarize.sh "$OUT"/direct.txt "$OUT"/agent.txt
