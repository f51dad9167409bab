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
