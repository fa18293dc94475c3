#!/usr/bin/env bash
# The Debian packages: scripts/package builds them (from the binaries of this build, --prebuilt),
# lintian reports no error on either; clients/cpp/example.cc builds against libtally-client-dev
# with only pkg-config; and dpkg installs tally into a temporary root (maintainer scripts run
# chrootless with DPKG_ROOT): the tally user and /run/tally are created, nothing is enabled, the
# files are where the units and docs say; remove keeps configs and data dirs, a reinstall keeps
# an edited config, purge deletes both.
# Usage: deb_test.sh SOURCE_DIR BIN_DIR
set -euo pipefail
source "$(dirname "$0")/lib.sh"
SRC="$1"
BIN="$2"
need_tool dpkg-buildpackage "package dpkg-dev"
need_tool dh "package debhelper"
need_tool help2man "package help2man"
need_tool lintian "package lintian"
need_tool systemd-sysusers "package systemd"
make_temp

"$SRC/scripts/package" --prebuilt "$BIN" --out "$TMP/out" --no-lintian ||
  fail "scripts/package failed"
deb="$(ls "$TMP"/out/tally_*_"$(dpkg-architecture -qDEB_HOST_ARCH)".deb)"
echo "built $(basename "$deb")"

dev_deb="$(ls "$TMP"/out/libtally-client-dev_*_"$(dpkg-architecture -qDEB_HOST_ARCH)".deb)"
echo "built $(basename "$dev_deb")"

# lintian: no error (warnings are printed for the record).
lintian --fail-on error --tag-display-limit 0 "$deb" "$dev_deb" || fail "lintian reports errors"
echo "lintian: no errors"

# The C++ client's package: a gateway builds against it with nothing but pkg-config.
multiarch="$(dpkg-architecture -qDEB_HOST_MULTIARCH)"
dev_contents="$(dpkg-deb -c "$dev_deb" | awk '{ print $6 }')"
for path in ./usr/include/tally/client.h "./usr/lib/$multiarch/libtally-client.a" \
  "./usr/lib/$multiarch/pkgconfig/tally-client.pc"; do
  grep -qx -- "$path" <<<"$dev_contents" || fail "$path is not in libtally-client-dev"
done
dev_root="$TMP/dev-root"
dpkg-deb -x "$dev_deb" "$dev_root"
pc_dir="$dev_root/usr/lib/$multiarch/pkgconfig"
grep -qx "libdir=/usr/lib/$multiarch" "$pc_dir/tally-client.pc" ||
  fail "tally-client.pc does not name /usr/lib/$multiarch: $(cat "$pc_dir/tally-client.pc")"
flags="$(PKG_CONFIG_LIBDIR="$pc_dir:/usr/lib/$multiarch/pkgconfig:/usr/share/pkgconfig" \
  PKG_CONFIG_SYSROOT_DIR="$dev_root" pkg-config --cflags --libs tally-client)" ||
  fail "pkg-config cannot resolve tally-client from the package"
# shellcheck disable=SC2086  # the flags are words
c++ -o "$TMP/example" "$SRC/clients/cpp/example.cc" $flags ||
  fail "clients/cpp/example.cc does not build against libtally-client-dev ($flags)"
"$TMP/example" 2>/dev/null && fail "example ran without its arguments"
echo "libtally-client-dev: example.cc builds with pkg-config --cflags --libs tally-client"

# Contents.
contents="$(dpkg-deb -c "$deb" | awk '{ print $6 }')"
for path in ./usr/bin/tally-ledger ./usr/bin/tally-agent ./usr/bin/tallyctl \
  ./lib/systemd/system/tally-ledger.service ./lib/systemd/system/tally-agent.service \
  ./lib/systemd/system/tally-agent.socket ./usr/lib/sysusers.d/tally.conf \
  ./usr/lib/tmpfiles.d/tally.conf ./etc/tally/agent.toml ./etc/tally/ledger.toml \
  ./etc/default/tally-agent ./etc/default/tally-ledger \
  ./usr/share/man/man8/tally-ledger.8.gz ./usr/share/man/man8/tally-agent.8.gz \
  ./usr/share/man/man1/tallyctl.1.gz ./usr/share/doc/tally/examples/tally.rules.yml; do
  grep -qx -- "$path" <<<"$contents" || fail "$path is not in the package"
