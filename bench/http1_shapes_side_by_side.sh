#!/usr/bin/env bash
# The HTTP/1 request shapes beyond plain HTTP/1.1 keep-alive, against nginx and haproxy, on
# loopback: the same upstream (an nginx
# answering 200 to every request, reading and discarding any body), the same clients.
#
#   http10-keepalive  ab -k -c 64: HTTP/1.0 with `Connection: Keep-Alive`, GET /
#   post-100k         wrk -t2 -c64: HTTP/1.1 POST of 100 KiB with Content-Length, over the fast
#                     path's 64 KiB buffered-body limit (MAX_FAST_BODY), so streamed
#   chunked-upload    wrk -t2 -c64: HTTP/1.1 POST with `Transfer-Encoding: chunked`, about 4 KiB
#                     in four chunks
#   expect-continue   wrk -t2 -c64: HTTP/1.1 POST of 1 KiB with `Expect: 100-continue`, the body
#                     sent with the head (RFC 9110 allows it). A server may still answer 100
#                     (Continue) first, as nginx and haproxy do (the edge does not when the
#                     body is already in); wrk takes that for a
#                     whole response and sends its next request on the connection, so the script
#                     counts final responses apart: req/s and CPU per request are per final
#                     response, p99 is wrk's, over every response, interim ones included
#
# All four take the edge's fast path (edge/src/fast_path.rs) since it streams long and chunked
# bodies; `--no-fast-path` would send them to Pingora's proxy.
#
# The edge runs alone (`edge-bench`, no access log), nginx as a reverse proxy with a keep-alive
# upstream pool and unbuffered request bodies, haproxy in HTTP mode with connection reuse, each
# with WORKERS workers or threads and no access log; both peers add the forwarding fields the
# edge adds (X-Forwarded-For, Forwarded, X-Forwarded-Proto and -Host), so that every target does
# the same work and sends the upstream the same head. Before measuring, every target must pass on
# the upstream's 200 to a GET, an HTTP/1.0 GET, a 100 KiB POST, the chunked upload (whose
# encoding the upstream checks first) and the Expect POST.
# RUNS interleaved runs per workload and target (median, and every run's figure), CPU per
# request for the target's process tree from /proc, autogroup scheduling off for the run
# (restored). Everything listens on 127.0.0.1 and every process started here is ended by its PID.
#
# Usage: bench/http1_shapes_side_by_side.sh   (knobs: DURATION [10], RUNS [3], WORKERS [nproc],
#        BASE_PORT [18500], TARGETS and WORKLOADS [all, space-separated])
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-10}
RUNS=${RUNS:-3}
WORKERS=${WORKERS:-$(nproc)}
BASE_PORT=${BASE_PORT:-18500}
UP_PORT=$BASE_PORT
NGINX_PORT=$((BASE_PORT + 1))
HAPROXY_PORT=$((BASE_PORT + 2))
EDGE_PORT=$((BASE_PORT + 3))
# The route the edge serves, sent as Host by every client; the URLs name 127.0.0.1.
HOST=localhost
read -r -a TARGETS <<<"${TARGETS:-nginx haproxy edge}"
PEERS=(nginx haproxy)
read -r -a WORKLOADS <<<"${WORKLOADS:-http10-keepalive post-100k chunked-upload expect-continue}"
EXPECTED="hello from upstream"
AB_CMD="ab -k -c 64 -t $DURATION -n 100000000 -H 'Host: localhost'"
WRK_CMD="wrk -t2 -c64 -d${DURATION}s --latency -s WORKLOAD.lua"

LOG_TAG=http1-shapes
# shellcheck source=bench/lib.sh
source bench/lib.sh

bench_need nginx:nginx haproxy:haproxy wrk:wrk ab:apache2-utils curl:curl
cargo build --release -q -p ployz-bench --bin edge-bench

for p in "$UP_PORT" "$NGINX_PORT" "$HAPROXY_PORT" "$EDGE_PORT"; do
  if (exec 3<>/dev/tcp/127.0.0.1/"$p") 2>/dev/null; then
    log "port $p is already in use; set BASE_PORT"
    exit 1
  fi
done

bench_begin http1_shapes_bench

