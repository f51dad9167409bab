//! A raw HTTP/1 upstream for the edge's tests: it records the exact bytes of every request it
//! receives and answers what the test's function returns.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Where a request ends in `buf` (head, then a Content-Length or chunked body), if it is all
/// there.
pub fn request_end(buf: &[u8]) -> Option<usize> {
    let head_end = buf.windows(4).position(|w| w == b"\r\n\r\n")? + 4;
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let field = |name: &str| {
        head.lines().find_map(|l| {
            l.strip_prefix(&format!("{name}:"))
                .map(|v| v.trim().to_owned())
        })
    };
    if field("transfer-encoding").is_some_and(|v| v.ends_with("chunked")) {
        let mut at = head_end;
        loop {
            let line_end = at + buf[at..].windows(2).position(|w| w == b"\r\n")?;
            let size_text = String::from_utf8_lossy(&buf[at..line_end]).to_string();
            let size = usize::from_str_radix(size_text.split(';').next()?.trim(), 16).ok()?;
            at = line_end + 2;
            if size == 0 {
                // Trailer lines, then the blank line.
                loop {
                    let line_end = at + buf[at..].windows(2).position(|w| w == b"\r\n")?;
                    let empty = line_end == at;
                    at = line_end + 2;
                    if empty {
                        return Some(at);
                    }
                }
            }
            at += size + 2;
            if at > buf.len() {
                return None;
            }
        }
    }
    let length: usize = field("content-length").map_or(Some(0), |v| v.parse().ok())?;
    (buf.len() >= head_end + length).then_some(head_end + length)
}

/// A raw HTTP/1 upstream: reads each request on each connection, records its exact bytes, and
/// answers what `answer` returns for it (closing the connection after an HTTP/1.0 answer).
/// Requests for `/hold...` wait until [`Upstream::release`].
pub struct Upstream {
    pub port: u16,
    seen: Arc<Mutex<Vec<Vec<u8>>>>,
    gate: Arc<(Mutex<bool>, Condvar)>,
}

/// The value of each `name` line of an HTTP/1 head, any case, trimmed.
pub fn fields(head: &str, name: &str) -> Vec<String> {
    head.split("\r\n")
        .filter_map(|l| {
            let (n, v) = l.split_once(':')?;
            n.eq_ignore_ascii_case(name).then(|| v.trim().to_owned())
        })
        .collect()
}

/// A request's method and target (its request line without the version).
pub fn method_and_target(request: &[u8]) -> String {
    String::from_utf8_lossy(request)
        .lines()
        .next()
        .unwrap_or_default()
        .rsplit_once(' ')
        .map(|(start, _)| start.to_owned())
        .unwrap_or_default()
}

/// 200 with the request line's method and target as the body.
pub fn echo_request_line(request: &[u8]) -> Vec<u8> {
    let line = method_and_target(request);
    format!(
        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{line}",
        line.len()
    )
    .into_bytes()
}

impl Upstream {
    pub fn start(answer: fn(&[u8]) -> Vec<u8>) -> Upstream {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let gate = Arc::new((Mutex::new(false), Condvar::new()));
        let (record, held) = (seen.clone(), gate.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { continue };
                let (record, held) = (record.clone(), held.clone());
                std::thread::spawn(move || {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 16384];
                    loop {
                        while let Some(end) = request_end(&buf) {
                            let request: Vec<u8> = buf.drain(..end).collect();
                            record.lock().unwrap().push(request.clone());
                            if request.starts_with(b"GET /hold") {
                                let (released, wake) = &*held;
                                let mut released = released.lock().unwrap();
                                while !*released {
                                    released = wake.wait(released).unwrap();
                                }
                            }
                            let answer = answer(&request);
                            if s.write_all(&answer).is_err() {
                                return;
                            }
                            // An HTTP/1.0 answer ends with the connection.
                            if answer.starts_with(b"HTTP/1.0 ") {
                                return;
                            }
                        }
                        match s.read(&mut chunk) {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                });
            }
        });
        Upstream { port, seen, gate }
    }

    pub fn route(&self, host: &str) -> String {
        format!("{host}=127.0.0.1:{}", self.port)
    }

    /// Every request received so far, as text.
    pub fn requests(&self) -> Vec<String> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .map(|r| String::from_utf8_lossy(r).into_owned())
            .collect()
    }

    /// The requests received once there are `n`, within 5 s.
    pub fn wait_for(&self, n: usize) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let seen = self.requests();
            if seen.len() >= n || Instant::now() > deadline {
                assert_eq!(seen.len(), n, "{seen:#?}");
                return seen;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Lets every held request be answered.
    pub fn release(&self) {
        let (released, wake) = &*self.gate;
        *released.lock().unwrap() = true;
        wake.notify_all();
    }
}
