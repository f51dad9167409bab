//! HTTP/2 at the edge, on both of its paths: an `h2` client over TLS to `ployz daemon edge
//! --https-listen`, and a raw HTTP/1 upstream that records the exact bytes it receives. Every
//! test runs twice: with the edge's own HTTP/2 path, and with `--no-fast-path` (every stream
//! through Pingora's proxy).

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use http::{HeaderMap, Method, Request};

const HOST: &str = "h2.test";

/// The upstream's answers, by path.
fn shapes(request: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(request);
    let target = text.split(' ').nth(1).unwrap_or_default().to_owned();
    let fixed: &[u8] = match target.as_str() {
        "/chunked" => b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: x-hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\nX-Kept: yes\r\n\r\n5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Trailer: t\r\n\r\n",
        "/interim" => b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        "/interims" => b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a.css>\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
        "/no-content" => b"HTTP/1.1 204 No Content\r\nX-Kept: yes\r\n\r\n",
        "/dated" => b"HTTP/1.1 200 OK\r\nDate: Thu, 01 Jan 1970 00:00:00 GMT\r\nContent-Length: 2\r\n\r\nok",
        "/until-close" => b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil close",
        "/garbage" => b"nonsense\r\n\r\n",
        "/switch" => b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n",
        "/big" => return big_answer(request.starts_with(b"HEAD ")),
        "/big-chunked" => return big_chunked_answer(),
        "/big-until-close" => {
            let mut answer = b"HTTP/1.0 200 OK\r\n\r\n".to_vec();
            answer.extend((0..BIG).map(big_byte));
            return answer;
        }
        _ => b"",
    };
    if !fixed.is_empty() {
        return fixed.to_vec();
    }
    if target.starts_with("/echo") {
        // The whole request as the upstream received it.
        let mut answer = format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n",
            request.len()
        )
        .into_bytes();
        answer.extend_from_slice(request);
        return answer;
    }
    if target.starts_with("/hold") {
        return b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nheld".to_vec();
    }
    echo_request_line(request)
}

const BIG: usize = 1 << 20;

/// Byte `i` of the big body.
fn big_byte(i: usize) -> u8 {
    (i % 251) as u8
}

fn big_answer(head: bool) -> Vec<u8> {
    let mut answer = format!("HTTP/1.1 200 OK\r\nContent-Length: {BIG}\r\n\r\n").into_bytes();
    if !head {
        answer.extend((0..BIG).map(big_byte));
    }
    answer
}

/// The big body in chunks of 7919 bytes, the last one shorter: the edge's reads of the
/// upstream end anywhere in a chunk (now and then in its framing; a cut at every offset of the
/// framing is `ChunkedScan`'s unit tests' job).
fn big_chunked_answer() -> Vec<u8> {
    let mut answer = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n".to_vec();
    let body: Vec<u8> = (0..BIG).map(big_byte).collect();
    for chunk in body.chunks(7919) {
        answer.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        answer.extend_from_slice(chunk);
        answer.extend_from_slice(b"\r\n");
    }
    answer.extend_from_slice(b"0\r\n\r\n");
    answer
}

/// The edge alone serving HTTPS (HTTP/1.1 and HTTP/2 by ALPN) for [`HOST`] with a
/// self-signed certificate, routed to `up`.
struct TlsEdge {
    port: u16,
    /// The plain-HTTP listener's port.
    http: u16,
    tls: Arc<rustls::ClientConfig>,
    _edge: EdgeAlone,
    _dir: tempfile::TempDir,
}

impl TlsEdge {
    fn start(position: Position, up: &Upstream, extra: &[&str]) -> TlsEdge {
        let dir = tempfile::tempdir().unwrap();
        let (cert_file, key_file, cert) = self_signed(dir.path(), HOST);
        let [port] = free_ports();
        let listen = format!("127.0.0.1:{port}");
        let mut args = vec![
            "--https-listen",
            listen.as_str(),
            "--tls-cert",
            cert_file.to_str().unwrap(),
            "--tls-key",
            key_file.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let (http, edge) = edge_alone_in(position, &up.route(HOST), &args);
        wait_listening(port, "the HTTPS listener");
        let mut roots = rustls::RootCertStore::empty();
        roots.add(cert.der().clone()).unwrap();
        let mut tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        tls.alpn_protocols = vec![b"h2".to_vec()];
        TlsEdge {
            port,
            http,
            tls: Arc::new(tls),
            _edge: edge,
            _dir: dir,
        }
    }
}

/// An HTTP/2 connection to the edge, driven by a runtime of its own.
struct H2 {
    rt: tokio::runtime::Runtime,
    send: h2::client::SendRequest<Bytes>,
    /// Drives the connection; it ends with the connection.
    driver: tokio::task::JoinHandle<()>,
}

/// One response as the client read it.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: HeaderMap,
    body: Vec<u8>,
}

