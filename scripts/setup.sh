#!/usr/bin/env bash
# Installs what building and testing Ployz needs on Debian, as root. Idempotent: packages
# already present are not fetched again. Sourced by demo.sh (PLOYZ_SETUP=demo: the demo's
# packages only) and test.sh (everything).
set -euo pipefail

# What building Ployz and running the demo need.
PLOYZ_DEMO_PACKAGES=(
  build-essential cmake pkg-config   # pingora's zlib-ng and ring build C
  docker.io                          # the Docker engine Service Containers run on
  busybox-static                     # the demo image is made from it with `docker import`
  curl ca-certificates tar
)
# What the test suite needs on top.
PLOYZ_TEST_PACKAGES=(
  pebble                             # Let's Encrypt's ACME test server
  openssh-server openssh-client      # the ssh transport's end-to-end test
  wireguard-tools                    # `wg` reads the mesh's interfaces
  dnsutils                           # dig, for DNS tests
  docker-compose                     # the reference the Compose loader is compared with
  iproute2 iptables procps psmisc openssl   # the lab: network namespaces, firewalls
  systemd sudo                       # the lab's host Machines run systemd; a non-root SSH user
  lintian                            # the package is checked as Debian checks packages
)

# ployz_install_packages PACKAGE... installs those of the named Debian packages that are missing.
ployz_install_packages() {
  local missing=()
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "==> installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
  fi
}

ployz_ensure_rust() {
  if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
  if ! command -v cargo >/dev/null 2>&1; then
    echo "==> installing the Rust toolchain with rustup"
    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y --profile minimal --component clippy,rustfmt
    export PATH="$HOME/.cargo/bin:$PATH"
  fi
}

# Starts dockerd when none answers; its log goes to /var/log/ployz-dockerd.log.
ployz_ensure_dockerd() {
  if docker info >/dev/null 2>&1; then
    return
  fi
  echo "==> starting dockerd"
  nohup dockerd >/var/log/ployz-dockerd.log 2>&1 &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && return
    sleep 0.5
  done
  echo "dockerd did not start; see /var/log/ployz-dockerd.log" >&2
  exit 1
}

if [ "$(id -u)" -ne 0 ]; then
  echo "run this as root (it installs packages and starts services): sudo $0" >&2
  exit 1
fi
# PLOYZ_SETUP=demo (demo.sh) installs only what the demo needs; anything else, the test suite's too.
if [ "${PLOYZ_SETUP:-test}" = demo ]; then
  ployz_install_packages "${PLOYZ_DEMO_PACKAGES[@]}"
else
  ployz_install_packages "${PLOYZ_DEMO_PACKAGES[@]}" "${PLOYZ_TEST_PACKAGES[@]}"
fi
ployz_ensure_rust
