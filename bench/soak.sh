#!/usr/bin/env bash
# The daemon's memory under a long mix of work, and whether it comes back afterwards. One
# daemon of its own on loopback ports; one Service of two replicas (busybox httpd) published
# over HTTP and over HTTPS (a self-signed certificate imported with `ployz cert import`).
# DEPLOYS rounds, each with, at the same time:
#   - wrk: keep-alive GETs on the fast path (paths and query strings all different), on 16
#     connections and, for a tenth of the requests, on BURST connections;
#   - wrk: what takes Pingora's path or is refused: HTTP/1.0, chunked and 100 KiB bodies,
#     unknown hostnames (all different), 16 KiB targets, 80 KiB heads, duplicate lengths, garbage;
#   - curl: HTTPS over HTTP/1.1 (a new TLS connection per request) and over HTTP/2;
#   - one rolling Deploy (a new `VER` each round, so both containers are replaced);
#   - API calls on the socket: every read route, logs, exec, unknown routes, broken and 1.5 MiB
#     bodies, and HALF_OPEN connections that send half a request head, held at once, then closed.
# REQUESTS is the total of edge requests over all rounds, shared among the kinds above.
# VmRSS, RssAnon and threads from /proc/PID/status after each round and the peak (VmHWM); then
# IDLE_SECONDS with no traffic (idle upstream connections expire after 30 s), sampled every 10 s.
#
# Usage: bench/soak.sh [REQUESTS] [DEPLOYS]   (default 200000 and 10, about 5 minutes on 2 cores;
#        needs a running dockerd; builds target/release/ployz; installs wrk)
#   PORT (default 18480) and the two after it; IDLE_SECONDS (default 40); API_CALLS per round
#   (default 200); BURST connections (default 500); HALF_OPEN API connections (default 300).
#   The daemon inherits the environment: `MALLOC_ARENA_MAX=16 bench/soak.sh` replaces the
#   daemon's own cap on malloc arenas (see cli/src/memory.rs).
set -euo pipefail
cd "$(dirname "$0")/.."
REQUESTS="${1:-200000}"
DEPLOYS="${2:-10}"
PORT="${PORT:-18480}"
IDLE_SECONDS="${IDLE_SECONDS:-40}"
API_CALLS="${API_CALLS:-200}"
BURST="${BURST:-500}"
HALF_OPEN="${HALF_OPEN:-300}"
[ "$DEPLOYS" -ge 1 ] || { echo "DEPLOYS must be at least 1" >&2; exit 2; }
command -v wrk >/dev/null || apt-get install -y -q wrk >/dev/null
PLOYZ="$PWD/target/release/ployz"
cargo build --release -q -p ployz
scripts/make-busybox-image.sh ployz-bench/busybox:1
HTTP=$PORT HTTPS=$((PORT + 1)) METRICS=$((PORT + 2))

work="$(mktemp -d)"
"$PLOYZ" daemon run --data-dir "$work/data" --socket "$work/ployz.sock" \
  --http-listen "127.0.0.1:$HTTP" --https-listen "127.0.0.1:$HTTPS" \
  --metrics-listen "127.0.0.1:$METRICS" --no-certificates --dns-listen off --no-mesh \
  --no-access-log 2>"$work/daemon.log" &
