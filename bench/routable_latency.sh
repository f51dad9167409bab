#!/usr/bin/env bash
# Time from a container turning healthy (Docker's health_status event) to the edge answering
# through it: the observer's debounce, the store write, the route table rebuild and publish.
# One Service, one replica with a 1 s healthcheck, on this Machine's real Docker; the daemon is
# its own, on loopback ports, and everything it made is removed.
#
# Usage: bench/routable_latency.sh [ROUNDS]   (needs a running dockerd; builds target/release/ployz)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-5}"
PLOYZ="$PWD/target/release/ployz"
cargo build --release -q -p ployz
scripts/make-busybox-image.sh ployz-bench/busybox:1
PORT="${PORT:-18380}"

work="$(mktemp -d)"
"$PLOYZ" daemon run --data-dir "$work/data" --socket "$work/ployz.sock" \
  --http-listen "127.0.0.1:$PORT" --https-listen 127.0.0.1:$((PORT + 1)) \
  --metrics-listen 127.0.0.1:$((PORT + 2)) --no-certificates --dns-listen off --no-mesh \
  --no-access-log 2>"$work/daemon.log" &
daemon=$!
export PLOYZ_CONNECT="unix://$work/ployz.sock"
events=""
cleanup() {
  [ -n "$events" ] && kill "$events" 2>/dev/null || true
  "$PLOYZ" rm lat -y >/dev/null 2>&1 || true
  kill -TERM "$daemon" 2>/dev/null || true
  for _ in $(seq 1 50); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$daemon" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 1 100); do "$PLOYZ" version >/dev/null 2>&1 && break; sleep 0.05; done
"$PLOYZ" machine init --name bench >/dev/null

cat > "$work/compose.yaml" <<'YAML'
services:
  lat:
    image: ployz-bench/busybox:1
    command: ["sh", "-c", "echo ok > /index.html && exec httpd -f -p 8080 -h /"]
    pull_policy: never
    healthcheck:
      test: ["CMD", "wget", "-q", "-O-", "http://127.0.0.1:8080/"]
      interval: 1s
      start_period: 0s
    x-ports:
      - lat.localhost:8080/http
YAML

times=()
for i in $(seq 1 "$ROUNDS"); do
  "$PLOYZ" rm lat -y >/dev/null 2>&1 || true
  : >"$work/events"
  docker events --filter type=container --format '{{.TimeNano}} {{.Action}}' >"$work/events" &
  events=$!
  sleep 0.3
  "$PLOYZ" deploy -f "$work/compose.yaml" -y >/dev/null 2>&1 &
  deploy=$!
  until [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Host: lat.localhost' "http://127.0.0.1:$PORT/")" = 200 ]; do
    sleep 0.002
  done
  routable=$(date +%s%N)
  wait "$deploy" || true
  kill "$events" 2>/dev/null; wait "$events" 2>/dev/null || true; events=""
  healthy=$(awk '/health_status: healthy/ {print $1; exit}' "$work/events")
  [ -n "$healthy" ] || { echo "round $i: no health_status event seen" >&2; continue; }
  times+=($(( (routable - healthy) / 1000000 )))
done
sorted=($(printf '%s\n' "${times[@]}" | sort -n))
n=${#sorted[@]}
echo "healthy -> routable over $n rounds: median ${sorted[$((n / 2))]} ms, min ${sorted[0]} ms, max ${sorted[$((n - 1))]} ms"
