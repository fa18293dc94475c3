#!/bin/bash
# Runs inside the container booted by nspawn_test.sh, as a oneshot unit after multi-user.target,
# under the container's own systemd (PID 1). Writes "ok: ..." / "FAIL: ..." lines to
# /tally-test/result and powers the container off.
set -uo pipefail
out=/tally-test/result
log() { echo "$*" >>"$out"; }
fail() {
  log "FAIL: $*"
  journalctl --no-pager -n 60 >>/tally-test/journal 2>&1
  systemctl poweroff
  exit 1
}
deb=$(ls /tally-test/tally_*.deb)
export PATH=/usr/sbin:/usr/bin:/sbin:/bin

# Install: the user and /run/tally exist, nothing is enabled or running.
dpkg -i "$deb" >/tally-test/dpkg.log 2>&1 || fail "dpkg -i: $(tail -5 /tally-test/dpkg.log)"
id tally >/dev/null || fail "no tally user"
[[ "$(stat -c '%U %a' /run/tally)" == "tally 750" ]] || fail "/run/tally: $(stat -c '%U %a' /run/tally)"
for unit in tally-ledger.service tally-agent.service tally-agent.socket; do
  state=$(systemctl is-enabled "$unit" 2>&1)
  [[ "$state" == disabled ]] || fail "$unit is $state after install"
  ! systemctl -q is-active "$unit" || fail "$unit runs after install"
done
log "ok: installed; tally user, /run/tally; nothing enabled or started"

# A short watchdog: without pings systemd would kill the ledger after 2 s.
mkdir -p /etc/systemd/system/tally-ledger.service.d
printf '[Service]\nWatchdogSec=2\n' >/etc/systemd/system/tally-ledger.service.d/watchdog.conf
systemctl daemon-reload
# Type=notify: start returns once the ledger sent READY=1.
timeout 30 systemctl start tally-ledger.service || fail "start tally-ledger: $(systemctl status tally-ledger --no-pager 2>&1 | tail -5)"
systemctl -q is-active tally-ledger.service || fail "tally-ledger not active"
log "ok: tally-ledger started (Type=notify: READY=1 received)"

pid=$(systemctl show -P MainPID tally-ledger.service)
status=/proc/$pid/status
grep -q '^NoNewPrivs:[[:space:]]*1' "$status" || fail "NoNewPrivs not set"
grep -q '^CapEff:[[:space:]]*0000000000000000' "$status" || fail "capabilities left: $(grep CapEff "$status")"
grep -q '^Seccomp:[[:space:]]*2' "$status" || fail "no seccomp filter"
grep -q "^Uid:[[:space:]]*$(id -u tally)[[:space:]]" "$status" || fail "not running as tally"
# ProtectSystem=strict: / is read-only for it, its StateDirectory is writable.
mounts=/proc/$pid/mountinfo
awk '$5 == "/" { print $6 }' "$mounts" | grep -q '^ro' || fail "/ is writable for the ledger"
awk '$5 == "/var/lib/tally-ledger" { print $6 }' "$mounts" | grep -q '^rw' ||
  fail "/var/lib/tally-ledger is not a writable mount"
nsenter -t "$pid" -m -S "$(id -u tally)" -G "$(id -g tally)" sh -c 'echo x > /etc/tally/probe' 2>/dev/null &&
  fail "the ledger's mount namespace lets user tally write /etc/tally"
nsenter -t "$pid" -m -S "$(id -u tally)" -G "$(id -g tally)" sh -c 'echo x > /var/lib/tally-ledger/probe && rm /var/lib/tally-ledger/probe' ||
  fail "user tally cannot write its StateDirectory"
log "ok: hardening in force (NoNewPrivs, CapEff 0, seccomp, uid tally, / ro, StateDirectory rw)"

policy=/tally-test/policy.toml
# The link is TLS as packaged: tallyctl is the operator (the key the ledger created at first
# start; --ledger-key defaults to ledger.key beside it), the agent's gateway key is enrolled and
# the agent pins the ledger's key (TALLY_AGENT_ARGS).
ctl=(tallyctl --key /var/lib/tally-ledger/operator.key)
[[ "$(stat -c '%U %a' /var/lib/tally-ledger/operator.key)" == "tally 600" ]] ||
  fail "operator.key: $(stat -c '%U %a' /var/lib/tally-ledger/operator.key 2>&1)"
