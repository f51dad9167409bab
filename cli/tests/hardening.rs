//! The edge refuses oversized and ambiguous requests before any upstream work, retries a
//! refused connection elsewhere, cuts slow headers, and shuts down without dropping a request.
//! Every test runs with the HTTP/1 fast path and without it.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::*;

/// Sends raw bytes to the edge and returns the status code of the answer (0 if none).
fn raw(port: u16, request: &[u8]) -> u16 {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let _ = s.write_all(request);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

fn oversized_and_ambiguous_requests_are_refused(position: Position) {
    let lab = Lab::new();
    let daemon = Daemon::start_with(
        lab.path("h1-data"),
        lab.path("h1.sock"),
        0,
        &[QUIET_DAEMON, position.args()].concat(),
    );
    let port = daemon.http_port;

    let long_path = format!(
        "GET /{} HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n\r\n",
        "x".repeat(9000)
    );
    assert_eq!(raw(port, long_path.as_bytes()), 414);

    let mut many = String::from("GET / HTTP/1.1\r\nHost: a.test\r\nConnection: close\r\n");
    for i in 0..20 {
        many.push_str(&format!("X-Filler-{i}: {}\r\n", "y".repeat(1000)));
    }
    many.push_str("\r\n");
    assert_eq!(raw(port, many.as_bytes()), 431);

    let big_body =
        "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 2000000\r\nConnection: close\r\n\r\n";
    assert_eq!(raw(port, big_body.as_bytes()), 413);

    let cl_te = "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\n\r\n";
    assert_eq!(raw(port, cl_te.as_bytes()), 400, "CL+TE must be refused");

    let dup_cl = "POST / HTTP/1.1\r\nHost: a.test\r\nContent-Length: 4\r\nContent-Length: 5\r\nConnection: close\r\n\r\nabcde";
    assert_eq!(
        raw(port, dup_cl.as_bytes()),
        400,
        "conflicting Content-Length must be refused"
    );

    // A normal request still gets its normal answer.
    assert_eq!(http_get(port, "a.test", "/").0, 404);
}

/// A tiny upstream answering every request with 200 "live", on its own thread.
fn live_upstream() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                // One request per connection is enough for the edge's pool to work with.
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                        let _ = s.write_all(
                            b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\nConnection: close\r\n\r\nlive",
                        );
                        break;
                    }
                }
            });
        }
    });
    port
}

fn a_refused_connection_is_retried_on_the_next_upstream(position: Position) {
    let live = live_upstream();
    // Nothing listens on `dead`: every connection to it is refused.
    let [dead] = free_ports();
    let (edge, child) = edge_alone_in(
        position,
        &format!("r.test=127.0.0.1:{dead},127.0.0.1:{live}"),
        &[],
    );
    // Round robin sends every other request to the dead upstream first; none may fail.
    let answers: Vec<(u16, String)> = (0..10).map(|_| http_get(edge, "r.test", "/")).collect();
    drop(child);
    assert!(
        answers
            .iter()
            .all(|(status, body)| *status == 200 && body == "live"),
        "{answers:?}"
    );
}

/// An upstream that answers 200 "seen" to every request header on a kept-alive connection and
/// records every byte it receives.
fn recording_upstream() -> (u16, std::sync::Arc<std::sync::Mutex<Vec<u8>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut s) = stream else { continue };
            let record = record.clone();
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut pending = Vec::new();
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    record.lock().unwrap().extend_from_slice(&buf[..n]);
                    pending.extend_from_slice(&buf[..n]);
                    while let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                        pending.drain(..end + 4);
                        let _ = s.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nseen");
                    }
                }
            });
        }
    });
    (port, seen)
}

