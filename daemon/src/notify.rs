//! The service manager's readiness protocol (`sd_notify`): when the daemon runs under systemd
//! (`Type=notify`, `$NOTIFY_SOCKET` set), it says `STATUS=` while it starts, `READY=1` once the
//! management API answers on its socket, the edge's listeners accept and (on an initialised
//! Machine) the edge's first route and certificate tables are built, `WATCHDOG=1` while the
//! API keeps answering, and `STOPPING=1` when it begins to stop. Without `$NOTIFY_SOCKET` every
//! call is a no-op: the daemon never depends on a service manager, it only tells one.
//!
//! The protocol is one datagram per message to a unix socket (a path, or an abstract name
//! written `@name`); nothing answers.

use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::OnceLock;
use std::time::Duration;

/// Where messages go, resolved once from `$NOTIFY_SOCKET`.
struct Target {
    socket: UnixDatagram,
    addr: SocketAddr,
}

fn target() -> Option<&'static Target> {
    static TARGET: OnceLock<Option<Target>> = OnceLock::new();
    TARGET
        .get_or_init(|| {
            let path = std::env::var_os("NOTIFY_SOCKET")?;
            let addr = socket_addr(path.as_encoded_bytes())?;
            let socket = UnixDatagram::unbound().ok()?;
            Some(Target { socket, addr })
        })
        .as_ref()
}

/// `$NOTIFY_SOCKET` as an address: `@name` is abstract, anything else a path.
fn socket_addr(raw: &[u8]) -> Option<SocketAddr> {
    use std::os::linux::net::SocketAddrExt;
    match raw.split_first() {
        None => None,
        Some((b'@', name)) => SocketAddr::from_abstract_name(name).ok(),
        Some(_) => {
            use std::os::unix::ffi::OsStrExt;
            SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(raw)).ok()
        }
    }
}

/// Sends `message` (newline-separated `KEY=value` assignments). A service manager that is gone
/// is not the daemon's failure: errors are logged at debug and dropped.
fn send(message: &str) {
    let Some(target) = target() else {
        return;
    };
    if let Err(e) = target.socket.send_to_addr(message.as_bytes(), &target.addr) {
        tracing::debug!(error = %e, "the service manager's notify socket refused a message");
    }
}

/// Whether a service manager listens (`$NOTIFY_SOCKET` is set and usable).
pub(crate) fn enabled() -> bool {
    target().is_some()
}

/// One line of what the daemon is doing, as `systemctl status` shows it.
pub(crate) fn status(line: &str) {
    // A newline would start another assignment.
    send(&format!("STATUS={}", line.replace('\n', " ")));
}

/// The daemon serves: `READY=1`, with its process ID (a handover's new process becomes the
/// service's main process by saying so).
pub(crate) fn ready(status: &str) {
    send(&format!(
        "MAINPID={}\nREADY=1\nSTATUS={}",
        std::process::id(),
        status.replace('\n', " ")
    ));
}

/// The daemon begins to stop.
pub(crate) fn stopping(status: &str) {
    send(&format!("STOPPING=1\nSTATUS={}", status.replace('\n', " ")));
}

/// The daemon is alive (the watchdog's keep-alive).
pub(crate) fn watchdog() {
    send("WATCHDOG=1");
}

/// How often the watchdog wants a keep-alive: half of `$WATCHDOG_USEC`, when it is set for this
/// process (`$WATCHDOG_PID`, when present, names it).
pub(crate) fn watchdog_interval() -> Option<Duration> {
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse::<u32>().ok()? != std::process::id() {
            return None;
        }
    }
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notify_socket_names_are_paths_or_abstract() {
        use std::os::linux::net::SocketAddrExt;
        let abs = socket_addr(b"@ployz/notify").unwrap();
        assert_eq!(abs.as_abstract_name(), Some(&b"ployz/notify"[..]));
        let path = socket_addr(b"/run/systemd/notify").unwrap();
        assert_eq!(
            path.as_pathname(),
            Some(std::path::Path::new("/run/systemd/notify"))
        );
        assert!(socket_addr(b"").is_none());
    }

    #[test]
    fn messages_arrive_as_one_datagram() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let target = Target {
            socket: UnixDatagram::unbound().unwrap(),
            addr: socket_addr(path.as_os_str().as_encoded_bytes()).unwrap(),
        };
        target
            .socket
            .send_to_addr(b"READY=1\nSTATUS=serving", &target.addr)
            .unwrap();
        let mut buf = [0u8; 256];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving");
    }
}
