#!/usr/bin/env bash
# Two builds of `edge-bench` taking turns in front of the same upstream, for a change whose
# effect the spread between side-by-side runs would hide: requests/s, the edge's CPU per
# request, and how busy the machine's CPUs were. Under a closed-loop load every CPU stays busy
# unless every process is waiting on another, so idle time is time lost to how the processes
# wake each other.
#
# One nginx worker upstream answering `return 200`; each run starts the build afresh with
# `--threads THREADS`, warms up for 2 s, then loads it for DURATION seconds: wrk -t2 -c64
# (HTTP/1.1 keep-alive, PROTOCOL=http1) or h2load -c16 -m10 -t2 over TLS with a self-signed
# ECDSA certificate (PROTOCOL=h2). The builds alternate, RUNS times each, and the medians close
# the report.
#
# Usage: [PROTOCOL=http1|h2] [RUNS=3] [DURATION=10] [THREADS=2] bench/edge_ab.sh OLD NEW
#        (OLD and NEW: edge-bench binaries, e.g. one built from another checkout; installs wrk,
#        nginx, nghttp2-client and openssl when missing)
set -euo pipefail
cd "$(dirname "$0")/.."
LOG_TAG=edge-ab
# shellcheck source=bench/lib.sh
source bench/lib.sh
if [ $# -ne 2 ] || [ ! -x "$1" ] || [ ! -x "$2" ]; then
  echo "usage: bench/edge_ab.sh OLD_EDGE_BENCH NEW_EDGE_BENCH (two executable edge-bench builds)" >&2
  exit 2
fi
OLD=$1 NEW=$2
PROTOCOL=${PROTOCOL:-http1} RUNS=${RUNS:-3} DURATION=${DURATION:-10} THREADS=${THREADS:-2}
case $PROTOCOL in http1 | h2) ;; *) echo "PROTOCOL must be http1 or h2, not '$PROTOCOL'" >&2; exit 2 ;; esac
bench_need wrk:wrk nginx:nginx h2load:nghttp2-client openssl:openssl
bench_begin edge-ab
UP=28810 EDGE=28811 EDGE_TLS=28812
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -keyout "$WORK/key.pem" -out "$WORK/cert.pem" -subj "/CN=localhost" \
  -addext "subjectAltName=DNS:localhost" 2>/dev/null
bench_upstream_nginx "$UP" "hello from upstream"

# Busy and idle jiffies of all CPUs so far (idle counts neither iowait nor steal).
cpu_busy_idle() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8, $5 }' /proc/stat; }

# load SECONDS: the load of PROTOCOL for SECONDS; prints "requests requests_per_second".
load() {
  if [ "$PROTOCOL" = h2 ]; then
    h2load -c16 -m10 -t2 -D "$1" "https://localhost:$EDGE_TLS/" |
      awk '/^finished in/ { rps = $4 } /^requests:/ { n = $8 } END { print n, rps }'
  else
    wrk -t2 -c64 -d"$1"s "http://localhost:$EDGE/" |
      awk '/ requests in / { n = $1 } /^Requests\/sec:/ { rps = $2 } END { print n, rps }'
  fi
}

declare -A RPS CPU BUSY
for run in $(seq 1 "$RUNS"); do
  for build in old new; do
    binary=$OLD
    [ "$build" = new ] && binary=$NEW
    "$binary" --listen "127.0.0.1:$EDGE" --route "localhost=127.0.0.1:$UP" --threads "$THREADS" \
      --tls-listen "127.0.0.1:$EDGE_TLS" --tls-cert "$WORK/cert.pem" --tls-key "$WORK/key.pem" \
      >"$WORK/$build.$run.log" 2>&1 &
    edge=$!
    PIDS+=("$edge")
    wait_port "$EDGE"
    wait_port "$EDGE_TLS"
    load 2 >/dev/null
    ticks0=$(cpu_ticks "$edge")
    read -r busy0 idle0 < <(cpu_busy_idle)
    read -r requests rps < <(load "$DURATION")
    read -r busy1 idle1 < <(cpu_busy_idle)
    ticks1=$(cpu_ticks "$edge")
    kill -TERM "$edge"
    for _ in $(seq 1 50); do kill -0 "$edge" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$edge" 2>/dev/null || true
    wait "$edge" 2>/dev/null || true
    tick=$(getconf CLK_TCK)
    cpu=$(awk -v t=$((ticks1 - ticks0)) -v n="$requests" -v hz="$tick" 'BEGIN { printf "%.1f", t / hz * 1e6 / n }')
    busy=$(awk -v b=$((busy1 - busy0)) -v i=$((idle1 - idle0)) 'BEGIN { printf "%.0f", 100 * b / (b + i) }')
    RPS[$build]+="$rps " CPU[$build]+="$cpu " BUSY[$build]+="$busy "
    log "run $run, $build ($binary): $rps requests/s, $cpu µs CPU per request, CPUs busy $busy%"
  done
done
for build in old new; do
  printf '%s: median %s requests/s, %s µs CPU per request, CPUs busy %s%% (runs: %s)\n' \
    "$build" "$(median <<<"${RPS[$build]}")" "$(median <<<"${CPU[$build]}")" \
    "$(median <<<"${BUSY[$build]}")" "${RPS[$build]% }"
done
