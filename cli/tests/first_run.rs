//! What a new user meets first: the daemon's messages about its listeners, `ployz daemon edge`
//! leaving nothing behind, the help of `daemon run`, and the forms `logs --since` takes.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Waits until `port` on loopback accepts a connection, or panics after 10 s.
fn wait_listening(port: u16, child: &mut std::process::Child) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the process exited before listening"
        );
        assert!(Instant::now() < deadline, "nothing listened on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn the_edge_alone_leaves_nothing_in_the_temporary_directory() {
    let lab = Lab::new();
    for signal in [libc::SIGTERM, libc::SIGINT] {
        let tmp = lab.path(&format!("tmp-{signal}"));
        std::fs::create_dir_all(&tmp).unwrap();
        let [port] = free_ports();
        let child = Command::new(PLOYZ)
            .args(["daemon", "edge", "--threads", "1", "--no-access-log"])
            .arg("--http-listen")
            .arg(format!("127.0.0.1:{port}"))
            .args(["--route", "app.test=127.0.0.1:9"])
            .env("TMPDIR", &tmp)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut edge = Reaped(child);
        wait_listening(port, &mut edge.0);
        unsafe {
            libc::kill(edge.0.id() as i32, signal);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while edge.0.try_wait().unwrap().is_none() {
            assert!(Instant::now() < deadline, "the edge did not stop");
            std::thread::sleep(Duration::from_millis(20));
        }
        let left: Vec<_> = std::fs::read_dir(&tmp)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(
            left.is_empty(),
            "left behind after signal {signal}: {left:?}"
        );
    }
}

#[test]
fn a_listener_in_use_is_named_by_what_it_serves() {
    let lab = Lab::new();
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let held_port = held.local_addr().unwrap().port();
    let [http, https] = free_ports();
    let out = lab
        .cli()
        .args(["daemon", "run", "--no-certificates", "--dns-listen", "off"])
        .arg("--data-dir")
        .arg(lab.path("data"))
        .arg("--socket")
        .arg(lab.path("ployz.sock"))
        .args(["--http-listen", &format!("127.0.0.1:{http}")])
        .args(["--https-listen", &format!("127.0.0.1:{https}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{held_port}")])
        .output()
        .unwrap();
    assert!(!out.status.success(), "the daemon started on a held port");
    let err = stderr(&out);
    assert!(
        err.contains(&format!(
            "the metrics listener cannot listen on 127.0.0.1:{held_port} (metrics_listen)"
        )),
        "{err}"
    );
    assert!(err.contains("--metrics-listen"), "{err}");
    assert!(!err.contains("the edge cannot"), "{err}");
}

#[test]
fn daemon_run_help_lists_only_daemon_options() {
    let lab = Lab::new();
    let out = lab
        .cli()
        .args(["daemon", "run", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = stdout(&out);
    assert!(help.contains("--data-dir"), "{help}");
    assert!(!help.contains("--connect"), "{help}");
    assert!(!help.contains("--context"), "{help}");
    let out = lab.cli().args(["ps", "--help"]).output().unwrap();
    assert!(stdout(&out).contains("--connect"));
}

#[test]
#[ignore = "needs dockerd: a Machine's init connects to Docker (scripts/test.sh runs it)"]
fn logs_since_takes_durations_and_rfc3339_times() {
    let lab = Lab::new();
    let out = lab
        .cli()
        .args(["logs", "web", "--since", "ten minutes"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("'ten minutes' is not a time"), "{err}");
    assert!(err.contains("10m") && err.contains("RFC 3339"), "{err}");

    let daemon = lab.daemon("m1");
    let init = lab.ployz(&daemon, &["machine", "init", "--name", "m1"]);
    assert!(init.status.success(), "{}", stderr(&init));
    for since in ["10m", "1h30m", "2026-12-01T10:00:00Z", "1733050000"] {
        let out = lab.ployz(&daemon, &["logs", "no-such-service", "--since", since]);
        // Accepted as a time: what fails is the lookup of the Service, not the flag.
        assert_eq!(out.status.code(), Some(1), "{since}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("no-such-service"),
            "{since}: {}",
            stderr(&out)
        );
    }
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn a_deploy_whose_reader_has_gone_still_runs_to_its_outcome() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "piped");
    std::fs::write(
        lab.path("compose.yaml"),
        format!(
            "services:\n  quiet:\n    image: {TEST_IMAGE}\n    command: [\"sleep\", \"3600\"]\n"
        ),
    )
    .unwrap();
    let mut deploy = lab.cli();
    deploy
        .current_dir(lab.dir.path())
        .env("PLOYZ_HEALTH_MONITOR_PERIOD", "0")
        .args(["--connect", &m.daemon.connect_url(), "deploy", "-y"]);
    let out = with_stdout_closed(deploy);
    // The preview was the first line nobody read; the Deploy went on and succeeded.
    assert!(out.status.success(), "{:?} {}", out.status, stderr(&out));
    // Progress goes to stderr, which is still read.
    assert!(stderr(&out).contains("done: quiet-"), "{}", stderr(&out));
    assert!(!stderr(&out).contains("panicked"), "{}", stderr(&out));
    let running: Vec<_> = m
        .docker_containers()
        .into_iter()
        .filter(|(name, state)| name.starts_with("quiet-") && state == "running")
        .collect();
    assert_eq!(running.len(), 1, "{running:?}");

    // An exec's output is held by the daemon: past its limit it is cut, and says so.
    let exec = lab
        .cli()
        .args(["--connect", &m.daemon.connect_url(), "exec", "quiet", "--"])
        .args(["sh", "-c", "yes | head -c 9000000"])
        .output()
        .unwrap();
    assert_eq!(exec.stdout.len(), 8 << 20, "{}", stderr(&exec));
    assert!(
        stderr(&exec).contains("the output was cut at 8 MiB"),
        "{}",
        stderr(&exec)
    );
}
