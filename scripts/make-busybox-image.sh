#!/usr/bin/env bash
# Makes a tiny image from Debian's busybox-static with `docker import` (no registry needed):
# sh, httpd, wget, nc, nslookup, sleep... Usage: make-busybox-image.sh TAG
set -euo pipefail
tag="${1:?usage: $0 TAG}"
if docker image inspect "$tag" >/dev/null 2>&1; then
  exit 0
fi
root="$(mktemp -d)"
trap 'rm -rf "$root" "$root.tar"' EXIT
mkdir -p "$root/bin" "$root/tmp" "$root/www" "$root/etc"
echo "root:x:0:0:root:/:/bin/sh" > "$root/etc/passwd"
cp /bin/busybox "$root/bin/busybox"
for applet in $(/bin/busybox --list); do
  [ "$applet" = busybox ] || ln -s busybox "$root/bin/$applet"
done
tar -C "$root" -cf "$root.tar" .
docker import "$root.tar" "$tag" >/dev/null
echo "==> made image $tag"
