//! Certificates by ACME through the real daemon: Pebble (Let's Encrypt's test CA) on loopback
//! validates HTTP-01 against the daemon's edge, the issuer orders for the Ingress Hostnames a
//! Deploy publishes with `https`, and curl gets the Service over HTTPS trusting Pebble's root.
//! Nothing leaves 127.0.0.1: Pebble's mock DNS answers 127.0.0.1 for every name and is also the
//! daemon's verdict resolver.

mod common;

#[path = "../../acme/tests/support/pebble.rs"]
mod pebble;

use std::time::{Duration, Instant};

use common::*;
use pebble::Pebble;

/// `ployz cert ls --json` of `m`.
fn listing(lab: &Lab, m: &DockerMachine) -> serde_json::Value {
    json(&run(lab, m, &["cert", "ls", "--json"]))
}

/// The Certificate Material summary for `host`, if the store has one.
fn material(listing: &serde_json::Value, host: &str) -> Option<serde_json::Value> {
    listing["material"]
        .as_array()?
        .iter()
        .find(|m| m["hostname"] == host)
        .cloned()
}

fn status(listing: &serde_json::Value, host: &str) -> Option<serde_json::Value> {
    listing["status"]
        .as_array()?
        .iter()
        .find(|s| s["hostname"] == host)
        .cloned()
}