/// Whether the edge closed `s` (read returned 0 or a reset) within `within`.
fn closed_within(s: &mut std::net::TcpStream, within: Duration) -> bool {
    s.set_read_timeout(Some(within)).unwrap();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

fn a_slow_request_header_is_cut_off_and_a_patient_keepalive_client_is_not(position: Position) {
    let (upstream, seen) = recording_upstream();
    let (port, child) = edge_alone_in(
        position,
        &format!("r.test=127.0.0.1:{upstream}"),
        &["--header-timeout", "2"],
    );

    // A connection that sends nothing is closed after the header timeout.
    let mut silent = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let start = std::time::Instant::now();
    assert!(closed_within(&mut silent, Duration::from_secs(8)));
    assert!(
        start.elapsed() >= Duration::from_millis(1500),
        "{:?}",
        start.elapsed()
    );

    // Slowloris: a header line every 300 ms, never the blank line, for up to six times the
    // header timeout. Pingora's own per-read timeout never fires; only the header deadline can
    // cut it off, so being cut off at all is the proof.
    let mut slow = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: r.test\r\n")
        .unwrap();
    let start = std::time::Instant::now();
    let mut cut = false;
    for i in 0..40 {
        std::thread::sleep(Duration::from_millis(300));
        if slow
            .write_all(format!("X-Slow-{i}: y\r\n").as_bytes())
            .is_err()
        {
            cut = true;
            break;
        }
        if closed_within(&mut slow, Duration::from_millis(1)) {
            cut = true;
            break;
        }
    }
    assert!(cut, "a header trickling for 12 s was never cut off");
    eprintln!("the slow header was cut off after {:?}", start.elapsed());
    assert!(
        !String::from_utf8_lossy(&seen.lock().unwrap()).contains("X-Slow"),
        "a partial header reached the upstream"
    );

    // The deadline holds for every request of a kept-alive connection, not only the first:
    // after one quick request, a second header trickled line by line is cut off too.
    let mut again = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    again
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    again
        .write_all(b"GET / HTTP/1.1\r\nHost: r.test\r\n\r\n")
        .unwrap();
    let answer = seen_answer(&mut again);
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    // Leading empty lines must not pass for the end of a header either.
    again.write_all(b"\r\n\r\nGET / HTTP/1.1\r\n").unwrap();
    let start = std::time::Instant::now();
    let mut cut = false;
    for i in 0..40 {
        std::thread::sleep(Duration::from_millis(300));
        if again
            .write_all(format!("X-Slow-{i}: y\r\n").as_bytes())
            .is_err()
            || closed_within(&mut again, Duration::from_millis(1))
        {
            cut = true;
            break;
        }
    }
    assert!(cut, "a second header trickling for 12 s was never cut off");
    eprintln!(
        "the second slow header was cut off after {:?}",
        start.elapsed()
    );

    // A kept-alive client idle for longer than the header timeout between two requests: the
    // clock starts at the next request's first byte, so its second request is answered.
    let mut patient = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    patient
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    for round in 0..2 {
        patient
            .write_all(b"GET / HTTP/1.1\r\nHost: r.test\r\n\r\n")
            .unwrap();
        let answer = seen_answer(&mut patient);
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("seen"),
            "round {round}: {answer:?}"
        );
        if round == 0 {
            std::thread::sleep(Duration::from_millis(3000));
        }
    }
    drop(child);
}

