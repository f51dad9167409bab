//! Service Names as Compose writes them, through the real daemon: a Service named `my_app` keeps
//! its name in `ployz ps` and as a selector, runs in containers named after it, and answers at
//! its DNS name `my-app.internal` through the Machine's DNS, to `ployz dns lookup` and to a DNS
//! client inside a container.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// The running Service Containers of `service` with their addresses, from `ployz ps --json`.
fn containers_of(lab: &Lab, m: &DockerMachine, service: &str) -> Vec<(String, String)> {
    json(&run(lab, m, &["ps", "--json"]))["values"]
        .clone()
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["service_name"] == service && c["state"] == "running")
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["address"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn lookup_addresses(lab: &Lab, m: &DockerMachine, name: &str) -> Vec<String> {
    json(&run(lab, m, &["dns", "lookup", name, "--json"]))["addresses"]
        .as_array()
        .map(|a| a.iter().map(|x| x.as_str().unwrap().to_owned()).collect())
        .unwrap_or_default()
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn a_service_named_as_compose_allows_answers_at_its_dns_label() {
    let lab = Lab::new();
    let m = DockerMachine::with(
        &lab,
        "names1",
        &["--no-certificates", "--dns-listen", "gateway"],
        &[],
    );
    std::fs::write(
        lab.path("compose.yaml"),
        format!(
            r#"
services:
  my_app:
    image: {TEST_IMAGE}
    command: ["sh", "-c", "echo from-my-app > /index.html && exec httpd -f -p 8080 -h /"]
  client:
    image: {TEST_IMAGE}
    command: ["sleep", "3600"]
"#
        ),
    )
    .unwrap();

    // The preview names the Service as written and shows its DNS name.
    let out = run(&lab, &m, &["deploy", "--dry-run"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("+ create service my_app (DNS: my-app.internal)"),
        "{}",
        stdout(&out)
    );
    assert!(
        stdout(&out).contains("+ create service client\n"),
        "{}",
        stdout(&out)
    );

    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));

    // `ployz ps` shows the name as written; the container is named after it.
    let deadline = Instant::now() + Duration::from_secs(15);
    let (container, address) = loop {
        let found = containers_of(&lab, &m, "my_app");
        if let [(name, addr)] = found.as_slice() {
            if !addr.is_empty() {
                break (name.clone(), addr.clone());
            }
        }
        assert!(
            Instant::now() < deadline,
            "my_app never ran with an address: {found:?}\n{}",
            m.daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(container.starts_with("my_app-"), "{container}");

    // The Machine's DNS answers the DNS label, in any case, with the container's address.
    let deadline = Instant::now() + Duration::from_secs(15);
    let expected = std::slice::from_ref(&address);
    while lookup_addresses(&lab, &m, "my-app.internal") != expected {
        assert!(
            Instant::now() < deadline,
            "my-app.internal never answered {address}: {:?}\n{}",
            lookup_addresses(&lab, &m, "my-app.internal"),
            m.daemon.log_text()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(lookup_addresses(&lab, &m, "MY-APP.internal"), expected);
    assert_eq!(
        lookup_addresses(&lab, &m, &format!("{}.m.my-app.internal", m.id)),
        expected
    );

    // A real DNS client in a container, through the Machine Gateway: the full name and the bare
    // label (search domain `internal`) resolve to the container, and it serves under that name.
    for name in ["my-app.internal", "my-app"] {
        let out = run(&lab, &m, &["exec", "client", "nslookup", name]);
        assert!(
            out.status.success() && stdout(&out).contains(&address),
            "nslookup {name}: {}{}",
            stdout(&out),
            stderr(&out)
        );
    }
    let out = run(
        &lab,
        &m,
        &["exec", "client", "wget", "-q", "-O-", "http://my-app:8080/"],
    );
    assert_eq!(stdout(&out).trim(), "from-my-app", "{}", stderr(&out));

    // The name as written selects the Service; the container's host name is a DNS label.
    let out = run(&lab, &m, &["exec", "my_app", "hostname"]);
    let hostname = stdout(&out).trim().to_owned();
    assert!(
        out.status.success() && hostname.starts_with("my-app-"),
        "{hostname}{}",
        stderr(&out)
    );
    let out = run(&lab, &m, &["stop", "my_app"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let deadline = Instant::now() + Duration::from_secs(10);
    while !lookup_addresses(&lab, &m, "my-app.internal").is_empty() {
        assert!(Instant::now() < deadline, "a stopped my_app still answers");
        std::thread::sleep(Duration::from_millis(200));
    }
}
