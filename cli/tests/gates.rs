//! Service Gates end to end through a real daemon and dockerd, on the HTTP/1 fast path and
//! through Pingora's proxy alone: maintenance answers 503 with the page (and keeps the
//! Machine's health out of it), even with the Service's containers stopped; a pause holds new
//! requests while the Service is deployed underneath, and none fails; a pause ends on its own.

mod common;

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

const HOST: &str = "gated.test.localhost";

const WEB: &str = r#"
services:
  web:
    image: IMAGE
    command: ["sh", "-c", "mkdir -p /www && echo \"version $$VER\" > /www/index.html && exec httpd -f -p 8080 -h /www"]
    environment:
      VER: ${VER}
    healthcheck:
      test: ["CMD", "wget", "-q", "-O-", "http://127.0.0.1:8080/"]
      interval: 1s
      retries: 2
    deploy:
      update_config:
        order: start-first
    x-ports: [gated.test.localhost:8080/http]
"#;

/// One GET on its own connection, waiting up to a minute: (status, content type, body).
fn get(port: u16, path: &str) -> (u16, String, String) {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return (0, String::new(), "connect failed".into());
    };
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    if write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {HOST}\r\nConnection: close\r\n\r\n"
    )
    .is_err()
    {
        return (0, String::new(), "write failed".into());
    }
    let mut raw = Vec::new();
    if let Err(e) = s.read_to_end(&mut raw) {
        return (0, String::new(), format!("read: {e}"));
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type: ")
                .map(str::to_owned)
        })
        .unwrap_or_default();
    (status, content_type, body.to_owned())
}

fn ployz(lab: &Lab, m: &DockerMachine, version: &str, args: &[&str]) -> std::process::Output {
    let out = lab
        .cli()
        .current_dir(lab.dir.path())
        .env("PLOYZ_HEALTH_MONITOR_PERIOD", "1")
        .env("VER", version)
        .arg("--connect")
        .arg(m.daemon.connect_url())
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}{}",
        stdout(&out),
        stderr(&out)
    );
    out
}

/// One request of the load: when it was sent, when its answer ended, status and body.
type Answered = (Instant, Instant, u16, String);

fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "{what} never happened");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn gates(position: Position) {
    let lab = Lab::new();
    let name = match position {
        Position::FastPath => "gates1",
        Position::PingoraOnly => "gates2",
    };
    let m = DockerMachine::with(&lab, name, &[QUIET_DAEMON, position.args()].concat(), &[]);
    let port = m.daemon.http_port;
    std::fs::write(lab.path("compose.yaml"), WEB.replace("IMAGE", TEST_IMAGE)).unwrap();
    ployz(&lab, &m, "1", &["deploy", "-y"]);
    wait_for("version 1 served", || get(port, "/").2 == "version 1\n");

    // Maintenance: 503 with the page, the message escaped; the Machine stays healthy.
    let out = ployz(
        &lab,
        &m,
        "1",
        &[
            "service",
            "maintenance",
            "web",
            "--message",
            "Back at 5 <promise>",
        ],
    );
    assert!(
        stdout(&out).contains("web is in maintenance"),
        "{}",
        stdout(&out)
    );
    wait_for("the maintenance page", || get(port, "/").0 == 503);
    let (status, content_type, body) = get(port, "/index.html?x=1");
    assert_eq!(status, 503);
    assert_eq!(content_type, "text/html; charset=utf-8");
    assert!(body.contains("Back at 5 &lt;promise&gt;"), "{body}");
    assert_eq!(
        get(port, "/.ployz/health").0,
        200,
        "the Machine's health is not the Service's"
    );
    let routes = json(&ployz(&lab, &m, "1", &["routes", "--json"]));
    assert_eq!(routes["routes"][0]["gate"], "maintenance", "{routes:#}");
    // With its containers stopped, the page still answers.
    ployz(&lab, &m, "1", &["stop", "web"]);
    wait_for("no web container running", || {
        !m.docker_containers()
            .iter()
            .any(|(_, state)| state == "running")
    });
    let (status, _, body) = get(port, "/");
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("Back at 5"), "{body}");
    ployz(&lab, &m, "1", &["start", "web"]);
    let out = ployz(&lab, &m, "1", &["service", "live", "web"]);
    assert!(
        stdout(&out).contains("web is live again"),
        "{}",
        stdout(&out)
    );
    wait_for("version 1 served again", || {
        get(port, "/").2 == "version 1\n"
    });

    // Pause, deploy underneath, resume, under a steady load: no request fails, and the ones
    // that came during the pause waited for the resume.
    let stop = Arc::new(AtomicBool::new(false));
    let seen: Arc<Mutex<Vec<Answered>>> = Arc::default();
    let load: Vec<_> = (0..4)
        .map(|_| {
            let (stop, seen) = (stop.clone(), seen.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let start = Instant::now();
                    let (status, _, body) = get(port, "/");
                    seen.lock()
                        .unwrap()
                        .push((start, Instant::now(), status, body));
                }
            })
        })
        .collect();
    wait_for("load running", || seen.lock().unwrap().len() > 20);
    let pausing = Instant::now();
    ployz(&lab, &m, "1", &["service", "pause", "web", "--for", "2m"]);
    ployz(&lab, &m, "2", &["deploy", "-y"]);
    let resumed = Instant::now();
    let out = ployz(&lab, &m, "2", &["service", "resume", "web"]);
    assert!(stdout(&out).contains("web is resumed"), "{}", stdout(&out));
    wait_for("version 2 served", || get(port, "/").2 == "version 2\n");
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.join().unwrap();
    }
    let seen = seen.lock().unwrap();
    let failed: Vec<_> = seen.iter().filter(|(_, _, s, _)| *s != 200).collect();
    assert!(
        failed.is_empty(),
        "{} of {} failed: {:?}",
        failed.len(),
        seen.len(),
        &failed[..failed.len().min(5)]
    );
    // Held: sent once the pause was asked for (the edge may apply it before the command
    // returns), answered after the resume, having waited through the deploy. (A request sent
    // before the edge applied the pause goes through at once.)
    let held: Vec<&Answered> = seen
        .iter()
        .filter(|(start, end, _, _)| {
            *start > pausing
                && *end > resumed
                && end.duration_since(*start) > Duration::from_secs(1)
        })
        .collect();
    assert!(
        !held.is_empty(),
        "no request was held through the deploy: {} requests",
        seen.len()
    );
    // Those held went on to what serves after the deploy.
    assert!(
        held.iter().all(|(_, _, _, body)| body == "version 2\n"),
        "{held:?}"
    );

    // A pause ends on its own: a request waits for it, then goes on.
    ployz(&lab, &m, "2", &["service", "pause", "web", "--for", "3s"]);
    wait_for("the pause applied", || {
        json(&ployz(&lab, &m, "2", &["routes", "--json"]))["routes"][0]["gate"] == "paused"
    });
    let start = Instant::now();
    let (status, _, body) = get(port, "/");
    let waited = start.elapsed();
    assert_eq!((status, body.as_str()), (200, "version 2\n"));
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(15),
        "{waited:?}"
    );
    ployz(&lab, &m, "2", &["service", "resume", "web"]);
}

in_both_positions!(
    #[ignore = "needs dockerd (scripts/test.sh runs it)"]
    gates
);
