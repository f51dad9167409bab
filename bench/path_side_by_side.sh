#!/usr/bin/env bash
# Path-prefix routing against nginx, on loopback: ROUTES prefixes of one hostname
# (`/team-<i % 97>/svc-<i>/`), every one proxied to the same upstream (an nginx answering 200
# to every request), and wrk asking for a path deep under one of them
# (`/team-52/svc-731/orders/2026?page=2`).
#
#   nginx  one `location /team-../svc-../ { proxy_pass ...; }` per route (a prefix location,
#          as users write them), a keep-alive upstream pool, the forwarding fields the edge
#          adds, no access log
#   edge   `edge-bench` with one `--route HOST/team-../svc-../*=UPSTREAM` per route (the route
#          table `x-routes` builds: prefixes on a segment boundary), no access log
#
# Before measuring, both must pass the upstream's 200 on for the deep path and answer 404 for a
# path no route takes. RUNS interleaved runs (median, and every run's figure), CPU per request
# of the target's process tree from /proc, autogroup scheduling off for the run (restored).
# Everything listens on 127.0.0.1 and every process started here is ended by its PID.
#
# Usage: bench/path_side_by_side.sh   (knobs: DURATION [10], RUNS [5], WORKERS [nproc],
#        ROUTES [1000], BASE_PORT [18600])
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
RUNS=${RUNS:-5}
WORKERS=${WORKERS:-$(nproc)}
ROUTES=${ROUTES:-1000}
BASE_PORT=${BASE_PORT:-18600}
UP_PORT=$BASE_PORT
NGINX_PORT=$((BASE_PORT + 1))
EDGE_PORT=$((BASE_PORT + 2))
HOST=shop.localhost
TARGET_PATH="/team-$((731 % 97))/svc-731/orders/2026?page=2"
TARGETS=(nginx edge)
EXPECTED="hello from upstream"

LOG_TAG=path-routing
# shellcheck source=bench/lib.sh
source bench/lib.sh

bench_need nginx:nginx wrk:wrk curl:curl
cargo build --release -q -p ployz-bench --bin edge-bench

for p in "$UP_PORT" "$NGINX_PORT" "$EDGE_PORT"; do
  if (exec 3<>/dev/tcp/127.0.0.1/"$p") 2>/dev/null; then
    log "port $p is already in use; set BASE_PORT"
    exit 1
  fi
done
[ "$ROUTES" -gt 731 ] || { log "ROUTES must be over 731: the measured path is under route 731"; exit 1; }

bench_begin path_bench

# ---------------------------------------------------------------- servers
bench_upstream_nginx "$UP_PORT" "$EXPECTED"
mkdir -p "$WORK/nginx"
{
  cat <<EOF
worker_processes $WORKERS;
daemon off;
pid $WORK/nginx/nginx.pid;
error_log $WORK/nginx/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    upstream app_up { server 127.0.0.1:$UP_PORT; keepalive 256; }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        server_name $HOST;
        location / { return 404; }
EOF
  for ((i = 1; i <= ROUTES; i++)); do
    cat <<EOF
        location /team-$((i % 97))/svc-$i/ {
            proxy_pass http://app_up;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$http_host;
$(bench_nginx_forwarding)
        }
EOF
  done
  echo "    }"
  echo "}"
} >"$WORK/nginx/nginx.conf"
EDGE_ARGS=()
for ((i = 1; i <= ROUTES; i++)); do
  EDGE_ARGS+=(--route "$HOST/team-$((i % 97))/svc-$i/*=127.0.0.1:$UP_PORT")
done
nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >"$WORK/nginx.log" 2>&1 &
PIDS+=($!); NGINX_PID=$!
target/release/edge-bench --listen "127.0.0.1:$EDGE_PORT" "${EDGE_ARGS[@]}" \
  --threads "$WORKERS" >"$WORK/edge.log" 2>&1 &
PIDS+=($!); EDGE_PID=$!
wait_port "$NGINX_PORT"
wait_port "$EDGE_PORT"

port_of() { case $1 in nginx) echo "$NGINX_PORT" ;; edge) echo "$EDGE_PORT" ;; esac; }
pid_of() { case $1 in nginx) echo "$NGINX_PID" ;; edge) echo "$EDGE_PID" ;; esac; }

