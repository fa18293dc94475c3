#!/usr/bin/env bash
# Under a real systemd: boots a container with systemd-nspawn --boot whose /usr and dpkg
# database are overlays of this host's (nothing on the host is written; no debootstrap, no
# download: the host's own Debian 12 /usr, systemd included, is the container's OS; its own
# network namespace, so the ledger's fixed ports never collide with the host's), installs
# the .deb inside and runs nspawn_inside.sh as a unit under the container's PID 1: install
# enables nothing; tally-ledger starts (Type=notify) with its hardening in force and survives a
# 2 s watchdog; a tallyctl reserve through tally-agent.socket starts the agent on demand;
# systemctl stop drains both with exit 0; a reinstall keeps the data dirs.
# Skipped, with the reason, when nspawn cannot run a container here.
# Usage: nspawn_test.sh SOURCE_DIR BIN_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
SRC="$1"
BIN="$2"
need_tool systemd-nspawn "package systemd-container"
need_tool dpkg-buildpackage "package dpkg-dev"
need_tool dh "package debhelper"
need_tool help2man "package help2man"
[[ "$(id -u)" == 0 ]] || skip "systemd-nspawn needs root"
[[ -x /usr/lib/systemd/systemd ]] || skip "no /usr/lib/systemd/systemd on this host"
make_temp

root="$TMP/root"
share="$TMP/share"
mkdir -p "$root"/{usr,etc,proc,sys,dev,run,tmp,root,var/lib/dpkg,var/log,var/cache,var/tmp}
mkdir -p "$share" "$TMP/usr-upper" "$TMP/dpkg-upper"
for dir in bin lib lib64 sbin; do ln -s "usr/$dir" "$root/$dir"; done
cp /usr/lib/os-release "$root/etc/os-release"
: >"$root/etc/machine-id"
# The host's users and groups: its dpkg database (statoverride) names them.
for file in passwd group shadow gshadow; do
  [[ -f "/etc/$file" ]] && cp -a "/etc/$file" "$root/etc/$file"
done
printf 'passwd: files\ngroup: files\nshadow: files\nhosts: files\n' >"$root/etc/nsswitch.conf"
printf '127.0.0.1 localhost\n::1 localhost\n' >"$root/etc/hosts"
[[ -d /etc/dpkg ]] && cp -a /etc/dpkg "$root/etc/dpkg"
# /usr/bin/awk and friends point through /etc/alternatives.
[[ -d /etc/alternatives ]] && cp -a /etc/alternatives "$root/etc/alternatives"

nspawn=(systemd-nspawn -q --register=no --keep-unit -D "$root"
  "--overlay=/usr:$TMP/usr-upper:/usr" "--overlay=/var/lib/dpkg:$TMP/dpkg-upper:/var/lib/dpkg"
  "--bind=$share:/tally-test" --private-network)
if ! probe="$(timeout 30 "${nspawn[@]}" /bin/true 2>&1)"; then
  skip "systemd-nspawn cannot run a container here: $probe"
fi

"$SRC/scripts/package" --prebuilt "$BIN" --out "$TMP/out" --no-lintian >/dev/null ||
  fail "scripts/package failed"
cp "$TMP"/out/tally_*.deb "$share/"
cp "$(dirname "$0")/nspawn_inside.sh" "$share/inside.sh"
write_test_policy "$share/policy.toml"

mkdir -p "$root/etc/systemd/system/multi-user.target.wants"
cat >"$root/etc/systemd/system/tally-test.service" <<'UNIT'
[Unit]
Description=tally packaging test (tests/packaging/nspawn_inside.sh)
After=multi-user.target
[Service]
Type=oneshot
ExecStart=/bin/bash /tally-test/inside.sh
UNIT
ln -s ../tally-test.service "$root/etc/systemd/system/multi-user.target.wants/tally-test.service"

echo "booting the container (systemd $(/usr/lib/systemd/systemd --version | head -1 | awk '{print $2}'))"
code=0
timeout 180 "${nspawn[@]}" --boot >"$TMP/console.log" 2>&1 </dev/null || code=$?
[[ -f "$share/result" ]] || fail "the test unit wrote nothing (nspawn exit $code): $(tail -30 "$TMP/console.log")"
cat "$share/result"
if grep -q '^FAIL' "$share/result" || ! grep -qx done "$share/result"; then
  [[ -f "$share/journal" ]] && cat "$share/journal"
  fail "inside the container (nspawn exit $code)"
fi
# For the record: what systemd said about the units (e.g. a hardening option this kernel or
# cgroup layout cannot apply).
grep -iE 'bpf|not supported|ignoring|warn' "$share/units.log" | grep -v 'level=info' || true
echo "under systemd: ok"
