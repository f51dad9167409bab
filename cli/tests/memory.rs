//! The daemon's memory comes back after a burst: a real `ployz daemon edge` proxies bursts of
//! hundreds of simultaneous requests to a slow upstream, and once the burst is over its resident
//! anonymous memory must fall back, not stay at the burst's high mark.

mod common;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use common::{free_ports, Reaped, PLOYZ};

/// Simultaneous client connections per burst.
const CONNECTIONS: usize = 400;
/// Bytes of each upstream response body.
const BODY: usize = 20_000;
/// What the edge keeps after any burst, by design, KiB: each worker's spare request buffers (up
/// to 64 pairs, here with the pages a 20 KB body touched) and its idle upstream connections.
/// The bursts take about 20 MiB with two workers; a quarter of that is about what is kept.
const KEPT_BY_DESIGN_KIB: u64 = 6 * 1024;

/// Resident anonymous memory of a process, KiB.
fn rss_anon_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("RssAnon:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("RssAnon in /proc/PID/status")
}

/// An upstream that answers every request after 300 ms, one thread per connection, so a burst
/// has all its requests in flight through the edge at once. Its listen backlog holds a whole
/// burst: with std's 128, connections the accepting thread has not taken yet in a busy moment
/// overflow it, their SYNs are dropped, and the edge's connects time out (1 s) before the
/// retransmission. Ends with the test process.
fn slow_upstream() -> u16 {
    use std::os::fd::AsRawFd;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    // SAFETY: listen(2) again on a listening socket the TcpListener owns only sets its backlog.
    let relisten = unsafe { libc::listen(listener.as_raw_fd(), 2 * CONNECTIONS as libc::c_int) };
    assert_eq!(relisten, 0, "{}", std::io::Error::last_os_error());
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let mut head = Vec::new();
                loop {
                    match conn.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                    if head.windows(4).any(|w| w == b"\r\n\r\n") {
                        head.clear();
                        std::thread::sleep(Duration::from_millis(300));
                        let response = format!(
                            "HTTP/1.1 200 OK\r\nContent-Length: {BODY}\r\n\r\n{}",
                            "x".repeat(BODY)
                        );
                        if conn.write_all(response.as_bytes()).is_err() {
                            return;
                        }
                    }
                }
            });
        }
    });
    port
}

/// Opens `CONNECTIONS` connections, sends a request on each, then reads every response whole.
fn burst(edge: u16) {
    let mut conns: Vec<TcpStream> = (0..CONNECTIONS)
        .map(|i| {
            let mut c = TcpStream::connect(("127.0.0.1", edge)).unwrap();
            c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            write!(c, "GET /burst/{i} HTTP/1.1\r\nHost: app.test\r\n\r\n").unwrap();
            c
        })
        .collect();
    for c in &mut conns {
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            let n = c.read(&mut buf).unwrap();
            assert!(
                n > 0,
                "the edge closed a connection before its response ended"
            );
            got.extend_from_slice(&buf[..n]);
            let head = got.windows(4).position(|w| w == b"\r\n\r\n");
            if head.is_some_and(|h| got.len() >= h + 4 + BODY) {
                break;
            }
        }
        assert!(
            got.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&got[..40.min(got.len())])
        );
    }
}

#[test]
fn memory_taken_by_a_burst_of_connections_is_returned_afterwards() {
    let upstream = slow_upstream();
    let [port] = free_ports();
    let child = std::process::Command::new(PLOYZ)
        .args(["daemon", "edge", "--threads", "2", "--no-access-log"])
        .arg("--http-listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--route")
        .arg(format!("app.test=127.0.0.1:{upstream}"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let edge = Reaped(child);
    let pid = edge.0.id();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the edge never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
    let before = rss_anon_kib(pid);
    let mut peak = before;
    for _ in 0..3 {
        burst(port);
        peak = peak.max(rss_anon_kib(pid));
    }
    assert!(
        peak >= before + 16 * 1024,
        "the bursts did not take memory ({before} KiB -> {peak} KiB): the test shows nothing"
    );
    // Back to at most a quarter of what the bursts took (or to what the edge keeps by design,
    // if that is more), within 30 s.
    let target = before + ((peak - before) / 4).max(KEPT_BY_DESIGN_KIB);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut now = rss_anon_kib(pid);
    while now > target {
        assert!(
            Instant::now() < deadline,
            "resident anonymous memory stayed at {now} KiB after the bursts (before {before} KiB, \
             peak {peak} KiB, expected at most {target} KiB)"
        );
        std::thread::sleep(Duration::from_millis(200));
        now = rss_anon_kib(pid);
    }
    // The figures, for `--nocapture`.
    eprintln!(
        "resident anonymous memory: {before} KiB before the bursts, {peak} KiB at most, \
         {now} KiB after"
    );
}
