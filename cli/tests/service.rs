//! The daemon started the way its systemd unit starts it (`Type=notify`): with `$NOTIFY_SOCKET`
//! naming a datagram socket this test listens on, as the service manager would. READY=1 must
//! come only once the management API answers and the edge's listeners accept; STATUS= lines
//! before it; WATCHDOG=1 while it runs with a watchdog; STOPPING=1 when it is told to stop.

mod common;

use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// The messages of one daemon, as they arrive.
struct Manager {
    socket: UnixDatagram,
    seen: Vec<String>,
}

impl Manager {
    /// The next message, or `None` after `within`.
    fn next(&mut self, within: Duration) -> Option<String> {
        self.socket.set_read_timeout(Some(within)).unwrap();
        let mut buf = vec![0u8; 4096];
        let n = self.socket.recv(&mut buf).ok()?;
        let message = String::from_utf8_lossy(&buf[..n]).into_owned();
        self.seen.push(message.clone());
        Some(message)
    }

    /// Waits for a message with the assignment `wanted` (`READY=1`), returning it.
    fn wait_for(&mut self, wanted: &str, within: Duration, child: &mut Reaped) -> String {
        let deadline = Instant::now() + within;
        loop {
            assert!(
                child.0.try_wait().unwrap().is_none(),
                "the daemon exited; it said: {:?}",
                self.seen
            );
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "no {wanted} within {within:?}; the daemon said: {:?}",
                self.seen
            );
            if let Some(m) = self.next(left.min(Duration::from_millis(200))) {
                if m.lines().any(|l| l == wanted) {
                    return m;
                }
            }
        }
    }
}

