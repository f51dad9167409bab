#!/usr/bin/env bash
# Request shapes side by side: the edge's own path, the edge with everything through Pingora's
# proxy (`--no-fast-path`), and nginx 1.22 (keep-alive upstream pool), all in front of one
# upstream that answers each request with the exact bytes it received. Not a benchmark: the
# review of what each shape becomes, before a path takes it on by default.
#
#   HTTP/2 (27 shapes by `nghttp`, over TLS): for plain shapes what the upstream saw through
#     each (forwarding fields left out: they differ by design); for malformed ones (RFC 9113
#     section 8.1.1) the status or the reset each answered.
#   HTTP/1 (44 shapes by raw requests over TCP): HTTP/1.0 and `Connection`, `Expect`, chunked
#     framing; the status lines each answered, the `Connection` said, whether the connection
#     stayed open, and for chunked framing what body the upstream got.
#
# Usage: bench/shapes_side_by_side.sh   (knobs: BASE_PORT [18600]; PLOYZ [target/debug/ployz])
set -euo pipefail
cd "$(dirname "$0")/.."

BASE_PORT=${BASE_PORT:-18600}
U=$((BASE_PORT + 1)); N=$((BASE_PORT + 2)); E=$((BASE_PORT + 3)); EH=$((BASE_PORT + 4))
P=$((BASE_PORT + 5)); PH=$((BASE_PORT + 6)); NH=$((BASE_PORT + 7))
LOG_TAG=shapes
# shellcheck source=bench/lib.sh
source bench/lib.sh

bench_need nginx:nginx nghttp:nghttp2-client python3:python3 openssl:openssl
PLOYZ=${PLOYZ:-target/debug/ployz}
[ -x "$PLOYZ" ] || cargo build -q -p ployz --bin ployz
bench_begin shapes

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
        listen 127.0.0.1:$NH;
        location / {
            proxy_pass http://up;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host \$host;
        }
    }
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
for port in $U $N $NH $E $EH $P $PH; do wait_port "$port"; done

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
echo "## HTTP/2"
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

echo
echo "## HTTP/1 (edge: $EH, pingora: $PH, nginx: $NH)"
cat >"$WORK/h1_shapes.py" <<'PY'
import socket, sys, time
targets = {"edge": int(sys.argv[1]), "pingora": int(sys.argv[2]), "nginx": int(sys.argv[3])}
def talk(port, parts, wait=0.6):
    s=socket.create_connection(("127.0.0.1",port)); s.settimeout(wait)
    got=b""
    for i,p in enumerate(parts):
        if isinstance(p,float):
            # read what comes within p seconds
            end=time.time()+p
            while time.time()<end:
                try:
                    d=s.recv(65536)
                    if not d: break
                    got+=d
                except socket.timeout: break
            continue
        s.sendall(p)
    closed=False
    end=time.time()+wait
    while time.time()<end:
        try:
            d=s.recv(65536)
            if not d: closed=True; break
            got+=d
        except socket.timeout: break
        except ConnectionResetError: closed=True; break
    s.close()
    return got, closed
def summary(got, closed):
    out=[]
    for block in got.split(b"HTTP/1.")[1:]:
        line=block.split(b"\r\n",1)[0].decode(errors="replace")
        head=block.split(b"\r\n\r\n",1)[0].lower()
        conn=[l.split(b":",1)[1].strip().decode() for l in head.split(b"\r\n") if l.startswith(b"connection:")]
        te=b"transfer-encoding" in head
        out.append(f"{line[2:]}" + (f" conn={conn[0]}" if conn else "") + (" chunked" if te else ""))
    return " | ".join(out) + (" [closed]" if closed else " [open]")
def summary_body(got, closed):
    if not got: return "(nothing)" + (" [closed]" if closed else " [open]")
    line=got.split(b"\r\n",1)[0].decode(errors="replace")
    body=got.split(b"\r\n\r\n",1)[1] if b"\r\n\r\n" in got else b""
    up=b""
    if body.startswith(b"POST") or body.startswith(b"PUT"):
        uh, _, ub = body.partition(b"\r\n\r\n")
        te=b"transfer-encoding: chunked" in uh.lower()
        up=(b"TE " if te else b"") + ub[:60]
    return f"{line} up={up!r}" + (" [closed]" if closed else " [open]")
