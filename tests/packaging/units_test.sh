#!/usr/bin/env bash
# The systemd units, sysusers.d and tmpfiles.d files under packaging/ as systemd itself reads
# them: `systemd-analyze verify` (no warning at all: an unknown or misspelt key is only a
# warning), the exposure score of `systemd-analyze security --offline` (at most
# TALLY_EXPOSURE_MAX), and systemd-sysusers / systemd-tmpfiles applied to an empty root.
# Usage: units_test.sh SOURCE_DIR BIN_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
SRC="$1"
BIN="$2"
EXPOSURE_MAX="${TALLY_EXPOSURE_MAX:-2.0}"
need_tool systemd-analyze "package systemd"
make_temp

# The units name /usr/bin/...; verify checks that the binaries exist, so point them at the build.
mkdir "$TMP/units"
for unit in "$SRC"/packaging/systemd/*; do
  sed "s|/usr/bin/|$BIN/|g" "$unit" >"$TMP/units/$(basename "$unit")"
done
units=("$TMP"/units/tally-agent.service "$TMP"/units/tally-agent.socket
  "$TMP"/units/tally-ledger.service)

verify() {
  systemd-analyze verify --man=no "$@" 2>&1
}
out="$(verify "${units[@]}")" || fail "systemd-analyze verify failed: $out"
[[ -z "$out" ]] || fail "systemd-analyze verify warns: $out"
echo "verify: ok (${#units[@]} units, no warnings)"

# The check can fail: a misspelt key is reported.
sed 's/^NoNewPrivileges=/NoNewPrivilege=/' "$TMP/units/tally-ledger.service" \
  >"$TMP/units/broken.service"
out="$(verify "$TMP/units/broken.service" || true)"
[[ "$out" == *"Unknown key"* ]] || fail "a misspelt key went unnoticed: '$out'"
rm "$TMP/units/broken.service"

for service in tally-agent tally-ledger; do
  out="$(systemd-analyze security --offline=true --threshold=100 "$TMP/units/$service.service" \
    2>&1)" || fail "systemd-analyze security $service: $out"
  line="$(grep 'Overall exposure level' <<<"$out")" || fail "no exposure level: $out"
  score="$(sed -E 's/.*: ([0-9.]+) .*/\1/' <<<"$line")"
  echo "security: $service exposure $score (${line##* [0-9].[0-9] })"
  awk -v s="$score" -v m="$EXPOSURE_MAX" 'BEGIN { exit !(s <= m) }' ||
    fail "$service exposure $score is above $EXPOSURE_MAX"
done

# The ledger listens where ledger.toml says (loopback as shipped, checked by the config tests),
# TLS: no --listen nor --insecure on the command line, and no IP allow list that would override
# the operator's listen address (requests are bound to the key that opened the connection).
unit="$SRC/packaging/systemd/tally-ledger.service"
grep -q -- '--listen' "$unit" && fail "tally-ledger.service passes --listen"
grep -q -- '--insecure' "$unit" && fail "tally-ledger.service passes --insecure"
grep -q '^IPAddress' "$unit" && fail "tally-ledger.service restricts IP addresses: $(grep '^IPAddress' "$unit")"

# sysusers.d and tmpfiles.d applied to an empty root: the user, then /run/tally owned by it.
mkdir -p "$TMP/root/etc"
systemd-sysusers --root="$TMP/root" "$SRC/packaging/sysusers.d/tally.conf" >/dev/null 2>&1 ||
  fail "systemd-sysusers refused packaging/sysusers.d/tally.conf"
grep -q '^tally:x:[0-9]*:[0-9]*:.*:/usr/sbin/nologin$' "$TMP/root/etc/passwd" ||
  fail "no tally user: $(cat "$TMP/root/etc/passwd")"
uid="$(awk -F: '$1 == "tally" { print $3 }' "$TMP/root/etc/passwd")"
((uid < 1000)) || fail "tally's uid $uid is not a system uid"
systemd-tmpfiles --create --root="$TMP/root" "$SRC/packaging/tmpfiles.d/tally.conf" ||
  fail "systemd-tmpfiles refused packaging/tmpfiles.d/tally.conf"
[[ "$(stat -c '%a %u' "$TMP/root/run/tally")" == "750 $uid" ]] ||
  fail "/run/tally is $(stat -c '%a %u' "$TMP/root/run/tally"), not 750 $uid"
echo "sysusers/tmpfiles: ok (uid $uid, /run/tally 0750)"
