//! Forwarding of every name outside `.internal` to the host's resolvers.
//!
//! Each try uses a UDP socket connected to the upstream (so only its datagrams arrive), taken
//! at random from the upstream's idle sockets or opened anew (the kernel picks a random source
//! port), under a random query ID; a reply counts only if it carries that ID and the same
//! question. A socket goes back to the idle ones only after a clean exchange, and is closed after
//! [`SOCKET_USES`] of them, so source ports keep changing while most tries skip the
//! bind and connect. A truncated reply is asked again over TCP. Upstreams
//! are tried in order, each with its own timeout; a SERVFAIL or REFUSED from one moves on to
//! the next. A semaphore caps forwards in flight so a flood of them cannot starve the
//! `.internal` answers.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::metrics::DnsMetrics;
use crate::wire::{self, Rcode};
use crate::DnsError;

/// The port resolvers listen on.
const DNS_PORT: u16 = 53;

/// The receive buffer of a forward. A datagram that fills it may have been cut by the kernel,
/// and is asked again over TCP.
const FORWARD_BUFFER: usize = 4096;

/// How many exchanges one UDP socket serves before it is closed.
const SOCKET_USES: u32 = 64;

/// Idle sockets kept per upstream at most.
const IDLE_SOCKETS: usize = 64;

/// Connected UDP sockets to one upstream, idle between tries, with the exchanges each served.
#[derive(Debug, Default)]
struct IdleSockets(std::sync::Mutex<Vec<(UdpSocket, u32)>>);

impl IdleSockets {
    /// One idle socket, chosen at random, or `None`.
    fn take(&self) -> Option<(UdpSocket, u32)> {
        let mut idle = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if idle.is_empty() {
            return None;
        }
        let i = rand::Rng::gen_range(&mut rand::thread_rng(), 0..idle.len());
        Some(idle.swap_remove(i))
    }

    /// Gives back a socket that just finished a clean exchange (closed when worn or in excess).
    fn give_back(&self, socket: UdpSocket, uses: u32) {
        if uses >= SOCKET_USES {
            return;
        }
        let mut idle = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if idle.len() < IDLE_SOCKETS {
            idle.push((socket, uses));
        }
    }
}

/// Sends queries to the upstream resolvers.
#[derive(Debug)]
pub(crate) struct Forwarder {
    upstreams: Vec<SocketAddr>,
    /// Per upstream, in the same order.
    idle: Vec<IdleSockets>,
    timeout: Duration,
    permits: Arc<Semaphore>,
    metrics: Arc<DnsMetrics>,
}

/// Why one exchange with one upstream produced nothing usable.
#[derive(Debug)]
enum TryError {
    Io(io::Error),
    TimedOut,
}

impl std::fmt::Display for TryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TryError::Io(e) => write!(f, "{e}"),
            TryError::TimedOut => f.write_str("timed out"),
        }
    }
}

impl From<io::Error> for TryError {
    fn from(e: io::Error) -> TryError {
        TryError::Io(e)
    }
}

impl Forwarder {
    pub(crate) fn new(
        upstreams: Vec<SocketAddr>,
        timeout: Duration,
        max_in_flight: usize,
        metrics: Arc<DnsMetrics>,
    ) -> Forwarder {
        Forwarder {
            idle: upstreams.iter().map(|_| IdleSockets::default()).collect(),
            upstreams,
            timeout,
            permits: Arc::new(Semaphore::new(max_in_flight)),
            metrics,
        }
    }

    /// Whether any upstream is configured.
    pub(crate) fn is_enabled(&self) -> bool {
        !self.upstreams.is_empty()
    }

    /// A slot for one forward, or `None` when the cap is reached.
    pub(crate) fn permit(&self) -> Option<OwnedSemaphorePermit> {
        self.permits.clone().try_acquire_owned().ok()
    }

    /// Forwards a client's query (which parsed) to the upstreams in order. Returns the first
    /// usable reply with the client's ID restored, or `None` when every upstream failed.
    /// `tcp` asks over TCP straight away (the client came over TCP and wants the whole answer).
    pub(crate) async fn forward(&self, packet: &[u8], tcp: bool) -> Option<Vec<u8>> {
        let q = wire::parse_query(packet).ok()?;
        let mut msg = packet.to_vec();
        for (i, upstream) in self.upstreams.iter().enumerate() {
            let mut result = self.ask(i, &mut msg, q.question, tcp).await;
            if !tcp && result.as_ref().is_ok_and(|r| wire::is_truncated(r)) {
                self.metrics.forward_tcp_retry();
                result = self.ask(i, &mut msg, q.question, true).await;
            }
            match result {
                Ok(mut reply) if usable(&reply) => {
                    wire::set_id(&mut reply, q.id);
                    return Some(reply);
                }
                Ok(reply) => tracing::debug!(
                    %upstream,
                    rcode = wire::header_rcode(&reply),
                    "upstream resolver failed the query; trying the next"
                ),
                Err(e) => {
                    tracing::debug!(%upstream, error = %e, "upstream resolver did not answer")
                }
            }
        }
        None
    }