#[test]
#[ignore = "needs dockerd and pebble (scripts/test.sh runs it)"]
fn https_hostnames_get_certificates_from_an_acme_server_and_renewal_drops_no_request() {
    let lab = Lab::new();
    // The daemon's ports are chosen first: Pebble validates HTTP-01 on the edge's HTTP port.
    let resolver_port = pebble::free_port();
    let m = DockerMachine::with(
        &lab,
        "acme1",
        &[
            "--dns-listen",
            "off",
            "--verdict-resolver",
            &format!("127.0.0.1:{resolver_port}"),
        ],
        &["--public-ip", "127.0.0.1"],
    );
    let mut ca = Pebble::start_with_dns(m.daemon.http_port, false, resolver_port);
    std::fs::write(lab.path("listener-ca.pem"), &ca.ca_pem).unwrap();

    // Bad policies are refused before anything is stored, each saying what to do.
    for (args, expected) in [
        (vec!["--challenge", "dns-01"], "http-01"),
        (vec!["--renew-fraction", "1.5"], "renew"),
        (vec!["--directory", "not a url"], "directory"),
        (vec!["--eab-kid", "k", "--eab-hmac", "%%%"], "base64"),
        (vec!["--backoff-min", "5x"], "--backoff-min"),
    ] {
        let mut a = vec!["cert", "policy", "set"];
        a.extend(args.iter().copied());
        let out = run(&lab, &m, &a);
        assert!(!out.status.success(), "{a:?} was accepted");
        assert!(
            stderr(&out)
                .to_lowercase()
                .contains(&expected.to_lowercase()),
            "{a:?}: {}",
            stderr(&out)
        );
    }
    let shown = json(&run(&lab, &m, &["cert", "policy", "show", "--json"]));
    assert_eq!(
        shown,
        serde_json::json!({}),
        "a refused policy changed something"
    );

    let directory = ca.directory_url();
    let out = run(
        &lab,
        &m,
        &[
            "cert",
            "policy",
            "set",
            "--directory",
            &directory,
            "--ca-file",
            "listener-ca.pem",
            "--backoff-min",
            "1s",
            "--backoff-max",
            "4s",
            "--probe-timeout",
            "1s",
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(stdout(&out).contains(&directory), "{}", stdout(&out));

    // One hostname that resolves elsewhere: it is not ordered, and `cert ls` says why.
    let add = std::process::Command::new("curl")
        .args(["-sS", "-X", "POST", "--data"])
        .arg(r#"{"host":"elsewhere.test.","addresses":["192.0.2.7"]}"#)
        .arg(format!("http://127.0.0.1:{}/add-a", ca.chall_mgmt_port))
        .output()
        .unwrap();
    assert!(add.status.success(), "{}", stderr(&add));

    std::fs::write(
        lab.path("compose.yaml"),
        format!(
            r#"
services:
  web:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "echo secure $$HOSTNAME > /index.html && exec httpd -f -p 8080 -h /"]
    x-ports:
      - app.test:8080/https
      - second.test:8080/https
      - elsewhere.test:8080/https
"#
        ),
    )
    .unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));

    let deadline = Instant::now() + Duration::from_secs(90);
    let mut last = serde_json::Value::Null;
    while Instant::now() < deadline {
        last = listing(&lab, &m);
        if material(&last, "app.test").is_some() && material(&last, "second.test").is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let first = material(&last, "app.test").unwrap_or_else(|| {
        panic!(
            "no certificate within 90 s: {last:#}\n{}",
            m.daemon.log_text()
        )
    });
    assert!(material(&last, "second.test").is_some(), "{last:#}");
    assert_eq!(material(&last, "elsewhere.test"), None, "{last:#}");
    let why = status(&last, "elsewhere.test").expect("a status for the held-back hostname");
    assert_eq!(why["state"], "not_pointing_here", "{why:#}");
    // The listing names what is overdue; an issuer at work is late for nothing.
    assert_eq!(last["overdue"], serde_json::json!([]), "{last:#}");
    let out = run(&lab, &m, &["cert", "ls"]);
    assert!(
        stdout(&out).contains("elsewhere.test") && stdout(&out).contains("192.0.2.7"),
        "{}",
        stdout(&out)
    );
    // The issuer by its Machine Name.
    let machines = json(&run(&lab, &m, &["machine", "ls", "--json"]));
    let name = machines["values"][0]["name"].as_str().unwrap().to_owned();
    let issuer_id = why["issuer"].as_str().unwrap().to_owned();
    assert!(
        stdout(&out).contains(&format!(" {name} ")) && !stdout(&out).contains(&issuer_id),
        "{name} ({issuer_id}) in {}",
        stdout(&out)
    );

    // A client trusting Pebble's root gets the Service by SNI, each hostname its own leaf.
    std::fs::write(lab.path("ca.pem"), ca.issuing_root()).unwrap();
    for host in ["app.test", "second.test"] {
        let (ok, body, verbose) = curl_https(lab.dir.path(), m.daemon.https_port, host, &[]);
        assert!(ok && body.starts_with("secure "), "{host}: {body}{verbose}");
        assert!(
            verbose.contains(&format!("subjectAltName: host \"{host}\" matched")),
            "{verbose}"
        );
    }

    // Renewal: a policy that renews almost at once (Pebble's certificates last 5 years, so a
    // fraction of 1e-8 is about 1.6 s); the new material replaces the old while a client keeps
    // requesting, and no request fails.
    let out = run(
        &lab,
        &m,
        &["cert", "policy", "set", "--renew-fraction", "0.00000001"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut requests = 0;
    let renewed = loop {
        let (ok, body, verbose) = curl_https(lab.dir.path(), m.daemon.https_port, "app.test", &[]);
        assert!(
            ok && body.starts_with("secure "),
            "during renewal: {body}{verbose}"
        );
        requests += 1;
        let now = material(&listing(&lab, &m), "app.test").unwrap();
        if now["not_after"] != first["not_after"] {
            break now;
        }
        assert!(
            Instant::now() < deadline,
            "no renewal within 60 s\n{}",
            m.daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(requests > 0);
    // Back to the default fraction, so the issuer rests.
    let out = run(
        &lab,
        &m,
        &["cert", "policy", "set", "--renew-fraction", "0.66"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    for _ in 0..5 {
        let (ok, body, verbose) = curl_https(lab.dir.path(), m.daemon.https_port, "app.test", &[]);
        assert!(
            ok && body.starts_with("secure "),
            "after renewal: {body}{verbose}"
        );
    }
    assert!(renewed["not_after"].as_i64() > first["not_after"].as_i64());
    // The edge's metrics follow: the renewed certificate's expiry, once the edge serves it.
    let line = format!(
        "ployz_edge_certificate_expiry_timestamp_seconds{{hostname=\"app.test\"}} {}\n",
        renewed["not_after"]
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (status, metrics) = http_get(m.daemon.metrics_port, "x", "/metrics");
        assert_eq!(status, 200);
        if metrics.contains(&line) {
            break;
        }
        assert!(Instant::now() < deadline, "no {line} in {metrics}");
        std::thread::sleep(Duration::from_millis(50));
    }
    ca.stop();
}
