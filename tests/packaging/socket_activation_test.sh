#!/usr/bin/env bash
# Socket activation as tally-agent.socket does it, without PID 1: systemd-socket-activate holds
# the listening socket and starts tally-agent (LISTEN_FDS=1, fd 3) only when the first gateway
# connects. Proves: nothing runs and nothing is written before that connection; the agent serves
# on the inherited socket (it never binds its own --socket path); SIGTERM drains and exits 0.
# Usage: socket_activation_test.sh BIN_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
BIN="$1"
need_tool systemd-socket-activate "package systemd"
make_temp

sock="$TMP/agent.sock"
systemd-socket-activate -l "$sock" "$BIN/tally-agent" --data-dir "$TMP/data" \
  --ledger 127.0.0.1:1 --insecure --socket "$TMP/own.sock" --metrics "" 2>"$TMP/log" &
pid=$!
CHILD_PIDS+=("$pid")
wait_for "grep -q 'Listening on $sock' '$TMP/log'" 10 || fail "no listener: $(cat "$TMP/log")"

# Listening, but the agent has not started: no data dir, the process is still the activator.
[[ ! -e "$TMP/data" ]] || fail "the agent started before any connection"
[[ "$(cat /proc/$pid/comm)" == systemd-socket-* ]] || fail "pid $pid is $(cat /proc/$pid/comm)"

# The first connection starts it; the request is answered on the inherited socket.
out="$("$BIN/tallyctl" --agent "$sock" --timeout-ms 10000 --json health)" ||
  fail "health through the activated socket failed: $out; log: $(cat "$TMP/log")"
[[ "$out" == *'"version"'* ]] || fail "unexpected health reply: $out"
[[ "$(cat /proc/$pid/comm)" == tally-agent ]] || fail "pid $pid is not tally-agent now"
[[ -d "$TMP/data" ]] || fail "the agent has no data dir"
[[ ! -e "$TMP/own.sock" ]] || fail "the agent bound its own socket instead of the inherited one"
grep -q 'event=ready' "$TMP/log" || fail "no ready line: $(cat "$TMP/log")"

# A second client is served by the same process.
"$BIN/tallyctl" --agent "$sock" --timeout-ms 10000 health >/dev/null || fail "second health"

kill -TERM "$pid"
code=0
wait "$pid" || code=$?
CHILD_PIDS=()
((code == 0)) || fail "tally-agent exited $code after SIGTERM: $(tail -5 "$TMP/log")"
grep -q 'event=exit code=0' "$TMP/log" || fail "no clean exit line"
echo "socket activation: ok (started on first connect, served on fd 3, drained, exit 0)"
