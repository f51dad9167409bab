#!/usr/bin/env bash
# Builds Ployz's Debian package and tarball from one `ployz` executable:
#
#   scripts/package.sh [--bin PATH] [--version V] [--out DIR] [--fast]
#
#   --bin PATH    the executable to package (default target/release/ployz, built with
#                 `cargo build --release --locked -p ployz` when missing)
#   --version V   the version the artefacts carry (default: the workspace's, from Cargo.toml)
#   --out DIR     where they go (default target/package/)
#   --fast        compress quickly (xz -1, gzip -1) into larger files: for tests
#
# Writes DIR/ployz_<version>_<debarch>.deb and DIR/ployz-<version>-linux-<arch>.tar.gz and prints
# one line per artefact: its path and size. The package's metadata and maintainer scripts are
# packaging/debian/; the unit, the installer and the configuration are the ones the CLI copies to
# hosts (packaging/ployz.service, packaging/install.sh, configs/daemon.toml). docs/install.md
# describes both artefacts.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
pkg="$repo/packaging"

die() {
    echo "package.sh: $*" >&2
    exit 1
}

usage() {
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
}

bin=""
version=""
out=""
fast=no
while [ $# -gt 0 ]; do
    case "$1" in
        --bin | --version | --out)
            if [ $# -lt 2 ] || [ -z "$2" ]; then die "$1 needs a value"; fi
            case "$1" in
                --bin) bin=$2 ;;
                --version) version=$2 ;;
                --out) out=$2 ;;
            esac
            shift 2
            ;;
        --bin=* ) bin=${1#--bin=}; shift ;;
        --version=*) version=${1#--version=}; shift ;;
        --out=*) out=${1#--out=}; shift ;;
        --fast) fast=yes; shift ;;
        -h | --help)
            usage
            exit 0
            ;;
        *) die "unknown argument '$1' (see --help)" ;;
    esac
done

# The tools, each with the Debian package that has it.
need() { # tool package
    command -v "$1" >/dev/null 2>&1 || die "$1 not found: install the Debian package $2"
}
need dpkg-deb dpkg
need dpkg dpkg
need strip binutils
need objdump binutils
need gzip gzip
need tar tar
need md5sum coreutils

for f in "$pkg/ployz.service" "$pkg/install.sh" "$pkg/ployz.1" "$pkg/README.tarball" \
    "$repo/configs/daemon.toml" "$pkg/debian/control.in" "$pkg/debian/conffiles" \
    "$pkg/debian/copyright" "$pkg/debian/changelog.in" "$pkg/debian/postinst" \
    "$pkg/debian/prerm" "$pkg/debian/postrm" "$pkg/debian/lintian-overrides"; do
    [ -f "$f" ] || die "$f is missing"
done

if [ -z "$version" ]; then
    version=$(sed -n '/^\[workspace.package\]/,/^\[/s/^version *= *"\(.*\)"/\1/p' "$repo/Cargo.toml" | head -n 1)
    [ -n "$version" ] || die "no version in $repo/Cargo.toml's [workspace.package]: give --version"
fi
# A Debian version: an upstream part starting with a digit, maybe a revision after the last '-'.
[[ "$version" =~ ^[0-9][A-Za-z0-9.+~-]*$ ]] \
    || die "'$version' is not a Debian version (digits first, then letters, digits and .+~-)"

if [ -z "$bin" ]; then
    bin="$repo/target/release/ployz"
    if [ ! -e "$bin" ]; then
        need cargo "cargo (or rustup)"
        echo "package.sh: $bin is missing; cargo build --release --locked -p ployz" >&2
        (cd "$repo" && cargo build --release --locked -p ployz) || die "cargo build --release failed"
    fi
fi
[ -e "$bin" ] || die "the executable $bin is missing (build it, or give --bin PATH)"
if [ ! -f "$bin" ] || [ ! -x "$bin" ]; then die "$bin is not an executable file"; fi
objdump -f "$bin" >/dev/null 2>&1 || die "$bin is not an executable objdump can read"

