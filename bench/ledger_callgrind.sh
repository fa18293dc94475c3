#!/usr/bin/env bash
# Instructions of tally-ledger under callgrind: LABEL 0 = start/health/stop only; LABEL SECONDS =
# tally-bench -K 64 -S 1000 (S=N: -S N) for SECONDS. Output /tmp/cgl/LABEL.out (docs/PERFORMANCE.md,
# "Instructions per cycle in the ledger"). Needs valgrind and a release build.
# Usage: bench/ledger_callgrind.sh idle 0 && bench/ledger_callgrind.sh k64 20
# $1 = label, $2 = bench duration seconds (0: no bench, just start/stop)
# BIN=DIR: another tally-ledger (default build/release/bin); the environment is the ledger's, so
#   TALLY_NULL_STORE=1 BIN=/tmp/null bench/ledger_callgrind.sh null 10   (bench/null_store.patch)
# With a bench, it also prints the request handler's (Server::onFrame) and the event loop's
# (uv_run: the loop thread, the commit included) instructions per request.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p /tmp/cgl
d=$(mktemp -d)
mkfifo "$d.ready"
# Set, so the ledger does not re-execute itself to set it (docs/LEDGER.md "Restart time"): the
# re-executed binary would run outside valgrind. valgrind's allocator ignores the tunable anyway.
GLIBC_TUNABLES=glibc.malloc.hugetlb=1 valgrind --tool=callgrind --callgrind-out-file=/tmp/cgl/$1.out "${BIN:-build/release/bin}/tally-ledger" --insecure --data-dir $d --listen 127.0.0.1:0 --log-level warn --ready-fd 3 3>$d.ready 2>/tmp/cgl/$1.log &
pid=$!
read -r -t 120 w port _ < $d.ready
if [[ "$2" != 0 ]]; then
  build/release/bin/tally-bench --ledger 127.0.0.1:$port -K 64 -S "${S:-1000}" -d $2 -w 2 --prefix cg > /tmp/cgl/$1.bench 2>&1 || true
else
  build/release/bin/tallyctl --insecure --ledger 127.0.0.1:$port --timeout-ms 60000 health > /tmp/cgl/$1.bench 2>&1 || true
fi
kill -TERM $pid; wait $pid || true
rm -rf $d $d.ready
if [[ "$2" != 0 ]]; then
  # Inclusive instructions of the loop and of onFrame, over onFrame's calls (one per request).
  # The awk programs read to the end (an early exit would fail the pipe under pipefail).
  callgrind_annotate --inclusive=yes --tree=calling /tmp/cgl/$1.out 2>/dev/null |
    awk '/\*  .*FramedStream::decode\(/ {in_decode = 1; next}
         in_decode && !done && /> .*Server::onFrame\(/ {
           ir = $1; gsub(",", "", ir); calls = $NF; gsub("[(),x]", "", calls);
           print ir, calls; done = 1 }' >/tmp/cgl/$1.onframe
  read -r onframe_ir requests </tmp/cgl/$1.onframe
  loop_ir=$(callgrind_annotate --inclusive=yes /tmp/cgl/$1.out 2>/dev/null |
    awk '!done && / \?\?\?:uv_run \[/ {gsub(",", "", $1); print $1; done = 1}')
  awk -v o="$onframe_ir" -v l="$loop_ir" -v n="$requests" -v label="$1" 'BEGIN {
    printf "%s: %d requests; per request: %.0f instructions in onFrame, %.0f in the loop\n", label, n, o / n, l / n }'
fi
