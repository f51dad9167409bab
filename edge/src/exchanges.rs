//! The exchanges this edge has open with containers on other Machines, so that when the mesh
//! observes a Machine down they end at once instead of waiting out an I/O timeout (a Machine
//! that lost power sends no reset: its connections would hang until the kernel gives up).
//!
//! Each path (the fast path, the HTTP/2 path, Pingora's proxy) registers the socket of an
//! exchange with a remote container for as long as the exchange lasts. [`Exchanges::cut`] shuts
//! every registered socket to a Machine down (`shutdown(2)`, which wakes the reader with
//! end-of-file) and marks its registration, so the path can tell a cut from a container that
//! closed: an idempotent request with nothing yet sent back is tried on another Serving
//! Container, the rest answered 502.
//!
//! A registration names the socket by descriptor and peer address. A socket closed before its
//! registration ends can have its descriptor reused; a cut checks the peer (`getpeername`) and
//! leaves a descriptor alone that no longer talks to the registered container.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use ployz_core::MachineId;

/// One registered exchange.
struct Open {
    machine: MachineId,
    fd: RawFd,
    peer: SocketAddr,
    cut: Arc<AtomicBool>,
}

/// The open exchanges with containers on other Machines.
#[derive(Default)]
pub struct Exchanges {
    next: AtomicU64,
    inner: Mutex<Inner>,
}

/// The registrations and the Machines observed down, under one lock: an exchange registered
/// with a Machine already down is cut as it registers, never missed between a cut and the
/// table that stops choosing the Machine.
#[derive(Default)]
struct Inner {
    open: HashMap<u64, Open>,
    down: HashSet<MachineId>,
}

/// An exchange's registration: ends when dropped.
pub struct Registered {
    id: u64,
    exchanges: Arc<Exchanges>,
    cut: Arc<AtomicBool>,
}

impl Registered {
    /// Whether the exchange was cut because its Machine was observed down.
    pub fn was_cut(&self) -> bool {
        self.cut.load(Ordering::Acquire)
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.exchanges
            .inner
            .lock()
            .expect("exchanges poisoned")
            .open
            .remove(&self.id);
    }
}

impl std::fmt::Debug for Registered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Registered({}, cut: {})", self.id, self.was_cut())
    }
}

impl Exchanges {
    /// Registers the socket `fd`, connected to `peer` on `machine`, until the answer is
    /// dropped. A socket to a Machine already observed down is cut at once.
    pub fn register(
        self: &Arc<Self>,
        machine: &MachineId,
        fd: RawFd,
        peer: SocketAddr,
    ) -> Registered {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let cut = Arc::new(AtomicBool::new(false));
        let open = Open {
            machine: machine.clone(),
            fd,
            peer,
            cut: cut.clone(),
        };
        let mut inner = self.inner.lock().expect("exchanges poisoned");
        if inner.down.contains(machine) {
            end(&open);
        }
        inner.open.insert(id, open);
        Registered {
            id,
            exchanges: self.clone(),
            cut,
        }
    }

    /// Sets the Machines observed down and ends every registered exchange with a container on
    /// one newly down (and every one registered later while it stays down). Answers, per
    /// Machine newly down, how many were cut.
    pub fn set_down(&self, down: &HashSet<MachineId>) -> Vec<(MachineId, usize)> {
        let mut inner = self.inner.lock().expect("exchanges poisoned");
        let newly: Vec<MachineId> = down.difference(&inner.down).cloned().collect();
        inner.down = down.clone();
        let mut out = Vec::new();
        for machine in newly {
            let n = inner
                .open
                .values()
                .filter(|o| o.machine == machine)
                .filter(|o| end(o))
                .count();
            out.push((machine, n));
        }
        out
    }

    /// Exchanges registered now.
    #[cfg(test)]
    fn open(&self) -> usize {
        self.inner.lock().expect("exchanges poisoned").open.len()
    }
}

/// Marks `o` cut and shuts its socket down, unless its descriptor no longer talks to the
/// registered container. Whether it did.
fn end(o: &Open) -> bool {
    if peer_of(o.fd) != Some(o.peer) {
        return false;
    }
    o.cut.store(true, Ordering::Release);
    // SAFETY: `fd` is open (its peer was just read back) and shutting a socket down neither
    // closes nor frees it; its owner still closes it.
    unsafe {
        libc::shutdown(o.fd, libc::SHUT_RDWR);
    }
    true
}

