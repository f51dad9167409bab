#!/usr/bin/env bash
# Time from `ployz deploy -y` to "all Serving" (running, with a Container Address, healthy or
# without a healthcheck) for one Service of one replica with `monitor: 0`, on this Machine's
# real Docker. Starts its own daemon in a temp dir and removes everything it made.
#
# Usage: bench/deploy_latency.sh [ROUNDS]   (needs target/release/ployz and a running dockerd)
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${1:-10}"
PLOYZ="$PWD/target/release/ployz"
[ -x "$PLOYZ" ] || cargo build --release -q -p ployz
scripts/make-busybox-image.sh ployz-bench/busybox:1

work="$(mktemp -d)"
"$PLOYZ" daemon run --data-dir "$work/data" --socket "$work/ployz.sock" 2>"$work/daemon.log" &
daemon=$!
export PLOYZ_CONNECT="unix://$work/ployz.sock"
cleanup() {
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
    command: ["sleep", "3600"]
    pull_policy: never
    deploy:
      update_config:
        monitor: 0s
YAML

now_ms() { date +%s%3N; }
times=()
for i in $(seq 1 "$ROUNDS"); do
  "$PLOYZ" rm lat -y >/dev/null 2>&1 || true
  start=$(now_ms)
  "$PLOYZ" deploy -f "$work/compose.yaml" -y >/dev/null 2>&1
  until "$PLOYZ" ps --json | grep -q '"state": "running"'; do sleep 0.01; done
  times+=($(( $(now_ms) - start )))
done
sorted=($(printf '%s\n' "${times[@]}" | sort -n))
n=${#sorted[@]}
echo "deploy -> all Serving over $n rounds: median ${sorted[$((n / 2))]} ms, min ${sorted[0]} ms, max ${sorted[$((n - 1))]} ms"