H=b"Host: localhost\r\n"
shapes=[
 ("1.0 no Host", [b"GET /a HTTP/1.0\r\n\r\n"]),
 ("1.0 plain", [b"GET /a HTTP/1.0\r\n"+H+b"\r\n"]),
 ("1.0 keep-alive", [b"GET /a HTTP/1.0\r\n"+H+b"Connection: keep-alive\r\n\r\n"]),
 ("1.0 Keep-Alive case", [b"GET /a HTTP/1.0\r\n"+H+b"Connection: Keep-Alive\r\n\r\n"]),
 ("1.0 keep-alive, close", [b"GET /a HTTP/1.0\r\n"+H+b"Connection: keep-alive, close\r\n\r\n"]),
 ("1.0 two Connection fields", [b"GET /a HTTP/1.0\r\n"+H+b"Connection: keep-alive\r\nConnection: close\r\n\r\n"]),
 ("1.0 keep-alive pipelined x2", [b"GET /a HTTP/1.0\r\n"+H+b"Connection: keep-alive\r\n\r\nGET /b HTTP/1.0\r\n"+H+b"Connection: keep-alive\r\n\r\n"]),
 ("1.0 POST keep-alive", [b"POST /a HTTP/1.0\r\n"+H+b"Connection: keep-alive\r\nContent-Length: 5\r\n\r\nhello"]),
 ("1.0 chunked POST", [b"POST /a HTTP/1.0\r\n"+H+b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"]),
 ("1.0 Expect", [b"POST /a HTTP/1.0\r\n"+H+b"Expect: 100-continue\r\nContent-Length: 5\r\n\r\n", 0.5, b"hello"]),
 ("1.1 Expect body later", [b"POST /a HTTP/1.1\r\n"+H+b"Expect: 100-continue\r\nContent-Length: 5\r\n\r\n", 0.5, b"hello"]),
 ("1.1 Expect body with head", [b"POST /a HTTP/1.1\r\n"+H+b"Expect: 100-continue\r\nContent-Length: 5\r\n\r\nhello"]),
 ("1.1 Expect case", [b"POST /a HTTP/1.1\r\n"+H+b"Expect: 100-Continue\r\nContent-Length: 5\r\n\r\n", 0.5, b"hello"]),
 ("1.1 Expect no body", [b"GET /a HTTP/1.1\r\n"+H+b"Expect: 100-continue\r\n\r\n"]),
 ("1.1 Expect CL 0", [b"POST /a HTTP/1.1\r\n"+H+b"Expect: 100-continue\r\nContent-Length: 0\r\n\r\n"]),
 ("1.1 Expect other", [b"POST /a HTTP/1.1\r\n"+H+b"Expect: something\r\nContent-Length: 5\r\n\r\nhello"]),
 ("1.1 Expect twice", [b"POST /a HTTP/1.1\r\n"+H+b"Expect: 100-continue\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\nhello"]),
 ("1.1 Expect list", [b"POST /a HTTP/1.1\r\n"+H+b"Expect: 100-continue, x\r\nContent-Length: 5\r\n\r\nhello"]),
 ("1.1 Expect, client gives up", [b"POST /a HTTP/1.1\r\n"+H+b"Expect: 100-continue\r\nContent-Length: 5\r\n\r\n", 0.5]),
]
HP=b"POST /a HTTP/1.1\r\nHost: localhost\r\n"
T=HP+b"Transfer-Encoding: chunked\r\n\r\n"
framing=[
 ("plain", T+b"5\r\nhello\r\n0\r\n\r\n"),
 ("extension", T+b"5;a=b\r\nhello\r\n0\r\n\r\n"),
 ("extension quoted", T+b"5;a=\"b;c\"\r\nhello\r\n0\r\n\r\n"),
 ("trailer", T+b"5\r\nhello\r\n0\r\nX-T: 1\r\n\r\n"),
 ("leading zeros", T+b"0005\r\nhello\r\n0\r\n\r\n"),
 ("uppercase hex", T+b"A\r\nhellohello\r\n0\r\n\r\n"),
 ("bare LF size line", T+b"5\nhello\r\n0\r\n\r\n"),
 ("bare LF after data", T+b"5\r\nhello\n0\r\n\r\n"),
 ("space before CRLF", T+b"5 \r\nhello\r\n0\r\n\r\n"),
 ("0x prefix", T+b"0x5\r\nhello\r\n0\r\n\r\n"),
 ("negative", T+b"-5\r\nhello\r\n0\r\n\r\n"),
 ("huge size", T+b"ffffffffffffffffff\r\nhello\r\n0\r\n\r\n"),
 ("data too long", T+b"3\r\nhello\r\n0\r\n\r\n"),
 ("no last chunk yet", T+b"5\r\nhello\r\n"),
 ("TE Chunked case", HP+b"Transfer-Encoding: Chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
 ("TE gzip, chunked", HP+b"Transfer-Encoding: gzip, chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
 ("TE chunked, identity", HP+b"Transfer-Encoding: chunked, identity\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
 ("TE twice", HP+b"Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
 ("TE + CL", HP+b"Transfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
 ("TE space before colon", HP+b"Transfer-Encoding : chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
 ("TE tab value", HP+b"Transfer-Encoding:\tchunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
 ("TE in HTTP/1.0", b"POST /a HTTP/1.0\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
 ("CL 70000 body", HP+b"Content-Length: 70000\r\n\r\n"+b"x"*70000),
 ("CL 70000 short", HP+b"Content-Length: 70000\r\n\r\n"+b"x"*100),
 ("chunked then pipelined GET", T+b"5\r\nhello\r\n0\r\n\r\nGET /b HTTP/1.1\r\nHost: localhost\r\n\r\n"),
]

for name, parts in shapes:
    print("===", name)
    for t, port in targets.items():
        got, closed = talk(port, parts)
        print(f"  {t:8} {summary(got, closed)}")
for name, data in framing:
    print("===", name, "(what the upstream saw)")
    for t, port in targets.items():
        got, closed = talk(port, [data], wait=0.8)
        print(f"  {t:8} {summary_body(got, closed)}")
PY
python3 "$WORK/h1_shapes.py" "$EH" "$PH" "$NH"
