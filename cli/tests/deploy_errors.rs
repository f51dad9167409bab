//! A refused `ployz deploy` end to end: every problem of the Compose files and of planning what
//! loaded in one run, as `error:` lines or one JSON document, and nothing changed; warnings on
//! stderr and the plan on stdout.

mod common;

use std::collections::BTreeSet;
use std::process::Output;

use common::*;
use serde_json::Value;

/// Two Services the loader refuses and one it loads.
const TWO_FILE_ERRORS: &str = r#"
services:
  web:
    image: IMAGE
    mem_limit: lots
  api:
    image: IMAGE
    x-ports: ["bad host.com:80/https"]
  fine:
    image: IMAGE
"#;

fn write_compose(lab: &Lab, text: &str) {
    std::fs::write(lab.path("compose.yaml"), text.replace("IMAGE", TEST_IMAGE)).unwrap();
}

/// The CLI run from the lab directory against a socket nothing listens on.
fn without_daemon(lab: &Lab, args: &[&str]) -> Output {
    let nowhere = format!("unix://{}", lab.path("nothing.sock").display());
    lab.cli()
        .current_dir(lab.dir.path())
        .arg("--connect")
        .arg(nowhere)
        .args(args)
        .output()
        .unwrap()
}

/// stdout parsed as the JSON error document of a command that failed.
fn error_document(out: &Output) -> Value {
    assert!(
        !out.status.success(),
        "expected failure, got success: {}",
        stdout(out)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}): {}{}",
            stdout(out),
            stderr(out)
        )
    })
}

/// The `error:` lines of stderr.
fn error_lines(out: &Output) -> Vec<String> {
    stderr(out)
        .lines()
        .filter(|l| l.starts_with("error: "))
        .map(str::to_owned)
        .collect()
}

/// Asserts an entry of a JSON error document has every field, absent ones `null`.
fn assert_fields(entry: &Value) {
    for field in ["kind", "file", "service", "key", "value", "message", "fix"] {
        assert!(
            entry.get(field).is_some(),
            "'{field}' missing from {entry:#}"
        );
    }
}

