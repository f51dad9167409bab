//! Ingress Ports: TCP and UDP ports every Machine's edge listens on for one Service
//! (`x-ports: [5432/tcp, 53/udp]`), forwarded to its Serving Containers.
//!
//! - TCP: each connection goes to one Serving Container, round robin, with the HTTP routes'
//!   rules: containers on Machines observed down last, one that refused a connection (or did
//!   not take it within the connect timeout) avoided for a while and the next tried (up to 3),
//!   each connection counted in flight so a drain waits for it, and cut at once when its
//!   container's Machine is observed down. Bytes pass both ways until either side closes.
//! - UDP: each flow (client address and port) goes to one Serving Container, from its own
//!   socket, until it has been idle for [`FLOW_IDLE`]; answers go back from the address and port
//!   the client sent to (the kernel says which address each datagram came to: `IP_PKTINFO`,
//!   `IPV6_RECVPKTINFO`), whichever address the Machine's routing would pick. A flow to a
//!   Machine observed down ends, and the client's next datagram starts a new one elsewhere.
//!
//! The listeners follow the published route table: a port is opened when the table first has
//! it and closed when it no longer does (connections already made stay until they end). A port
//! the Machine already uses elsewhere is reported (`ployz routes`) and tried again.
//!
//! A daemon handing over to a next process sends it copies of its sockets
//! ([`IngressPorts::copies`]); the next process serves them ([`IngressPorts::adopt`]) instead of
//! binding the ports again, both serve them until the old one retires, and no client is
//! refused in between.
//!
//! The ports belong to the edge: its [`EdgeClosing`] closes them with the HTTP listeners
//! (SIGTERM after the drain delay, or retiring after a handover; UDP flows end then), and counts
//! each TCP connection as open until it ends, so the process waits for connections under way as
//! it does for HTTP requests instead of cutting them. A TCP connection has no request to finish
//! (a pooled database connection may never close), so one still open the stop's grace period
//! after the close is cut: a process that handed over does not forward for minutes with a view
//! of the Cluster no longer kept up.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsFd as _, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ployz_core::HostProtocol;
use tokio::io::Interest;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::sync::watch;

use crate::route_table::{InFlight, Route};
use crate::service::{Accepting, OpenConnection};
use crate::{EdgeClosing, RouteController};

/// How long a UDP flow lives without a datagram either way.
pub const FLOW_IDLE: Duration = Duration::from_secs(60);

/// The most UDP flows one port keeps; datagrams of new flows beyond it are dropped.
const MAX_FLOWS: usize = 16_384;

/// How many containers one connection tries.
const MAX_TRIES: usize = 3;

/// How long a container that refused a connection is avoided.
const FAILURE_WINDOW_MS: u64 = 10_000;

/// How often a port that could not be opened is tried again.
const RETRY_BIND: Duration = Duration::from_secs(5);

/// The largest UDP datagram.
const MAX_DATAGRAM: usize = 65_535;

/// The Ingress Ports of one edge.
pub struct IngressPorts {
    routes: RouteController,
    /// The edge's: closes the ports with its listeners and counts their TCP connections.
    closing: EdgeClosing,
    /// The address listened on: every address.
    bind: IpAddr,
    connect_timeout: Duration,
    /// How long a TCP connection may go on once the edge closed.
    close_grace: Duration,
    /// The open listeners.
    open: Mutex<HashMap<(u16, HostProtocol), Open>>,
    /// Sockets a previous process handed over, used when the table has their port.
    inherited: Mutex<HashMap<(u16, HostProtocol), OwnedFd>>,
    /// Set by [`IngressPorts::stop_serving`]: no port opens again.
    stopped: std::sync::atomic::AtomicBool,
}

/// One open Ingress Port: its task stops when `_stop` is dropped; `socket` is a copy of its
/// socket, for a handover.
struct Open {
    _stop: watch::Sender<()>,
    socket: OwnedFd,
}

impl IngressPorts {
    /// Ingress Ports on every address (IPv6 and IPv4), closed with the edge of `closing` (TCP
    /// connections cut `close_grace` after), trying containers for `connect_timeout` each.
    pub fn new(
        routes: RouteController,
        closing: EdgeClosing,
        close_grace: Duration,
        connect_timeout: Duration,
    ) -> Arc<IngressPorts> {
        IngressPorts::on(
            routes,
            closing,
            close_grace,
            IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            connect_timeout,
        )
    }