out=${out:-$repo/target/package}
mkdir -p "$out"
out=$(cd "$out" && pwd)

debarch=$(dpkg --print-architecture)
arch=$(uname -m)

# One timestamp for every file, so two builds of one executable give the same archives.
if [ -z "${SOURCE_DATE_EPOCH:-}" ]; then
    SOURCE_DATE_EPOCH=$(git -C "$repo" log -1 --format=%ct 2>/dev/null || true)
    [ -n "$SOURCE_DATE_EPOCH" ] || SOURCE_DATE_EPOCH=$(date +%s)
fi
export SOURCE_DATE_EPOCH

work=$(mktemp -d "${TMPDIR:-/tmp}/ployz-package.XXXXXX")
trap 'rm -rf "$work"' EXIT
umask 022

# The executable, stripped as dh_strip does, on a copy.
stripped="$work/ployz"
cp "$bin" "$stripped"
chmod 0755 "$stripped"
strip --strip-unneeded --remove-section=.comment --remove-section=.note "$stripped" \
    || die "strip failed on a copy of $bin"

# The package's Depends: what the executable links, as dpkg-shlibdeps computes it (it wants a
# debian/control, so it runs in a directory of its own); without dpkg-dev, from the ELF header.
depends_of() { # executable
    local exe=$1
    if command -v dpkg-shlibdeps >/dev/null 2>&1; then
        local dir="$work/shlibdeps"
        mkdir -p "$dir/debian"
        printf 'Source: ployz\n\nPackage: ployz\nArchitecture: any\n' >"$dir/debian/control"
        cp "$exe" "$dir/ployz"
        local line
        line=$(cd "$dir" && dpkg-shlibdeps -O -e ployz 2>"$dir/stderr") \
            || die "dpkg-shlibdeps failed: $(cat "$dir/stderr")"
        line=${line#shlibs:Depends=}
        [ -n "$line" ] || die "dpkg-shlibdeps found no dependency for $exe"
        echo "$line"
        return
    fi
    local needed glibc deps=() lib
    needed=$(objdump -p "$exe" | awk '$1 == "NEEDED" { print $2 }')
    glibc=$(objdump -T "$exe" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -u -V | tail -n 1)
    for lib in $needed; do
        case "$lib" in
            libc.so.* | libm.so.* | libpthread.so.* | libdl.so.* | librt.so.* | ld-linux*)
                deps+=("libc6${glibc:+ (>= $glibc)}")
                ;;
            libgcc_s.so.1) deps+=("libgcc-s1") ;;
            *) die "$exe links $lib, which needs dpkg-shlibdeps: install the Debian package dpkg-dev" ;;
        esac
    done
    [ ${#deps[@]} -gt 0 ] || die "$exe links no libc: a static executable needs no Depends, which this script does not expect"
    printf '%s\n' "${deps[@]}" | sort -u | paste -sd, - | sed 's/,/, /g'
}
depends="$(depends_of "$stripped"), passwd"

date_rfc2822=$(LC_ALL=C date -u -R -d "@$SOURCE_DATE_EPOCH")

# ---- the Debian package ----------------------------------------------------------------------
root="$work/deb"
mkdir -p "$root/DEBIAN" "$root/usr/bin" "$root/lib/systemd/system" "$root/etc/ployz" \
    "$root/usr/share/doc/ployz" "$root/usr/share/man/man1"
install -m 0755 "$stripped" "$root/usr/bin/ployz"
install -m 0644 "$pkg/ployz.service" "$root/lib/systemd/system/ployz.service"
install -m 0644 "$repo/configs/daemon.toml" "$root/etc/ployz/daemon.toml"
install -m 0644 "$pkg/debian/copyright" "$root/usr/share/doc/ployz/copyright"
install -D -m 0644 "$pkg/debian/lintian-overrides" "$root/usr/share/lintian/overrides/ployz"
# A native package's changelog is changelog.gz; with a Debian revision, changelog.Debian.gz.
changelog=changelog.gz
[[ "$version" == *-* ]] && changelog=changelog.Debian.gz
sed -e "s/@VERSION@/$version/g" -e "s/@DATE@/$date_rfc2822/g" "$pkg/debian/changelog.in" \
    | gzip -9n >"$root/usr/share/doc/ployz/$changelog"
chmod 0644 "$root/usr/share/doc/ployz/$changelog"
gzip -9n <"$pkg/ployz.1" >"$root/usr/share/man/man1/ployz.1.gz"
chmod 0644 "$root/usr/share/man/man1/ployz.1.gz"

for script in postinst prerm postrm; do
    install -m 0755 "$pkg/debian/$script" "$root/DEBIAN/$script"
done
install -m 0644 "$pkg/debian/conffiles" "$root/DEBIAN/conffiles"
while read -r conffile; do
    [ -z "$conffile" ] || [ -f "$root$conffile" ] || die "conffile $conffile is not in the package"
done <"$pkg/debian/conffiles"

# md5sums of every file but the conffiles (dpkg keeps theirs itself), as dh_md5sums writes it.
(
    cd "$root"
    find . -path ./DEBIAN -prune -o -type f -print | sed 's|^\./||' | LC_ALL=C sort \
        | grep -v -x -F -f <(sed 's|^/||' "$pkg/debian/conffiles") \
        | xargs -r -d '\n' md5sum
) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/md5sums"

# Installed-Size in KiB, as dpkg-gencontrol counts it: each file rounded up, each directory 1.
installed_size=$(cd "$root" && find . -path ./DEBIAN -prune -o -mindepth 1 -print0 \
    | xargs -0 stat -c '%F %s' \
    | awk '$1 == "directory" { n += 1; next } { n += int(($NF + 1023) / 1024) } END { print n }')

sed -e "s/@VERSION@/$version/" -e "s/@ARCH@/$debarch/" -e "s/@DEPENDS@/$depends/" \
    -e "s/@INSTALLED_SIZE@/$installed_size/" "$pkg/debian/control.in" >"$root/DEBIAN/control"
chmod 0644 "$root/DEBIAN/control"
! grep -q '@[A-Z_]*@' "$root/DEBIAN/control" || die "a placeholder is left in DEBIAN/control"

find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
deb="$out/ployz_${version}_${debarch}.deb"
rm -f "$deb"
xz_level=6
gzip_level=9
if [ "$fast" = yes ]; then
    xz_level=1
    gzip_level=1
fi
dpkg-deb --root-owner-group -Zxz -z"$xz_level" --build "$root" "$deb" >/dev/null \
    || die "dpkg-deb --build failed"

# ---- the tarball -----------------------------------------------------------------------------
top="ployz-$version-linux-$arch"
tdir="$work/tar/$top"
mkdir -p "$tdir"
install -m 0755 "$stripped" "$tdir/ployz"
install -m 0644 "$pkg/ployz.service" "$tdir/ployz.service"
install -m 0644 "$repo/configs/daemon.toml" "$tdir/daemon.toml"
install -m 0755 "$pkg/install.sh" "$tdir/install.sh"
sed -e "s/@VERSION@/$version/g" "$pkg/README.tarball" >"$tdir/README"
chmod 0644 "$tdir/README"
chmod 0755 "$tdir"
tarball="$out/$top.tar.gz"
tar -C "$work/tar" --sort=name --owner=0 --group=0 --numeric-owner \
    --mtime="@$SOURCE_DATE_EPOCH" -cf - "$top" | gzip -"$gzip_level" -n >"$tarball.tmp"
mv -f "$tarball.tmp" "$tarball"

for f in "$deb" "$tarball"; do
    printf '%s\t%s bytes\n' "$f" "$(stat -c %s "$f")"
done
