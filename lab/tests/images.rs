//! Images without a registry: `ployz image push` from the Docker where the CLI runs to the
//! Machines, through the Machine reached and the mesh; only what each Machine lacks crosses.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use ployz_lab::Lab;
use serde_json::Value;

/// The Docker where the CLI runs: the lab host's.
const LOCAL_DOCKER: &str = "unix:///var/run/docker.sock";

fn host_docker(args: &[&str]) -> std::process::Output {
    let out = Command::new("docker")
        .arg("-H")
        .arg(LOCAL_DOCKER)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("docker runs");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `size` bytes that do not compress (xorshift from `seed`).
fn noise(seed: u8, size: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15 ^ u64::from(seed);
    (0..size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Builds `tag` in the host's Docker: `FROM scratch`, the busybox binary, then `size` bytes of
/// data made from `seed` (incompressible), one layer each.
fn build(dir: &Path, tag: &str, seed: u8, size: usize) -> String {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::copy("/bin/busybox", dir.join("busybox")).unwrap();
    std::fs::write(dir.join("data"), noise(seed, size)).unwrap();
    std::fs::write(
        dir.join("Dockerfile"),
        "FROM scratch\nCOPY busybox /bin/busybox\nCOPY data /data\n",
    )
    .unwrap();
    host_docker(&["build", "-q", "-t", tag, dir.to_str().unwrap()]);
    image_id_on_host(tag)
}

fn image_id_on_host(tag: &str) -> String {
    let out = host_docker(&["image", "inspect", "-f", "{{.Id}}", tag]);
    String::from_utf8_lossy(&out.stdout).trim().to_owned()
}

/// The ID of image `tag` on Machine `i`'s Docker, if it has it.
fn image_id_on(lab: &Lab, i: usize, tag: &str) -> Option<String> {
    let out = lab.docker(i, &["image", "inspect", "-f", "{{.Id}}", tag]);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// `ployz image push --json` through Machine 0, with the lab host's Docker as the local one.
fn push(lab: &Lab, args: &[&str]) -> std::process::Output {
    let mut c = lab.cli(0);
    c.env("DOCKER_HOST", LOCAL_DOCKER)
        .args(["image", "push", "--json"])
        .args(args);
    c.output().unwrap()
}

/// Each Machine's outcome in a push's JSON, by Machine Name.
fn outcomes(out: &std::process::Output) -> std::collections::BTreeMap<String, Value> {
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", text(out)));
    v[0]["values"]
        .as_array()
        .unwrap_or_else(|| panic!("no values: {v}"))
        .iter()
        .map(|o| (o["machine_name"].as_str().unwrap().to_owned(), o.clone()))
        .collect()
}

/// How many images arrived at Machine `i` (its daemon logs each one it loads).
fn arrivals(lab: &Lab, i: usize) -> usize {
    lab.log(i).matches("an image arrived").count()
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_push_sends_only_what_each_machine_lacks_and_a_machine_that_has_it_costs_one_round_trip() {
    let mut lab = cluster(3);
    let tag_one = format!("ployz-push-test/{}:1", lab.run());
    let tag_two = format!("ployz-push-test/{}:2", lab.run());
    let _cleanup = RemoveOnDrop(vec![tag_one.clone(), tag_two.clone()]);
    let data = 1 << 20;
    let id = build(&lab.dir().join("one"), &tag_one, 1, data);
    // Machine 1 has the image already (by ID), under another tag.
    let save = Command::new("docker")
        .args(["-H", LOCAL_DOCKER, "save", &id])
        .output()
        .unwrap();
    assert!(save.status.success());
    let mut load = lab.docker_command(1, &["load"]);
    load.stdin(Stdio::piped()).stdout(Stdio::null());
    let mut child = load.spawn().unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), &save.stdout).unwrap();
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    assert_eq!(image_id_on(&lab, 1, &id).as_deref(), Some(id.as_str()));

    let out = push(&lab, &[&tag_one]);
    assert!(out.status.success(), "{}\n{}", text(&out), logs(&lab));
    let got = outcomes(&out);
    // Machine 1: the offer alone; nothing sent, nothing loaded, the tag applied.
    assert_eq!(got["m1"]["present"], true, "{got:?}");
    assert_eq!(got["m1"]["bytes_sent"], 0, "{got:?}");
    assert_eq!(arrivals(&lab, 1), 0, "Machine 1 loaded an image");
    for m in ["m0", "m2"] {
        assert_eq!(got[m]["present"], false, "{got:?}");
        assert_eq!(got[m]["layers_sent"], 2, "{m}: {got:?}");
        let sent = got[m]["bytes_sent"].as_u64().unwrap();
        // busybox (compressible) and the data (not): more than the data, less than both.
        assert!(
            sent > data as u64 && sent < data as u64 + 1_982_256,
            "{m} sent {sent} bytes"
        );
    }
    for i in 0..3 {
        assert_eq!(
            image_id_on(&lab, i, &tag_one).as_deref(),
            Some(id.as_str()),
            "Machine {i} has no {tag_one} with the pushed ID"
        );
    }
    assert_eq!(arrivals(&lab, 0), 1);
    assert_eq!(arrivals(&lab, 2), 1);

    // Again: every Machine has it, nothing crosses.
    let out = push(&lab, &[&tag_one]);
    assert!(out.status.success(), "{}", text(&out));
    let got = outcomes(&out);
    assert!(
        got.values()
            .all(|o| o["present"] == true && o["bytes_sent"] == 0),
        "{got:?}"
    );

    // Without --json: a line per Machine as its share moves on (no terminal), and a summary.
    let mut c = lab.cli(0);
    c.env("DOCKER_HOST", LOCAL_DOCKER)
        .args(["image", "push", &tag_one]);
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    for m in ["m0", "m1", "m2"] {
        assert!(
            err.contains(&format!("{m}: offering"))
                && err.contains(&format!("{m}: has it already")),
            "{err}"
        );
    }
    assert!(
        String::from_utf8_lossy(&out.stdout)
            .contains("3 of 3 Machines have it (3 already did); 0 B sent."),
        "{}",
        text(&out)
    );

    // A change to one file: only its layer crosses (the busybox layer is there).
    let two = build(&lab.dir().join("two"), &tag_two, 2, data);
    let out = push(&lab, &[&tag_two, "-m", "m2", "-m", "m1"]);
    assert!(out.status.success(), "{}\n{}", text(&out), logs(&lab));
    let got = outcomes(&out);
    assert_eq!(got.len(), 2, "{got:?}");
    for m in ["m1", "m2"] {
        assert_eq!(got[m]["layers_sent"], 1, "{m}: {got:?}");
        let sent = got[m]["bytes_sent"].as_u64().unwrap();
        assert!(
            sent > data as u64 && sent < data as u64 + 64 * 1024,
            "{m} sent {sent} bytes for a {data}-byte layer"
        );
    }
    assert_eq!(
        image_id_on(&lab, 2, &tag_two).as_deref(),
        Some(two.as_str())
    );
    assert_eq!(image_id_on(&lab, 0, &tag_two), None, "m0 was not asked");

    // `image ls` sees it on each Machine that has it; `image rm` removes it there.
    let v = lab.json(0, &["image", "ls", &tag_two, "--json"]);
    let mut on: Vec<&str> = v["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["machine_name"].as_str().unwrap())
        .collect();
    on.sort();
    assert_eq!(on, ["m1", "m2"], "{v}");
    // An image no Machine has, named first: reported, after the other is removed.
    let out = lab.ployz(0, &["image", "rm", "ployz-nowhere:1", &tag_two]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("no image 'ployz-nowhere:1' on the Machines asked"),
        "{}",
        text(&out)
    );
    for i in 0..3 {
        assert_eq!(image_id_on(&lab, i, &tag_two), None, "Machine {i}");
    }

    // A Machine that does not answer: the others get the image, it is reported (a Partial
    // Result, exit code 3).
    let m2 = own_id(&lab, 2);
    lab.kill_daemon(2);
    let out = push(&lab, &[&tag_two]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut got: Vec<&str> = v[0]["values"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["machine_name"].as_str().unwrap())
        .collect();
    got.sort();
    assert_eq!(got, ["m0", "m1"], "{v}");
    let failures = v[0]["failures"].as_array().unwrap();
    assert_eq!(failures.len(), 1, "{v}");
    assert_eq!(failures[0]["target"], m2.as_str(), "{v}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(&format!("warning: Machine {m2}:")),
        "{}",
        text(&out)
    );
}

/// Removes the host Docker's test images when the test ends, however it ends.
struct RemoveOnDrop(Vec<String>);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        for tag in &self.0 {
            let _ = Command::new("docker")
                .args(["-H", LOCAL_DOCKER, "rmi", "-f", tag])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        }
    }
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_push_cut_off_half_way_leaves_no_half_image_and_the_next_push_completes() {
    let mut lab = cluster(2);
    let tag = format!("ployz-push-test/{}:big", lab.run());
    let _cleanup = RemoveOnDrop(vec![tag.clone()]);
    let id = build(&lab.dir().join("big"), &tag, 3, 96 << 20);
    let tmp = lab.machine_dir(1).join("data/tmp");
    let receiving = |lab: &Lab| {
        wait_for(
            lab,
            "Machine 1's Docker receiving the image",
            Duration::from_secs(60),
            || {
                let receiving = std::fs::read_dir(&tmp).ok()?.flatten().any(|e| {
                    e.file_name()
                        .to_string_lossy()
                        .starts_with("docker-import-")
                        && dir_bytes(&e.path()) > 8 << 20
                });
                receiving.then_some(())
            },
        )
    };
    // Docker gives up on a cut-off archive and removes what it unpacked; no image.
    let let_go = |lab: &Lab| {
        wait_for(
            lab,
            "Machine 1's Docker letting go of the partial archive",
            Duration::from_secs(90),
            || {
                let left = std::fs::read_dir(&tmp)
                    .map(|d| {
                        d.flatten().any(|e| {
                            e.file_name()
                                .to_string_lossy()
                                .starts_with("docker-import-")
                        })
                    })
                    .unwrap_or(false);
                (!left).then_some(())
            },
        );
        assert_eq!(image_id_on(lab, 1, &id), None, "a half image on Machine 1");
    };
    let start_push = |lab: &Lab| {
        let mut c = lab.cli(0);
        c.env("DOCKER_HOST", LOCAL_DOCKER)
            .env("PLOYZ_TRANSFER_STALL_SECONDS", "5")
            .args(["image", "push", &tag, "-m", "m1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c.spawn().unwrap()
    };

    // The CLI killed while bytes arrive.
    let mut cli = start_push(&lab);
    receiving(&lab);
    cli.kill().unwrap();
    cli.wait().unwrap();
    let_go(&lab);

    // The link between the two Machines cut while bytes arrive: the push says so within its
    // stall limit instead of hanging until TCP gives up.
    let cli = start_push(&lab);
    receiving(&lab);
    lab.partition(&[&[0], &[1]]);
    let out = cli.wait_with_output().unwrap();
    assert!(!out.status.success(), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no byte went out for 5 s") && err.contains("the link to it may be cut"),
        "{err}"
    );
    let_go(&lab);
    lab.heal();
    wait_until_whole(&lab, 2, Duration::from_secs(60));

    // The next push completes.
    let out = push(&lab, &[&tag, "-m", "m1"]);
    assert!(out.status.success(), "{}\n{}", text(&out), logs(&lab));
    assert_eq!(image_id_on(&lab, 1, &tag).as_deref(), Some(id.as_str()));
}

/// Bytes of the files under `dir`.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => dir_bytes(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn bad_input_is_refused_before_any_machine_is_asked() {
    let lab = cluster(1);
    // No such image in the local Docker.
    let out = push(&lab, &["ployz-push-test/none:0"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("has no image 'ployz-push-test/none:0'") && err.contains("docker images"),
        "{err}"
    );
    // No local Docker.
    let mut c = lab.cli(0);
    c.env(
        "DOCKER_HOST",
        format!("unix://{}/none.sock", lab.dir().display()),
    )
    .args(["image", "push", "ployz-lab/busybox:latest"]);
    let out = c.output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot reach the local Docker") && err.contains("DOCKER_HOST"),
        "{err}"
    );
    // A Machine that does not exist.
    let tag = format!("ployz-push-test/{}:small", lab.run());
    let _cleanup = RemoveOnDrop(vec![tag.clone()]);
    build(&lab.dir().join("small"), &tag, 4, 1024);
    let out = push(&lab, &[&tag, "-m", "nowhere"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("no Machine is named or has the ID 'nowhere'"),
        "{}",
        text(&out)
    );

    // A build that fails: its lines shown, no Machine changed.
    let dir = lab.dir().join("failing");
    let compose = project(&dir, 6, 1024, "RUN [\"/bin/busybox\", \"false\"]\n");
    let mut c = lab.cli(0);
    c.env("DOCKER_HOST", LOCAL_DOCKER)
        .args(["deploy", "-y", "-f", compose.to_str().unwrap()]);
    let out = c.output().unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the build failed") && err.contains("RUN [\"/bin/busybox\", \"false\"]"),
        "{err}"
    );
    assert!(running_images(&lab).is_empty(), "a container ran");
    // No local Docker to build with.
    let mut c = lab.cli(0);
    c.env(
        "DOCKER_HOST",
        format!("unix://{}/none.sock", lab.dir().display()),
    )
    .args(["deploy", "-y", "-f", compose.to_str().unwrap()]);
    let out = c.output().unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot reach the local Docker"),
        "{}",
        text(&out)
    );
    // A dry run needs no local Docker: the tag is computed, nothing is built.
    let mut c = lab.cli(0);
    c.env(
        "DOCKER_HOST",
        format!("unix://{}/none.sock", lab.dir().display()),
    )
    .args(["deploy", "--dry-run", "-f", compose.to_str().unwrap()]);
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("to build (not in a dry run)"),
        "{}",
        text(&out)
    );
    // A context that is not there: refused before anything else.
    std::fs::remove_dir_all(dir.join("ctx")).unwrap();
    let out = lab.ployz(0, &["deploy", "-y", "-f", compose.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("build.context './ctx': no folder at"),
        "{}",
        text(&out)
    );
    assert!(running_images(&lab).is_empty(), "a container ran");
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_deploy_through_one_machine_has_another_fetch_the_image_from_the_machine_that_has_it() {
    let lab = cluster(3);
    let tag = format!("ployz-push-test/{}:peer", lab.run());
    let _cleanup = RemoveOnDrop(vec![tag.clone()]);
    let id = build(&lab.dir().join("peer"), &tag, 5, 256 << 10);
    // Only Machine 1 has it.
    let out = push(&lab, &[&tag, "-m", "m1"]);
    assert!(out.status.success(), "{}", text(&out));
    assert_eq!(image_id_on(&lab, 2, &tag), None);
    let compose = lab.dir().join("peer.yaml");
    std::fs::write(
        &compose,
        format!(
            "services:\n  job:\n    image: {tag}\n    command: [\"/bin/busybox\", \"sleep\", \"3600\"]\n    x-machines: [m1, m2]\n    deploy:\n      replicas: 2\n"
        ),
    )
    .unwrap();
    let file = compose.to_str().unwrap();
    // The preview shows the fetch as a step, from the Machine that has the image.
    let preview = ok(&lab, 0, &["deploy", "--dry-run", "-f", file]);
    let preview = String::from_utf8_lossy(&preview.stdout).into_owned();
    assert!(
        preview.contains(&format!("⇣ fetch image {tag} on m2 from m1")),
        "{preview}"
    );
    assert!(!preview.contains("on m1 from"), "{preview}");

    let out = ok(&lab, 0, &["deploy", "-y", "--json", "-f", file]);
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let images = report["outcome"]["images"]
        .as_array()
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(images.len(), 1, "{report}");
    let fetched = &images[0];
    assert_eq!(fetched["error"], Value::Null, "{fetched}");
    assert_eq!(fetched["present"], false, "{fetched}");
    assert_eq!(fetched["layers_sent"], 2, "{fetched}");
    let bytes = fetched["bytes"].as_u64().unwrap();
    assert!(bytes > 256 << 10, "{bytes} bytes crossed");
    // Machine 2 fetched it from Machine 1 (daemon to daemon, not through the CLI).
    assert_eq!(image_id_on(&lab, 2, &tag).as_deref(), Some(id.as_str()));
    assert!(
        lab.log(2).contains("an image arrived from a peer"),
        "{}",
        logs(&lab)
    );
    assert_eq!(arrivals(&lab, 0), 0, "Machine 0 was only the entry");
    // Both containers run.
    let ps = lab.json(0, &["ps", "--json"]);
    let running = ps["values"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["service_name"] == "job" && c["state"] == "running")
        .count();
    assert_eq!(running, 2, "{ps}");
}

/// A project folder with a Compose file whose one Service is built from `ctx/`: `FROM scratch`,
/// the busybox binary, then `size` bytes of data made from `seed`; global, so it runs on every
/// Machine.
fn project(dir: &Path, seed: u8, size: usize, extra: &str) -> std::path::PathBuf {
    let ctx = dir.join("ctx");
    std::fs::create_dir_all(&ctx).unwrap();
    std::fs::copy("/bin/busybox", ctx.join("busybox")).unwrap();
    std::fs::write(ctx.join("data"), noise(seed, size)).unwrap();
    std::fs::write(
        ctx.join("Dockerfile"),
        format!("FROM scratch\nCOPY busybox /bin/busybox\nCOPY data /data\n{extra}"),
    )
    .unwrap();
    let compose = dir.join("compose.yaml");
    std::fs::write(
        &compose,
        "services:\n  app:\n    build: ./ctx\n    command: [\"/bin/busybox\", \"sleep\", \"3600\"]\n    deploy:\n      mode: global\n",
    )
    .unwrap();
    compose
}

/// `ployz deploy -y --json -f FILE` through Machine 0 with the lab host's Docker as the local
/// one: (the JSON report, stderr).
fn deploy_built(lab: &Lab, compose: &Path) -> (Value, String) {
    let mut c = lab.cli(0);
    c.env("DOCKER_HOST", LOCAL_DOCKER).args([
        "deploy",
        "-y",
        "--json",
        "-f",
        compose.to_str().unwrap(),
    ]);
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}\n{}", text(&out), logs(lab));
    let report = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON ({e}): {}", text(&out)));
    (report, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The image each Machine's `app` container runs.
fn running_images(lab: &Lab) -> Vec<String> {
    let ps = lab.json(0, &["ps", "--json"]);
    let mut images: Vec<String> = ps["values"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["service_name"] == "app" && c["state"] == "running")
        .map(|c| c["image"].as_str().unwrap().to_owned())
        .collect();
    images.sort();
    images
}

/// A Docker socket in front of the lab host's whose answers arrive at `bytes_per_s` (what the
/// CLI reads, as over a slow uplink; what it sends is not slowed). Stops with the process.
fn slow_docker(lab: &Lab, bytes_per_s: usize) -> String {
    use std::io::{Read, Write};
    use std::os::unix::net::{UnixListener, UnixStream};
    let path = lab.dir().join("slow-docker.sock");
    let listener = UnixListener::bind(&path).unwrap();
    std::thread::spawn(move || {
        for client in listener.incoming().flatten() {
            let Ok(docker) = UnixStream::connect("/var/run/docker.sock") else {
                continue;
            };
            let (mut c_in, mut d_out) = (client.try_clone().unwrap(), docker.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c_in, &mut d_out);
                let _ = d_out.shutdown(std::net::Shutdown::Write);
            });
            let (mut d_in, mut c_out) = (docker, client);
            std::thread::spawn(move || {
                let chunk = (bytes_per_s / 20).max(1);
                let mut buf = vec![0u8; chunk];
                while let Ok(n) = d_in.read(&mut buf) {
                    if n == 0 || c_out.write_all(&buf[..n]).is_err() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                let _ = c_out.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    format!("unix://{}", path.display())
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_built_image_sent_slowly_to_the_only_machine_keeps_the_deploys_lease() {
    // The image reaches the Machine for longer than the lease's 10 s with no other call: the
    // lease is renewed meanwhile, and the Deploy's first operation is still its holder's.
    let lab = cluster(1);
    let dir = lab.dir().join("slow");
    let compose = project(&dir, 9, 20 << 20, "");
    let docker = slow_docker(&lab, 1 << 20);
    let started = std::time::Instant::now();
    let mut c = lab.cli(0);
    c.env("DOCKER_HOST", &docker)
        .args(["deploy", "-y", "--json", "-f", compose.to_str().unwrap()]);
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}\n{}", text(&out), logs(&lab));
    assert!(
        started.elapsed() > Duration::from_secs(12),
        "the transfer was not slow enough to outlast the lease: {:?}",
        started.elapsed()
    );
    assert_eq!(running_images(&lab).len(), 1, "{}", text(&out));
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_service_built_from_its_context_deploys_to_three_machines_and_only_changes_cross_again() {
    let lab = cluster(3);
    let dir = lab.dir().join("app");
    let data = 256 << 10;
    let compose = project(&dir, 1, data, "");
    let (report, stderr) = deploy_built(&lab, &compose);
    let images = report["outcome"]["images"]
        .as_array()
        .unwrap_or_else(|| panic!("{report}"));
    assert_eq!(images.len(), 3, "{report}");
    for i in images {
        assert_eq!(i["error"], Value::Null, "{i}");
        assert_eq!(
            i["transfer"]["from"],
            Value::Null,
            "from the local Docker: {i}"
        );
        assert_eq!(i["layers_sent"], 2, "{i}");
    }
    let first = running_images(&lab);
    assert_eq!(first.len(), 3, "{first:?}");
    assert!(
        first
            .iter()
            .all(|i| i == &first[0] && i.starts_with("app-app:")),
        "{first:?}"
    );
    let _cleanup = RemoveOnDrop(vec![first[0].clone()]);
    assert!(stderr.is_empty(), "--json writes nothing else: {stderr}");

    // Unchanged: nothing is built, nothing crosses, nothing changes.
    let mut c = lab.cli(0);
    c.env("DOCKER_HOST", LOCAL_DOCKER)
        .args(["deploy", "-y", "-f", compose.to_str().unwrap()]);
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("build app → {} from ", first[0]))
            && stderr.contains("built already"),
        "{stderr}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("Services are up to date."),
        "{}",
        text(&out)
    );
    assert_eq!(running_images(&lab), first);

    // One file of the context changed: a new image, and only its changed layer crosses.
    project(&dir, 2, data, "");
    let (report, _) = deploy_built(&lab, &compose);
    let images = report["outcome"]["images"].as_array().unwrap();
    assert_eq!(images.len(), 3, "{report}");
    for i in images {
        assert_eq!(i["layers_sent"], 1, "{i}");
        let bytes = i["bytes"].as_u64().unwrap();
        assert!(
            bytes > data as u64 && bytes < data as u64 + 64 * 1024,
            "{bytes} bytes for a {data}-byte layer: {i}"
        );
    }
    let second = running_images(&lab);
    let _cleanup_two = RemoveOnDrop(vec![second[0].clone()]);
    assert_eq!(second.len(), 3, "{second:?}");
    assert!(
        second.iter().all(|i| i == &second[0] && *i != first[0]),
        "{second:?}"
    );

    // `ployz build --push`: the same tag, built already, on every Machine already.
    let mut c = lab.cli(0);
    c.env("DOCKER_HOST", LOCAL_DOCKER).args([
        "build",
        "--push",
        "--json",
        "-f",
        compose.to_str().unwrap(),
    ]);
    let out = c.output().unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v[0]["service"], "app", "{v}");
    assert_eq!(v[0]["image"], second[0].as_str(), "{v}");
    let pushed = v[0]["pushed"]["values"].as_array().unwrap();
    assert_eq!(pushed.len(), 3, "{v}");
    assert!(pushed.iter().all(|p| p["present"] == true), "{v}");
}

/// Kills a process started by the test when dropped.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn with_registry_auth_a_machine_pulls_with_the_clis_docker_credentials_and_keeps_none() {
    let lab = cluster(1);
    // A registry on Machine 0's loopback (Docker pulls from 127.0.0.0/8 over plain HTTP) that
    // asks for Basic credentials: busybox httpd guarding /v2.
    let www = lab.dir().join("registry");
    std::fs::create_dir_all(www.join("v2")).unwrap();
    // httpd asks for credentials only for what exists.
    std::fs::write(www.join("v2/index.html"), "{}").unwrap();
    let conf = lab.dir().join("registry.conf");
    std::fs::write(&conf, "/v2:alice:s3cret\n").unwrap();
    let _registry = Killed(
        Command::new("nsenter")
            .arg(format!("--net=/var/run/netns/{}", lab.netns(0)))
            .args(["busybox", "httpd", "-f", "-p", "127.0.0.1:5000", "-h"])
            .arg(&www)
            .arg("-c")
            .arg(&conf)
            .spawn()
            .unwrap(),
    );
    wait_for(
        &lab,
        "the registry answering",
        Duration::from_secs(10),
        || {
            let out = lab.exec_in(
                0,
                &["busybox", "wget", "-q", "-O-", "http://127.0.0.1:5000/v2/"],
            );
            String::from_utf8_lossy(&out.stderr)
                .contains("401")
                .then_some(())
        },
    );
    let docker_config = lab.dir().join("docker-config-auth");
    std::fs::create_dir_all(&docker_config).unwrap();
    std::fs::write(
        docker_config.join("config.json"),
        // base64 of alice:s3cret
        r#"{"auths": {"127.0.0.1:5000": {"auth": "YWxpY2U6czNjcmV0"}}}"#,
    )
    .unwrap();
    let compose = lab.dir().join("private.yaml");
    std::fs::write(
        &compose,
        "services:\n  app:\n    image: 127.0.0.1:5000/team/app:1\n",
    )
    .unwrap();
    let deploy = |with: bool| {
        let mut c = lab.cli(0);
        c.env("DOCKER_CONFIG", &docker_config).args([
            "deploy",
            "-y",
            "-f",
            compose.to_str().unwrap(),
        ]);
        if with {
            c.arg("--with-registry-auth");
        }
        c.output().unwrap()
    };
    // Without: Docker is asked for credentials it was not given.
    let out = deploy(false);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(err.contains("no basic auth credentials"), "{err}");
    // With: the registry accepted them (the image itself is not there: it says so instead).
    let out = deploy(true);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !err.contains("no basic auth credentials")
            && !err.contains("unauthorized")
            && err.contains("not found"),
        "{err}"
    );
    // The credentials are kept nowhere and shown nowhere.
    assert!(!text(&out).contains("s3cret"));
    assert!(
        !lab.log(0).contains("s3cret"),
        "the daemon logged the password"
    );
    let mut found = Vec::new();
    let store = lab.machine_dir(0);
    for entry in walk(store) {
        if std::fs::read(&entry)
            .map(|b| b.windows(6).any(|w| w == b"s3cret"))
            .unwrap_or(false)
        {
            found.push(entry);
        }
    }
    assert!(found.is_empty(), "the password is kept in {found:?}");
}

/// Every file under `dir` (the Docker data root's image store left out).
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in entries.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() && !p.ends_with("data/overlay2") => out.extend(walk(&p)),
            Ok(t) if t.is_file() => out.push(p),
            _ => {}
        }
    }
    out
}
