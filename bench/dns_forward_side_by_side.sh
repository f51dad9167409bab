#!/usr/bin/env bash
# Forwarded DNS side by side: the daemon's DNS server code (`dns/examples/serve_zone`) and Unbound,
# both forwarding every name to the same upstream (Knot, authoritative for `example.`), measured
# with dnsperf on loopback, in two workloads:
#
#   cached    200 names asked over and over (`hostN.example A`): a forwarder with a cache answers
#             nearly all of them itself;
#   uncached  names never asked before (`<run>-<target>-N.example A`, NXDOMAIN from Knot), a new
#             set for every run and target: every query goes to the upstream.
#
# RUNS interleaved runs per target and workload (median reported, every run's figure too), CPU
# per answered query from /proc, autogroup scheduling off for the run (restored). Everything
# listens on 127.0.0.1 and every process started here is ended by its PID.
#
# Usage: bench/dns_forward_side_by_side.sh   (knobs: DURATION [10], RUNS [3], CLIENTS [8],
#        OUTSTANDING [200], WORKERS [nproc], BASE_PORT [15453])
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
RUNS=${RUNS:-3}
CLIENTS=${CLIENTS:-8}
OUTSTANDING=${OUTSTANDING:-200}
WORKERS=${WORKERS:-$(nproc)}
BASE_PORT=${BASE_PORT:-15453}
KNOT_PORT=$BASE_PORT
UNBOUND_PORT=$((BASE_PORT + 1))
PLOYZ_PORT=$((BASE_PORT + 2))
# Queries one uncached run may send at most (a file larger than a run can use).
UNCACHED_NAMES=${UNCACHED_NAMES:-$((DURATION * 150000))}

LOG_TAG=dns_forward
# shellcheck source=bench/lib.sh
source bench/lib.sh

bench_need knotd:knot unbound:unbound dnsperf:dnsperf dig:bind9-dnsutils
cargo build --release -q -p ployz-dns --example serve_zone

bench_begin dns_forward

mkdir -p "$WORK"/{knot/zones,knot/db,unbound,raw}
{
  echo "\$ORIGIN example."
  echo "\$TTL 300"
  echo "@ IN SOA ns.example. hostmaster.example. 1 3600 600 86400 300"
  echo "@ IN NS ns.example."
  echo "ns IN A 127.0.0.1"
  for ((i = 1; i <= 200; i++)); do echo "host$i IN A 10.88.$((i / 250)).$((i % 250 + 1))"; done
} >"$WORK/knot/zones/example.zone"
# The benchmark zone for `.internal` (serve_zone wants one); not asked here.
printf '$ORIGIN internal.\n$TTL 300\n@ IN SOA ns.internal. h.internal. 1 3600 600 86400 300\nns IN A 127.0.0.1\n' \
  >"$WORK/internal.zone"
awk 'BEGIN { srand(43); for (i = 0; i < 20000; i++) printf "host%d.example A\n", int(rand() * 200) + 1 }' \
  >"$WORK/q_cached.txt"

cat >"$WORK/knot/knot.conf" <<EOF
server:
    rundir: "$WORK/knot"
    listen: 127.0.0.1@$KNOT_PORT
    udp-workers: $WORKERS
    tcp-workers: 1
    background-workers: 1
log:
  - target: stderr
    any: warning
database:
    storage: "$WORK/knot/db"
template:
  - id: default
    storage: "$WORK/knot/zones"
    zonefile-sync: -1
    journal-content: none
zone:
  - domain: example.
EOF
cat >"$WORK/unbound/unbound.conf" <<EOF
server:
    interface: 127.0.0.1@$UNBOUND_PORT
    port: $UNBOUND_PORT
    do-daemonize: no
    username: ""
    chroot: ""
    directory: "$WORK/unbound"
    pidfile: "$WORK/unbound/unbound.pid"
    use-syslog: no
    logfile: ""
    verbosity: 0
    num-threads: $WORKERS
    so-reuseport: yes
    access-control: 127.0.0.0/8 allow
    do-not-query-localhost: no
    module-config: "iterator"
    qname-minimisation: no
remote-control:
    control-enable: no
forward-zone:
    name: "."
    forward-addr: 127.0.0.1@$KNOT_PORT
EOF

wait_dns() { # port
  for _ in $(seq 1 100); do
    [ -n "$(dig +short +time=1 +tries=1 @127.0.0.1 -p "$1" host1.example A 2>/dev/null)" ] && return 0
    sleep 0.2
  done
  log "nothing answers on port $1"; return 1
}
knotd -c "$WORK/knot/knot.conf" >"$WORK/knot.log" 2>&1 &
PIDS+=($!); KNOT_PID=$!
wait_dns "$KNOT_PORT"
unbound -d -c "$WORK/unbound/unbound.conf" >"$WORK/unbound.log" 2>&1 &
PIDS+=($!); UNBOUND_PID=$!
target/release/examples/serve_zone --zone "$WORK/internal.zone" --listen "127.0.0.1:$PLOYZ_PORT" \
  --forward "127.0.0.1:$KNOT_PORT" >"$WORK/ployz.log" 2>&1 &
