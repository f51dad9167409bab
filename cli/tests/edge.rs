//! The edge end to end: real daemon, real containers, requests through the Pingora listener.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::*;

fn run(lab: &Lab, m: &DockerMachine, args: &[&str]) -> std::process::Output {
    lab.cli()
        .current_dir(lab.dir.path())
        .env("PLOYZ_HEALTH_MONITOR_PERIOD", "1")
        .arg("--connect")
        .arg(m.daemon.connect_url())
        .args(args)
        .output()
        .unwrap()
}

/// Bodies answered for `host` over `n` requests.
fn bodies(port: u16, host: &str, n: usize) -> BTreeSet<String> {
    (0..n)
        .map(|_| http_get(port, host, "/").1.trim().to_owned())
        .collect()
}

#[test]
fn hostnames_route_to_every_serving_container_and_unknown_hosts_get_404() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "edge1");
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
    let names: BTreeSet<String> = json(&run(&lab, &m, &["ps", "--json"]))
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
