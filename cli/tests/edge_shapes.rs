//! Request and response shapes at the edge, on both of its paths: raw requests over TCP to
//! `ployz daemon edge`, and a raw upstream that records the exact bytes it receives. Every test
//! runs twice: with the HTTP/1 fast path, and with `--no-fast-path` (everything through
//! Pingora's proxy).

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::*;

/// One answer as the client read it.
#[derive(Debug)]
struct Answer {
    status: u16,
    /// The head as received, status line included.
    head: String,
    body: Vec<u8>,
}

impl Answer {
    fn says_close(&self) -> bool {
        self.head.lines().any(|l| {
            let l = l.to_ascii_lowercase();
            l.starts_with("connection:") && l.contains("close")
        })
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A client connection that reads answers one by one.
struct Client {
    s: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    fn open(port: u16) -> Client {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Client { s, buf: Vec::new() }
    }

    fn send(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap();
    }

    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 16384];
        match self.s.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// The next answer; panics when the connection ends first.
    fn answer(&mut self) -> Answer {
        let head_end = loop {
            if let Some(i) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if let Some(i) = self.buf.windows(2).position(|w| w == b"\n\n") {
                break i + 2;
            }
            assert!(
                self.fill(),
                "the connection ended before an answer: {:?}",
                String::from_utf8_lossy(&self.buf)
            );
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        let status = head
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let lower = head.to_ascii_lowercase();
        let length = lower
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .map(|v| v.trim().parse::<usize>().unwrap());
        self.buf.drain(..head_end);
        let body = if lower.contains("transfer-encoding: chunked") {
            let mut body = Vec::new();
            loop {
                let line_end = loop {
                    if let Some(i) = self.buf.windows(2).position(|w| w == b"\r\n") {
                        break i;
                    }
                    assert!(self.fill(), "a chunked body broke off");
                };
                let size = usize::from_str_radix(
                    String::from_utf8_lossy(&self.buf[..line_end])
                        .split(';')
                        .next()
                        .unwrap()
                        .trim(),
                    16,
                )
                .unwrap();
                while self.buf.len() < line_end + 2 + size + 2 {
                    assert!(self.fill(), "a chunked body broke off");
                }
                body.extend_from_slice(&self.buf[line_end + 2..line_end + 2 + size]);
                self.buf.drain(..line_end + 2 + size + 2);
                if size == 0 {
                    break body;
                }
            }
        } else {
            let length = length.unwrap_or(0);
            while self.buf.len() < length {
                assert!(self.fill(), "a body broke off");
            }
            self.buf.drain(..length).collect()
        };
        Answer { status, head, body }
    }

    /// Whether the edge closed the connection (EOF or reset) within `within`, with nothing
    /// more sent.
    fn closed_within(&mut self, within: Duration) -> bool {
        self.s.set_read_timeout(Some(within)).unwrap();
        let mut byte = [0u8; 1];
        let closed = match self.s.read(&mut byte) {
            Ok(0) => true,
            Ok(_) => panic!("unexpected bytes: {:?}", String::from_utf8_lossy(&byte)),
            Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        };
        self.s
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        closed
    }
}

/// One request on its own connection; the answer.
fn one(port: u16, request: &[u8]) -> Answer {
    let mut c = Client::open(port);
    c.send(request);
    c.answer()
}

fn every_forwarded_for_line_reaches_the_upstream(position: Position) {
    let up = Upstream::start(echo_request_line);
    let (edge, _child) = edge_alone_in(position, &up.route("s.test"), &[]);
    let mut request = String::from("GET /xff HTTP/1.1\r\nHost: s.test\r\n");
    let chain: Vec<String> = (1..=12).map(|i| format!("10.0.0.{i}")).collect();
    for hop in &chain {
        request.push_str(&format!("X-Forwarded-For: {hop}\r\n"));
    }
    request.push_str("\r\n");
    assert_eq!(one(edge, request.as_bytes()).status, 200);
    let seen = up.wait_for(1);
    assert_eq!(
        fields(&seen[0], "x-forwarded-for"),
        vec![format!("{}, 127.0.0.1", chain.join(", "))],
        "{}",
        seen[0]
    );
}

fn content_length_is_one_plain_decimal_or_the_request_is_refused(position: Position) {
    let up = Upstream::start(echo_request_line);
    let (edge, _child) = edge_alone_in(position, &up.route("s.test"), &[]);
    for refused in [
        &b"POST /list HTTP/1.1\r\nHost: s.test\r\nContent-Length: 5,5\r\n\r\nhello"[..],
        b"POST /duplicates HTTP/1.1\r\nHost: s.test\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
        b"POST /plus HTTP/1.1\r\nHost: s.test\r\nContent-Length: +5\r\n\r\nhello",
    ] {
        let answer = one(edge, refused);
        assert_eq!(
            answer.status,
            400,
            "{}: {answer:?}",
            String::from_utf8_lossy(refused)
        );
    }
    for (path, length, body) in [
        ("/zero", "05", "hello"),
        ("/zeros", "00000000000000000000000005", "world"),
    ] {
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: s.test\r\nContent-Length: {length}\r\n\r\n{body}"
        );
        let answer = one(edge, request.as_bytes());
        assert_eq!(answer.status, 200, "{answer:?}");
    }
    let seen = up.wait_for(2);
    for (request, body) in seen.iter().zip(["hello", "world"]) {
        let (head, sent) = request.split_once("\r\n\r\n").unwrap();
        assert_eq!(fields(head, "content-length"), vec!["5"], "{request}");
        assert_eq!(sent, body);
    }
}

fn absolute_form_targets_go_upstream_in_origin_form_and_others_are_refused(position: Position) {
    let up = Upstream::start(echo_request_line);
    let (edge, _child) = edge_alone_in(
        position,
        &up.route("a.test"),
        &["--route", &up.route("b.test")],
    );
    let cases = [
        (
            "GET https://a.test/p?q=1 HTTP/1.1\r\nHost: a.test\r\n\r\n",
            "GET /p?q=1 HTTP/1.1",
            "a.test",
        ),
        // The target's authority names the host (RFC 9112 3.2.2).
        (
            "GET http://b.test HTTP/1.1\r\n\r\n",
            "GET / HTTP/1.1",
            "b.test",
        ),
        (
            "GET HTTP://b.test:80?x=1 HTTP/1.1\r\nHost: b.test:80\r\n\r\n",
            "GET /?x=1 HTTP/1.1",
            "b.test:80",
        ),
    ];
    for (request, _, _) in cases {
        let answer = one(edge, request.as_bytes());
        assert_eq!(answer.status, 200, "{request}: {answer:?}");
    }
    let seen = up.wait_for(cases.len());
    for (received, (request, line, host)) in seen.iter().zip(cases) {
        let head = received.split("\r\n\r\n").next().unwrap();
        assert_eq!(head.lines().next(), Some(line), "{request} -> {received}");
        assert_eq!(fields(head, "host"), vec![host], "{received}");
        assert_eq!(fields(head, "x-forwarded-host"), vec![host], "{received}");
        assert_eq!(
            fields(head, "x-forwarded-proto"),
            vec!["http"],
            "{received}"
        );
    }
    for refused in [
        "OPTIONS * HTTP/1.1\r\nHost: a.test\r\n\r\n",
        "GET ?a=1 HTTP/1.1\r\nHost: a.test\r\n\r\n",
        "GET ftp://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
        "GET http://user@a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
        "GET http:///x HTTP/1.1\r\nHost: a.test\r\n\r\n",
        // A Host that names another host than the target is ambiguous.
        "GET http://b.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n",
        "GET a.test:80 HTTP/1.1\r\nHost: a.test\r\n\r\n",
        "CONNECT a.test:443 HTTP/1.1\r\nHost: a.test\r\n\r\n",
    ] {
        let answer = one(edge, refused.as_bytes());
        assert!(
            answer.status == 400 || (refused.starts_with("CONNECT") && answer.status == 405),
            "{refused}: {answer:?}"
        );
    }
    assert_eq!(up.requests().len(), cases.len(), "{:#?}", up.requests());
}

fn pipelined_requests_behind_any_request_are_answered_in_order(position: Position) {
    let up = Upstream::start(echo_request_line);
    let (edge, _child) = edge_alone_in(position, &up.route("s.test"), &[]);
    let big = "b".repeat(100_000);
    let shapes: Vec<(String, Vec<&str>)> = vec![
        // An HTTP/1.0 keep-alive request (Pingora's path) with the next one behind it.
        (
            "GET /ten HTTP/1.0\r\nHost: s.test\r\nConnection: keep-alive\r\n\r\n\
             GET /after-ten HTTP/1.1\r\nHost: s.test\r\n\r\n"
                .to_owned(),
            vec!["GET /ten", "GET /after-ten"],
        ),
        // A chunked body, then the next request in the same packet.
        (
            "POST /chunked HTTP/1.1\r\nHost: s.test\r\nTransfer-Encoding: chunked\r\n\r\n\
             5\r\nhello\r\n0\r\n\r\nGET /after-chunked HTTP/1.1\r\nHost: s.test\r\n\r\n"
                .to_owned(),
            vec!["POST /chunked", "GET /after-chunked"],
        ),
        // A body over the fast path's limit, then the next request.
        (
            format!(
                "POST /big HTTP/1.1\r\nHost: s.test\r\nContent-Length: {}\r\n\r\n{big}\
                 GET /after-big HTTP/1.1\r\nHost: s.test\r\n\r\n",
                big.len()
            ),
            vec!["POST /big", "GET /after-big"],
        ),
        // Three plain ones and a short body.
        (
            "GET /1 HTTP/1.1\r\nHost: s.test\r\n\r\nPOST /2 HTTP/1.1\r\nHost: s.test\r\n\
             Content-Length: 3\r\n\r\nabcGET /3 HTTP/1.1\r\nHost: s.test\r\n\r\n"
                .to_owned(),
            vec!["GET /1", "POST /2", "GET /3"],
        ),
    ];
    let mut expected = 0;
    for (bytes, lines) in &shapes {
        let mut c = Client::open(edge);
        c.send(bytes.as_bytes());
        for line in lines {
            let answer = c.answer();
            assert_eq!(
                (answer.status, answer.text()),
                (200, line.to_string()),
                "{answer:?}"
            );
        }
        expected += lines.len();
    }
    let seen = up.wait_for(expected);
    let bodies: Vec<&str> = seen
        .iter()
        .filter_map(|r| r.split_once("\r\n\r\n").map(|(_, b)| b))
        .filter(|b| !b.is_empty())
        .collect();
    assert_eq!(bodies.len(), 3, "{seen:#?}");
    assert!(bodies.contains(&big.as_str()));
}

/// A response head whose lines end in a bare LF.
fn bare_lf_answer(request: &[u8]) -> Vec<u8> {
    let _ = request;
    b"HTTP/1.1 200 OK\nContent-Length: 2\nX-Upstream: lf\n\nok".to_vec()
}

fn response_heads_with_bare_line_feeds_reach_the_client_with_crlf(position: Position) {
    let up = Upstream::start(bare_lf_answer);
    let (edge, _child) = edge_alone_in(position, &up.route("s.test"), &[]);
    let mut c = Client::open(edge);
    for _ in 0..2 {
        c.send(b"GET / HTTP/1.1\r\nHost: s.test\r\n\r\n");
        let answer = c.answer();
        assert_eq!((answer.status, answer.text().as_str()), (200, "ok"));
        assert_eq!(fields(&answer.head, "x-upstream"), vec!["lf"], "{answer:?}");
        let head = answer.head.as_bytes();
        assert!(
            head.iter()
                .enumerate()
                .all(|(i, b)| *b != b'\n' || (i > 0 && head[i - 1] == b'\r')),
            "a bare LF reached the client: {:?}",
            answer.head
        );
    }
}

fn fields_named_with_underscores_are_dropped_unless_passed(position: Position) {
    let up = Upstream::start(echo_request_line);
    let (edge, _child) = edge_alone_in(position, &up.route("s.test"), &[]);
    let request = b"GET / HTTP/1.1\r\nHost: s.test\r\nX_Forwarded_For: 6.6.6.6\r\nTransfer_Encoding: chunked\r\nX-Kept: 1\r\n\r\n";
    assert_eq!(one(edge, request).status, 200);
    let seen = up.wait_for(1);
    let head = seen[0].split("\r\n\r\n").next().unwrap();
    assert!(!head.contains('_'), "{head}");
    assert_eq!(fields(head, "x-kept"), vec!["1"]);
    assert_eq!(fields(head, "x-forwarded-for"), vec!["127.0.0.1"]);
    let (passing, _passing_child) = edge_alone_in(
        position,
        &up.route("s.test"),
        &["--underscore-headers", "pass"],
    );
    assert_eq!(one(passing, request).status, 200);
    let seen = up.wait_for(2);
    assert_eq!(
        fields(&seen[1], "x_forwarded_for"),
        vec!["6.6.6.6"],
        "{}",
        seen[1]
    );
    assert_eq!(fields(&seen[1], "transfer_encoding"), vec!["chunked"]);
}

/// A listener whose accept queue is full: connections to it neither succeed nor fail, as with
/// a container that died while Docker was away. Dropping it closes it.
struct SilentUpstream {
    listener: TcpListener,
    _queued: Vec<TcpStream>,
}

impl SilentUpstream {
    fn start() -> SilentUpstream {
        use std::os::fd::FromRawFd;
        // SAFETY: a socket made, bound and put to listen with a backlog of 0 by plain libc
        // calls; its descriptor is owned by the TcpListener from then on.
        let listener = unsafe {
            let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0);
            assert!(fd >= 0);
            let addr = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: 0,
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes([127, 0, 0, 1]),
                },
                sin_zero: [0; 8],
            };
            assert_eq!(
                libc::bind(
                    fd,
                    &addr as *const libc::sockaddr_in as *const libc::sockaddr,
                    std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t,
                ),
                0
            );
            assert_eq!(libc::listen(fd, 0), 0);
            TcpListener::from_raw_fd(fd)
        };
        let addr = listener.local_addr().unwrap();
        let mut queued = Vec::new();
        loop {
            match TcpStream::connect_timeout(&addr, Duration::from_millis(300)) {
                Ok(s) => queued.push(s),
                Err(_) => break,
            }
            assert!(queued.len() < 16, "the accept queue never filled");
        }
        SilentUpstream {
            listener,
            _queued: queued,
        }
    }

    fn port(&self) -> u16 {
        self.listener.local_addr().unwrap().port()
    }
}