# ---------------------------------------------------------------- servers
bench_upstream_nginx "$UP_PORT" "$EXPECTED"
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
    client_max_body_size 10m;
    upstream app_up { server 127.0.0.1:$UP_PORT; keepalive 256; }
    server {
        listen 127.0.0.1:$NGINX_PORT;
        server_name $HOST;
        location / {
            proxy_pass http://app_up;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$http_host;
$(bench_nginx_forwarding)
            proxy_request_buffering off;
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
    option http-keep-alive
    timeout connect 5s
    timeout client 120s
    timeout server 120s
    timeout http-request 60s
    timeout http-keep-alive 120s
frontend fe
    bind 127.0.0.1:$HAPROXY_PORT
$(bench_haproxy_forwarding http)
    default_backend be_app
backend be_app
    http-reuse always
    server up1 127.0.0.1:$UP_PORT maxconn 1000
EOF
nginx -p "$WORK/nginx" -c "$WORK/nginx/nginx.conf" >"$WORK/nginx.log" 2>&1 &
PIDS+=($!); NGINX_PID=$!
haproxy -db -f "$WORK/haproxy/haproxy.cfg" >"$WORK/haproxy.log" 2>&1 &
PIDS+=($!); HAPROXY_PID=$!
target/release/edge-bench --listen "127.0.0.1:$EDGE_PORT" --route "$HOST=127.0.0.1:$UP_PORT" \
  --threads "$WORKERS" >"$WORK/edge.log" 2>&1 &
PIDS+=($!); EDGE_PID=$!
wait_port "$NGINX_PORT"
wait_port "$HAPROXY_PORT"
wait_port "$EDGE_PORT"

port_of() { case $1 in upstream) echo "$UP_PORT" ;; nginx) echo "$NGINX_PORT" ;; haproxy) echo "$HAPROXY_PORT" ;; edge) echo "$EDGE_PORT" ;; esac; }
pid_of() { case $1 in nginx) echo "$NGINX_PID" ;; haproxy) echo "$HAPROXY_PID" ;; edge) echo "$EDGE_PID" ;; esac; }

# ---------------------------------------------------------------- request bodies and wrk scripts
head -c 102400 /dev/zero | tr '\0' 'a' >"$WORK/post-100k.body"
head -c 1024 /dev/zero | tr '\0' 'e' >"$WORK/expect-continue.body"
bench_chunked_body "$WORK/chunked-upload.body"
# wrk sends the request these scripts build, verbatim, on every connection. wrk.format adds
# Content-Length only when given a body, so the chunked request is formatted without one and its
# encoded body appended.
cat >"$WORK/post-100k.lua" <<EOF
local f = assert(io.open("$WORK/post-100k.body", "rb"))
local body = f:read("*a")
f:close()
local req = wrk.format("POST", "/", { ["Host"] = "$HOST", ["Content-Type"] = "application/octet-stream" }, body)
request = function() return req end
EOF
cat >"$WORK/chunked-upload.lua" <<EOF
local f = assert(io.open("$WORK/chunked-upload.body", "rb"))
local body = f:read("*a")
f:close()
local req = wrk.format("POST", "/", { ["Host"] = "$HOST", ["Content-Type"] = "application/octet-stream", ["Transfer-Encoding"] = "chunked" }, nil) .. body
request = function() return req end
EOF
cat >"$WORK/expect-continue.lua" <<EOF
local f = assert(io.open("$WORK/expect-continue.body", "rb"))
local body = f:read("*a")
f:close()
local req = wrk.format("POST", "/", { ["Host"] = "$HOST", ["Content-Type"] = "application/octet-stream", ["Expect"] = "100-continue" }, body)
request = function() return req end
-- wrk takes an interim 100 (Continue) for a whole response: count final and interim ones apart.
local threads = {}
function setup(thread) table.insert(threads, thread) end
function init(args) interim = 0; final = 0 end
function response(status, headers, body)
  if status < 200 then interim = interim + 1 else final = final + 1 end
end
function done(summary, latency, requests)
  local i, f = 0, 0
  for _, t in ipairs(threads) do i = i + t:get("interim"); f = f + t:get("final") end
  io.write(string.format("Interim responses: %d\nFinal responses: %d\nFinal responses/sec: %.2f\n",
    i, f, f / (summary.duration / 1e6)))
end
EOF

