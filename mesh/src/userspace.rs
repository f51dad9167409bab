//! The userspace WireGuard device (boringtun), driven over a private control channel.
//!
//! boringtun's own control socket (`/var/run/wireguard/<if>.sock`, the one
//! `defguard_wireguard_rs` talks to) comes with two signal handlers: the device blocks SIGINT and
//! SIGTERM in the thread that creates it and reads them from a `signalfd`, exiting when one
//! arrives. In a daemon that has its own SIGTERM handling, that `signalfd` competes for every
//! process-directed SIGTERM: whichever thread dequeues it first wins, so a SIGTERM could stop the
//! WireGuard device and never reach the daemon, which then kept running with a dead interface
//! (each later control call timing out in a loop).
//!
//! So the device is created with a control file descriptor instead (boringtun's `uapi_fd`, one
//! end of a socket pair this module keeps): that path registers no signal handlers. The calling
//! thread's signal mask is left as it was.
//!
//! `wg show <if>` (wireguard-tools) still works: [`UserspaceDevice`] serves the standard control
//! socket at `/var/run/wireguard/<if>.sock` itself, one request at a time, by passing each
//! request over the private channel.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::fd::IntoRawFd;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use defguard_boringtun::device::{DeviceConfig, DeviceHandle};

/// Where WireGuard userspace implementations put their control sockets (one per interface,
/// shared by every network namespace of the host).
pub const SOCKET_DIR: &str = "/var/run/wireguard";

/// How long one control exchange with the device may take before the channel is given up.
const CONTROL_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client of the control socket has to send its request.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);
/// The largest request the control socket accepts from a client.
const MAX_CLIENT_REQUEST: u64 = 1 << 20;

/// The device's configuration, controlled over `uapi_fd`. Without connected sockets: the
/// crate's connected-socket path asks Linux for a UDP socket of the stream type, which Linux
/// refuses (`EPROTONOSUPPORT`), and it asks again for every packet it receives: one failed
/// `socket(2)` per packet, about 6,000 a second per device thread under load in the lab. The
/// device sends on its one unconnected socket instead.
fn device_config(uapi_fd: i32) -> DeviceConfig {
    DeviceConfig {
        uapi_fd,
        use_connected_socket: false,
        ..DeviceConfig::default()
    }
}

/// A running boringtun device and the channel that configures it. Dropping it stops the device
/// (its threads exit and the TUN interface goes with them) and removes its control socket.
pub struct UserspaceDevice {
    name: String,
    control: Arc<Mutex<Control>>,
    handle: Option<DeviceHandle>,
    socket: Option<SocketServer>,
}

impl std::fmt::Debug for UserspaceDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserspaceDevice")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// The answer to one control request: what the device printed before `errno=`, and the errno
/// (0 on success).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The `key=value` lines before `errno=` (a `get` lists the device and its peers here).
    pub body: String,
    /// The errno the device answered; 0 is success.
    pub errno: i32,
}

