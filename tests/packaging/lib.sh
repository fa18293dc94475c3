# Shared by the packaging tests (sourced). Every test: `set -euo pipefail`, a temp dir removed
# on exit, children stopped by pid, exit 77 (ctest: skipped) with a printed reason when a tool
# is missing.

skip() {
  echo "SKIPPED: $*"
  exit 77
}

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

need_tool() {
  command -v "$1" >/dev/null 2>&1 || skip "$1 is not installed (${2:-scripts/deps installs it})"
}

# A temp dir removed at exit, after the pids in CHILD_PIDS are killed.
CHILD_PIDS=()
make_temp() {
  TMP="$(mktemp -d /tmp/tally-pkg.XXXXXX)"
  trap cleanup EXIT
}
cleanup() {
  local pid
  for pid in "${CHILD_PIDS[@]}"; do
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$TMP"
}

# Waits (at most $2 seconds, default 10) until the command in $1 succeeds; polls every 50 ms.
wait_for() {
  local deadline=$((SECONDS + ${2:-10}))
  until eval "$1"; do
    ((SECONDS < deadline)) || return 1
    sleep 0.05
  done
}

# The one policy the packaging tests publish: tenant-1/chat, 1,000 tokens, no refill.
write_test_policy() {
  cat >"$1" <<'POLICY'
[[budget]]
subject = "tenant-1"
route = "chat"
unit = "tokens"
refill_per_second = 0
burst = 1000
max_single_reservation = 1000
hold_ttl_ms = 600000
hard_execution_limit_ms = 600000
POLICY
}
