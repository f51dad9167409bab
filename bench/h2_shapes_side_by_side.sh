#!/usr/bin/env bash
# HTTP/2 request shapes side by side: the edge's own HTTP/2 path, the edge with every stream
# through Pingora's proxy (`--no-fast-path`), and nginx 1.22 (TLS, http2, keep-alive upstream
# pool), all in front of one upstream that answers each request with the exact bytes it
# received. For plain shapes it prints what the upstream saw through each (forwarding fields
# left out: they differ by design); for malformed ones (RFC 9113 section 8.1.1) the status or
# the reset each answered. Not a benchmark: the review of what each shape becomes.
#
# Usage: bench/h2_shapes_side_by_side.sh   (knobs: BASE_PORT [18600]; PLOYZ [target/debug/ployz])
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_PORT=${BASE_PORT:-18600}
U=$((BASE_PORT + 1)); N=$((BASE_PORT + 2)); E=$((BASE_PORT + 3)); EH=$((BASE_PORT + 4))
P=$((BASE_PORT + 5)); PH=$((BASE_PORT + 6))
LOG_TAG=h2-shapes
# shellcheck source=bench/lib.sh
source bench/lib.sh

bench_need nginx:nginx nghttp:nghttp2-client python3:python3 openssl:openssl
PLOYZ=${PLOYZ:-target/debug/ployz}
[ -x "$PLOYZ" ] || cargo build -q -p ployz --bin ployz
bench_begin h2_shapes

cat >"$WORK/upstream.py" <<'PY'
import socket, threading, sys
def serve(c):
    buf=b""
    try:
        while True:
            while b"\r\n\r\n" in buf:
                head,rest=buf.split(b"\r\n\r\n",1)
                low=head.lower()
                n=0
                body=b""
                if b"transfer-encoding: chunked" in low:
                    # read until 0-chunk end
                    while b"\r\n0\r\n\r\n" not in rest and not rest.startswith(b"0\r\n\r\n"):
                        d=c.recv(65536)
                        if not d: return
                        rest+=d
                    end=rest.find(b"0\r\n\r\n")+5
                    body=rest[:end]; rest=rest[end:]
                else:
                    for l in low.split(b"\r\n"):
                        if l.startswith(b"content-length:"): n=int(l.split(b":")[1])
                    while len(rest)<n:
                        d=c.recv(65536)
                        if not d: return
                        rest+=d
                    body=rest[:n]; rest=rest[n:]
                req=head+b"\r\n\r\n"+body
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n"%len(req)+req)
                buf=rest
            d=c.recv(65536)
            if not d: return
            buf+=d
    finally:
        c.close()
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)
s.bind(("127.0.0.1",int(sys.argv[1]))); s.listen(64)
while True:
    c,_=s.accept(); threading.Thread(target=serve,args=(c,),daemon=True).start()
PY
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 2 \
  -keyout "$WORK/key.pem" -out "$WORK/cert.pem" -subj "/CN=localhost" \
  -addext "subjectAltName=DNS:localhost" 2>/dev/null
mkdir -p "$WORK/ng"
cat >"$WORK/ng/nginx.conf" <<EOF
worker_processes 1;
daemon off;
pid $WORK/ng/nginx.pid;
error_log $WORK/ng/error.log warn;
events { worker_connections 1024; }
http {
    access_log off;
    upstream up { server 127.0.0.1:$U; keepalive 16; }
    server {
        listen 127.0.0.1:$N ssl http2;
        ssl_certificate $WORK/cert.pem;
        ssl_certificate_key $WORK/key.pem;
        location / {
            proxy_pass http://up;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$host;
        }
    }
}
EOF
python3 "$WORK/upstream.py" "$U" &
PIDS+=($!)
nginx -p "$WORK/ng" -c "$WORK/ng/nginx.conf" >"$WORK/nginx.log" 2>&1 &
PIDS+=($!)
"$PLOYZ" daemon edge --no-access-log --http-listen "127.0.0.1:$EH" --https-listen "127.0.0.1:$E" \
  --tls-cert "$WORK/cert.pem" --tls-key "$WORK/key.pem" --route "localhost=127.0.0.1:$U" \
  2>"$WORK/edge.log" &
PIDS+=($!)
"$PLOYZ" daemon edge --no-fast-path --no-access-log --http-listen "127.0.0.1:$PH" \
  --https-listen "127.0.0.1:$P" --tls-cert "$WORK/cert.pem" --tls-key "$WORK/key.pem" \
  --route "localhost=127.0.0.1:$U" 2>"$WORK/pingora.log" &
PIDS+=($!)
for port in $U $N $E $P; do wait_port "$port"; done

shape() {
  local name=$1; shift
  echo "=== $name"
  for t in edge:$E pingora:$P nginx:$N; do
    out=$(timeout 5 nghttp -n -v "$@" "https://localhost:${t#*:}/" 2>&1 || true)
    status=$(echo "$out" | grep -m1 -o ':status: [0-9]*' | cut -d' ' -f2 || true)
    rst=$(echo "$out" | grep -m1 -oE 'recv (RST_STREAM|GOAWAY).*' | head -1 || true)
    echo "  ${t%%:*}: status=${status:-none} ${rst}"
  done
}
body() {
  local name=$1; shift
  echo "=== $name (what the upstream saw)"
  for t in edge:$E pingora:$P nginx:$N; do
    echo "  --- ${t%%:*}"
    timeout 5 nghttp "$@" "https://localhost:${t#*:}${PATHQ:-/}" 2>&1 | tr -d '\r' | grep -viE "^(x-forwarded|forwarded|\\[WARNING\\])" | sed 's/^/    /' || true
  done
}
body "cookie crumbs" -H 'cookie: a=1' -H 'cookie: b=2'
body "obs-text value" -H $'x-obs: caf\xc3\xa9'
body "value with inner spaces" -H 'x-sp: a  b'
PATHQ='/a%20b?x=%00' body "percent-encoded path"
PATHQ='/a/../b' body "dot segments"
PATHQ='//double' body "double slash"
body "te trailers" -H 'te: trailers'
echo "hello, upstream" >"$WORK/body.txt"
body "post with length" -d "$WORK/body.txt"
shape "uppercase field name" -H 'X-Upper: 1'
shape "connection field" -H 'connection: close'
shape "te gzip" -H 'te: gzip'
shape "transfer-encoding" -H 'transfer-encoding: chunked'
shape "upgrade" -H 'upgrade: websocket'
shape "keep-alive field" -H 'keep-alive: 5'
shape "space in path" -H ':path: /a b'
shape "asterisk path" -H ':path: *'
shape "absolute path" -H ':path: http://localhost/x'
shape "fragment" -H ':path: /a#b'
shape "CONNECT" -H ':method: CONNECT'
shape "bad method" -H ':method: GE T'
shape "authority with userinfo" -H ':authority: u@localhost'
shape "two content-length" -H 'content-length: 1' -H 'content-length: 2'
shape "content-length list" -H 'content-length: 0,0'
shape "content-length text" -H 'content-length: abc'
shape "expect" -H 'expect: 100-continue'
shape "control char in value" -H $'x-ctl: a\x01b'
shape "pseudo after regular" -H 'x-a: 1' -H ':scheme: https'