impl Reply {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// `method` on `path` for `authority`, with `fields`.
fn request(method: Method, authority: &str, path: &str, fields: &[(&str, &str)]) -> Request<()> {
    let mut req = Request::builder()
        .method(method)
        .uri(format!("https://{authority}{path}"));
    for (name, value) in fields {
        req = req.header(*name, *value);
    }
    req.body(()).unwrap()
}

/// Sends `req` (with `body`, if any) and reads the whole response.
async fn exchange(
    send: &mut h2::client::SendRequest<Bytes>,
    req: Request<()>,
    body: Option<&[u8]>,
) -> Result<Reply, h2::Error> {
    let mut send = send.clone().ready().await?;
    let (response, mut stream) = send.send_request(req, body.is_none())?;
    if let Some(body) = body {
        stream.send_data(Bytes::copy_from_slice(body), true)?;
    }
    let response = response.await?;
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let mut recv = response.into_body();
    let mut body = Vec::new();
    while let Some(data) = recv.data().await {
        let data = data?;
        let _ = recv.flow_control().release_capacity(data.len());
        body.extend_from_slice(&data);
    }
    Ok(Reply {
        status,
        headers,
        body,
    })
}

impl H2 {
    fn open(edge: &TlsEdge) -> H2 {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let send = rt.block_on(async {
            let tcp = tokio::net::TcpStream::connect(("127.0.0.1", edge.port))
                .await
                .unwrap();
            let name = rustls::pki_types::ServerName::try_from(HOST).unwrap();
            let tls = tokio_rustls::TlsConnector::from(edge.tls.clone())
                .connect(name, tcp)
                .await
                .unwrap();
            assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
            let (send, conn) = h2::client::handshake(tls).await.unwrap();
            let driver = tokio::spawn(async move {
                let _ = conn.await;
            });
            (send, driver)
        });
        let (send, driver) = send;
        H2 { rt, send, driver }
    }

    /// Whether the edge ended the connection within `within`.
    fn ended_within(&mut self, within: Duration) -> bool {
        let driver = &mut self.driver;
        self.rt
            .block_on(async { tokio::time::timeout(within, driver).await.is_ok() })
    }

    /// Sends a request whose answer is read later, with [`H2::wait`].
    fn start(&mut self, path: &str) -> tokio::task::JoinHandle<Result<Reply, h2::Error>> {
        let mut send = self.send.clone();
        let req = request(Method::GET, HOST, path, &[]);
        let _guard = self.rt.enter();
        tokio::spawn(async move { exchange(&mut send, req, None).await })
    }

    fn wait(&mut self, started: tokio::task::JoinHandle<Result<Reply, h2::Error>>) -> Reply {
        self.rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(20), started).await })
            .expect("an answer within 20 s")
            .unwrap()
            .unwrap()
    }

    /// One request on this connection, with a body if `body` is `Some`.
    fn send(&mut self, req: Request<()>, body: Option<&[u8]>) -> Reply {
        let what = format!("{} {}", req.method(), req.uri());
        let send = &mut self.send;
        self.rt
            .block_on(async {
                tokio::time::timeout(Duration::from_secs(20), exchange(send, req, body)).await
            })
            .unwrap_or_else(|_| panic!("{what}: no answer within 20 s"))
            .unwrap_or_else(|e| panic!("{what}: {e}"))
    }

    fn get(&mut self, path: &str) -> Reply {
        self.send(request(Method::GET, HOST, path, &[]), None)
    }
}

