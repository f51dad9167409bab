#!/usr/bin/env bash
# HTTPS through the edge against nginx and haproxy, on loopback: the same upstream (an nginx
# answering 200), the same ECDSA P-256 certificate, the same clients.
#
#   https-keepalive  wrk over TLS, HTTP/1.1 keep-alive (-t2 -c64)
#   h2               h2load over TLS, HTTP/2 (-c16 -m10: many streams per connection; p99
#                    from its per-request log)
#   tls-new          wrk over TLS with `Connection: close` (-t2 -c32): every request on a new
#                    connection with a full handshake (wrk does not resume sessions), what each
#                    new visitor costs
#   tls-resumed      tls-churn --resume (-c32, two threads, VISITORS [2000] visitors taking
#                    turns): every request on a new connection from a returning visitor, who
#                    resumes the session from their last visit when the server still honours it
#                    (a few seconds earlier); each visitor's first visit is made before the
#                    clock starts, and the share of the counted handshakes that resumed is
#                    reported beside the rate
#
# The edge runs alone (`edge-bench --tls-listen`, no access log), nginx and haproxy as
# TLS-terminating reverse proxies with a keep-alive upstream pool and no access log, each with
# WORKERS workers (threads for haproxy and the edge), both adding the forwarding fields the edge
# adds (X-Forwarded-For, Forwarded, X-Forwarded-Proto and -Host): the same work, the same head
# upstream. RUNS interleaved runs per target and workload (median, and every run's figure), CPU
# per request from /proc (its user-space part in brackets), autogroup scheduling off for the
# run (restored). Everything listens
# on 127.0.0.1 and every process started here is ended by its PID.
#
# Usage: bench/https_side_by_side.sh   (knobs: DURATION [10], RUNS [3], WORKERS [nproc],
#        BASE_PORT [18480], TARGETS and WORKLOADS [all, space-separated], VISITORS [2000])
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
RUNS=${RUNS:-3}
WORKERS=${WORKERS:-$(nproc)}
BASE_PORT=${BASE_PORT:-18480}
UP_PORT=$BASE_PORT
NGINX_PORT=$((BASE_PORT + 1))
EDGE_HTTP_PORT=$((BASE_PORT + 2))
EDGE_PORT=$((BASE_PORT + 3))
# A name that resolves to 127.0.0.1 for wrk and h2load, which send it as SNI and Host.
HOST=localhost
HAPROXY_PORT=$((BASE_PORT + 4))
TARGETS=${TARGETS:-nginx haproxy edge}
WORKLOADS=${WORKLOADS:-https-keepalive h2 tls-new tls-resumed}
VISITORS=${VISITORS:-2000}

LOG_TAG=https
# shellcheck source=bench/lib.sh
source bench/lib.sh

bench_need nginx:nginx haproxy:haproxy wrk:wrk h2load:nghttp2-client openssl:openssl
cargo build --release -q -p ployz-bench --bin edge-bench --bin tls-churn

bench_begin https_bench

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -keyout "$WORK/key.pem" -out "$WORK/cert.pem" -subj "/CN=$HOST" \
  -addext "subjectAltName=DNS:$HOST" 2>/dev/null

cat "$WORK/cert.pem" "$WORK/key.pem" >"$WORK/combined.pem"

bench_upstream_nginx "$UP_PORT" "hello from upstream"
mkdir -p "$WORK/nginx" "$WORK/haproxy"
cat >"$WORK/nginx/nginx.conf" <<EOF
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
        listen 127.0.0.1:$NGINX_PORT ssl http2;
        server_name $HOST;
        ssl_certificate $WORK/cert.pem;
        ssl_certificate_key $WORK/key.pem;
        ssl_protocols TLSv1.2 TLSv1.3;
        ssl_session_cache shared:SSL:10m;
        location / {
            proxy_pass http://app_up;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$http_host;
$(bench_nginx_forwarding)
        }
    }
}
EOF
cat >"$WORK/haproxy/haproxy.cfg" <<EOF
global
    nbthread $WORKERS
    maxconn 8000
defaults
    mode http
    timeout connect 5s
    timeout client 60s
    timeout server 60s
    timeout http-keep-alive 60s
    option http-keep-alive
    http-reuse always
frontend https_in
    bind 127.0.0.1:$HAPROXY_PORT ssl crt $WORK/combined.pem alpn h2,http/1.1
