//! A daemon process taking over from the one running, without dropping a request
//! (`ployz daemon handover`, the unit's `ExecReload=`, which `machine upgrade` and the package's
//! upgrade use).
//!
//! The running daemon listens on `<data_dir>/run/handover.sock` (0600, root's). A new process
//! started with `--take-over` connects and asks; the old one then:
//!
//! 1. **releases** what only one process may hold: its modules that act on the Machine stop
//!    (the mesh lets go of its interface and ports, its membership without leaving the Cluster:
//!    peers would observe the Machine down, and end their exchanges with its containers; the
//!    certificate issuer, the drain-mark
//!    sweeper, the Docker observer, the route controller), then the store hands its files over
//!    ([`ployz_store::Store::hand_over`]); the edge goes on serving with the routes it has;
//! 2. sends copies of the edge's listening sockets (`SCM_RIGHTS`), which from then on both
//!    processes accept on: no connection is refused, none waits for a process to start; and
//!    copies of the Ingress Ports' sockets, which both processes serve from then on too, when
//!    the new process says it takes them (`ingress-ports` after its ID: an older one does not,
//!    and binds the ports once this process has closed them);
//! 3. waits for the new process to say `READY` (it is serving: store open, modules started,
//!    its first route and certificate tables published, before which its edge takes no
//!    connection from the shared sockets, the management API renamed into the socket's path,
//!    the service manager told `MAINPID=` and `READY=1`);
//! 4. **retires**: the management API, the internal DNS and the metrics listener stop (the new
//!    process binds them again: a bounded gap, which DNS clients retry through), the edge's
//!    listeners and the Ingress Ports close in this process at once (the new one serves the same
//!    sockets; TCP connections through an Ingress Port go on for the shutdown grace at most), every
//!    response says `Connection: close`, a connection here whose next request is only on its
//!    way is still answered (the edge's idle window at shutdown), and the requests in flight
//!    finish (within the shutdown grace) before it exits.
//!
//! A new process that goes away before `READY` leaves the old one without its store: it exits
//! (status 1), for the service manager to start a fresh daemon.

use std::io::{BufRead as _, Read as _, Write as _};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use async_trait::async_trait;
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use serde::{Deserialize, Serialize};

/// What the old process is doing, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Stage {
    Serving,
    /// A new process is taking over: modules that act on the Machine stop.
    Releasing,
    /// The new process serves: the rest stops, the edge finishes what is in flight.
    Retiring,
}

/// The handover socket's name in the runtime directory.
pub(crate) const SOCKET: &str = "handover.sock";
/// How long the modules that act on the Machine may take to stop.
const RELEASE_WITHIN: Duration = Duration::from_secs(15);
/// How long the new process may take from the listeners to `READY`.
const READY_WITHIN: Duration = Duration::from_secs(120);
/// The first line a process taking over sends, before its process ID and what it takes.
const ASK: &str = "PLOYZ-TAKE-OVER 1";
/// Said after the process ID by a process that takes the Ingress Ports' sockets.
const TAKES_INGRESS_PORTS: &str = "ingress-ports";
/// The most descriptors one message carries (Linux's `SCM_MAX_FD`).
const MAX_DESCRIPTORS: usize = 253;

/// One listening socket handed over.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Handed {
    addr: SocketAddr,
    tls: bool,
}

/// One Ingress Port's socket handed over.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct HandedPort {
    port: u16,
    protocol: ployz_core::HostProtocol,
}

/// What the old process sends, beside the descriptors.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Handing {
    /// One per descriptor, in order.
    listeners: Vec<Handed>,
    /// One per descriptor after the listeners', in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    ingress_ports: Vec<HandedPort>,
    /// The service manager's watchdog period the old process kept (`$WATCHDOG_USEC`, which
    /// only the unit's first process is given), microseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    watchdog_usec: Option<u64>,
}

/// What a process taking over received: the edge's listening sockets and the Ingress Ports'.
pub(crate) struct TakenOver {
    pub edge: Vec<(SocketAddr, bool, std::net::TcpListener)>,
    pub ingress_ports: Vec<(u16, ployz_core::HostProtocol, OwnedFd)>,
    /// Half the watchdog period the old process kept, for this one to keep.
    pub watchdog: Option<Duration>,
    /// Where `READY` goes.
    conn: UnixStream,
}