"${ctl[@]}" policy publish "$policy" >/tally-test/ctl.log 2>&1 || fail "policy publish: $(cat /tally-test/ctl.log)"
install -d -o tally -g tally -m 0750 /var/lib/tally-agent
gateway=$(setpriv --reuid tally --regid tally --init-groups tally-agent --data-dir /var/lib/tally-agent identity --json 2>&1) ||
  fail "tally-agent identity: $gateway"
gateway_id=$(sed -n 's/.*"gatewayId":"\([^"]*\)".*/\1/p' <<<"$gateway")
gateway_key=$(sed -n 's/.*"publicKey":"\([^"]*\)".*/\1/p' <<<"$gateway")
"${ctl[@]}" gateway enroll --id "$gateway_id" --public-key "$gateway_key" >>/tally-test/ctl.log 2>&1 ||
  fail "gateway enroll: $(tail -3 /tally-test/ctl.log)"
ledger_key=$(tally-ledger --data-dir /var/lib/tally-ledger identity --json |
  sed -n 's/.*"publicKey":"\([^"]*\)".*/\1/p')
[[ -n "$ledger_key" ]] || fail "tally-ledger identity printed no key"
echo "TALLY_AGENT_ARGS=--ledger-public-key $ledger_key" >>/etc/default/tally-agent
log "ok: TLS link set up: operator key, gateway $gateway_id enrolled, ledger key pinned"

# Socket activation: the socket unit listens, the service starts on the first connection.
systemctl start tally-agent.socket || fail "start tally-agent.socket"
[[ -S /run/tally/agent.sock ]] || fail "no /run/tally/agent.sock"
! systemctl -q is-active tally-agent.service || fail "the agent started before any connection"
ok=0
for attempt in $(seq 1 50); do
  if tallyctl --agent /run/tally/agent.sock --timeout-ms 5000 reserve --id nspawn-$attempt \
    --subject tenant-1 --route chat --units 5 >>/tally-test/ctl.log 2>&1; then
    ok=1
    break
  fi
  sleep 0.2  # the agent's first policy fetch
done
((ok)) || fail "no reserve through the activated socket: $(tail -5 /tally-test/ctl.log)"
systemctl -q is-active tally-agent.service || fail "tally-agent not active after the reserve"
log "ok: tallyctl reserve through tally-agent.socket started tally-agent on demand (attempt $attempt)"

# Each WATCHDOG=1 moves the unit's watchdog timestamp.
first=$(systemctl show -P WatchdogTimestampMonotonic tally-ledger.service)
sleep 3  # longer than WatchdogSec=2: the ledger survives only if it pings
second=$(systemctl show -P WatchdogTimestampMonotonic tally-ledger.service)
[[ -n "$first" && "$first" != 0 && "$second" != "$first" ]] ||
  fail "the watchdog timestamp did not move ($first, $second): no WATCHDOG=1 reached systemd"
journalctl --no-pager -u tally-ledger.service -u tally-agent.service >/tally-test/units.log 2>&1
systemctl -q is-active tally-ledger.service || fail "tally-ledger died (watchdog?)"
[[ "$(systemctl show -P NRestarts tally-ledger.service)" == 0 ]] || fail "tally-ledger was restarted"
log "ok: watchdog: tally-ledger alive past WatchdogSec=2, no restart"

key_before=$(sha256sum /var/lib/tally-agent/gateway.key)
timeout 30 systemctl stop tally-agent.socket tally-agent.service || fail "stop agent"
timeout 30 systemctl stop tally-ledger.service || fail "stop ledger"
for unit in tally-agent.service tally-ledger.service; do
  [[ "$(systemctl show -P Result "$unit")" == success ]] || fail "$unit result $(systemctl show -P Result "$unit")"
  [[ "$(systemctl show -P ExecMainStatus "$unit")" == 0 ]] || fail "$unit exit $(systemctl show -P ExecMainStatus "$unit")"
done
log "ok: systemctl stop drained both, exit 0, result success"

# A reinstall keeps the data dirs.
dpkg -i "$deb" >>/tally-test/dpkg.log 2>&1 || fail "reinstall"
[[ "$(sha256sum /var/lib/tally-agent/gateway.key)" == "$key_before" ]] || fail "the agent's key changed"
[[ -f /var/lib/tally-ledger/tables.db && -d /var/lib/tally-ledger/log ]] || fail "the ledger's record is gone"
log "ok: reinstall kept /var/lib/tally-agent and /var/lib/tally-ledger"
log "done"
systemctl poweroff