/// A request of an HTTP/2 stream reaches the upstream as one HTTP/1.1 request: `Host` from the
/// authority, the `cookie` fields joined into one (RFC 9113 section 8.2.3), the forwarding
/// fields after the client's, no field named with `_`, the body with its length; a body of no
/// declared length arrives whole too.
fn an_http2_request_reaches_the_upstream_as_one_http1_request(position: Position) {
    let up = Upstream::start(shapes);
    let edge = TlsEdge::start(position, &up, &[]);
    let mut h2 = H2::open(&edge);
    let got = h2.send(
        request(
            Method::GET,
            HOST,
            "/echo?q=1",
            &[
                ("cookie", "a=1"),
                ("x-plain", "yes"),
                ("cookie", "b=2"),
                ("x-forwarded-for", "203.0.113.9"),
                ("x_under", "1"),
                ("te", "trailers"),
            ],
        ),
        None,
    );
    assert_eq!(got.status, 200);
    let head = got.text();
    assert!(head.starts_with("GET /echo?q=1 HTTP/1.1\r\n"), "{head}");
    assert_eq!(fields(&head, "host"), [HOST], "{head}");
    assert_eq!(fields(&head, "cookie"), ["a=1; b=2"], "{head}");
    assert_eq!(fields(&head, "x-plain"), ["yes"], "{head}");
    assert_eq!(
        fields(&head, "x-forwarded-for"),
        ["203.0.113.9, 127.0.0.1"],
        "{head}"
    );
    assert_eq!(fields(&head, "x-forwarded-proto"), ["https"], "{head}");
    assert_eq!(fields(&head, "x-forwarded-host"), [HOST], "{head}");
    assert!(fields(&head, "x_under").is_empty(), "{head}");
    assert!(fields(&head, "te").is_empty(), "{head}");

    let posted = h2.send(
        request(Method::POST, HOST, "/echo", &[("content-length", "5")]),
        Some(b"hello"),
    );
    let text = posted.text();
    assert!(text.starts_with("POST /echo HTTP/1.1\r\n"), "{text}");
    assert_eq!(fields(&text, "content-length"), ["5"], "{text}");
    assert!(text.ends_with("\r\n\r\nhello"), "{text}");

    // No Content-Length: the body arrives whole, framed one way or another.
    let no_length = h2.send(
        request(Method::POST, HOST, "/echo", &[]),
        Some(b"hello world"),
    );
    let text = no_length.text();
    assert!(text.starts_with("POST /echo HTTP/1.1\r\n"), "{text}");
    let (_, body) = text.split_once("\r\n\r\n").unwrap();
    if fields(&text, "transfer-encoding") == ["chunked"] {
        assert_eq!(body.to_ascii_lowercase(), "b\r\nhello world\r\n0\r\n\r\n");
    } else {
        assert_eq!(body, "hello world");
    }
}

/// The upstream's response reaches the client without its hop-by-hop fields, its chunked
/// framing or its interim responses, whatever its framing.
fn responses_reach_http2_clients_without_hop_by_hop_fields(position: Position) {
    let up = Upstream::start(shapes);
    let edge = TlsEdge::start(position, &up, &[]);
    let mut h2 = H2::open(&edge);

    let chunked = h2.get("/chunked");
    assert_eq!(
        (chunked.status, chunked.text().as_str()),
        (200, "hello world")
    );
    for dropped in ["connection", "keep-alive", "x-hop", "transfer-encoding"] {
        assert!(!chunked.headers.contains_key(dropped), "{chunked:?}");
    }
    assert_eq!(chunked.headers["x-kept"], "yes");

    let interim = h2.get("/interim");
    assert_eq!((interim.status, interim.text().as_str()), (200, "ok"));
    let interims = h2.get("/interims");
    assert_eq!((interims.status, interims.text().as_str()), (200, "ok"));

    // One `Date`, the edge's own: the upstream's is not passed on beside or instead of it.
    let dated = h2.get("/dated");
    assert_eq!((dated.status, dated.text().as_str()), (200, "ok"));
    let dates: Vec<_> = dated.headers.get_all("date").iter().collect();
    assert_eq!(dates.len(), 1, "{dated:?}");
    assert_ne!(dates[0], "Thu, 01 Jan 1970 00:00:00 GMT", "{dated:?}");

    let none = h2.get("/no-content");
    assert_eq!((none.status, none.body.len()), (204, 0));
    assert_eq!(none.headers["x-kept"], "yes");

    let head = h2.send(request(Method::HEAD, HOST, "/big", &[]), None);
    assert_eq!((head.status, head.body.len()), (200, 0));
    assert_eq!(head.headers["content-length"], BIG.to_string().as_str());

    let until_close = h2.get("/until-close");
    assert_eq!(
        (until_close.status, until_close.text().as_str()),
        (200, "until close")
    );
    // Bodies longer than one read of the upstream, whatever their framing, come whole.
    for path in ["/big", "/big-chunked", "/big-until-close"] {
        let big = h2.get(path);
        assert_eq!((big.status, big.body.len()), (200, BIG), "{path}");
        assert!(
            big.body.iter().enumerate().all(|(i, b)| *b == big_byte(i)),
            "{path}: the body came back changed"
        );
    }
    // And the connection goes on.
    assert_eq!(h2.get("/after").text(), "GET /after");
}