impl TakenOver {
    /// The listening socket handed over for `addr`, HTTPS when `tls`.
    pub fn take(&mut self, addr: SocketAddr, tls: bool) -> Option<std::net::TcpListener> {
        let i = self
            .edge
            .iter()
            .position(|(a, t, _)| *a == addr && *t == tls)?;
        Some(self.edge.remove(i).2)
    }

    /// Tells the old process this one serves: it retires.
    pub fn ready(&mut self) -> std::io::Result<()> {
        self.conn.write_all(b"READY\n")?;
        self.conn.flush()
    }
}

/// The handover socket under `runtime_dir`.
pub(crate) fn socket_path(runtime_dir: &Path) -> PathBuf {
    runtime_dir.join(SOCKET)
}

/// Asks the daemon running on this data dir to hand over; returns once it has released the
/// Machine and sent its listening sockets.
pub(crate) fn take_over(runtime_dir: &Path) -> anyhow::Result<TakenOver> {
    let path = socket_path(runtime_dir);
    let mut conn = UnixStream::connect(&path).with_context(|| {
        format!(
            "no running daemon to take over from answers at {} (start it without --take-over)",
            path.display()
        )
    })?;
    conn.set_read_timeout(Some(RELEASE_WITHIN + Duration::from_secs(15)))?;
    writeln!(conn, "{ASK} {} {TAKES_INGRESS_PORTS}", std::process::id())?;
    let (payload, mut fds) = receive(&conn).context("the running daemon did not hand over")?;
    let Handing {
        listeners: handed,
        ingress_ports,
        watchdog_usec,
    } = serde_json::from_slice(&payload).with_context(|| {
        format!(
            "the running daemon's handover is not understood: {}",
            String::from_utf8_lossy(&payload)
        )
    })?;
    if handed.len() + ingress_ports.len() != fds.len() {
        bail!(
            "the running daemon named {} sockets and sent {}",
            handed.len() + ingress_ports.len(),
            fds.len()
        );
    }
    let ingress_fds = fds.split_off(handed.len());
    let ingress_ports = ingress_ports
        .into_iter()
        .zip(ingress_fds)
        .map(|(h, fd)| (h.port, h.protocol, fd))
        .collect();
    let edge = handed
        .into_iter()
        .zip(fds)
        .map(|(h, fd)| (h.addr, h.tls, std::net::TcpListener::from(fd)))
        .collect();
    conn.set_read_timeout(None)?;
    Ok(TakenOver {
        edge,
        ingress_ports,
        watchdog: watchdog_usec
            .filter(|u| *u > 0)
            .map(|u| Duration::from_micros(u / 2)),
        conn,
    })
}

/// Receives one message with its file descriptors.
fn receive(conn: &UnixStream) -> anyhow::Result<(Vec<u8>, Vec<OwnedFd>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    let mut buf = vec![0u8; 64 * 1024];
    let mut space = nix::cmsg_space!([RawFd; MAX_DESCRIPTORS]);
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(
        conn.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_CMSG_CLOEXEC,
    )
    .context("reading the handover")?;
    let mut fds = Vec::new();
    for c in msg.cmsgs().context("reading the handover's descriptors")? {
        if let ControlMessageOwned::ScmRights(received) = c {
            // SAFETY: the kernel just installed these descriptors in this process for us.
            fds.extend(
                received
                    .into_iter()
                    .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
            );
        }
    }
    if msg.flags.contains(MsgFlags::MSG_CTRUNC) {
        bail!("the running daemon sent more sockets than one message carries");
    }
    let n = msg.bytes;
    if n == 0 {
        bail!("the running daemon closed the handover without sending anything (see its log)");
    }
    Ok((buf[..n].to_vec(), fds))
}

fn send(conn: &UnixStream, payload: &[u8], fds: &[RawFd]) -> std::io::Result<()> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags};
    let iov = [std::io::IoSlice::new(payload)];
    let cmsgs = [ControlMessage::ScmRights(fds)];
    let sent = sendmsg::<()>(conn.as_raw_fd(), &iov, &cmsgs, MsgFlags::empty(), None)
        .map_err(std::io::Error::from)?;
    if sent != payload.len() {
        return Err(std::io::Error::other("the handover was cut short"));
    }
    Ok(())
}

