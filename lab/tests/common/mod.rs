//! What the Cluster tests share: forming a Cluster over SSH, reading what each Machine observes,
//! and waiting (bounded) for an observable condition.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::process::Output;
use std::time::{Duration, Instant};

use ployz_lab::{Lab, LabOptions, LAB_IMAGE};
use serde_json::Value;

pub fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The tail of every Machine's daemon log, for failure messages.
pub fn logs(lab: &Lab) -> String {
    (0..lab.len())
        .map(|i| {
            let log = lab.log(i);
            let tail: Vec<&str> = log.lines().rev().take(25).collect();
            format!(
                "--- Machine {i} daemon log (last lines) ---\n{}",
                tail.into_iter().rev().collect::<Vec<_>>().join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Runs `ployz ARGS` against Machine `i`, which must succeed.
pub fn ok(lab: &Lab, i: usize, args: &[&str]) -> Output {
    let out = lab.ployz(i, args);
    assert!(
        out.status.success(),
        "ployz {args:?} on Machine {i} failed:\n{}\n{}",
        text(&out),
        logs(lab)
    );
    out
}

/// Waits until `check` returns `Some`, polling every 200 ms, at most `within`.
pub fn wait_for<T>(
    lab: &Lab,
    what: &str,
    within: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() >= deadline {
            panic!("{what}: not within {} s\n{}", within.as_secs(), logs(lab));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// `machine ls --json` on Machine `i`, or `None` when it does not answer.
pub fn machines(lab: &Lab, i: usize) -> Option<Vec<Value>> {
    let out = lab.ployz(i, &["machine", "ls", "--json"]);
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    v["values"].as_array().cloned()
}

/// Per Machine ID, what a Machine observes of it: (phase, membership).
pub type Observed = BTreeMap<String, (String, String)>;

/// What Machine `i` observes of each Machine.
pub fn observed(lab: &Lab, i: usize) -> Option<Observed> {
    Some(
        machines(lab, i)?
            .into_iter()
            .map(|m| {
                (
                    m["id"].as_str().unwrap_or_default().to_owned(),
                    (
                        m["phase"].as_str().unwrap_or_default().to_owned(),
                        m["membership"].as_str().unwrap_or_default().to_owned(),
                    ),
                )
            })
            .collect(),
    )
}

/// The Machine ID of Machine `i` (what it says of itself).
pub fn own_id(lab: &Lab, i: usize) -> String {
    let v = lab.json(i, &["version", "--json"]);
    v["daemon"]["machine"]
        .as_str()
        .unwrap_or_else(|| panic!("Machine {i} names no Machine ID: {v}"))
        .to_owned()
}

/// The store digest of Machine `i`.
pub fn digest(lab: &Lab, i: usize) -> Option<Value> {
    let out = lab.ployz(i, &["store", "digest", "--json"]);
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(v["digest"].clone())
}

/// Scratch values on Machine `i`: name -> (value, origin).
pub fn scratch(lab: &Lab, i: usize) -> Option<BTreeMap<String, (String, String)>> {
    let out = lab.ployz(i, &["store", "ls", "--json"]);
    if !out.status.success() {
        return None;
    }
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    Some(
        v.as_array()?
            .iter()
            .map(|r| {
                (
                    r["name"].as_str().unwrap_or_default().to_owned(),
                    (
                        r["value"].as_str().unwrap_or_default().to_owned(),
                        r["origin"].as_str().unwrap_or_default().to_owned(),
                    ),
                )
            })
            .collect(),
    )
}

/// Whether every Machine in `which` has the same digest (and answers).
pub fn digests_equal(lab: &Lab, which: &[usize]) -> bool {
    let all: Vec<Option<Value>> = which.iter().map(|&i| digest(lab, i)).collect();
    all.iter().all(Option::is_some) && all.windows(2).all(|w| w[0] == w[1])
}

/// A lab of `n` Machines with sshd, Machine 0 initialised as `m0` and the others added through
/// it as `m1`, `m2`...; returns once every Machine observes every other `participating` and
/// `up`.
pub fn cluster(n: usize) -> Lab {
    cluster_with(LabOptions {
        sshd: true,
        ..LabOptions::machines(n)
    })
}

/// [`cluster`] with other lab options (sshd is always on: joining goes over SSH).
pub fn cluster_with(options: LabOptions) -> Lab {
    let n = options.machines;
    let lab = Lab::start(LabOptions {
        sshd: true,
        ..options
    });
    ok(&lab, 0, &["machine", "init", "--name", "m0"]);
    for i in 1..n {
        let name = format!("m{i}");
        ok(
            &lab,
            0,
            &["machine", "add", "--name", &name, &lab.ssh_url(i)],
        );
    }
    wait_until_whole(&lab, n, Duration::from_secs(30));
    lab
}

/// Waits until every Machine observes `n` Machines, all `participating` and `up`; a failure
/// says what each Machine observed last.
pub fn wait_until_whole(lab: &Lab, n: usize, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let seen: Vec<(usize, Option<Observed>)> = (0..lab.len())
            .filter(|&i| lab.daemon_pid(i).is_some())
            .map(|i| (i, observed(lab, i)))
            .collect();
        let whole = seen.iter().all(|(_, o)| {
            o.as_ref().is_some_and(|o| {
                o.len() == n
                    && o.values()
                        .all(|(phase, m)| phase == "participating" && m == "up")
            })
        });
        if whole {
            return;
        }
        if Instant::now() >= deadline {
            panic!(
                "every Machine observes every other participating and up: not within {} s; \
                 last observed (Machine ID: phase, membership): {seen:#?}\n{}",
                within.as_secs(),
                logs(lab)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

pub fn options(n: usize) -> LabOptions {
    LabOptions {
        sshd: true,
        ..LabOptions::machines(n)
    }
}

/// A Service answering `GET /` with the Machine it runs on, `POST /cgi-bin/echo` with the body
/// it was sent, and `GET /cgi-bin/slow` with `slow-on-<Machine ID>` after 20 s (having added a
/// line to `/www/slow-started` when it began, for a test to wait on). `VERSION` changes its
/// spec.
pub fn web_compose(version: u32) -> String {
    let setup = [
        "mkdir -p /www/cgi-bin",
        "echo web-on-$$PLOYZ_MACHINE_ID > /www/index.html",
        "printf '#!/bin/sh\\nprintf \"Content-Type: text/plain\\\\r\\\\n\\\\r\\\\n\"\\nhead -c $$CONTENT_LENGTH\\n' > /www/cgi-bin/echo",
        "printf '#!/bin/sh\\necho started >> /www/slow-started\\nsleep 20\\nprintf \"Content-Type: text/plain\\\\r\\\\n\\\\r\\\\nslow-on-%%s\\\\n\" $$PLOYZ_MACHINE_ID\\n' > /www/cgi-bin/slow",
        "chmod +x /www/cgi-bin/echo /www/cgi-bin/slow",
        "exec httpd -f -p 8080 -h /www",
    ]
    .join(" && ");
    format!(
        r#"
services:
  web:
    image: {LAB_IMAGE}
    command: ["sh", "-c", "{setup}"]
    environment:
      VERSION: "{version}"
    deploy:
      replicas: 3
    x-ports:
      - web.example.test:8080/http
"#,
        setup = setup.replace('"', "\\\"")
    )
}

/// How many long requests (`GET /cgi-bin/slow` of [`web_compose`]) have begun in the running
/// containers of Service `service` on Machines `machines`, as their `/www/slow-started` says.
pub fn slow_requests_started(lab: &Lab, machines: std::ops::Range<usize>, service: &str) -> usize {
    let mut started = 0;
    for i in machines {
        let ps = lab.docker(
            i,
            &[
                "ps",
                "-q",
                "--filter",
                &format!("label=ployz.service.name={service}"),
            ],
        );
        for id in String::from_utf8_lossy(&ps.stdout).split_whitespace() {
            let out = lab.docker(i, &["exec", id, "cat", "/www/slow-started"]);
            started += String::from_utf8_lossy(&out.stdout).lines().count();
        }
    }
    started
}