/// The peer address of socket `fd`, or `None` when it is no connected IP socket.
fn peer_of(fd: RawFd) -> Option<SocketAddr> {
    // SAFETY: getpeername writes at most `len` bytes into `storage`, which is large enough for
    // any address family.
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
    let rc = unsafe {
        libc::getpeername(
            fd,
            (&mut storage as *mut libc::sockaddr_storage).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    match storage.ss_family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let a: &libc::sockaddr_in =
                unsafe { &*(&storage as *const libc::sockaddr_storage).cast() };
            Some(SocketAddr::from((
                u32::from_be(a.sin_addr.s_addr).to_be_bytes(),
                u16::from_be(a.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let a: &libc::sockaddr_in6 =
                unsafe { &*(&storage as *const libc::sockaddr_storage).cast() };
            Some(SocketAddr::from((
                a.sin6_addr.s6_addr,
                u16::from_be(a.sin6_port),
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_cut_ends_a_waiting_read_on_that_machines_sockets_only() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut a = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (_a_peer, _) = listener.accept().await.unwrap();
        let mut b = tokio::net::TcpStream::connect(addr).await.unwrap();
        let (_b_peer, _) = listener.accept().await.unwrap();
        let exchanges = Arc::new(Exchanges::default());
        let (down, up) = (MachineId::generate(), MachineId::generate());
        let ra = exchanges.register(&down, a.as_raw_fd(), addr);
        let rb = exchanges.register(&up, b.as_raw_fd(), addr);
        // Nothing will ever come on either socket: the read of `a` ends only by the cut.
        let reading = tokio::spawn(async move {
            let mut buf = [0u8; 16];
            let n = a.read(&mut buf).await;
            (n.map_err(|e| e.kind()), a)
        });
        tokio::task::yield_now().await;
        assert_eq!(
            exchanges.set_down(&[down.clone()].into()),
            [(down.clone(), 1)]
        );
        let (n, _a) = tokio::time::timeout(std::time::Duration::from_secs(5), reading)
            .await
            .expect("the cut read ended at once")
            .unwrap();
        assert_eq!(n, Ok(0));
        assert!(ra.was_cut() && !rb.was_cut());
        let mut buf = [0u8; 1];
        assert!(
            tokio::time::timeout(std::time::Duration::from_millis(50), b.read(&mut buf))
                .await
                .is_err(),
            "the other Machine's socket is untouched"
        );
        assert_eq!(exchanges.open(), 2);
        drop(ra);
        drop(rb);
        assert_eq!(exchanges.open(), 0);
    }

    #[tokio::test]
    async fn an_exchange_registered_while_its_machine_is_down_is_cut_at_once() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let exchanges = Arc::new(Exchanges::default());
        let m = MachineId::generate();
        assert_eq!(exchanges.set_down(&[m.clone()].into()), [(m.clone(), 0)]);
        // Down already: nothing newly down.
        assert!(exchanges.set_down(&[m.clone()].into()).is_empty());
        let r = exchanges.register(&m, s.as_raw_fd(), addr);
        assert!(r.was_cut());
        // Up again: a new exchange is left alone.
        exchanges.set_down(&HashSet::new());
        let s2 = tokio::net::TcpStream::connect(addr).await.unwrap();
        assert!(!exchanges.register(&m, s2.as_raw_fd(), addr).was_cut());
    }

    #[tokio::test]
    async fn a_descriptor_that_no_longer_talks_to_the_container_is_left_alone() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let exchanges = Arc::new(Exchanges::default());
        let m = MachineId::generate();
        // Registered with another peer than the socket's: as if the descriptor was reused.
        let other: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let r = exchanges.register(&m, s.as_raw_fd(), other);
        assert_eq!(exchanges.set_down(&[m.clone()].into()), [(m.clone(), 0)]);
        assert!(!r.was_cut());
        assert_eq!(peer_of(s.as_raw_fd()), Some(addr));
    }
}