/// The modules of one stage that are still running, so the handover waits for them.
#[derive(Default)]
pub(crate) struct Running {
    count: AtomicUsize,
    changed: tokio::sync::Notify,
}

impl Running {
    async fn until_none(&self, within: Duration) -> bool {
        let wait = async {
            loop {
                let notified = self.changed.notified();
                if self.count.load(Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(within, wait).await.is_ok()
    }
}

/// A module of the daemon that stops at a stage of a handover as at shutdown: it sees its
/// shutdown watch change at whichever comes first.
pub(crate) struct UntilStage<S> {
    pub inner: S,
    pub until: Stage,
    pub stage: tokio::sync::watch::Receiver<Stage>,
    /// Counted while it runs, when the handover waits for it.
    pub running: Option<Arc<Running>>,
}

impl<S> UntilStage<S> {
    pub fn new(inner: S, until: Stage, handover: &Handover) -> UntilStage<S> {
        let running = (until == Stage::Releasing).then(|| handover.releasing.clone());
        if let Some(r) = &running {
            r.count.fetch_add(1, Ordering::SeqCst);
        }
        UntilStage {
            inner,
            until,
            stage: handover.stage.subscribe(),
            running,
        }
    }
}

#[async_trait]
impl<S: BackgroundService + Send + Sync> BackgroundService for UntilStage<S> {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        let mut stage = self.stage.clone();
        let until = self.until;
        let forward = async move {
            tokio::select! {
                _ = shutdown.wait_for(|down| *down) => {}
                _ = stage.wait_for(|s| *s >= until) => {}
            }
            let _ = tx.send(true);
            // The sender stays: a dropped one would read as shutdown too, early.
            std::future::pending::<()>().await
        };
        tokio::select! {
            () = self.inner.start(rx) => {}
            () = forward => {}
        }
        if let Some(r) = &self.running {
            r.count.fetch_sub(1, Ordering::SeqCst);
            r.changed.notify_waiters();
        }
    }
}

/// The old process's side: the stage every staged module watches, and the socket a new
/// process asks on.
pub(crate) struct Handover {
    pub stage: tokio::sync::watch::Sender<Stage>,
    releasing: Arc<Running>,
}

impl Handover {
    pub fn new() -> Handover {
        Handover {
            stage: tokio::sync::watch::channel(Stage::Serving).0,
            releasing: Arc::default(),
        }
    }

    /// The modules a handover waits for before it gives up the store.
    pub fn releasing(&self) -> Arc<Running> {
        self.releasing.clone()
    }
}

/// Serves the handover socket: answers one process taking over, then retires this one.
pub(crate) struct HandoverService {
    pub listener: std::sync::Mutex<Option<std::os::unix::net::UnixListener>>,
    pub path: PathBuf,
    pub stage: tokio::sync::watch::Sender<Stage>,
    pub releasing: Arc<Running>,
    /// Copies of the edge's listening sockets.
    pub edge: std::sync::Mutex<Vec<(SocketAddr, bool, std::net::TcpListener)>>,
    /// Closes the edge: a stop under way, after which no handover is taken and the copies go.
    pub edge_closing: ployz_edge::EdgeClosing,
    /// The Ingress Ports, whose sockets the new process is sent copies of.
    pub ingress_ports: Arc<ployz_edge::ingress_ports::IngressPorts>,
    pub machine: Arc<crate::local_machine::LocalMachine>,
    pub edge_state: Arc<ployz_edge::EdgeState>,
    /// Tells the shutdown watch to retire the edge (`Ok`) or to stop at once (`Err`: the new
    /// process failed after this one gave up its store).
    pub retire: tokio::sync::mpsc::UnboundedSender<crate::server::Stop>,
}

impl HandoverService {
    /// Binds the handover socket (0600) in `runtime_dir`, replacing a stale one.
    pub fn bind(runtime_dir: &Path) -> anyhow::Result<std::os::unix::net::UnixListener> {
        let path = socket_path(runtime_dir);
        if UnixStream::connect(&path).is_ok() {
            bail!(
                "another daemon serves {}; give this one its own --data-dir",
                path.display()
            );
        }
        let _ = std::fs::remove_file(&path);
        let listener = std::os::unix::net::UnixListener::bind(&path)
            .with_context(|| format!("cannot listen on {}", path.display()))?;
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    }

    /// Reads a handover request on `conn`: the asking process's ID and whether it takes the
    /// Ingress Ports' sockets, or `None` when it is not one.
    async fn request(
        conn: &mut tokio::io::BufReader<tokio::net::UnixStream>,
    ) -> Option<(String, bool)> {
        use tokio::io::AsyncBufReadExt as _;
        let mut first = String::new();
        match tokio::time::timeout(Duration::from_secs(5), conn.read_line(&mut first)).await {
            Ok(Ok(_)) => {}
            _ => return None,
        }
        let mut words = first.trim().strip_prefix(ASK)?.split_whitespace();
        let pid = words.next()?.to_owned();
        let takes_ingress_ports = words.any(|w| w == TAKES_INGRESS_PORTS);
        Some((pid, takes_ingress_ports))
    }

    /// Runs the handover asked for on `conn`: release, send the sockets, wait for READY.
    async fn hand_over(
        &self,
        conn: tokio::io::BufReader<tokio::net::UnixStream>,
        pid: &str,
        takes_ingress_ports: bool,
    ) -> anyhow::Result<()> {
        tracing::info!(
            new_pid = pid,
            "a new process takes over: stopping the modules that act on this Machine"
        );
        crate::notify::status("handing over to a new process");
        self.edge_state.set_handing_over();
        self.stage.send_replace(Stage::Releasing);
        if !self.releasing.until_none(RELEASE_WITHIN).await {
            tracing::warn!(
                within_s = RELEASE_WITHIN.as_secs(),
                "some modules did not stop in time; handing over regardless"
            );
        }
        if let Some(store) = self.machine.store() {
            store.hand_over().context("cannot hand the store over")?;
        }
        let edge = std::mem::take(&mut *self.edge.lock().expect("handover lock"));
        let ports = match takes_ingress_ports.then(|| self.ingress_ports.copies()) {
            Some(Ok(ports)) if edge.len() + ports.len() <= MAX_DESCRIPTORS => ports,
            not_handed => {
                match not_handed {
                    None => tracing::info!(
                        "the new process binds the Ingress Ports itself (an older release): closing them"
                    ),
                    Some(Ok(ports)) => tracing::warn!(
                        ports = ports.len(),
                        "more Ingress Ports than one message carries: closing them for the new process to bind"
                    ),
                    Some(Err(e)) => tracing::warn!(
                        error = %e,
                        "cannot copy the Ingress Ports' sockets: closing them for the new process to bind"
                    ),
                }
                self.ingress_ports.stop_serving();
                Vec::new()
            }
        };
        let payload = serde_json::to_vec(&Handing {
            listeners: edge
                .iter()
                .map(|(addr, tls, _)| Handed {
                    addr: *addr,
                    tls: *tls,
                })
                .collect(),
            ingress_ports: ports
                .iter()
                .map(|(port, protocol, _)| HandedPort {
                    port: *port,
                    protocol: *protocol,
                })
                .collect(),
            watchdog_usec: crate::notify::watchdog_interval()
                .map(|half| half.as_micros() as u64 * 2),
        })?;
        let fds: Vec<RawFd> = edge
            .iter()
            .map(|(_, _, l)| l.as_raw_fd())
            .chain(ports.iter().map(|(_, _, fd)| fd.as_raw_fd()))
            .collect();
        let std_conn = conn.into_inner().into_std()?;
        std_conn.set_nonblocking(false)?;
        send(&std_conn, &payload, &fds).context("cannot send the listening sockets")?;
        drop(edge);
        drop(ports);
        tracing::info!(
            sockets = fds.len(),
            "listening sockets handed over; waiting for the new process to serve"
        );
        let ready = tokio::task::spawn_blocking(move || {
            let mut conn = std_conn;
            conn.set_read_timeout(Some(READY_WITHIN))?;
            let mut line = String::new();
            let mut reader = std::io::BufReader::new(&mut conn);
            reader.read_line(&mut line)?;
            // Whatever follows is not for us; the connection stays open until the new process
            // is done with it.
            let mut rest = [0u8; 1];
            let _ = conn.set_read_timeout(Some(Duration::from_millis(1)));
            let _ = conn.read(&mut rest);
            Ok::<_, std::io::Error>(line)
        })
        .await??;
        if ready.trim() != "READY" {
            bail!(
                "the new process went away before it served ({:?})",
                ready.trim()
            );
        }
        Ok(())
    }
}

#[async_trait]
impl BackgroundService for HandoverService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let Some(std_listener) = self.listener.lock().expect("handover lock").take() else {
            return;
        };
        let listener = match tokio::net::UnixListener::from_std(std_listener) {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(error = %e, "the handover socket cannot be used");
                return;
            }
        };
        let (conn, (pid, takes_ingress_ports)) = loop {
            let conn = tokio::select! {
                _ = shutdown.changed() => return,
                () = self.edge_closing.close_called() => {
                    // A stop: the copies of the edge's listening sockets go with the edge's
                    // own, or the kernel would go on completing handshakes on them into a
                    // queue no one accepts from, and clients would wait instead of being
                    // refused and trying elsewhere.
                    self.edge.lock().expect("handover lock").clear();
                    drop(listener);
                    let _ = std::fs::remove_file(&self.path);
                    return;
                }
                accepted = listener.accept() => match accepted {
                    Ok((conn, _)) => conn,
                    Err(e) => {
                        tracing::error!(error = %e, "the handover socket failed");
                        return;
                    }
                },
            };
            let mut conn = tokio::io::BufReader::new(conn);
            match Self::request(&mut conn).await {
                Some(asked) => break (conn, asked),
                None => tracing::warn!(
                    "the handover socket got something that is not a handover request"
                ),
            }
        };
        // One handover per process: a second asker finds no socket.
        drop(listener);
        let _ = std::fs::remove_file(&self.path);
        match self.hand_over(conn, &pid, takes_ingress_ports).await {
            Ok(()) => {
                tracing::info!("the new process serves: retiring");
                self.stage.send_replace(Stage::Retiring);
                let _ = self.retire.send(crate::server::Stop::Retire);
            }
            Err(e) => {
                tracing::error!(
                    error = %format!("{e:#}"),
                    "the handover failed after this process gave up its modules and store; exiting for the service manager to start a fresh daemon"
                );
                let _ = self.retire.send(crate::server::Stop::Failed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt as _;

    /// An older process taking over asks without `ingress-ports`, and is sent only the edge's
    /// listeners (it counts the descriptors against them).
    #[tokio::test]
    async fn a_request_says_whether_the_asker_takes_the_ingress_ports() {
        for (line, expected) in [
            ("PLOYZ-TAKE-OVER 1 42\n", Some(("42", false))),
            ("PLOYZ-TAKE-OVER 1 42 ingress-ports\n", Some(("42", true))),
            ("PLOYZ-TAKE-OVER 1\n", None),
            ("GET / HTTP/1.1\n", None),
        ] {
            let (ours, mut theirs) = tokio::net::UnixStream::pair().unwrap();
            theirs.write_all(line.as_bytes()).await.unwrap();
            let mut conn = tokio::io::BufReader::new(ours);
            let asked = HandoverService::request(&mut conn).await;
            assert_eq!(
                asked,
                expected.map(|(pid, takes)| (pid.to_owned(), takes)),
                "{line:?}"
            );
        }
    }

    /// What an older release sends reads with no Ingress Ports; with none, none is written.
    #[test]
    fn a_handing_without_ingress_ports_reads_and_writes_as_before() {
        let older = r#"{"listeners":[{"addr":"127.0.0.1:80","tls":false}]}"#;
        let handing: Handing = serde_json::from_str(older).unwrap();
        assert!(handing.ingress_ports.is_empty());
        assert_eq!(handing.listeners.len(), 1);
        let written = serde_json::to_string(&handing).unwrap();
        assert_eq!(written, older);
    }
}