fn a_silent_upstream_costs_at_most_the_connect_timeout(position: Position) {
    let silent = SilentUpstream::start();
    let up = Upstream::start(echo_request_line);
    let route = format!("d.test=127.0.0.1:{},127.0.0.1:{}", silent.port(), up.port);
    // The default timeout (1 s), as a Machine runs with.
    let (edge, _child) = edge_alone_in(position, &route, &[]);
    let took: Vec<Duration> = (0..6)
        .map(|i| {
            let start = Instant::now();
            let answer = one(
                edge,
                format!("GET /{i} HTTP/1.1\r\nHost: d.test\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            );
            assert_eq!(answer.status, 200, "{answer:?}");
            start.elapsed()
        })
        .collect();
    eprintln!("request times with a silent upstream first in line ({position:?}): {took:?}");
    // A request that tried the silent upstream waited the whole connect timeout: at least 1 s
    // however fast or loaded the machine (the other requests take milliseconds).
    const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
    let slow = took.iter().filter(|t| **t >= CONNECT_TIMEOUT).count();
    assert!(
        slow == 1,
        "one request pays the connect timeout, then the silent upstream is avoided: {took:?}"
    );
    // Paid once, not twice: the bound is a whole timeout above the one paid.
    let worst = took.iter().max().unwrap();
    assert!(
        *worst < 2 * CONNECT_TIMEOUT,
        "a request waited {worst:?} for a silent upstream (connect timeout 1 s)"
    );
    drop(silent);
}

fn sigterm_answers_kept_alive_clients_once_with_close_then_closes_between_requests(
    position: Position,
) {
    let up = Upstream::start(echo_request_line);
    let (edge, child) = edge_alone_in(
        position,
        &up.route("s.test"),
        &["--drain-delay", "4", "--shutdown-grace", "30"],
    );
    let mut child = child;
    let kept = |n: usize| -> Vec<Client> {
        (0..n)
            .map(|_| {
                let mut c = Client::open(edge);
                c.send(b"GET /before HTTP/1.1\r\nHost: s.test\r\n\r\n");
                let answer = c.answer();
                assert_eq!(answer.status, 200);
                assert!(!answer.says_close(), "{answer:?}");
                c
            })
            .collect()
    };
    let mut during = kept(10);
    let mut in_flight = kept(10);
    let mut idle = kept(10);
    // SAFETY: a signal to the child this test started.
    unsafe {
        libc::kill(child.0.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while one(
        edge,
        b"GET /.ployz/health HTTP/1.1\r\nHost: s.test\r\nConnection: close\r\n\r\n",
    )
    .status
        != 503
    {
        assert!(Instant::now() < deadline, "health never turned to draining");
        std::thread::sleep(Duration::from_millis(20));
    }
    // During the drain delay: one more answer, saying close, then the connection ends.
    for c in &mut during {
        c.send(b"GET /during HTTP/1.1\r\nHost: s.test\r\n\r\n");
        let answer = c.answer();
        assert_eq!(answer.status, 200, "{answer:?}");
        assert!(answer.says_close(), "{answer:?}");
        assert!(c.closed_within(Duration::from_secs(2)));
    }
    // Requests still in flight when the listener closes are answered.
    for c in &mut in_flight {
        c.send(b"GET /hold HTTP/1.1\r\nHost: s.test\r\n\r\n");
    }
    up.wait_for(30 + 10 + 10);
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", edge)).is_ok() {
        assert!(Instant::now() < deadline, "the listener never closed");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Idle kept-alive connections are closed, between requests: each still waits up to 2 s
    // (the edge's IDLE_AT_SHUTDOWN) for a request crossing the close, counted from when the
    // edge closed its listeners, not from when this test saw it. Bounded well below the 30 s
    // grace period they would otherwise be held for.
    for c in &mut idle {
        assert!(c.closed_within(Duration::from_secs(6)));
    }
    assert!(
        child.0.try_wait().unwrap().is_none(),
        "the edge exited with requests in flight"
    );
    up.release();
    for c in &mut in_flight {
        let answer = c.answer();
        assert_eq!((answer.status, answer.text().as_str()), (200, "GET /hold"));
        assert!(answer.says_close(), "{answer:?}");
        assert!(c.closed_within(Duration::from_secs(2)));
    }
    // Then the edge exits, well within its grace period.
    let deadline = Instant::now() + Duration::from_secs(5);
    while child.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the edge did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn the_fast_path_setting_decides_who_writes_the_response_head(position: Position) {
    let up = Upstream::start(echo_request_line);
    let (edge, _child) = edge_alone_in(position, &up.route("s.test"), &[]);
    let answer = one(edge, b"GET / HTTP/1.1\r\nHost: s.test\r\n\r\n");
    assert_eq!(answer.status, 200);
    // The fast path passes the upstream's head as it came; Pingora's proxy writes its own,
    // with a Date.
    let dated = !fields(&answer.head, "date").is_empty();
    match position {
        Position::FastPath => assert!(!dated, "{answer:?}"),
        Position::PingoraOnly => assert!(dated, "{answer:?}"),
    }
}

/// The edge alone with `--https-listen`: HTTPS by SNI with the certificate from files, HTTP/1.1
/// and HTTP/2 by ALPN (what `edge-bench --tls-listen` runs for HTTPS side by sides); a
/// certificate for none of the routes' hostnames is refused before anything listens.
fn https_on_the_edge_alone_with_a_certificate_from_files(position: Position) {
    let dir = tempfile::tempdir().unwrap();
    let (cert_file, key_file, _) = self_signed(dir.path(), "tls.test");
    let up = Upstream::start(echo_request_line);
    let [https] = free_ports();
    let listen = format!("127.0.0.1:{https}");
    let tls_args = [
        "--https-listen",
        listen.as_str(),
        "--tls-cert",
        cert_file.to_str().unwrap(),
        "--tls-key",
        key_file.to_str().unwrap(),
    ];
    let (_edge, _child) = edge_alone_in(position, &up.route("tls.test"), &tls_args);
    let resolve = format!("tls.test:{https}:127.0.0.1");
    let url = format!("https://tls.test:{https}/over-tls");
    let get = |version: &str| {
        let out = std::process::Command::new("curl")
            .args(["-sS", "-m", "10", version, "--cacert"])
            .arg(&cert_file)
            .args(["--resolve", &resolve, "-w", "\n%{http_version}", &url])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "curl {version}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    wait_listening(https, "the HTTPS listener");
    assert_eq!(get("--http1.1"), "GET /over-tls\n1.1");
    assert_eq!(get("--http2"), "GET /over-tls\n2");

    // A certificate for another name: refused, naming the file, before anything listens.
    let other_key = rcgen::KeyPair::generate().unwrap();
    let other = rcgen::CertificateParams::new(vec!["other.test".to_owned()])
        .unwrap()
        .self_signed(&other_key)
        .unwrap();
    let other_file = dir.path().join("other.pem");
    std::fs::write(&other_file, other.pem()).unwrap();
    let [port, https2] = free_ports();
    let out = std::process::Command::new(PLOYZ)
        .args(["daemon", "edge", "--http-listen"])
        .arg(format!("127.0.0.1:{port}"))
        .args(["--route", &up.route("tls.test"), "--https-listen"])
        .arg(format!("127.0.0.1:{https2}"))
        .arg("--tls-cert")
        .arg(&other_file)
        .arg("--tls-key")
        .arg(&key_file)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("--tls-cert") && said.contains("serves none of the routes' hostnames"),
        "{said}"
    );
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}

/// 200 with the request line as the body, chunked for `/chunked...` (with an interim 103
/// first for `/interim...`).
fn framed_by_path(request: &[u8]) -> Vec<u8> {
    let line = method_and_target(request);
    let target = line.split(' ').nth(1).unwrap_or_default();
    let interim = if target.starts_with("/interim") {
        "HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\n"
    } else {
        ""
    };
    if target.starts_with("/chunked") {
        let (a, b) = line.split_at(line.len() / 2);
        format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
            a.len(),
            b.len()
        )
        .into_bytes()
    } else {
        format!(
            "{interim}HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{line}",
            line.len()
        )
        .into_bytes()
    }
}

/// HTTP/1.0 clients that ask to keep their connection keep it (the answer says
/// `Connection: keep-alive`), get no interim responses, and a chunked body unframed, the
/// connection ending with it; those that do not ask are answered once.
fn http10_clients_keep_their_connection_when_they_ask(position: Position) {
    let up = Upstream::start(framed_by_path);
    let (edge, _child) = edge_alone_in(position, &up.route("s.test"), &[]);
    let mut c = Client::open(edge);
    for path in ["/a", "/interim", "/b"] {
        c.send(
            format!("GET {path} HTTP/1.0\r\nHost: s.test\r\nConnection: keep-alive\r\n\r\n")
                .as_bytes(),
        );
        let answer = c.answer();
        assert_eq!(
            (answer.status, answer.text()),
            (200, format!("GET {path}")),
            "{answer:?}"
        );
        assert_eq!(
            fields(&answer.head, "connection"),
            ["keep-alive"],
            "{answer:?}"
        );
    }
    // A chunked body: unframed, until the connection ends.
    c.send(b"GET /chunked-body HTTP/1.0\r\nHost: s.test\r\nConnection: keep-alive\r\n\r\n");
    let mut rest = Vec::new();
    let _ = c.s.read_to_end(&mut rest);
    let mut all = std::mem::take(&mut c.buf);
    all.extend_from_slice(&rest);
    let text = String::from_utf8_lossy(&all).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{text}");
    assert!(fields(head, "transfer-encoding").is_empty(), "{text}");
    assert_ne!(fields(head, "connection"), ["keep-alive"], "{text}");
    assert_eq!(body, "GET /chunked-body");

    // Not asking: one answer, then the connection ends.
    let mut c = Client::open(edge);
    c.send(b"GET /once HTTP/1.0\r\nHost: s.test\r\n\r\n");
    let answer = c.answer();
    assert_eq!((answer.status, answer.text().as_str()), (200, "GET /once"));
    assert!(c.closed_within(Duration::from_secs(2)));
}

/// `Expect: 100-continue`: the fast path answers `100 Continue` before the body is sent and
/// keeps the expectation from the upstream; Pingora's proxy passes it on (and the upstream's
/// 100, if it sends one). Either way the body arrives and the answer follows.
fn expect_100_continue_gets_the_body_through(position: Position) {
    let up = Upstream::start(echo_request_line);
    let (edge, _child) = edge_alone_in(position, &up.route("s.test"), &[]);
    let mut c = Client::open(edge);
    c.send(
        b"PUT /put HTTP/1.1\r\nHost: s.test\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
    );
    // As curl does: wait a while for 100, then send the body anyway.
    c.s.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let continued = c.fill();
    c.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    if continued {
        assert!(
            c.buf.starts_with(b"HTTP/1.1 100 Continue\r\n\r\n"),
            "{:?}",
            String::from_utf8_lossy(&c.buf)
        );
        c.buf.drain(..25);
    }
    c.send(b"hello");
    let answer = c.answer();
    assert_eq!((answer.status, answer.text().as_str()), (200, "PUT /put"));
    let seen = up.wait_for(1);
    assert!(seen[0].ends_with("\r\n\r\nhello"), "{seen:?}");
    let expect_passed = !fields(&seen[0], "expect").is_empty();
    match position {
        Position::FastPath => assert!(continued && !expect_passed, "{seen:?}"),
        Position::PingoraOnly => assert!(expect_passed, "{seen:?}"),
    }
    // The connection goes on.
    c.send(b"GET /next HTTP/1.1\r\nHost: s.test\r\n\r\n");
    assert_eq!(c.answer().text(), "GET /next");
}

/// The body of an HTTP/1 request as recorded by the upstream: chunked framing decoded.
fn body_of(request: &str) -> String {
    let (head, body) = request.split_once("\r\n\r\n").unwrap();
    if fields(head, "transfer-encoding").is_empty() {
        return body.to_owned();
    }
    let mut data = String::new();
    let mut rest = body;
    loop {
        let (size, after) = rest.split_once("\r\n").unwrap();
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            return data;
        }
        data.push_str(&after[..size]);
        rest = &after[size + 2..];
    }
}

/// Chunked uploads (extensions, trailers, split anywhere across writes) and bodies over 64 KiB
/// reach the upstream whole as they arrive, and the connection carries the next request.
fn streamed_bodies_reach_the_upstream_whole(position: Position) {
    let up = Upstream::start(echo_request_line);
    let (edge, _child) = edge_alone_in(position, &up.route("s.test"), &[]);
    let mut c = Client::open(edge);
    let chunked: &[u8] = b"POST /chunked HTTP/1.1\r\nHost: s.test\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nX-Trailer: t\r\n\r\n";
    for piece in chunked.chunks(7) {
        c.send(piece);
        std::thread::sleep(Duration::from_millis(2));
    }
    let answer = c.answer();
    assert_eq!(
        (answer.status, answer.text().as_str()),
        (200, "POST /chunked")
    );
    let seen = up.wait_for(1);
    assert_eq!(body_of(&seen[0]), "hello world", "{seen:?}");

    let long: String = (0..200 * 1024)
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let mut request = format!(
        "PUT /long HTTP/1.1\r\nHost: s.test\r\nContent-Length: {}\r\n\r\n",
        long.len()
    )
    .into_bytes();
    request.extend_from_slice(long.as_bytes());
    // The next request right behind the body.
    request.extend_from_slice(b"GET /after HTTP/1.1\r\nHost: s.test\r\n\r\n");
    for piece in request.chunks(48 * 1024) {
        c.send(piece);
    }
    let answer = c.answer();
    assert_eq!((answer.status, answer.text().as_str()), (200, "PUT /long"));
    assert_eq!(c.answer().text(), "GET /after");
    let seen = up.wait_for(3);
    assert_eq!(body_of(&seen[1]).len(), long.len());
    assert!(
        body_of(&seen[1]) == long,
        "the long body came through changed"
    );

    // A chunked body longer than the first read of a request takes (a new connection's
    // buffer), sent in one write with its head and the next request: what the first read left
    // is taken before the first write, and chunks cut by that boundary come through whole.
    let mut c = Client::open(edge);
    let mut request =
        b"POST /chunks HTTP/1.1\r\nHost: s.test\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    let mut data = Vec::new();
    for i in 0..40usize {
        let chunk: Vec<u8> = (0..997 + i).map(|j| b'A' + ((i + j) % 26) as u8).collect();
        request.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        request.extend_from_slice(&chunk);
        request.extend_from_slice(b"\r\n");
        data.extend_from_slice(&chunk);
    }
    request.extend_from_slice(b"0\r\n\r\nGET /after-chunks HTTP/1.1\r\nHost: s.test\r\n\r\n");
    c.send(&request);
    assert_eq!(c.answer().text(), "POST /chunks");
    assert_eq!(c.answer().text(), "GET /after-chunks");
    let seen = up.wait_for(5);
    assert!(
        body_of(&seen[3]).as_bytes() == data,
        "the chunked body came through changed"
    );
}

/// Broken chunked framing is answered 400 and ends the connection, on either path.
fn broken_chunked_framing_is_refused(position: Position) {
    let up = Upstream::start(echo_request_line);
    let (edge, _child) = edge_alone_in(position, &up.route("s.test"), &[]);
    for bad in [
        &b"POST /x HTTP/1.1\r\nHost: s.test\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n0\r\n\r\n"[..],
        b"POST /x HTTP/1.1\r\nHost: s.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXX0\r\n\r\n",
    ] {
        let mut c = Client::open(edge);
        c.send(bad);
        let answer = c.answer();
        assert_eq!(answer.status, 400, "{answer:?}");
        assert!(c.closed_within(Duration::from_secs(2)));
    }
}

/// A chunked body over the body limit is answered 413 and ends the connection, on either
/// path; the fast path refuses it before anything of the request reaches the upstream.
fn a_chunked_body_over_the_limit_is_refused(position: Position) {
    let up = Upstream::start(echo_request_line);
    let (edge, _child) =
        edge_alone_in(position, &up.route("s.test"), &["--max-body-bytes", "1000"]);
    let mut request =
        b"POST /big HTTP/1.1\r\nHost: s.test\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    for _ in 0..3 {
        request.extend_from_slice(b"190\r\n");
        request.extend_from_slice(&[b'x'; 400]);
        request.extend_from_slice(b"\r\n");
    }
    request.extend_from_slice(b"0\r\n\r\n");
    let mut c = Client::open(edge);
    c.send(&request);
    let answer = c.answer();
    assert_eq!(answer.status, 413, "{answer:?}");
    // The same words on either path, and nothing of where the container is.
    assert_eq!(answer.text(), "request body too large\n", "{answer:?}");
    assert!(c.closed_within(Duration::from_secs(2)));
    // Within the limit, the same shape goes through.
    let mut c = Client::open(edge);
    c.send(b"POST /small HTTP/1.1\r\nHost: s.test\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n");
    assert_eq!(c.answer().text(), "POST /small");
    if position == Position::FastPath {
        let seen = up.requests();
        assert_eq!(
            seen.len(),
            1,
            "only the request within the limit went upstream: {seen:?}"
        );
    }
}

/// A listening upstream that runs `serve` on each connection in a thread of its own; its port.
fn raw_upstream(serve: fn(TcpStream)) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve(stream));
        }
    });
    port
}

