//! The userspace WireGuard device ([`crate::device`]) and the standard control socket that lets
//! `wg show <if>` (wireguard-tools) see it.
//!
//! The daemon configures the device directly, with the same text requests `wg(8)` sends; the
//! socket at `/var/run/wireguard/<if>.sock` serves those requests for other tools, one at a time.
//! The device installs no signal handlers: the daemon's own SIGTERM handling is the only one.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::device::{Device, Stats};

/// Where WireGuard userspace implementations put their control sockets (one per interface,
/// shared by every network namespace of the host).
pub const SOCKET_DIR: &str = "/var/run/wireguard";

/// How long a client of the control socket has to send its request.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest request the control socket accepts from a client.
const MAX_CLIENT_REQUEST: u64 = 1 << 20;

/// A running userspace device and its control socket. Dropping it stops the device (its threads
/// exit and the TUN interface goes with them) and removes the socket.
pub struct UserspaceDevice {
    device: Arc<Device>,
    socket: Option<SocketServer>,
}

impl std::fmt::Debug for UserspaceDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserspaceDevice")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

/// The answer to one control request: the `key=value` lines, and the errno (0 on success).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The `key=value` lines before `errno=` (a `get` lists the device and its peers here).
    pub body: String,
    /// The errno the device answered; 0 is success.
    pub errno: i32,
}

impl UserspaceDevice {
    /// Creates the TUN interface `name` in the calling thread's network namespace, starts the
    /// device on it, and serves `/var/run/wireguard/<name>.sock`. The interface is down, without
    /// key, address or peers.
    ///
    /// The control socket is best effort: if it cannot be made (the directory is read-only, say)
    /// the device runs without it and a warning says so.
    pub fn create(name: &str) -> io::Result<UserspaceDevice> {
        let device = Arc::new(Device::create(name)?);
        let socket = match SocketServer::start(name, device.clone()) {
            Ok(server) => Some(server),
            Err(err) => {
                tracing::warn!(interface = name, error = %err, "the WireGuard control socket could not be made; `wg show` will not see this interface (`ployz wg show` does)");
                None
            }
        };
        Ok(UserspaceDevice { device, socket })
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        self.device.name()
    }

    /// Answers a `get` request; the body lists the device and its peers.
    pub fn get(&self) -> io::Result<Reply> {
        Ok(Reply {
            body: self.device.get(),
            errno: 0,
        })
    }

    /// Applies a `set` request with `body` (`key=value` lines).
    pub fn set(&self, body: &str) -> io::Result<Reply> {
        Ok(Reply {
            body: String::new(),
            errno: self.device.set(body),
        })
    }

    /// The device's counters and offloads.
    pub fn stats(&self) -> Stats {
        self.device.stats()
    }

    /// The control socket's path, whether or not it could be made.
    pub fn socket_path(&self) -> PathBuf {
        socket_path(self.name())
    }
}

impl Drop for UserspaceDevice {
    fn drop(&mut self) {
        if let Some(socket) = self.socket.take() {
            socket.stop();
        }
    }
}

/// Reads one reply: lines up to `errno=N`, then the empty line that ends it.
pub fn read_reply(reader: &mut impl BufRead) -> io::Result<Reply> {
    let mut body = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the userspace WireGuard device closed its control channel",
            ));
        }
        let text = line.trim_end_matches('\n');
        if let Some(value) = text.strip_prefix("errno=") {
            let errno = value.parse().map_err(|_| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("the userspace WireGuard device answered errno={value:?}"),
                )
            })?;
            line.clear();
            reader.read_line(&mut line)?;
            if !line.trim_end_matches('\n').is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "the userspace WireGuard device's reply did not end after errno",
                ));
            }
            return Ok(Reply { body, errno });
        }
        body.push_str(text);
        body.push('\n');
    }
}

fn socket_path(name: &str) -> PathBuf {
    Path::new(SOCKET_DIR).join(format!("{name}.sock"))
}

/// Serves the standard control socket for `wg(8)`, one connection at a time.
struct SocketServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl SocketServer {
    fn start(name: &str, device: Arc<Device>) -> io::Result<SocketServer> {
        // Only root reaches the sockets; a directory made by wireguard-tools is left as it is.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(SOCKET_DIR)?;
        let path = socket_path(name);
        // A socket file nobody listens on is a leftover of a process that is gone.
        if UnixStream::connect(&path).is_err() {
            let _ = std::fs::remove_file(&path);
        }
        let listener = UnixListener::bind(&path)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("wg-uapi-{name}"))
            .spawn(move || {
                for client in listener.incoming() {
                    if stopping.load(Ordering::Acquire) {
                        return;
                    }
                    let Ok(client) = client else { continue };
                    if let Err(err) = serve_client(client, &device) {
                        tracing::debug!(error = %err, "a WireGuard control socket client failed");
                    }
                }
            })?;
        Ok(SocketServer {
            path,
            stop,
            thread: Some(thread),
        })
    }

    fn stop(mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept; the thread sees the flag and ends.
        let _ = UnixStream::connect(&self.path);
        let _ = std::fs::remove_file(&self.path);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads one request (`get=1` or `set=1` up to the empty line), passes it to the device and
/// writes its reply back.
fn serve_client(client: UnixStream, device: &Device) -> io::Result<()> {
    client.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    client.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut reader = BufReader::new((&client).take(MAX_CLIENT_REQUEST));
    let mut first = String::new();
    reader.read_line(&mut first)?;
    let request = match first.trim_end_matches('\n') {
        "get=1" => None,
        "set=1" => {
            let mut request = String::new();
            let mut line = String::new();
            loop {
                line.clear();
                if reader.read_line(&mut line)? == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the request ended before its empty line",
                    ));
                }
                if line.trim_end_matches('\n').is_empty() {
                    break;
                }
                request.push_str(&line);
            }
            Some(request)
        }
        _ => {
            // What boringtun answers to anything else.
            (&client).write_all(b"errno=5\n\n")?;
            return Ok(());
        }
    };
    let (mut out, errno) = match request {
        None => (device.get(), 0),
        Some(body) => (String::new(), device.set(&body)),
    };
    out.push_str(&format!("errno={errno}\n\n"));
    (&client).write_all(out.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_ends_at_errno_and_its_empty_line() {
        let mut input: &[u8] = b"listen_port=51820\npublic_key=ab\nerrno=0\n\nextra";
        let reply = read_reply(&mut input).unwrap();
        assert_eq!(reply.body, "listen_port=51820\npublic_key=ab\n");
        assert_eq!(reply.errno, 0);
        assert_eq!(input, b"extra", "the reader stops after the reply");
    }

    #[test]
    fn a_failed_set_carries_its_errno() {
        let mut input: &[u8] = b"errno=22\n\n";
        assert_eq!(
            read_reply(&mut input).unwrap(),
            Reply {
                body: String::new(),
                errno: 22
            }
        );
    }

    #[test]
    fn a_truncated_or_malformed_reply_is_an_error() {
        for input in [
            &b"listen_port=1\n"[..],
            b"errno=x\n\n",
            b"errno=0\nlisten_port=1\n",
        ] {
            let mut reader = input;
            assert!(read_reply(&mut reader).is_err(), "{input:?}");
        }
    }
}
