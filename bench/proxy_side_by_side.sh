#!/usr/bin/env bash
# The edge against nginx, haproxy and Caddy in one run, on loopback, through the shared script
# ../shared/bench/proxy_bench.sh (it installs the peers and wrk, and ends what it starts by PID).
# The edge runs alone (`edge-bench`: the daemon's proxy code with one fixed route to the script's
# upstream) and, like the peers' configurations there, without an access log.
#
# Usage: bench/proxy_side_by_side.sh   (knobs of proxy_bench.sh apply: DURATION, RUNS, CONNS...)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p ployz-bench --bin edge-bench
SHARED="${SHARED_DIR:-$PWD/../shared}"
export CANDIDATE_NAME=ployz-edge
export CANDIDATE_PORT="${CANDIDATE_PORT:-18090}"
export CANDIDATE_HEALTH_PATH=/.ployz/health
# Expanded by the benchmark script, which exports UPSTREAM_ADDR, ROUTE_HOST and WORKERS.
export CANDIDATE_CMD="$PWD/target/release/edge-bench --listen 127.0.0.1:\$CANDIDATE_PORT --route \$ROUTE_HOST=\$UPSTREAM_ADDR --threads \$WORKERS"
# Linux's autogroup scheduler shares CPU between sessions, not threads. The shared script starts
# the candidate in a session of its own (setsid) and the references in the load generator's, so
# under load the candidate gets half the machine and the references share theirs with the load
# generator thread by thread: measured here, either server loses about half its throughput when
# placed apart from the load generator. For the run, every process is scheduled alike.
AUTOGROUP=/proc/sys/kernel/sched_autogroup_enabled
if [ -w "$AUTOGROUP" ] && [ "$(cat "$AUTOGROUP")" = 1 ]; then
  echo 0 >"$AUTOGROUP"
  trap 'echo 1 >"$AUTOGROUP"' EXIT
fi
bash "$SHARED/bench/proxy_bench.sh"
