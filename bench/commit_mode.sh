#!/usr/bin/env bash
# Commits on the event loop against commits on a worker thread (commit_mode; docs/LEDGER.md
# "Durability and group commit"). Each closed-loop shape runs against a fresh ledger and data
# dir per run, the two modes interleaved run by run so that both see the same disk and load.
# Prints one line per run: shape, mode, cycles/s, cycle p50/p99 (µs), the ledger's CPU over the
# run (user + system s) and that CPU per cycle (µs, warm-up and drain included in the CPU).
#   bench/commit_mode.sh                                   (ROUNDS=3, the SHAPES below)
#   ROUNDS=5 SHAPES="-K 64 -S 1|-K 1 -S 1000" bench/commit_mode.sh
# Needs a release build (scripts/build release). Results: /tmp/tally-commit-mode/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${ROUNDS:-3}"
SHAPES="${SHAPES:--K 64 -S 1000|-K 64 -S 1|-K 512 -c 8 -S 1000|-K 1 -S 1000}"
D="${D:-10}"
W="${W:-2}"
OUT=/tmp/tally-commit-mode
BIN=build/release/bin
source bench/lib.sh
mkdir -p "$OUT"
rm -f "$OUT"/*
for mode in loop thread; do printf 'commit_mode = "%s"\n' "$mode" >"$OUT/$mode.toml"; done

echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-22s %-6s %9s %9s %9s %14s %9s\n' shape mode cycles/s p50_us p99_us cpu_user+sys us/cycle
IFS='|' read -r -a shapes <<<"$SHAPES"
for round in $(seq 1 "$ROUNDS"); do
  for shape in "${shapes[@]}"; do
    for mode in loop thread; do
      start_ledger "$OUT/ledger.log" "$OUT/$mode.toml"
      closed_loop_run "$OUT/round$round-$mode-${shape// /}.txt" "$shape"
      # shellcheck disable=SC2086  # the columns are words
      printf '%-22s %-6s %9s %9s %9s %14s %9s\n' "$shape" "$mode" $RUN_COLUMNS
    done
  done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)"