impl UserspaceDevice {
    /// Creates the TUN interface `name` in the calling thread's network namespace and starts
    /// boringtun on it, and serves `/var/run/wireguard/<name>.sock`. The interface is down,
    /// without key, address or peers.
    ///
    /// The control socket is best effort: if it cannot be made (the directory is read-only, say)
    /// the device runs without it and a warning says so.
    pub fn create(name: &str) -> io::Result<UserspaceDevice> {
        let (ours, theirs) = UnixStream::pair()?;
        let config = device_config(theirs.into_raw_fd());
        // On success the device owns the descriptor (it closes it when it stops); on failure
        // boringtun has not wrapped it yet in every path, and leaking one descriptor on a
        // failed start is the lesser evil against a double close.
        let handle = DeviceHandle::new(name, config).map_err(io::Error::other)?;
        ours.set_read_timeout(Some(CONTROL_TIMEOUT))?;
        ours.set_write_timeout(Some(CONTROL_TIMEOUT))?;
        let reader = BufReader::new(ours.try_clone()?);
        let control = Arc::new(Mutex::new(Control {
            stream: ours,
            reader,
            broken: None,
        }));
        let socket = match SocketServer::start(name, control.clone()) {
            Ok(server) => Some(server),
            Err(err) => {
                tracing::warn!(interface = name, error = %err, "the WireGuard control socket could not be made; `wg show` will not see this interface (`ployz wg show` does)");
                None
            }
        };
        Ok(UserspaceDevice {
            name: name.to_owned(),
            control,
            handle: Some(handle),
            socket,
        })
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends one `get` request; the body lists the device and its peers.
    pub fn get(&self) -> io::Result<Reply> {
        lock(&self.control).exchange(b"get=1\n")
    }

    /// Sends one `set` request with `body` (`key=value` lines, each ending in a newline).
    pub fn set(&self, body: &str) -> io::Result<Reply> {
        let mut request = Vec::with_capacity(body.len() + 8);
        request.extend_from_slice(b"set=1\n");
        request.extend_from_slice(body.as_bytes());
        if !body.is_empty() && !body.ends_with('\n') {
            request.push(b'\n');
        }
        request.push(b'\n');
        lock(&self.control).exchange(&request)
    }

    /// The control socket's path, whether or not it could be made.
    pub fn socket_path(&self) -> PathBuf {
        socket_path(&self.name)
    }
}

impl Drop for UserspaceDevice {
    fn drop(&mut self) {
        if let Some(socket) = self.socket.take() {
            socket.stop();
        }
        // Closing our end of the channel is what stops the device: boringtun reads end of file
        // and exits its threads; the handle's drop tells them too.
        if let Ok(control) = self.control.lock() {
            let _ = control.stream.shutdown(std::net::Shutdown::Both);
        }
        drop(self.handle.take());
    }
}

fn lock(control: &Mutex<Control>) -> std::sync::MutexGuard<'_, Control> {
    control
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The private channel to the device.
struct Control {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
    /// Why the channel is no longer trusted: after a timeout or a malformed answer a late reply
    /// could be taken for the next request's, so every later request fails instead.
    broken: Option<String>,
}

impl Control {
    fn exchange(&mut self, request: &[u8]) -> io::Result<Reply> {
        if let Some(why) = &self.broken {
            return Err(io::Error::other(format!(
                "the userspace WireGuard device stopped answering earlier ({why}); restart the daemon"
            )));
        }
        let result = self.try_exchange(request);
        if let Err(err) = &result {
            self.broken = Some(err.to_string());
        }
        result
    }

    fn try_exchange(&mut self, request: &[u8]) -> io::Result<Reply> {
        self.stream.write_all(request)?;
        read_reply(&mut self.reader)
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
    fn start(name: &str, control: Arc<Mutex<Control>>) -> io::Result<SocketServer> {
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
                    if let Err(err) = serve_client(client, &control) {
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
fn serve_client(client: UnixStream, control: &Mutex<Control>) -> io::Result<()> {
    client.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    client.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut reader = BufReader::new((&client).take(MAX_CLIENT_REQUEST));
    let mut first = String::new();
    reader.read_line(&mut first)?;
    let request = match first.trim_end_matches('\n') {
        "get=1" => b"get=1\n".to_vec(),
        "set=1" => {
            let mut request = first.into_bytes();
            let mut line = String::new();
            loop {
                line.clear();
                if reader.read_line(&mut line)? == 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the request ended before its empty line",
                    ));
                }
                request.extend_from_slice(line.as_bytes());
                if line.trim_end_matches('\n').is_empty() {
                    break;
                }
            }
            request
        }
        _ => {
            // What boringtun answers to anything else.
            (&client).write_all(b"errno=5\n\n")?;
            return Ok(());
        }
    };
    let reply = lock(control).exchange(&request)?;
    let mut out = reply.body.into_bytes();
    out.extend_from_slice(format!("errno={}\n\n", reply.errno).as_bytes());
    (&client).write_all(&out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_device_sends_on_its_unconnected_socket() {
        // The connected-socket path would attempt (and fail) a socket(2) per received packet.
        let config = device_config(-1);
        assert!(!config.use_connected_socket);
        assert_eq!(config.n_threads, DeviceConfig::default().n_threads);
    }

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