/// An upstream that answers before the body is whole (a refusal) is heard: the client gets
/// its answer, and its connection, with the body's rest unread, ends after it.
fn an_answer_before_the_whole_body_reaches_the_client(position: Position) {
    let port = raw_upstream(|mut s| {
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            if s.read(&mut byte).unwrap_or(0) == 0 {
                return;
            }
            head.push(byte[0]);
        }
        let _ = s.write_all(
                    b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 8\r\nConnection: close\r\n\r\ntoo much",
                );
        // Held open a while, unread, as a busy upstream would.
        std::thread::sleep(Duration::from_secs(3));
    });
    let (edge, _child) = edge_alone_in(position, &format!("s.test=127.0.0.1:{port}"), &[]);
    // A client that sends a little and waits, and one that sends 8 MiB as fast as it can
    // (more than the sockets between it and the upstream hold).
    for sent in [64 * 1024, 8 << 20] {
        let mut c = Client::open(edge);
        c.send(
            format!(
                "PUT /big HTTP/1.1\r\nHost: s.test\r\nContent-Length: {}\r\n\r\n",
                8 << 20
            )
            .as_bytes(),
        );
        let mut writer = c.s.try_clone().unwrap();
        let body = std::thread::spawn(move || {
            let _ = writer.write_all(&vec![b'x'; sent]);
        });
        let answer = c.answer();
        assert_eq!(
            (answer.status, answer.text().as_str()),
            (413, "too much"),
            "{answer:?}"
        );
        assert!(answer.says_close(), "{answer:?}");
        drop(c);
        body.join().unwrap();
    }
}

