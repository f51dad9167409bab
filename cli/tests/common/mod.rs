//! The end-to-end harness: real `ployz daemon run` processes in temp dirs, driven by the real
//! `ployz` CLI. Everything a test starts is stopped by PID when the test's handles drop.

#![allow(dead_code)]

mod raw_upstream;
#[allow(unused_imports)]
pub use raw_upstream::*;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const PLOYZ: &str = env!("CARGO_BIN_EXE_ployz");

/// A temp dir holding one test's daemons, sockets and CLI config.
pub struct Lab {
    pub dir: tempfile::TempDir,
}

impl Lab {
    pub fn new() -> Lab {
        Lab {
            dir: tempfile::Builder::new()
                .prefix("ployz-e2e-")
                .tempdir()
                .unwrap(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CLI with HOME and config pointed into the lab, and no ambient connection settings.
    pub fn cli(&self) -> Command {
        let mut cmd = Command::new(PLOYZ);
        cmd.env("HOME", self.dir.path())
            .env("XDG_CONFIG_HOME", self.dir.path().join("config"))
            .env_remove("PLOYZ_CONNECT")
            .env_remove("PLOYZ_CONTEXT")
            .env_remove("PLOYZ_CONFIG")
            .env_remove("PLOYZ_SSH_COMMAND")
            .stdin(Stdio::null());
        cmd
    }

    /// Runs the CLI against `daemon`'s socket.
    pub fn ployz(&self, daemon: &Daemon, args: &[&str]) -> Output {
        self.cli()
            .arg("--connect")
            .arg(daemon.connect_url())
            .args(args)
            .output()
            .unwrap()
    }

    /// Starts a daemon whose data dir and socket are named after `name`.
    pub fn daemon(&self, name: &str) -> Daemon {
        Daemon::start(
            self.path(&format!("{name}-data")),
            self.path(&format!("{name}.sock")),
        )
    }
}

/// What test daemons run without: certificate ordering (it would reach for the internet) and
/// the internal DNS on the Machine Gateway (port 53 is one per host; the DNS tests ask for it).
/// None of them runs the mesh ([`spawn_daemon`] adds `--no-mesh`): one WireGuard interface name
/// and firewall chain per network namespace, and these share the host's; the lab's Machines,
/// each in a namespace of its own, run it.
pub const QUIET_DAEMON: &[&str] = &["--no-certificates", "--dns-listen", "off"];

/// A running `ployz daemon run`.
pub struct Daemon {
    pub data_dir: PathBuf,
    pub socket: PathBuf,
    /// The edge's HTTP port on 127.0.0.1, this daemon's own.
    pub http_port: u16,
    /// The edge's HTTPS port on 127.0.0.1.
    pub https_port: u16,
    /// The metrics port on 127.0.0.1.
    pub metrics_port: u16,
    /// Seconds the daemon serves with health 503 after SIGTERM (0 in tests unless asked).
    pub drain_delay: u64,
    /// Flags beyond the ones every test daemon gets.
    args: Vec<String>,
    child: Option<Child>,
    log: PathBuf,
}

impl Daemon {
    pub fn start(data_dir: PathBuf, socket: PathBuf) -> Daemon {
        Daemon::start_with_drain_delay(data_dir, socket, 0)
    }

    pub fn start_with_drain_delay(data_dir: PathBuf, socket: PathBuf, drain_delay: u64) -> Daemon {
        Daemon::start_with(data_dir, socket, drain_delay, QUIET_DAEMON)
    }

    /// A daemon with `args` beside the usual test flags. Without `--no-certificates` among them,
    /// it orders certificates: give it a Certificate Policy pointing at a local ACME server first.
    pub fn start_with(
        data_dir: PathBuf,
        socket: PathBuf,
        drain_delay: u64,
        args: &[&str],
    ) -> Daemon {
        let log = data_dir.with_extension("log");
        let [http_port, https_port, metrics_port] = free_ports();
        let ports = [http_port, https_port, metrics_port];
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        let child = spawn_daemon(&data_dir, &socket, &log, ports, drain_delay, &args);
        let mut d = Daemon {
            data_dir,
            socket,
            http_port,
            https_port,
            metrics_port,
            drain_delay,
            args,
            child: Some(child),
            log,
        };
        d.wait_ready();
        d
    }

    pub fn connect_url(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok()
                && std::net::TcpStream::connect(("127.0.0.1", self.http_port)).is_ok()
            {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "daemon exited early ({status}): {}{}",
                    self.log_text(),
                    self.port_holders()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("daemon not ready within 20 s: {}", self.log_text());
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// When the daemon found one of its ports in use: every socket `ss` lists on those ports,
    /// with its process, for the failure message (the ports were reserved for this test).
    fn port_holders(&self) -> String {
        if !self.log_text().contains("Address already in use") {
            return String::new();
        }
        let ports = [self.http_port, self.https_port, self.metrics_port];
        let filter = ports
            .iter()
            .map(|p| format!("sport = :{p}"))
            .collect::<Vec<_>>()
            .join(" or ");
        match std::process::Command::new("ss")
            .args(["-tuanp", &filter])
            .output()
        {
            Ok(out) => format!(
                "\nsockets on ports {ports:?} (ss -tuanp):\n{}",
                String::from_utf8_lossy(&out.stdout)
            ),
            Err(e) => format!("\n(ss did not run: {e})"),
        }
    }

    /// SIGTERM, a bounded wait, then SIGKILL. Returns whether it stopped on SIGTERM.
    pub fn stop(&mut self) -> bool {
        let Some(mut child) = self.child.take() else {
            return true;
        };
        stop_child(&mut child, Duration::from_secs(10))
    }

    /// The flags after `daemon run` this daemon was started with (`daemon handover` takes
    /// the same).
    pub fn run_flags(&self) -> Vec<String> {
        daemon_flags(
            &self.data_dir,
            &self.socket,
            [self.http_port, self.https_port, self.metrics_port],
            self.drain_delay,
            &self.args,
        )
    }

    /// Where its log goes (appended to by any process started on this data dir).
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Waits up to `within` for the process to exit by itself; its status, or `None`.
    pub fn wait_exited(&mut self, within: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + within;
        loop {
            if let Some(status) = self.child.as_mut()?.try_wait().unwrap() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Starts again after the process was killed from outside.
    pub fn restart_after_kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        self.respawn();
    }

    /// Starts the process again with the same data dir, socket and ports.
    fn respawn(&mut self) {
        self.child = Some(spawn_daemon(
            &self.data_dir,
            &self.socket,
            &self.log,
            [self.http_port, self.https_port, self.metrics_port],
            self.drain_delay,
            &self.args,
        ));
        self.wait_ready();
    }

    /// Stops and starts again on the same data dir and socket with `args` beside the usual
    /// test flags (instead of those it had).
    pub fn restart_with(&mut self, args: &[&str]) {
        self.args = args.iter().map(|a| a.to_string()).collect();
        self.restart();
    }

    /// Stops and starts again on the same data dir and socket.
    pub fn restart(&mut self) {
        assert!(
            self.stop(),
            "daemon did not stop on SIGTERM: {}",
            self.log_text()
        );
        self.respawn();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The flags after `daemon run` every test daemon gets, then `args`.
fn daemon_flags(
    data_dir: &Path,
    socket: &Path,
    [http_port, https_port, metrics_port]: [u16; 3],
    drain_delay: u64,
    args: &[String],
) -> Vec<String> {
    let mut flags: Vec<String> = vec![
        "--data-dir".into(),
        data_dir.display().to_string(),
        "--socket".into(),
        socket.display().to_string(),
        "--http-listen".into(),
        format!("127.0.0.1:{http_port}"),
        "--https-listen".into(),
        format!("127.0.0.1:{https_port}"),
        "--metrics-listen".into(),
        format!("127.0.0.1:{metrics_port}"),
        "--drain-delay".into(),
        drain_delay.to_string(),
        "--max-body-bytes".into(),
        "1048576".into(),
        "--no-mesh".into(),
    ];
    flags.extend(args.iter().cloned());
    flags
}

fn spawn_daemon(
    data_dir: &Path,
    socket: &Path,
    log: &Path,
    ports: [u16; 3],
    drain_delay: u64,
    args: &[String],
) -> Child {
    let log_file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(PLOYZ)
        .args(["daemon", "run"])
        .args(daemon_flags(data_dir, socket, ports, drain_delay, args))
        .env("PLOYZ_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file)
        .spawn()
        .unwrap()
}

/// A child process stopped (SIGTERM, then SIGKILL after 5 s) when dropped, so a failing
/// assertion does not leave it running.
pub struct Reaped(pub Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        stop_child(&mut self.0, Duration::from_secs(5));
    }
}

/// SIGTERM, wait up to `grace`, then SIGKILL. Returns whether SIGTERM sufficed.
pub fn stop_child(child: &mut Child, grace: Duration) -> bool {
    if child.try_wait().unwrap().is_some() {
        return true;
    }
    unsafe {
        libc::kill(child.id() as i32, libc::SIGTERM);
    }
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    false
}

/// stdout as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// stderr as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts a command failed with exactly one line on stderr containing every `needle`.
pub fn assert_one_line_error(o: &Output, needles: &[&str]) {
    let err = stderr(o);
    assert!(
        !o.status.success(),
        "expected failure, got success: {}",
        stdout(o)
    );
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err:?}");
    assert!(err.starts_with("error: "), "{err}");
    for n in needles {
        assert!(err.contains(n), "missing {n:?} in {err:?}");
    }
}

/// Parses stdout as JSON, or panics with both streams.
pub fn json(o: &Output) -> serde_json::Value {
    assert!(
        o.status.success(),
        "command failed: {}{}",
        stdout(o),
        stderr(o)
    );
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", stdout(o)))
}

/// Distinct loopback ports free on TCP and UDP, reserved for this test process (see
/// `ployz_testkit`): no other test binary running beside it is handed the same ones.
#[allow(unused_imports)] // each test binary uses only some of the harness
pub use ployz_testkit::{free_port, free_ports};

/// The test image: Debian's busybox-static imported into Docker (no registry needed). It has
/// `sh`, `httpd`, `wget`, `nc`, `nslookup` and `sleep`.
pub const TEST_IMAGE: &str = "ployz-test/busybox:1";

/// Runs the docker CLI (tests only: the product talks to Docker through its API).
pub fn docker(args: &[&str]) -> Output {
    Command::new("docker")
        .args(args)
        .output()
        .expect("the docker CLI runs")
}

/// Makes [`TEST_IMAGE`] once per test binary.
pub fn ensure_test_image() {
    static ONCE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        assert!(
            docker(&["info"]).status.success(),
            "dockerd is not running; scripts/test.sh starts it"
        );
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../scripts/make-busybox-image.sh"
        );
        let status = Command::new("bash")
            .arg(script)
            .arg(TEST_IMAGE)
            .status()
            .unwrap();
        assert!(status.success(), "{script} failed");
    });
}

/// Removes every container and volume a Machine's daemon created on the shared Docker.
pub fn remove_machine_containers(machine_id: &str) {
    let filter = format!("label=ployz.machine.id={machine_id}");
    let ids = docker(&["ps", "-aq", "--filter", &filter]);
    for id in String::from_utf8_lossy(&ids.stdout).split_whitespace() {
        docker(&["rm", "-f", "-v", id]);
    }
    let vols = docker(&["volume", "ls", "-q", "--filter", &filter]);
    for v in String::from_utf8_lossy(&vols.stdout).split_whitespace() {
        docker(&["volume", "rm", "-f", v]);
    }
}

/// An initialised Machine whose containers are removed when the test ends.
pub struct DockerMachine {
    pub daemon: Daemon,
    pub id: String,
}

impl DockerMachine {
    pub fn new(lab: &Lab, name: &str) -> DockerMachine {
        DockerMachine::with(lab, name, QUIET_DAEMON, &[])
    }

    /// A Machine whose daemon gets `daemon_args` (instead of `--no-certificates`) and whose
    /// `machine init` gets `init_args`.
    pub fn with(lab: &Lab, name: &str, daemon_args: &[&str], init_args: &[&str]) -> DockerMachine {
        ensure_test_image();
        let daemon = Daemon::start_with(
            lab.path(&format!("{name}-data")),
            lab.path(&format!("{name}.sock")),
            0,
            daemon_args,
        );
        let mut args = vec!["machine", "init", "--name", name, "--json"];
        args.extend_from_slice(init_args);
        let init = json(&lab.ployz(&daemon, &args));
        DockerMachine {
            id: init["id"].as_str().unwrap().to_owned(),
            daemon,
        }
    }

    /// Containers of this Machine as `docker ps` sees them: (name, state).
    pub fn docker_containers(&self) -> Vec<(String, String)> {
        let filter = format!("label=ployz.machine.id={}", self.id);
        let out = docker(&[
            "ps",
            "-a",
            "--filter",
            &filter,
            "--format",
            "{{.Names}} {{.State}}",
        ]);
        let mut v: Vec<(String, String)> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_once(' ').map(|(a, b)| (a.to_owned(), b.to_owned())))
            .collect();
        v.sort();
        v
    }
}

impl Drop for DockerMachine {
    fn drop(&mut self) {
        self.daemon.stop();
        remove_machine_containers(&self.id);
    }
}

/// One HTTP/1.1 request to 127.0.0.1:`port` with a Host header; returns (status, body).
pub fn http_get(port: u16, host: &str, path: &str) -> (u16, String) {
    http_request(port, "GET", host, path, "")
}

/// One HTTP/1.1 request on its own connection; a non-empty `body` is sent with its
/// Content-Length. Status 0 when no complete answer came within 10 s (the body then says why).
pub fn http_request(port: u16, method: &str, host: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut s = match std::net::TcpStream::connect(("127.0.0.1", port)) {
        Ok(s) => s,
        Err(e) => return (0, format!("connect: {e}")),
    };
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let length = if body.is_empty() && method == "GET" {
        String::new()
    } else {
        format!("Content-Length: {}\r\n", body.len())
    };
    if let Err(e) = write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {host}\r\n{length}Connection: close\r\n\r\n{body}"
    ) {
        return (0, format!("write: {e}"));
    }
    let mut raw = Vec::new();
    if let Err(e) = s.read_to_end(&mut raw) {
        return (0, format!("read after {} bytes: {e}", raw.len()));
    }
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

/// Runs the CLI against `m` from the lab directory, with a 1 s monitor window.
pub fn run(lab: &Lab, m: &DockerMachine, args: &[&str]) -> Output {
    lab.cli()
        .current_dir(lab.dir.path())
        .env("PLOYZ_HEALTH_MONITOR_PERIOD", "1")
        .arg("--connect")
        .arg(m.daemon.connect_url())
        .args(args)
        .output()
        .unwrap()
}

/// `curl` of `https://host:port/` with `host` resolved to 127.0.0.1, trusting `dir/ca.pem`:
/// (success, stdout, stderr).
pub fn curl_https(
    dir: &std::path::Path,
    port: u16,
    host: &str,
    extra: &[&str],
) -> (bool, String, String) {
    let out = std::process::Command::new("curl")
        .current_dir(dir)
        .args([
            "-sS",
            "-v",
            "--max-time",
            "10",
            "--cacert",
            "ca.pem",
            "--resolve",
        ])
        .arg(format!("{host}:{port}:127.0.0.1"))
        .args(extra)
        .arg(format!("https://{host}:{port}/"))
        .output()
        .expect("curl runs");
    (out.status.success(), stdout(&out), stderr(&out))
}

/// `ployz daemon edge` started by [`edge_alone`]: stopped like [`Reaped`] when dropped, and
/// when that happens in a failing test, the last lines it logged are printed (why it stopped
/// answering, when it did).
pub struct EdgeAlone(pub Child, tempfile::NamedTempFile);

impl Drop for EdgeAlone {
    fn drop(&mut self) {
        let exited = self.0.try_wait().ok().flatten();
        stop_child(&mut self.0, Duration::from_secs(5));
        if std::thread::panicking() {
            let log = std::fs::read_to_string(self.1.path()).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            eprintln!(
                "--- the edge ({}) logged, last lines ---\n{}",
                exited.map_or("running until the test stopped it".to_owned(), |s| format!(
                    "it had exited: {s}"
                )),
                lines[lines.len().saturating_sub(40)..].join("\n")
            );
        }
    }
}

/// Starts `ployz daemon edge` on a free port with one route and waits until it listens.
pub fn edge_alone(route: &str, extra: &[&str]) -> (u16, EdgeAlone) {
    let [port] = free_ports();
    let log = tempfile::NamedTempFile::new().unwrap();
    let child = std::process::Command::new(PLOYZ)
        .args(["daemon", "edge", "--threads", "1", "--no-access-log"])
        .args(extra)
        .arg("--http-listen")
        .arg(format!("127.0.0.1:{port}"))
        .arg("--route")
        .arg(route)
        .stdout(std::process::Stdio::null())
        .stderr(log.reopen().unwrap())
        .spawn()
        .unwrap();
    let child = EdgeAlone(child, log);
    // Ready once it answers HTTP, not once its port accepts: under load, a test's first
    // request on a port that had only just begun to accept was once reset.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !answers_http(port) {
        assert!(
            std::time::Instant::now() < deadline,
            "the edge never answered on its listener"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (port, child)
}

/// A self-signed certificate for `host`, written to `dir` as `tls.pem` with its key as
/// `tls.key`: (certificate file, key file, certificate).
pub fn self_signed(dir: &Path, host: &str) -> (PathBuf, PathBuf, rcgen::Certificate) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec![host.to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let (cert_file, key_file) = (dir.join("tls.pem"), dir.join("tls.key"));
    std::fs::write(&cert_file, cert.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    (cert_file, key_file, cert)
}

/// Waits (10 s at most) until `port` on 127.0.0.1 accepts connections.
pub fn wait_listening(port: u16, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} never listened"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether something on `port` answers an HTTP/1.1 request (the edge's health path) with a
/// status line.
fn answers_http(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /.ployz/health HTTP/1.1\r\nHost: ready.test\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut start = [0u8; 9];
    s.read_exact(&mut start).is_ok() && &start == b"HTTP/1.1 "
}

/// Which of the edge's paths serves what it can: the HTTP/1 fast path (the default), or
/// Pingora's proxy alone (`--no-fast-path`). Edge tests run in both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Position {
    FastPath,
    PingoraOnly,
}

impl Position {
    /// The flags of `ployz daemon run` and `ployz daemon edge` for this position.
    pub fn args(self) -> &'static [&'static str] {
        match self {
            Position::FastPath => &[],
            Position::PingoraOnly => &["--no-fast-path"],
        }
    }
}

/// For each named `fn(Position)`, a module of two tests: `with_the_fast_path` and
/// `through_pingora_only`. A leading attribute (e.g. `#[ignore = "needs dockerd ..."]`) applies
/// to every test made.
#[macro_export]
macro_rules! in_both_positions {
    (@one $(#[$attr:meta])? $name:ident) => {
        mod $name {
            #[test]
            $(#[$attr])?
            fn with_the_fast_path() {
                super::$name($crate::common::Position::FastPath)
            }
            #[test]
            $(#[$attr])?
            fn through_pingora_only() {
                super::$name($crate::common::Position::PingoraOnly)
            }
        }
    };
    (#[$attr:meta] $($name:ident),* $(,)?) => {$(
        $crate::in_both_positions!(@one #[$attr] $name);
    )*};
    ($($name:ident),* $(,)?) => {$(
        $crate::in_both_positions!(@one $name);
    )*};
}

/// [`edge_alone`] in `position`.
pub fn edge_alone_in(position: Position, route: &str, extra: &[&str]) -> (u16, EdgeAlone) {
    edge_alone(route, &[position.args(), extra].concat())
}

/// Runs `cmd` with its stdout the write end of a pipe whose read end is already closed, as
/// `ployz ... | head -1` looks once `head` has its line.
pub fn with_stdout_closed(mut cmd: Command) -> Output {
    let mut fds = [0; 2];
    // SAFETY: pipe writes two descriptors into `fds`; each is owned and closed exactly once.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    unsafe { libc::close(fds[0]) };
    // SAFETY: fds[1] is an open descriptor that nothing else owns.
    let write_end = unsafe { <std::fs::File as std::os::unix::io::FromRawFd>::from_raw_fd(fds[1]) };
    cmd.stdout(Stdio::from(write_end))
        .stderr(Stdio::piped())
        .output()
        .unwrap()
}

/// Runs openssl in `dir` (certificates for the edge's HTTPS tests).
pub fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl runs");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One HTTP/1.1 request to the management API over `socket`, on a connection of its own, with
/// `headers` (each ending in CRLF) beside the usual ones: (status, head, body).
pub fn api_request(
    socket: &Path,
    method: &str,
    path: &str,
    headers: &str,
    body: &[u8],
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: ployz\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).unwrap();
    // The daemon may refuse before reading the whole body: what it answers is what matters.
    let _ = s.write_all(body);
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (status, head.to_owned(), body.to_owned())
}

/// Reads one answer's head from `s` (to the blank line); `None` if the connection ended first.
pub fn answer_head(s: &mut std::net::TcpStream) -> Option<String> {
    use std::io::Read as _;
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        match s.read(&mut byte) {
            Ok(1) => head.push(byte[0]),
            _ => return None,
        }
    }
    Some(String::from_utf8_lossy(&head).into_owned())
}

/// Reads one answer to a request for `/.ployz/verify` (head and the Machine ID as its body).
pub fn verify_answer(s: &mut std::net::TcpStream, id: &str) -> Option<String> {
    use std::io::Read as _;
    let head = answer_head(s)?;
    let mut body = vec![0u8; id.len()];
    s.read_exact(&mut body).ok()?;
    assert_eq!(String::from_utf8_lossy(&body), id, "{head}");
    Some(head)
}

/// A TCP port free on every address now.
pub fn free_tcp_port() -> u16 {
    std::net::TcpListener::bind("0.0.0.0:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Service `raw` whose container answers any HTTP request on 8080 with `raw-tcp`, published as
/// the Ingress Port `port`/tcp.
pub fn raw_tcp_compose(port: u16) -> String {
    format!(
        "services:\n  raw:\n    image: {TEST_IMAGE}\n    command: [\"sh\", \"-c\", \"mkdir -p /www && echo raw-tcp > /www/index.html && exec httpd -f -p 8080 -h /www\"]\n    x-ports: ['{port}:8080/tcp']\n"
    )
}
