//! HTTP/1.1 through the edge against a scripted upstream: kept connections on both sides,
//! forwarding fields, every response framing, interim responses, pipelining, request bodies on
//! either side of the fast path's limit, and upstreams that break or drop kept connections.
//! Every test runs with the HTTP/1 fast path and without it (`--no-fast-path`).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::*;

/// How long `/wait-for-close` waited for the edge to close its upstream connection, ms, by
/// upstream port.
static WAITED_MS: std::sync::Mutex<std::collections::BTreeMap<u16, usize>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Upstream ports whose `/wait-for-close` request arrived.
static WAITING: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// How many connections each upstream port closed after answering `/close-soon`.
static CLOSED_SOON: std::sync::Mutex<std::collections::BTreeMap<u16, usize>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

/// Waits until `ready` holds, for at most 10 s, or panics saying `what` never happened.
fn wait_until(what: &str, ready: impl Fn() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !ready() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} never happened"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One MiB of a repeating pattern, for the large response.
fn big_body() -> Vec<u8> {
    (0..1024 * 1024).map(|i| (i % 251) as u8).collect()
}

/// Reads one request (head and Content-Length or chunked body) from `r`; `None` at EOF.
fn read_request(r: &mut BufReader<TcpStream>) -> Option<(String, Vec<u8>)> {
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if r.read_line(&mut line).ok()? == 0 {
            return None;
        }
        head.push_str(&line);
        if line == "\r\n" && head.len() > 2 {
            break;
        }
    }
    let lower = head.to_ascii_lowercase();
    let mut body = Vec::new();
    if let Some(len) = lower
        .lines()
        .find_map(|l| l.strip_prefix("content-length: "))
        .and_then(|v| v.trim().parse::<usize>().ok())
    {
        body.resize(len, 0);
        r.read_exact(&mut body).ok()?;
    } else if lower.contains("transfer-encoding: chunked") {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).ok()?;
            let n = usize::from_str_radix(size.trim(), 16).ok()?;
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).ok()?;
            if n == 0 {
                break;
            }
            body.extend_from_slice(&chunk[..n]);
        }
    }
    Some((head, body))
}

/// An upstream whose answers depend on the path. Every answer carries `X-Conn`, the number of
/// the upstream connection it came on. Returns the port and the count of connections accepted.
fn scripted_upstream() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let accepted = Arc::new(AtomicUsize::new(0));
    let count = accepted.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let conn = count.fetch_add(1, Ordering::SeqCst) + 1;
            std::thread::spawn(move || serve_scripted(stream, conn, port));
        }
    });
    (port, accepted)
}

