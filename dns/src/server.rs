//! The sockets: UDP workers on `SO_REUSEPORT` sockets and a TCP listener, all answering from
//! the published [`DnsSnapshot`] with one atomic load per query and no lock.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use socket2::{Domain, Protocol, SockRef, Socket, Type};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;

use crate::acl::AllowedSources;
use crate::answer::{self, Action, Policy, Scratch, Transport, Verdict};
use crate::cache::ForwardCache;
use crate::forward::Forwarder;
use crate::metrics::{DnsMetrics, QuerySource};
use crate::snapshot::DnsSnapshot;
use crate::udp::{RecvBatch, SendBatch};
use crate::wire::{self, Rcode};
use crate::DnsError;

/// Socket buffers asked of the kernel (it caps them at `net.core.[rw]mem_max`).
const SOCKET_BUFFER: usize = 4 << 20;
/// How often a blocked UDP worker looks whether the server stopped.
const UDP_STOP_POLL: Duration = Duration::from_millis(200);

/// How to run one DNS server.
#[derive(Debug, Clone)]
pub struct DnsServerConfig {
    /// Where to listen, UDP and TCP: the Machine Gateway on port 53 in the daemon.
    pub listen: SocketAddr,
    /// Sources allowed to query; others get REFUSED. Default: loopback only.
    pub allowed_sources: AllowedSources,
    /// Resolvers for every name outside `.internal`, tried in order. Empty: such names are
    /// REFUSED.
    pub upstreams: Vec<SocketAddr>,
    /// How long one try at one upstream may take. Default 2 s.
    pub forward_timeout: Duration,
    /// Forwards in flight at once; a forwarded query beyond the cap gets SERVFAIL at once
    /// (transient: the client may retry) and never delays `.internal` answers. Default 256.
    pub max_concurrent_forwards: usize,
    /// UDP receive loops, each a dedicated thread blocking on its own `SO_REUSEPORT` socket
    /// (the kernel spreads clients over them). Default: one per CPU.
    pub udp_workers: usize,
    /// TCP connections open at once; more are closed on accept. Default 128.
    pub max_tcp_connections: usize,
    /// How long a TCP connection may sit idle (or take to send a query). Default 10 s.
    pub tcp_idle_timeout: Duration,
    /// Forwarded answers kept for their TTL (`crate::cache`); 0 keeps none. Default 10,000.
    pub cache_entries: usize,
    /// The counters to add to; `None`: new ones. A server bound again after its sockets were
    /// lost keeps counting where the last one stopped.
    pub metrics: Option<Arc<DnsMetrics>>,
}

impl DnsServerConfig {
    /// Defaults for a server on `listen`: loopback sources only, no upstreams.
    pub fn new(listen: SocketAddr) -> DnsServerConfig {
        DnsServerConfig {
            listen,
            allowed_sources: AllowedSources::loopback(),
            upstreams: Vec::new(),
            forward_timeout: Duration::from_secs(2),
            max_concurrent_forwards: 256,
            udp_workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            max_tcp_connections: 128,
            tcp_idle_timeout: Duration::from_secs(10),
            cache_entries: 10_000,
            metrics: None,
        }
    }
}

/// What every worker reads.
struct Shared {
    snapshot: Arc<ArcSwap<DnsSnapshot>>,
    allowed: AllowedSources,
    forwarder: Forwarder,
    /// Upstream answers, kept for their TTL.
    cache: ForwardCache,
    metrics: Arc<DnsMetrics>,
    tcp_permits: Arc<Semaphore>,
    tcp_idle: Duration,
}

impl Shared {
    fn policy(&self, source: IpAddr) -> Policy {
        Policy {
            allowed: self.allowed.allows(source),
            forwarding: self.forwarder.is_enabled(),
        }
    }

    /// Answers one packet into `out` and counts it.
    fn respond(
        &self,
        packet: &[u8],
        source: IpAddr,
        transport: Transport,
        out: &mut Vec<u8>,
        scratch: &mut Scratch,
    ) -> Verdict {
        let verdict = {
            let snapshot = self.snapshot.load();
            answer::respond(
                &snapshot,
                packet,
                self.policy(source),
                transport,
                out,
                scratch,
            )
        };
        self.metrics.query(verdict.source);
        match (verdict.action, verdict.rcode) {
            (Action::Reply, Some(rcode)) => {
                if verdict.truncated {
                    self.metrics.truncated();
                }
                self.metrics.response(rcode);
            }
            (Action::Reply, None) => self.count_reply(out, verdict.truncated),
            (Action::Drop, _) => self.metrics.dropped(),
            (Action::Forward, _) => {}
        }
        verdict
    }