fn smuggling_shapes_and_bad_hostnames_never_reach_an_upstream_unframed(position: Position) {
    let (upstream, seen) = recording_upstream();
    let (port, child) = edge_alone_in(position, &format!("r.test=127.0.0.1:{upstream}"), &[]);

    // Hostnames with control characters or spaces: refused, never forwarded.
    for host in [
        "r.test\x01",
        "r.te\x7fst",
        "r .test",
        "r.test\x00",
        "r.test:1@evil.test",
        "r.test:1\";proto=https;for=1.2.3.4",
    ] {
        let request =
            format!("GET /bad-host HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
        let status = raw(port, request.as_bytes());
        assert!(status == 400 || status == 404, "Host {host:?} got {status}");
    }
    assert!(
        !String::from_utf8_lossy(&seen.lock().unwrap()).contains("/bad-host"),
        "a request with a bad Host reached the upstream"
    );

    // Upgrade before 101: the upstream answers 200, so the connection stays HTTP; bytes the
    // client sent after the upgrade request are never tunnelled to the upstream raw. Whatever
    // reaches it must have passed through the edge as a request of its own.
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    s.write_all(
        b"GET /upgrade HTTP/1.1\r\nHost: r.test\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n\
          GET /smuggled HTTP/1.1\r\nHost: r.test\r\n\r\n",
    )
    .unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    // The client has its answer, so the upgrade request reached the upstream: wait until the
    // recorder has read all of its head, and of the smuggled request's if that came too.
    let complete = |text: &str, request: &str| {
        text.find(request)
            .is_some_and(|i| text[i..].contains("\r\n\r\n"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let received = loop {
        let text = String::from_utf8_lossy(&seen.lock().unwrap()).to_string();
        let smuggled_partly = text.contains("GET /smuggled") && !complete(&text, "GET /smuggled");
        if complete(&text, "GET /upgrade") && !smuggled_partly {
            break text;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the upstream never received the whole upgrade request: {text:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(received.contains("GET /upgrade"), "{received}");
    for (i, _) in received.match_indices("GET /smuggled") {
        let head = &received[i..];
        let head = &head[..head.find("\r\n\r\n").unwrap_or(head.len())];
        assert!(
            head.to_ascii_lowercase().contains("x-forwarded-for"),
            "bytes after an Upgrade request reached the upstream unframed: {head:?}"
        );
    }
    drop(child);
}

/// Reads one answer of [`recording_upstream`]'s through the edge: its head, then its 4-byte
/// body, however the edge's writes were split into segments.
fn seen_answer(s: &mut std::net::TcpStream) -> String {
    let Some(head) = answer_head(s) else {
        panic!("the connection ended before an answer's head");
    };
    let mut body = [0u8; 4];
    if let Err(e) = s.read_exact(&mut body) {
        panic!("no 4-byte body after {head:?}: {e}");
    }
    head + &String::from_utf8_lossy(&body)
}

fn says_close(head: &str) -> bool {
    head.to_ascii_lowercase()
        .contains("\r\nconnection: close\r\n")
}

fn sigterm_answers_each_kept_alive_client_once_with_close_on_a_real_daemon(position: Position) {
    let lab = Lab::new();
    let mut daemon = Daemon::start_with(
        lab.path("t-data"),
        lab.path("t.sock"),
        3,
        &[QUIET_DAEMON, position.args()].concat(),
    );
    let init = json(&lab.ployz(&daemon, &["machine", "init", "--name", "term", "--json"]));
    let id = init["id"].as_str().unwrap().to_owned();
    let port = daemon.http_port;
    // The edge learns the Machine's ID from the daemon's route service, a moment after `init`
    // has answered: verify answers 503 until then.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while http_get(port, "x", "/.ployz/verify") != (200, id.clone()) {
        assert!(
            std::time::Instant::now() < deadline,
            "the edge never answered verify with the Machine's ID"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let verify = b"GET /.ployz/verify HTTP/1.1\r\nHost: x\r\n\r\n";
    let mut clients: Vec<std::net::TcpStream> = (0..10)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            s.write_all(verify).unwrap();
            let head = verify_answer(&mut s, &id).expect("an answer before SIGTERM");
            assert!(!says_close(&head), "{head}");
            s
        })
        .collect();
    // SAFETY: a signal to the daemon this test started.
    unsafe {
        libc::kill(daemon.pid() as i32, libc::SIGTERM);
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    // Draining, not "starting" (the first route table may come after verify answers).
    while !http_get(port, "x", "/.ployz/health")
        .1
        .contains(r#""status":"draining""#)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "health never turned to draining"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Each kept-alive client gets its answer, told to close, then the connection ends: it
    // reconnects elsewhere rather than meeting a closed connection mid-request later.
    for s in &mut clients {
        s.write_all(verify).unwrap();
        let head = verify_answer(s, &id).expect("an answer during the drain delay");
        assert!(says_close(&head), "{head}");
        assert!(
            closed_within(s, Duration::from_secs(2)),
            "still open after close"
        );
    }
    assert!(
        daemon.stop(),
        "the daemon did not stop after its drain delay"
    );
}

crate::in_both_positions!(
    oversized_and_ambiguous_requests_are_refused,
    a_refused_connection_is_retried_on_the_next_upstream,
    a_slow_request_header_is_cut_off_and_a_patient_keepalive_client_is_not,
    smuggling_shapes_and_bad_hostnames_never_reach_an_upstream_unframed,
);
crate::in_both_positions!(
    #[ignore = "needs dockerd: a Machine's init connects to Docker (scripts/test.sh runs it)"]
    sigterm_answers_each_kept_alive_client_once_with_close_on_a_real_daemon,
);
