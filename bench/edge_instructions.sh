#!/usr/bin/env bash
# Instructions per proxied request through `edge-bench`, counted by callgrind: a figure that does
# not move with the machine's load, for comparing one change of the edge with the next.
# An nginx upstream answers `return 200`; wrk sends HTTP/1.1 keep-alive requests on 4 connections
# for SECONDS after a warm-up (ab would send HTTP/1.0, which the edge hands to Pingora's proxy);
# callgrind's counters are zeroed after the warm-up and dumped after the run, and divided by the
# number of requests wrk completed. With PROTOCOL=h2, HTTP/2 over TLS instead (a self-signed
# ECDSA certificate for localhost): h2load -c16 -m10, many streams per connection, on the
# edge's HTTP/2 path, REQUESTS of them (default 20000: a fixed count, so that no stream is
# still in flight when the counters are dumped). With PROTOCOL=chunked, HTTP/1.1 POSTs of about
# 4 KiB with `Transfer-Encoding: chunked` in four chunks (bench/http1_shapes_side_by_side.sh's
# chunked upload), which the edge streams to the upstream framed anew.
#
# Usage: [PROTOCOL=h2|chunked [REQUESTS=N]] bench/edge_instructions.sh [SECONDS]   (default 10;
#        installs valgrind, wrk, nginx, and for h2 nghttp2-client)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/lib.sh
source bench/lib.sh
SECONDS_RUN="${1:-10}"
PROTOCOL="${PROTOCOL:-http1}"
case $PROTOCOL in http1 | h2 | chunked) ;; *) echo "PROTOCOL must be http1, h2 or chunked, not '$PROTOCOL'" >&2; exit 2 ;; esac
for p in valgrind:valgrind wrk:wrk nginx:nginx h2load:nghttp2-client; do
  command -v "${p%%:*}" >/dev/null || apt-get install -y -q "${p#*:}" >/dev/null
done
cargo build --release -q -p ployz-bench --bin edge-bench
work="$(mktemp -d)"
UP=28780 EDGE=28781 EDGE_TLS=28782
cat >"$work/nginx.conf" <<CONF
worker_processes 1; daemon off; error_log $work/error.log; pid $work/nginx.pid;
events { worker_connections 1024; }
http { access_log off; server { listen 127.0.0.1:$UP; keepalive_requests 100000;
  location / { return 200 "hello from upstream\n"; } } }
CONF
nginx -c "$work/nginx.conf" &
up=$!
tls=()
if [ "$PROTOCOL" = h2 ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
    -keyout "$work/key.pem" -out "$work/cert.pem" -subj "/CN=localhost" \
    -addext "subjectAltName=DNS:localhost" 2>/dev/null
  tls=(--tls-listen "127.0.0.1:$EDGE_TLS" --tls-cert "$work/cert.pem" --tls-key "$work/key.pem")
fi
valgrind --tool=callgrind --callgrind-out-file="$work/cg.out" \
  target/release/edge-bench --listen "127.0.0.1:$EDGE" --route "app.internal=127.0.0.1:$UP" \
  --route "localhost=127.0.0.1:$UP" --threads 1 "${tls[@]}" >"$work/edge.log" 2>&1 &
edge=$!
cleanup() {
  kill "$edge" "$up" 2>/dev/null || true
  wait "$edge" "$up" 2>/dev/null || true
  [ -n "${KEEP_CALLGRIND:-}" ] && cp "$work"/cg.out.1 "$KEEP_CALLGRIND" 2>/dev/null; rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
  curl -fs -o /dev/null -H "Host: app.internal" "http://127.0.0.1:$EDGE/" && break
  sleep 0.3
done
if [ "$PROTOCOL" = h2 ]; then
  for _ in $(seq 1 100); do
    curl -fsk --http2 -o /dev/null "https://localhost:$EDGE_TLS/" && break
    sleep 0.3
  done
  h2load -c16 -m10 -t1 -n 2000 "https://localhost:$EDGE_TLS/" >/dev/null
  callgrind_control -z "$edge" >/dev/null
  out=$(h2load -c16 -m10 -t1 -n "${REQUESTS:-20000}" "https://localhost:$EDGE_TLS/")
else
  script=()
  if [ "$PROTOCOL" = chunked ]; then
    bench_chunked_body "$work/chunked.body"
    cat >"$work/chunked.lua" <<EOF
local f = assert(io.open("$work/chunked.body", "rb"))
local body = f:read("*a")
f:close()
local req = wrk.format("POST", "/", { ["Host"] = "app.internal", ["Transfer-Encoding"] = "chunked" }, nil) .. body
request = function() return req end
EOF
    script=(-s "$work/chunked.lua")
  fi
  wrk -t1 -c4 -d2s "${script[@]}" -H "Host: app.internal" "http://127.0.0.1:$EDGE/" >/dev/null
  callgrind_control -z "$edge" >/dev/null
  out=$(wrk -t1 -c4 -d"${SECONDS_RUN}s" "${script[@]}" -H "Host: app.internal" "http://127.0.0.1:$EDGE/")
fi
callgrind_control -d "$edge" >/dev/null
# The dump is written by the busy process: wait until its size holds still.
prev=-1
for _ in $(seq 1 20); do
  size=$(stat -c %s "$work/cg.out.1" 2>/dev/null || echo 0)
  [ "$size" -gt 0 ] && [ "$size" = "$prev" ] && break
  prev=$size
  sleep 1
done
if [ "$PROTOCOL" = h2 ]; then
  N=$(echo "$out" | awk '/^requests:/ {print $8; exit}')
  echo "$out" | grep -E "^requests:|^status codes:" || true
  what="HTTP/2 requests, h2load -c16 -m10"
else
  N=$(echo "$out" | awk '/requests in/ {print $1; exit}')
  echo "$out" | grep -E "requests in|Non-2xx|Socket errors" || true
  what="keep-alive HTTP/1.1 requests"
  [ "$PROTOCOL" = chunked ] && what="chunked HTTP/1.1 uploads of 4,000 bytes"
fi
total=$(callgrind_annotate "$work/cg.out.1" | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1; exit}')
echo "user-space instructions per request: $((total / N))  (edge-bench, 1 thread, $N $what)"
echo "heaviest inclusive costs of the edge's own code, per request:"
callgrind_annotate --inclusive=yes "$work/cg.out.1" \
  | awk -v n="$N" '/^ *[0-9,]+ \(/ && /ployz_edge::/ {
      count = $1; gsub(",", "", count)
      f = substr($0, index($0, "ployz_edge::")); sub(/ \[.*$/, "", f); sub(/::\{\{closure\}\}.*/, "", f)
      if (!seen[f]++) printf "  %8d  %s\n", count / n, f
    }' | sort -rn | head -6