    /// Counts a reply by the code in its header (forwarded replies carry the upstream's).
    fn count_reply(&self, reply: &[u8], truncated: bool) {
        if truncated {
            self.metrics.truncated();
        }
        match Rcode::from_code(u16::from(wire::header_rcode(reply))) {
            Some(rcode) => self.metrics.response(rcode),
            None => self.metrics.response_other(),
        }
    }

    /// The SERVFAIL for a forward that could not be made (`rejected`: over the cap) or failed.
    fn servfail(&self, packet: &[u8], out: &mut Vec<u8>, rejected: bool) -> bool {
        if rejected {
            self.metrics.forward_rejected();
        } else {
            self.metrics.forward_failed();
        }
        let ok = answer::servfail(packet, out);
        if ok {
            self.count_reply(out, false);
        }
        ok
    }

    /// Answers a query to forward from the cache into `out`, fitted to a UDP client when
    /// `udp`; false when no answer to it is kept.
    fn cached(&self, packet: &[u8], udp: bool, out: &mut Vec<u8>) -> bool {
        let Ok(q) = wire::parse_query(packet) else {
            return false;
        };
        if !self.cache.answer(&q, out) {
            return false;
        }
        self.metrics.cache_hit();
        let truncated = udp && wire::truncate_reply(out, &q, q.udp_limit());
        self.count_reply(out, truncated);
        true
    }

    /// Forwards `packet` and writes the reply (or a SERVFAIL) into `out`, fitted to a UDP
    /// client when `udp`; the reply is kept in the cache when it may be. Returns false when
    /// there is nothing to send.
    async fn forward(&self, packet: &[u8], udp: bool, out: &mut Vec<u8>) -> bool {
        match self.forwarder.forward(packet, !udp).await {
            Some(reply) => {
                if let Ok(q) = wire::parse_query(packet) {
                    self.cache.insert(&q, &reply);
                }
                *out = reply;
                let truncated = udp
                    && wire::parse_query(packet)
                        .is_ok_and(|q| wire::truncate_reply(out, &q, q.udp_limit()));
                self.count_reply(out, truncated);
                true
            }
            None => self.servfail(packet, out, false),
        }
    }
}

/// A bound DNS server, not yet serving.
pub struct DnsServer {
    local_addr: SocketAddr,
    udp: Vec<std::net::UdpSocket>,
    tcp: TcpListener,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for DnsServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DnsServer")
            .field("local_addr", &self.local_addr)
            .field("udp_workers", &self.udp.len())
            .finish_non_exhaustive()
    }
}

/// Checks that nothing holds `addr` for UDP or TCP, by binding it briefly without any reuse
/// option. Port 0 picks a free port, which is returned (the same for both protocols).
pub fn check_port_free(addr: SocketAddr) -> Result<SocketAddr, DnsError> {
    let udp = std::net::UdpSocket::bind(addr).map_err(|e| DnsError::bind(addr, "UDP", e))?;
    let resolved = udp
        .local_addr()
        .map_err(|e| DnsError::bind(addr, "UDP", e))?;
    let tcp =
        std::net::TcpListener::bind(resolved).map_err(|e| DnsError::bind(resolved, "TCP", e))?;
    drop((udp, tcp));
    Ok(resolved)
}

fn udp_socket(addr: SocketAddr) -> io::Result<std::net::UdpSocket> {
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    socket.set_reuse_port(true)?;
    // Best effort: bigger buffers ride out bursts; the kernel caps them.
    let _ = socket.set_recv_buffer_size(SOCKET_BUFFER);
    let _ = socket.set_send_buffer_size(SOCKET_BUFFER);
    socket.set_read_timeout(Some(UDP_STOP_POLL))?;
    socket.bind(&addr.into())?;
    Ok(socket.into())
}

fn tcp_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// Attempts at finding a port free for both UDP and TCP when asked for port 0.
const PORT_ZERO_ATTEMPTS: usize = 16;

type Sockets = (SocketAddr, Vec<std::net::UdpSocket>, TcpListener);

/// Checks the port is free, then binds `workers` UDP sockets and one TCP listener on it. For
/// port 0, a port the kernel picked that turns out taken for TCP (or is taken in between) is
/// given up for another.
fn bind_sockets(listen: SocketAddr, workers: usize) -> Result<Sockets, DnsError> {
    let attempts = if listen.port() == 0 {
        PORT_ZERO_ATTEMPTS
    } else {
        1
    };
    let mut attempt = 0;
    loop {
        attempt += 1;
        let bound = check_port_free(listen).and_then(|addr| {
            let udp = (0..workers)
                .map(|_| udp_socket(addr).map_err(|e| DnsError::bind(addr, "UDP", e)))
                .collect::<Result<Vec<_>, _>>()?;
            let tcp = tcp_listener(addr).map_err(|e| DnsError::bind(addr, "TCP", e))?;
            Ok((addr, udp, tcp))
        });
        match bound {
            Err(DnsError::AddressInUse { .. }) if attempt < attempts => continue,
            other => return other,
        }
    }
}