fn serve_scripted(stream: TcpStream, conn: usize, port: u16) {
    let mut w = stream.try_clone().unwrap();
    let mut r = BufReader::new(stream);
    let mut drop_next = false;
    while let Some((head, body)) = read_request(&mut r) {
        if drop_next {
            // The connection was kept idle and is now closed on the next request, unanswered:
            // what an upstream closing idle connections looks like from the edge.
            return;
        }
        let path = head.split_whitespace().nth(1).unwrap_or("/").to_owned();
        let ok = |extra: &str, body: &[u8]| {
            let mut out = format!(
                "HTTP/1.1 200 OK\r\nX-Conn: {conn}\r\nContent-Length: {}\r\n{extra}\r\n",
                body.len()
            )
            .into_bytes();
            out.extend_from_slice(body);
            out
        };
        let answer: Vec<u8> = match path.as_str() {
            "/echo" => ok("", &body),
            "/chunked" => {
                for part in [
                    format!("HTTP/1.1 200 OK\r\nX-Conn: {conn}\r\nTransfer-Encoding: chunked\r\n\r\n")
                        .into_bytes(),
                    b"5\r\nhello\r\n".to_vec(),
                    b"7;ext=1\r\n, world\r\n".to_vec(),
                    b"0\r\nX-Trailer: t\r\n\r\n".to_vec(),
                ] {
                    let _ = w.write_all(&part);
                    let _ = w.flush();
                    std::thread::sleep(Duration::from_millis(20));
                }
                continue;
            }
            "/until-close" => {
                let _ = w.write_all(b"HTTP/1.1 200 OK\r\nX-Conn: 0\r\n\r\nall of it");
                return;
            }
            "/interim" => {
                let _ = w.write_all(b"HTTP/1.1 103 Early Hints\r\nLink: </style.css>\r\n\r\n");
                std::thread::sleep(Duration::from_millis(20));
                ok("", b"ok")
            }
            "/no-content" => format!("HTTP/1.1 204 No Content\r\nX-Conn: {conn}\r\n\r\n").into_bytes(),
            "/big" => ok("", &big_body()),
            "/hop" => ok(
                "Connection: keep-alive, X-Hop\r\nX-Hop: secret\r\nKeep-Alive: timeout=5\r\nX-End: kept\r\n",
                b"hop",
            ),
            "/garbage" => b"NOT HTTP AT ALL\r\n\r\n".to_vec(),
            "/drop-next" => {
                drop_next = true;
                ok("", b"until next time")
            }
            "/trickle" => {
                for b in ok("", b"slowly").iter() {
                    if w.write_all(&[*b]).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                continue;
            }
            "/wait-for-close" => {
                // Never answers; records how long until the edge gives the connection up.
                WAITING.lock().unwrap().insert(port);
                let started = std::time::Instant::now();
                let mut rest = Vec::new();
                let _ = r.read_to_end(&mut rest);
                let waited = started.elapsed().as_millis() as usize;
                WAITED_MS.lock().unwrap().insert(port, waited.max(1));
                return;
            }
            "/close-soon" => {
                let _ = w.write_all(&ok("", b"closing"));
                drop(w);
                drop(r);
                *CLOSED_SOON.lock().unwrap().entry(port).or_default() += 1;
                return;
            }
            // Anything else: the request head as the upstream saw it.
            _ => ok("", head.as_bytes()),
        };
        if w.write_all(&answer).is_err() {
            return;
        }
    }
}

/// A response as a client reads it.
#[derive(Debug)]
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Reads one response from the edge; `head_request` says there is no body to read.
fn read_response(r: &mut BufReader<TcpStream>, head_request: bool) -> Response {
    let mut status_line = String::new();
    r.read_line(&mut status_line).expect("a status line");
    let status = status_line
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {status_line:?}"));
    let mut headers = Vec::new();
    loop {
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        let (n, v) = line.trim_end().split_once(':').expect("a header field");
        headers.push((n.to_owned(), v.trim().to_owned()));
    }
    let mut resp = Response {
        status,
        headers,
        body: Vec::new(),
    };
    if head_request || status == 204 || (100..200).contains(&status) {
        return resp;
    }
    if let Some(len) = resp.header("content-length") {
        resp.body.resize(len.parse().unwrap(), 0);
        r.read_exact(&mut resp.body).unwrap();
    } else if resp
        .header("transfer-encoding")
        .is_some_and(|v| v.contains("chunked"))
    {
        loop {
            let mut size = String::new();
            r.read_line(&mut size).unwrap();
            let n = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
            if n == 0 {
                // Trailer fields, then the blank line.
                loop {
                    let mut line = String::new();
                    r.read_line(&mut line).unwrap();
                    if line == "\r\n" {
                        break;
                    }
                    let (n, v) = line.trim_end().split_once(':').unwrap();
                    resp.headers.push((n.to_owned(), v.trim().to_owned()));
                }
                break;
            }
            let mut chunk = vec![0; n + 2];
            r.read_exact(&mut chunk).unwrap();
            resp.body.extend_from_slice(&chunk[..n]);
        }
    } else {
        r.read_to_end(&mut resp.body).unwrap();
    }
    resp
}

/// A kept-alive client connection to the edge.
struct Client {
    w: TcpStream,
    r: BufReader<TcpStream>,
}

impl Client {
    fn new(port: u16) -> Client {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Client {
            w: s.try_clone().unwrap(),
            r: BufReader::new(s),
        }
    }

    fn send(&mut self, method: &str, path: &str, extra: &str, body: &[u8]) -> Response {
        let length = if body.is_empty() || extra.contains("Transfer-Encoding") {
            String::new()
        } else {
            format!("Content-Length: {}\r\n", body.len())
        };
        let mut req =
            format!("{method} {path} HTTP/1.1\r\nHost: p.test\r\n{extra}{length}\r\n").into_bytes();
        req.extend_from_slice(body);
        self.w.write_all(&req).unwrap();
        read_response(&mut self.r, method == "HEAD")
    }

    fn get(&mut self, path: &str) -> Response {
        self.send("GET", path, "", b"")
    }

    /// Whether the edge closed this connection.
    fn closed(&mut self) -> bool {
        let mut rest = Vec::new();
        matches!(self.r.read_to_end(&mut rest), Ok(0))
    }
}

fn kept_alive_clients_share_one_upstream_connection_and_get_forwarding_fields(position: Position) {
    let (upstream, accepted) = scripted_upstream();
    let (edge, _child) = edge_alone_in(position, &format!("p.test=127.0.0.1:{upstream}"), &[]);
    let mut client = Client::new(edge);
    let mut conns = Vec::new();
    for i in 0..20 {
        let resp = client.send(
            "GET",
            &format!("/head?i={i}"),
            "X-Forwarded-For: 203.0.113.7\r\nKeep-Alive: timeout=5\r\nConnection: keep-alive\r\nProxy-Authorization: Basic c2VjcmV0\r\nForwarded: for=evil\r\nX-Forwarded-Host: evil\r\nAccept: */*\r\n",
            b"",
        );
        assert_eq!(resp.status, 200, "{resp:?}");
        let seen = resp.text();
        assert!(
            seen.starts_with(&format!("GET /head?i={i} HTTP/1.1\r\n")),
            "{seen}"
        );
        for wanted in [
            "Host: p.test\r\n",
            "Accept: */*\r\n",
            "X-Forwarded-For: 203.0.113.7, 127.0.0.1\r\n",
            "Forwarded: for=127.0.0.1;host=\"p.test\";proto=http\r\n",
            "X-Forwarded-Proto: http\r\n",
            "X-Forwarded-Host: p.test\r\n",
        ] {
            assert!(seen.contains(wanted), "{wanted:?} missing from\n{seen}");
        }
        for unwanted in [
            "Keep-Alive",
            "Proxy-Authorization",
            "for=evil",
            "Host: evil",
            "Connection",
        ] {
            assert!(
                !seen.contains(unwanted),
                "{unwanted:?} passed on in\n{seen}"
            );
        }
        conns.push(resp.header("x-conn").unwrap().to_owned());
    }
    conns.dedup();
    assert_eq!(
        conns.len(),
        1,
        "one upstream connection for the whole client: {conns:?}"
    );
    assert_eq!(accepted.load(Ordering::SeqCst), 1);

    // A client idle for more than a second gives its upstream connection back to the pool: a
    // second client gets it while the first stays connected.
    std::thread::sleep(Duration::from_millis(1500));
    assert_eq!(Client::new(edge).get("/again").status, 200);
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        1,
        "the idle upstream connection is reused"
    );
    assert_eq!(client.get("/first-again").status, 200);

    // Two clients one after the other: the second gets the first one's pooled connection.
    drop(client);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(Client::new(edge).get("/later").status, 200);
    assert!(
        accepted.load(Ordering::SeqCst) <= 2,
        "idle upstream connections are reused"
    );
}