daemon=$!
export PLOYZ_CONNECT="unix://$work/ployz.sock"
machine=""
helpers=()
cleanup() {
  # The load generators first (each background job writes its PID to $work/pids), then the
  # shells that waited on them.
  [ -e "$work/pids" ] && while read -r p; do kill "$p" 2>/dev/null || true; done <"$work/pids"
  for p in "${helpers[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${helpers[@]}"; do wait "$p" 2>/dev/null || true; done
  kill -TERM "$daemon" 2>/dev/null || true
  for _ in $(seq 1 100); do kill -0 "$daemon" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$daemon" 2>/dev/null || true
  wait "$daemon" 2>/dev/null || true
  if [ -n "$machine" ]; then
    ids=$(docker ps -aq --filter "label=ployz.machine.id=$machine")
    [ -z "$ids" ] || docker rm -f -v $ids >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
for _ in $(seq 1 100); do "$PLOYZ" version >/dev/null 2>&1 && break; sleep 0.05; done
machine=$("$PLOYZ" machine init --name soak --json | sed -n 's/.*"id": *"\([^"]*\)".*/\1/p' | head -1)
[ -n "$machine" ] || { echo "machine init printed no id" >&2; exit 1; }

status_kb() { awk -v k="$1:" '$1 == k {print $2}' "/proc/$daemon/status"; }
mb() { awk -v k="$1" 'BEGIN { printf "%.1f MB", k / 1024 }'; }
sample() {
  if ! kill -0 "$daemon" 2>/dev/null; then
    echo "the daemon exited; its log ends:" >&2
    tail -20 "$work/daemon.log" >&2
    exit 1
  fi
  printf '%-34s VmRSS %9s  RssAnon %9s  threads %s\n' "$1" "$(mb "$(status_kb VmRSS)")" \
    "$(mb "$(status_kb RssAnon)")" "$(status_kb Threads)"
}
sample "after machine init"

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
  -subj /CN=soaks.localhost -addext subjectAltName=DNS:soaks.localhost \
  -keyout "$work/key.pem" -out "$work/cert.pem" >/dev/null 2>&1
"$PLOYZ" cert import soaks.localhost --cert "$work/cert.pem" --key "$work/key.pem" >/dev/null

cat >"$work/compose.yaml" <<'YAML'
services:
  soak:
    image: ployz-bench/busybox:1
    command: ["sh", "-c", "echo ok > /index.html && exec httpd -f -p 8080 -h /"]
    pull_policy: never
    environment:
      VER: "${VER}"
    healthcheck:
      test: ["CMD", "wget", "-q", "-O-", "http://127.0.0.1:8080/"]
      interval: 1s
      start_period: 0s
    deploy:
      replicas: 2
      update_config:
        monitor: 0s
    x-ports:
      - soak.localhost:8080/http
      - soaks.localhost:8080/https
YAML
deploy() { VER="$1" timeout 180 "$PLOYZ" deploy -f "$work/compose.yaml" -y >>"$work/deploy.log" 2>&1; }
deploy 0 || { echo "the first Deploy failed:" >&2; tail -20 "$work/deploy.log" >&2; exit 1; }
routable=""
for _ in $(seq 1 300); do
  [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'Host: soak.localhost' "http://127.0.0.1:$HTTP/")" = 200 ] \
    && routable=1 && break
  sleep 0.1
done
[ -n "$routable" ] || { echo "soak.localhost never answered 200 through the edge" >&2; exit 1; }
sample "after the first Deploy"

# Each wrk thread stops after SOAK_LIMIT responses and leaves a file SOAK_DONE.<thread>; wrk
# itself runs for its whole -d, so it gets SIGINT (and prints its figures) once both threads
# have left theirs. -d bounds the time.
lua_common='
local limit = tonumber(os.getenv("SOAK_LIMIT"))
local n, i, next_id = 0, 0, 0
setup = function(thread)
  next_id = next_id + 1
  thread:set("id", next_id)
end
response = function()
  n = n + 1
  if n == limit then
    io.open(os.getenv("SOAK_DONE") .. "." .. id, "w"):close()
    wrk.thread:stop()
  end
end
'
{ echo "$lua_common"; cat <<'LUA'; } >"$work/fast.lua"
request = function()
  i = i + 1
  local path = (i % 10 == 0) and ("/missing/" .. i) or ("/index.html?r=" .. math.random(1e9))
  return wrk.format("GET", path, { Host = "soak.localhost" })
end
LUA
{ echo "$lua_common"; cat <<'LUA'; } >"$work/mixed.lua"
local big = string.rep("b", 100 * 1024)
local long = string.rep("x", 16 * 1024)
local shapes = {
  function() return "GET /index.html?h10=" .. i .. " HTTP/1.0\r\nHost: soak.localhost\r\n\r\n" end,
  function() return "GET /?u=" .. i .. " HTTP/1.1\r\nHost: u" .. math.random(1e9) .. ".soak.test\r\n\r\n" end,
  function() return "POST /index.html HTTP/1.1\r\nHost: soak.localhost\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n" end,
  function() return "POST /index.html HTTP/1.1\r\nHost: soak.localhost\r\nContent-Length: " .. #big .. "\r\n\r\n" .. big end,
  function() return "GET /" .. long .. " HTTP/1.1\r\nHost: soak.localhost\r\n\r\n" end,
  function() return "GET / HTTP/1.1\r\nHost: soak.localhost\r\nX-Big: " .. long .. long .. long .. long .. long .. "\r\n\r\n" end,
  function() return "GET / HTTP/1.1\r\nHost: soak.localhost\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!" end,
  function() return "\1\2garbage " .. i .. "\r\n\r\n" end,
}
request = function()
  i = i + 1
  return shapes[(i % #shapes) + 1]()
end
LUA
# Connections that send half a request head, all held open at once, then closed.
cat >"$work/half.py" <<'PY'
import socket, sys
path, count = sys.argv[1], int(sys.argv[2])
conns = []
for i in range(count):
    s = socket.socket(socket.AF_UNIX)
    s.settimeout(5)
    s.connect(path)
    s.sendall(b"POST /v1/containers HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\nX-Half: " + str(i).encode())
    conns.append(s)
for s in conns:
    s.close()
PY

api() {
  curl -s --max-time 20 --unix-socket "$work/ployz.sock" -o /dev/null -w '%{http_code}\n' "$@" \
    >>"$work/api.codes" 2>/dev/null || true
}
api_round() {
  local each=$((API_CALLS / 16)) first
  [ "$each" -ge 1 ] || each=1
  first=$(docker ps -q --filter "label=ployz.machine.id=$machine" | head -1)
  head -c 1572864 /dev/urandom >"$work/junk"
  for path in version machines snapshot containers store/containers certificates \
    certificates/status volumes; do
    api --parallel --parallel-max 4 "http://ployz/v1/$path?[1-$each]"
  done
  api --parallel --parallel-max 4 "http://ployz/v1/nope/[1-$each]"
  api --parallel --parallel-max 4 "http://ployz/v1/containers/c[1-$each]/logs"
  api -X POST -H 'Content-Type: application/json' --data-binary '{"image": [' \
    --parallel --parallel-max 4 "http://ployz/v1/containers?[1-$each]"
  api -X POST -H 'Content-Type: application/json' --data-binary "@$work/junk" \
    --parallel --parallel-max 4 "http://ployz/v1/hooks?[1-$each]"
  if [ -n "$first" ]; then
    api --parallel --parallel-max 4 "http://ployz/v1/containers/$first/logs?tail=200&[1-$each]"
    timeout 30 "$PLOYZ" exec soak -- true >/dev/null 2>&1 || true
    timeout 30 "$PLOYZ" logs soak -n 100 >/dev/null 2>&1 || true
  fi
  timeout 30 "$PLOYZ" ps --json >/dev/null 2>&1 || true
  timeout 60 python3 "$work/half.py" "$work/ployz.sock" "$HALF_OPEN" || true
}

per_round=$((REQUESTS / DEPLOYS))
fast=$((per_round * 7 / 10)) burst=$((per_round / 10)) mixed=$((per_round / 10))
tls=$((per_round / 20))
h2=$((per_round - fast - burst - mixed - tls))
wrk_run() { # NAME LUA REQUESTS CONNECTIONS
  local done="$work/done.$1" pid
  rm -f "$done".*
  SOAK_LIMIT=$(( ($3 + 1) / 2 )) SOAK_DONE="$done" \
    wrk -t2 -c"$4" -d240s --timeout 10s -s "$2" "http://127.0.0.1:$HTTP/" >"$work/wrk.$1.out" 2>&1 &
  pid=$!
  echo "$pid" >>"$work/pids"
  for _ in $(seq 1 2400); do
    { [ -e "$done.1" ] && [ -e "$done.2" ]; } || ! kill -0 "$pid" 2>/dev/null && break
    sleep 0.1
  done
  kill -INT "$pid" 2>/dev/null || true
  wait "$pid" || true
}
wrk_done() { awk '/requests in/ {print $1}' "$work/wrk.$1.out" 2>/dev/null | grep . || echo 0; }
curl_run() { # NAME COUNT CURL-ARGS...
  local name=$1 count=$2 pid
  shift 2
  timeout 300 curl -sk --parallel --parallel-max 8 --resolve "soaks.localhost:$HTTPS:127.0.0.1" \
    -o /dev/null -w '%{http_code}\n' "$@" "https://soaks.localhost:$HTTPS/index.html?$name=[1-$count]" \
    >"$work/$name.codes" 2>/dev/null &
  pid=$!
  echo "$pid" >>"$work/pids"
  wait "$pid" || true
}

total=0 deploys=0 failed=0
start_s=$(date +%s)
for round in $(seq 1 "$DEPLOYS"); do
  helpers=()
  wrk_run fast "$work/fast.lua" "$fast" 16 & helpers+=($!)
  wrk_run burst "$work/fast.lua" "$burst" "$BURST" & helpers+=($!)
  wrk_run mixed "$work/mixed.lua" "$mixed" 16 & helpers+=($!)
  # HTTPS: a new TLS connection per request over HTTP/1.1; HTTP/2 on a few connections.
  curl_run tls "$tls" --http1.1 -H 'Connection: close' & helpers+=($!)
  curl_run h2 "$h2" --http2 & helpers+=($!)
  deploy "$round" || failed=$((failed + 1))
  deploys=$((deploys + 1))
  api_round
  for p in "${helpers[@]}"; do wait "$p" || true; done
  helpers=()
  rm -f "$work/pids"
  done_now=$(( $(wrk_done fast) + $(wrk_done burst) + $(wrk_done mixed) + $(wc -l <"$work/tls.codes") + $(wc -l <"$work/h2.codes") ))
  total=$((total + done_now))
  sample "round $round: $total requests, $deploys deploys"
done
elapsed=$(( $(date +%s) - start_s ))
after=$(status_kb VmRSS)
echo "peak (VmHWM) $(mb "$(status_kb VmHWM)")"
# Idle: no traffic, only the daemon's own timers (the observer's resync, idle connections
# expiring); a sample every 10 s.
for t in $(seq 10 10 "$IDLE_SECONDS"); do
  sleep 10
  sample "idle ${t} s"
done
idle=$(status_kb VmRSS)
awk '/^(Rss|Anonymous):/ {printf "  smaps_rollup %-11s %6d kB\n", $1, $2}' "/proc/$daemon/smaps_rollup"
curl -s "http://127.0.0.1:$METRICS/metrics" | grep '^ployz_edge_requests_total' | sed 's/^/  /'
[ "$failed" -eq 0 ] || echo "warning: $failed of $deploys Deploys failed; see the daemon's log" >&2
echo "RSS after $total requests, $deploys deploys and $(wc -l <"$work/api.codes") API calls in ${elapsed} s: $(mb "$after"); after $IDLE_SECONDS s idle: $(mb "$idle")"