impl DnsServer {
    /// Checks the port is free ([`check_port_free`]), then binds `config.udp_workers` UDP
    /// sockets (sharing the port with `SO_REUSEPORT`) and one TCP listener. Answers come from
    /// whatever `snapshot` holds at each query.
    pub async fn bind(
        config: DnsServerConfig,
        snapshot: Arc<ArcSwap<DnsSnapshot>>,
    ) -> Result<DnsServer, DnsError> {
        let (addr, udp, tcp) = bind_sockets(config.listen, config.udp_workers.max(1))?;
        let metrics = config.metrics.unwrap_or_default();
        let shared = Arc::new(Shared {
            snapshot,
            allowed: config.allowed_sources,
            forwarder: Forwarder::new(
                config.upstreams,
                config.forward_timeout,
                config.max_concurrent_forwards,
                metrics.clone(),
            ),
            cache: ForwardCache::new(config.cache_entries),
            metrics,
            tcp_permits: Arc::new(Semaphore::new(config.max_tcp_connections)),
            tcp_idle: config.tcp_idle_timeout,
        });
        Ok(DnsServer {
            local_addr: addr,
            udp,
            tcp,
            shared,
        })
    }

    /// The address it listens on (with the port the kernel chose for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Its counters, to render when metrics are scraped.
    pub fn metrics(&self) -> Arc<DnsMetrics> {
        self.shared.metrics.clone()
    }

    /// Serves until `shutdown` turns true (or its sender is dropped). Every task and thread it
    /// started, forwards and TCP connections included, is stopped when it returns or is
    /// dropped (UDP threads notice within 200 ms).
    pub async fn run(self, mut shutdown: watch::Receiver<bool>) {
        let (cancel_tx, cancel_rx) = watch::channel(());
        let stopping = Stopping {
            stop: Arc::new(AtomicBool::new(false)),
            _cancel: cancel_tx,
        };
        let runtime = tokio::runtime::Handle::current();
        for (i, socket) in self.udp.into_iter().enumerate() {
            let worker = UdpWorker {
                socket: Arc::new(socket),
                shared: self.shared.clone(),
                stop: stopping.stop.clone(),
                cancel: cancel_rx.clone(),
                runtime: runtime.clone(),
            };
            if let Err(e) = std::thread::Builder::new()
                .name(format!("ployz-dns-udp-{i}"))
                .spawn(move || worker.run())
            {
                tracing::error!(error = %e, "cannot start a DNS UDP worker thread");
            }
        }
        let mut tasks = JoinSet::new();
        tasks.spawn(tcp_acceptor(self.tcp, self.shared.clone()));
        tracing::info!(addr = %self.local_addr, "DNS server listening");
        loop {
            tokio::select! {
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        break;
                    }
                }
                Some(ended) = tasks.join_next() => {
                    tracing::error!(?ended, "a DNS server task ended unexpectedly");
                }
            }
        }
        drop(stopping);
        tracing::info!(addr = %self.local_addr, "DNS server stopped");
    }
}

/// Dropped when [`DnsServer::run`] ends, however it ends: tells the UDP threads to stop and
/// cancels the forwards in flight.
struct Stopping {
    stop: Arc<AtomicBool>,
    _cancel: watch::Sender<()>,
}

