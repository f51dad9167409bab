//! The Machine lease end to end: one command at a time changes a Machine, every call carries the
//! lease's fencing token, a stale holder's late call is refused, and a holder that died is taken
//! over once its lease lapses.

mod common;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

fn write(lab: &Lab, file: &str, text: &str) {
    std::fs::write(lab.path(file), text.replace("IMAGE", TEST_IMAGE)).unwrap();
}

/// `ployz <args>` against `m` from the lab directory, with a 1 s monitor window.
fn cli(lab: &Lab, m: &DockerMachine, args: &[&str]) -> Command {
    let mut cmd = lab.cli();
    cmd.current_dir(lab.dir.path())
        .env("PLOYZ_HEALTH_MONITOR_PERIOD", "1")
        .arg("--connect")
        .arg(m.daemon.connect_url())
        .args(args);
    cmd
}

/// Starts `ployz <args>` in the background; its output goes to the lab's `<name>.out`/`.err`.
fn spawn(lab: &Lab, m: &DockerMachine, name: &str, args: &[&str]) -> Reaped {
    Reaped(
        cli(lab, m, args)
            .stdout(std::fs::File::create(lab.path(&format!("{name}.out"))).unwrap())
            .stderr(std::fs::File::create(lab.path(&format!("{name}.err"))).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// Waits (bounded) for a background command: (success, stdout, stderr).
fn finish(lab: &Lab, name: &str, mut child: Reaped) -> (bool, String, String) {
    let deadline = Instant::now() + Duration::from_secs(180);
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "{name} did not finish");
        std::thread::sleep(Duration::from_millis(50));
    };
    let read = |ext: &str| std::fs::read_to_string(lab.path(&format!("{name}.{ext}"))).unwrap();
    (status.success(), read("out"), read("err"))
}

/// One HTTP/1.1 call on the daemon's socket, with a lease token when given: (status, JSON).
fn api(socket: &Path, method: &str, path: &str, token: Option<u64>, body: &Value) -> (u16, Value) {
    let body = if body.is_null() {
        String::new()
    } else {
        body.to_string()
    };
    let token = token.map_or(String::new(), |t| format!("x-ployz-lease: {t}\r\n"));
    let (status, _, answer) = api_request(socket, method, path, &token, body.as_bytes());
    (status, serde_json::from_str(&answer).unwrap_or(Value::Null))
}

/// Asks for the lease through the API as `holder`.
fn take(m: &DockerMachine, holder: &str, command: &str) -> Value {
    let (status, answer) = api(
        &m.daemon.socket,
        "POST",
        "/v1/lease",
        None,
        &json!({ "holder": holder, "command": command }),
    );
    assert_eq!(status, 200, "{answer}");
    answer
}

fn granted_token(answer: &Value) -> u64 {
    assert_eq!(answer["lease"], "granted", "{answer:#}");
    answer["holder"]["token"].as_u64().unwrap()
}

/// Service IDs and container names of the Machine's running Service Containers.
fn services(lab: &Lab, m: &DockerMachine) -> (BTreeSet<String>, Vec<String>) {
    let ps = json(&cli(lab, m, &["ps", "--json"]).output().unwrap())["values"].clone();
    let running: Vec<&Value> = ps
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["kind"] == "service" && c["state"] == "running")
        .collect();
    (
        running
            .iter()
            .map(|c| c["service_id"].as_str().unwrap().to_owned())
            .collect(),
        running
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect(),
    )
}

