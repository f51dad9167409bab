#!/usr/bin/env bash
# Sets up a Debian machine (as root), builds Ployz, runs the daemon with its embedded default
# configuration in ./demo-data, initialises this Machine and shows it. The daemon keeps running
# in the foreground: Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh

echo "==> building ployz (release)"
cargo build --release --locked -p ployz
PLOYZ="$PWD/target/release/ployz"
DEMO="${PLOYZ_DEMO_DIR:-$PWD/demo-data}"
mkdir -p "$DEMO"
SOCKET="$DEMO/ployz.sock"
export PLOYZ_CONNECT="unix://$SOCKET"

echo "==> starting: ployz daemon run --data-dir $DEMO/data --socket $SOCKET"
"$PLOYZ" daemon run --data-dir "$DEMO/data" --socket "$SOCKET" &
DAEMON=$!
trap 'kill -TERM $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 100); do
  [ -S "$SOCKET" ] && "$PLOYZ" version >/dev/null 2>&1 && break
  sleep 0.1
done

if "$PLOYZ" version --json | grep -q '"phase": "uninitialized"'; then
  "$PLOYZ" machine init --name demo
fi
echo
"$PLOYZ" machine ls
echo
echo "The daemon runs (PID $DAEMON). In another shell:"
echo "  export PLOYZ_CONNECT=unix://$SOCKET"
echo "  $PLOYZ machine ls"
echo "Ctrl-C stops it."
wait $DAEMON
