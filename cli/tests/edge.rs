//! The edge end to end: real daemon, real containers, requests through the Pingora listener.
//! The tests of routing and draining run with the HTTP/1 fast path and without it.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;

/// An initialised Machine named `name` whose edge runs in `position`.
fn machine_in(lab: &Lab, name: &str, position: Position) -> DockerMachine {
    let name = match position {
        Position::FastPath => name.to_owned(),
        Position::PingoraOnly => format!("{name}p"),
    };
    DockerMachine::with(lab, &name, &[QUIET_DAEMON, position.args()].concat(), &[])
}

/// Bodies answered for `host` over `n` requests.
fn bodies(port: u16, host: &str, n: usize) -> BTreeSet<String> {
    (0..n)
        .map(|_| http_get(port, host, "/").1.trim().to_owned())
        .collect()
}

/// Waits until the containers behind `web.test.localhost` have started `n` slow CGI requests
/// between them (each appends its container's hostname to that container's `/www/slow-started`).
fn wait_for_slow_requests(port: u16, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        // Round robin: a few answers cover every container; each says what its container saw.
        let mut started_by_container = std::collections::BTreeMap::new();
        for _ in 0..4 {
            let (status, body) = http_get(port, "web.test.localhost", "/slow-started");
            if let (200, Some(container)) = (status, body.lines().next()) {
                started_by_container.insert(container.to_owned(), body.lines().count());
            }
        }
        let started: usize = started_by_container.values().sum();
        if started >= n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{n} slow requests never reached the containers: {started_by_container:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the slow CGI of the one container behind `host` has started a request.
fn wait_for_slow_request(port: u16, host: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(port, host, "/slow-started").0 != 200 {
        assert!(
            Instant::now() < deadline,
            "the slow request never reached {host}'s container"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the load clients have had `n` answers in all.
fn wait_for_answers(answered: &std::sync::atomic::AtomicUsize, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while answered.load(std::sync::atomic::Ordering::Relaxed) < n {
        assert!(
            Instant::now() < deadline,
            "the load had only {} of {n} answers",
            answered.load(std::sync::atomic::Ordering::Relaxed)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn hostnames_route_to_every_serving_container_and_unknown_hosts_get_404(position: Position) {
    let lab = Lab::new();
    let m = machine_in(&lab, "edge1", position);
    let port = m.daemon.http_port;

    // The edge learns of `machine init` within moments.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (status, body) = loop {
        let answer = http_get(port, "anything", "/.ployz/health");
        if answer.0 == 200 || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(&m.id) && body.contains("serving"), "{body}");
    assert_eq!(http_get(port, "x", "/.ployz/verify"), (200, m.id.clone()));

    std::fs::write(
        lab.path("compose.yaml"),
        format!(
            r#"
services:
  app:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "echo $$HOSTNAME > /www/index.html && exec httpd -f -p 8080 -h /www"]
    deploy:
      replicas: 2
    healthcheck:
      test: ["CMD", "wget", "-q", "-O-", "http://127.0.0.1:8080/"]
      interval: 1s
      retries: 2
    x-ports:
      - app.test.localhost:8080/http
"#
        ),
    )
    .unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let names: BTreeSet<String> = json(&run(&lab, &m, &["ps", "--json"]))["values"]
        .clone()
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names.len(), 2);

    // Both containers answer, round robin, whatever the Host's case or port.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let seen = bodies(port, "App.Test.Localhost:80", 6);
        if seen == names {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "answers {seen:?}, containers {names:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, body) = http_get(port, "nobody.test", "/");
    assert_eq!(status, 404);
    assert!(body.contains("no Service publishes this host"), "{body}");

    let ls = stdout(&run(&lab, &m, &["ls"]));
    assert!(ls.contains("http://app.test.localhost"), "{ls}");

    // Metrics count what the edge answered.
    let (status, metrics) = http_get(m.daemon.metrics_port, "x", "/metrics");
    assert_eq!(status, 200);
    let count = |code: &str| -> u64 {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("ployz_edge_requests_total{{code=\"{code}\"}}")))
            .and_then(|l| l.split_whitespace().last()?.parse().ok())
            .unwrap_or(0)
    };
    assert!(count("2xx") >= 6, "{metrics}");
    assert!(count("4xx") >= 1, "{metrics}");
    assert!(
        metrics.contains("ployz_edge_route_table_hostnames 1"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("ployz_edge_route_table_generation 0\n"),
        "{metrics}"
    );

    // A container that turns unhealthy stops receiving requests.
    let sick = names.iter().next().unwrap().clone();
    let healthy: BTreeSet<String> = names.iter().filter(|n| **n != sick).cloned().collect();
    let out = run(
        &lab,
        &m,
        &["exec", "app", "--container", &sick, "rm", "/www/index.html"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let seen = bodies(port, "app.test.localhost", 6);
        if seen == healthy {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still routed to the unhealthy one: {seen:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A test CA and a leaf for `host` signed by it: `<name>.pem`, `<name>.key`.
fn leaf(dir: &std::path::Path, name: &str, host: &str) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={host}"),
        ],
    );
    std::fs::write(
        dir.join(format!("{name}.ext")),
        format!("subjectAltName=DNS:{host}\n"),
    )
    .unwrap();
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            &format!("{name}.pem"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
        ],
    );
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn https_with_imported_certificates_by_sni_and_http_redirects() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "edge2");
    let dir = lab.dir.path();
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=Ployz Test CA",
        ],
    );
    leaf(dir, "app", "app.test.localhost");
    leaf(dir, "second", "second.test.localhost");

    std::fs::write(
        lab.path("compose.yaml"),
        format!(
            r#"
services:
  app:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "echo secure-$$HOSTNAME > /www/index.html && exec httpd -f -p 8080 -h /www"]
    x-ports:
      - app.test.localhost:8080/https
      - second.test.localhost:8080/https
"#
        ),
    )
    .unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));

    // Bad pairs are refused before anything is stored.
    let out = run(
        &lab,
        &m,
        &[
            "cert",
            "import",
            "app.test.localhost",
            "--cert",
            "app.pem",
            "--key",
            "second.key",
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("does not match the certificate"),
        "{}",
        stderr(&out)
    );
    let out = run(
        &lab,
        &m,
        &[
            "cert",
            "import",
            "app.test.localhost",
            "--cert",
            "second.pem",
            "--key",
            "second.key",
        ],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("does not cover")
            || stderr(&out).contains("but not 'app.test.localhost'"),
        "{}",
        stderr(&out)
    );

    for (host, name) in [
        ("app.test.localhost", "app"),
        ("second.test.localhost", "second"),
    ] {
        let out = run(
            &lab,
            &m,
            &[
                "cert",
                "import",
                host,
                "--cert",
                &format!("{name}.pem"),
                "--key",
                &format!("{name}.key"),
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let ls = json(&run(&lab, &m, &["cert", "ls", "--json"]));
    assert_eq!(ls["material"].as_array().unwrap().len(), 2, "{ls:#}");
    assert!(
        ls["material"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["imported"] == true),
        "imported material is marked so the issuer leaves it alone: {ls:#}"
    );

    // Each hostname gets its own certificate, picked by SNI, without a restart.
    let port = m.daemon.https_port;
    let deadline = Instant::now() + Duration::from_secs(10);
    let (ok, body, verbose) = loop {
        let answer = curl_https(dir, port, "app.test.localhost", &[]);
        if answer.0 || Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(ok, "{verbose}");
    assert!(body.starts_with("secure-app-"), "{body}");
    assert!(verbose.contains("CN=app.test.localhost"), "{verbose}");
    let (ok, _, verbose) = curl_https(dir, port, "second.test.localhost", &[]);
    assert!(ok, "{verbose}");
    assert!(verbose.contains("CN=second.test.localhost"), "{verbose}");
    let (ok, _, verbose) = curl_https(dir, port, "app.test.localhost", &["--http2"]);
    assert!(ok && verbose.contains("HTTP/2"), "{verbose}");

    // A hostname with no certificate: the handshake fails, and the metrics count it.
    let (ok, _, verbose) = curl_https(dir, port, "none.test.localhost", &[]);
    assert!(!ok, "no certificate covers none.test.localhost: {verbose}");
    // Counted once the edge's handshake returns, which can be just after curl saw the alert.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, metrics) = http_get(m.daemon.metrics_port, "x", "/metrics");
        assert_eq!(status, 200);
        let failed = metrics
            .lines()
            .find(|l| l.starts_with("ployz_edge_tls_handshake_failures_total{reason=\"failed\"}"))
            .and_then(|l| l.split_whitespace().last()?.parse::<u64>().ok());
        if failed.is_some_and(|n| n >= 1) {
            // The edge serves both certificates (curl saw each): it says when each expires.
            for material in ls["material"].as_array().unwrap() {
                let line = format!(
                    "ployz_edge_certificate_expiry_timestamp_seconds{{hostname=\"{}\"}} {}\n",
                    material["hostname"].as_str().unwrap(),
                    material["not_after"].as_i64().unwrap()
                );
                assert!(metrics.contains(&line), "no {line} in {metrics}");
            }
            assert!(
                !metrics.contains("hostname=\"none.test.localhost\""),
                "{metrics}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the failed handshake was never counted: {metrics}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }

    // Plain HTTP to an https hostname redirects, keeping the path and query.
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", m.daemon.http_port)).unwrap();
    write!(
        s,
        "GET /x?y=1 HTTP/1.1\r\nHost: app.test.localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut raw = String::new();
    s.read_to_string(&mut raw).unwrap();
    assert!(raw.starts_with("HTTP/1.1 308"), "{raw}");
    assert!(
        raw.to_ascii_lowercase().contains(&format!(
            "location: https://app.test.localhost:{port}/x?y=1"
        )),
        "{raw}"
    );
}

fn a_rolling_deploy_under_load_fails_no_request_and_a_long_request_completes(position: Position) {
    // One position at a time: the long requests must still be in flight when the first drain
    // starts, which two loaded deploys side by side on a small machine do not leave time for.
    static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _turn = ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let lab = Lab::new();
    let m = machine_in(&lab, "edge3", position);
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
        printf '#!/bin/sh\necho %s >> /www/slow-started\nsleep 6\necho "Content-Type: text/plain"\necho\necho slow-done\n' "$$HOSTNAME" > /www/cgi-bin/slow
        printf '#!/bin/sh\necho "Content-Type: text/plain"\necho\nhead -c "$$CONTENT_LENGTH"\n' > /www/cgi-bin/echo
        chmod +x /www/cgi-bin/slow /www/cgi-bin/echo
        exec httpd -f -p 8080 -h /www
    environment:
      GREETING: {greeting}
    deploy:
      replicas: 2
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
    let deadline = Instant::now() + Duration::from_secs(10);
    while bodies(port, "web.test.localhost", 4).len() < 2 {
        assert!(Instant::now() < deadline, "both containers never answered");
        std::thread::sleep(Duration::from_millis(100));
    }

    // Four long requests first, before any other: round robin puts two on each old container,
    // whatever order they arrive in. The first drain must wait for them.
    let slow: Vec<_> = (0..4)
        .map(|_| std::thread::spawn(move || http_get(port, "web.test.localhost", "/cgi-bin/slow")))
        .collect();
    wait_for_slow_requests(port, 4);
    // The load: three clients back to back, GETs of the page and POSTs echoed by a CGI.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answered = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let load: Vec<_> = (0..3)
        .map(|client| {
            let stop = stop.clone();
            let answered = answered.clone();
            std::thread::spawn(move || {
                let mut results: Vec<(u16, String)> = Vec::new();
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    if n.is_multiple_of(2) {
                        let sent = format!("post-{client}-{n}");
                        let (status, body) = http_request(
                            port,
                            "POST",
                            "web.test.localhost",
                            "/cgi-bin/echo",
                            &sent,
                        );
                        let ok = status == 200 && body.contains(&sent);
                        results.push((
                            if ok { 200 } else { status.max(1) },
                            format!("POST {sent} -> {status} {body}"),
                        ));
                    } else {
                        results.push(http_get(port, "web.test.localhost", "/"));
                    }
                    answered.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                results
            })
        })
        .collect();
    let load_started = Instant::now();
    // The deploy starts under load: once the clients have had answers.
    wait_for_answers(&answered, 30);

    std::fs::write(lab.path("compose.yaml"), compose("two")).unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        !stderr(&out).contains("still had"),
        "a drain timed out: {}",
        stderr(&out)
    );
    let waits: Vec<u64> = m
        .daemon
        .log_text()
        .lines()
        .filter(|l| l.contains("container drained"))
        .filter_map(|l| {
            l.split("waited_ms=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    assert_eq!(waits.len(), 2, "{waits:?}");
    assert!(
        waits[0] >= 1000,
        "the first drain did not wait for its long requests: {waits:?}"
    );
    // Keep the load on a little after the deploy returned: answers only the new version gave.
    let after_deploy = answered.load(std::sync::atomic::Ordering::Relaxed);
    wait_for_answers(&answered, after_deploy + 30);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let per_client: Vec<Vec<(u16, String)>> = load.into_iter().map(|h| h.join().unwrap()).collect();
    let rate = per_client.iter().map(Vec::len).sum::<usize>() as f64
        / load_started.elapsed().as_secs_f64();
    let results: Vec<(u16, String)> = per_client.concat();
    let failed: Vec<&(u16, String)> = results
        .iter()
        .filter(|(status, _)| *status != 200)
        .collect();
    eprintln!("load: {} requests, {rate:.0}/s", results.len());
    assert!(
        results.len() > 500,
        "too few requests to prove anything: {}",
        results.len()
    );
    assert!(
        failed.is_empty(),
        "{} of {} requests failed: {:?}",
        failed.len(),
        results.len(),
        &failed[..failed.len().min(5)]
    );
    assert!(
        results.iter().any(|(_, b)| b.starts_with("POST ")),
        "no POST was made"
    );
    assert!(results.iter().any(|(_, b)| b.starts_with("one ")));
    let last_get = per_client[0]
        .iter()
        .rev()
        .find(|(_, b)| !b.starts_with("POST "));
    assert!(
        last_get.is_some_and(|(_, b)| b.starts_with("two ")),
        "{last_get:?}"
    );
    for handle in slow {
        let (status, body) = handle.join().unwrap();
        assert_eq!(status, 200, "{body}");
        assert!(
            body.contains("slow-done"),
            "a long request in flight did not complete: {body:?}"
        );
    }
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn websocket_upgrades_pass_through_both_ways() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "edge4");
    std::fs::write(
        lab.path("compose.yaml"),
        format!(
            r#"
services:
  ws:
    image: {TEST_IMAGE}
    command:
      - sh
      - -c
      - |
        printf '#!/bin/sh\nwhile read -r line; do\n  line=$$(printf "%%s" "$$line" | tr -d "\\r")\n  [ -z "$$line" ] && break\ndone\nprintf "HTTP/1.1 101 Switching Protocols\\r\\nUpgrade: websocket\\r\\nConnection: Upgrade\\r\\n\\r\\n"\nexec cat\n' > /bin/upgrade
        chmod +x /bin/upgrade
        while true; do nc -l -p 8080 -e /bin/upgrade; done
    x-ports:
      - ws.test.localhost:8080/http
"#
        ),
    )
    .unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));

    use std::io::{Read, Write};
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut s = std::net::TcpStream::connect(("127.0.0.1", m.daemon.http_port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        write!(
            s,
            "GET /ws HTTP/1.1\r\nHost: ws.test.localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        .unwrap();
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") && s.read(&mut byte).unwrap_or(0) == 1 {
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_string();
        if !head.starts_with("HTTP/1.1 101") {
            assert!(Instant::now() < deadline, "no upgrade: {head}");
            std::thread::sleep(Duration::from_millis(200));
            continue;
        }
        // Bytes flow both ways after the upgrade.
        for msg in ["ping-1\n", "ping-2 with more bytes\n"] {
            s.write_all(msg.as_bytes()).unwrap();
            let mut echo = vec![0u8; msg.len()];
            s.read_exact(&mut echo).unwrap();
            assert_eq!(String::from_utf8_lossy(&echo), msg);
        }
        break;
    }
}

fn rm_drains_first_and_a_stop_grace_period_bounds_the_drain(position: Position) {
    let lab = Lab::new();
    let m = machine_in(&lab, "edge5", position);
    let port = m.daemon.http_port;
    let service = |name: &str, sleep: u32, grace: &str| {
        format!(
            r#"
  {name}:
    image: {TEST_IMAGE}
    command:
      - sh
      - -c
      - |
        mkdir -p /www/cgi-bin
        echo ok > /www/index.html
        printf '#!/bin/sh\necho started >> /www/slow-started\nsleep {sleep}\necho "Content-Type: text/plain"\necho\necho slow-done\n' > /www/cgi-bin/slow
        chmod +x /www/cgi-bin/slow
        exec httpd -f -p 8080 -h /www
{grace}    x-ports:
      - {name}.test.localhost:8080/http
"#
        )
    };
    let compose = format!(
        "services:{}{}",
        service("patient", 3, ""),
        service("bounded", 8, "    stop_grace_period: 1s\n")
    );
    std::fs::write(lab.path("compose.yaml"), compose).unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    for host in ["patient.test.localhost", "bounded.test.localhost"] {
        let deadline = Instant::now() + Duration::from_secs(10);
        while http_get(port, host, "/").0 != 200 {
            assert!(Instant::now() < deadline, "{host} never answered");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    // `rm` of a Service with a request in flight: the drain waits for it, then removes.
    let slow =
        std::thread::spawn(move || http_get(port, "patient.test.localhost", "/cgi-bin/slow"));
    wait_for_slow_request(port, "patient.test.localhost");
    let started = Instant::now();
    let out = run(&lab, &m, &["rm", "-y", "patient"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let (status, body) = slow.join().unwrap();
    assert!(
        status == 200 && body.contains("slow-done"),
        "the request in flight was cut: {status} {body:?}"
    );
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "rm did not wait: {:?}",
        started.elapsed()
    );
    // Once rm returns, the store no longer holds the removed container: its drain mark was
    // lifted only after that, so nothing can route to it again (a 502 until the observer's
    // next pass, otherwise).
    let ps = json(&run(&lab, &m, &["ps", "--replicated", "--json"]))["values"].clone();
    let left: Vec<&str> = ps
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["service_name"] == "patient")
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert!(left.is_empty(), "the store still holds {left:?} after rm");
    assert_eq!(http_get(port, "patient.test.localhost", "/").0, 404);

    // A stop_grace_period of 1 s bounds the drain of a request that would take 8 s: rm says
    // so and goes on instead of waiting the default 30 s.
    let slow =
        std::thread::spawn(move || http_get(port, "bounded.test.localhost", "/cgi-bin/slow"));
    wait_for_slow_request(port, "bounded.test.localhost");
    let started = Instant::now();
    let out = run(&lab, &m, &["rm", "-y", "bounded"]);
    let took = started.elapsed();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stderr(&out).contains("still had 1 requests in flight"),
        "{}",
        stderr(&out)
    );
    // Far below the 8 s the request takes: a guard telling a bounded drain from a full one,
    // not a timing target.
    assert!(
        took < Duration::from_secs(7),
        "the drain was not bounded by stop_grace_period: {took:?}"
    );
    let _ = slow.join();
}

crate::in_both_positions!(
    #[ignore = "needs dockerd (scripts/test.sh runs it)"]
    hostnames_route_to_every_serving_container_and_unknown_hosts_get_404,
    a_rolling_deploy_under_load_fails_no_request_and_a_long_request_completes,
    rm_drains_first_and_a_stop_grace_period_bounds_the_drain,
);
