//! A Compose app as people write it, deployed end to end on a real dockerd: short-syntax ports,
//! a file bound read-only from the project folder, a relative data folder, a file secret and an
//! anonymous volume.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::*;

/// Three Services: `web` serves the project's `conf/index.html` on a host port, `api` reads the
/// secret, `worker` writes into the project's `data/` folder and has an anonymous volume.
const APP: &str = r#"
services:
  web:
    image: IMAGE
    restart: unless-stopped
    command: ["httpd", "-f", "-p", "80", "-h", "/www"]
    ports:
      - "HOST_PORT:80"
    volumes:
      - ./conf/index.html:/www/index.html:ro
  api:
    image: IMAGE
    restart: unless-stopped
    command: ["sh", "-c", "while true; do sleep 1; done"]
    secrets:
      - api_key
  worker:
    image: IMAGE
    restart: unless-stopped
    command: ["sh", "-c", "echo from-worker > /data/worker.txt && while true; do sleep 1; done"]
    volumes:
      - ./data:/data
      - /cache
secrets:
  api_key:
    file: ./secret.txt
"#;

/// Anonymous volumes the test saw, removed when it ends (also on panic). Declared before the
/// Machine, so the Machine's containers are gone (dropped first) when these are removed.
struct SeenVolumes(Vec<String>);

impl Drop for SeenVolumes {
    fn drop(&mut self) {
        for v in &self.0 {
            docker(&["volume", "rm", "-f", v]);
        }
    }
}

/// Service name -> container ID, for the Machine's containers that run.
fn container_ids(m: &DockerMachine) -> BTreeMap<String, String> {
    let filter = format!("label=ployz.machine.id={}", m.id);
    let out = docker(&["ps", "--filter", &filter, "--format", "{{.ID}} {{.Names}}"]);
    assert!(out.status.success(), "docker ps: {}", stderr(&out));
    let mut ids = BTreeMap::new();
    for line in stdout(&out).lines() {
        let Some((id, name)) = line.split_once(' ') else {
            continue;
        };
        let service = name.rsplit_once('-').map(|(s, _)| s).unwrap_or(name);
        let previous = ids.insert(service.to_owned(), id.to_owned());
        assert!(
            previous.is_none(),
            "two running containers of {service}: {}",
            stdout(&out)
        );
    }
    ids
}

/// Waits (10 s at most) until `probe` returns `Some`.
fn wait_for<T>(what: &str, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = probe() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn a_compose_app_with_short_ports_relative_files_a_secret_and_an_anonymous_volume() {
    let mut seen = SeenVolumes(Vec::new());
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "composeapp");
    let port = free_port();
    std::fs::create_dir_all(lab.path("conf")).unwrap();
    std::fs::create_dir_all(lab.path("data")).unwrap();
    std::fs::write(lab.path("conf/index.html"), "hello from the config file\n").unwrap();
    std::fs::write(lab.path("secret.txt"), "first-secret").unwrap();
    std::fs::write(
        lab.path("compose.yaml"),
        APP.replace("IMAGE", TEST_IMAGE)
            .replace("HOST_PORT", &port.to_string()),
    )
    .unwrap();

    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let first = container_ids(&m);
    assert_eq!(
        first.keys().map(String::as_str).collect::<Vec<_>>(),
        ["api", "web", "worker"],
        "{first:?}"
    );

    // The short port publishes on the Machine and serves the file bound read-only.
    let body = wait_for("web to answer on its host port", || {
        let (status, body) = http_get(port, "localhost", "/");
        (status == 200).then_some(body)
    });
    assert_eq!(body, "hello from the config file\n");

    // The secret is readable where Compose puts it.
    let cat = docker(&["exec", &first["api"], "cat", "/run/secrets/api_key"]);
    assert!(cat.status.success(), "{}", stderr(&cat));
    assert_eq!(stdout(&cat), "first-secret");

    // The relative folder is bound: what the worker writes shows in the project folder.
    let written = wait_for("the worker's file in ./data", || {
        std::fs::read_to_string(lab.path("data/worker.txt")).ok()
    });
    assert_eq!(written, "from-worker\n");

    // The anonymous volume is a Docker volume at /cache, made with the container.
    let mounts = docker(&[
        "inspect",
        "-f",
        "{{range .Mounts}}{{.Type}} {{.Name}} {{.Destination}}\n{{end}}",
        &first["worker"],
    ]);
    assert!(mounts.status.success(), "{}", stderr(&mounts));
    let cache: Vec<String> = stdout(&mounts)
        .lines()
        .filter(|l| l.starts_with("volume ") && l.ends_with(" /cache"))
        .map(|l| l.split(' ').nth(1).unwrap_or_default().to_owned())
        .collect();
    seen.0.extend(cache.iter().cloned());
    assert_eq!(cache.len(), 1, "{}", stdout(&mounts));

    // Unchanged: nothing to do and no container touched.
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("Services are up to date."),
        "{}",
        stdout(&out)
    );
    assert_eq!(container_ids(&m), first);

    // A changed secret replaces exactly the Service that uses it.
    std::fs::write(lab.path("secret.txt"), "second-secret").unwrap();
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}\n{}", stdout(&out), stderr(&out));
    let second = container_ids(&m);
    assert_ne!(second["api"], first["api"], "api was not replaced");
    assert_eq!(second["web"], first["web"], "web was replaced");
    assert_eq!(second["worker"], first["worker"], "worker was replaced");
    let cat = docker(&["exec", &second["api"], "cat", "/run/secrets/api_key"]);
    assert!(cat.status.success(), "{}", stderr(&cat));
    assert_eq!(stdout(&cat), "second-secret");
    // The secret's value shows in no label of the new container.
    let labels = docker(&["inspect", "-f", "{{json .Config.Labels}}", &second["api"]]);
    assert!(
        !stdout(&labels).contains("second-secret"),
        "{}",
        stdout(&labels)
    );
}
