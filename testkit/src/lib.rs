//! Test-only helpers shared by the workspace's tests. Never published; a dev-dependency only.
//!
//! [`free_port`] and [`free_ports`] hand out loopback ports that stay free for the life of the
//! test process, even while other test binaries run beside it:
//!
//! - ports come from a range below the kernel's ephemeral range
//!   (`/proc/sys/net/ipv4/ip_local_port_range`), so outgoing connections, which take ephemeral
//!   ports, never land on one;
//! - each port handed out is reserved across processes by an `flock`ed lock file in
//!   [`lock_dir`], kept open in a process-wide registry until the process exits (the kernel then
//!   releases the lock, whatever way the process ended);
//! - a port is only handed out after binding it on 127.0.0.1 over TCP and UDP succeeded.
//!
//! A test binds the port itself (or hands it to the process it starts) after the call: nothing
//! else that uses this crate can take it in between.

use std::collections::hash_map::RandomState;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::ops::Range;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};

/// The lowest port handed out.
const RANGE_START: u16 = 20_000;
/// One past the highest port handed out, unless the ephemeral range starts lower.
const RANGE_END: u16 = 32_000;
/// Where Linux says which ports outgoing connections take.
const EPHEMERAL_RANGE_FILE: &str = "/proc/sys/net/ipv4/ip_local_port_range";

/// The reservations this process holds: each port with its open, locked file.
static HELD: Mutex<Vec<(u16, File)>> = Mutex::new(Vec::new());

/// A loopback port free on TCP and UDP, reserved for this process until it exits.
///
/// Panics when no port of the range is free (the message says which range and lock directory).
pub fn free_port() -> u16 {
    let [port] = free_ports();
    port
}

/// `N` distinct loopback ports, each as [`free_port`] hands one out.
pub fn free_ports<const N: usize>() -> [u16; N] {
    let mut got = [0u16; N];
    for slot in &mut got {
        *slot = reserve().unwrap_or_else(|e| panic!("{e}"));
    }
    got
}

/// The directory of the per-port lock files, shared by every test process on the machine.
pub fn lock_dir() -> PathBuf {
    std::env::temp_dir().join("ployz-test-ports")
}

/// The ports handed out: from [`RANGE_START`] up to [`RANGE_END`] or the start of the ephemeral
/// range, whichever is lower.
pub fn port_range() -> Result<Range<u16>, String> {
    let text = std::fs::read_to_string(EPHEMERAL_RANGE_FILE);
    // Without the file (not Linux), the fixed range is used as it is.
    let ephemeral_start = match text {
        Ok(text) => text
            .split_whitespace()
            .next()
            .and_then(|low| low.parse::<u16>().ok())
            .ok_or_else(|| {
                format!("{EPHEMERAL_RANGE_FILE} holds {text:?}, not two port numbers")
            })?,
        Err(_) => RANGE_END,
    };
    let end = RANGE_END.min(ephemeral_start);
    if end <= RANGE_START + 100 {
        return Err(format!(
            "the ephemeral port range starts at {ephemeral_start} ({EPHEMERAL_RANGE_FILE}), \
             leaving no room for test ports from {RANGE_START}; raise it, e.g. \
             `sysctl net.ipv4.ip_local_port_range=\"32768 60999\"`"
        ));
    }
    Ok(RANGE_START..end)
}

/// Finds, reserves and registers one port.
fn reserve() -> Result<u16, String> {
    let range = port_range()?;
    let dir = lock_dir();
    std::fs::create_dir_all(&dir).map_err(|e| {
        format!(
            "cannot create the test port lock directory {}: {e}; set TMPDIR to a writable directory",
            dir.display()
        )
    })?;
    // Shared by every user's tests, like /tmp itself; only its owner can change the mode, and
    // a directory someone else made is used as it is.
    let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777));
    let len = u32::from(range.end - range.start);
    // Start somewhere random so concurrent processes rarely contend for the same ports.
    let offset = random_u32() % len;
    let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
    for i in 0..len {
        let port = range.start + ((offset + i) % len) as u16;
        if held.iter().any(|(p, _)| *p == port) {
            continue;
        }
        let Some(lock) = try_lock(&dir, port)? else {
            continue;
        };
        if bindable(port) {
            held.push((port, lock));
            return Ok(port);
        }
        // Bound by something outside the reservation scheme: dropping the file unlocks it.
    }
    Err(format!(
        "no free test port in {}..{} (lock files in {}): every port is reserved or bound",
        range.start,
        range.end,
        dir.display()
    ))
}

/// Opens and locks `port`'s lock file without waiting: `None` when another holder has it.
fn try_lock(dir: &std::path::Path, port: u16) -> Result<Option<File>, String> {
    let path = dir.join(format!("{port}.lock"));
    // Writable by everyone (as far as the umask allows), so other users' tests can lock it too;
    // a file another user made read-only for us still locks when opened for reading.
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o666)
        .open(&path)
        .or_else(|e| match e.kind() {
            io::ErrorKind::PermissionDenied => File::open(&path),
            _ => Err(e),
        })
        .map_err(|e| {
            format!(
                "cannot open the test port lock file {}: {e}",
                path.display()
            )
        })?;
    // SAFETY: flock on a descriptor `file` owns and keeps open; no memory is involved.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(Some(file));
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(None)
    } else {
        Err(format!("cannot lock {}: {err}", path.display()))
    }
}

/// Whether nothing holds `port` on 127.0.0.1, over TCP or UDP.
fn bindable(port: u16) -> bool {
    TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
        && UdpSocket::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
}

/// A random number from the standard library's per-process hash keys.
fn random_u32() -> u32 {
    let mut h = RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.finish() as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_distinct_below_the_ephemeral_range_and_bindable() {
        let range = port_range().unwrap();
        let ports: [u16; 8] = free_ports();
        let mut sorted = ports.to_vec();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), ports.len(), "{ports:?}");
        for port in ports {
            assert!(range.contains(&port), "{port} outside {range:?}");
            assert!(bindable(port), "{port} was handed out but cannot be bound");
        }
    }

    #[test]
    fn a_reserved_port_is_locked_against_other_holders() {
        let port = free_port();
        // Another open file description of the same lock file, as another process would have.
        assert!(
            try_lock(&lock_dir(), port).unwrap().is_none(),
            "port {port} is handed out but its lock file is not locked"
        );
    }
}

/// A position-dependent 64-bit digest of a byte stream, however it is cut into reads: a test
/// that sends a stream over a network checks that what arrived is what was sent, whole and in
/// order, without holding either in memory.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct StreamDigest {
    hash: u64,
    len: u64,
}

impl StreamDigest {
    /// Adds the next bytes of the stream.
    pub fn update(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.hash = (self.hash ^ u64::from(*byte) ^ (self.len << 8))
                .wrapping_mul(0x0000_0100_0000_01b3)
                .rotate_left(5);
            self.len += 1;
        }
    }

    /// The bytes seen so far.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether no byte was seen.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod digest_tests {
    use super::StreamDigest;

    #[test]
    fn the_digest_ignores_how_a_stream_is_cut_but_not_its_order() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let mut whole = StreamDigest::default();
        whole.update(&data);
        let mut pieces = StreamDigest::default();
        for piece in data.chunks(333) {
            pieces.update(piece);
        }
        assert_eq!(whole, pieces);
        let mut swapped = data.clone();
        swapped.swap(10, 20);
        let mut other = StreamDigest::default();
        other.update(&swapped);
        assert_ne!(whole, other, "two bytes swapped");
        let mut short = StreamDigest::default();
        short.update(&data[..9_999]);
        assert_ne!(whole, short, "one byte lost");
    }
}
