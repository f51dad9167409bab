//! `ployz machine init|ls` and the daemon's lifecycle, end to end through real processes.

mod common;

use common::*;

#[test]
#[ignore = "needs dockerd: a Machine's init connects to Docker (scripts/test.sh runs it)"]
fn init_then_ls_then_restart_keeps_the_machine() {
    let lab = Lab::new();
    let mut daemon = lab.daemon("m1");

    let version = json(&lab.ployz(&daemon, &["version", "--json"]));
    assert_eq!(version["daemon"]["phase"], "uninitialized");

    let init = json(&lab.ployz(&daemon, &["machine", "init", "--name", "alpha", "--json"]));
    assert_eq!(init["name"], "alpha");
    assert_eq!(init["phase"], "participating");
    assert_eq!(init["subnet"], "10.210.0.0/24");
    let id = init["id"].as_str().unwrap().to_owned();
    assert_eq!(id.len(), 32);

    // The private key is 0600 and matches nothing else in the data dir.
    use std::os::unix::fs::PermissionsExt;
    let key = daemon.data_dir.join("wireguard.key");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);

    let ls = json(&lab.ployz(&daemon, &["machine", "ls", "--json"]));
    assert_eq!(ls["values"].as_array().unwrap().len(), 1);
    assert_eq!(ls["values"][0]["id"], id.as_str());
    assert_eq!(ls["values"][0]["membership"], "up");
    assert_eq!(ls["failures"].as_array().unwrap().len(), 0);
    // What its edge enforces, which a Deploy checks on every Machine before it relies on it.
    assert_eq!(
        ls["values"][0]["edge_features"],
        serde_json::json!(["routes", "route-auth", "route-limits", "ingress-ports"])
    );

    daemon.restart();

    let ls = json(&lab.ployz(&daemon, &["machine", "ls", "--json"]));
    assert_eq!(ls["values"][0]["id"], id.as_str());
    assert_eq!(ls["values"][0]["name"], "alpha");
    assert_eq!(ls["values"][0]["phase"], "participating");

    let table = lab.ployz(&daemon, &["machine", "ls"]);
    let text = stdout(&table);
    assert!(text.starts_with("NAME"), "{text}");
    assert!(text.contains("alpha") && text.contains(&id), "{text}");
}

