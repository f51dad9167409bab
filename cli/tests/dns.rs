//! The internal DNS through the real daemon: containers deployed by `ployz deploy` find each
//! other by Service Name through the Machine Gateway, other names are forwarded to an upstream
//! the test runs on loopback, and `ployz dns lookup` says what the Machine would answer.

mod common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::*;

/// A one-name upstream resolver on 127.0.0.1: `forwarded.test` A 192.0.2.10, everything else
/// NXDOMAIN. Answers until the process ends.
fn upstream_resolver() -> u16 {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = socket.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut buf = [0u8; 512];
        while let Ok((n, from)) = socket.recv_from(&mut buf) {
            if n < 12 {
                continue;
            }
            // The question: labels from byte 12 to the root label, then type and class.
            let mut i = 12;
            let mut labels = Vec::new();
            while i < n && buf[i] != 0 {
                let len = buf[i] as usize;
                labels.push(String::from_utf8_lossy(&buf[i + 1..i + 1 + len]).to_lowercase());
                i += 1 + len;
            }
            let question_end = i + 5;
            let known = labels.join(".") == "forwarded.test";
            let mut reply = buf[..question_end].to_vec();
            reply[2] = 0x81; // QR, RD
            reply[3] = if known { 0x80 } else { 0x83 }; // RA; NOERROR or NXDOMAIN
            reply[6..12].copy_from_slice(&[0, u8::from(known), 0, 0, 0, 0]);
            if known {
                // Name pointer to the question, A, IN, TTL 60, 4 bytes.
                reply.extend_from_slice(&[0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 192, 0, 2, 10]);
            }
            let _ = socket.send_to(&reply, from);
        }
    });
    port
}

fn lookup(lab: &Lab, m: &DockerMachine, name: &str) -> serde_json::Value {
    json(&run(lab, m, &["dns", "lookup", name, "--json"]))
}

fn addresses(answer: &serde_json::Value) -> Vec<String> {
    answer["addresses"]
        .as_array()
        .map(|a| a.iter().map(|x| x.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn containers_find_each_other_by_name_and_other_names_are_forwarded() {
    let lab = Lab::new();
    let upstream = upstream_resolver();
    let m = DockerMachine::with(
        &lab,
        "dns1",
        &[
            "--no-certificates",
            "--dns-listen",
            "gateway",
            "--dns-upstream",
            &format!("127.0.0.1:{upstream}"),
        ],
        &[],
    );
    std::fs::write(
        lab.path("compose.yaml"),
        format!(
            r#"
services:
  api:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "echo api-says-hi > /index.html && exec httpd -f -p 8080 -h /"]
    deploy:
      replicas: 2
    healthcheck:
      test: ["CMD", "wget", "-q", "-O-", "http://127.0.0.1:8080/"]
      interval: 1s
      retries: 2
  client:
    image: {TEST_IMAGE}
    command: ["sleep", "3600"]
"#
        ),
    )
    .unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));

    // The Machine's own view: both api containers, in this Machine's subnet.
    let deadline = Instant::now() + Duration::from_secs(15);
    let answer = loop {
        let a = lookup(&lab, &m, "api.internal");
        if addresses(&a).len() == 2 {
            break a;
        }
        assert!(
            Instant::now() < deadline,
            "api.internal never had 2 addresses: {a:#}\n{}",
            m.daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(answer["kind"], "internal");
    assert_eq!(answer["local_addresses"], 2);
    let api_addresses = addresses(&answer);
    let nearest = lookup(&lab, &m, "nearest.api.internal");
    assert_eq!(addresses(&nearest).len(), 2, "{nearest:#}");
    let machine_scoped = lookup(&lab, &m, &format!("{}.m.api.internal", m.id));
    assert_eq!(addresses(&machine_scoped).len(), 2, "{machine_scoped:#}");
    let by_name = lookup(&lab, &m, "dns1.m.api.internal");
    assert_eq!(addresses(&by_name).len(), 2, "{by_name:#}");
    let missing = lookup(&lab, &m, "nothing.internal");
    assert_eq!(missing["kind"], "unknown", "{missing:#}");
    let out = run(&lab, &m, &["dns", "lookup", "api.internal"]);
    assert!(stdout(&out).contains(&api_addresses[0]), "{}", stdout(&out));

    // From inside a container: the bare Service Name (search domain `internal`) resolves and
    // serves, and a name outside .internal comes from the upstream.
    let out = run(&lab, &m, &["exec", "client", "nslookup", "api"]);
    let text = stdout(&out);
    assert!(
        out.status.success() && api_addresses.iter().all(|a| text.contains(a.as_str())),
        "{text}{}",
        stderr(&out)
    );
    let out = run(
        &lab,
        &m,
        &["exec", "client", "wget", "-q", "-O-", "http://api:8080/"],
    );
    assert_eq!(stdout(&out).trim(), "api-says-hi", "{}", stderr(&out));
    let out = run(&lab, &m, &["exec", "client", "nslookup", "forwarded.test"]);
    assert!(
        stdout(&out).contains("192.0.2.10"),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
    let out = run(
        &lab,
        &m,
        &["exec", "client", "nslookup", "nothing.internal"],
    );
    assert!(
        !out.status.success() || !stdout(&out).contains("Address: 10."),
        "{}",
        stdout(&out)
    );

    // A real DNS client on the host, where dig is installed: authoritative, TTL 0.
    if std::process::Command::new("dig").arg("-v").output().is_ok() {
        let out = std::process::Command::new("dig")
            .args(["@10.210.0.1", "+norecurse", "api.internal", "A"])
            .output()
            .unwrap();
        let text = stdout(&out);
        assert!(text.contains("flags: qr aa"), "{text}");
        assert!(
            text.contains("api.internal.\t\t0\tIN\tA\t")
                || text.contains("api.internal.\t0\tIN\tA\t"),
            "{text}"
        );
    }

    // Stopped containers leave the answers.
    let out = run(&lab, &m, &["stop", "api"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let a = lookup(&lab, &m, "api.internal");
        if a["kind"] == "unknown" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "stopped containers still answer: {a:#}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let out = run(&lab, &m, &["exec", "client", "nslookup", "api"]);
    assert!(
        api_addresses
            .iter()
            .all(|a| !stdout(&out).contains(a.as_str())),
        "{}",
        stdout(&out)
    );

    // Metrics count what was asked.
    let metrics = http_get(m.daemon.metrics_port, "localhost", "/metrics").1;
    assert!(
        metrics.contains("ployz_dns_queries_total{source=\"internal\"}"),
        "{metrics}"
    );
}