# ---------------------------------------------------------------- checks before measuring
# One raw request (head + body bytes as given) on its own connection; prints the status codes of
# every response head received, interim ones included (e.g. "100 200").
raw_statuses() { # port head_file body_file
  local out
  out=$(
    exec 3<>/dev/tcp/127.0.0.1/"$1"
    cat "$2" "$3" >&3
    timeout 5 cat <&3 || true
  )
  printf '%s' "$out" | tr -d '\r' | awk '/^HTTP\/1\.[01] [0-9][0-9][0-9]/ { printf "%s%s", (n++ ? " " : ""), $2 }'
}
printf 'POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n' "$HOST" >"$WORK/chunked.head"
printf 'POST / HTTP/1.1\r\nHost: %s\r\nContent-Type: application/octet-stream\r\nExpect: 100-continue\r\nContent-Length: 1024\r\nConnection: close\r\n\r\n' "$HOST" >"$WORK/expect.head"
# The chunked encoding itself, straight to the upstream.
s=$(raw_statuses "$UP_PORT" "$WORK/chunked.head" "$WORK/chunked-upload.body")
[ "$s" = 200 ] || { log "the upstream answered '$s' to the chunked upload: its encoding is invalid"; exit 1; }
declare -A INTERIM=()
for t in upstream "${TARGETS[@]}"; do
  port=$(port_of "$t")
  body=$(curl -sS -H "Host: $HOST" "http://127.0.0.1:$port/") || body="(curl failed)"
  [ "$body" = "$EXPECTED" ] || { log "$t answered '$body' to a GET"; exit 1; }
  code=$(curl -sS -o "$WORK/post.out" -w '%{http_code}' -H "Host: $HOST" -H 'Expect:' \
    -H 'Content-Type: application/octet-stream' --data-binary "@$WORK/post-100k.body" \
    "http://127.0.0.1:$port/") || code="(curl failed)"
  [ "$code" = 200 ] && [ "$(cat "$WORK/post.out")" = "$EXPECTED" ] \
    || { log "$t answered $code '$(cat "$WORK/post.out")' to a 100 KiB POST"; exit 1; }
  body=$(curl -sS -0 -H "Host: $HOST" -H 'Connection: keep-alive' "http://127.0.0.1:$port/") || body="(curl failed)"
  [ "$body" = "$EXPECTED" ] || { log "$t answered '$body' to an HTTP/1.0 GET"; exit 1; }
  s=$(raw_statuses "$port" "$WORK/chunked.head" "$WORK/chunked-upload.body")
  [ "$s" = 200 ] || { log "$t answered '$s' to the chunked upload"; exit 1; }
  s=$(raw_statuses "$port" "$WORK/expect.head" "$WORK/expect-continue.body")
  case $s in
    200) INTERIM[$t]=0 ;;
    "100 200") INTERIM[$t]=1 ;;
    *) log "$t answered '$s' to the Expect: 100-continue POST"; exit 1 ;;
  esac
done
for t in "${TARGETS[@]}"; do
  if [ "${INTERIM[$t]}" = 1 ]; then
    log "note: $t sends '100 Continue' before its 200 although the body came with the head"
  fi
done

# ---------------------------------------------------------------- measuring
to_ms() { awk '{ v = $1; if (v ~ /us$/) { sub(/us$/, "", v); v /= 1000 } else if (v ~ /ms$/) sub(/ms$/, "", v); else if (v ~ /s$/) { sub(/s$/, "", v); v *= 1000 }; print v }'; }

# Each workload: target run -> writes "rps requests p99_ms" to $WORK/result, warns on stderr.
http10-keepalive() {
  local t=$1 r=$2 out="$WORK/$1.http10-keepalive.$2.txt" rps n failed ka p99
  ab -k -c 64 -t "$DURATION" -n 100000000 -H "Host: $HOST" "http://127.0.0.1:$(port_of "$t")/" >"$out" 2>&1 || true
  rps=$(awk '/^Requests per second:/ {print $4}' "$out")
  n=$(awk '/^Complete requests:/ {print $3}' "$out")
  failed=$(awk '/^Failed requests:/ {print $3}' "$out")
  ka=$(awk '/^Keep-Alive requests:/ {print $3}' "$out")
  p99=$(awk '/Percentage of the requests served/ {p = 1} p && $1 == "99%" {print $2}' "$out")
  [ -n "$rps" ] || log "$t http10-keepalive run $r: ab failed: $(tail -n 3 "$out" | tr '\n' ' ')"
  if [ "${failed:-0}" -gt 0 ]; then log "WARNING: $t http10-keepalive run $r: ab counted $failed failed requests"; fi
  if [ "${n:-0}" -gt 0 ] && [ "$((${ka:-0} * 100))" -lt "$((n * 95))" ]; then
    log "WARNING: $t http10-keepalive run $r: only ${ka:-0} of $n requests were on kept-alive connections"
  fi
  echo "${rps:-nan} ${n:-0} ${p99:-nan}" >"$WORK/result"
}
wrk_run() { # target workload run
  local t=$1 w=$2 r=$3 out="$WORK/$1.$2.$3.txt" rps n p99 non2xx errors interim
  wrk -t2 -c64 -d"${DURATION}s" --latency -s "$WORK/$w.lua" "http://127.0.0.1:$(port_of "$t")/" >"$out" 2>&1 || true
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
  n=$(awk '/requests in/ {print $1}' "$out")
  p99=$(awk '$1 == "99%" {print $2}' "$out" | to_ms)
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$out")
  errors=$(grep 'Socket errors:' "$out" || true)
  [ -n "$rps" ] || log "$t $w run $r: wrk failed: $(tail -n 3 "$out" | tr '\n' ' ')"
  if [ -n "$non2xx" ]; then log "WARNING: $t $w run $r: $non2xx non-2xx or 3xx responses of ${n:-0}"; fi
  if [ -n "$errors" ]; then log "WARNING: $t $w run $r:$errors"; fi
  # wrk's own figures count interim responses too; requests are the final ones.
  interim=$(awk '/^Interim responses:/ {print $3}' "$out")
  if [ -n "$interim" ]; then
    n=$(awk '/^Final responses:/ {print $3}' "$out")
    rps=$(awk '/^Final responses\/sec:/ {print $3}' "$out")
    if [ "$interim" -gt 0 ]; then log "$t $w run $r: $interim interim 100 responses, $n final ones"; fi
  fi
  echo "${rps:-nan} ${n:-0} ${p99:-nan}" >"$WORK/result"
}
post-100k() { wrk_run "$1" post-100k "$2"; }
chunked-upload() { wrk_run "$1" chunked-upload "$2"; }
expect-continue() { wrk_run "$1" expect-continue "$2"; }