impl Drop for Stopping {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// One UDP receive loop on a dedicated thread: batched blocking receives (no event loop
/// between the kernel and the answer), `.internal` queries answered inline into batched
/// sends, forwards handed to the runtime.
struct UdpWorker {
    socket: Arc<std::net::UdpSocket>,
    shared: Arc<Shared>,
    stop: Arc<AtomicBool>,
    /// Closed when the server stops: forwards in flight give up.
    cancel: watch::Receiver<()>,
    runtime: tokio::runtime::Handle,
}

impl UdpWorker {
    fn run(self) {
        let mut recv = RecvBatch::new();
        let mut send = SendBatch::new();
        let mut scratch = Scratch::new();
        while !self.stop.load(Ordering::Relaxed) {
            let received = match recv.recv(&self.socket) {
                Ok(n) => n,
                Err(e) if is_timeout(&e) => continue,
                Err(e) if is_socket_gone(&e) => {
                    // Nothing more arrives here; the daemon binds again when it finds the
                    // listener no longer answers.
                    tracing::error!(error = %e, "DNS UDP socket gone; this worker stops");
                    return;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "DNS UDP receive failed");
                    // Whatever it is, do not spin on it.
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            for i in 0..received {
                let Some((packet, src, cut)) = recv.get(i) else {
                    continue;
                };
                if cut {
                    // Larger than any query: not worth an answer.
                    self.shared.metrics.query(QuerySource::Malformed);
                    self.shared.metrics.dropped();
                    continue;
                }
                let out = send.next_buf();
                let verdict =
                    self.shared
                        .respond(packet, src.ip(), Transport::Udp, out, &mut scratch);
                let reply = match verdict.action {
                    Action::Reply => true,
                    Action::Drop => false,
                    Action::Forward if self.shared.cached(packet, true, out) => true,
                    Action::Forward => match self.shared.forwarder.permit() {
                        Some(permit) => {
                            self.spawn_forward(packet.to_vec(), src, permit);
                            false
                        }
                        None => self.shared.servfail(packet, out, true),
                    },
                };
                if reply {
                    send.push(src);
                }
            }
            send.flush(&self.socket);
        }
    }

    fn spawn_forward(&self, packet: Vec<u8>, src: SocketAddr, permit: OwnedSemaphorePermit) {
        let (shared, socket, mut cancel) = (
            self.shared.clone(),
            self.socket.clone(),
            self.cancel.clone(),
        );
        self.runtime.spawn(async move {
            let _permit = permit;
            let mut out = Vec::new();
            tokio::select! {
                _ = cancel.changed() => return,
                send = shared.forward(&packet, true, &mut out) => if !send { return },
            }
            // Never block the runtime on a full socket buffer: drop the reply instead, the
            // client retries.
            let sent =
                SockRef::from(&*socket).send_to_with_flags(&out, &src.into(), libc::MSG_DONTWAIT);
            if let Err(e) = sent {
                tracing::debug!(error = %e, %src, "DNS UDP send failed");
            }
        });
    }
}

/// Whether the error says the descriptor is no longer a socket (closed or replaced under the
/// server): every further receive would fail the same way.
fn is_socket_gone(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EBADF) | Some(libc::ENOTSOCK) | Some(libc::ECONNABORTED)
    )
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

async fn tcp_acceptor(listener: TcpListener, shared: Arc<Shared>) {
    let mut connections = JoinSet::new();
    loop {
        let accepted = listener.accept().await;
        while connections.try_join_next().is_some() {}
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // Out of file descriptors and the like: do not spin.
                tracing::warn!(error = %e, "DNS TCP accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Strangers get no connection slot: closed at once, before they can hold one.
        if !shared.allowed.allows(peer.ip()) {
            shared.metrics.tcp_rejected();
            continue;
        }
        let Ok(permit) = shared.tcp_permits.clone().try_acquire_owned() else {
            shared.metrics.tcp_rejected();
            continue;
        };
        shared.metrics.tcp_connection();
        connections.spawn(serve_tcp(stream, peer, shared.clone(), permit));
    }
}

/// Answers queries on one TCP connection, one at a time, until it closes or idles out.
async fn serve_tcp(
    mut stream: TcpStream,
    peer: SocketAddr,
    shared: Arc<Shared>,
    _permit: OwnedSemaphorePermit,
) {
    let _ = stream.set_nodelay(true);
    let idle = shared.tcp_idle;
    let mut scratch = Scratch::new();
    let mut packet = Vec::new();
    let mut out = Vec::new();
    let mut framed = Vec::new();
    loop {
        let Ok(Ok(len)) = tokio::time::timeout(idle, stream.read_u16()).await else {
            return;
        };
        packet.resize(usize::from(len), 0);
        let Ok(Ok(_)) = tokio::time::timeout(idle, stream.read_exact(&mut packet)).await else {
            return;
        };
        let verdict = shared.respond(&packet, peer.ip(), Transport::Tcp, &mut out, &mut scratch);
        let send = match verdict.action {
            Action::Reply => true,
            // Junk on a stream: the framing cannot be trusted any more.
            Action::Drop => return,
            Action::Forward if shared.cached(&packet, false, &mut out) => true,
            Action::Forward => match shared.forwarder.permit() {
                Some(_permit) => shared.forward(&packet, false, &mut out).await,
                None => shared.servfail(&packet, &mut out, true),
            },
        };
        if !send {
            return;
        }
        let Ok(len) = u16::try_from(out.len()) else {
            return;
        };
        framed.clear();
        framed.extend_from_slice(&len.to_be_bytes());
        framed.extend_from_slice(&out);
        let Ok(Ok(())) = tokio::time::timeout(idle, stream.write_all(&framed)).await else {
            return;
        };
    }
}
