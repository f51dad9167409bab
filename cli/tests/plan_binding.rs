//! `ployz deploy --plan-id`: a reviewed plan runs exactly as previewed while nothing it depends
//! on moved, and each kind of drift (another deploy, a Compose value, a container removed by
//! hand, a tag retagged, an image no Machine holds) refuses before any effect, naming what moved.

mod common;

use common::*;
use serde_json::Value;

fn compose(lab: &Lab, image: &str, greeting: &str) {
    let text = format!(
        r#"
services:
  web:
    image: {image}
    command: ["sh", "-c", "echo $$GREETING > /index.html && exec httpd -f -p 8080 -h /"]
    environment:
      GREETING: {greeting}
"#
    );
    std::fs::write(lab.path("compose.yaml"), text).unwrap();
}

/// The plan id a dry run prints, from its JSON.
fn plan_id(lab: &Lab, m: &DockerMachine) -> String {
    let report = json(&run(lab, m, &["deploy", "--dry-run", "--json"]));
    report["plan_id"]
        .as_str()
        .unwrap_or_else(|| panic!("a plan id: {report:#}"))
        .to_owned()
}

/// Each operation as `op service-or-container`, in order.
fn ops(operations: &Value) -> Vec<String> {
    operations
        .as_array()
        .unwrap()
        .iter()
        .map(|op| {
            let op = op.get("operation").unwrap_or(op);
            format!(
                "{} {}",
                op["op"].as_str().unwrap(),
                op["spec"]["name"]
                    .as_str()
                    .or(op["container"]["name"].as_str())
                    .unwrap_or("-")
            )
        })
        .collect()
}

/// A bound deploy that must be refused: names `moved`, changes no container.
fn refused(lab: &Lab, m: &DockerMachine, id: &str, moved: &str) -> String {
    let before = m.docker_containers();
    let out = run(lab, m, &["deploy", "-y", "--plan-id", id]);
    let err = stderr(&out);
    assert!(!out.status.success(), "refused: {}{err}", stdout(&out));
    assert!(err.contains(moved), "names {moved:?}: {err}");
    assert_eq!(m.docker_containers(), before, "nothing ran");
    err
}

