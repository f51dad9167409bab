//! Deploys across Machines, through one entry Machine: placement over every Machine the entry
//! reaches, each operation run by its Machine's daemon under that Machine's lease, and a
//! Machine that does not answer left out (named in the preview) unless a Service is pinned to
//! it.

mod common;

use std::collections::BTreeMap;
use std::process::Output;
use std::time::Duration;

use common::*;
use ployz_lab::{Lab, LAB_IMAGE};

/// `ployz ARGS` through Machine `i` with a one-second health monitor (the containers here have
/// no healthcheck; the default five seconds per operation only makes the test slower).
fn ployz_fast(lab: &Lab, i: usize, args: &[&str]) -> Output {
    let mut c = lab.cli(i);
    c.env("PLOYZ_HEALTH_MONITOR_PERIOD", "1").args(args);
    c.output().expect("the CLI runs")
}

fn ok_fast(lab: &Lab, i: usize, args: &[&str]) -> String {
    let out = ployz_fast(lab, i, args);
    assert!(
        out.status.success(),
        "ployz {args:?} on Machine {i} failed:\n{}\n{}",
        text(&out),
        logs(lab)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Per Service, how many of its containers each Machine runs (by Machine Name), from `ps
/// --json` through Machine `i`; only running ones when `running`.
fn placement(lab: &Lab, i: usize, running: bool) -> BTreeMap<String, BTreeMap<String, usize>> {
    let v = lab.json(i, &["ps", "--json"]);
    assert_eq!(v["failures"], serde_json::json!([]), "{v}");
    let mut out: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    for c in v["values"].as_array().expect("values") {
        if running && c["state"] != "running" {
            continue;
        }
        let service = c["service_name"].as_str().unwrap_or_default().to_owned();
        let machine = c["machine_name"].as_str().unwrap_or_default().to_owned();
        *out.entry(service).or_default().entry(machine).or_default() += 1;
    }
    out
}

fn each(list: &[(&str, usize)]) -> BTreeMap<String, usize> {
    list.iter().map(|(m, n)| (m.to_string(), *n)).collect()
}

/// The lines of a Service's tree in a preview: from its header to the blank line after it.
fn tree<'a>(preview: &'a str, service: &str) -> Vec<&'a str> {
    preview
        .lines()
        .skip_while(|l| {
            !l.ends_with(&format!("service {service}"))
                && !l.contains(&format!("service {service} "))
        })
        .take_while(|l| !l.is_empty())
        .collect()
}

const COMPOSE: &str = r#"
services:
  web:
    image: IMAGE
    command: ["sh", "-c", "mkdir -p /www && echo web-on-$$PLOYZ_MACHINE_ID > /www/index.html && exec httpd -f -p 8080 -h /www"]
    deploy:
      replicas: 3
    x-ports:
      - web.example.test:8080/http
  agent:
    image: IMAGE
    command: ["sleep", "3600"]
    deploy:
      mode: global
  db:
    image: IMAGE
    command: ["sleep", "3600"]
    x-machines: m1
