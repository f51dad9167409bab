//! The management API's boundary, end to end: calls are bounded when Docker hangs, routes act
//! only on this Machine's containers and volumes, the socket and data files are never open to
//! others, slow clients cannot hold the API, and the framework's refusals, the body limit and a
//! closed stdout are handled as the product's own.

mod common;

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// One request to the API on its own connection: (status, head, body).
fn api(socket: &Path, method: &str, path: &str, body: &[u8]) -> (u16, String, String) {
    api_request(socket, method, path, "", body)
}

/// The API error body of an answer, or a panic showing the answer.
fn api_error(answer: &(u16, String, String)) -> serde_json::Value {
    let (status, head, body) = answer;
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: application/json"),
        "not JSON ({status}): {head}\n{body}"
    );
    let v: serde_json::Value = serde_json::from_str(body)
        .unwrap_or_else(|e| panic!("not an API error ({e}): {status} {body}"));
    assert!(v["code"].is_string() && v["message"].is_string(), "{v}");
    v
}

/// Waits for a child with a deadline, killing it if it overruns; its output and how long it ran.
fn wait_bounded(child: std::process::Child, deadline: Duration) -> (Output, Duration) {
    let started = Instant::now();
    let mut child = Reaped(child);
    while child.0.try_wait().unwrap().is_none() {
        assert!(
            started.elapsed() < deadline,
            "still running after {deadline:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let elapsed = started.elapsed();
    let mut out = Output {
        status: child.0.wait().unwrap(),
        stdout: Vec::new(),
        stderr: Vec::new(),
    };
    if let Some(mut s) = child.0.stdout.take() {
        s.read_to_end(&mut out.stdout).unwrap();
    }
    if let Some(mut s) = child.0.stderr.take() {
        s.read_to_end(&mut out.stderr).unwrap();
    }
    (out, elapsed)
}

/// A "Docker" that accepts connections on a unix socket and never answers: a hung engine.
struct HungDocker {
    path: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HungDocker {
    fn start(path: PathBuf) -> HungDocker {
        let listener = std::os::unix::net::UnixListener::bind(&path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut held = Vec::new();
            while !stopping.load(std::sync::atomic::Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => held.push(stream),
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
            }
        });
        HungDocker {
            path,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for HungDocker {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[test]
fn a_hung_docker_fails_ps_and_deploy_in_bounded_time_naming_its_socket() {
    let lab = Lab::new();
    let fake = HungDocker::start(lab.path("docker.sock"));
    let docker_host = format!("unix://{}", fake.path.display());
    let mut args = QUIET_DAEMON.to_vec();
    args.extend(["--docker-host", docker_host.as_str()]);
    let daemon = Daemon::start_with(lab.path("hung-data"), lab.path("hung.sock"), 0, &args);
    json(&lab.ployz(&daemon, &["machine", "init", "--name", "hung", "--json"]));
    std::fs::write(
        lab.path("compose.yaml"),
        format!("services:\n  web:\n    image: {TEST_IMAGE}\n    command: [sleep, '600']\n"),
    )
    .unwrap();

    let start = |args: &[&str]| {
        lab.cli()
            .current_dir(lab.dir.path())
            .arg("--connect")
            .arg(daemon.connect_url())
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let ps = start(&["ps"]);
    let deploy = start(&["deploy", "-y"]);
    // Each call to Docker is bounded (30 s); without a bound the CLI would wait for ever.
    let (ps, ps_took) = wait_bounded(ps, Duration::from_secs(75));
    let (deploy, deploy_took) = wait_bounded(deploy, Duration::from_secs(75));
    for (name, out, took) in [("ps", &ps, ps_took), ("deploy", &deploy, deploy_took)] {
        let err = stderr(out);
        assert!(!out.status.success(), "{name} succeeded: {}", stdout(out));
        assert!(
            err.contains("Docker did not answer") && err.contains(&docker_host),
            "{name} after {took:?}: {err}"
        );
        assert!(took < Duration::from_secs(70), "{name} took {took:?}");
    }
}

/// What a boundary test creates outside Ployz, removed by name when the test ends.
struct Foreign {
    container: String,
    volume: String,
    image: String,
}

impl Drop for Foreign {
    fn drop(&mut self) {
        docker(&["rm", "-f", "-v", &self.container]);
        docker(&["volume", "rm", "-f", &self.volume]);
        docker(&["rmi", &self.image]);
    }
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn container_and_volume_routes_act_only_on_this_machines() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "boundary");
    let socket = m.daemon.socket.clone();
    let pid = std::process::id();
    let foreign = Foreign {
        container: format!("ployz-boundary-{pid}"),
        volume: format!("ployz-boundary-{pid}"),
        image: format!("ployz-boundary/victim:{pid}"),
    };
    // Another Machine's container on the same engine, a volume and an image made outside Ployz.
    let created = docker(&[
        "run",
        "-d",
        "--name",
        &foreign.container,
        "--label",
        "ployz.machine.id=someone-else",
        TEST_IMAGE,
        "sleep",
        "600",
    ]);
    assert!(created.status.success(), "{}", stderr(&created));
    let id = stdout(&created).trim().to_owned();
    assert!(docker(&["volume", "create", &foreign.volume])
        .status
        .success());
    assert!(docker(&["tag", TEST_IMAGE, &foreign.image])
        .status
        .success());
    let running =
        |id: &str| stdout(&docker(&["inspect", "-f", "{{.State.Running}}", id])).trim() == "true";

    let exec = serde_json::json!({"command": ["touch", "/tmp/pwned"]}).to_string();
    for (method, path, body) in [
        ("POST", format!("/v1/containers/{id}/exec"), exec.as_str()),
        ("GET", format!("/v1/containers/{id}/logs"), ""),
        ("GET", format!("/v1/containers/{id}"), ""),
        ("POST", format!("/v1/containers/{id}/stop"), ""),
        ("POST", format!("/v1/containers/{id}/start"), ""),
        ("DELETE", format!("/v1/containers/{id}"), ""),
    ] {
        let answer = api(&socket, method, &path, body.as_bytes());
        assert_eq!(answer.0, 404, "{method} {path}: {answer:?}");
        let e = api_error(&answer);
        assert_eq!(e["code"], "not_found", "{e}");
        assert!(
            e["message"].as_str().unwrap().contains("on this Machine"),
            "{e}"
        );
    }
    assert!(running(&id), "another Machine's container was touched");
    let touched = docker(&["exec", &foreign.container, "test", "-e", "/tmp/pwned"]);
    assert!(
        !touched.status.success(),
        "exec ran in another Machine's container"
    );

    // Names and IDs never reach Docker's paths unchecked.
    for (path, field) in [
        (format!("/v1/volumes/..%2Fcontainers%2F{id}"), "name"),
        (
            format!(
                "/v1/volumes/..%2Fimages%2F{}",
                foreign.image.replace('/', "%2F")
            ),
            "name",
        ),
        ("/v1/containers/..%2F..%2Fimages%2Fx".to_owned(), "id"),
    ] {
        let answer = api(&socket, "DELETE", &path, b"");
        assert_eq!(answer.0, 400, "{path}: {answer:?}");
        let e = api_error(&answer);
        assert_eq!(e["code"], "invalid_argument", "{e}");
        assert!(
            e["message"]
                .as_str()
                .unwrap()
                .starts_with(&format!("{field} '")),
            "{e}"
        );
    }
    assert!(running(&id), "a traversal reached the container");
    assert!(
        docker(&["image", "inspect", &foreign.image])
            .status
            .success(),
        "a traversal removed an image"
    );

    // `volume ls` lists this Machine's volumes only, and a foreign one cannot be removed.
    let own = format!("boundary-own-{pid}");
    let created = run(&lab, &m, &["volume", "create", &own]);
    assert!(created.status.success(), "{}", stderr(&created));
    let listed = json(&run(&lab, &m, &["volume", "ls", "--json"]))["values"].clone();
    let names: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap())
        .collect();
    assert!(names.contains(&own.as_str()), "{names:?}");
    assert!(!names.contains(&foreign.volume.as_str()), "{names:?}");
    assert!(
        !names.iter().any(|n| !n.starts_with("boundary-own-")),
        "only this Machine's volumes: {names:?}"
    );
    let removed = run(&lab, &m, &["volume", "rm", "-y", &foreign.volume]);
    assert_one_line_error(&removed, &["no volume", &foreign.volume]);
    assert!(
        docker(&["volume", "inspect", &foreign.volume])
            .status
            .success(),
        "a foreign volume was removed"
    );
    let removed = run(&lab, &m, &["volume", "rm", "-y", &own]);
    assert!(removed.status.success(), "{}", stderr(&removed));
}

/// Files and directories under `root` (itself included) whose mode lets others in.
fn open_to_others(root: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.permissions().mode() & 0o007 != 0 {
            found.push(format!(
                "{} {:o}",
                p.display(),
                meta.permissions().mode() & 0o777
            ));
        }
        if meta.is_dir() {
            if let Ok(entries) = std::fs::read_dir(&p) {
                stack.extend(entries.flatten().map(|e| e.path()));
            }
        }
    }
    found
}

#[test]
#[ignore = "needs dockerd: a Machine's init connects to Docker (scripts/test.sh runs it)"]
fn under_a_permissive_umask_no_socket_or_data_file_is_ever_open_to_others() {
    let lab = Lab::new();
    let data_dir = lab.path("umask-data");
    let socket_dir = lab.path("run/ployz");
    let socket = socket_dir.join("ployz.sock");
    let [http, https, metrics] = free_ports();
    let log = std::fs::File::create(lab.path("umask.log")).unwrap();
    let mut daemon = Command::new(PLOYZ);
    daemon
        .args(["daemon", "run", "--no-mesh", "--data-dir"])
        .arg(&data_dir)
        .arg("--socket")
        .arg(&socket)
        .args(["--http-listen", &format!("127.0.0.1:{http}")])
        .args(["--https-listen", &format!("127.0.0.1:{https}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
        .args(["--drain-delay", "0"])
        .args(QUIET_DAEMON)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log);
    // SAFETY: umask is async-signal-safe and touches nothing but the child's mask.
    unsafe {
        use std::os::unix::process::CommandExt;
        daemon.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    let _daemon = Reaped(daemon.spawn().unwrap());

    // Watch the socket and the data dir from the first moment until the daemon answers.
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        seen.extend(open_to_others(&data_dir));
        seen.extend(open_to_others(&lab.path("run")));
        if UnixStream::connect(&socket).is_ok() {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "daemon not ready: {}",
            std::fs::read_to_string(lab.path("umask.log")).unwrap_or_default()
        );
    }
    let url = format!("unix://{}", socket.display());
    let init = lab
        .cli()
        .args([
            "--connect",
            &url,
            "machine",
            "init",
            "--name",
            "umask",
            "--json",
        ])
        .output()
        .unwrap();
    json(&init);
    // The store, the identity and the key now exist; the daemon writes to the store meanwhile.
    for _ in 0..50 {
        seen.extend(open_to_others(&data_dir));
        seen.extend(open_to_others(&lab.path("run")));
    }
    seen.sort();
    seen.dedup();
    assert!(seen.is_empty(), "open to others: {seen:#?}");
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&socket), 0o660, "the socket is for root and its group");
    assert_eq!(
        mode(&socket_dir),
        0o750,
        "the socket's dir is for root and its group"
    );
    assert!(
        std::fs::read_dir(data_dir.join("store")).unwrap().count() > 0,
        "the store was written"
    );
}

/// Opens `n` connections to the socket, each with a request head that never ends.
fn half_sent(socket: &Path, n: usize) -> Vec<UnixStream> {
    (0..n)
        .map(|_| {
            let mut s = UnixStream::connect(socket).unwrap();
            s.write_all(b"GET /v1/version HTTP/1.1\r\nHost: ployz\r\n")
                .unwrap();
            s
        })
        .collect()
}

/// Waits until every stream is closed by the daemon; how long the last one took.
fn wait_closed(streams: Vec<UnixStream>, opened: Instant, deadline: Duration) -> Duration {
    let mut last = Duration::ZERO;
    for mut s in streams {
        let left = deadline.saturating_sub(opened.elapsed());
        s.set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        let mut buf = [0u8; 256];
        loop {
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => continue,
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
                Err(e) => panic!("still open after {:?}: {e}", opened.elapsed()),
            }
        }
        last = opened.elapsed();
    }
    last
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count()
}

#[test]
fn half_sent_requests_are_closed_at_the_header_deadline_and_capped() {
    let lab = Lab::new();
    let mut args = QUIET_DAEMON.to_vec();
    args.extend(["--header-timeout", "2"]);
    let daemon = Daemon::start_with(lab.path("slow-data"), lab.path("slow.sock"), 0, &args);
    // The daemon goes on opening what it starts with (listeners, stores, workers) after its
    // socket answers: the baseline is its count once a request was served and two readings
    // 200 ms apart agree, not the count of the first moment.
    let version = lab.ployz(&daemon, &["version", "--json"]);
    assert!(version.status.success(), "{}", stderr(&version));
    let settled = Instant::now() + Duration::from_secs(10);
    let mut baseline = open_fds(daemon.pid());
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = open_fds(daemon.pid());
        if now == baseline || Instant::now() > settled {
            baseline = baseline.max(now);
            break;
        }
        baseline = now;
    }

    let opened = Instant::now();
    let held = half_sent(&daemon.socket, 100);
    // A normal request is served while they are held.
    let version = lab.ployz(&daemon, &["version", "--json"]);
    assert!(version.status.success(), "{}", stderr(&version));
    let took = wait_closed(held, opened, Duration::from_secs(15));
    assert!(
        took >= Duration::from_millis(1500),
        "closed before the deadline: {took:?}"
    );

    // A whole head and a body that never comes: 408 within twice the header deadline, then
    // the connection closes.
    let opened = Instant::now();
    let mut withheld: Vec<UnixStream> = (0..20)
        .map(|_| {
            let mut s = UnixStream::connect(&daemon.socket).unwrap();
            s.write_all(
                b"POST /v1/lease HTTP/1.1\r\nHost: ployz\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"holder\"",
            )
            .unwrap();
            s
        })
        .collect();
    let first = withheld.remove(0);
    let mut answer = String::new();
    first
        .try_clone()
        .unwrap()
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    (&first).read_to_string(&mut answer).unwrap();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("did not arrive within 4 s"), "{answer}");
    let took = wait_closed(withheld, opened, Duration::from_secs(15));
    assert!(
        took >= Duration::from_millis(3500),
        "closed before the body deadline: {took:?}"
    );

    // Past the cap, connections wait to be accepted instead of each holding a descriptor.
    let opened = Instant::now();
    let held = half_sent(&daemon.socket, 300);
    let mut most = 0;
    while opened.elapsed() < Duration::from_millis(1500) {
        most = most.max(open_fds(daemon.pid()));
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        most <= baseline + 256 + 16,
        "{most} descriptors for 300 slow clients (baseline {baseline})"
    );
    wait_closed(held, opened, Duration::from_secs(20));
    let version = lab.ployz(&daemon, &["version", "--json"]);
    assert!(version.status.success(), "{}", stderr(&version));
}

#[test]
fn framework_refusals_are_api_errors_naming_the_field() {
    let lab = Lab::new();
    let daemon = lab.daemon("refusals");
    let socket = &daemon.socket;
    let id = "0123456789abcdef";

    let unknown = api(
        socket,
        "POST",
        &format!("/v1/containers/{id}/exec"),
        br#"{"command":["true"],"comand":["x"]}"#,
    );
    assert_eq!(unknown.0 / 100, 4, "{unknown:?}");
    let e = api_error(&unknown);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("unknown field `comand`"),
        "{e}"
    );

    let init = api(socket, "POST", "/v1/machines/init", br#"{"nmae":"x"}"#);
    assert_eq!(init.0, 400, "{init:?}");
    assert!(api_error(&init)["message"]
        .as_str()
        .unwrap()
        .contains("unknown field `nmae`"));

    let not_json = api(
        socket,
        "POST",
        &format!("/v1/containers/{id}/exec"),
        b"{not json",
    );
    assert_eq!(not_json.0, 400, "{not_json:?}");
    assert!(api_error(&not_json)["message"]
        .as_str()
        .unwrap()
        .contains("not JSON"));

    let query = api(socket, "GET", "/v1/volumes/abc?force=true", b"");
    assert_eq!(query.0, 405, "{query:?}");
    let e = api_error(&query);
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("GET is not allowed on /v1/volumes/abc"),
        "{e}"
    );

    let query = api(socket, "DELETE", "/v1/volumes/abc?forse=true", b"");
    assert_eq!(query.0, 400, "{query:?}");
    assert!(api_error(&query)["message"]
        .as_str()
        .unwrap()
        .contains("unknown field `forse`"));

    let method = api(socket, "PUT", "/v1/version", b"");
    assert_eq!(method.0, 405, "{method:?}");
    assert!(api_error(&method)["message"]
        .as_str()
        .unwrap()
        .contains("PUT is not allowed on /v1/version"));

    let big = format!(r#"{{"command":["{}"]}}"#, "x".repeat(10 << 20));
    let too_large = api(
        socket,
        "POST",
        &format!("/v1/containers/{id}/exec"),
        big.as_bytes(),
    );
    assert_eq!(too_large.0, 413, "{:?}", too_large.1);
    assert!(api_error(&too_large)["message"]
        .as_str()
        .unwrap()
        .contains("over the API's body limit of 2097152 bytes (2 MiB)"));
}

#[test]
#[ignore = "needs dockerd (scripts/test.sh runs it)"]
fn a_request_over_the_body_limit_is_refused_before_sending_in_the_dry_run_too() {
    let lab = Lab::new();
    let m = DockerMachine::new(&lab, "bodylimit");
    std::fs::write(
        lab.path("compose.yaml"),
        format!(
            "services:\n  big:\n    image: {TEST_IMAGE}\n    command: [sh, -c, 'echo {}']\n",
            "x".repeat(10 << 20)
        ),
    )
    .unwrap();
    for args in [&["deploy", "--dry-run"][..], &["deploy", "-y"][..]] {
        let out = run(&lab, &m, args);
        assert_one_line_error(
            &out,
            &[
                "service 'big'",
                "over the API's body limit of 2097152 bytes (2 MiB)",
            ],
        );
    }
    assert!(m.docker_containers().is_empty(), "nothing ran");
}

#[test]
fn a_closed_stdout_ends_the_cli_quietly() {
    let lab = Lab::new();
    let daemon = lab.daemon("pipe");
    let mut version = lab.cli();
    version.args(["--connect", &daemon.connect_url(), "version", "--json"]);
    let mut completion = lab.cli();
    completion.args(["completion", "bash"]);
    for cmd in [version, completion] {
        let shown = format!("{cmd:?}");
        let out = with_stdout_closed(cmd);
        assert!(
            out.status.success(),
            "{shown}: {:?} {}",
            out.status,
            stderr(&out)
        );
        assert_eq!(stderr(&out), "", "{shown}");
    }
}