/// Streams in flight together on one connection each get their own answer, big bodies whole
/// (HTTP/2's flow control holds them back until the client reads).
fn many_streams_on_one_connection_each_get_their_own_answer(position: Position) {
    let up = Upstream::start(shapes);
    let edge = TlsEdge::start(position, &up, &[]);
    let h2 = H2::open(&edge);
    let replies = h2.rt.block_on(async {
        let mut tasks = Vec::new();
        for i in 0..68 {
            let mut send = h2.send.clone();
            let path = if i % 17 == 0 {
                "/big".to_owned()
            } else {
                format!("/stream/{i}")
            };
            tasks.push(tokio::spawn(async move {
                let req = request(Method::GET, HOST, &path, &[]);
                (path, exchange(&mut send, req, None).await.unwrap())
            }));
        }
        let mut replies = Vec::new();
        for task in tasks {
            replies.push(task.await.unwrap());
        }
        replies
    });
    for (path, reply) in replies {
        assert_eq!(reply.status, 200, "{path}");
        if path == "/big" {
            assert_eq!(reply.body.len(), BIG);
            assert!(
                reply
                    .body
                    .iter()
                    .enumerate()
                    .all(|(i, b)| *b == big_byte(i)),
                "the big body came back changed"
            );
        } else {
            assert_eq!(reply.text(), format!("GET {path}"));
        }
    }
}

/// An upstream that answers nonsense, a 101 nobody asked for, or cannot be reached, gets the
/// client a 502, and the connection goes on.
fn upstream_failures_are_502_and_the_connection_goes_on(position: Position) {
    let up = Upstream::start(shapes);
    let [closed] = free_ports();
    let down = format!("down.test=127.0.0.1:{closed}");
    let edge = TlsEdge::start(position, &up, &["--route", &down]);
    let mut h2 = H2::open(&edge);
    // Either path says what failed, in the same words.
    let garbage = h2.get("/garbage");
    assert_eq!(
        (garbage.status, garbage.text().as_str()),
        (502, "upstream failed\n")
    );
    let switch = h2.get("/switch");
    assert_eq!(
        (switch.status, switch.text().as_str()),
        (502, "upstream failed\n")
    );
    let unreachable = h2.send(request(Method::GET, "down.test", "/", &[]), None);
    assert_eq!(
        (unreachable.status, unreachable.text().as_str()),
        (502, "upstream unreachable\n")
    );
    // The answer to HEAD gives the length and leaves the text out.
    let head = h2.send(request(Method::HEAD, "down.test", "/", &[]), None);
    assert_eq!((head.status, head.body.len()), (502, 0), "{head:?}");
    assert_eq!(
        head.headers["content-length"],
        "upstream unreachable\n".len().to_string().as_str()
    );
    let unknown = h2.send(request(Method::GET, "nobody.test", "/", &[]), None);
    assert_eq!(unknown.status, 404);
    // The edge's own answers to HEAD carry no DATA (a protocol error on a HEAD stream).
    let unknown = h2.send(request(Method::HEAD, "nobody.test", "/", &[]), None);
    assert_eq!(
        (unknown.status, unknown.body.len()),
        (404, 0),
        "{unknown:?}"
    );
    assert_eq!(h2.get("/after").text(), "GET /after");
}

/// A stream the client resets while its upstream works leaves nothing behind: the upstream's
/// late answer never reaches another stream.
fn a_reset_stream_leaves_no_answer_behind(position: Position) {
    let up = Upstream::start(shapes);
    let edge = TlsEdge::start(position, &up, &[]);
    let mut h2 = H2::open(&edge);
    // A first request, so an upstream connection is kept for the next ones.
    assert_eq!(h2.get("/first").text(), "GET /first");
    h2.rt.block_on(async {
        let mut send = h2.send.clone().ready().await.unwrap();
        let (response, _) = send
            .send_request(request(Method::GET, HOST, "/hold-me", &[]), true)
            .unwrap();
        // The upstream has the request: the client gives up on it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while !up.requests().iter().any(|r| r.starts_with("GET /hold-me")) {
            assert!(Instant::now() < deadline, "the held request never arrived");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(response);
    });
    up.release();
    for i in 0..4 {
        assert_eq!(
            h2.get(&format!("/next/{i}")).text(),
            format!("GET /next/{i}")
        );
    }
}

/// Who writes the upstream's request: the edge's own HTTP/2 path (its forwarding fields
/// spelled as the HTTP/1 fast path spells them) or Pingora's proxy (in lowercase).
fn the_fast_path_setting_decides_who_serves_http2_streams(position: Position) {
    let up = Upstream::start(shapes);
    let edge = TlsEdge::start(position, &up, &[]);
    let mut h2 = H2::open(&edge);
    let head = h2.get("/echo").text();
    let own = head.contains("\r\nX-Forwarded-For: 127.0.0.1\r\n");
    match position {
        Position::FastPath => assert!(own, "{head}"),
        Position::PingoraOnly => assert!(!own, "{head}"),
    }
}

