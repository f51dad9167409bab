#!/usr/bin/env bash
# The internal DNS against Knot and Unbound in one run, on loopback, through the shared script
# ../shared/bench/dns_bench.sh (it installs the references and dnsperf, and ends what it starts
# by PID). The candidate is `dns/examples/serve_zone`: the daemon's DNS server code answering the
# benchmark's `internal.` zone from a snapshot and forwarding every other name to Knot.
#
# Usage: bench/dns_side_by_side.sh   (knobs of dns_bench.sh apply: DURATION, RUNS, REFS...)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p ployz-dns --example serve_zone
SHARED="${SHARED_DIR:-$PWD/../shared}"
export CANDIDATE_NAME=ployz-dns
export CANDIDATE_PORT="${CANDIDATE_PORT:-15360}"
# Expanded by the benchmark script, which exports ZONE_FILE, FORWARD_UPSTREAM and WORKERS.
export CANDIDATE_CMD="$PWD/target/release/examples/serve_zone --zone \$ZONE_FILE --listen 127.0.0.1:\$CANDIDATE_PORT --forward \$FORWARD_UPSTREAM"
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
bash "$SHARED/bench/dns_bench.sh"