# ---------------------------------------------------------------- checks before measuring
for t in "${TARGETS[@]}"; do
  port=$(port_of "$t")
  body=$(curl -sS -H "Host: $HOST" "http://127.0.0.1:$port$TARGET_PATH") || body="(curl failed)"
  [ "$body" = "$EXPECTED" ] || { log "$t answered '$body' for $TARGET_PATH"; exit 1; }
  code=$(curl -sS -o /dev/null -w '%{http_code}' -H "Host: $HOST" "http://127.0.0.1:$port/team-46/nothing/") || code="(curl failed)"
  [ "$code" = 404 ] || { log "$t answered $code for a path no route takes"; exit 1; }
done

# ---------------------------------------------------------------- measuring
to_ms() { awk '{ v = $1; if (v ~ /us$/) { sub(/us$/, "", v); v /= 1000 } else if (v ~ /ms$/) sub(/ms$/, "", v); else if (v ~ /s$/) { sub(/s$/, "", v); v *= 1000 }; print v }'; }
: >"$WORK/metrics.txt"
run() { # target run
  local t=$1 r=$2 out="$WORK/$1.$2.txt" c0 c1 rps n p99 non2xx cpu
  c0=$(cpu_ticks "$(pid_of "$t")")
  wrk -t2 -c64 -d"${DURATION}s" --latency -H "Host: $HOST" "http://127.0.0.1:$(port_of "$t")$TARGET_PATH" >"$out" 2>&1 || true
  c1=$(cpu_ticks "$(pid_of "$t")")
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
  n=$(awk '/requests in/ {print $1}' "$out")
  p99=$(awk '$1 == "99%" {print $2}' "$out" | to_ms)
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$out")
  if [ -n "$non2xx" ]; then log "WARNING: $t run $r: $non2xx non-2xx or 3xx responses of ${n:-0}"; fi
  cpu=$(awk -v d=$((c1 - c0)) -v hz="$(getconf CLK_TCK)" -v n="${n:-0}" 'BEGIN { if (n > 0) printf "%.1f", d * 1e6 / hz / n; else print "nan" }')
  echo "$t $r ${rps:-nan} $cpu ${p99:-nan}" >>"$WORK/metrics.txt"
  log "$(printf '%-6s run %d: %10s req/s  %s us CPU/request  p99 %s ms' "$t" "$r" "${rps:-nan}" "$cpu" "${p99:-nan}")"
}
for t in "${TARGETS[@]}"; do
  wrk -t2 -c64 -d2s -H "Host: $HOST" "http://127.0.0.1:$(port_of "$t")$TARGET_PATH" >/dev/null 2>&1 || true
done
for ((r = 1; r <= RUNS; r++)); do
  for t in "${TARGETS[@]}"; do run "$t" "$r"; done
done

# ---------------------------------------------------------------- report
col() { awk -v t="$1" -v c="$2" '$1==t {print $c}' "$WORK/metrics.txt" | median; }
echo
echo "## Path-prefix routing $(date -u +%Y-%m-%dT%H:%M:%SZ) cpus=$(nproc); $ROUTES prefixes of one hostname; $WORKERS workers each; nginx $(nginx -v 2>&1 | awk -F/ '{print $2}'); wrk -t2 -c64 -d${DURATION}s GET $TARGET_PATH; $RUNS interleaved runs, median"
echo "| target | req/s (median) | CPU µs per request | p99 ms | runs |"
echo "|---|---|---|---|---|"
for t in "${TARGETS[@]}"; do
  all=$(awk -v t="$t" '$1==t {printf "%s%s", (n++ ? "/" : ""), ($3 == "nan" ? "nan" : sprintf("%.0f", $3))}' "$WORK/metrics.txt")
  printf '| %s | %s | %s | %s | %s |\n' "$t" "$(col "$t" 3 | awk '{ if ($1 == "nan") print; else printf "%.0f\n", $1 }')" "$(col "$t" 4)" "$(col "$t" 5)" "$all"
done
awk -v e="$(col edge 3)" -v n="$(col nginx 3)" -v ec="$(col edge 4)" -v nc="$(col nginx 4)" 'BEGIN {
  printf "ratio edge/nginx req/s: %s; CPU per request: %s\n",
    (e == "nan" || n == 0) ? "nan" : sprintf("%.2f", e / n),
    (ec == "nan" || nc == "nan" || nc == 0) ? "nan" : sprintf("%.2f", ec / nc) }'