fn targets_pingora_would_normalise_reach_the_upstream_normalised(position: Position) {
    let (upstream, _) = scripted_upstream();
    let (edge, _child) = edge_alone_in(position, &format!("p.test=127.0.0.1:{upstream}"), &[]);
    let mut client = Client::new(edge);
    let resp = client.get("/page#section");
    assert_eq!(resp.status, 200);
    assert!(
        resp.text().starts_with("GET /page HTTP/1.1\r\n"),
        "{}",
        resp.text()
    );
}

fn shutdown_closes_idle_kept_alive_connections(position: Position) {
    let (upstream, _) = scripted_upstream();
    // In-flight requests would get 60 s; an idle connection has nothing in flight.
    let (edge, child) = edge_alone_in(
        position,
        &format!("p.test=127.0.0.1:{upstream}"),
        &["--shutdown-grace", "60"],
    );
    let mut client = Client::new(edge);
    assert_eq!(client.get("/before").status, 200);
    let pid = child.0.id().to_string();
    assert!(std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    // Closed at shutdown: within the client's 10 s read timeout, long before the 60 s grace
    // would end (a generous guard, not a timing target).
    assert!(
        client.closed(),
        "the idle connection was not closed at shutdown"
    );
}

fn every_response_framing_passes_through_on_a_kept_connection(position: Position) {
    let (upstream, _) = scripted_upstream();
    let (edge, _child) = edge_alone_in(position, &format!("p.test=127.0.0.1:{upstream}"), &[]);
    let mut client = Client::new(edge);

    let chunked = client.get("/chunked");
    assert_eq!(
        (chunked.status, chunked.text().as_str()),
        (200, "hello, world")
    );
    // Trailers pass on the fast path; Pingora's proxy does not forward HTTP/1 trailers.
    let trailer = (position == Position::FastPath).then_some("t");
    assert_eq!(
        chunked.header("x-trailer"),
        trailer,
        "trailers: {chunked:?}"
    );

    let interim = client.get("/interim");
    assert_eq!(interim.status, 103);
    assert_eq!(interim.header("link"), Some("</style.css>"));
    let last = read_response(&mut client.r, false);
    assert_eq!((last.status, last.text().as_str()), (200, "ok"));

    let head = client.send("HEAD", "/big", "", b"");
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-length"), Some("1048576"));

    let slow = client.get("/trickle");
    assert_eq!((slow.status, slow.text().as_str()), (200, "slowly"));

    let none = client.get("/no-content");
    assert_eq!((none.status, none.body.len()), (204, 0));

    let big = client.get("/big");
    assert_eq!(big.status, 200);
    assert!(big.body == big_body(), "1 MiB arrives intact");

    let hop = client.get("/hop");
    assert_eq!((hop.status, hop.text().as_str()), (200, "hop"));
    assert_eq!(hop.header("x-end"), Some("kept"));
    for gone in ["x-hop", "keep-alive"] {
        assert_eq!(hop.header(gone), None, "{gone} passed on: {hop:?}");
    }
    // The upstream's `Connection` stays behind; Pingora's proxy writes one of its own.
    let own = (position == Position::PingoraOnly).then_some("keep-alive");
    assert_eq!(hop.header("connection"), own, "{hop:?}");

    // Still the same client connection; a body that ends with the upstream's connection
    // ends the client's too on the fast path, and says so. Pingora's proxy sends it chunked
    // and keeps the client's connection.
    let until_close = client.get("/until-close");
    assert_eq!(
        (until_close.status, until_close.text().as_str()),
        (200, "all of it")
    );
    match position {
        Position::FastPath => {
            assert_eq!(until_close.header("connection"), Some("close"));
            assert!(client.closed());
        }
        Position::PingoraOnly => assert_eq!(client.get("/after").status, 200),
    }
}

fn pipelined_requests_are_answered_in_order(position: Position) {
    let (upstream, _) = scripted_upstream();
    let (edge, _child) = edge_alone_in(position, &format!("p.test=127.0.0.1:{upstream}"), &[]);
    let mut client = Client::new(edge);
    client
        .w
        .write_all(b"GET /one HTTP/1.1\r\nHost: p.test\r\n\r\nPOST /echo HTTP/1.1\r\nHost: p.test\r\nContent-Length: 3\r\n\r\nabcGET /three HTTP/1.1\r\nHost: p.test\r\n\r\n")
        .unwrap();
    let one = read_response(&mut client.r, false);
    assert!(one.text().starts_with("GET /one "), "{one:?}");
    let two = read_response(&mut client.r, false);
    assert_eq!(two.text(), "abc");
    let three = read_response(&mut client.r, false);
    assert!(three.text().starts_with("GET /three "), "{three:?}");
}

fn request_bodies_of_every_size_and_framing_arrive_whole(position: Position) {
    let (upstream, _) = scripted_upstream();
    let (edge, _child) = edge_alone_in(position, &format!("p.test=127.0.0.1:{upstream}"), &[]);
    let mut client = Client::new(edge);
    for size in [1, 10_000, 65_536, 65_537, 300_000] {
        let body: Vec<u8> = (0..size).map(|i| (i % 253) as u8).collect();
        let resp = client.send("POST", "/echo", "", &body);
        assert_eq!(resp.status, 200);
        assert!(resp.body == body, "a {size}-byte body came back different");
    }
    let chunked = client.send(
        "POST",
        "/echo",
        "Transfer-Encoding: chunked\r\n",
        b"4\r\nwiki\r\n5\r\npedia\r\n0\r\n\r\n",
    );
    assert_eq!(
        (chunked.status, chunked.text().as_str()),
        (200, "wikipedia")
    );
    // HTTP/1.0 with no Host-less shortcuts.
    let mut old = TcpStream::connect(("127.0.0.1", edge)).unwrap();
    old.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    old.write_all(b"GET /old HTTP/1.0\r\nHost: p.test\r\n\r\n")
        .unwrap();
    let mut answer = String::new();
    old.read_to_string(&mut answer).unwrap();
    assert!(
        answer.starts_with("HTTP/1.") && answer.contains(" 200 "),
        "{answer}"
    );
    assert!(answer.contains("GET /old HTTP/1.1\r\n"), "{answer}");
}

fn a_broken_upstream_gets_502_and_dropped_kept_connections_are_handled(position: Position) {
    let (upstream, accepted) = scripted_upstream();
    let (edge, _child) = edge_alone_in(position, &format!("p.test=127.0.0.1:{upstream}"), &[]);

    let mut client = Client::new(edge);
    let garbage = client.get("/garbage");
    // Either path says what failed, in the same words.
    assert_eq!(
        (garbage.status, garbage.text().as_str()),
        (502, "upstream failed\n"),
        "{garbage:?}"
    );
    assert_eq!(garbage.header("content-type"), Some("text/plain"));
    assert!(
        client.closed(),
        "a 502 from the edge closes the client's connection"
    );

    // The upstream closes its kept connection when the next request arrives on it, unanswered.
    // A GET is sent again on a new connection; nothing is lost.
    let mut client = Client::new(edge);
    let first = client.get("/drop-next");
    assert_eq!(first.status, 200);
    let again = client.get("/after-drop");
    assert_eq!(again.status, 200, "{again:?}");
    assert_ne!(again.header("x-conn"), first.header("x-conn"));

    // A POST is not: its body may have been acted on.
    let first = client.get("/drop-next");
    assert_eq!(first.status, 200);
    let post = client.send("POST", "/echo", "", b"once");
    assert_eq!(post.status, 502, "{post:?}");

    // An upstream that closed an idle kept connection before the next request: the edge
    // notices and uses a new one, even for a POST.
    let mut client = Client::new(edge);
    let before = accepted.load(Ordering::SeqCst);
    let closed_before = CLOSED_SOON.lock().unwrap().get(&upstream).copied();
    assert_eq!(client.get("/close-soon").status, 200);
    wait_until("the upstream's close after /close-soon", || {
        CLOSED_SOON.lock().unwrap().get(&upstream).copied() > closed_before
    });
    let post = client.send("POST", "/echo", "", b"once");
    assert_eq!((post.status, post.text().as_str()), (200, "once"));
    assert_eq!(accepted.load(Ordering::SeqCst), before + 2);
}

fn an_upstream_nobody_listens_on_gets_502_saying_it_is_unreachable(position: Position) {
    // A port just freed: nothing listens on it.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (edge, _child) = edge_alone_in(position, &format!("p.test=127.0.0.1:{closed}"), &[]);
    let mut client = Client::new(edge);
    let answer = client.get("/");
    assert_eq!(
        (answer.status, answer.text().as_str()),
        (502, "upstream unreachable\n"),
        "{answer:?}"
    );
    let mut client = Client::new(edge);
    let head = client.send("HEAD", "/", "", b"");
    assert_eq!(head.status, 502, "{head:?}");
    // Nothing follows a HEAD answer's head but the close.
    assert!(client.closed(), "a HEAD answer has no body and closes");
}

fn a_client_that_goes_away_frees_its_upstream_connection(position: Position) {
    let (upstream, _) = scripted_upstream();
    let (edge, _child) = edge_alone_in(position, &format!("p.test=127.0.0.1:{upstream}"), &[]);
    let mut client = Client::new(edge);
    client
        .w
        .write_all(b"GET /wait-for-close HTTP/1.1\r\nHost: p.test\r\n\r\n")
        .unwrap();
    wait_until("the request's arrival at the upstream", || {
        WAITING.lock().unwrap().contains(&upstream)
    });
    drop(client);
    // The upstream never answers: only the edge giving up the connection when its client left
    // ends the wait. 10 s is a guard against waiting forever, not a timing target.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let waited_ms = || WAITED_MS.lock().unwrap().get(&upstream).copied();
    while waited_ms().is_none() {
        assert!(
            std::time::Instant::now() < deadline,
            "the edge kept the upstream connection of a client that left"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "the upstream connection was closed {} ms after the request reached it",
        waited_ms().unwrap_or_default()
    );
}

#[test]
fn a_fixed_route_that_is_not_a_host_name_is_refused() {
    for route in [
        "app.test:80=127.0.0.1:1",
        "a\"b=127.0.0.1:1",
        "=127.0.0.1:1",
    ] {
        let out = std::process::Command::new(PLOYZ)
            .args([
                "daemon",
                "edge",
                "--http-listen",
                "127.0.0.1:0",
                "--route",
                route,
            ])
            .output()
            .unwrap();
        assert!(!out.status.success(), "{route} was accepted");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("is not a host name"), "{route}: {err}");
    }
}

crate::in_both_positions!(
    kept_alive_clients_share_one_upstream_connection_and_get_forwarding_fields,
    targets_pingora_would_normalise_reach_the_upstream_normalised,
    shutdown_closes_idle_kept_alive_connections,
    every_response_framing_passes_through_on_a_kept_connection,
    pipelined_requests_are_answered_in_order,
    request_bodies_of_every_size_and_framing_arrive_whole,
    a_broken_upstream_gets_502_and_dropped_kept_connections_are_handled,
    an_upstream_nobody_listens_on_gets_502_saying_it_is_unreachable,
    a_client_that_goes_away_frees_its_upstream_connection,
);
