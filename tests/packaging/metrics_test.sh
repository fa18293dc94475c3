#!/usr/bin/env bash
# Prometheus: `promtool check metrics` on the live /metrics of a ledger and an agent that served
# real requests; `promtool check rules` and `promtool test rules` (tally.rules.test.yml) on
# packaging/prometheus/tally.rules.yml; every metric the rules and the Grafana dashboard
# (packaging/grafana/tally.json) use exists in a live exposition, and every dashboard query parses.
# promtool comes from PATH, or from build/tools/promtool (scripts/deps extracts it from Debian's
# prometheus package without installing the server).
# Usage: metrics_test.sh SOURCE_DIR BIN_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
SRC="$1"
BIN="$2"
promtool="$(command -v promtool || true)"
[[ -n "$promtool" ]] || promtool="$SRC/build/tools/promtool"
[[ -x "$promtool" ]] || skip "promtool not found (scripts/deps extracts it into build/tools/)"
make_temp

# GET http://127.0.0.1:PORT/metrics, the body only.
scrape() {
  local body
  exec 9<>"/dev/tcp/127.0.0.1/$1"
  printf 'GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&9
  body="$(cat <&9)"
  exec 9<&-
  sed '1,/^\r$/d' <<<"$body"
}

# --insecure: plaintext link (this test is about metrics; the TLS link has tls_*_test.cc).
"$BIN/tally-ledger" --data-dir "$TMP/ledger" --listen 127.0.0.1:0 --metrics 127.0.0.1:0 --insecure \
  --ready-fd 3 3>"$TMP/ledger.ready" 2>"$TMP/ledger.log" &
CHILD_PIDS+=($!)
wait_for "[[ -s '$TMP/ledger.ready' ]]" 10 || fail "ledger not ready: $(cat "$TMP/ledger.log")"
read -r _ ledger_port ledger_metrics <"$TMP/ledger.ready"
"$BIN/tally-agent" --data-dir "$TMP/agent" --ledger "127.0.0.1:$ledger_port" --insecure \
  --socket "$TMP/agent.sock" --metrics 127.0.0.1:0 --ready-fd 3 3>"$TMP/agent.ready" \
  2>"$TMP/agent.log" &
CHILD_PIDS+=($!)
wait_for "[[ -s '$TMP/agent.ready' ]]" 10 || fail "agent not ready: $(cat "$TMP/agent.log")"
read -r _ agent_metrics _ <"$TMP/agent.ready"

# Real traffic, so that the counters and histograms have samples.
write_test_policy "$TMP/policy.toml"
"$BIN/tallyctl" --insecure --ledger "127.0.0.1:$ledger_port" policy publish "$TMP/policy.toml" >/dev/null
"$BIN/tallyctl" --insecure --ledger "127.0.0.1:$ledger_port" reserve --id direct --subject tenant-1 \
  --route chat --units 10 >/dev/null
# The agent fetches the policy on its own schedule: retry until it admits (bounded).
wait_for "'$BIN/tallyctl' --agent '$TMP/agent.sock' reserve --id via-agent --subject tenant-1 \
  --route chat --units 10 >/dev/null 2>&1" 15 || fail "no reserve through the agent"
"$BIN/tallyctl" --insecure --ledger "127.0.0.1:$ledger_port" audit >/dev/null

scrape "$ledger_metrics" >"$TMP/ledger.metrics"
scrape "$agent_metrics" >"$TMP/agent.metrics"
for daemon in ledger agent; do
  grep -q "^tally_${daemon}_requests_total" "$TMP/$daemon.metrics" ||
    fail "$daemon exposition has no requests: $(head -5 "$TMP/$daemon.metrics")"
  lint="$("$promtool" check metrics <"$TMP/$daemon.metrics" 2>&1)" ||
    fail "promtool check metrics ($daemon): $lint"
  [[ -z "$lint" ]] || fail "promtool check metrics ($daemon) complains: $lint"
  echo "check metrics: $daemon ok ($(grep -c '^# TYPE' "$TMP/$daemon.metrics") metrics)"
done

rules="$SRC/packaging/prometheus/tally.rules.yml"
"$promtool" check rules "$rules" || fail "promtool check rules"
(cd "$(dirname "$0")" && "$promtool" test rules tally.rules.test.yml) || fail "promtool test rules"

# The tally_* metric families named in the PromQL text $2 (histogram series by their family), each
# asserted to be exposed by a daemon; $1 says who uses them. Prints them.
exposed_families() {
  local families metric
  families="$(grep -oE 'tally_[a-z_]+' <<<"$2" | sed -E 's/_(bucket|sum|count)$//' | sort -u)"
  [[ -n "$families" ]] || fail "no metric found in $1"
  for metric in $families; do
    grep -qx "# TYPE $metric [a-z]*" "$TMP/ledger.metrics" "$TMP/agent.metrics" \
      --no-filename || fail "$1 uses $metric, which neither daemon exposes"
  done
  echo "$families"
}

used="$(exposed_families "the rules" "$(grep 'expr:' "$rules")")"
echo "rules: $(wc -w <<<"$used") metrics used, all exposed"

# The Grafana dashboard queries only metrics a daemon exposes, and every expression parses.
dashboard="$SRC/packaging/grafana/tally.json"
exprs="$(grep -E '^ *"expr": ' "$dashboard" | sed -E 's/^ *"expr": "(.*)",?$/\1/; s/\\"/"/g')"
[[ -n "$exprs" ]] || fail "no query found in the dashboard"
graphed="$(exposed_families "the dashboard" "$exprs")"
# promtool has no expression linter; a rules file of one recording rule per query is checked
# by `promtool check rules`, which parses each PromQL expression (the variable $job replaced
# by what Grafana substitutes for "All").
{
  echo "groups:"
  echo "  - name: dashboard"
  echo "    rules:"
  n=0
  while IFS= read -r expr; do
    n=$((n + 1))
    expr="${expr//\$job/.*}"
    [[ "$expr" != *"'"* ]] || fail "a dashboard query holds a single quote: $expr"
    printf '      - record: dashboard:query%d\n        expr: %s\n' "$n" "'$expr'"
  done <<<"$exprs"
} >"$TMP/dashboard.rules.yml"
"$promtool" check rules "$TMP/dashboard.rules.yml" >/dev/null ||
  fail "a dashboard query does not parse: $("$promtool" check rules "$TMP/dashboard.rules.yml" 2>&1)"
echo "dashboard: $(wc -l <<<"$exprs") queries parse, $(wc -w <<<"$graphed") metrics, all exposed"

for pid in "${CHILD_PIDS[@]}"; do kill -TERM "$pid"; done
for pid in "${CHILD_PIDS[@]}"; do wait "$pid" || fail "a daemon did not exit 0 after SIGTERM"; done
CHILD_PIDS=()