PIDS+=($!); PLOYZ_PID=$!
wait_dns "$UNBOUND_PORT"
wait_dns "$PLOYZ_PORT"

port_of() { case $1 in unbound) echo "$UNBOUND_PORT" ;; ployz) echo "$PLOYZ_PORT" ;; esac; }
pid_of() { case $1 in unbound) echo "$UNBOUND_PID" ;; ployz) echo "$PLOYZ_PID" ;; esac; }

: >"$WORK/metrics.txt"
run() { # target workload run
  local t=$1 w=$2 r=$3 file="$WORK/q_cached.txt" out="$WORK/raw/$1.$2.$3.txt" c0 c1
  if [ "$w" = uncached ]; then
    file="$WORK/q_uncached_$t$r.txt"
    awk -v n="$UNCACHED_NAMES" -v tag="r$r$t" 'BEGIN { for (i = 0; i < n; i++) printf "%s-%d.example A\n", tag, i }' >"$file"
  fi
  c0=$(cpu_ticks "$(pid_of "$t")")
  dnsperf -s 127.0.0.1 -p "$(port_of "$t")" -d "$file" -l "$DURATION" -c "$CLIENTS" -T 2 \
    -q "$OUTSTANDING" -t 2 >"$out" 2>&1
  c1=$(cpu_ticks "$(pid_of "$t")")
  [ "$w" = uncached ] && rm -f "$file"
  local qps completed lost sent cpu
  qps=$(awk '/Queries per second:/ {print $4}' "$out")
  completed=$(awk '/Queries completed:/ {print $3}' "$out")
  sent=$(awk '/Queries sent:/ {print $3}' "$out")
  lost=$(awk '/Queries lost:/ {print $3}' "$out")
  [ "$w" = uncached ] && [ "${sent:-0}" -ge "$UNCACHED_NAMES" ] && log "warning: $t used every uncached name; raise UNCACHED_NAMES"
  cpu=$(awk -v d=$((c1 - c0)) -v hz="$(getconf CLK_TCK)" -v n="${completed:-0}" 'BEGIN { if (n > 0) printf "%.2f", d * 1e6 / hz / n; else print "nan" }')
  echo "$t $w $r ${qps:-nan} ${lost:-nan} $cpu" >>"$WORK/metrics.txt"
  log "$(printf '%-8s %-9s run %d: %10s queries/s  lost %s  %s us CPU/query' "$t" "$w" "$r" "${qps:-nan}" "${lost:-nan}" "$cpu")"
}

# Warm-up: both caches hold the cached set, as a forwarder's would in a steady state.
for t in unbound ployz; do
  dnsperf -s 127.0.0.1 -p "$(port_of "$t")" -d "$WORK/q_cached.txt" -l 2 -c "$CLIENTS" -q "$OUTSTANDING" -t 2 >/dev/null 2>&1
done
for ((r = 1; r <= RUNS; r++)); do
  for w in cached uncached; do
    for t in unbound ployz; do run "$t" "$w" "$r"; done
  done
done

echo
echo "## forwarded DNS $(date -u +%Y-%m-%dT%H:%M:%SZ) cpus=$(nproc); dnsperf -c $CLIENTS -T 2 -q $OUTSTANDING -l $DURATION, $RUNS interleaved runs, median; upstream Knot $(knotd -V 2>&1 | awk '{print $NF}'), Unbound $(unbound -V 2>/dev/null | awk '/^Version/ {print $2}'), $WORKERS workers each"
echo "| target | workload | queries/s (median) | CPU µs per query | lost | runs |"
echo "|---|---|---|---|---|---|"
for w in cached uncached; do
  for t in unbound ployz; do
    q=$(awk -v t="$t" -v w="$w" '$1==t && $2==w {print $4}' "$WORK/metrics.txt" | median)
    c=$(awk -v t="$t" -v w="$w" '$1==t && $2==w {print $6}' "$WORK/metrics.txt" | median)
    l=$(awk -v t="$t" -v w="$w" '$1==t && $2==w {x+=$5} END {print x+0}' "$WORK/metrics.txt")
    all=$(awk -v t="$t" -v w="$w" '$1==t && $2==w {printf "%s%.0f", (n++ ? "/" : ""), $4}' "$WORK/metrics.txt")
    printf '| %s | %s | %.0f | %s | %s | %s |\n' "$t" "$w" "$q" "$c" "$l" "$all"
  done
  u=$(awk -v w="$w" '$1=="unbound" && $2==w {print $4}' "$WORK/metrics.txt" | median)
  p=$(awk -v w="$w" '$1=="ployz" && $2==w {print $4}' "$WORK/metrics.txt" | median)
  awk -v u="$u" -v p="$p" -v w="$w" 'BEGIN { printf "ratio ployz/unbound, %s: %.2f\n", w, p / u }' >&2
done