#[test]
#[ignore = "needs dockerd: a Machine's init connects to Docker (scripts/test.sh runs it)"]
fn bad_input_gets_a_one_line_error_and_a_nonzero_exit() {
    let lab = Lab::new();
    let daemon = lab.daemon("m1");

    let out = lab.ployz(&daemon, &["machine", "init", "--name", "web_1"]);
    assert_one_line_error(
        &out,
        &["--name", "Machine Name 'web_1'", "only lowercase letters"],
    );

    let out = lab.ployz(&daemon, &["machine", "init", "--name", &"x".repeat(64)]);
    assert_one_line_error(&out, &["the limit is 63"]);

    let out = lab.ployz(&daemon, &["machine", "ls"]);
    assert_one_line_error(&out, &["not initialised", "run `ployz machine init` first"]);

    assert!(lab
        .ployz(&daemon, &["machine", "init", "--name", "one"])
        .status
        .success());
    let out = lab.ployz(&daemon, &["machine", "init", "--name", "two"]);
    assert_one_line_error(&out, &["already initialised as 'one'"]);

    // Test daemons run without the internal DNS: asking it says so instead of "no such name".
    let out = lab.ployz(&daemon, &["dns", "lookup", "web.internal"]);
    assert_one_line_error(&out, &["internal DNS is off", "--dns-listen"]);
    let out = lab.ployz(
        &daemon,
        &["dns", "lookup", "web.internal", "--type", "BOGUS"],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("--type"), "{}", stderr(&out));

    // Certificate Policy values a daemon cannot follow are refused, naming the value.
    let out = lab.ployz(&daemon, &["cert", "policy", "set", "--backoff-max", "400d"]);
    assert_one_line_error(&out, &["backoff_max_secs", "30 days"]);
    let out = lab.ployz(&daemon, &["machine", "update", "--public-ip", "not-an-ip"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("not-an-ip"), "{}", stderr(&out));
    let out = lab.ployz(
        &daemon,
        &["machine", "update", "--public-ip", "203.0.113.9", "--json"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(json(&out)["addresses"][0], "203.0.113.9");

    let missing = lab.path("nowhere.sock");
    let out = lab
        .cli()
        .args([
            "--connect",
            &format!("unix://{}", missing.display()),
            "machine",
            "ls",
        ])
        .output()
        .unwrap();
    assert_one_line_error(
        &out,
        &["cannot reach the daemon", "is `ployz daemon run` running?"],
    );

    let out = lab
        .cli()
        .args(["--connect", "tcp://1.2.3.4:5", "machine", "ls"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("write unix:///"), "{}", stderr(&out));
}

#[test]
fn a_second_daemon_on_the_same_socket_is_refused_and_sigterm_cleans_up() {
    let lab = Lab::new();
    let mut daemon = lab.daemon("m1");
    let second = lab
        .cli()
        .args(["daemon", "run", "--data-dir"])
        .arg(lab.path("other-data"))
        .arg("--socket")
        .arg(&daemon.socket)
        .output()
        .unwrap();
    assert!(!second.status.success());
    assert!(
        stderr(&second).contains("already listening"),
        "{}",
        stderr(&second)
    );

    let bad_config = lab.path("bad.toml");
    std::fs::write(&bad_config, "sockett = \"/x\"\n").unwrap();
    let out = lab
        .cli()
        .args(["daemon", "run", "--config"])
        .arg(&bad_config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(stderr(&out).contains("sockett"), "{}", stderr(&out));

    assert!(daemon.stop(), "SIGTERM did not stop the daemon");
    assert!(
        !daemon.socket.exists(),
        "socket left behind: {}",
        daemon.log_text()
    );
}

#[test]
#[ignore = "needs dockerd: a Machine's init connects to Docker (scripts/test.sh runs it)"]
fn contexts_choose_the_connection_and_fall_through_dead_ones() {
    let lab = Lab::new();
    let daemon = lab.daemon("m1");
    let dead = format!("unix://{}", lab.path("dead.sock").display());

    let add = lab
        .cli()
        .args(["ctx", "add", "lab", &dead, &daemon.connect_url()])
        .output()
        .unwrap();
    assert!(add.status.success(), "{}", stderr(&add));

    let ls = json(&lab.cli().args(["ctx", "ls", "--json"]).output().unwrap());
    assert_eq!(ls[0]["name"], "lab");
    assert_eq!(ls[0]["current"], true);
    assert_eq!(ls[0]["connections"][1], daemon.connect_url().as_str());

    // No --connect: the current context is used, and its dead first connection skipped.
    let out = lab
        .cli()
        .args(["machine", "init", "--name", "via-ctx"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));

    let show = json(&lab.cli().args(["ctx", "show", "--json"]).output().unwrap());
    assert_eq!(show["name"], "lab");

    // A first connection reaching an uninitialised Machine (one removed from the Cluster resets
    // itself) is passed over, with a warning, for the next that reaches an initialised one.
    let gone = lab.daemon("gone");
    let add = lab
        .cli()
        .args([
            "ctx",
            "add",
            "after-rm",
            &gone.connect_url(),
            &daemon.connect_url(),
        ])
        .output()
        .unwrap();
    assert!(add.status.success(), "{}", stderr(&add));
    let ls = lab
        .cli()
        .args(["-c", "after-rm", "machine", "ls", "--json"])
        .output()
        .unwrap();
    assert!(ls.status.success(), "{}", stderr(&ls));
    assert_eq!(json(&ls)["values"][0]["name"], "via-ctx");
    let warned = stderr(&ls);
    assert!(
        warned.contains(&format!(
            "warning: passed over: {} reaches a Machine that is not initialised",
            gone.connect_url()
        )) && warned.contains(&format!("; using {}", daemon.connect_url())),
        "{warned}"
    );
    // `machine init` is meant for an uninitialised Machine: it takes the first that answers.
    let init = lab
        .cli()
        .args(["-c", "after-rm", "machine", "init", "--name", "second"])
        .output()
        .unwrap();
    assert!(init.status.success(), "{}", stderr(&init));
    let version = json(&lab.ployz(&gone, &["version", "--json"]));
    assert!(version["daemon"]["machine"].is_string(), "{version}");

    let out = lab.cli().args(["ctx", "use", "nope"]).output().unwrap();
    assert_one_line_error(
        &out,
        &[
            "context 'nope' does not exist",
            "known contexts: after-rm, lab",
        ],
    );

    let out = lab
        .cli()
        .args(["-c", "nope", "machine", "ls"])
        .output()
        .unwrap();
    assert_one_line_error(&out, &["context 'nope' does not exist"]);

    let completion = lab.cli().args(["completion", "bash"]).output().unwrap();
    assert!(stdout(&completion).contains("ployz"));
}

#[test]
#[ignore = "needs dockerd: a Machine's init connects to Docker (scripts/test.sh runs it)"]
fn sigterm_answers_503_for_the_drain_delay_while_serving_then_stops() {
    let lab = Lab::new();
    let mut daemon = Daemon::start_with_drain_delay(lab.path("d-data"), lab.path("d.sock"), 2);
    assert!(lab
        .ployz(&daemon, &["machine", "init", "--name", "term"])
        .status
        .success());
    let port = daemon.http_port;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while http_get(port, "x", "/.ployz/health").0 != 200 {
        assert!(std::time::Instant::now() < deadline, "never healthy");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // SAFETY: a signal to the daemon this test started.
    unsafe {
        libc::kill(daemon.pid() as i32, libc::SIGTERM);
    }
    // Still serving, but telling load balancers to go away: health turns to 503 once the
    // signal is handled (the 2 s drain delay leaves the listeners open meanwhile).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (status, body) = loop {
        let answer = http_get(port, "x", "/.ployz/health");
        if answer.0 != 200 || std::time::Instant::now() > deadline {
            break answer;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("draining"), "{body}");
    assert_eq!(http_get(port, "x", "/.ployz/verify").0, 200);
    // After the delay the listeners close and the process exits on that first SIGTERM
    // (`stop` waits a bounded time and says whether it had to SIGKILL).
    assert!(
        daemon.stop(),
        "the daemon did not exit after its drain delay"
    );
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_err());
}