#[test]
fn file_problems_are_reported_when_the_daemon_cannot_be_reached() {
    let lab = Lab::new();
    write_compose(&lab, TWO_FILE_ERRORS);

    let out = without_daemon(&lab, &["deploy", "--dry-run"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert_eq!(stdout(&out), "", "stdout holds only a plan");
    let errors = error_lines(&out);
    assert_eq!(errors.len(), 3, "{}", stderr(&out));
    assert!(
        errors[0].starts_with("error: compose.yaml: service 'web': mem_limit 'lots': "),
        "{errors:?}"
    );
    assert!(
        errors[1].starts_with(
            "error: compose.yaml: service 'api': x-ports[0] 'bad host.com:80/https': "
        ),
        "{errors:?}"
    );
    assert!(
        errors[2].starts_with("error: planning problems were not checked: "),
        "{errors:?}"
    );
    assert!(errors[2].contains("nothing.sock"), "{errors:?}");

    let out = without_daemon(&lab, &["deploy", "--dry-run", "--json"]);
    let doc = error_document(&out);
    let errors = doc["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 3, "{doc:#}");
    for e in errors {
        assert_fields(e);
    }
    assert_eq!(errors[0]["kind"], "compose", "{doc:#}");
    assert_eq!(errors[0]["file"], "compose.yaml", "{doc:#}");
    assert_eq!(errors[0]["service"], "web", "{doc:#}");
    assert_eq!(errors[0]["key"], "mem_limit", "{doc:#}");
    assert_eq!(errors[0]["value"], "lots", "{doc:#}");
    assert_eq!(errors[1]["service"], "api", "{doc:#}");
    assert_eq!(errors[1]["key"], "x-ports[0]", "{doc:#}");
    assert_eq!(errors[2]["kind"], "daemon", "{doc:#}");
    assert!(errors[2]["service"].is_null(), "{doc:#}");
    assert!(doc["warnings"].as_array().unwrap().is_empty(), "{doc:#}");
    assert!(
        stderr(&out).contains("the Deploy was refused: 3 problems"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn other_failures_of_deploy_json_are_json_documents() {
    let lab = Lab::new();
    write_compose(&lab, "services:\n  web:\n    image: IMAGE\n");

    // --json cannot ask for confirmation: checked first.
    let out = without_daemon(&lab, &["deploy", "--json"]);
    let doc = error_document(&out);
    assert_eq!(doc["errors"][0]["kind"], "usage", "{doc:#}");
    assert!(
        doc["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("add -y to deploy or --dry-run to preview"),
        "{doc:#}"
    );
    assert_fields(&doc["errors"][0]);

    // A file that loads, and no daemon.
    let out = without_daemon(&lab, &["deploy", "--dry-run", "--json"]);
    let doc = error_document(&out);
    assert_eq!(doc["errors"].as_array().unwrap().len(), 1, "{doc:#}");
    assert_eq!(doc["errors"][0]["kind"], "daemon", "{doc:#}");
    assert!(
        doc["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("nothing.sock"),
        "{doc:#}"
    );
    // The same without --json: one line on stderr, nothing on stdout.
    let out = without_daemon(&lab, &["deploy", "--dry-run"]);
    assert_one_line_error(&out, &["nothing.sock"]);
    assert_eq!(stdout(&out), "");
}

/// A unique suffix for names on the shared Docker engine.
fn unique() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn one_run_reports_every_problem_of_the_files_and_of_planning_and_changes_nothing() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "refused");
    let suffix = unique();
    let volume = format!("ployz-test-absent-{suffix}");
    let image = format!("ployz-test/absent:{suffix}");
    write_compose(
        &lab,
        &format!(
            r#"
services:
  web:
    image: IMAGE
    mem_limit: lots
  api:
    image: IMAGE
    x-ports: ["bad host.com:80/https"]
  pinned:
    image: IMAGE
    x-machines: [nowhere]
  store:
    image: IMAGE
    volumes: ["ext:/data"]
  local:
    image: {image}
    pull_policy: never
volumes:
  ext:
    external: true
    name: {volume}
"#
        ),
    );
    let expected_plan = [
        (
            "local",
            format!(
                "service 'local': image '{image}' is not on Machine refused and pull_policy is never; load it there or use pull_policy: missing"
            ),
        ),
        (
            "pinned",
            "service 'pinned': no Machine can run it (x-machines nowhere matches no Machine that is up); name Machines that exist and are up in x-machines (`ployz machine ls` lists them)".to_owned(),
        ),
        (
            "store",
            format!(
                "service 'store': external volume '{volume}' does not exist on any Machine; create it with `ployz volume create {volume}`"
            ),
        ),
    ];

    // Text: every problem on stderr, one `error:` line each; nothing on stdout.
    for args in [&["deploy", "--dry-run"][..], &["deploy", "-y"][..]] {
        let out = run(&lab, &m, args);
        assert!(!out.status.success(), "{args:?}: {}", stdout(&out));
        assert_eq!(stdout(&out), "", "{args:?}");
        let errors = error_lines(&out);
        assert_eq!(errors.len(), 5, "{args:?}: {}", stderr(&out));
        assert!(
            errors[0].starts_with("error: compose.yaml: service 'web': mem_limit 'lots': "),
            "{errors:?}"
        );
        assert!(
            errors[1].starts_with("error: compose.yaml: service 'api': x-ports[0] "),
            "{errors:?}"
        );
        let planned: BTreeSet<String> = errors[2..].iter().cloned().collect();
        let expected: BTreeSet<String> = expected_plan
            .iter()
            .map(|(_, line)| format!("error: {line}"))
            .collect();
        assert_eq!(planned, expected, "{args:?}");
    }

    // JSON: one document on stdout, five problems with their fields.
    let out = run(&lab, &m, &["deploy", "--dry-run", "--json"]);
    let doc = error_document(&out);
    let errors = doc["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 5, "{doc:#}");
    for e in errors {
        assert_fields(e);
    }
    assert_eq!(errors[0]["kind"], "compose");
    assert_eq!(errors[0]["file"], "compose.yaml");
    assert_eq!(errors[0]["service"], "web");
    assert_eq!(errors[0]["key"], "mem_limit");
    assert_eq!(errors[0]["value"], "lots");
    assert!(errors[0]["message"].as_str().is_some_and(|m| !m.is_empty()));
    assert_eq!(errors[1]["kind"], "compose");
    assert_eq!(errors[1]["service"], "api");
    assert_eq!(errors[1]["key"], "x-ports[0]");
    assert_eq!(errors[1]["value"], "bad host.com:80/https");
    for (service, line) in &expected_plan {
        let e = errors
            .iter()
            .find(|e| e["service"] == *service)
            .unwrap_or_else(|| panic!("no problem for '{service}': {doc:#}"));
        assert_eq!(e["kind"], "plan", "{e:#}");
        assert!(e["file"].is_null() && e["key"].is_null() && e["value"].is_null());
        let (message, fix) = line.split_once("; ").unwrap();
        assert_eq!(e["message"], message, "{e:#}");
        assert_eq!(e["fix"], fix, "{e:#}");
    }

    // Nothing reached Docker: no container, no volume of this Machine.
    assert!(m.docker_containers().is_empty(), "Docker was touched");
    let volumes = docker(&[
        "volume",
        "ls",
        "-q",
        "--filter",
        &format!("label=ployz.machine.id={}", m.id),
    ]);
    assert!(String::from_utf8_lossy(&volumes.stdout).trim().is_empty());
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn warnings_go_to_stderr_and_the_plan_to_stdout() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "warned");
    write_compose(
        &lab,
        "services:\n  web:\n    image: IMAGE\n    command: [sleep, '600']\n    no_such_key: 1\n",
    );

    let out = run(&lab, &m, &["deploy", "--dry-run"]);
    assert!(out.status.success(), "{}{}", stdout(&out), stderr(&out));
    let plan = stdout(&out);
    assert!(plan.starts_with("+ create service web\n"), "{plan}");
    assert!(plan.contains("1 create · 0 replace"), "{plan}");
    assert!(!plan.contains("warning"), "{plan}");
    let err = stderr(&out);
    let warnings: Vec<&str> = err.lines().filter(|l| l.starts_with("warning: ")).collect();
    assert_eq!(warnings.len(), 1, "{err}");
    assert!(
        warnings[0].starts_with("warning: compose.yaml: service 'web': no_such_key: "),
        "{err}"
    );

    // With --json the warnings are in the report, and stdout is only that report.
    let out = run(&lab, &m, &["deploy", "--dry-run", "--json"]);
    let report = json(&out);
    let listed = report["preview"]["warnings"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{report:#}");
    assert!(
        listed[0].as_str().unwrap().contains("no_such_key"),
        "{report:#}"
    );
    assert!(m.docker_containers().is_empty(), "a dry run touched Docker");
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn each_refusal_of_what_compose_allows_but_ployz_cannot_run_names_its_fix_and_touches_nothing() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "refusals");
    let edge = m.daemon.http_port;
    let taken = ployz_testkit::free_port();
    write_compose(
        &lab,
        &format!(
            r#"
services:
  my_app:
    image: IMAGE
  my-app:
    image: IMAGE
  badref:
    image: "nginx:"
  twice:
    image: IMAGE
    environment: [A=1, B=2, A=3]
  front:
    image: IMAGE
    ports: ["{taken}:80"]
  back:
    image: IMAGE
    ports: ["{taken}:8080"]
  web:
    image: IMAGE
    ports: ["127.0.0.1:{edge}:8080"]
"#
        ),
    );
    let out = run(&lab, &m, &["deploy", "-y"]);
    assert!(!out.status.success(), "{}", stdout(&out));
    assert_eq!(stdout(&out), "");
    let errors = error_lines(&out);
    let all = errors.join("\n");
    assert!(
        errors.iter().any(
            |e| e.contains("has the DNS name my-app.internal, which service '")
                && e.contains("'my_app'")
                && e.contains("'my-app'")
                && e.contains("rename one of them")
        ),
        "two Services with one DNS name are refused naming both:\n{all}"
    );
    let expected: [&str; 4] = [
        // An image reference Docker would refuse, named with the rule.
        "service 'badref': image 'nginx:'",
        // A name set twice in an environment list.
        "service 'twice': environment",
        // One host port, two Services, one Machine: both named.
        &format!("service 'front' and service 'back' both publish host port {taken}/tcp on Machine refusals"),
        // The edge's own port, with the fix that fits.
        &format!("service 'web' publishes host port {edge}/tcp on Machine refusals, where the daemon's"),
    ];
    for want in expected {
        let found = errors.iter().any(|e| e.contains(want))
            || errors.iter().any(|e| {
                // Either Service of a pair may be named first.
                want.contains(" and service ")
                    && e.contains("service 'back' and service 'front' both publish host port")
            });
        assert!(found, "missing '{want}' in:\n{all}");
    }
    assert!(
        all.contains("x-ports: ['app.example.com:8080/https']"),
        "the edge port refusal names the x-ports fix:\n{all}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("'badref'") && e.contains("tag")),
        "the image refusal names the rule:\n{all}"
    );
    assert_eq!(
        errors.len(),
        5,
        "one line per problem, no follow-on errors:\n{all}"
    );
    assert!(m.docker_containers().is_empty(), "Docker was touched");
}

#[test]
fn compose_file_and_compose_profiles_from_env_are_read_and_a_named_service_is_included() {
    let lab = Lab::new();
    // The files COMPOSE_FILE lists in .env (not compose.yaml): the second one's error shows it
    // was read. A Service in a profile is included when COMPOSE_PROFILES enables it, or when it
    // is named on the command line.
    std::fs::write(
        lab.path("base.yaml"),
        format!("services:\n  web:\n    image: {TEST_IMAGE}\n  tools:\n    image: {TEST_IMAGE}\n    profiles: [debug]\n    mem_limit: lots\n  batch:\n    image: {TEST_IMAGE}\n    profiles: [jobs]\n    mem_limit: heaps\n"),
    )
    .unwrap();
    std::fs::write(lab.path("prod.yaml"), "services:\n  web:\n    cpus: many\n").unwrap();
    std::fs::write(
        lab.path(".env"),
        "COMPOSE_FILE=base.yaml:prod.yaml\nCOMPOSE_PROFILES=debug\n",
    )
    .unwrap();
    let keys = |out: &Output| -> Vec<String> {
        error_lines(out)
            .into_iter()
            .filter(|l| !l.contains("planning problems were not checked"))
            .collect()
    };
    let out = without_daemon(&lab, &["deploy", "--dry-run"]);
    let errors = keys(&out);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("prod.yaml: service 'web': cpus 'many'")),
        "{errors:?}"
    );
    assert!(
        errors
            .iter()
            .any(|e| e.contains("service 'tools': mem_limit 'lots'")),
        "COMPOSE_PROFILES=debug did not include tools: {errors:?}"
    );
    assert!(
        !errors.iter().any(|e| e.contains("'batch'")),
        "batch's profile is not in effect: {errors:?}"
    );
    // Named, batch is included though its profile is not in effect.
    let out = without_daemon(&lab, &["deploy", "--dry-run", "batch"]);
    let errors = keys(&out);
    assert!(
        errors
            .iter()
            .any(|e| e.contains("service 'batch': mem_limit 'heaps'")),
        "the named batch was left out: {errors:?}"
    );
}
