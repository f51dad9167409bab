//! `ployz daemon handover`: a new daemon process takes over from the running one (its edge
//! listeners, its store, its modules) under load, and no request fails: GETs and POSTs on new
//! connections and on a kept-alive one, and a 20 s request in flight that completes in the old
//! process. The management API's socket is probed throughout; its longest answer is the gap.

mod common;

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;

/// Kills a process by ID when dropped (the daemon the handover started is not the harness's
/// child).
struct KillOnDrop(Option<u32>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(pid) = self.0 {
            let pid = pid as i32;
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::path::Path::new(&format!("/proc/{pid}")).exists()
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
        }
    }
}

/// Stops the load when dropped (a failing assertion too), so its threads end.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// A client on one kept-alive connection, reconnecting when the edge says `Connection: close`
/// (or closes after a response); a request that gets no complete response is a failure.
struct KeepAlive {
    port: u16,
    conn: Option<BufReader<std::net::TcpStream>>,
    connections: usize,
    /// How long a response may take.
    timeout: Duration,
}

impl KeepAlive {
    fn request(&mut self, method: &str, path: &str, body: &str) -> Result<(u16, String), String> {
        if self.conn.is_none() {
            let s = std::net::TcpStream::connect(("127.0.0.1", self.port))
                .map_err(|e| format!("connect: {e}"))?;
            s.set_read_timeout(Some(self.timeout)).unwrap();
            self.conn = Some(BufReader::new(s));
            self.connections += 1;
        }
        let conn = self.conn.as_mut().unwrap();
        let head = format!(
            "{method} {path} HTTP/1.1\r\nHost: web.test.localhost\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        if let Err(e) = conn.get_mut().write_all(head.as_bytes()) {
            self.conn = None;
            return Err(format!("write: {e}"));
        }
        let mut status_line = String::new();
        if let Err(e) = conn.read_line(&mut status_line) {
            self.conn = None;
            return Err(format!("read: {e}"));
        }
        if status_line.is_empty() {
            self.conn = None;
            return Err("closed without a response".into());
        }
        let status: u16 = status_line
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let (mut length, mut close, mut chunked) = (None::<usize>, false, false);
        loop {
            let mut line = String::new();
            conn.read_line(&mut line)
                .map_err(|e| format!("head: {e}"))?;
            let line = line.trim_end();
            if line.is_empty() {
                break;
            }
            let lower = line.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                length = v.trim().parse().ok();
            }
            if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
                chunked = true;
            }
            if lower.starts_with("connection:") && lower.contains("close") {
                close = true;
            }
        }
        let mut body = Vec::new();
        if chunked {
            loop {
                let mut size = String::new();
                conn.read_line(&mut size)
                    .map_err(|e| format!("chunk: {e}"))?;
                let n = usize::from_str_radix(size.trim().split(';').next().unwrap_or(""), 16)
                    .map_err(|e| format!("chunk size {size:?}: {e}"))?;
                let mut chunk = vec![0u8; n + 2];
                conn.read_exact(&mut chunk)
                    .map_err(|e| format!("chunk: {e}"))?;
                if n == 0 {
                    break;
                }
                body.extend_from_slice(&chunk[..n]);
            }
        } else if let Some(n) = length {
            body.resize(n, 0);
            conn.read_exact(&mut body)
                .map_err(|e| format!("body: {e}"))?;
        } else {
            conn.read_to_end(&mut body)
                .map_err(|e| format!("body: {e}"))?;
            close = true;
        }
        if close {
            self.conn = None;
        }
        Ok((status, String::from_utf8_lossy(&body).into_owned()))
    }
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn a_handover_under_load_fails_no_request_and_a_long_request_completes() {
    let lab = Lab::new();
    let mut m = DockerMachine::new(&lab, "handover");
    let port = m.daemon.http_port;
    let compose = |greeting: &str| {
        format!(
            r#"
services:
  web:
    image: {TEST_IMAGE}
    command:
      - sh
      - -c
      - |
        mkdir -p /www/cgi-bin
        echo "$$GREETING $$HOSTNAME" > /www/index.html
        printf '#!/bin/sh\necho started > /www/slow-started\nsleep 20\necho "Content-Type: text/plain"\necho\necho slow-done\n' > /www/cgi-bin/slow
        printf '#!/bin/sh\necho "Content-Type: text/plain"\necho\nhead -c "$$CONTENT_LENGTH"\n' > /www/cgi-bin/echo
        chmod +x /www/cgi-bin/slow /www/cgi-bin/echo
        exec httpd -f -p 8080 -h /www
    environment:
      GREETING: {greeting}
    healthcheck:
      test: ["CMD", "wget", "-q", "-O-", "http://127.0.0.1:8080/"]
      interval: 1s
      retries: 2
    x-ports:
      - web.test.localhost:8080/http
"#
        )
    };
    std::fs::write(lab.path("compose.yaml"), compose("one")).unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let deadline = Instant::now() + Duration::from_secs(20);
    while http_get(port, "web.test.localhost", "/").0 != 200 {
        assert!(Instant::now() < deadline, "the container never answered");
        std::thread::sleep(Duration::from_millis(100));
    }

    // The long request, in flight before the handover starts.
    let slow = std::thread::spawn(move || {
        let started = Instant::now();
        let mut client = KeepAlive {
            port,
            conn: None,
            connections: 0,
            timeout: Duration::from_secs(60),
        };
        let answer = client
            .request("GET", "/cgi-bin/slow", "")
            .unwrap_or_else(|e| (0, e));
        (answer, started.elapsed())
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(port, "web.test.localhost", "/slow-started").0 != 200 {
        assert!(Instant::now() < deadline, "the long request never started");
        std::thread::sleep(Duration::from_millis(50));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_panic = StopOnDrop(stop.clone());
    let answered = Arc::new(AtomicUsize::new(0));
    // Two clients with a connection per request, GETs and POSTs by turns.
    let mut load: Vec<std::thread::JoinHandle<Vec<String>>> = (0..2)
        .map(|client| {
            let (stop, answered) = (stop.clone(), answered.clone());
            std::thread::spawn(move || {
                let mut failures = Vec::new();
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += 1;
                    let sent = format!("post-{client}-{n}");
                    let (status, body) = if n.is_multiple_of(2) {
                        http_request(port, "POST", "web.test.localhost", "/cgi-bin/echo", &sent)
                    } else {
                        http_get(port, "web.test.localhost", "/")
                    };
                    let ok = status == 200
                        && if n.is_multiple_of(2) {
                            body.contains(&sent)
                        } else {
                            body.starts_with("one ")
                        };
                    if !ok {
                        failures.push(format!("#{n}: {status} {body}"));
                    }
                    answered.fetch_add(1, Ordering::Relaxed);
                }
                failures
            })
        })
        .collect();
    // One client on kept-alive connections.
    let kept_connections = Arc::new(AtomicUsize::new(0));
    {
        let (stop, answered, kept_connections) =
            (stop.clone(), answered.clone(), kept_connections.clone());
        load.push(std::thread::spawn(move || {
            let mut client = KeepAlive {
                port,
                conn: None,
                connections: 0,
                timeout: Duration::from_secs(10),
            };
            let mut failures = Vec::new();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let sent = format!("kept-{n}");
                let result = if n.is_multiple_of(2) {
                    client.request("POST", "/cgi-bin/echo", &sent)
                } else {
                    client.request("GET", "/", "")
                };
                match result {
                    Ok((200, body)) if !n.is_multiple_of(2) || body.contains(&sent) => {}
                    other => failures.push(format!("kept #{n}: {other:?}")),
                }
                answered.fetch_add(1, Ordering::Relaxed);
            }
            kept_connections.store(client.connections, Ordering::Relaxed);
            failures
        }));
    }
    // The management API, every 20 ms: (longest answer, failures).
    let api = {
        let (stop, socket) = (stop.clone(), m.daemon.socket.clone());
        std::thread::spawn(move || {
            let (mut longest, mut failures, mut calls) = (Duration::ZERO, Vec::new(), 0usize);
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let answer = std::panic::catch_unwind(|| {
                    api_request(&socket, "GET", "/v1/version", "", b"").0
                });
                let took = t.elapsed();
                calls += 1;
                match answer {
                    Ok(200) => longest = longest.max(took),
                    other => failures.push(format!("{other:?} after {took:?}")),
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (longest, failures, calls)
        })
    };
    wait_for_answers(&answered, 50);

    let old_pid = m.daemon.pid();
    let started = Instant::now();
    let (new_pid, _new) = handover(&lab, &m);
    let handover_took = started.elapsed();
    assert!(
        new_pid.is_some_and(|p| p != old_pid),
        "the pid file names {new_pid:?}, the old process was {old_pid}"
    );
    // Answers from the new process for a while, then the load stops.
    let after = answered.load(Ordering::Relaxed);
    wait_for_answers(&answered, after + 100);

    // The old process finishes its long request, then exits by itself.
    let ((status, body), slow_took) = slow.join().unwrap();
    assert_eq!(
        status,
        200,
        "the long request: {body}\n{}",
        m.daemon.log_text()
    );
    assert!(body.contains("slow-done"), "the long request: {body:?}");
    assert!(slow_took >= Duration::from_secs(15), "{slow_took:?}");
    retired_by_itself(&mut m);
    let after = answered.load(Ordering::Relaxed);
    wait_for_answers(&answered, after + 50);
    stop.store(true, Ordering::Relaxed);
    let failures: Vec<String> = load.into_iter().flat_map(|h| h.join().unwrap()).collect();
    let total = answered.load(Ordering::Relaxed);
    let (api_longest, api_failures, api_calls) = api.join().unwrap();
    eprintln!(
        "handover: {total} requests, {} kept-alive connections, handover command {handover_took:?}; management API: {api_calls} calls, longest answer {api_longest:?}, {} failed",
        kept_connections.load(Ordering::Relaxed),
        api_failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {total} requests failed: {:?}\n{}",
        failures.len(),
        &failures[..failures.len().min(5)],
        m.daemon.log_text()
    );
    assert!(
        api_failures.is_empty(),
        "management API calls failed: {api_failures:?}"
    );
    assert!(
        kept_connections.load(Ordering::Relaxed) >= 2,
        "the kept-alive client never moved to the new process"
    );

    // The new process owns the store and the containers: a deploy goes through it.
    std::fs::write(lab.path("compose.yaml"), compose("two")).unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let deadline = Instant::now() + Duration::from_secs(30);
    while !http_get(port, "web.test.localhost", "/")
        .1
        .starts_with("two ")
    {
        assert!(
            Instant::now() < deadline,
            "the new process never served the new deploy"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The Ingress Ports are handed over too: a client connecting to one throughout a handover is
/// never refused, and every connection is answered by the Service's container, by the old
/// process and then the new one, which serves the sockets the old one kept open. A connection
/// the old process took goes on after the handover: the old process waits for it.
#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn ingress_ports_are_handed_over_and_no_connection_is_refused() {
    let lab = Lab::new();
    let mut m = DockerMachine::new(&lab, "handports");
    let port = free_tcp_port();
    std::fs::write(lab.path("compose.yaml"), raw_tcp_compose(port)).unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    // One connection through the Ingress Port: its answer, or what went wrong.
    let ask = move || -> Result<(), String> {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port))
            .map_err(|e| format!("connect: {e}"))?;
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(b"GET / HTTP/1.0\r\n\r\n")
            .map_err(|e| format!("write: {e}"))?;
        let mut raw = String::new();
        s.read_to_string(&mut raw)
            .map_err(|e| format!("read: {e}"))?;
        if raw.ends_with("raw-tcp\n") {
            Ok(())
        } else {
            Err(format!("answered {raw:?}"))
        }
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = ask() {
        assert!(
            Instant::now() < deadline,
            "the Ingress Port never forwarded: {e}\n{}",
            m.daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    let stop = Arc::new(AtomicBool::new(false));
    let _stop_on_panic = StopOnDrop(stop.clone());
    let answered = Arc::new(AtomicUsize::new(0));
    let load = {
        let (stop, answered) = (stop.clone(), answered.clone());
        std::thread::spawn(move || {
            let mut failures = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = ask() {
                    failures.push(e);
                }
                answered.fetch_add(1, Ordering::Relaxed);
            }
            failures
        })
    };
    wait_for_answers(&answered, 20);
    let old_pid = m.daemon.pid();
    // A connection the old process took, whose request comes only after the handover.
    let mut held = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    held.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    wait_accepted_by(old_pid, port, held.local_addr().unwrap().port());
    let (new_pid, _new) = handover(&lab, &m);
    assert!(new_pid.is_some_and(|p| p != old_pid));
    let retiring = wait_log(&m, "handed over: the edge's listeners are closed here");
    let counted: usize = retiring
        .split_once("connections=")
        .and_then(|(_, n)| n.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    assert!(
        counted >= 1,
        "the old process does not count the connection it took through the Ingress Port: {retiring}"
    );
    assert!(
        m.daemon.wait_exited(Duration::ZERO).is_none(),
        "the old process exited with the connection it took still open"
    );
    held.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let mut raw = String::new();
    let read = held.read_to_string(&mut raw);
    assert!(
        read.is_ok() && raw.ends_with("raw-tcp\n"),
        "the connection the old process took was cut: {read:?} {raw:?}\n{}",
        m.daemon.log_text()
    );
    drop(held);
    retired_by_itself(&mut m);
    let after = answered.load(Ordering::Relaxed);
    wait_for_answers(&answered, after + 50);
    stop.store(true, Ordering::Relaxed);
    let failures = load.join().unwrap();
    let total = answered.load(Ordering::Relaxed);
    eprintln!("Ingress Port handover: {total} connections");
    assert!(
        failures.is_empty(),
        "{} of {total} connections failed: {:?}\n{}",
        failures.len(),
        &failures[..failures.len().min(5)],
        m.daemon.log_text()
    );
    let log = m.daemon.log_text();
    assert!(
        log.lines()
            .any(|l| l.contains("Ingress Port listening") && l.contains("handed over")),
        "the new process did not serve the handed-over socket:\n{log}"
    );
}

#[test]
fn a_handover_with_no_daemon_running_says_so_and_starts_nothing() {
    let lab = Lab::new();
    let [http, https, metrics] = free_ports();
    let data = lab.path("data");
    let out = lab
        .cli()
        .args(["daemon", "handover", "--data-dir"])
        .arg(&data)
        .arg("--socket")
        .arg(lab.path("ployz.sock"))
        .args(["--http-listen", &format!("127.0.0.1:{http}")])
        .args(["--https-listen", &format!("127.0.0.1:{https}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
        .args(["--no-mesh"])
        .args(QUIET_DAEMON)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("no running daemon to take over from"), "{err}");
    assert!(!data.join("run/daemon.pid").exists());
    // Nothing listens on the ports it was given.
    assert!(std::net::TcpStream::connect(("127.0.0.1", http)).is_err());
}

/// Waits for `m`'s daemon, the old process, to exit by itself after a handover, successfully.
fn retired_by_itself(m: &mut DockerMachine) {
    let exited = m.daemon.wait_exited(Duration::from_secs(30));
    assert!(
        exited.is_some_and(|s| s.success()),
        "the old process did not retire by itself: {exited:?}\n{}",
        m.daemon.log_text()
    );
}

/// Runs `ployz daemon handover` for `m`'s daemon (its output appended to the daemon's log),
/// which must succeed: the new process's ID (from the pid file), and a guard that stops it.
fn handover(lab: &Lab, m: &DockerMachine) -> (Option<u32>, KillOnDrop) {
    let old_pid = m.daemon.pid();
    let out = lab
        .cli()
        .args(["daemon", "handover"])
        .args(m.daemon.run_flags())
        .env("PLOYZ_LOG", "info")
        .stderr(
            std::fs::OpenOptions::new()
                .append(true)
                .open(m.daemon.log_path())
                .unwrap(),
        )
        .output()
        .unwrap();
    let new_pid: Option<u32> = std::fs::read_to_string(m.daemon.data_dir.join("run/daemon.pid"))
        .ok()
        .and_then(|p| p.trim().parse().ok());
    let guard = KillOnDrop(new_pid.filter(|p| *p != old_pid));
    assert!(
        out.status.success(),
        "handover failed: {}\n{}",
        stdout(&out),
        m.daemon.log_text()
    );
    (new_pid, guard)
}

/// Waits until the load clients have had `n` answers in all.
fn wait_for_answers(answered: &AtomicUsize, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while answered.load(Ordering::Relaxed) < n {
        assert!(
            Instant::now() < deadline,
            "the load had only {} of {n} answers",
            answered.load(Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until `m`'s daemon log has a line containing `what`, and answers it.
fn wait_log(m: &DockerMachine, what: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(line) = m.daemon.log_text().lines().find(|l| l.contains(what)) {
            return line.to_string();
        }
        assert!(
            Instant::now() < deadline,
            "the daemon never logged {what:?}:\n{}",
            m.daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits until the connection from local port `client` to the edge's `port` is accepted by
/// the process `pid` (`ss` names the process holding each socket).
fn wait_accepted_by(pid: u32, port: u16, client: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = std::process::Command::new("ss")
            .args(["-Htnp", "state", "established"])
            .arg(format!("( sport = :{port} and dport = :{client} )"))
            .output()
            .expect("ss runs");
        if String::from_utf8_lossy(&out.stdout).contains(&format!("pid={pid},")) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "process {pid} never accepted the connection from port {client}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A client whose request is on its way just as the retiring process closes its listeners is
/// answered there (told to close), not met with a closed connection: on a kept-alive
/// connection between two requests, on a fresh connection that has sent nothing yet, and on
/// an HTTPS connection that has not begun its handshake.
#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn a_request_sent_as_the_old_process_closes_its_listeners_is_answered() {
    let lab = Lab::new();
    let mut m = DockerMachine::new(&lab, "straggler");
    let (port, id) = (m.daemon.http_port, m.id.clone());
    let deadline = Instant::now() + Duration::from_secs(10);
    while http_get(port, "x", "/.ployz/verify") != (200, id.clone()) {
        assert!(
            Instant::now() < deadline,
            "the edge never answered verify with the Machine's ID"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let verify = b"GET /.ployz/verify HTTP/1.1\r\nHost: x\r\n\r\n";
    let connect = |port: u16| {
        let s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    let mut kept = connect(port);
    kept.write_all(verify).unwrap();
    let head = verify_answer(&mut kept, &id).expect("an answer before the handover");
    assert!(
        !head.to_ascii_lowercase().contains("connection: close"),
        "{head}"
    );
    let mut fresh = connect(port);
    let tls = connect(m.daemon.https_port);
    let old_pid = m.daemon.pid();
    for (s, port) in [(&fresh, port), (&tls, m.daemon.https_port)] {
        wait_accepted_by(old_pid, port, s.local_addr().unwrap().port());
    }

    let (_, _new) = handover(&lab, &m);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !m
        .daemon
        .log_text()
        .contains("the edge's listeners are closed here")
    {
        assert!(
            Instant::now() < deadline,
            "the old process never closed its listeners:\n{}",
            m.daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(10));
    }

    for (what, s) in [("kept-alive", &mut kept), ("fresh", &mut fresh)] {
        s.write_all(verify).unwrap();
        let head = verify_answer(s, &id)
            .unwrap_or_else(|| panic!("the {what} connection was closed without an answer"));
        assert!(
            head.to_ascii_lowercase()
                .contains("\r\nconnection: close\r\n"),
            "the {what} connection's answer does not say close: {head}"
        );
    }
    // No certificate is held for this name: the edge's answer to the handshake is an alert,
    // where a connection closed under it would end without one.
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("straggler.test").unwrap();
    let mut client = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut tls = tls;
    let handshake = client.complete_io(&mut tls);
    assert!(
        matches!(
            handshake,
            Err(ref e) if e.to_string().contains("received fatal alert")
        ),
        "the HTTPS connection's handshake: {handshake:?}"
    );
    assert!(
        m.daemon
            .wait_exited(Duration::from_secs(30))
            .is_some_and(|s| s.success()),
        "the old process did not retire:\n{}",
        m.daemon.log_text()
    );
}
