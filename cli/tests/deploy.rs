//! `ployz deploy` and the Service commands end to end: the real daemon, a real dockerd, and a
//! test image imported from busybox-static.

mod common;

use common::*;
use serde_json::Value;

fn compose(lab: &Lab, text: &str) {
    std::fs::write(lab.path("compose.yaml"), text.replace("IMAGE", TEST_IMAGE)).unwrap();
}

const TWO_SERVICES: &str = r#"
services:
  web:
    image: IMAGE
    command: ["sh", "-c", "echo hello-$$GREETING > /www/index.html && exec httpd -f -p 8080 -h /www"]
    environment:
      GREETING: one
    healthcheck:
      test: ["CMD", "wget", "-q", "-O-", "http://127.0.0.1:8080/"]
      interval: 1s
      timeout: 1s
      retries: 3
    x-pre_deploy:
      command: ["sh", "-c", "echo migrating"]
  worker:
    image: IMAGE
    command: ["sh", "-c", "while true; do echo tick; sleep 1; done"]
"#;

/// Service name -> container names, from `ployz ps --json`, running ones only.
fn running(lab: &Lab, m: &DockerMachine) -> Vec<(String, String)> {
    let ps = json(&run(lab, m, &["ps", "--json"]))["values"].clone();
    let mut v: Vec<(String, String)> = ps
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["state"] == "running" && c["kind"] == "service")
        .map(|c| {
            (
                c["service_name"].as_str().unwrap().to_owned(),
                c["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Container names the Machine's store holds.
fn stored(lab: &Lab, m: &DockerMachine) -> Vec<String> {
    let ps = json(&run(lab, m, &["ps", "--replicated", "--json"]))["values"].clone();
    ps.as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect()
}

fn wait_for(mut cond: impl FnMut() -> bool, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !cond() {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

fn names_of(list: &[(String, String)], service: &str) -> Vec<String> {
    list.iter()
        .filter(|(s, _)| s == service)
        .map(|(_, n)| n.clone())
        .collect()
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn deploy_redeploy_update_fail_scale_logs_exec_rm() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "deploy1");
    compose(&lab, TWO_SERVICES);

    // First deploy: both Services, the hook first.
    let out = run(&lab, &m, &["deploy", "-y", "--json"]);
    let report: Value = json(&out);
    assert!(report["outcome"]["failed"].is_null(), "{report:#}");
    let first_op = &report["outcome"]["completed"][0]["operation"];
    assert_eq!(first_op["op"], "run_hook", "{report:#}");
    let before = running(&lab, &m);
    assert_eq!(names_of(&before, "web").len(), 1, "{before:?}");
    assert_eq!(names_of(&before, "worker").len(), 1, "{before:?}");
    let hook = m
        .docker_containers()
        .into_iter()
        .find(|(n, _)| n.starts_with("web-pre-deploy-"))
        .expect("the hook container is kept");
    assert_eq!(hook.1, "exited");

    // The observer writes what Docker shows into the store.
    let web_name = names_of(&before, "web")[0].clone();
    wait_for(|| stored(&lab, &m).contains(&web_name), "web in the store");

    // Unchanged: nothing to do, nothing touched.
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("Services are up to date."),
        "{}",
        stdout(&out)
    );
    assert_eq!(running(&lab, &m), before);

    // One env var: exactly web is replaced, start-first and health-gated; worker untouched.
    let changed = TWO_SERVICES.replace("GREETING: one", "GREETING: two");
    compose(&lab, &changed);
    let preview = run(&lab, &m, &["deploy", "--dry-run"]);
    let text = stdout(&preview);
    assert!(text.contains("~ update service web"), "{text}");
    assert!(text.contains("+/- replace container"), "{text}");
    assert!(!text.contains("service worker"), "{text}");
    assert!(
        text.contains("0 create · 1 replace (start-first)"),
        "{text}"
    );
    let report = json(&run(&lab, &m, &["deploy", "-y", "--json"]));
    assert!(report["outcome"]["failed"].is_null(), "{report:#}");
    let after = running(&lab, &m);
    assert_eq!(names_of(&after, "worker"), names_of(&before, "worker"));
    assert_ne!(names_of(&after, "web"), names_of(&before, "web"));
    let ps = json(&run(&lab, &m, &["ps", "--json"]))["values"].clone();
    let web = ps
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["service_name"] == "web" && c["state"] == "running")
        .unwrap();
    assert_eq!(web["health"], "healthy", "{web:#}");
    assert!(
        web["address"].as_str().unwrap().starts_with("10.210.0."),
        "{web:#}"
    );
    let exec = run(
        &lab,
        &m,
        &["exec", "web", "wget", "-q", "-O-", "http://127.0.0.1:8080/"],
    );
    assert!(exec.status.success(), "{}", stderr(&exec));
    assert_eq!(stdout(&exec).trim(), "hello-two");
    let exec = run(&lab, &m, &["exec", "web", "sh", "-c", "exit 3"]);
    assert_eq!(exec.status.code(), Some(3));
    let env = run(
        &lab,
        &m,
        &["exec", "web", "sh", "-c", "echo $PLOYZ_MACHINE_ID"],
    );
    assert_eq!(stdout(&env).trim(), m.id);

    // An image whose process exits 1: the Deploy fails, names the operation, keeps the old.
    let broken = changed
        .replace(
            "command: [\"sh\", \"-c\", \"echo hello-$$GREETING > /www/index.html && exec httpd -f -p 8080 -h /www\"]",
            "command: [\"sh\", \"-c\", \"echo about to fail; exit 1\"]",
        )
        .replace("GREETING: two", "GREETING: three");
    compose(&lab, &broken);
    let out = run(&lab, &m, &["deploy", "-y", "--json"]);
    assert!(!out.status.success(), "a failing deploy exited 0");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let failed = &report["outcome"]["failed"];
    assert_eq!(failed["operation"]["op"], "replace_container", "{report:#}");
    assert!(
        failed["reason"].as_str().unwrap().contains("exited")
            || failed["reason"].as_str().unwrap().contains("restarted"),
        "{failed:#}"
    );
    assert!(
        failed["logs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l == "about to fail"),
        "{failed:#}"
    );
    assert!(
        stderr(&out).contains("deploy failed at"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        names_of(&running(&lab, &m), "web"),
        names_of(&after, "web"),
        "the old web container must still run"
    );
    // Scaled after that failure, web is what it runs, not the spec that failed.
    let out = run(&lab, &m, &["scale", "web", "2", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(names_of(&running(&lab, &m), "web").len(), 2);
    let page = run(
        &lab,
        &m,
        &["exec", "web", "wget", "-q", "-O-", "http://127.0.0.1:8080/"],
    );
    assert_eq!(stdout(&page).trim(), "hello-two", "{}", stderr(&page));

    // Back to the good file; scale, logs, rm.
    compose(&lab, &changed);
    let out = run(&lab, &m, &["scale", "worker", "2", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(names_of(&running(&lab, &m), "worker").len(), 2);
    let logs = run(&lab, &m, &["logs", "worker", "-n", "5"]);
    assert!(logs.status.success(), "{}", stderr(&logs));
    assert!(stdout(&logs).contains("tick"), "{}", stdout(&logs));
    let ls = json(&run(&lab, &m, &["ls", "--json"]))["values"].clone();
    let worker = ls
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "worker")
        .unwrap();
    assert_eq!(worker["running"], 2);
    let out = run(&lab, &m, &["rm", "worker"]);
    assert!(
        !out.status.success(),
        "rm without -y and without a TTY must refuse"
    );
    assert!(stderr(&out).contains("pass -y"), "{}", stderr(&out));
    let out = run(&lab, &m, &["rm", "worker", "-y"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(names_of(&running(&lab, &m), "worker").is_empty());
    wait_for(
        || !stored(&lab, &m).iter().any(|n| n.starts_with("worker-")),
        "removed containers gone from the store",
    );
    assert!(!m
        .docker_containers()
        .iter()
        .any(|(n, _)| n.starts_with("worker-")));
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn no_tty_and_no_yes_is_an_error_and_bad_compose_touches_nothing() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "deploy2");
    compose(&lab, TWO_SERVICES);
    let out = run(&lab, &m, &["deploy"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("pass -y"), "{}", stderr(&out));
    assert!(m.docker_containers().is_empty());

    compose(
        &lab,
        "services:\n  web:\n    image: IMAGE\n    volumes: [\"./data:/data\"]\n    x-ports: [\"bad host.com:80/https\"]\n",
    );
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(!out.status.success());
    let err = stderr(&out);
    assert!(err.contains("compose.yaml") && err.contains("web"), "{err}");
    assert!(m.docker_containers().is_empty(), "Docker was touched");
    let vols = docker(&[
        "volume",
        "ls",
        "-q",
        "--filter",
        &format!("label=ployz.machine.id={}", m.id),
    ]);
    assert!(String::from_utf8_lossy(&vols.stdout).trim().is_empty());
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn a_daemon_killed_mid_deploy_is_finished_by_the_next_deploy() {
    let lab = Lab::new();
    let mut m = DockerMachine::new(&lab, "deploy3");
    compose(
        &lab,
        "services:\n  api:\n    image: IMAGE\n    command: [\"sleep\", \"3600\"]\n    deploy:\n      replicas: 3\n      update_config:\n        monitor: 2s\n",
    );
    let mut deploy = lab
        .cli()
        .current_dir(lab.dir.path())
        .arg("--connect")
        .arg(m.daemon.connect_url())
        .args(["deploy", "-y"])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(lab.path("deploy.err")).unwrap())
        .spawn()
        .unwrap();
    // Wait until the first container exists, then kill the daemon mid-deploy.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while m.docker_containers().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "no container appeared: {}",
            std::fs::read_to_string(lab.path("deploy.err")).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    unsafe {
        libc::kill(m.daemon.pid() as i32, libc::SIGKILL);
    }
    let status = deploy.wait().unwrap();
    assert!(
        !status.success(),
        "the deploy should fail when its daemon dies"
    );
    m.daemon.restart_after_kill();

    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let containers = m.docker_containers();
    assert_eq!(containers.len(), 3, "{containers:?}");
    assert!(
        containers.iter().all(|(_, state)| state == "running"),
        "{containers:?}"
    );
    let again = run(&lab, &m, &["deploy", "-y"]);
    assert!(
        stdout(&again).contains("Services are up to date."),
        "{}",
        stdout(&again)
    );
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn run_hooks_configs_and_volumes() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "deploy4");

    // `ployz run`: a Service from flags.
    let out = run(
        &lab,
        &m,
        &[
            "run", "-n", "solo", "-e", "A=1", "-y", TEST_IMAGE, "sleep", "3600",
        ],
    );
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(names_of(&running(&lab, &m), "solo").len(), 1);
    let env = run(&lab, &m, &["exec", "solo", "sh", "-c", "echo $A"]);
    assert_eq!(stdout(&env).trim(), "1");
    let out = run(&lab, &m, &["run", "-n", "bad/name", "-y", TEST_IMAGE]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--name: Service Name 'bad/name' has '/' at position 4"),
        "{}",
        stderr(&out)
    );

    // Configs are in place before the process starts; a named volume is created and mounted.
    std::fs::write(lab.path("site.conf"), "greeting=hi\n").unwrap();
    compose(
        &lab,
        r#"
services:
  app:
    image: IMAGE
    command: ["sh", "-c", "cat /etc/site.conf > /data/seen && sleep 3600"]
    configs:
      - source: site
        target: /etc/site.conf
        mode: 0440
    volumes:
      - data:/data
volumes:
  data: {}
configs:
  site:
    file: ./site.conf
"#,
    );
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stdout(&out).contains("+ create volume data"),
        "{}",
        stdout(&out)
    );
    let seen = run(&lab, &m, &["exec", "app", "cat", "/data/seen"]);
    assert_eq!(stdout(&seen), "greeting=hi\n");
    let mode = run(
        &lab,
        &m,
        &["exec", "app", "stat", "-c", "%a", "/etc/site.conf"],
    );
    assert_eq!(stdout(&mode).trim(), "440");
    let vols = json(&run(&lab, &m, &["volume", "ls", "--json"]))["values"].clone();
    assert!(
        vols.as_array().unwrap().iter().any(|v| v["name"] == "data"),
        "{vols:#}"
    );

    // A hook that fails stops the Deploy before any container of its Service starts.
    compose(
        &lab,
        "services:\n  job:\n    image: IMAGE\n    command: [\"sleep\", \"3600\"]\n    x-pre_deploy:\n      command: [\"sh\", \"-c\", \"echo migration broke; exit 4\"]\n",
    );
    let out = run(&lab, &m, &["deploy", "-y", "--json"]);
    assert!(!out.status.success());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let failed = &report["outcome"]["failed"];
    assert_eq!(failed["operation"]["op"], "run_hook", "{report:#}");
    assert!(
        failed["reason"]
            .as_str()
            .unwrap()
            .contains("exited with code 4"),
        "{failed:#}"
    );
    assert!(
        failed["logs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l == "migration broke"),
        "{failed:#}"
    );
    assert_eq!(report["outcome"]["unexecuted"].as_array().unwrap().len(), 1);
    assert!(names_of(&running(&lab, &m), "job").is_empty());
}

/// One replica at web.test.localhost whose page says its version (`$VER`), with a CGI that
/// answers after 20 s; `order` is its update order.
fn versioned_web(order: &str) -> String {
    format!(
        r#"
services:
  web:
    image: IMAGE
    command:
      - sh
      - -c
      - |
        mkdir -p /www/cgi-bin
        echo "version $$VER" > /www/index.html
        printf '#!/bin/sh\ntouch /tmp/slow-started\nsleep 20\necho "Content-Type: text/plain"\necho\necho slow-done\n' > /www/cgi-bin/slow
        chmod +x /www/cgi-bin/slow
        exec httpd -f -p 8080 -h /www
    environment:
      VER: ${{VER}}
    healthcheck:
      test: ["CMD", "wget", "-q", "-O-", "http://127.0.0.1:8080/"]
      interval: 1s
      retries: 2
    deploy:
      update_config:
        order: {order}
    x-ports:
      - web.test.localhost:8080/http
"#
    )
}

const WEB_HOST: &str = "web.test.localhost";

/// The CLI against `m` with `VER` set, from the lab directory, with a 1 s monitor window.
fn cli_with_version(lab: &Lab, m: &DockerMachine, version: &str) -> std::process::Command {
    let mut cmd = lab.cli();
    cmd.current_dir(lab.dir.path())
        .env("PLOYZ_HEALTH_MONITOR_PERIOD", "1")
        .env("VER", version)
        .arg("--connect")
        .arg(m.daemon.connect_url());
    cmd
}

fn deploy_version(lab: &Lab, m: &DockerMachine, version: &str) -> std::process::Output {
    cli_with_version(lab, m, version)
        .args(["deploy", "-y"])
        .output()
        .unwrap()
}

/// Starts `VER=version ployz deploy -y` in the background (output in the lab's `deploy-bg.*`).
fn deploy_version_in_background(lab: &Lab, m: &DockerMachine, version: &str) -> Reaped {
    Reaped(
        cli_with_version(lab, m, version)
            .args(["deploy", "-y"])
            .stdout(std::fs::File::create(lab.path("deploy-bg.out")).unwrap())
            .stderr(std::fs::File::create(lab.path("deploy-bg.err")).unwrap())
            .spawn()
            .unwrap(),
    )
}

/// Containers `ployz ps --json` shows with a drain mark: (name, mark).
fn draining(lab: &Lab, m: &DockerMachine) -> Vec<(String, Value)> {
    json(&run(lab, m, &["ps", "--json"]))["values"]
        .clone()
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| !c["draining"].is_null())
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["draining"].clone(),
            )
        })
        .collect()
}

/// Waits (up to `secs`) until the edge answers 200 for WEB_HOST with a body containing `body`.
fn wait_served(m: &DockerMachine, body: &str, secs: u64, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let (status, got) = http_get(m.daemon.http_port, WEB_HOST, "/");
        if status == 200 && got.contains(body) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: the edge answers {status} {got:?} for {WEB_HOST}; daemon log:\n{}",
            m.daemon.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Starts a request to the slow CGI and waits until a drain of its container is waiting for it:
/// returns the request's thread and the drained container's name with its mark.
fn deploy_while_a_request_is_in_flight(
    lab: &Lab,
    m: &DockerMachine,
    version: &str,
) -> (
    std::thread::JoinHandle<(u16, String)>,
    Reaped,
    String,
    Value,
) {
    let port = m.daemon.http_port;
    let slow = std::thread::spawn(move || http_get(port, WEB_HOST, "/cgi-bin/slow"));
    // The request has reached the container once its CGI has started.
    let started = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !running(lab, m).iter().any(|(_, name)| {
        docker(&["exec", name, "test", "-e", "/tmp/slow-started"])
            .status
            .success()
    }) {
        assert!(
            std::time::Instant::now() < started,
            "the slow request never reached its container"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let deploy = deploy_version_in_background(lab, m, version);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Some((name, mark)) = draining(lab, m).into_iter().next() {
            return (slow, deploy, name, mark);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no drain began: {}",
            std::fs::read_to_string(lab.path("deploy-bg.err")).unwrap_or_default()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn a_daemon_killed_while_a_drain_waits_leaves_no_service_dark() {
    let lab = Lab::new();
    let mut m = DockerMachine::new(&lab, "drain1");
    compose(&lab, &versioned_web("stop-first"));
    let out = deploy_version(&lab, &m, "7");
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    wait_served(&m, "version 7", 15, "after the first deploy");

    // A stop-first replacement drains the only container first: while that drain waits for the
    // request in flight, `ps` shows the container draining, and the mark names its setter.
    let (slow, mut deploy, name, mark) = deploy_while_a_request_is_in_flight(&lab, &m, "10");
    assert!(name.starts_with("web-"), "{name}");
    assert!(
        mark["set_by"].as_str().unwrap().contains("deploy of web"),
        "{mark:#}"
    );
    assert!(mark["lease_token"].as_u64().is_some(), "{mark:#}");
    assert!(
        mark["deadline_ms"].as_u64() > mark["set_at_ms"].as_u64(),
        "{mark:#}"
    );
    let table = stdout(&run(&lab, &m, &["ps"]));
    assert!(
        table
            .lines()
            .any(|l| l.contains(&name) && l.contains("draining")),
        "{table}"
    );

    unsafe {
        libc::kill(m.daemon.pid() as i32, libc::SIGKILL);
    }
    let status = deploy.0.wait().unwrap();
    assert!(
        !status.success(),
        "the deploy should fail when its daemon dies"
    );
    let _ = slow.join();
    m.daemon.restart_after_kill();

    // Served again, by the container that was being drained, without `ployz start`.
    wait_served(&m, "version 7", 20, "after the daemon restarted");
    assert!(draining(&lab, &m).is_empty(), "{:?}", draining(&lab, &m));
    assert!(
        m.daemon.log_text().contains("drain mark lifted"),
        "{}",
        m.daemon.log_text()
    );

    // The next deploys converge.
    let out = deploy_version(&lab, &m, "10");
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    wait_served(&m, "version 10", 15, "after the next deploy");
    let out = deploy_version(&lab, &m, "10");
    assert!(
        stdout(&out).contains("Services are up to date."),
        "{}",
        stdout(&out)
    );
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn a_cli_killed_while_a_drain_waits_leaves_no_service_dark() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "drain2");
    compose(&lab, &versioned_web("start-first"));
    let out = deploy_version(&lab, &m, "7");
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    wait_served(&m, "version 7", 15, "after the first deploy");

    // Start-first: version 10 runs, then version 7 is drained; the CLI dies while it waits.
    let (slow, mut deploy, name, _) = deploy_while_a_request_is_in_flight(&lab, &m, "10");
    deploy.0.kill().unwrap();
    let _ = deploy.0.wait();

    // The mark does not outlive the command that set it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(45);
    while !draining(&lab, &m).is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the drain mark of {name} outlived its command: {:?}",
            draining(&lab, &m)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    // At once: the drain's caller went away, so the drain lifted its own mark.
    let lifted_by_the_drain = "reason=\"its drain ended before completing\"";
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !m.daemon.log_text().contains(lifted_by_the_drain) {
        assert!(
            std::time::Instant::now() < deadline,
            "{}",
            m.daemon.log_text()
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }

    // Back to version 7: the container that was being drained is kept, version 10 is removed,
    // and the edge serves version 7.
    let out = deploy_version(&lab, &m, "7");
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    wait_served(&m, "version 7", 15, "after deploying version 7 again");
    let names: Vec<String> = running(&lab, &m).into_iter().map(|(_, n)| n).collect();
    assert_eq!(
        names,
        std::slice::from_ref(&name),
        "the drained container is the one kept"
    );
    for _ in 0..5 {
        assert_eq!(
            http_get(m.daemon.http_port, WEB_HOST, "/"),
            (200, "version 7\n".to_owned())
        );
    }
    let out = deploy_version(&lab, &m, "7");
    assert!(
        stdout(&out).contains("Services are up to date."),
        "{}",
        stdout(&out)
    );
    let _ = slow.join();
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn compose_ports_publish_on_the_machine_and_the_edge_port_is_refused() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "ports1");
    let port = free_port();
    compose(
        &lab,
        &format!(
            r#"
services:
  web:
    image: IMAGE
    command: ["sh", "-c", "echo hello-ports > /www/index.html && exec httpd -f -p 8080 -h /www"]
    ports: ["{port}:8080", "127.0.0.1::8080"]
"#
        ),
    );
    let preview = run(&lab, &m, &["deploy", "--dry-run"]);
    assert!(preview.status.success(), "{}", stderr(&preview));
    for line in [
        format!("│ port: 0.0.0.0:{port} → 8080/tcp on ports1"),
        "│ port: 127.0.0.1:(any free port) → 8080/tcp on ports1".to_owned(),
    ] {
        assert!(stdout(&preview).contains(&line), "{}", stdout(&preview));
    }

    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}", stderr(&out));
    wait_for(
        || http_get(port, "localhost", "/").1.contains("hello-ports"),
        "the Service to answer on its host port",
    );
    // The port Docker picked on 127.0.0.1 answers too.
    let (web, _) = m
        .docker_containers()
        .into_iter()
        .find(|(n, _)| n.starts_with("web-"))
        .expect("the web container");
    let bindings = docker(&["port", &web, "8080/tcp"]);
    let picked: u16 = String::from_utf8_lossy(&bindings.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("127.0.0.1:")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no 127.0.0.1 binding: {bindings:?}"));
    assert_ne!(picked, port);
    wait_for(
        || http_get(picked, "localhost", "/").1.contains("hello-ports"),
        "the Service to answer on the port Docker picked",
    );

    // The daemon's own edge port: refused at plan time with the fix, nothing reaches Docker.
    let edge = m.daemon.http_port;
    compose(
        &lab,
        &format!(
            "services:\n  site:\n    image: IMAGE\n    command: [\"sleep\", \"3600\"]\n    ports: [\"{edge}:80\"]\n"
        ),
    );
    let before = m.docker_containers();
    let out = run(&lab, &m, &["deploy", "--dry-run"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "service 'site' publishes host port {edge}/tcp on Machine ports1, where the daemon's edge HTTP listener listens (127.0.0.1:{edge}); publish the web port through the edge with x-ports (e.g. x-ports: ['app.example.com:80/https']) or pick another host port"
        )),
        "{err}"
    );
    assert_eq!(m.docker_containers(), before, "Docker was touched");
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn a_rollback_after_a_change_of_replicas_alone_keeps_the_replicas_that_ran() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "rollback2");
    let web = |replicas: u32| {
        versioned_web("start-first")
            .replace("IMAGE", TEST_IMAGE)
            .replace(
                "    deploy:\n",
                &format!("    deploy:\n      replicas: {replicas}\n"),
            )
    };
    // Version 1 with 2 replicas, then 4 (the first two are kept, and still say 2), then
    // version 2 with 4.
    for (version, replicas) in [("1", 2), ("1", 4), ("2", 4)] {
        std::fs::write(lab.path("compose.yaml"), web(replicas)).unwrap();
        let out = deploy_version(&lab, &m, version);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    wait_served(&m, "version 2", 30, "version 2 serves");
    let kept = json(&run(&lab, &m, &["history", "web", "--json"]));
    let shape: Vec<(String, u64)> = kept
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["spec"]["container"]["env"]["VER"]
                    .as_str()
                    .unwrap()
                    .to_owned(),
                r["spec"]["replicas"].as_u64().unwrap(),
            )
        })
        .collect();
    let want: Vec<(String, u64)> = vec![("1".into(), 2), ("1".into(), 4), ("2".into(), 4)];
    assert_eq!(
        shape, want,
        "a kept container's old replica count was recorded as a revision"
    );

    // Rolled back: version 1 with the 4 replicas it ran with last, not 2.
    let out = run(&lab, &m, &["rollback", "web", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stderr(&out).contains("back to revision 2"),
        "{}",
        stderr(&out)
    );
    wait_served(&m, "version 1", 30, "version 1 serves after the rollback");
    // History marks the rollback's revision running once what runs is it: version 1, 4 of them.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let history = stdout(&run(&lab, &m, &["history", "web"]));
        let marked: Vec<&str> = history.lines().filter(|l| l.contains("running")).collect();
        if marked.len() == 1 && marked[0].trim_start().starts_with("4 ") {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "revision 4 (version 1, 4 replicas) is not marked running: {history}\n{:?}",
            running(&lab, &m)
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    assert_eq!(running(&lab, &m).len(), 4, "{:?}", running(&lab, &m));
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn rollback_under_load_fails_no_request_and_history_lists_the_revisions() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "rollback1");
    std::fs::write(
        lab.path("compose.yaml"),
        versioned_web("start-first").replace("IMAGE", TEST_IMAGE),
    )
    .unwrap();
    for version in ["1", "2"] {
        let out = deploy_version(&lab, &m, version);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    wait_served(&m, "version 2", 30, "version 2 serves");

    // Both revisions are kept, the running one marked.
    let history = stdout(&run(&lab, &m, &["history", "web"]));
    let rows: Vec<&str> = history.lines().filter(|l| l.contains("@")).collect();
    assert_eq!(rows.len(), 2, "{history}");
    assert!(
        rows[1].contains("running") && !rows[0].contains("running"),
        "{history}"
    );
    let kept = json(&run(&lab, &m, &["history", "web", "--json"]));
    assert_eq!(kept[0]["spec"]["container"]["env"]["VER"], "1", "{kept:#}");
    assert_eq!(kept[1]["spec"]["container"]["env"]["VER"], "2", "{kept:#}");

    // Requests through the edge the whole time; the rollback goes through the same gates.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let port = m.daemon.http_port;
    let load = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let (mut ok, mut failed) = (0u32, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let (status, body) = http_get(port, WEB_HOST, "/");
                if status == 200 && body.contains("version") {
                    ok += 1;
                } else {
                    failed.push((status, body));
                }
            }
            (ok, failed)
        })
    };
    let preview = stdout(&run(&lab, &m, &["rollback", "web", "--dry-run"]));
    assert!(preview.contains("~ update service web"), "{preview}");
    let out = run(&lab, &m, &["rollback", "web", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert!(
        stderr(&out).contains("back to revision 1"),
        "{}",
        stderr(&out)
    );
    wait_served(&m, "version 1", 30, "version 1 serves after the rollback");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = load.join().unwrap();
    assert!(ok > 20, "{ok} requests answered");
    assert!(failed.is_empty(), "failed during the rollback: {failed:?}");

    // The rollback is a revision of its own; a revision not kept is named with those that are.
    let kept = json(&run(&lab, &m, &["history", "web", "--json"]));
    assert_eq!(kept.as_array().unwrap().len(), 3, "{kept:#}");
    assert_eq!(kept[2]["spec"]["container"]["env"]["VER"], "1", "{kept:#}");
    let out = run(&lab, &m, &["rollback", "web", "--to", "9", "-y"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("kept: 1, 2, 3"), "{}", stderr(&out));
}