$(bench_haproxy_forwarding https)
    default_backend app_up
backend app_up
    server up 127.0.0.1:$UP_PORT
EOF
nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >"$WORK/nginx.log" 2>&1 &
PIDS+=($!); NGINX_PID=$!
haproxy -db -f "$WORK/haproxy/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
PIDS+=($!); HAPROXY_PID=$!
target/release/edge-bench --listen "127.0.0.1:$EDGE_HTTP_PORT" --route "$HOST=127.0.0.1:$UP_PORT" \
  --threads "$WORKERS" --tls-listen "127.0.0.1:$EDGE_PORT" --tls-cert "$WORK/cert.pem" \
  --tls-key "$WORK/key.pem" >"$WORK/edge.log" 2>&1 &
PIDS+=($!); EDGE_PID=$!
wait_port "$NGINX_PORT"
wait_port "$HAPROXY_PORT"
wait_port "$EDGE_PORT"
port_of() { case $1 in nginx) echo "$NGINX_PORT" ;; haproxy) echo "$HAPROXY_PORT" ;; edge) echo "$EDGE_PORT" ;; esac; }
pid_of() { case $1 in nginx) echo "$NGINX_PID" ;; haproxy) echo "$HAPROXY_PID" ;; edge) echo "$EDGE_PID" ;; esac; }
for t in $TARGETS; do
  port=$(port_of "$t")
  body=$(curl -sS --cacert "$WORK/cert.pem" --resolve "$HOST:$port:127.0.0.1" "https://$HOST:$port/")
  [ "$body" = "hello from upstream" ] || { log "$t answered '$body'"; exit 1; }
done


: >"$WORK/metrics.txt"
: >"$WORK/resumed.txt"
run() { # target workload run
  local t=$1 w=$2 r=$3 out="$WORK/$1.$2.$3.txt" c0 c1 u0 u1 rps p99 n
  local url="https://$HOST:$(port_of "$t")/"
  c0=$(cpu_ticks "$(pid_of "$t")")
  u0=$(cpu_ticks "$(pid_of "$t")" user)
  if [ "$w" = https-keepalive ] || [ "$w" = tls-new ]; then
    if [ "$w" = tls-new ]; then
      wrk -t2 -c32 -d"${DURATION}s" --latency -H "Connection: close" "$url" >"$out" 2>&1
    else
      wrk -t2 -c64 -d"${DURATION}s" --latency "$url" >"$out" 2>&1
    fi
    rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
    n=$(awk '/requests in/ {print $1}' "$out")
    p99=$(awk '$1 == "99%" { v = $2; if (v ~ /us$/) { sub(/us$/, "", v); v /= 1000 } else if (v ~ /ms$/) sub(/ms$/, "", v); else if (v ~ /s$/) { sub(/s$/, "", v); v *= 1000 }; print v }' "$out")
  elif [ "$w" = tls-resumed ]; then
    target/release/tls-churn --connect "127.0.0.1:$(port_of "$t")" --host "$HOST" \
      --connections 32 --threads 2 --duration "$DURATION" --resume --visitors "$VISITORS" >"$out" 2>&1
    rps=$(awk -F'[ =]' '/^requests=/ {print $6}' "$out")
    n=$(awk -F'[ =]' '/^requests=/ {print $2}' "$out")
    p99=$(awk -F'[ =]' '/^requests=/ {print $14}' "$out")
    awk -v t="$t" -F'[ =]' '/^requests=/ {print t, $8}' "$out" >>"$WORK/resumed.txt"
    # A failed visit is not a figure: say so.
    errors=$(awk -F'[ =]' '/^requests=/ {print $10}' "$out")
    [ "${errors:-1}" = 0 ] || log "$t tls-resumed run $r: ${errors:-no summary} failed visits ($(grep -m1 'error' "$out" || true))"
  else
    h2load -c16 -m10 -t2 -D "$DURATION" --log-file="$WORK/h2.times" "$url" >"$out" 2>&1
    rps=$(awk '/^finished in/ {gsub(/,/, "", $4); print $4}' "$out")
    n=$(awk '/^requests:/ {print $8}' "$out")
    # h2load prints no percentiles; its log has each request's time (µs) in column 3.
    p99=$(awk -F'\t' '$2 > 0 {print $3}' "$WORK/h2.times" | sort -n \
      | awk '{ v[NR] = $1 } END { if (NR) printf "%.2f", v[int(NR * 0.99 + 0.5)] / 1000; else print "nan" }')
    rm -f "$WORK/h2.times"
  fi
  c1=$(cpu_ticks "$(pid_of "$t")")
  u1=$(cpu_ticks "$(pid_of "$t")" user)
  local cpu user
  per_request() { awk -v d="$1" -v hz="$(getconf CLK_TCK)" -v n="${n:-0}" 'BEGIN { if (n > 0) printf "%.1f", d * 1e6 / hz / n; else print "nan" }'; }
  cpu=$(per_request $((c1 - c0)))
  user=$(per_request $((u1 - u0)))
  echo "$t $w $r ${rps:-nan} $cpu ${p99:-nan} $user" >>"$WORK/metrics.txt"
  log "$(printf '%-6s %-16s run %d: %10s req/s  %s us CPU/request (user %s)  p99 %s ms' "$t" "$w" "$r" "${rps:-nan}" "$cpu" "$user" "${p99:-nan}")"
}
# Warm-up, then interleaved runs.
for t in $TARGETS; do wrk -t2 -c64 -d2s "https://$HOST:$(port_of "$t")/" >/dev/null 2>&1 || true; done
for ((r = 1; r <= RUNS; r++)); do
  for w in $WORKLOADS; do
    for t in $TARGETS; do run "$t" "$w" "$r"; done
  done