#[test]
fn ready_comes_once_the_api_answers_and_the_edge_accepts_and_the_watchdog_is_fed() {
    let lab = Lab::new();
    let notify = lab.path("notify");
    let manager = UnixDatagram::bind(&notify).unwrap();
    let mut manager = Manager {
        socket: manager,
        seen: Vec::new(),
    };
    let socket = lab.path("ployz.sock");
    let [http, https, metrics] = free_ports();
    let log = std::fs::File::create(lab.path("daemon.log")).unwrap();
    let child = Command::new(PLOYZ)
        .args(["daemon", "run", "--data-dir"])
        .arg(lab.path("data"))
        .arg("--socket")
        .arg(&socket)
        .args(["--http-listen", &format!("127.0.0.1:{http}")])
        .args(["--https-listen", &format!("127.0.0.1:{https}")])
        .args(["--metrics-listen", &format!("127.0.0.1:{metrics}")])
        .args(["--drain-delay", "0", "--no-mesh"])
        .args(QUIET_DAEMON)
        .env("NOTIFY_SOCKET", &notify)
        .env("WATCHDOG_USEC", "400000")
        .env("PLOYZ_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    let mut daemon = Reaped(child);
    let pid = daemon.0.id();

    let ready = manager.wait_for("READY=1", Duration::from_secs(20), &mut daemon);
    // At the moment READY=1 arrives, everything it promises is there: the daemon is frozen on
    // the spot, and the edge's listeners must already be listening (a READY=1 sent early, before
    // Pingora binds them, fails here).
    unsafe {
        libc::kill(pid as i32, libc::SIGSTOP);
    }
    let listening = [http, https].map(|port| {
        let out = Command::new("ss")
            .args(["-ltnH", &format!("sport = :{port}")])
            .output()
            .expect("ss runs");
        !String::from_utf8_lossy(&out.stdout).trim().is_empty()
    });
    unsafe {
        libc::kill(pid as i32, libc::SIGCONT);
    }
    assert_eq!(
        listening,
        [true, true],
        "the edge's listeners (HTTP {http}, HTTPS {https}) at READY=1"
    );
    let (status, _, body) = api_request(&socket, "GET", "/v1/version", "", b"");
    assert_eq!(status, 200, "the API did not answer at READY=1: {body}");
    for port in [http, https] {
        std::net::TcpStream::connect(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("the edge's port {port} refused at READY=1: {e}"));
    }
    assert!(
        ready.lines().any(|l| l == format!("MAINPID={pid}")),
        "READY=1 names the main process: {ready:?}"
    );
    let before: Vec<_> = manager.seen[..manager.seen.len() - 1].to_vec();
    assert!(
        before.iter().any(|m| m.starts_with("STATUS=")),
        "STATUS= lines come while starting: {before:?}"
    );
    assert!(
        !before.iter().any(|m| m.contains("READY=1")),
        "READY=1 once: {before:?}"
    );

    // Half the watchdog's period: a keep-alive comes, and keeps coming.
    for _ in 0..2 {
        manager.wait_for("WATCHDOG=1", Duration::from_secs(5), &mut daemon);
    }

    unsafe {
        libc::kill(pid as i32, libc::SIGTERM);
    }
    manager.wait_for("STOPPING=1", Duration::from_secs(10), &mut daemon);
    let deadline = Instant::now() + Duration::from_secs(20);
    while daemon.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the daemon did not stop");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn without_a_service_manager_nothing_is_sent_and_nothing_waits() {
    // A daemon run by hand (no $NOTIFY_SOCKET) starts as before: the harness's own readiness
    // check is the API and the edge answering.
    let lab = Lab::new();
    let daemon = lab.daemon("plain");
    let (status, _, _) = api_request(&daemon.socket, "GET", "/v1/version", "", b"");
    assert_eq!(status, 200);
    assert!(
        !daemon.log_text().contains("told the service manager"),
        "{}",
        daemon.log_text()
    );
}

#[test]
fn a_handover_tells_the_service_manager_the_new_main_process_and_keeps_the_watchdog_fed() {
    let lab = Lab::new();
    let notify = lab.path("notify");
    let mut manager = Manager {
        socket: UnixDatagram::bind(&notify).unwrap(),
        seen: Vec::new(),
    };
    let socket = lab.path("ployz.sock");
    let [http, https, metrics] = free_ports();
    let flags: Vec<String> = [
        "--data-dir".to_owned(),
        lab.path("data").display().to_string(),
        "--socket".to_owned(),
        socket.display().to_string(),
        "--http-listen".to_owned(),
        format!("127.0.0.1:{http}"),
        "--https-listen".to_owned(),
        format!("127.0.0.1:{https}"),
        "--metrics-listen".to_owned(),
        format!("127.0.0.1:{metrics}"),
        "--drain-delay".to_owned(),
        "0".to_owned(),
        "--no-mesh".to_owned(),
    ]
    .into_iter()
    .chain(QUIET_DAEMON.iter().map(|s| s.to_string()))
    .collect();
    let log = std::fs::File::create(lab.path("daemon.log")).unwrap();
    let child = Command::new(PLOYZ)
        .args(["daemon", "run"])
        .args(&flags)
        .env("NOTIFY_SOCKET", &notify)
        .env("WATCHDOG_USEC", "400000")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log.try_clone().unwrap())
        .spawn()
        .unwrap();
    let mut old = Reaped(child);
    let old_pid = old.0.id();
    manager.wait_for("READY=1", Duration::from_secs(20), &mut old);

    // As a unit's reload runs: $NOTIFY_SOCKET, but no $WATCHDOG_USEC (only the first process
    // gets it).
    let out = Command::new(PLOYZ)
        .args(["daemon", "handover"])
        .args(&flags)
        .env("NOTIFY_SOCKET", &notify)
        .env_remove("WATCHDOG_USEC")
        .stderr(log)
        .output()
        .unwrap();
    let new_pid: u32 = std::fs::read_to_string(lab.path("data/run/daemon.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let mut new = Reaped(
        // Not our child: stopped by PID at the end (Reaped needs a Child, so a watcher).
        Command::new("tail")
            .args(["--pid", &new_pid.to_string(), "-f", "/dev/null"])
            .spawn()
            .unwrap(),
    );
    let _kill_new = scopeguard_kill(new_pid);
    assert!(out.status.success(), "{}", stderr(&out));
    assert_ne!(new_pid, old_pid);
    let ready = manager.wait_for("READY=1", Duration::from_secs(20), &mut new);
    assert!(
        ready.lines().any(|l| l == format!("MAINPID={new_pid}")),
        "the new process names itself the main process: {ready:?}"
    );
    // The old one retires without telling the service manager it stops.
    let deadline = Instant::now() + Duration::from_secs(20);
    while old.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "the old process did not retire");
        let _ = manager.next(Duration::from_millis(50));
    }
    assert!(
        !manager.seen.iter().any(|m| m.contains("STOPPING=1")),
        "a handover is not a stop: {:?}",
        manager.seen
    );
    // With the old process gone, keep-alives still come: the new one's.
    for _ in 0..2 {
        manager.wait_for("WATCHDOG=1", Duration::from_secs(5), &mut new);
    }
    let (status, _, _) = api_request(&socket, "GET", "/v1/version", "", b"");
    assert_eq!(status, 200);
}

/// SIGTERM, then SIGKILL, to `pid` when dropped.
fn scopeguard_kill(pid: u32) -> impl Drop {
    struct Kill(i32);
    impl Drop for Kill {
        fn drop(&mut self) {
            unsafe {
                libc::kill(self.0, libc::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            while std::path::Path::new(&format!("/proc/{}", self.0)).exists()
                && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            unsafe {
                libc::kill(self.0, libc::SIGKILL);
            }
        }
    }
    Kill(pid as i32)
}