/// An interim response (`100 Continue`) from the upstream while the body is still on its way
/// does not stop the body: the upstream gets it whole, and the client the final answer.
fn an_interim_answer_does_not_stop_a_body(position: Position) {
    let port = raw_upstream(|mut s| {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 16384];
        let mut continued = false;
        loop {
            if !continued && buf.windows(4).any(|w| w == b"\r\n\r\n") {
                let _ = s.write_all(b"HTTP/1.1 100 Continue\r\n\r\n");
                continued = true;
            }
            if let Some(end) = request_end(&buf) {
                let body_len = end - (buf.windows(4).position(|w| w == b"\r\n\r\n").unwrap() + 4);
                let answer = format!("{body_len}");
                let _ = s.write_all(
                    format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{answer}",
                        answer.len()
                    )
                    .as_bytes(),
                );
                return;
            }
            match s.read(&mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    });
    let (edge, _child) = edge_alone_in(position, &format!("s.test=127.0.0.1:{port}"), &[]);
    let mut c = Client::open(edge);
    let len = 300 * 1024;
    c.send(
        format!("PUT /big HTTP/1.1\r\nHost: s.test\r\nContent-Length: {len}\r\n\r\n").as_bytes(),
    );
    for piece in vec![b'y'; len].chunks(32 * 1024) {
        std::thread::sleep(Duration::from_millis(5));
        c.send(piece);
    }
    let mut answer = c.answer();
    if answer.status == 100 {
        answer = c.answer();
    }
    assert_eq!(
        (answer.status, answer.text()),
        (200, len.to_string()),
        "{answer:?}"
    );
}

crate::in_both_positions!(
    an_interim_answer_does_not_stop_a_body,
    an_answer_before_the_whole_body_reaches_the_client,
    streamed_bodies_reach_the_upstream_whole,
    broken_chunked_framing_is_refused,
    a_chunked_body_over_the_limit_is_refused,
    http10_clients_keep_their_connection_when_they_ask,
    expect_100_continue_gets_the_body_through,
    https_on_the_edge_alone_with_a_certificate_from_files,
    every_forwarded_for_line_reaches_the_upstream,
    content_length_is_one_plain_decimal_or_the_request_is_refused,
    absolute_form_targets_go_upstream_in_origin_form_and_others_are_refused,
    pipelined_requests_behind_any_request_are_answered_in_order,
    response_heads_with_bare_line_feeds_reach_the_client_with_crlf,
    fields_named_with_underscores_are_dropped_unless_passed,
    a_silent_upstream_costs_at_most_the_connect_timeout,
    sigterm_answers_kept_alive_clients_once_with_close_then_closes_between_requests,
    the_fast_path_setting_decides_who_writes_the_response_head,
);
