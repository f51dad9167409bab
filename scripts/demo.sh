#!/usr/bin/env bash
# Sets up a Debian machine (as root), builds Ployz, runs the daemon with its embedded default
# configuration in ./demo-data, initialises this Machine, deploys the demo app from
# configs/demo/compose.yaml and shows it answering. The daemon keeps running in the foreground:
# Ctrl-C stops it (the demo's containers keep running; `ployz rm hello -y` removes them).
#
# Every listener the demo opens has a knob (environment variable, default):
#   EDGE_LISTEN      127.0.0.1:80     the edge's HTTP listener
#   EDGE_TLS_LISTEN  127.0.0.1:443    the edge's HTTPS listener
#   METRICS_LISTEN   127.0.0.1:51090  Prometheus metrics
#   DNS_LISTEN       gateway          the internal DNS: the Machine Gateway's port 53, ADDR:PORT, or off
#   PLOYZ_DEMO_DIR   ./demo-data      data dir and management socket
set -euo pipefail
cd "$(dirname "$0")/.."
PLOYZ_SETUP=demo source scripts/setup.sh
ployz_ensure_dockerd

echo "==> building ployz (release)"
cargo build --release --locked -p ployz
PLOYZ="$PWD/target/release/ployz"
DEMO="${PLOYZ_DEMO_DIR:-$PWD/demo-data}"
mkdir -p "$DEMO"
SOCKET="$DEMO/ployz.sock"
export PLOYZ_CONNECT="unix://$SOCKET"

EDGE="${EDGE_LISTEN:-127.0.0.1:80}"
EDGE_TLS="${EDGE_TLS_LISTEN:-127.0.0.1:443}"
METRICS="${METRICS_LISTEN:-127.0.0.1:51090}"
DNS="${DNS_LISTEN:-gateway}"
DAEMON_ARGS=(daemon run --data-dir "$DEMO/data" --socket "$SOCKET" --http-listen "$EDGE"
  --https-listen "$EDGE_TLS" --metrics-listen "$METRICS" --dns-listen "$DNS")
echo "==> starting: ployz ${DAEMON_ARGS[*]}"
"$PLOYZ" "${DAEMON_ARGS[@]}" &
DAEMON=$!
trap 'kill -TERM $DAEMON 2>/dev/null; wait $DAEMON 2>/dev/null' EXIT INT TERM
for _ in $(seq 1 100); do
  [ -S "$SOCKET" ] && "$PLOYZ" version >/dev/null 2>&1 && break
  if ! kill -0 "$DAEMON" 2>/dev/null; then
    echo "the daemon exited; its message is above (a listener in use? see the knobs at the top of $0)" >&2
    exit 1
  fi
  sleep 0.1
done

# The whole answer first, then the match: `grep -q` closing the pipe early must not decide it.
version="$("$PLOYZ" version --json)"
if grep -q '"phase": "uninitialized"' <<<"$version"; then
  "$PLOYZ" machine init --name demo
fi
echo
"$PLOYZ" machine ls
echo

scripts/make-busybox-image.sh ployz-demo/busybox:1
echo "==> ployz deploy -f configs/demo/compose.yaml -y"
"$PLOYZ" deploy -f configs/demo/compose.yaml -y
echo
"$PLOYZ" ls
echo
echo "==> curl -H 'Host: hello.localhost' http://$EDGE/   (through the edge, twice: two containers)"
for _ in $(seq 1 50); do
  curl -fsS -H "Host: hello.localhost" "http://$EDGE/" && break
  sleep 0.2
done
curl -fsS -H "Host: hello.localhost" "http://$EDGE/" || true
echo
echo "The daemon runs (PID $DAEMON). In another shell:"
echo "  export PLOYZ_CONNECT=unix://$SOCKET"
echo "  $PLOYZ ps; $PLOYZ logs hello; $PLOYZ exec hello -- wget -qO- http://127.0.0.1:8080/"
echo "Ctrl-C stops the daemon."
wait $DAEMON