    /// One exchange with upstream `i` under a fresh random ID, bounded by the per-try timeout.
    async fn ask(
        &self,
        i: usize,
        msg: &mut [u8],
        question: &[u8],
        tcp: bool,
    ) -> Result<Vec<u8>, TryError> {
        let upstream = self.upstreams[i];
        let id = rand::random::<u16>();
        wire::set_id(msg, id);
        let msg = &*msg;
        if tcp {
            return tokio::time::timeout(self.timeout, exchange_tcp(upstream, msg, id, question))
                .await
                .unwrap_or(Err(TryError::TimedOut));
        }
        let (socket, uses) = match self.idle[i].take() {
            Some(idle) => idle,
            None => (connected_udp(upstream).await?, 0),
        };
        // A socket whose try failed or timed out is dropped (closed): a late reply must not
        // meet the next try.
        let reply = tokio::time::timeout(self.timeout, exchange_udp(&socket, msg, id, question))
            .await
            .unwrap_or(Err(TryError::TimedOut))?;
        self.idle[i].give_back(socket, uses + 1);
        Ok(reply)
    }
}

/// Whether a reply is an answer worth returning: not SERVFAIL or REFUSED, which say only that
/// this upstream could not help.
fn usable(reply: &[u8]) -> bool {
    !matches!(
        Rcode::from_code(u16::from(wire::header_rcode(reply))),
        Some(Rcode::ServFail | Rcode::Refused)
    )
}

fn unspecified_for(upstream: SocketAddr) -> SocketAddr {
    match upstream {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    }
}

/// A UDP socket on a port the kernel picks, connected to `upstream`.
async fn connected_udp(upstream: SocketAddr) -> Result<UdpSocket, TryError> {
    let socket = UdpSocket::bind(unspecified_for(upstream)).await?;
    socket.connect(upstream).await?;
    Ok(socket)
}

/// One query over a connected UDP socket; waits for the datagram that matches.
async fn exchange_udp(
    socket: &UdpSocket,
    msg: &[u8],
    id: u16,
    question: &[u8],
) -> Result<Vec<u8>, TryError> {
    socket.send(msg).await?;
    let mut buf = vec![0u8; FORWARD_BUFFER];
    loop {
        let n = socket.recv(&mut buf).await?;
        if wire::reply_matches(&buf[..n], id, question) {
            if n == buf.len() {
                // Possibly cut by the kernel: make it look truncated so TCP is tried.
                wire::set_truncated(&mut buf);
            }
            buf.truncate(n);
            return Ok(buf);
        }
        tracing::debug!("ignored a datagram that does not answer our query");
    }
}

/// One query over a fresh TCP connection with 2-byte length framing.
async fn exchange_tcp(
    upstream: SocketAddr,
    msg: &[u8],
    id: u16,
    question: &[u8],
) -> Result<Vec<u8>, TryError> {
    let mut stream = TcpStream::connect(upstream).await?;
    stream.set_nodelay(true)?;
    let len = u16::try_from(msg.len()).map_err(|_| io::Error::other("query too long"))?;
    let mut framed = Vec::with_capacity(msg.len() + 2);
    framed.extend_from_slice(&len.to_be_bytes());
    framed.extend_from_slice(msg);
    stream.write_all(&framed).await?;
    loop {
        let len = usize::from(stream.read_u16().await?);
        let mut reply = vec![0u8; len];
        stream.read_exact(&mut reply).await?;
        if wire::reply_matches(&reply, id, question) {
            return Ok(reply);
        }
    }
}

/// The nameservers of a resolv.conf text (`nameserver <address>` lines), on port 53, in file
/// order without repeats. Lines that do not parse are skipped; an IPv6 zone is accepted only
/// as a number (`fe80::1%2`).
pub fn parse_resolv_conf(text: &str) -> Vec<SocketAddr> {
    let mut out: Vec<SocketAddr> = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("nameserver") {
            continue;
        }
        let Some(addr) = words.next().and_then(parse_nameserver) else {
            continue;
        };
        if !out.contains(&addr) {
            out.push(addr);
        }
    }
    out
}

