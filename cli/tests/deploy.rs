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
    let ps = json(&run(lab, m, &["ps", "--json"]));
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
    let ps = json(&run(lab, m, &["ps", "--replicated", "--json"]));
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
    let ps = json(&run(&lab, &m, &["ps", "--json"]));
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

    // Back to the good file; scale, logs, rm.
    compose(&lab, &changed);
    let out = run(&lab, &m, &["scale", "worker", "2", "-y"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    assert_eq!(names_of(&running(&lab, &m), "worker").len(), 2);
    let logs = run(&lab, &m, &["logs", "worker", "-n", "5"]);
    assert!(logs.status.success(), "{}", stderr(&logs));
    assert!(stdout(&logs).contains("tick"), "{}", stdout(&logs));
    let ls = json(&run(&lab, &m, &["ls", "--json"]));
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
    let out = run(&lab, &m, &["run", "-n", "Bad", "-y", TEST_IMAGE]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("--name: Service Name 'Bad'"),
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
    let vols = json(&run(&lab, &m, &["volume", "ls", "--json"]));
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