/// SIGTERM: during the drain delay a connection's next stream is answered and the connection
/// then told to go away (GOAWAY) and ended; when the listeners close, idle connections end and
/// streams in flight are answered first.
fn sigterm_answers_streams_then_ends_http2_connections(position: Position) {
    let up = Upstream::start(shapes);
    let edge = TlsEdge::start(
        position,
        &up,
        &["--drain-delay", "4", "--shutdown-grace", "30"],
    );
    let mut during = H2::open(&edge);
    let mut in_flight = H2::open(&edge);
    let mut idle = H2::open(&edge);
    for c in [&mut during, &mut in_flight, &mut idle] {
        assert_eq!(c.get("/before").status, 200);
    }
    // SAFETY: a signal to the child this test started.
    unsafe {
        libc::kill(edge._edge.0.id() as i32, libc::SIGTERM);
    }
    let health = || {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", edge.http)).unwrap();
        std::io::Write::write_all(
            &mut s,
            b"GET /.ployz/health HTTP/1.1\r\nHost: h2.test\r\nConnection: close\r\n\r\n",
        )
        .unwrap();
        let mut answer = String::new();
        let _ = std::io::Read::read_to_string(&mut s, &mut answer);
        answer
    };
    let deadline = Instant::now() + Duration::from_secs(5);
    while !health().starts_with("HTTP/1.1 503") {
        assert!(Instant::now() < deadline, "health never turned to draining");
        std::thread::sleep(Duration::from_millis(20));
    }
    // During the drain delay: the next stream is answered, then the connection ends.
    assert_eq!(during.get("/during").text(), "GET /during");
    assert!(during.ended_within(Duration::from_secs(2)));
    // A stream still in flight when the listeners close is answered.
    let held = in_flight.start("/hold");
    in_flight.rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(10);
        while !up.requests().iter().any(|r| r.starts_with("GET /hold")) {
            assert!(Instant::now() < deadline, "the held request never arrived");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", edge.port)).is_ok() {
        assert!(Instant::now() < deadline, "the listener never closed");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(idle.ended_within(Duration::from_secs(2)));
    up.release();
    let answer = in_flight.wait(held);
    assert_eq!((answer.status, answer.text().as_str()), (200, "held"));
    assert!(in_flight.ended_within(Duration::from_secs(2)));
}

/// A client that opens malformed stream after malformed stream loses its connection, even
/// with a stream still waiting for its body: the streams in flight end with it.
fn a_flood_of_malformed_streams_ends_the_connection(position: Position) {
    let up = Upstream::start(shapes);
    let edge = TlsEdge::start(position, &up, &[]);
    let mut h2 = H2::open(&edge);
    assert_eq!(h2.get("/first").status, 200);
    let send = h2.send.clone();
    let body = h2.rt.block_on(async move {
        let mut send = send.ready().await.unwrap();
        // A body of no declared length, left unfinished.
        let (_response, mut body) = send
            .send_request(request(Method::POST, HOST, "/echo", &[]), false)
            .unwrap();
        body.send_data(Bytes::from_static(b"part of a body"), false)
            .unwrap();
        // Kept, so that the client resets none of them.
        let mut refused = Vec::new();
        for _ in 0..40 {
            let Ok(mut ready) = send.clone().ready().await else {
                break;
            };
            // Refused by the edge (400) for the userinfo in its authority.
            let bad = request(Method::GET, &format!("user@{HOST}"), "/", &[]);
            match ready.send_request(bad, true) {
                Ok(sent) => refused.push(sent),
                Err(_) => break,
            }
            tokio::task::yield_now().await;
        }
        (body, refused)
    });
    assert!(
        h2.ended_within(Duration::from_secs(5)),
        "the connection outlived its malformed streams"
    );
    drop(body);
}

crate::in_both_positions!(
    a_flood_of_malformed_streams_ends_the_connection,
    sigterm_answers_streams_then_ends_http2_connections,
    an_http2_request_reaches_the_upstream_as_one_http1_request,
    responses_reach_http2_clients_without_hop_by_hop_fields,
    many_streams_on_one_connection_each_get_their_own_answer,
    upstream_failures_are_502_and_the_connection_goes_on,
    a_reset_stream_leaves_no_answer_behind,
    the_fast_path_setting_decides_who_serves_http2_streams,
);