    /// Ingress Ports on `bind` alone.
    pub fn on(
        routes: RouteController,
        closing: EdgeClosing,
        close_grace: Duration,
        bind: IpAddr,
        connect_timeout: Duration,
    ) -> Arc<IngressPorts> {
        Arc::new(IngressPorts {
            routes,
            closing,
            bind,
            connect_timeout,
            close_grace,
            open: Mutex::new(HashMap::new()),
            inherited: Mutex::new(HashMap::new()),
            stopped: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// Sockets a previous process listened on, to use for their ports instead of binding them.
    /// Those whose port the first published table does not have are closed then.
    pub fn adopt(&self, sockets: Vec<(u16, HostProtocol, OwnedFd)>) {
        let mut inherited = self.inherited.lock().expect("ingress ports poisoned");
        for (port, protocol, socket) in sockets {
            inherited.insert((port, protocol), socket);
        }
    }

    /// Closes every port now and opens none again: a handover whose new process binds the ports
    /// itself (an older release, or more ports than one message carries).
    pub fn stop_serving(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        self.open.lock().expect("ingress ports poisoned").clear();
    }

    /// Copies of the sockets of the ports open now, for a next process to serve too.
    pub fn copies(&self) -> std::io::Result<Vec<(u16, HostProtocol, OwnedFd)>> {
        let open = self.open.lock().expect("ingress ports poisoned");
        open.iter()
            .map(|(&(port, protocol), o)| Ok((port, protocol, o.socket.try_clone()?)))
            .collect()
    }

    /// Keeps the listeners matching the published table until `shutdown` turns true or the
    /// edge closes, then closes them all (TCP connections under way go on).
    pub async fn run(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        loop {
            // Registered before the table is read: a publish after the read wakes it.
            let published = self.routes.published();
            let failed = self.reconcile();
            tokio::select! {
                _ = published => {}
                _ = tokio::time::sleep(RETRY_BIND), if failed => {}
                _ = shutdown.changed() => break,
                () = self.closing.close_called() => break,
            }
            if *shutdown.borrow() {
                break;
            }
        }
        self.open.lock().expect("ingress ports poisoned").clear();
        self.inherited
            .lock()
            .expect("ingress ports poisoned")
            .clear();
    }

    /// Opens the ports the table has and this edge does not listen on, closes those it no
    /// longer has. Answers whether a port could not be opened.
    pub fn reconcile(self: &Arc<Self>) -> bool {
        if self.stopped.load(Ordering::SeqCst) || self.closing.is_closed() {
            return false;
        }
        let table = self.routes.table().load();
        let wanted: Vec<(u16, HostProtocol)> = table.ingress_ports().collect();
        let mut inherited = self.inherited.lock().expect("ingress ports poisoned");
        let mut open = self.open.lock().expect("ingress ports poisoned");
        open.retain(|key, _| {
            let keep = wanted.contains(key);
            if !keep {
                tracing::info!(port = key.0, protocol = %key.1, "Ingress Port closed");
            }
            keep
        });
        let mut failed = false;
        for key in wanted {
            if open.contains_key(&key) {
                continue;
            }
            let addr = SocketAddr::new(self.bind, key.0);
            let (stop, stopped) = watch::channel(());
            let handed = inherited.remove(&key);
            let from = if handed.is_some() {
                "handed over"
            } else {
                "bound"
            };
            let started = match key.1 {
                HostProtocol::Tcp => {
                    handed
                        .map_or_else(|| bind_tcp(addr), adopt_tcp)
                        .and_then(|l| {
                            let copy = l.as_fd().try_clone_to_owned()?;
                            // Counted from now: the edge's close waits for it to stop.
                            let accepting = self.closing.accepting();
                            tokio::spawn(self.clone().accept(l, key.0, stopped, accepting));
                            Ok(copy)
                        })
                }
                HostProtocol::Udp => {
                    handed
                        .map_or_else(|| bind_udp(addr), adopt_udp)
                        .and_then(|s| {
                            let copy = s.as_fd().try_clone_to_owned()?;
                            tokio::spawn(self.clone().relay(Arc::new(s), key.0, stopped));
                            Ok(copy)
                        })
                }
            };
            match started {
                Ok(socket) => {
                    tracing::info!(port = key.0, protocol = %key.1, socket = from, "Ingress Port listening");
                    self.routes.set_not_listening(key, None);
                    open.insert(
                        key,
                        Open {
                            _stop: stop,
                            socket,
                        },
                    );
                }
                Err(e) => {
                    let why = format!("cannot listen on {addr}: {e}");
                    tracing::warn!(port = key.0, protocol = %key.1, error = %e, "Ingress Port not listening; tried again in 5 s");
                    self.routes.set_not_listening(key, Some(why));
                    failed = true;
                }
            }
        }
        // Handed-over sockets for ports the published table does not have close (the empty
        // table of a start says nothing yet).
        if table.generation() > 0 {
            for ((port, protocol), _) in inherited.drain() {
                tracing::info!(port, %protocol, "a handed-over Ingress Port is not routed here; closed");
            }
        }
        failed
    }

    /// Accepts connections on an Ingress Port until it is closed or the edge closes, each
    /// counted as open from its accept on.
    async fn accept(
        self: Arc<Self>,
        listener: TcpListener,
        port: u16,
        mut stopped: watch::Receiver<()>,
        _accepting: Accepting,
    ) {
        loop {
            let accepted = tokio::select! {
                biased;
                () = self.closing.close_called() => return,
                _ = stopped.changed() => return,
                a = listener.accept() => a,
            };
            match accepted {
                Ok((client, _)) => {
                    let _ = client.set_nodelay(true);
                    let open = self.closing.opened();
                    tokio::spawn(self.clone().forward(client, port, open));
                }
                Err(e) => {
                    // Out of descriptors, most likely: a moment for connections to end.
                    tracing::warn!(port, error = %e, "Ingress Port accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// One TCP connection: a container, then bytes both ways until either side closes.
    async fn forward(self: Arc<Self>, mut client: TcpStream, port: u16, _open: OpenConnection) {
        let Some((route, i, _counted, mut upstream)) = self.connect(port).await else {
            // Nothing to forward to: the client sees its connection closed.
            return;
        };
        let up = &route.upstreams[i];
        let registered = match (&up.machine, up.local) {
            (Some(m), false) => Some(self.routes.exchanges().register(
                m,
                upstream.as_raw_fd(),
                up.addr,
            )),
            _ => None,
        };
        tokio::select! {
            _ = tokio::io::copy_bidirectional(&mut client, &mut upstream) => {}
            () = self.grace_over() => {
                tracing::debug!(port, grace_s = self.close_grace.as_secs(), "an Ingress Port's connection still open after the edge's grace period: cut");
            }
        }
        drop(registered);
    }

    /// Ends [`IngressPorts::close_grace`] after the edge closed.
    async fn grace_over(&self) {
        self.closing.close_called().await;
        tokio::time::sleep(self.close_grace).await;
    }

    /// A connection to a Serving Container of Ingress Port `port`: the route, the upstream's
    /// index, its in-flight count (held from before the connect) and the stream. `None` when
    /// there is none or none took the connection.
    ///
    /// The count goes up before the pick is confirmed against the table published after it,
    /// as for HTTP requests: a drain that saw the container unrouted and its count at zero
    /// never has a connection begin under it.
    async fn connect(&self, port: u16) -> Option<(Arc<Route>, usize, Counted, TcpStream)> {
        let mut tried: Vec<usize> = Vec::new();
        let mut table = self.routes.table().load_full();
        let mut route = table.stream(port, HostProtocol::Tcp)?.clone();
        let mut rounds = 0;
        while tried.len() < MAX_TRIES.min(route.upstreams.len()) {
            let i = route.pick(self.routes.now_ms(), &tried)?;
            let counted = Counted::new(&route.upstreams[i].in_flight);
            let now = self.routes.table().load_full();
            if !Arc::ptr_eq(&now, &table) && rounds < 2 {
                // Another table since the pick: pick again from it.
                rounds += 1;
                drop(counted);
                table = now;
                route = table.stream(port, HostProtocol::Tcp)?.clone();
                tried.clear();
                continue;
            }
            tried.push(i);
            let addr = route.upstreams[i].addr;
            match tokio::time::timeout(self.connect_timeout, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => {
                    let _ = s.set_nodelay(true);
                    return Some((route, i, counted, s));
                }
                Ok(Err(e)) => {
                    tracing::debug!(port, %addr, error = %e, "Ingress Port: connect failed; trying the next container");
                }
                Err(_) => {
                    tracing::debug!(port, %addr, "Ingress Port: connect timed out; trying the next container");
                }
            }
            route.mark_failed(i, self.routes.now_ms() + FAILURE_WINDOW_MS);
        }
        None
    }

    /// Relays the datagrams of a UDP Ingress Port until it is closed.
    async fn relay(
        self: Arc<Self>,
        socket: Arc<UdpSocket>,
        port: u16,
        mut stopped: watch::Receiver<()>,
    ) {
        let flows: Arc<Mutex<HashMap<SocketAddr, Arc<Flow>>>> = Arc::default();
        let mut buf = vec![0u8; MAX_DATAGRAM];
        loop {
            let received = tokio::select! {
                r = socket.async_io(Interest::READABLE, || recv_from_to(&socket, &mut buf)) => r,
                _ = stopped.changed() => return,
            };
            let Ok((n, client, to)) = received else {
                continue;
            };
            let existing = flows.lock().expect("flows poisoned").get(&client).cloned();
            let flow = match existing {
                Some(f) => f,
                None => {
                    if flows.lock().expect("flows poisoned").len() >= MAX_FLOWS {
                        continue;
                    }
                    let Some(flow) = self.open_flow(port).await else {
                        continue;
                    };
                    flows
                        .lock()
                        .expect("flows poisoned")
                        .insert(client, flow.clone());
                    tokio::spawn(answers(
                        flow.clone(),
                        socket.clone(),
                        (client, to),
                        flows.clone(),
                        stopped.clone(),
                    ));
                    flow
                }
            };
            flow.touch();
            let _ = flow.upstream.send(&buf[..n]).await;
        }
    }

    /// A new flow to a Serving Container of UDP Ingress Port `port`.
    async fn open_flow(&self, port: u16) -> Option<Arc<Flow>> {
        let route = self
            .routes
            .table()
            .load()
            .stream(port, HostProtocol::Udp)?
            .clone();
        let i = route.pick(self.routes.now_ms(), &[])?;
        let up = &route.upstreams[i];
        let local: SocketAddr = if up.addr.is_ipv4() {
            "0.0.0.0:0".parse().expect("an address")
        } else {
            "[::]:0".parse().expect("an address")
        };
        let socket = UdpSocket::bind(local).await.ok()?;
        socket.connect(up.addr).await.ok()?;
        let registered = match (&up.machine, up.local) {
            (Some(m), false) => Some(self.routes.exchanges().register(
                m,
                socket.as_raw_fd(),
                up.addr,
            )),
            _ => None,
        };
        up.in_flight.acquire();
        Some(Arc::new(Flow {
            registered,
            upstream: socket,
            in_flight: up.in_flight.clone(),
            last: AtomicU64::new(now_secs()),
        }))
    }
}

/// One UDP flow: the socket connected to its container.
struct Flow {
    /// Dropped first: the registration ends before the socket closes, so its descriptor is
    /// never registered while another socket may reuse it.
    registered: Option<crate::exchanges::Registered>,
    upstream: UdpSocket,
    /// Its container's in-flight count, held while the flow lives.
    in_flight: Arc<InFlight>,
    /// When a datagram last passed, either way (seconds on a monotonic clock).
    last: AtomicU64,
}

impl Flow {
    fn touch(&self) {
        self.last.store(now_secs(), Ordering::Relaxed);
    }
}

impl Drop for Flow {
    fn drop(&mut self) {
        self.in_flight.release();
    }
}

/// Passes a flow's answers back to its client until the flow is idle for [`FLOW_IDLE`], its
/// socket is cut or the port is closed, then forgets the flow. Each answer is read into the
/// thread's buffer and sent on without waiting (a datagram the socket cannot take now is
/// dropped, as the network may drop it), so an idle flow holds no buffer.
async fn answers(
    flow: Arc<Flow>,
    socket: Arc<UdpSocket>,
    (client, from): (SocketAddr, Option<Destination>),
    flows: Arc<Mutex<HashMap<SocketAddr, Arc<Flow>>>>,
    mut stopped: watch::Receiver<()>,
) {
    thread_local! {
        static BUF: std::cell::RefCell<Vec<u8>> = std::cell::RefCell::new(vec![0u8; MAX_DATAGRAM]);
    }
    loop {
        let idle_for = now_secs().saturating_sub(flow.last.load(Ordering::Relaxed));
        let left = FLOW_IDLE.saturating_sub(Duration::from_secs(idle_for));
        if left.is_zero() {
            break;
        }
        let ready = tokio::select! {
            r = tokio::time::timeout(left, flow.upstream.readable()) => r,
            _ = stopped.changed() => break,
        };
        match ready {
            Ok(Ok(())) => {}
            // An error on the socket (an ICMP refusal) ends the flow.
            Ok(Err(_)) => break,
            Err(_) => continue,
        }
        let received = BUF.with(|buf| {
            let mut buf = buf.borrow_mut();
            match flow.upstream.try_recv(&mut buf) {
                Ok(n) => {
                    let _ = socket.try_io(Interest::WRITABLE, || {
                        send_to_from(&socket, &buf[..n], client, from)
                    });
                    Some(Ok(n))
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
                Err(e) => Some(Err(e)),
            }
        });
        match received {
            None => continue,
            Some(Err(_)) => break,
            // A cut socket reads 0 bytes from then on; an empty datagram is passed on.
            Some(Ok(0)) if flow.registered.as_ref().is_some_and(|r| r.was_cut()) => break,
            Some(Ok(_)) => flow.touch(),
        }
    }
    let mut map = flows.lock().expect("flows poisoned");
    if map.get(&client).is_some_and(|f| Arc::ptr_eq(f, &flow)) {
        map.remove(&client);
    }
}

/// Holds one in-flight count of a container while a connection lives.
struct Counted(Arc<InFlight>);

impl Counted {
    fn new(in_flight: &Arc<InFlight>) -> Counted {
        in_flight.acquire();
        Counted(in_flight.clone())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.release();
    }
}

/// Seconds on a monotonic clock.
fn now_secs() -> u64 {
    static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    START
        .get_or_init(std::time::Instant::now)
        .elapsed()
        .as_secs()
}

/// A TCP listener on `addr` (an IPv6 unspecified address takes IPv4 too), without
/// `SO_REUSEPORT`: a port another process holds is an error, never shared.
fn bind_tcp(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::STREAM,
        Some(socket2::Protocol::TCP),
    )?;
    if addr.is_ipv6() {
        socket.set_only_v6(false)?;
    }
    socket.set_reuse_address(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    TcpListener::from_std(socket.into())
}

/// The local address a datagram came to, as the kernel reported it (with the interface, for
/// IPv6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Destination {
    V4(Ipv4Addr),
    V6(Ipv6Addr, u32),
}

/// Receives one datagram on `socket`: its length, sender, and the local address it came to.
fn recv_from_to(
    socket: &UdpSocket,
    buf: &mut [u8],
) -> std::io::Result<(usize, SocketAddr, Option<Destination>)> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, SockaddrLike, SockaddrStorage};
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!(libc::in6_pktinfo, libc::in_pktinfo);
    let msg = recvmsg::<SockaddrStorage>(
        socket.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::MSG_DONTWAIT,
    )
    .map_err(std::io::Error::from)?;
    let mut to = None;
    if let Ok(cmsgs) = msg.cmsgs() {
        for cmsg in cmsgs {
            match cmsg {
                ControlMessageOwned::Ipv4PacketInfo(info) => {
                    to = Some(Destination::V4(Ipv4Addr::from(u32::from_be(
                        info.ipi_addr.s_addr,
                    ))));
                }
                ControlMessageOwned::Ipv6PacketInfo(info) => {
                    let addr = Ipv6Addr::from(info.ipi6_addr.s6_addr);
                    to = Some(match addr.to_ipv4_mapped() {
                        Some(v4) => Destination::V4(v4),
                        None => Destination::V6(addr, info.ipi6_ifindex),
                    });
                }
                _ => {}
            }
        }
    }
    let from = msg
        .address
        .and_then(|a| match a.family() {
            Some(nix::sys::socket::AddressFamily::Inet) => a
                .as_sockaddr_in()
                .map(|a| SocketAddr::V4(std::net::SocketAddrV4::from(*a))),
            Some(nix::sys::socket::AddressFamily::Inet6) => a
                .as_sockaddr_in6()
                .map(|a| SocketAddr::V6(std::net::SocketAddrV6::from(*a))),
            _ => None,
        })
        .ok_or_else(|| std::io::Error::other("a datagram without a sender's address"))?;
    Ok((msg.bytes, from, to))
}

/// Sends `data` to `to` from the local address `from` (where the client sent its datagram),
/// or from what routing picks when that is not known.
fn send_to_from(
    socket: &UdpSocket,
    data: &[u8],
    to: SocketAddr,
    from: Option<Destination>,
) -> std::io::Result<usize> {
    use nix::sys::socket::{sendmsg, ControlMessage, MsgFlags, SockaddrStorage};
    let iov = [std::io::IoSlice::new(data)];
    let addr = SockaddrStorage::from(to);
    let v4;
    let v6;
    let cmsgs: &[ControlMessage] = match from {
        Some(Destination::V4(a)) => {
            v4 = [libc::in_pktinfo {
                ipi_ifindex: 0,
                ipi_spec_dst: libc::in_addr {
                    s_addr: u32::from(a).to_be(),
                },
                ipi_addr: libc::in_addr { s_addr: 0 },
            }];
            &[ControlMessage::Ipv4PacketInfo(&v4[0])]
        }
        Some(Destination::V6(a, ifindex)) => {
            v6 = [libc::in6_pktinfo {
                ipi6_addr: libc::in6_addr {
                    s6_addr: a.octets(),
                },
                ipi6_ifindex: ifindex,
            }];
            &[ControlMessage::Ipv6PacketInfo(&v6[0])]
        }
        None => &[],
    };
    sendmsg(
        socket.as_raw_fd(),
        &iov,
        cmsgs,
        MsgFlags::MSG_DONTWAIT,
        Some(&addr),
    )
    .map_err(std::io::Error::from)
}

/// Asks the kernel to say which local address each datagram came to: `IP_PKTINFO` (IPv4, and
/// IPv4 on a dual-stack IPv6 socket) and `IPV6_RECVPKTINFO`.
fn report_destinations(socket: &impl std::os::fd::AsFd, v6: bool) -> std::io::Result<()> {
    use nix::sys::socket::{setsockopt, sockopt};
    setsockopt(socket, sockopt::Ipv4PacketInfo, &true).map_err(std::io::Error::from)?;
    if v6 {
        setsockopt(socket, sockopt::Ipv6RecvPacketInfo, &true).map_err(std::io::Error::from)?;
    }
    Ok(())
}

/// The TCP listener a previous process handed over.
fn adopt_tcp(socket: OwnedFd) -> std::io::Result<TcpListener> {
    let listener = std::net::TcpListener::from(socket);
    listener.set_nonblocking(true)?;
    TcpListener::from_std(listener)
}

/// The UDP socket a previous process handed over.
fn adopt_udp(socket: OwnedFd) -> std::io::Result<UdpSocket> {
    let socket = std::net::UdpSocket::from(socket);
    // An older release's socket: the options are set again (they are the same on ours).
    report_destinations(&socket, socket.local_addr()?.is_ipv6())?;
    socket.set_nonblocking(true)?;
    UdpSocket::from_std(socket)
}

/// A UDP socket on `addr` (an IPv6 unspecified address takes IPv4 too).
fn bind_udp(addr: SocketAddr) -> std::io::Result<UdpSocket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(addr),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    if addr.is_ipv6() {
        socket.set_only_v6(false)?;
    }
    report_destinations(&socket, addr.is_ipv6())?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    UdpSocket::from_std(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::route_table::tests::obs;
    use crate::route_table::RouteTable;
    use ployz_core::{ContainerState, MachineId, PortSpec};
    use std::collections::HashSet;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// How long the tests' TCP connections may go on once the edge closed.
    const GRACE: Duration = Duration::from_secs(30);

    /// A port nothing listens on now.
    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// A container observation at 127.0.0.`n` publishing `ports` as Ingress Ports.
    fn container(
        m: &MachineId,
        n: u8,
        ports: &[(u16, u16, HostProtocol)],
    ) -> ployz_core::ContainerRuntimeObservation {
        let mut o = obs(m, n, &[], ContainerState::Running, None);
        o.address = Some(std::net::Ipv4Addr::new(127, 0, 0, n));
        o.spec.as_mut().unwrap().ports = ports
            .iter()
            .map(|(published, container_port, protocol)| PortSpec::Stream {
                published: *published,
                container_port: *container_port,
                protocol: *protocol,
            })
            .collect();
        o
    }

    fn controller(
        observations: &[ployz_core::ContainerRuntimeObservation],
        m: &MachineId,
    ) -> RouteController {
        let c = RouteController::new();
        let table = RouteTable::build(
            observations,
            &HashSet::new(),
            (m, &HashSet::new()),
            &*c.counters_for_tests(),
            1,
        );
        c.table().store(Arc::new(table));
        c
    }

    /// A TCP server on 127.0.0.`n`:`port` answering each connection's first read with its
    /// name and what it read.
    async fn tcp_echo(n: u8, port: u16) {
        let l = TcpListener::bind((std::net::Ipv4Addr::new(127, 0, 0, n), port))
            .await
            .unwrap();
        tokio::spawn(async move {
            loop {
                let (mut s, _) = l.accept().await.unwrap();
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    while let Ok(k) = s.read(&mut buf).await {
                        if k == 0 {
                            break;
                        }
                        let mut answer = format!("c{n}:").into_bytes();
                        answer.extend_from_slice(&buf[..k]);
                        if s.write_all(&answer).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
    }

    /// A UDP server on 127.0.0.`n`:`port` answering each datagram with its name and it.
    async fn udp_echo(n: u8, port: u16) {
        let s = UdpSocket::bind((std::net::Ipv4Addr::new(127, 0, 0, n), port))
            .await
            .unwrap();
        tokio::spawn(async move {
            let mut buf = [0u8; 64];
            loop {
                let (k, from) = s.recv_from(&mut buf).await.unwrap();
                let mut answer = format!("c{n}:").into_bytes();
                answer.extend_from_slice(&buf[..k]);
                s.send_to(&answer, from).await.unwrap();
            }
        });
    }

    async fn tcp_ask(port: u16, what: &str) -> String {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(what.as_bytes()).await.unwrap();
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        String::from_utf8_lossy(&buf[..n]).into_owned()
    }

    #[tokio::test]
    async fn tcp_connections_go_round_robin_and_skip_a_container_that_refuses() {
        let m = MachineId::generate();
        let (published, backend) = (free_port(), free_port());
        tcp_echo(1, backend).await;
        tcp_echo(2, backend).await;
        // Container 3 publishes the port but nothing listens: refused, skipped.
        let routes = controller(
            &[
                container(&m, 1, &[(published, backend, HostProtocol::Tcp)]),
                container(&m, 2, &[(published, backend, HostProtocol::Tcp)]),
                container(&m, 3, &[(published, backend, HostProtocol::Tcp)]),
            ],
            &m,
        );
        let ports = IngressPorts::on(
            routes.clone(),
            EdgeClosing::default(),
            GRACE,
            "127.0.0.1".parse().unwrap(),
            Duration::from_secs(1),
        );
        assert!(!ports.reconcile());
        let mut seen = std::collections::BTreeSet::new();
        for i in 0..9 {
            let answer = tcp_ask(published, &format!("q{i}")).await;
            assert!(answer.ends_with(&format!(":q{i}")), "{answer}");
            seen.insert(answer[..2].to_owned());
        }
        assert_eq!(seen, ["c1".to_owned(), "c2".to_owned()].into());
        // A connection holds its container's in-flight count while it lives.
        let mut held = TcpStream::connect(("127.0.0.1", published)).await.unwrap();
        held.write_all(b"x").await.unwrap();
        let mut buf = [0u8; 8];
        let _ = held.read(&mut buf).await.unwrap();
        let in_flight: usize = routes.view().ingress_ports[0]
            .upstreams
            .iter()
            .map(|u| u.in_flight)
            .sum();
        assert_eq!(in_flight, 1);
        drop(held);

        // A table without the port closes it.
        routes.table().store(Arc::new(RouteTable::default()));
        assert!(!ports.reconcile());
        tokio::time::timeout(Duration::from_secs(5), async {
            while TcpStream::connect(("127.0.0.1", published)).await.is_ok() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the port closed");
    }

    #[tokio::test]
    async fn udp_flows_stay_with_one_container_and_answers_come_back() {
        let m = MachineId::generate();
        let published = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let backend = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        udp_echo(1, backend).await;
        udp_echo(2, backend).await;
        let routes = controller(
            &[
                container(&m, 1, &[(published, backend, HostProtocol::Udp)]),
                container(&m, 2, &[(published, backend, HostProtocol::Udp)]),
            ],
            &m,
        );
        let ports = IngressPorts::on(
            routes.clone(),
            EdgeClosing::default(),
            GRACE,
            "127.0.0.1".parse().unwrap(),
            Duration::from_secs(1),
        );
        assert!(!ports.reconcile());
        let mut by_client = Vec::new();
        for client in 0..4 {
            let s = UdpSocket::bind("127.0.0.1:0").await.unwrap();
            s.connect(("127.0.0.1", published)).await.unwrap();
            let mut first = None;
            for i in 0..3 {
                s.send(format!("d{client}-{i}").as_bytes()).await.unwrap();
                let mut buf = [0u8; 64];
                let n = tokio::time::timeout(Duration::from_secs(5), s.recv(&mut buf))
                    .await
                    .expect("an answer")
                    .unwrap();
                let answer = String::from_utf8_lossy(&buf[..n]).into_owned();
                assert!(answer.ends_with(&format!(":d{client}-{i}")), "{answer}");
                // Every datagram of one flow reaches the same container.
                let container = answer[..2].to_owned();
                assert_eq!(first.get_or_insert(container.clone()), &container);
            }
            by_client.push(first.unwrap());
        }
        // Flows are spread over the containers, and each holds an in-flight count.
        assert!(
            by_client.contains(&"c1".to_owned()) && by_client.contains(&"c2".to_owned()),
            "{by_client:?}"
        );
        let in_flight: usize = routes.view().ingress_ports[0]
            .upstreams
            .iter()
            .map(|u| u.in_flight)
            .sum();
        assert_eq!(in_flight, 4);
    }

    #[tokio::test]
    async fn a_port_taken_on_the_machine_is_reported_and_tried_again() {
        let m = MachineId::generate();
        let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let published = taken.local_addr().unwrap().port();
        let routes = controller(
            &[container(&m, 1, &[(published, 9, HostProtocol::Tcp)])],
            &m,
        );
        let ports = IngressPorts::on(
            routes.clone(),
            EdgeClosing::default(),
            GRACE,
            "127.0.0.1".parse().unwrap(),
            Duration::from_secs(1),
        );
        assert!(ports.reconcile());
        let view = routes.view();
        let why = view.ingress_ports[0].not_listening.as_deref().unwrap();
        assert!(
            why.starts_with(&format!("cannot listen on 127.0.0.1:{published}: ")),
            "{why}"
        );
        drop(taken);
        assert!(!ports.reconcile());
        assert_eq!(routes.view().ingress_ports[0].not_listening, None);
    }

    fn free_udp_port() -> u16 {
        std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// Runs `ports` until the returned sender says stop.
    fn run(ports: &Arc<IngressPorts>) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
        let (stop, stopped) = watch::channel(false);
        (stop, tokio::spawn(ports.clone().run(stopped)))
    }

    /// A next edge given copies of an edge's sockets serves them (binding the ports afresh
    /// would fail while the first holds them), both serve until the first stops, and the
    /// next goes on alone: no connection is refused, no datagram left unanswered.
    #[tokio::test]
    async fn copies_of_the_sockets_are_served_by_the_next_edge() {
        let m = MachineId::generate();
        let (tcp, tcp_backend) = (free_port(), free_port());
        let (udp, udp_backend) = (free_udp_port(), free_udp_port());
        tcp_echo(1, tcp_backend).await;
        udp_echo(1, udp_backend).await;
        let observed = [container(
            &m,
            1,
            &[
                (tcp, tcp_backend, HostProtocol::Tcp),
                (udp, udp_backend, HostProtocol::Udp),
            ],
        )];
        let edge = || {
            IngressPorts::on(
                controller(&observed, &m),
                EdgeClosing::default(),
                GRACE,
                "127.0.0.1".parse().unwrap(),
                Duration::from_secs(1),
            )
        };
        let udp_client = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        udp_client.connect(("127.0.0.1", udp)).await.unwrap();
        let udp_ask = |what: &'static str| {
            let client = &udp_client;
            async move {
                client.send(what.as_bytes()).await.unwrap();
                let mut buf = [0u8; 64];
                let n = tokio::time::timeout(Duration::from_secs(5), client.recv(&mut buf))
                    .await
                    .expect("an answer")
                    .unwrap();
                String::from_utf8_lossy(&buf[..n]).into_owned()
            }
        };

        let old = edge();
        let (stop, running) = run(&old);
        tokio::time::timeout(Duration::from_secs(5), async {
            while TcpStream::connect(("127.0.0.1", tcp)).await.is_err() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the port opened");
        assert_eq!(udp_ask("before").await, "c1:before");
        let copies = old.copies().unwrap();
        assert_eq!(copies.len(), 2);

        let next = edge();
        next.adopt(copies);
        assert!(!next.reconcile(), "{:?}", next.routes.view().ingress_ports);
        for i in 0..10 {
            let what = format!("both{i}");
            assert_eq!(tcp_ask(tcp, &what).await, format!("c1:{what}"));
        }
        assert_eq!(udp_ask("both").await, "c1:both");

        stop.send_replace(true);
        running.await.unwrap();
        for i in 0..10 {
            let what = format!("after{i}");
            assert_eq!(tcp_ask(tcp, &what).await, format!("c1:{what}"));
        }
        assert_eq!(udp_ask("after").await, "c1:after");
        // The next edge stopping closes them: no copy lingers.
        let (stop, running) = run(&next);
        stop.send_replace(true);
        running.await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), async {
            while TcpStream::connect(("127.0.0.1", tcp)).await.is_ok()
                || std::net::UdpSocket::bind(("127.0.0.1", udp)).is_err()
            {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("both ports closed");
    }

    /// A UDP client that sent to one of the Machine's addresses gets its answers from that
    /// address, not from the one routing would pick (a floating address beside the primary
    /// one): here 127.0.0.2 and 127.0.0.3, where routing answers 127.0.0.1 from 127.0.0.1, on
    /// a dual-stack socket as the daemon binds; and over IPv6.
    #[tokio::test]
    async fn udp_answers_leave_from_the_address_the_client_sent_to() {
        let m = MachineId::generate();
        let (published, backend) = (free_udp_port(), free_udp_port());
        udp_echo(1, backend).await;
        let routes = controller(
            &[container(&m, 1, &[(published, backend, HostProtocol::Udp)])],
            &m,
        );
        let ports = IngressPorts::on(
            routes,
            EdgeClosing::default(),
            GRACE,
            IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            Duration::from_secs(1),
        );
        assert!(!ports.reconcile());
        for (from, to) in [
            ("127.0.0.1:0", "127.0.0.2"),
            ("127.0.0.1:0", "127.0.0.3"),
            ("[::1]:0", "::1"),
        ] {
            let client = UdpSocket::bind(from).await.unwrap();
            // Connected: the kernel passes on only datagrams from exactly there.
            let to: IpAddr = to.parse().unwrap();
            client.connect((to, published)).await.unwrap();
            for i in 0..2 {
                let what = format!("{to}-{i}");
                client.send(what.as_bytes()).await.unwrap();
                let mut buf = [0u8; 64];
                let n = tokio::time::timeout(Duration::from_secs(5), client.recv(&mut buf))
                    .await
                    .unwrap_or_else(|_| panic!("no answer from {to}:{published}"))
                    .unwrap();
                assert_eq!(String::from_utf8_lossy(&buf[..n]), format!("c1:{what}"));
            }
        }
    }

    /// A handover whose new process binds the ports itself: they close at once and stay
    /// closed, whatever the table says.
    #[tokio::test]
    async fn ports_stopped_for_a_next_process_stay_closed() {
        let m = MachineId::generate();
        let (tcp, backend) = (free_port(), free_port());
        tcp_echo(1, backend).await;
        let ports = IngressPorts::on(
            controller(
                &[container(&m, 1, &[(tcp, backend, HostProtocol::Tcp)])],
                &m,
            ),
            EdgeClosing::default(),
            GRACE,
            "127.0.0.1".parse().unwrap(),
            Duration::from_secs(1),
        );
        assert!(!ports.reconcile());
        assert_eq!(tcp_ask(tcp, "open").await, "c1:open");
        ports.stop_serving();
        assert!(!ports.reconcile());
        assert!(ports.copies().unwrap().is_empty());
        tokio::time::timeout(Duration::from_secs(5), async {
            while TcpStream::connect(("127.0.0.1", tcp)).await.is_ok() {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("the port closed");
    }

    /// A handed-over socket waits while the table is the empty one of a start, and closes once
    /// a published table does not route its port.
    #[tokio::test]
    async fn a_handed_over_socket_the_table_does_not_route_closes() {
        let port = free_port();
        let handed = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
        let routes = RouteController::new();
        let ports = IngressPorts::on(
            routes.clone(),
            EdgeClosing::default(),
            GRACE,
            "127.0.0.1".parse().unwrap(),
            Duration::from_secs(1),
        );
        ports.adopt(vec![(port, HostProtocol::Tcp, handed.into())]);
        assert!(!ports.reconcile());
        assert!(
            TcpStream::connect(("127.0.0.1", port)).await.is_ok(),
            "kept before the store was read"
        );
        routes.table().store(Arc::new(RouteTable::build(
            &[],
            &HashSet::new(),
            (&MachineId::generate(), &HashSet::new()),
            &*routes.counters_for_tests(),
            1,
        )));
        assert!(!ports.reconcile());
        assert!(
            TcpStream::connect(("127.0.0.1", port)).await.is_err(),
            "closed once a table without it was published"
        );
    }

    /// Closing the edge closes its Ingress Ports with its listeners, and a TCP connection under
    /// way is counted open until it ends: the process waits for it instead of cutting it.
    #[tokio::test]
    async fn closing_the_edge_closes_the_ports_and_waits_for_their_connections() {
        let m = MachineId::generate();
        let (published, backend) = (free_port(), free_port());
        // A container that answers only once told to.
        let (accepted_tx, mut accepted) = tokio::sync::mpsc::unbounded_channel();
        let release = Arc::new(tokio::sync::Notify::new());
        let l = TcpListener::bind(("127.0.0.1", backend)).await.unwrap();
        let held = release.clone();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).await.unwrap();
            accepted_tx.send(()).unwrap();
            held.notified().await;
            s.write_all(&buf[..n]).await.unwrap();
        });
        let closing = EdgeClosing::default();
        let ports = IngressPorts::on(
            controller(
                &[container(&m, 1, &[(published, backend, HostProtocol::Tcp)])],
                &m,
            ),
            closing.clone(),
            GRACE,
            "127.0.0.1".parse().unwrap(),
            Duration::from_secs(1),
        );
        let (_stop, running) = run(&ports);
        let mut client = tokio::time::timeout(Duration::from_secs(5), async {
            loop {
                match TcpStream::connect(("127.0.0.1", published)).await {
                    Ok(c) => return c,
                    Err(_) => tokio::task::yield_now().await,
                }
            }
        })
        .await
        .expect("the port opened");
        client.write_all(b"under way").await.unwrap();
        accepted.recv().await.expect("the container got the bytes");

        closing.close();
        assert_eq!(
            closing.closed(Duration::from_millis(200)).await,
            1,
            "the connection under way is counted open"
        );
        tokio::time::timeout(Duration::from_secs(5), running)
            .await
            .expect("the ports stop with the edge")
            .unwrap();
        assert!(
            TcpStream::connect(("127.0.0.1", published)).await.is_err(),
            "no connection is taken once the edge closed"
        );
        release.notify_one();
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(&buf[..n], b"under way", "the connection went on to its end");
        drop(client);
        assert_eq!(closing.closed(Duration::from_secs(5)).await, 0);
        assert!(!ports.reconcile(), "nothing opens again");
        assert!(ports.copies().unwrap().is_empty());
    }

    /// A connection still open the grace period after the edge closed is cut, and counted open
    /// no longer: a pooled connection that never ends does not hold the process.
    #[tokio::test]
    async fn a_connection_still_open_the_grace_after_the_close_is_cut() {
        let m = MachineId::generate();
        let (published, backend) = (free_port(), free_port());
        // A container that reads and never answers.
        let (accepted_tx, mut accepted) = tokio::sync::mpsc::unbounded_channel();
        let l = TcpListener::bind(("127.0.0.1", backend)).await.unwrap();
        tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf).await;
            accepted_tx.send(()).unwrap();
            let _ = s.read(&mut buf).await;
        });
        let closing = EdgeClosing::default();
        let ports = IngressPorts::on(
            controller(
                &[container(&m, 1, &[(published, backend, HostProtocol::Tcp)])],
                &m,
            ),
            closing.clone(),
            Duration::from_millis(300),
            "127.0.0.1".parse().unwrap(),
            Duration::from_secs(1),
        );
        assert!(!ports.reconcile());
        let mut client = TcpStream::connect(("127.0.0.1", published)).await.unwrap();
        client.write_all(b"pooled").await.unwrap();
        accepted.recv().await.expect("the container got the bytes");
        closing.close();
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(10), client.read(&mut buf))
            .await
            .expect("the connection was cut after the grace period");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
        assert_eq!(closing.closed(Duration::from_secs(5)).await, 0);
    }
}