"#;

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn one_deploy_through_one_machine_places_services_on_all_three() {
    let mut lab = cluster(3);
    let compose = lab.dir().join("compose.yaml");
    std::fs::write(&compose, COMPOSE.replace("IMAGE", LAB_IMAGE)).expect("compose file");
    let file = compose.to_str().expect("utf-8 path");

    // The preview names the Machine of every operation: one replica of web on each, one agent
    // on each, db on m1.
    let preview = ok_fast(&lab, 0, &["deploy", "--dry-run", "-f", file]);
    for (service, machines) in [
        ("web", vec!["m0", "m1", "m2"]),
        ("agent", vec!["m0", "m1", "m2"]),
        ("db", vec!["m1"]),
    ] {
        let lines = tree(&preview, service);
        let mut on: Vec<&str> = lines
            .iter()
            .filter_map(|l| l.split_once("+ run container on ").map(|(_, m)| m))
            .collect();
        on.sort();
        assert_eq!(on, machines, "{service} in:\n{preview}");
    }
    assert!(
        preview.contains("7 create · 0 replace (start-first) · 0 replace (stop-first) · 0 remove · across 3 machines"),
        "{preview}"
    );
    assert!(!preview.contains("not included"), "{preview}");

    ok_fast(&lab, 0, &["deploy", "-y", "-f", file]);
    // Listed from Machine 1 (the second), each container with its Machine.
    let want = BTreeMap::from([
        ("agent".to_owned(), each(&[("m0", 1), ("m1", 1), ("m2", 1)])),
        ("db".to_owned(), each(&[("m1", 1)])),
        ("web".to_owned(), each(&[("m0", 1), ("m1", 1), ("m2", 1)])),
    ]);
    assert_eq!(placement(&lab, 1, true), want);
    // Every Machine's web container answers through Machine 0's edge.
    let ids: Vec<String> = (0..3).map(|i| own_id(&lab, i)).collect();
    let url = format!("http://{}/", lab.underlay_addr(0));
    wait_for(
        &lab,
        "every web container answers through Machine 0's edge",
        Duration::from_secs(30),
        || {
            let seen: std::collections::BTreeSet<String> = (0..15)
                .map(|_| {
                    let out = lab.exec_in(
                        0,
                        &[
                            "curl",
                            "-sS",
                            "-m",
                            "5",
                            "-H",
                            "Host: web.example.test",
                            &url,
                        ],
                    );
                    String::from_utf8_lossy(&out.stdout).trim().to_owned()
                })
                .collect();
            ids.iter()
                .all(|id| seen.contains(&format!("web-on-{id}")))
                .then_some(())
        },
    );

    // Unchanged, from another entry Machine: nothing to do.
    let again = ok_fast(&lab, 2, &["deploy", "-y", "-f", file]);
    assert!(again.contains("Services are up to date."), "{again}");

    // Scaled to 5 through Machine 2: two more, on two different Machines.
    let scaled = ok_fast(&lab, 2, &["scale", "web", "5", "-y"]);
    assert_eq!(scaled.matches("+ run container on ").count(), 2, "{scaled}");
    let web = placement(&lab, 0, true).remove("web").expect("web listed");
    let mut counts: Vec<usize> = web.values().copied().collect();
    counts.sort();
    assert_eq!(counts, [1, 2, 2], "web after scaling: {web:?}");

    // stop/start/rm through one Machine act on every Machine holding the Service.
    ok_fast(&lab, 1, &["stop", "agent"]);
    let p = placement(&lab, 0, false);
    assert_eq!(p["agent"], each(&[("m0", 1), ("m1", 1), ("m2", 1)]));
    assert!(!placement(&lab, 0, true).contains_key("agent"));
    ok_fast(&lab, 2, &["start", "agent"]);
    assert_eq!(
        placement(&lab, 0, true)["agent"],
        each(&[("m0", 1), ("m1", 1), ("m2", 1)])
    );
    ok_fast(&lab, 0, &["rm", "-y", "db"]);
    assert!(!placement(&lab, 2, false).contains_key("db"));

    // An image no Machine has and none can pull: the operation fails naming the Machine and
    // how to get the image there.
    let out = ployz_fast(
        &lab,
        0,
        &[
            "run",
            "-y",
            "--name",
            "ghost",
            "-m",
            "m2",
            "127.0.0.1:9/ployz-nowhere:1",
        ],
    );
    assert!(!out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(
        said.contains("image '127.0.0.1:9/ployz-nowhere:1' is not on Machine m2")
            && said.contains("ployz image push 127.0.0.1:9/ployz-nowhere:1 -m m2"),
        "{said}"
    );

    // A Service that runs on Machine 2 alone, seen there by Machine 0's store before Machine 2
    // stops: deployed again through Machine 0 without it, it is refused, not made anew on the
    // others (a second Service, with empty volumes).
    let solo = lab.dir().join("solo.yaml");
    let solo_on = |pin: &str| {
        format!(
            "services:\n  solo:\n    image: {LAB_IMAGE}\n    command: [\"sleep\", \"3600\"]\n{pin}"
        )
    };
    std::fs::write(&solo, solo_on("    x-machines: m2\n")).expect("compose file");
    ok_fast(&lab, 0, &["deploy", "-y", "-f", solo.to_str().unwrap()]);
    wait_for(
        &lab,
        "Machine 0's store holds solo's container on Machine 2",
        Duration::from_secs(30),
        || {
            let v = lab.json(0, &["ps", "--replicated", "--json"]);
            v["values"]
                .as_array()?
                .iter()
                .any(|c| c["service_name"] == "solo" && c["machine_name"] == "m2")
                .then_some(())
        },
    );

    // Machine 2 stopped: a Service pinned to it is refused before anything runs; the others
    // deploy on Machines 0 and 1, and the preview says Machine 2 was not included.
    lab.stop_machine(2);
    std::fs::write(&solo, solo_on("")).expect("compose file");
    let out = ployz_fast(&lab, 0, &["deploy", "-y", "-f", solo.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out)
            .contains("service 'solo' runs only on Machine m2, which this Deploy cannot include"),
        "{}",
        text(&out)
    );
    let pinned = lab.dir().join("pinned.yaml");
    std::fs::write(
        &pinned,
        format!(
            "services:\n  cache:\n    image: {LAB_IMAGE}\n    command: [\"sleep\", \"3600\"]\n    x-machines: m2\n"
        ),
    )
    .expect("compose file");
    let out = ployz_fast(&lab, 0, &["deploy", "-y", "-f", pinned.to_str().unwrap()]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        text(&out).contains(
            "service 'cache' names Machine m2 in x-machines, but this Deploy cannot include it"
        ),
        "{}",
        text(&out)
    );
    let changed = lab.dir().join("changed.yaml");
    std::fs::write(
        &changed,
        COMPOSE
            .replace("IMAGE", LAB_IMAGE)
            .replace("[\"sleep\", \"3600\"]", "[\"sleep\", \"3601\"]"),
    )
    .expect("compose file");
    let out = ok_fast(
        &lab,
        0,
        &["deploy", "-y", "-f", changed.to_str().unwrap(), "agent"],
    );
    assert!(out.contains("not included: Machine m2"), "{out}");
    assert!(
        out.contains("across 2 machines"),
        "agent replaced on Machines 0 and 1 only: {out}"
    );
    let v = lab.ployz(0, &["ps", "--json"]);
    assert_eq!(v.status.code(), Some(3), "{}", text(&v));
    let v: serde_json::Value = serde_json::from_slice(&v.stdout).expect("json");
    let agents: Vec<String> = v["values"]
        .as_array()
        .expect("values")
        .iter()
        .filter(|c| c["service_name"] == "agent" && c["state"] == "running")
        .map(|c| c["machine_name"].as_str().unwrap_or_default().to_owned())
        .collect();
    let mut agents = agents;
    agents.sort();
    assert_eq!(agents, ["m0", "m1"], "{v}");
}

/// `curl` inside Machine `i`'s namespace against its own edge, for web.example.test.
fn curl_edge(lab: &Lab, i: usize, path: &str, post: Option<&str>, max_seconds: u32) -> Output {
    let url = format!("http://{}{path}", lab.underlay_addr(i));
    let max = max_seconds.to_string();
    let mut args = vec![
        "nsenter".to_owned(),
        format!("--net=/var/run/netns/{}", lab.netns(i)),
        "curl".into(),
        "-sS".into(),
        "-m".into(),
        max,
        "-o".into(),
        "-".into(),
        "-w".into(),
        "\n%{http_code}".into(),
        "-H".into(),
        "Host: web.example.test".into(),
    ];
    if let Some(body) = post {
        args.extend(["--data-binary".into(), body.to_owned()]);
    }
    args.push(url);
    std::process::Command::new(&args[0])
        .args(&args[1..])
        .output()
        .expect("nsenter runs")
}

/// The body and status code of a [`curl_edge`] answer.
fn answer(out: &Output) -> (String, String) {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (body.trim().to_owned(), code.trim().to_owned())
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_rolling_deploy_across_machines_fails_no_request_and_lets_a_long_one_finish_elsewhere() {
    let lab = cluster(3);
    let file = |version: u32| {
        let path = lab.dir().join(format!("web-{version}.yaml"));
        std::fs::write(&path, web_compose(version)).expect("compose file");
        path.to_str().expect("utf-8 path").to_owned()
    };
    let v1 = file(1);
    ok_fast(&lab, 0, &["deploy", "-y", "-f", &v1]);
    let ids: Vec<String> = (0..3).map(|i| own_id(&lab, i)).collect();
    for edge in [0, 1] {
        wait_for(
            &lab,
            "every web container answers through the edge",
            Duration::from_secs(30),
            || {
                let seen: std::collections::BTreeSet<String> = (0..15)
                    .map(|_| answer(&curl_edge(&lab, edge, "/", None, 5)).0)
                    .collect();
                ids.iter()
                    .all(|id| seen.contains(&format!("web-on-{id}")))
                    .then_some(())
            },
        );
    }

    let stop = std::sync::atomic::AtomicBool::new(false);
    let (loads, longs, deployed) = std::thread::scope(|scope| {
        // GET and POST through Machines 0 and 1's edges, until the deploy ends.
        let loads: Vec<_> = [0usize, 1]
            .into_iter()
            .map(|edge| {
                let (lab, stop) = (&lab, &stop);
                scope.spawn(move || {
                    let mut outcomes = Vec::new();
                    let mut n = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        n += 1;
                        let sent = format!("post-{edge}-{n}");
                        let (body, code) = if n.is_multiple_of(2) {
                            answer(&curl_edge(lab, edge, "/cgi-bin/echo", Some(&sent), 10))
                        } else {
                            answer(&curl_edge(lab, edge, "/", None, 10))
                        };
                        let good = code == "200"
                            && if n.is_multiple_of(2) {
                                body == sent
                            } else {
                                body.starts_with("web-on-")
                            };
                        outcomes.push((good, format!("{code} {body}")));
                    }
                    outcomes
                })
            })
            .collect();
        // Long requests through Machine 0's edge, round robin over the three containers: two
        // of them go to Machine 2's.
        let longs: Vec<_> = (0..6)
            .map(|_| {
                let lab = &lab;
                scope.spawn(move || answer(&curl_edge(lab, 0, "/cgi-bin/slow", None, 60)))
            })
            .collect();
        // Every long request under way in its container before the deploy begins.
        wait_for(
            &lab,
            "the six long requests running in their containers",
            Duration::from_secs(30),
            || (slow_requests_started(&lab, 0..3, "web") >= 6).then_some(()),
        );
        let deployed = ployz_fast(&lab, 2, &["deploy", "-y", "-f", &file(2)]);
        let longs: Vec<(String, String)> = longs
            .into_iter()
            .map(|t| t.join().expect("long request"))
            .collect();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let loads: Vec<Vec<(bool, String)>> =
            loads.into_iter().map(|t| t.join().expect("load")).collect();
        (loads, longs, deployed)
    });
    assert!(
        deployed.status.success(),
        "{}\n{}",
        text(&deployed),
        logs(&lab)
    );
    let said = String::from_utf8_lossy(&deployed.stdout);
    assert_eq!(said.matches("replace container").count(), 3, "{said}");
    assert!(said.contains("across 3 machines"), "{said}");
    for (edge, outcomes) in loads.iter().enumerate() {
        let failed: Vec<&String> = outcomes.iter().filter(|o| !o.0).map(|o| &o.1).collect();
        assert!(outcomes.len() > 10, "too little load through edge {edge}");
        assert!(
            failed.is_empty(),
            "through Machine {edge}'s edge, {} of {} requests failed: {failed:?}",
            failed.len(),
            outcomes.len()
        );
    }
    for (body, code) in &longs {
        assert_eq!(code, "200", "a long request failed: {body}");
        assert!(body.starts_with("slow-on-"), "{body}");
    }
    assert!(
        longs
            .iter()
            .any(|(b, _)| b == &format!("slow-on-{}", ids[2])),
        "no long request went to Machine 2's container: {longs:?}"
    );
    // Every container was replaced.
    let v = lab.json(0, &["ps", "--json"]);
    let running: Vec<&serde_json::Value> = v["values"]
        .as_array()
        .expect("values")
        .iter()
        .filter(|c| c["state"] == "running")
        .collect();
    assert_eq!(running.len(), 3, "{v}");
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_plan_reviewed_with_three_machines_is_refused_once_one_is_stopped() {
    let mut lab = cluster(3);
    let compose = lab.dir().join("compose.yaml");
    std::fs::write(&compose, web_compose(1)).expect("compose file");
    let file = compose.to_str().expect("utf-8 path");
    let review: serde_json::Value = serde_json::from_str(&ok_fast(
        &lab,
        0,
        &["deploy", "--dry-run", "--json", "-f", file],
    ))
    .expect("the dry run's JSON");
    let id = review["plan_id"].as_str().expect("a plan id").to_owned();

    let m2 = own_id(&lab, 2);
    lab.stop_machine(2);
    wait_for(&lab, "m0 observes m2 down", Duration::from_secs(30), || {
        observed(&lab, 0)
            .and_then(|o| o.get(&m2).cloned())
            .filter(|(_, membership)| membership == "down")
    });
    let out = ployz_fast(&lab, 0, &["deploy", "-y", "--plan-id", &id, "-f", file]);
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "refused: {}", text(&out));
    assert!(
        err.contains("the Machines included"),
        "names the Machines: {err}"
    );
    assert!(
        err.contains("ployz deploy --dry-run"),
        "how to review again: {err}"
    );
    // Nothing ran on the Machines still there.
    for i in 0..2 {
        let ps = lab.docker(i, &["ps", "-q", "--filter", "label=ployz.service.name=web"]);
        assert!(
            String::from_utf8_lossy(&ps.stdout).trim().is_empty(),
            "no web container on Machine {i}: {}",
            text(&ps)
        );
    }
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_rollback_through_another_machine_returns_all_three_to_the_previous_revision() {
    let lab = cluster(3);
    let compose = lab.dir().join("compose.yaml");
    let file = compose.to_str().expect("utf-8 path").to_owned();
    for version in [1, 2] {
        std::fs::write(&compose, web_compose(version)).expect("compose file");
        ok_fast(&lab, 0, &["deploy", "-y", "-f", &file]);
    }
    // The revisions were written through m0; m1 rolls back once it observes both.
    wait_for(
        &lab,
        "m1 observes both revisions",
        Duration::from_secs(30),
        || {
            let out = ployz_fast(&lab, 1, &["history", "web", "--json"]);
            let kept: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
            (kept.as_array()?.len() == 2).then_some(())
        },
    );
    ok_fast(&lab, 1, &["rollback", "web", "-y"]);
    // Every Machine's web containers run revision 1's spec now.
    let ps = lab.json(1, &["ps", "--json"]);
    let running: Vec<&serde_json::Value> = ps["values"]
        .as_array()
        .expect("containers")
        .iter()
        .filter(|c| c["service_name"] == "web" && c["state"] == "running")
        .collect();
    assert_eq!(running.len(), 3, "{ps:#}");
    let machines: std::collections::BTreeSet<&str> = running
        .iter()
        .filter_map(|c| c["machine_id"].as_str())
        .collect();
    assert_eq!(machines.len(), 3, "one on each Machine: {ps:#}");
    for c in &running {
        assert_eq!(
            c["spec"]["container"]["env"]["VERSION"], "1",
            "revision 1 everywhere: {c:#}"
        );
    }
}