: >"$WORK/metrics.txt"
run() { # target workload run
  local t=$1 w=$2 r=$3 c0 c1 rps n p99 cpu
  c0=$(cpu_ticks "$(pid_of "$t")")
  "$w" "$t" "$r"
  c1=$(cpu_ticks "$(pid_of "$t")")
  read -r rps n p99 <"$WORK/result"
  cpu=$(awk -v d=$((c1 - c0)) -v hz="$(getconf CLK_TCK)" -v n="$n" 'BEGIN { if (n > 0) printf "%.1f", d * 1e6 / hz / n; else print "nan" }')
  echo "$t $w $r $rps $cpu $p99" >>"$WORK/metrics.txt"
  log "$(printf '%-7s %-16s run %d: %10s req/s  %s us CPU/request  p99 %s ms' "$t" "$w" "$r" "$rps" "$cpu" "$p99")"
}
# Warm-up on Pingora's path (the 100 KiB POST), then interleaved runs.
for t in "${TARGETS[@]}"; do
  wrk -t2 -c64 -d2s -s "$WORK/post-100k.lua" "http://127.0.0.1:$(port_of "$t")/" >/dev/null 2>&1 || true
done
for ((r = 1; r <= RUNS; r++)); do
  for w in "${WORKLOADS[@]}"; do
    for t in "${TARGETS[@]}"; do run "$t" "$w" "$r"; done
  done
done

# ---------------------------------------------------------------- report
col() { awk -v t="$1" -v w="$2" -v c="$3" '$1==t && $2==w {print $c}' "$WORK/metrics.txt" | median; }
echo
echo "## HTTP/1 shapes $(date -u +%Y-%m-%dT%H:%M:%SZ) cpus=$(nproc); $WORKERS workers each; nginx $(nginx -v 2>&1 | awk -F/ '{print $2}'), haproxy $(haproxy -v | awk 'NR==1 {print $3}'); $AB_CMD (HTTP/1.0 keep-alive); $WRK_CMD (post-100k, chunked-upload, expect-continue); $RUNS interleaved runs, median"
echo "| target | workload | req/s (median) | CPU µs per request | p99 ms | runs |"
echo "|---|---|---|---|---|---|"
for w in "${WORKLOADS[@]}"; do
  for t in "${TARGETS[@]}"; do
    all=$(awk -v t="$t" -v w="$w" '$1==t && $2==w {printf "%s%s", (n++ ? "/" : ""), ($4 == "nan" ? "nan" : sprintf("%.0f", $4))}' "$WORK/metrics.txt")
    printf '| %s | %s | %s | %s | %s | %s |\n' "$t" "$w" \
      "$(col "$t" "$w" 4 | awk '{ if ($1 == "nan") print; else printf "%.0f\n", $1 }')" \
      "$(col "$t" "$w" 5)" "$(col "$t" "$w" 6)" "$all"
  done
done
echo
for w in "${WORKLOADS[@]}"; do
  best=""; best_rps=0
  for p in "${PEERS[@]}"; do
    q=$(col "$p" "$w" 4)
    if [ "$q" != nan ] && awk -v a="$q" -v b="$best_rps" 'BEGIN { exit !(a > b) }'; then best=$p; best_rps=$q; fi
  done
  e=$(col edge "$w" 4)
  awk -v e="$e" -v b="$best_rps" -v w="$w" -v name="${best:-none}" \
    'BEGIN { if (e == "nan" || b == 0) r = "nan"; else r = sprintf("%.2f", e / b); printf "ratio edge/best peer, %s: %s (best peer: %s)\n", w, r, name }'
  awk -v e="$(col edge "$w" 5)" -v n="$(col nginx "$w" 5)" \
    'BEGIN { if (e == "nan" || n == "nan" || n == 0) r = "nan"; else r = sprintf("%.2f", e / n); printf "ratio edge/nginx CPU per request: %s\n", r }'
done