/// [`refused`] because something the plan binds moved: says so, and how to review again.
fn drifted(lab: &Lab, m: &DockerMachine, id: &str, moved: &str) -> String {
    let err = refused(lab, m, id, moved);
    assert!(
        err.contains("the plan moved since it was reviewed")
            && err.contains("ployz deploy --dry-run"),
        "says it moved and how to review again: {err}"
    );
    err
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn a_reviewed_plan_runs_as_previewed_and_refuses_once_anything_it_binds_moved() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "bind1");
    // A tag of this test's own, so retagging it touches no other test.
    let image = format!("ployz-test/bind-{}:1", std::process::id());
    assert!(docker(&["tag", TEST_IMAGE, &image]).status.success());
    compose(&lab, &image, "one");

    // Reviewed, then run: the same operations, in the same order.
    let review = json(&run(&lab, &m, &["deploy", "--dry-run", "--json"]));
    let id = review["plan_id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("p1."), "{id}");
    let text = stdout(&run(&lab, &m, &["deploy", "--dry-run"]));
    assert!(text.contains(&format!("Plan id: {id}")), "{text}");
    assert!(
        text.contains(&format!("ployz deploy --plan-id {id}")),
        "{text}"
    );
    let previewed: Vec<String> = review["preview"]["plan"]["services"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|s| ops(&s["operations"]))
        .collect();
    assert_eq!(previewed, ["run_container web"], "{review:#}");
    let ran = json(&run(
        &lab,
        &m,
        &["deploy", "-y", "--json", "--plan-id", &id],
    ));
    assert!(ran["outcome"]["failed"].is_null(), "{ran:#}");
    assert_eq!(ran["plan_id"], id.as_str());
    assert_eq!(ops(&ran["outcome"]["completed"]), previewed);
    // The container it ran carries the id, and `inspect` shows it.
    let shown = stdout(&run(&lab, &m, &["inspect", "web"]));
    assert!(shown.contains("PLAN ID") && shown.contains(&id), "{shown}");
    let inspected = json(&run(&lab, &m, &["inspect", "web", "--json"]));
    assert_eq!(
        inspected["containers"][0]["plan_id"],
        id.as_str(),
        "{inspected:#}"
    );

    // The same id again: the deploy it bound changed what it depends on (its container now
    // runs), so it is refused, and says the id it planned to instead.
    let err = drifted(&lab, &m, &id, "the containers of the attempted Services");
    assert!(err.contains(&plan_id(&lab, &m)), "the new id: {err}");

    // A Compose value changed after review.
    let id = plan_id(&lab, &m);
    compose(&lab, &image, "two");
    drifted(&lab, &m, &id, "the Deploy Intent");
    compose(&lab, &image, "one");

    // A container removed by hand.
    let id = plan_id(&lab, &m);
    let (name, _) = m.docker_containers().into_iter().next().expect("web runs");
    assert!(docker(&["rm", "-f", &name]).status.success());
    drifted(&lab, &m, &id, "the containers of the attempted Services");
    let again = json(&run(&lab, &m, &["deploy", "-y", "--json"]));
    assert!(again["outcome"]["failed"].is_null(), "{again:#}");

    // The tag retagged to another image.
    let id = plan_id(&lab, &m);
    let build =
        std::process::Command::new("docker")
            .args(["build", "-q", "-t", &image, "-"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .and_then(|mut child| {
                use std::io::Write;
                child.stdin.take().unwrap().write_all(
                    format!("FROM {TEST_IMAGE}\nLABEL ployz.test=retagged\n").as_bytes(),
                )?;
                child.wait_with_output()
            })
            .unwrap();
    assert!(build.status.success(), "{}", stderr(&build));
    drifted(&lab, &m, &id, "how an image resolves on a Machine");

    // Nothing moved since this review: it binds, and changes nothing more.
    let id = plan_id(&lab, &m);
    let ran = run(&lab, &m, &["deploy", "-y", "--plan-id", &id]);
    assert!(ran.status.success(), "{}{}", stdout(&ran), stderr(&ran));

    // An image no Machine holds binds only with --allow-unresolved.
    let absent = format!("ployz-test/absent-{}:1", std::process::id());
    compose(&lab, &absent, "one");
    let text = stdout(&run(&lab, &m, &["deploy", "--dry-run"]));
    assert!(text.contains("needs --allow-unresolved"), "{text}");
    let id = plan_id(&lab, &m);
    let err = refused(&lab, &m, &id, "is bound by its tag alone");
    assert!(err.contains("--allow-unresolved"), "{err}");
    let checked = run(
        &lab,
        &m,
        &[
            "deploy",
            "--dry-run",
            "--plan-id",
            &id,
            "--allow-unresolved",
        ],
    );
    assert!(checked.status.success(), "{}", stderr(&checked));

    // A malformed id is a usage error before anything is asked.
    let out = run(&lab, &m, &["deploy", "-y", "--plan-id", "p1.nope"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("is not a plan id"),
        "{}",
        stderr(&out)
    );

    let _ = docker(&["rmi", "-f", &image]);
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn two_deploys_bound_to_one_plan_started_together_run_it_once() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "bind2");
    compose(&lab, TEST_IMAGE, "one");
    let id = plan_id(&lab, &m);
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        .to_string();
    let start = |n: usize| {
        lab.cli()
            .current_dir(lab.dir.path())
            .env("PLOYZ_HEALTH_MONITOR_PERIOD", "1")
            .arg("--connect")
            .arg(m.daemon.connect_url())
            .args(["deploy", "-y", "--plan-id", &id])
            .stdout(std::fs::File::create(lab.path(&format!("bound-{n}.out"))).unwrap())
            .stderr(std::fs::File::create(lab.path(&format!("bound-{n}.err"))).unwrap())
            .spawn()
            .unwrap()
    };
    let (mut a, mut b) = (start(0), start(1));
    let ok = [a.wait().unwrap().success(), b.wait().unwrap().success()];
    let err = |n: usize| std::fs::read_to_string(lab.path(&format!("bound-{n}.err"))).unwrap();
    // One ran the plan; the other waited for the lease, planned again, found the container the
    // first had made, and changed nothing.
    assert_eq!(
        ok.iter().filter(|ok| **ok).count(),
        1,
        "exactly one ran: {} / {}",
        err(0),
        err(1)
    );
    let loser = if ok[0] { 1 } else { 0 };
    assert!(
        err(loser).contains("the containers of the attempted Services"),
        "{}",
        err(loser)
    );
    assert_eq!(
        m.docker_containers().len(),
        1,
        "one container, from one run"
    );
    // Docker's own log: one container created and started, by the one run.
    let events = docker(&[
        "events",
        "--since",
        &since,
        "--until",
        &std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
            .saturating_add(1)
            .to_string(),
        "--filter",
        &format!("label=ployz.machine.id={}", m.id),
        "--filter",
        "type=container",
        "--format",
        "{{.Action}}",
    ]);
    let actions = stdout(&events);
    let created = actions.lines().filter(|l| *l == "create").count();
    assert_eq!(created, 1, "{actions}");
}
