//! The edge refuses oversized and ambiguous requests before any upstream work.

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

#[test]
fn oversized_and_ambiguous_requests_are_refused() {
    let lab = Lab::new();
    let daemon = lab.daemon("h1");
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

#[test]
fn a_refused_connection_is_retried_on_the_next_upstream() {
    let live = live_upstream();
    // Nothing listens on `dead`: every connection to it is refused.
    let [edge, dead] = free_ports();
    let mut child = std::process::Command::new(PLOYZ)
        .args([
            "daemon",
            "edge",
            "--threads",
            "1",
            "--no-access-log",
            "--http-listen",
        ])
        .arg(format!("127.0.0.1:{edge}"))
        .arg("--route")
        .arg(format!("r.test=127.0.0.1:{dead},127.0.0.1:{live}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", edge)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the edge never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Round robin sends every other request to the dead upstream first; none may fail.
    let answers: Vec<(u16, String)> = (0..10).map(|_| http_get(edge, "r.test", "/")).collect();
    stop_child(&mut child, Duration::from_secs(5));
    assert!(
        answers
            .iter()
            .all(|(status, body)| *status == 200 && body == "live"),
        "{answers:?}"
    );
}