fn parse_nameserver(text: &str) -> Option<SocketAddr> {
    match text.split_once('%') {
        None => text
            .parse::<IpAddr>()
            .ok()
            .map(|ip| SocketAddr::new(ip, DNS_PORT)),
        Some((ip, zone)) => {
            let ip: Ipv6Addr = ip.parse().ok()?;
            let scope = zone.parse().ok()?;
            Some(SocketAddr::V6(SocketAddrV6::new(ip, DNS_PORT, 0, scope)))
        }
    }
}

/// Drops the upstreams that would be this server itself: any nameserver on an address the
/// server listens on (whatever the port). For an unspecified listen address (`0.0.0.0`, `::`)
/// the loopback and unspecified addresses of that family on the listen port are dropped too;
/// other local addresses cannot be told apart here.
pub fn exclude_own_addresses(upstreams: Vec<SocketAddr>, listen: &[SocketAddr]) -> Vec<SocketAddr> {
    let is_own = |u: &SocketAddr| {
        listen.iter().any(|l| {
            let (lip, uip) = (l.ip().to_canonical(), u.ip().to_canonical());
            lip == uip
                || (lip.is_unspecified()
                    && lip.is_ipv4() == uip.is_ipv4()
                    && (uip.is_loopback() || uip.is_unspecified())
                    && l.port() == u.port())
        })
    };
    upstreams.into_iter().filter(|u| !is_own(u)).collect()
}

/// The upstreams named by the resolv.conf at `path`, minus this server's own addresses (see
/// [`exclude_own_addresses`]). On hosts with systemd-resolved, `/etc/resolv.conf` names its
/// 127.0.0.53 stub, which is the right upstream for a daemon in the host network namespace;
/// `/run/systemd/resolve/resolv.conf` names the real servers instead.
pub fn upstreams_from_resolv_conf(
    path: &Path,
    listen: &[SocketAddr],
) -> Result<Vec<SocketAddr>, DnsError> {
    let text = std::fs::read_to_string(path).map_err(|source| DnsError::Read {
        path: path.to_owned(),
        source,
    })?;
    Ok(exclude_own_addresses(parse_resolv_conf(&text), listen))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn reads_nameserver_lines_in_order() {
        let text = "# generated\nsearch internal example.com\nnameserver 10.0.0.2\n\
                    nameserver   2001:db8::53 # comment\n; old\n#nameserver 9.9.9.9\n\
                    nameserver fe80::1%2\nnameserver fe80::1%eth0\nnameserver bogus\n\
                    nameserver 10.0.0.2\noptions edns0\n";
        assert_eq!(
            parse_resolv_conf(text),
            vec![
                sa("10.0.0.2:53"),
                sa("[2001:db8::53]:53"),
                SocketAddr::V6(SocketAddrV6::new("fe80::1".parse().unwrap(), 53, 0, 2)),
            ]
        );
    }

    #[test]
    fn excludes_the_servers_own_addresses() {
        let ups = vec![
            sa("10.210.0.1:53"),
            sa("127.0.0.53:53"),
            sa("1.1.1.1:53"),
            sa("[::1]:53"),
        ];
        assert_eq!(
            exclude_own_addresses(ups.clone(), &[sa("10.210.0.1:53")]),
            vec![sa("127.0.0.53:53"), sa("1.1.1.1:53"), sa("[::1]:53")]
        );
        assert_eq!(
            exclude_own_addresses(ups.clone(), &[sa("0.0.0.0:53")]),
            vec![sa("10.210.0.1:53"), sa("1.1.1.1:53"), sa("[::1]:53")]
        );
        assert_eq!(
            exclude_own_addresses(ups.clone(), &[sa("0.0.0.0:5353")]),
            ups
        );
        assert_eq!(
            exclude_own_addresses(vec![sa("127.0.0.1:53")], &[sa("127.0.0.1:5353")]),
            vec![]
        );
    }

    #[test]
    fn reads_a_resolv_conf_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("resolv.conf");
        std::fs::write(&path, "nameserver 127.0.0.53\nnameserver 10.210.0.1\n").unwrap();
        assert_eq!(
            upstreams_from_resolv_conf(&path, &[sa("10.210.0.1:53")]).unwrap(),
            vec![sa("127.0.0.53:53")]
        );
        let missing = upstreams_from_resolv_conf(&dir.path().join("nope"), &[]).unwrap_err();
        assert!(missing.to_string().contains("nope"), "{missing}");
    }

    #[test]
    fn servfail_and_refused_are_not_usable() {
        let reply = |rcode: u8| {
            let mut r = vec![0u8; 12];
            r[2] = 0x80;
            r[3] = rcode;
            r
        };
        assert!(usable(&reply(0)));
        assert!(usable(&reply(3)));
        assert!(!usable(&reply(2)));
        assert!(!usable(&reply(5)));
    }
}