done
grep -qE -- "^\./usr/share/doc/tally/examples/tally\.json(\.gz)?$" <<<"$contents" ||
  fail "the Grafana dashboard is not in the package"
for doc in operations configuration; do  # dh_compress leaves files under 4 KiB as they are
  grep -qE -- "^\./usr/share/doc/tally/$doc\.md(\.gz)?$" <<<"$contents" ||
    fail "docs/$doc.md is not in the package"
done
# The man pages are the binaries' own --help (help2man): they name the subcommands.
man_ledger="$(dpkg-deb --fsys-tarfile "$deb" | tar -xOf - ./usr/share/man/man8/tally-ledger.8.gz |
  gunzip)"
[[ "$man_ledger" == *'data\-dir'* && "$man_ledger" == *"backup DEST"* ]] ||
  fail "tally-ledger.8 lacks --data-dir or backup"
[[ "$(dpkg-deb -f "$deb" Version)" == "$(sed -nE 's/^project\(tally VERSION ([0-9.]+).*/\1/p' \
  "$SRC/CMakeLists.txt")"-* ]] || fail "debian/changelog's version is not CMakeLists.txt's"

# Install into a temporary root.
root="$TMP/root"
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/etc"
touch "$root/var/lib/dpkg/status"
dpkg_root() {
  dpkg --root="$root" --force-script-chrootless --force-depends --force-confold "$@" \
    >>"$TMP/dpkg.log" 2>&1 || fail "dpkg $*: $(tail -20 "$TMP/dpkg.log")"
}
dpkg_root -i "$deb"
grep -q '^tally:x:[0-9]*:[0-9]*:' "$root/etc/passwd" || fail "postinst created no tally user"
uid="$(awk -F: '$1 == "tally" { print $3 }' "$root/etc/passwd")"
[[ "$(stat -c '%a %u' "$root/run/tally")" == "750 $uid" ]] || fail "/run/tally is not tally's"
[[ ! -e "$root/etc/systemd/system" ]] ||
  fail "something was enabled: $(find "$root/etc/systemd/system")"
for unit in tally-ledger.service tally-agent.service tally-agent.socket; do
  [[ -f "$root/var/lib/systemd/deb-systemd-helper-enabled/$unit.dsh-also" ]] ||
    fail "$unit not registered with deb-systemd-helper (purge would not clean it)"
done
echo "install: ok (user uid $uid, /run/tally, nothing enabled)"

# A ledger's record and an agent's outbox, and an edited config.
mkdir -p "$root/var/lib/tally-ledger" "$root/var/lib/tally-agent"
echo record >"$root/var/lib/tally-ledger/tables.db"
echo outbox >"$root/var/lib/tally-agent/agent.db"
echo 'log_level = "debug"' >>"$root/etc/tally/ledger.toml"

dpkg_root -r tally
[[ ! -e "$root/usr/bin/tally-ledger" ]] || fail "remove left the binary"
[[ -f "$root/var/lib/tally-ledger/tables.db" && -f "$root/var/lib/tally-agent/agent.db" ]] ||
  fail "remove deleted a data dir"
grep -q 'log_level = "debug"' "$root/etc/tally/ledger.toml" || fail "remove dropped the config"
echo "remove: ok (data dirs and configs kept)"

dpkg_root -i "$deb"
grep -q 'log_level = "debug"' "$root/etc/tally/ledger.toml" ||
  fail "reinstall replaced the edited config"
[[ -f "$root/var/lib/tally-ledger/tables.db" ]] || fail "reinstall lost the ledger's data"
echo "reinstall: ok (edited config and data kept)"

dpkg_root -P tally
[[ ! -e "$root/var/lib/tally-ledger" && ! -e "$root/var/lib/tally-agent" ]] ||
  fail "purge kept a data dir"
[[ ! -e "$root/etc/tally" && ! -e "$root/etc/default/tally-agent" ]] || fail "purge kept configs"
[[ ! -e "$root/var/lib/systemd/deb-systemd-helper-enabled/tally-ledger.service.dsh-also" ]] ||
  fail "purge kept deb-systemd-helper state"
echo "purge: ok (data dirs and configs gone)"