done

echo
echo "## HTTPS $(date -u +%Y-%m-%dT%H:%M:%SZ) cpus=$(nproc); ECDSA P-256, $WORKERS workers each; wrk -t2 -c64 -d${DURATION}s (HTTP/1.1 keep-alive), h2load -c16 -m10 -t2 -D $DURATION (HTTP/2), wrk -t2 -c32 -H 'Connection: close' (a full handshake per request), tls-churn --resume -c32 --visitors $VISITORS (a new connection per request from returning visitors); $RUNS interleaved runs, median; nginx $(nginx -v 2>&1 | awk -F/ '{print $2}'), haproxy $(haproxy -v 2>/dev/null | awk 'NR==1 {print $3}')"
echo "| target | workload | req/s (median) | CPU µs per request (user space) | p99 ms | runs |"
echo "|---|---|---|---|---|---|"
for w in $WORKLOADS; do
  for t in $TARGETS; do
    q=$(awk -v t="$t" -v w="$w" '$1==t && $2==w {print $4}' "$WORK/metrics.txt" | median)
    c=$(awk -v t="$t" -v w="$w" '$1==t && $2==w {print $5}' "$WORK/metrics.txt" | median)
    p=$(awk -v t="$t" -v w="$w" '$1==t && $2==w {print $6}' "$WORK/metrics.txt" | median)
    u=$(awk -v t="$t" -v w="$w" '$1==t && $2==w {print $7}' "$WORK/metrics.txt" | median)
    all=$(awk -v t="$t" -v w="$w" '$1==t && $2==w {printf "%s%.0f", (n++ ? "/" : ""), $4}' "$WORK/metrics.txt")
    printf '| %s | %s | %.0f | %s (%s) | %s | %s |\n' "$t" "$w" "$q" "$c" "$u" "$p" "$all"
  done
  n=$(awk -v w="$w" '$1=="nginx" && $2==w {print $4}' "$WORK/metrics.txt" | median)
  h=$(awk -v w="$w" '$1=="haproxy" && $2==w {print $4}' "$WORK/metrics.txt" | median)
  e=$(awk -v w="$w" '$1=="edge" && $2==w {print $4}' "$WORK/metrics.txt" | median)
  awk -v n="$n" -v h="$h" -v e="$e" -v w="$w" 'BEGIN { b = n > h ? n : h; printf "ratio edge/nginx, %s: %.2f; edge/best peer: %.2f\n", w, e / n, e / b }' >&2
done
if [ -s "$WORK/resumed.txt" ]; then
  for t in $TARGETS; do
    awk -v t="$t" '$1==t {printf "%s%s", (n++ ? "/" : ""), $2}' "$WORK/resumed.txt" |
      xargs -r printf 'share of handshakes resumed, %s: %s\n' "$t" >&2
  done
fi
