//! Secrets end to end: the real daemon, a real dockerd and the busybox test image. A file
//! secret lands in the container with its mode; its value shows nowhere else (not in the
//! `--json` report, the container's labels, `ployz inspect` or the daemon's log); an unchanged
//! secret replaces nothing, a changed one replaces exactly the Service that mounts it.

mod common;

use common::*;
use ployz_core::SecretValue;

const FIRST: &str = "first-value-7c1f9a";
const SECOND: &str = "second-value-2b8e44";

const SERVICES: &str = r#"
services:
  app:
    image: IMAGE
    command: ["sh", "-c", "while true; do sleep 1; done"]
    secrets:
      - db_password
      - source: db_password
        target: copy
        uid: "1000"
        mode: 0400
  other:
    image: IMAGE
    command: ["sh", "-c", "while true; do sleep 1; done"]
secrets:
  db_password:
    file: ./db_password.txt
"#;

fn write_project(lab: &Lab, secret: &str) {
    std::fs::write(
        lab.path("compose.yaml"),
        SERVICES.replace("IMAGE", TEST_IMAGE),
    )
    .unwrap();
    std::fs::write(lab.path("db_password.txt"), secret).unwrap();
}

/// Service name -> running container names, from `ployz ps --json`.
fn running(lab: &Lab, m: &DockerMachine, service: &str) -> Vec<String> {
    let ps = json(&run(lab, m, &["ps", "--json"]))["values"].clone();
    let mut v: Vec<String> = ps
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["state"] == "running" && c["kind"] == "service")
        .filter(|c| c["service_name"] == service)
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect();
    v.sort();
    v
}

/// Asserts `text` holds neither the secret nor its base64 form.
fn assert_hidden(text: &str, secret: &str, where_: &str) {
    let encoded = serde_json::to_string(&SecretValue::new(secret.as_bytes().to_vec())).unwrap();
    let encoded = encoded.trim_matches('"');
    assert!(
        !text.contains(secret) && !text.contains(encoded),
        "the secret's value shows in {where_}:\n{text}"
    );
}

fn exec(lab: &Lab, m: &DockerMachine, args: &[&str]) -> String {
    let mut all = vec!["exec", "app"];
    all.extend_from_slice(args);
    let out = run(lab, m, &all);
    assert!(out.status.success(), "{:?}: {}", args, stderr(&out));
    stdout(&out)
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn a_file_secret_is_mounted_shown_nowhere_and_replaces_only_its_service_when_it_changes() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "secrets1");
    write_project(&lab, FIRST);

    // The dry run's JSON report and text preview show no value.
    let dry = run(&lab, &m, &["deploy", "--dry-run", "--json"]);
    assert!(dry.status.success(), "{}", stderr(&dry));
    let dry_text = format!("{}{}", stdout(&dry), stderr(&dry));
    assert_hidden(&dry_text, FIRST, "the --json dry run");
    let report = json(&dry);
    assert!(
        report
            .to_string()
            .contains(&SecretValue::new(FIRST.as_bytes().to_vec()).digest()),
        "the report names the secret by its digest: {report:#}"
    );
    let preview = run(&lab, &m, &["deploy", "--dry-run"]);
    assert!(preview.status.success(), "{}", stderr(&preview));
    assert_hidden(
        &format!("{}{}", stdout(&preview), stderr(&preview)),
        FIRST,
        "the preview",
    );

    // Deploy: the files are there, with their mode and owner.
    let out = run(&lab, &m, &["deploy", "-y", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_hidden(&stdout(&out), FIRST, "the --json deploy report");
    assert_eq!(exec(&lab, &m, &["cat", "/run/secrets/db_password"]), FIRST);
    assert_eq!(exec(&lab, &m, &["cat", "/run/secrets/copy"]), FIRST);
    assert_eq!(
        exec(
            &lab,
            &m,
            &[
                "stat",
                "-c",
                "%a %u",
                "/run/secrets/db_password",
                "/run/secrets/copy"
            ]
        ),
        "444 0\n400 1000\n"
    );
    let app = running(&lab, &m, "app");
    let other = running(&lab, &m, "other");
    assert_eq!((app.len(), other.len()), (1, 1), "{app:?} {other:?}");

    // The container's labels, `ployz inspect` and the daemon's log hold no value.
    let labels = docker(&["inspect", "--format", "{{json .Config.Labels}}", &app[0]]);
    assert!(labels.status.success(), "{}", stderr(&labels));
    let labels = stdout(&labels);
    assert!(labels.contains("sha256:"), "{labels}");
    assert_hidden(&labels, FIRST, "the container's labels");
    let inspect = run(&lab, &m, &["inspect", "app", "--json"]);
    assert!(inspect.status.success(), "{}", stderr(&inspect));
    assert_hidden(&stdout(&inspect), FIRST, "ployz inspect");
    assert_hidden(&m.daemon.log_text(), FIRST, "the daemon's log");

    // Unchanged: nothing replaced.
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("Services are up to date."),
        "{}",
        stdout(&out)
    );
    assert_eq!(running(&lab, &m, "app"), app);
    assert_eq!(running(&lab, &m, "other"), other);

    // A changed secret: exactly app is replaced, other untouched.
    write_project(&lab, SECOND);
    let out = run(&lab, &m, &["deploy", "-y", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_hidden(&stdout(&out), SECOND, "the --json deploy report");
    let new_app = running(&lab, &m, "app");
    assert_eq!(new_app.len(), 1, "{new_app:?}");
    assert_ne!(new_app, app, "app must be replaced");
    assert_eq!(running(&lab, &m, "other"), other, "other must be untouched");
    assert_eq!(exec(&lab, &m, &["cat", "/run/secrets/db_password"]), SECOND);

    // A spec read back from a container has no value: scaling it up is refused, not done
    // with empty files.
    let out = run(&lab, &m, &["scale", "app", "2", "-y"]);
    assert!(
        !out.status.success(),
        "scaling a Service with secrets from its label ran"
    );
    let err = stderr(&out);
    assert!(err.contains("the secret 'db_password'"), "{err}");
    assert!(
        err.contains("deploy the Service from its Compose file"),
        "{err}"
    );
    assert_eq!(running(&lab, &m, "app"), new_app);
    assert_hidden(&m.daemon.log_text(), SECOND, "the daemon's log");
}