const DUP: &str = "services:\n  dup:\n    image: IMAGE\n    command: [\"sleep\", \"3600\"]\n    deploy:\n      replicas: 2\n      update_config:\n        monitor: 3s\n";

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn two_first_deploys_at_once_make_one_service_and_the_second_waits_then_is_refused() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "lease1");
    write(&lab, "compose.yaml", DUP);

    let a = spawn(&lab, &m, "a", &["deploy", "-y"]);
    let b = spawn(&lab, &m, "b", &["deploy", "-y"]);
    let (a_ok, a_out, a_err) = finish(&lab, "a", a);
    let (b_ok, b_out, b_err) = finish(&lab, "b", b);
    assert!(a_ok && b_ok, "a: {a_out}{a_err}\nb: {b_out}{b_err}");
    let (ids, names) = services(&lab, &m);
    assert_eq!(ids.len(), 1, "two Services were made: {ids:?}");
    assert_eq!(names.len(), 2, "{names:?}");
    // One deployed; the other waited for it (saying so, naming it), then planned from what the
    // first left: nothing to do.
    let (first, second) = if a_err.contains("waiting for this Machine's lease") {
        ((b_out, b_err), (a_out, a_err))
    } else {
        ((a_out, a_err), (b_out, b_err))
    };
    assert!(
        !first.1.contains("waiting for this Machine's lease"),
        "both waited: {}",
        first.1
    );
    assert!(first.0.contains("Deploy completed"), "{}", first.0);
    assert!(
        second
            .1
            .contains("waiting for this Machine's lease: its lease is held by"),
        "{}",
        second.1
    );
    assert!(second.1.contains("running `deploy of dup`"), "{}", second.1);
    assert!(
        second.0.contains("Services are up to date."),
        "{}",
        second.0
    );

    // While a Deploy holds the lease, a second one that will not wait long is refused, naming
    // the holder: who, since when, which command. Nothing changes meanwhile.
    let holder = spawn(&lab, &m, "recreate", &["deploy", "-y", "--recreate"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        let (_, status) = api(&m.daemon.socket, "GET", "/v1/lease", None, &Value::Null);
        if !status.is_null() {
            break status;
        }
        assert!(Instant::now() < deadline, "the lease was never taken");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status["command"], "deploy of dup", "{status:#}");
    let holder_pid = format!("(pid {})", holder.0.id());
    let started = Instant::now();
    let out = cli(&lab, &m, &["deploy", "-y", "--lease-wait", "1"])
        .output()
        .unwrap();
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(!out.status.success(), "{}", stdout(&out));
    let err = stderr(&out);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines[0].starts_with("waiting for this Machine's lease: its lease is held by"),
        "{err}"
    );
    for needle in [
        "error: this Machine is busy: its lease is held by",
        &holder_pid,
        "running `deploy of dup`",
        " UTC (",
        "nothing was changed",
        "--lease-wait",
    ] {
        assert!(lines[1].contains(needle), "{needle:?} not in {err}");
    }
    // `ployz rm` takes the lease too, and calls without one are refused while it is held.
    let out = cli(&lab, &m, &["rm", "-y", "dup", "--lease-wait", "0"])
        .output()
        .unwrap();
    assert_one_line_error(&out, &["this Machine is busy", &holder_pid]);
    let (status, answer) = api(
        &m.daemon.socket,
        "POST",
        "/v1/volumes",
        None,
        &json!({ "name": "unleased" }),
    );
    assert_eq!(status, 409, "{answer}");
    assert!(
        answer["message"]
            .as_str()
            .unwrap()
            .contains("this Machine is busy: its lease is held by"),
        "{answer}"
    );
    let (ok, out, err) = finish(&lab, "recreate", holder);
    assert!(ok, "{out}{err}");
    let (ids_after, names_after) = services(&lab, &m);
    assert_eq!(ids_after, ids);
    assert_eq!(names_after.len(), 2, "{names_after:?}");
    let volumes =
        json(&cli(&lab, &m, &["volume", "ls", "--json"]).output().unwrap())["values"].clone();
    assert!(
        !volumes.to_string().contains("unleased"),
        "a refused call was applied: {volumes}"
    );
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn two_services_claiming_one_hostname_deployed_at_once_one_is_refused() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "lease2");
    let service = |name: &str| {
        format!(
            "services:\n  {name}:\n    image: IMAGE\n    command: [\"sleep\", \"3600\"]\n    deploy:\n      update_config:\n        monitor: 3s\n    x-ports:\n      - shared.test.localhost:8080/http\n"
        )
    };
    write(&lab, "a.yaml", &service("alpha"));
    write(&lab, "b.yaml", &service("beta"));
    let a = spawn(&lab, &m, "a", &["deploy", "-y", "-f", "a.yaml"]);
    let b = spawn(&lab, &m, "b", &["deploy", "-y", "-f", "b.yaml"]);
    let (a_ok, a_out, a_err) = finish(&lab, "a", a);
    let (b_ok, b_out, b_err) = finish(&lab, "b", b);
    assert!(
        a_ok != b_ok,
        "exactly one must succeed:\na: {a_out}{a_err}\nb: {b_out}{b_err}"
    );
    let (winner, loser_err) = if a_ok {
        ("alpha", b_err)
    } else {
        ("beta", a_err)
    };
    assert!(
        loser_err
            .contains("Ingress Hostname 'shared.test.localhost', already published by Service"),
        "{loser_err}"
    );
    assert!(loser_err.contains(&format!("'{winner}'")), "{loser_err}");
    let ps = json(&cli(&lab, &m, &["ps", "--json"]).output().unwrap())["values"].clone();
    let owners: BTreeSet<&str> = ps
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["service_name"].as_str().unwrap())
        .collect();
    assert_eq!(owners, BTreeSet::from([winner]));
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn a_stale_token_is_refused_and_a_dead_holder_is_taken_over_after_its_lease_lapses() {
    let lab = Lab::new();
    let mut m = DockerMachine::new(&lab, "lease3");
    write(
        &lab,
        "compose.yaml",
        "services:\n  dup:\n    image: IMAGE\n    command: [\"sleep\", \"3600\"]\n",
    );

    // A holder takes the lease through the API and begins a Deploy: it runs one container of
    // `dup` (the operation a dry run plans), then dies without releasing the lease.
    let preview = json(
        &cli(&lab, &m, &["deploy", "--dry-run", "--json"])
            .output()
            .unwrap(),
    );
    let op = preview["preview"]["plan"]["services"][0]["operations"][0].clone();
    assert_eq!(op["op"], "run_container", "{preview:#}");
    let t1 = granted_token(&take(&m, "mallory@elsewhere (pid 1)", "deploy of dup"));
    // A second holder is told who holds it.
    let answer = take(&m, "eve@elsewhere (pid 2)", "deploy of dup");
    assert_eq!(answer["lease"], "held", "{answer:#}");
    assert_eq!(answer["holder"]["holder"], "mallory@elsewhere (pid 1)");
    // Calls without the token are refused while it is held; with it, they run.
    let run = json!({ "service_id": op["service_id"], "spec": op["spec"] });
    let (status, answer) = api(&m.daemon.socket, "POST", "/v1/containers", None, &run);
    assert_eq!(status, 409, "{answer}");
    let (status, created) = api(&m.daemon.socket, "POST", "/v1/containers", Some(t1), &run);
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_owned();
    let name = created["name"].as_str().unwrap().to_owned();
    // Its last call drains the container, as a Deploy does before stopping one: the mark names
    // the holder and its token.
    let drain = format!("/v1/containers/{id}/drain");
    let (status, drained) = api(&m.daemon.socket, "POST", &drain, Some(t1), &Value::Null);
    assert_eq!(status, 200, "{drained}");
    let ps = json(&cli(&lab, &m, &["ps", "--json"]).output().unwrap())["values"].clone();
    let mark = &ps[0]["draining"];
    assert_eq!(mark["lease_token"], t1, "{ps:#}");
    assert_eq!(
        mark["set_by"], "mallory@elsewhere (pid 1), running `deploy of dup`",
        "{ps:#}"
    );

    // While it lives, a Deploy that will not wait is refused, naming it.
    let out = cli(&lab, &m, &["deploy", "-y", "--lease-wait", "0"])
        .output()
        .unwrap();
    assert_one_line_error(
        &out,
        &["mallory@elsewhere (pid 1), running `deploy of dup`"],
    );

    // Once its lease lapses (10 s after its last call), a Deploy takes over, and plans from
    // what the Machine shows then: the dead holder's container is the Service's, up to date.
    let started = Instant::now();
    let out = cli(&lab, &m, &["deploy", "-y"]).output().unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stderr(&out).contains("took over this Machine's lease from mallory@elsewhere (pid 1)"),
        "{}",
        stderr(&out)
    );
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        stdout(&out).contains("Services are up to date."),
        "{}",
        stdout(&out)
    );
    let (ids, names) = services(&lab, &m);
    assert_eq!(names, std::slice::from_ref(&name));
    // The mark its dead setter left was lifted before the plan was made.
    assert!(
        m.daemon.log_text().contains(
            "reason=\"the command that set it no longer holds this Machine's lease and the container still runs\""
        ),
        "{}",
        m.daemon.log_text()
    );
    assert_eq!(
        ids,
        BTreeSet::from([op["service_id"].as_str().unwrap().to_owned()])
    );

    // The stale holder's late operations are refused and not applied.
    for (method, path) in [
        ("POST", format!("/v1/containers/{id}/stop")),
        ("POST", format!("/v1/containers/{id}/drain")),
        ("DELETE", format!("/v1/containers/{id}")),
    ] {
        let (status, answer) = api(&m.daemon.socket, method, &path, Some(t1), &Value::Null);
        assert_eq!(status, 409, "{method} {path}: {answer}");
        assert!(
            answer["message"]
                .as_str()
                .unwrap()
                .contains(&format!("lease token {t1} is not this Machine's lease")),
            "{answer}"
        );
    }
    let (_, names) = services(&lab, &m);
    assert_eq!(names, [name]);
    let ps = json(&cli(&lab, &m, &["ps", "--json"]).output().unwrap())["values"].clone();
    assert!(
        ps.as_array()
            .unwrap()
            .iter()
            .all(|c| c["draining"].is_null()),
        "{ps:#}"
    );

    // Tokens only grow, across a daemon restart too; a token from before the restart is stale.
    let t2 = granted_token(&take(&m, "test (pid 3)", "deploy of dup"));
    assert!(t2 > t1 + 1, "{t2} after {t1} and the takeover's");
    let (status, _) = api(
        &m.daemon.socket,
        "DELETE",
        "/v1/lease",
        Some(t2),
        &Value::Null,
    );
    assert_eq!(status, 200);
    let t3 = granted_token(&take(&m, "test (pid 3)", "deploy of dup"));
    assert!(t3 > t2);
    m.daemon.restart();
    let t4 = granted_token(&take(&m, "test (pid 4)", "deploy of dup"));
    assert!(
        t4 > t3,
        "a restarted daemon reissued token {t4} (had issued {t3})"
    );
    let (status, answer) = api(
        &m.daemon.socket,
        "POST",
        &format!("/v1/containers/{id}/stop"),
        Some(t3),
        &Value::Null,
    );
    assert_eq!(status, 409, "{answer}");
    let (status, _) = api(
        &m.daemon.socket,
        "DELETE",
        "/v1/lease",
        Some(t4),
        &Value::Null,
    );
    assert_eq!(status, 200);
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn a_drain_called_without_a_lease_stands_only_for_the_stop_that_should_follow() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "unleased");
    write(
        &lab,
        "compose.yaml",
        "services:\n  lone:\n    image: IMAGE\n    command: [\"sleep\", \"3600\"]\n    stop_grace_period: 2s\n",
    );
    let deployed = cli(&lab, &m, &["deploy", "-y"]).output().unwrap();
    assert!(deployed.status.success(), "{}", stderr(&deployed));
    let ps = json(&cli(&lab, &m, &["ps", "--json"]).output().unwrap())["values"].clone();
    let id = ps.as_array().unwrap()[0]["id"].as_str().unwrap().to_owned();

    // A direct API call drains the container and then never stops it.
    let (status, answer) = api(
        &m.daemon.socket,
        "POST",
        &format!("/v1/containers/{id}/drain"),
        None,
        &json!({ "timeout_seconds": 0 }),
    );
    assert_eq!(status, 200, "{answer}");
    let drained = Instant::now();
    let marks =
        |m: &DockerMachine| api(&m.daemon.socket, "GET", "/v1/drains", None, &Value::Null).1;
    assert_eq!(marks(&m).as_array().map(Vec::len), Some(1), "{}", marks(&m));

    // The mark stands for the stop grace period (2 s) and a handoff (10 s), then the sweeper
    // (every 2 s) lifts it: the running container is served again, not dark for a minute or more.
    let deadline = drained + Duration::from_secs(30);
    while marks(&m).as_array().is_some_and(|a| !a.is_empty()) {
        assert!(
            Instant::now() < deadline,
            "the mark still stands {:?} after the drain: {}",
            drained.elapsed(),
            marks(&m)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let ps = stdout(&cli(&lab, &m, &["ps"]).output().unwrap());
    assert!(!ps.contains("draining"), "{ps}");
}

/// `web` turns healthy once `/tmp/ready` exists, which it makes itself unless `VER` is `stuck`
/// (then the test makes it, with `docker exec`); `api` is the Service deployed on its own.
const GATED: &str = r#"
services:
  web:
    image: IMAGE
    command:
      - sh
      - -c
      - |
        mkdir -p /www
        echo "version $$VER" > /www/index.html
        if [ "$$VER" != stuck ]; then touch /tmp/ready; fi
        exec httpd -f -p 8080 -h /www
    environment:
      VER: ${VER}
    healthcheck:
      test: ["CMD", "test", "-f", "/tmp/ready"]
      interval: 1s
      start_period: 5m
    deploy:
      update_config:
        order: start-first
    x-ports:
      - web.test.localhost:8080/http
  api:
    image: IMAGE
    command: ["sleep", "3600"]
    environment:
      VER: ${VER}
"#;

/// `web`'s containers from `ployz ps --json`: (name, ID, health).
fn web_containers(lab: &Lab, m: &DockerMachine) -> Vec<(String, String, String)> {
    let ps = json(&cli(lab, m, &["ps", "--json"]).output().unwrap())["values"].clone();
    ps.as_array()
        .unwrap()
        .iter()
        .filter(|c| c["service_name"] == "web" && c["state"] == "running")
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["id"].as_str().unwrap().to_owned(),
                c["health"].as_str().unwrap_or("none").to_owned(),
            )
        })
        .collect()
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn a_deploy_killed_in_its_health_gate_is_taken_over_and_what_it_left_is_not_trusted() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "lease5");
    write(&lab, "compose.yaml", GATED);
    let out = cli(&lab, &m, &["deploy", "-y"])
        .env("VER", "1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let served = || http_get(m.daemon.http_port, "web.test.localhost", "/");
    let deadline = Instant::now() + Duration::from_secs(15);
    while served() != (200, "version 1\n".to_owned()) {
        assert!(
            Instant::now() < deadline,
            "version 1 not served: {:?}",
            served()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let v1 = web_containers(&lab, &m);
    assert_eq!(v1.len(), 1, "{v1:?}");

    // The next version waits in its health gate; its CLI is killed there (CI cancelled).
    let mut killed = Reaped(
        cli(&lab, &m, &["deploy", "-y", "web"])
            .env("VER", "stuck")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    let left = loop {
        let now = web_containers(&lab, &m);
        if let Some(c) = now.iter().find(|c| c.0 != v1[0].0 && c.2 == "starting") {
            break c.clone();
        }
        assert!(Instant::now() < deadline, "no stuck container: {now:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let (_, holder) = api(&m.daemon.socket, "GET", "/v1/lease", None, &Value::Null);
    let t1 = holder["token"]
        .as_u64()
        .expect("the killed deploy holds the lease");
    killed.0.kill().unwrap();
    let _ = killed.0.wait();

    // A Deploy of another Service takes the lease over once it lapses, and refuses: it cannot
    // finish nor undo what the killed one left of `web`. Nothing changes.
    let out = cli(&lab, &m, &["deploy", "-y", "--lease-wait", "60", "api"])
        .env("VER", "2")
        .output()
        .unwrap();
    let text = format!("{}{}", stdout(&out), stderr(&out));
    assert!(!out.status.success(), "{text}");
    for part in [
        "took over this Machine's lease from",
        "service 'web' on Machine lease5 was left unfinished by `deploy of web`",
        &format!("(lease {t1},"),
        &format!("{} (running (starting), created under lease {t1})", left.0),
        &format!(
            "{} (running (healthy), the container it was replacing, still there)",
            v1[0].0
        ),
        "deploy 'web' too",
    ] {
        assert!(text.contains(part), "{part}\n{text}");
    }
    let mut both = web_containers(&lab, &m);
    both.sort();
    let mut want = [v1[0].clone(), left.clone()];
    want.sort();
    assert_eq!(
        both.iter().map(|c| &c.0).collect::<Vec<_>>(),
        want.iter().map(|c| &c.0).collect::<Vec<_>>()
    );

    // The killed holder's late operation, replayed with its token, is refused and not applied.
    let path = format!("/v1/containers/{}", v1[0].1);
    let (status, answer) = api(&m.daemon.socket, "DELETE", &path, Some(t1), &Value::Null);
    assert_eq!(status, 409, "{answer}");

    // The same Deploy again (the job re-run): the container left is not trusted, so `web` is
    // replaced through its gate again, and version 1 serves until a new container is healthy.
    let rerun = Reaped(
        cli(&lab, &m, &["deploy", "-y", "web"])
            .env("VER", "stuck")
            .stdout(std::fs::File::create(lab.path("rerun.out")).unwrap())
            .stderr(std::fs::File::create(lab.path("rerun.err")).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let fresh = loop {
        assert_eq!(
            served(),
            (200, "version 1\n".to_owned()),
            "while the rerun runs"
        );
        let now = web_containers(&lab, &m);
        if let Some(c) = now.iter().find(|c| c.0 != v1[0].0 && c.0 != left.0) {
            break c.clone();
        }
        assert!(
            Instant::now() < deadline,
            "the rerun made no new container: {now:?}\n{}",
            std::fs::read_to_string(lab.path("rerun.out")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let open = docker(&["exec", &fresh.1, "touch", "/tmp/ready"]);
    assert!(open.status.success(), "{}", stderr(&open));
    let (ok, out, err) = finish(&lab, "rerun", rerun);
    assert!(ok, "{out}{err}");
    assert!(
        out.contains(&format!(
            "{} on lease5 (running (starting)) was left unverified by `deploy of web`",
            left.0
        )),
        "{out}"
    );
    let now: Vec<String> = web_containers(&lab, &m).into_iter().map(|c| c.0).collect();
    assert_eq!(now, std::slice::from_ref(&fresh.0));
    for _ in 0..5 {
        assert_eq!(served(), (200, "version stuck\n".to_owned()));
    }
    // Its own lease was released: nothing it made counts as left.
    let out = cli(&lab, &m, &["deploy", "-y", "web"])
        .env("VER", "stuck")
        .output()
        .unwrap();
    assert!(
        stdout(&out).contains("Services are up to date."),
        "{}{}",
        stdout(&out),
        stderr(&out)
    );
}
