#!/bin/sh
# Installs Ployz from this directory (the tarball's): /usr/bin/ployz, the ployz.service unit,
# /etc/ployz/daemon.toml (kept when present), /var/lib/ployz (0700) and the group ployz; then
# enables and starts the unit, or upgrades a running daemon in place (`systemctl reload`: a
# handover that drops no request). The same as the package does, with nothing but coreutils and
# systemd; running it again changes nothing that is already right.
#
#   sh install.sh              install or upgrade
#   sh install.sh --uninstall  stop, disable and remove the program and unit; keep state and config
#   sh install.sh --purge      --uninstall, and remove /var/lib/ployz, /etc/ployz and the group
#   sh install.sh --help       usage
set -eu

here=$(cd "$(dirname "$0")" && pwd)
bin=/usr/bin/ployz
unit=/lib/systemd/system/ployz.service
conf_dir=/etc/ployz
state_dir=/var/lib/ployz

say() { printf 'install.sh: %s\n' "$*" >&2; }
fail() { say "$*"; exit 1; }

usage() {
    cat <<'EOF'
Usage: sh install.sh [--uninstall | --purge | --help]

Installs Ployz from this directory: /usr/bin/ployz, the ployz.service unit,
/etc/ployz/daemon.toml (kept when present), /var/lib/ployz (0700) and the group
ployz; then enables and starts the unit, or upgrades a running daemon in place.

  sh install.sh              install or upgrade
  sh install.sh --uninstall  stop, disable and remove the program and unit;
                             keep state and config
  sh install.sh --purge      --uninstall, and remove /var/lib/ployz, /etc/ployz
                             and the group ployz too
  sh install.sh --help       this text

Run it as root (sudo sh install.sh) from the directory holding ployz,
ployz.service and daemon.toml.
EOF
}

# The arguments first: a mistake is reported as such, as root or not, before anything is done.
mode=install
for arg in "$@"; do
    case "$arg" in
        --uninstall) [ "$mode" = purge ] || mode=uninstall ;;
        --purge) mode=purge ;;
        -h|--help) usage; exit 0 ;;
        *) fail "unknown argument '$arg'; use --uninstall, --purge, --help or nothing" ;;
    esac
done

[ "$(id -u)" = 0 ] || fail "must run as root (sudo sh install.sh)"
command -v systemctl >/dev/null 2>&1 || fail "systemctl not found: Ployz runs as a systemd unit"
[ -d /run/systemd/system ] || fail "systemd is not running on this host (no /run/systemd/system)"

# Whether the ployz Debian package owns the program, as dpkg says.
from_package() {
    command -v dpkg-query >/dev/null 2>&1 && dpkg-query -S "$bin" 2>/dev/null | grep -q '^ployz:'
}

if [ "$mode" != install ]; then
    # Checked before anything is stopped: the package's own scripts remove what it installed.
    if from_package; then
        fail "Ployz was installed by the ployz package: remove it with apt remove ployz (or apt purge ployz)"
    fi
    if systemctl is-enabled --quiet ployz.service 2>/dev/null || systemctl is-active --quiet ployz.service 2>/dev/null; then
        say "stopping and disabling ployz.service"
        systemctl disable --now ployz.service >/dev/null 2>&1 || systemctl stop ployz.service || true
    fi
    rm -f "$unit" "$bin"
    systemctl daemon-reload
    if [ "$mode" = purge ]; then
        rm -rf "$state_dir" "$conf_dir" /run/ployz
        if getent group ployz >/dev/null 2>&1; then
            groupdel ployz || say "could not delete the group ployz"
        fi
        say "removed Ployz, its state ($state_dir), its configuration ($conf_dir) and the group ployz"
    else
        say "removed Ployz; kept $state_dir and $conf_dir (--purge removes them)"
    fi
    exit 0
fi

for f in ployz ployz.service daemon.toml; do
    [ -f "$here/$f" ] || fail "$here/$f is missing: run install.sh from the unpacked tarball"
done
if ! "$here/ployz" --version >/dev/null 2>&1; then
    if [ -x "$here/ployz" ] && command -v findmnt >/dev/null 2>&1 \
        && findmnt -n -o OPTIONS --target "$here" | tr ',' '\n' | grep -qx noexec; then
        fail "$here is on a filesystem mounted noexec, so $here/ployz cannot run: unpack the tarball elsewhere (your home directory) and run install.sh there"
    fi
    fail "$here/ployz does not run on this host (wrong architecture?)"
fi
if from_package; then
    # The package's next upgrade puts its own files back; until then dpkg --verify reports them.
    say "note: the ployz package is installed; its program and unit are replaced by this directory's"
fi

# Replaced by rename, so a running daemon keeps its executable and nothing reads half a file.
install_file() { # mode source destination
    if [ -f "$3" ] && cmp -s "$2" "$3"; then
        chmod "$1" "$3"
        return 1
    fi
    mkdir -p "$(dirname "$3")"
    cp "$2" "$3.new"
    chmod "$1" "$3.new"
    mv -f "$3.new" "$3"
    return 0
}

getent group ployz >/dev/null 2>&1 || { groupadd --system ployz; say "created the group ployz"; }

changed_bin=no
if install_file 0755 "$here/ployz" "$bin"; then changed_bin=yes; say "installed $bin ($("$bin" --version | head -n 1))"; fi
changed_unit=no
if install_file 0644 "$here/ployz.service" "$unit"; then changed_unit=yes; say "installed $unit"; fi
if [ ! -e "$conf_dir/daemon.toml" ]; then
    install_file 0644 "$here/daemon.toml" "$conf_dir/daemon.toml" || true
    say "installed $conf_dir/daemon.toml (the documented defaults)"
fi
mkdir -p "$state_dir"
chmod 0700 "$state_dir"

if [ "$changed_unit" = yes ]; then systemctl daemon-reload; fi
systemctl enable ployz.service >/dev/null 2>&1 || fail "systemctl enable ployz.service failed"

# The running daemon's executable is not the installed file (it was replaced since the daemon
# started, and the handover that should have followed did not happen).
runs_another_build() {
    pid=$(systemctl show -p MainPID --value ployz.service 2>/dev/null)
    [ -n "$pid" ] && [ "$pid" != 0 ] || return 1
    exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || return 1
    [ "$exe" != "$bin" ]
}

if systemctl is-active --quiet ployz.service; then
    if [ "$changed_bin" = yes ] || [ "$changed_unit" = yes ] || runs_another_build; then
        say "upgrading the running daemon in place (systemctl reload ployz: handover)"
        systemctl reload ployz.service || fail "systemctl reload ployz (the handover) failed: see systemctl status ployz and journalctl -u ployz"
    else
        say "ployz.service already runs this build"
    fi
else
    say "starting ployz.service"
    systemctl start ployz.service || fail "ployz.service did not start: see journalctl -u ployz"
fi
say "done: systemctl status ployz"
