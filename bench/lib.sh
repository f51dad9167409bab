# What the side-by-side scripts share. Sourced, not run: `source bench/lib.sh` after setting
# LOG_TAG; then `bench_need` for packages, `bench_begin PREFIX` for the work directory, the PID
# list every started process goes into, autogroup scheduling off and the cleanup on exit.

log() { printf '[%s] %s\n' "${LOG_TAG:-bench}" "$*" >&2; }

# bench_need COMMAND:PACKAGE...: installs the packages whose command is missing.
bench_need() {
  local need=() pair
  for pair in "$@"; do
    command -v "${pair%%:*}" >/dev/null || need+=("${pair#*:}")
  done
  if [ ${#need[@]} -gt 0 ]; then
    log "installing: ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  fi
}

# bench_begin PREFIX: WORK (a new directory under /tmp), PIDS (append every process started),
# Linux's autogroup scheduling off for the run (a server started in a session of its own would
# otherwise get half the CPU a client in another session gets), and on exit every process in
# PIDS ended (TERM, five seconds, KILL), autogroup restored and WORK removed.
bench_begin() {
  WORK=$(mktemp -d "/tmp/$1.XXXXXX")
  PIDS=()
  AUTOGROUP=/proc/sys/kernel/sched_autogroup_enabled
  AUTOGROUP_WAS=""
  if [ -w "$AUTOGROUP" ] && [ "$(cat "$AUTOGROUP")" = 1 ]; then
    AUTOGROUP_WAS=1
    echo 0 >"$AUTOGROUP"
  fi
  trap bench_cleanup EXIT
  trap 'exit 130' INT TERM
}

bench_cleanup() {
  if [ -n "$AUTOGROUP_WAS" ]; then echo 1 >"$AUTOGROUP"; fi
  local pid
  for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -rf "$WORK"
}

# bench_chunked_body FILE: the chunked upload the benches send, 4,000 bytes of data in four
# chunks (sizes in hex), then the last chunk: a valid encoding, written to FILE.
bench_chunked_body() {
  {
    for size in 1024 1024 1024 928; do
      printf '%x\r\n' "$size"
      head -c "$size" /dev/zero | tr '\0' 'c'
      printf '\r\n'
    done
    printf '0\r\n\r\n'
  } >"$1"
}

# Waits up to ten seconds for a TCP listener on 127.0.0.1:$1.
wait_port() {
  for _ in $(seq 1 100); do
    (exec 3<>/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
    sleep 0.1
  done
  log "nothing listens on $1"
  return 1
}

# The upstream every HTTP side-by-side target proxies to: one nginx worker on 127.0.0.1:$1
# answering 200 with "$2" and a newline to every request (bodies up to 10 MiB read and
# discarded), no access log, keep-alive without a request limit. Started in $WORK/up, its PID
# in PIDS, ready when this returns.
bench_upstream_nginx() {
  mkdir -p "$WORK/up"
  cat >"$WORK/up/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $WORK/up/nginx.pid;
error_log $WORK/up/error.log warn;
events { worker_connections 4096; }
http {
    access_log off;
    keepalive_requests 1000000;
    client_max_body_size 10m;
    server {
        listen 127.0.0.1:$1;
        location / { return 200 "$2\n"; }
    }
}
EOF
  nginx -p "$WORK/up" -c "$WORK/up/nginx.conf" >"$WORK/up.log" 2>&1 &
  PIDS+=($!)
  wait_port "$1"
}

# The forwarding fields the edge adds to every request it sends upstream (X-Forwarded-For,
# Forwarded, X-Forwarded-Proto, X-Forwarded-Host), as nginx `location` lines and as haproxy
# `frontend` lines for scheme $1: the peers do the same work, and the upstream reads the same
# fields from each.
bench_nginx_forwarding() {
  cat <<'EOF'
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_set_header Forwarded "for=$remote_addr;host=\"$http_host\";proto=$scheme";
            proxy_set_header X-Forwarded-Proto $scheme;
            proxy_set_header X-Forwarded-Host $http_host;
EOF
}
bench_haproxy_forwarding() {
  cat <<EOF
    option forwardfor
    http-request set-header Forwarded "for=%[src];host=\\"%[req.hdr(host)]\\";proto=$1"
    http-request set-header X-Forwarded-Proto $1
    http-request set-header X-Forwarded-Host %[req.hdr(host)]
EOF
}

# A process and its descendants.
tree_pids() {
  local c
  echo "$1"
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do tree_pids "$c"; done
}

# CPU ticks (user + system) of a process tree so far; with `user` as second argument, user
# space only.
cpu_ticks() {
  local t=0 p v fields='$12 + $13'
  [ "${2:-}" = user ] && fields='$12'
  for p in $(tree_pids "$1"); do
    v=$(awk "{ sub(/^.*\\) /, \"\"); print $fields }" "/proc/$p/stat" 2>/dev/null) || continue
    t=$((t + ${v:-0}))
  done
  echo "$t"
}

# The median of the numbers on stdin (space- or line-separated; `nan` left out).
median() {
  # grep finding nothing (every run's figure nan) is no failure: the median is then nan.
  tr ' ' '\n' | { grep -v -e '^$' -e nan || true; } | sort -g |
    awk '{a[NR]=$1} END { if (NR == 0) print "nan"; else if (NR%2) print a[(NR+1)/2]; else printf "%.2f\n", (a[NR/2]+a[NR/2+1])/2 }'
}
