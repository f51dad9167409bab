//! The userspace WireGuard device: Ployz's own data path around boringtun's protocol core.
//!
//! boringtun's `noise::Tunn` does WireGuard itself (handshakes, sessions, timers, the AEAD); this
//! module moves the packets. It exists because the device layer that comes with boringtun moves
//! one packet per system call at every step (one TUN read, one `sendto`, one `recvfrom`, one TUN
//! write per ~1,400 bytes, with a wakeup of an event loop in between), which held the lab's mesh
//! to 2% of its link. Here:
//!
//! - the TUN interface is opened with virtio headers and TCP segmentation offload
//!   ([`tun`]): one read hands over up to 64 KiB of one TCP flow, cut into packets here
//!   ([`offload::segment`]);
//! - the packets of one read are encrypted under one lock of their peer and leave in one
//!   `sendmsg` with UDP GSO ([`udp`]);
//! - one `recvmsg` with UDP GRO takes up to 64 KiB of datagrams from one sender; after
//!   decryption the TCP segments of one flow are written back to the TUN interface as one
//!   ([`offload::Coalescer`]);
//! - each direction has its own thread, blocking in `poll(2)` when idle (an idle device costs
//!   only its timer thread's tick), and never shares an event loop with the daemon's other work.
//!
//! The configuration path is unchanged: the same text protocol `wg(8)` and
//! `defguard_wireguard_rs` speak ([`uapi`]), so `wg show` works and the mesh code above does not
//! know which device it drives.

pub mod offload;
mod tun;
pub mod uapi;
mod udp;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use defguard_boringtun::device::allowed_ips::AllowedIps;
use defguard_boringtun::noise::handshake::parse_handshake_anon;
use defguard_boringtun::noise::rate_limiter::RateLimiter;
use defguard_boringtun::noise::{Packet, Tunn, TunnResult};
use defguard_boringtun::x25519::{PublicKey, StaticSecret};

use self::offload::{Coalescer, VnetHdr, VNET_HDR_LEN};
use self::tun::Tun;
pub use self::tun::TunOffloads;
use self::udp::{Udp, MAX_GRO_BYTES, MAX_GSO_BYTES, MAX_GSO_SEGMENTS};

/// How often peers' timers run (handshake retries, keepalives, rekeying). Their own resolution
/// is a second; a quarter of that keeps retries on time.
const TIMER_TICK: Duration = Duration::from_millis(250);
/// Handshakes per second the device takes before it asks senders for cookies.
const HANDSHAKE_RATE_LIMIT: u64 = 100;
/// WireGuard's overhead on a data packet (header and tag), and the padding to 16 bytes.
const DATA_OVERHEAD: usize = 32 + 16;
/// The smallest buffer `Tunn` writes a handshake into.
const MIN_MESSAGE_BUFFER: usize = 148;
/// A TUN read's buffer: the virtio header and the largest IP packet.
const TUN_BUFFER: usize = VNET_HDR_LEN + 65_535;

const MESSAGE_DATA: u32 = 4;

/// Counters of the device's work since it started; see [`Stats`].
#[derive(Debug, Default)]
struct Counters {
    tun_reads: AtomicU64,
    tun_writes: AtomicU64,
    udp_sends: AtomicU64,
    udp_receives: AtomicU64,
    packets_sent: AtomicU64,
    packets_received: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    dropped_no_peer: AtomicU64,
    dropped_no_endpoint: AtomicU64,
    dropped_invalid: AtomicU64,
}

/// What the device has done since it started, and how it moves packets: the figures behind
/// `ployz wg show` and the mesh metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Stats {
    /// The TUN interface hands over and takes back TCP segments of up to 64 KiB.
    pub tun_offload: bool,
    /// Sends are segmented by the kernel (UDP GSO).
    pub udp_gso: bool,
    /// Receives are coalesced by the kernel (UDP GRO).
    pub udp_gro: bool,
    /// Reads from the TUN interface (each one or more packets).
    pub tun_reads: u64,
    /// Writes to the TUN interface (each one or more packets).
    pub tun_writes: u64,
    /// UDP send calls (each one or more datagrams).
    pub udp_sends: u64,
    /// UDP receive calls (each one or more datagrams).
    pub udp_receives: u64,
    /// WireGuard packets sent (data and handshake).
    pub packets_sent: u64,
    /// WireGuard packets received.
    pub packets_received: u64,
    /// Encrypted bytes sent.
    pub bytes_sent: u64,
    /// Encrypted bytes received.
    pub bytes_received: u64,
    /// Packets from the interface to an address no peer is allowed.
    pub dropped_no_peer: u64,
    /// Packets to a peer whose endpoint is not known yet.
    pub dropped_no_endpoint: u64,
    /// Datagrams that were not WireGuard, failed authentication, or came from a source the
    /// sending peer is not allowed.
    pub dropped_invalid: u64,
}

/// One peer: its WireGuard state, where it is, and what it may send.
struct Peer {
    public: [u8; 32],
    index: u32,
    tunn: Mutex<Tunn>,
    config: Mutex<PeerConfig>,
}

#[derive(Debug, Clone, Default)]
struct PeerConfig {
    endpoint: Option<SocketAddr>,
    allowed_ips: Vec<(IpAddr, u8)>,
    keepalive: Option<u16>,
    preshared_key: Option<[u8; 32]>,
}

impl Peer {
    fn endpoint(&self) -> Option<SocketAddr> {
        lock(&self.config).endpoint
    }
}

/// The device's configuration and peers. Read by the data path per batch; written by `set`.
struct State {
    key: Option<(StaticSecret, PublicKey)>,
    listen_port: u16,
    fwmark: Option<u32>,
    udp4: Option<Arc<Udp>>,
    udp6: Option<Arc<Udp>>,
    peers: HashMap<[u8; 32], Arc<Peer>>,
    by_index: HashMap<u32, Arc<Peer>>,
    allowed: AllowedIps<Arc<Peer>>,
    rate_limiter: Option<Arc<RateLimiter>>,
}

impl Default for State {
    fn default() -> State {
        State {
            key: None,
            listen_port: 0,
            fwmark: None,
            udp4: None,
            udp6: None,
            peers: HashMap::new(),
            by_index: HashMap::new(),
            allowed: AllowedIps::new(),
            rate_limiter: None,
        }
    }
}

impl State {
    fn udp_for(&self, to: SocketAddr) -> Option<&Arc<Udp>> {
        match to {
            SocketAddr::V4(_) => self.udp4.as_ref(),
            SocketAddr::V6(_) => self.udp6.as_ref(),
        }
    }

    fn rebuild_allowed(&mut self) {
        let mut allowed = AllowedIps::new();
        for peer in self.peers.values() {
            for (addr, cidr) in &lock(&peer.config).allowed_ips {
                allowed.insert(*addr, u32::from(*cidr), peer.clone());
            }
        }
        self.allowed = allowed;
    }

    fn new_index(&self) -> u32 {
        loop {
            let index = rand::random::<u32>() & 0x00ff_ffff;
            if index != 0 && !self.by_index.contains_key(&index) {
                return index;
            }
        }
    }
}

struct Shared {
    tun: Tun,
    state: RwLock<State>,
    stopping: AtomicBool,
    /// Readable once the device stops; never drained, so every thread sees it.
    stop: OwnedFd,
    /// Written when the listening sockets change; the receiving thread drains it.
    sockets_changed: OwnedFd,
    counters: Counters,
}

impl Shared {
    fn state(&self) -> std::sync::RwLockReadGuard<'_, State> {
        self.state
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn state_mut(&self) -> std::sync::RwLockWriteGuard<'_, State> {
        self.state
            .write()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

fn eventfd() -> io::Result<OwnedFd> {
    // SAFETY: plain eventfd creation; the result is checked.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a descriptor we just created and own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn signal(fd: &OwnedFd) {
    let one: u64 = 1;
    // SAFETY: an eventfd takes an 8-byte write.
    unsafe { libc::write(fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
}

fn drain(fd: &OwnedFd) {
    let mut value: u64 = 0;
    // SAFETY: an eventfd gives an 8-byte read; non-blocking.
    unsafe { libc::read(fd.as_raw_fd(), (&mut value as *mut u64).cast(), 8) };
}

/// A running device. Dropping it stops its threads and removes its TUN interface.
pub struct Device {
    name: String,
    shared: Arc<Shared>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device")
            .field("name", &self.name)
            .field("offloads", &self.shared.tun.offloads())
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Device {
    /// Creates the TUN interface `name` in the calling thread's network namespace (the threads
    /// started here inherit it, and so do the sockets they open later) and starts the data path.
    /// The interface is down, without key, port or peers.
    pub fn create(name: &str) -> io::Result<Device> {
        let tun = Tun::create(name)?;
        let shared = Arc::new(Shared {
            tun,
            state: RwLock::new(State::default()),
            stopping: AtomicBool::new(false),
            stop: eventfd()?,
            sockets_changed: eventfd()?,
            counters: Counters::default(),
        });
        let mut device = Device {
            name: name.to_owned(),
            shared: shared.clone(),
            threads: Vec::new(),
        };
        let spawn = |role: &str, run: fn(Arc<Shared>)| {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name(format!("wg-{role}"))
                .spawn(move || run(shared))
        };
        device.threads.push(spawn("send", send_loop)?);
        device.threads.push(spawn("receive", receive_loop)?);
        device.threads.push(spawn("timers", timer_loop)?);
        Ok(device)
    }

    /// The interface name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's counters and offloads.
    pub fn stats(&self) -> Stats {
        let c = &self.shared.counters;
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let state = self.shared.state();
        let udp = state.udp4.as_ref().or(state.udp6.as_ref());
        Stats {
            tun_offload: self.shared.tun.offloads().tso,
            udp_gso: udp.is_some_and(|udp| udp.gso()),
            udp_gro: udp.is_some_and(|udp| udp.gro()),
            tun_reads: get(&c.tun_reads),
            tun_writes: get(&c.tun_writes),
            udp_sends: get(&c.udp_sends),
            udp_receives: get(&c.udp_receives),
            packets_sent: get(&c.packets_sent),
            packets_received: get(&c.packets_received),
            bytes_sent: get(&c.bytes_sent),
            bytes_received: get(&c.bytes_received),
            dropped_no_peer: get(&c.dropped_no_peer),
            dropped_no_endpoint: get(&c.dropped_no_endpoint),
            dropped_invalid: get(&c.dropped_invalid),
        }
    }

    /// Answers a `get=1` request: the `key=value` lines of the device and its peers.
    pub fn get(&self) -> String {
        let state = self.shared.state();
        let mut out = String::new();
        if let Some((secret, _)) = &state.key {
            uapi::line(&mut out, "private_key", uapi::hex(secret.as_bytes()));
        }
        if state.listen_port != 0 {
            uapi::line(&mut out, "listen_port", state.listen_port);
        }
        if let Some(mark) = state.fwmark {
            uapi::line(&mut out, "fwmark", mark);
        }
        let mut peers: Vec<_> = state.peers.values().collect();
        peers.sort_by_key(|peer| peer.public);
        for peer in peers {
            let config = lock(&peer.config).clone();
            uapi::line(&mut out, "public_key", uapi::hex(&peer.public));
            if let Some(key) = config.preshared_key {
                uapi::line(&mut out, "preshared_key", uapi::hex(&key));
            }
            if let Some(endpoint) = config.endpoint {
                uapi::line(&mut out, "endpoint", endpoint);
            }
            uapi::line(
                &mut out,
                "persistent_keepalive_interval",
                config.keepalive.unwrap_or(0),
            );
            for (addr, cidr) in &config.allowed_ips {
                uapi::line(&mut out, "allowed_ip", format_args!("{addr}/{cidr}"));
            }
            let tunn = lock(&peer.tunn);
            if let Some(time) = tunn.last_handshake_time() {
                uapi::line(&mut out, "last_handshake_time_sec", time.as_secs());
                uapi::line(&mut out, "last_handshake_time_nsec", time.subsec_nanos());
            }
            let (_, tx_bytes, rx_bytes, ..) = tunn.stats();
            uapi::line(&mut out, "rx_bytes", rx_bytes);
            uapi::line(&mut out, "tx_bytes", tx_bytes);
        }
        out
    }

    /// Applies a `set=1` request (the lines after `set=1`); answers the errno, 0 on success.
    /// A request that does not parse changes nothing.
    pub fn set(&self, body: &str) -> i32 {
        match uapi::parse_set(body) {
            Ok(request) => match self.apply(request) {
                Ok(()) => 0,
                Err(errno) => errno,
            },
            Err(errno) => errno,
        }
    }

    fn apply(&self, request: uapi::SetRequest) -> Result<(), i32> {
        let mut state = self.shared.state_mut();
        // A peer needs the device's key for its session: refused whole, before any change.
        if state.key.is_none()
            && request.private_key.is_none()
            && request.peers.iter().any(|p| !p.remove)
        {
            return Err(libc::ENOKEY);
        }
        let mut sockets_changed = false;
        if let Some(key) = request.private_key {
            let secret = StaticSecret::from(key);
            let public = PublicKey::from(&secret);
            let limiter = Arc::new(RateLimiter::new(&public, HANDSHAKE_RATE_LIMIT));
            for peer in state.peers.values() {
                lock(&peer.tunn).set_static_private(secret.clone(), public, Some(limiter.clone()));
            }
            state.rate_limiter = Some(limiter);
            state.key = Some((secret, public));
        }
        if let Some(mark) = request.fwmark {
            let mark = (mark != 0).then_some(mark);
            if mark != state.fwmark {
                // The sockets bound now take it (0 clears it); sockets bound later carry it.
                for udp in state.udp4.iter().chain(state.udp6.iter()) {
                    udp.set_mark(mark.unwrap_or(0))
                        .map_err(|err| err.raw_os_error().unwrap_or(libc::EINVAL))?;
                }
                state.fwmark = mark;
            }
        }
        if let Some(port) = request.listen_port {
            if state.udp4.is_none() || (port != state.listen_port && port != 0) {
                bind(&mut state, port)?;
                sockets_changed = true;
            }
        }
        if request.replace_peers {
            state.peers.clear();
            state.by_index.clear();
        }
        for set in request.peers {
            apply_peer(&mut state, set);
        }
        state.rebuild_allowed();
        drop(state);
        if sockets_changed {
            signal(&self.shared.sockets_changed);
        }
        Ok(())
    }
}

/// Binds the listening sockets on `port` (0: a free one, the same for both families).
fn bind(state: &mut State, port: u16) -> Result<(), i32> {
    let fwmark = state.fwmark;
    let udp4 = Udp::bind(false, port, fwmark).map_err(|err| {
        tracing::warn!(port, error = %err, "the userspace WireGuard device could not bind its port");
        err.raw_os_error().unwrap_or(libc::EADDRINUSE)
    })?;
    let port = udp4.port().map_err(|_| libc::EIO)?;
    // A host without IPv6 still gets an IPv4 mesh.
    let udp6 = match Udp::bind(true, port, fwmark) {
        Ok(udp6) => Some(Arc::new(udp6)),
        Err(err) => {
            tracing::info!(port, error = %err, "the userspace WireGuard device listens on IPv4 only");
            None
        }
    };
    state.udp4 = Some(Arc::new(udp4));
    state.udp6 = udp6;
    state.listen_port = port;
    Ok(())
}

fn apply_peer(state: &mut State, set: uapi::PeerSet) {
    if set.remove {
        if let Some(peer) = state.peers.remove(&set.public_key) {
            state.by_index.remove(&peer.index);
        }
        return;
    }
    let existing = state.peers.get(&set.public_key).cloned();
    if existing.is_none() && set.update_only {
        return;
    }
    let Some((secret, public)) = state.key.clone() else {
        // `apply` refuses a request that would get here.
        return;
    };
    if set.public_key == *public.as_bytes() {
        // WireGuard never peers with itself.
        return;
    }
    let mut config = existing
        .as_ref()
        .map(|peer| lock(&peer.config).clone())
        .unwrap_or_default();
    if let Some(endpoint) = set.endpoint {
        config.endpoint = Some(endpoint);
    }
    if set.replace_allowed_ips {
        config.allowed_ips.clear();
    }
    for allowed in set.allowed_ips {
        if !config.allowed_ips.contains(&allowed) {
            config.allowed_ips.push(allowed);
        }
    }
    let keepalive_changed = set
        .keepalive
        .is_some_and(|keepalive| (keepalive != 0).then_some(keepalive) != config.keepalive);
    if let Some(keepalive) = set.keepalive {
        config.keepalive = (keepalive != 0).then_some(keepalive);
    }
    let psk_changed = set
        .preshared_key
        .is_some_and(|key| (key != [0; 32]).then_some(key) != config.preshared_key);
    if let Some(key) = set.preshared_key {
        config.preshared_key = (key != [0; 32]).then_some(key);
    }
    match existing {
        // Endpoint and allowed IPs change in place: the session goes on.
        Some(peer) if !keepalive_changed && !psk_changed => {
            *lock(&peer.config) = config;
        }
        // The keepalive and the preshared key live inside the session state: a new one.
        _ => {
            if let Some(old) = state.peers.remove(&set.public_key) {
                state.by_index.remove(&old.index);
            }
            let index = state.new_index();
            let tunn = Tunn::new(
                secret,
                PublicKey::from(set.public_key),
                config.preshared_key,
                config.keepalive,
                index,
                state.rate_limiter.clone(),
            );
            let peer = Arc::new(Peer {
                public: set.public_key,
                index,
                tunn: Mutex::new(tunn),
                config: Mutex::new(config),
            });
            state.by_index.insert(index, peer.clone());
            state.peers.insert(set.public_key, peer);
        }
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::Release);
        signal(&self.shared.stop);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}

/// Waits until one of `fds` is readable, the timeout passes, or the device stops. Returns false
/// when stopping.
fn wait(shared: &Shared, fds: &[RawFd], timeout: Option<Duration>) -> bool {
    wait_ready(shared, fds, timeout).is_some()
}

/// [`wait`], answering which of `fds` are readable (bit `i` for `fds[i]`); `None` when
/// stopping.
fn wait_ready(shared: &Shared, fds: &[RawFd], timeout: Option<Duration>) -> Option<u8> {
    const MAX: usize = 4;
    assert!(
        fds.len() < MAX,
        "the device waits on at most three descriptors"
    );
    let unused = libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    };
    let mut pollfds = [unused; MAX];
    pollfds[0] = libc::pollfd {
        fd: shared.stop.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    for (slot, fd) in pollfds[1..].iter_mut().zip(fds) {
        *slot = libc::pollfd {
            fd: *fd,
            events: libc::POLLIN,
            revents: 0,
        };
    }
    let timeout = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    // SAFETY: `pollfds` is a live array; the first `1 + fds.len()` entries are polled.
    let rc = unsafe {
        libc::poll(
            pollfds.as_mut_ptr(),
            (1 + fds.len()) as libc::nfds_t,
            timeout,
        )
    };
    if shared.stopping.load(Ordering::Acquire) {
        return None;
    }
    // An interrupted or failed poll reports everything ready: the reads find out.
    Some(
        pollfds[1..=fds.len()]
            .iter()
            .enumerate()
            .filter(|(_, p)| rc < 0 || p.revents != 0)
            .fold(0, |bits, (i, _)| bits | 1 << i),
    )
}

/// Encrypted packets waiting to leave, back to back, with their lengths.
struct SendBatch {
    buf: Vec<u8>,
    lens: Vec<usize>,
}

impl SendBatch {
    fn new() -> SendBatch {
        SendBatch {
            buf: Vec::with_capacity(128 * 1024),
            lens: Vec::with_capacity(128),
        }
    }

    fn clear(&mut self) {
        self.buf.clear();
        self.lens.clear();
    }

    /// Encrypts `packet` into the batch. `tunn` answers a handshake message instead when it has
    /// no session (the packet waits in it for the handshake).
    fn encapsulate(&mut self, tunn: &mut Tunn, packet: &[u8]) -> Result<(), ()> {
        let start = self.buf.len();
        let room = (packet.len() + DATA_OVERHEAD).max(MIN_MESSAGE_BUFFER);
        self.buf.resize(start + room, 0);
        match tunn.encapsulate(packet, &mut self.buf[start..]) {
            TunnResult::WriteToNetwork(out) => {
                let len = out.len();
                self.buf.truncate(start + len);
                self.lens.push(len);
                Ok(())
            }
            TunnResult::Done => {
                self.buf.truncate(start);
                Ok(())
            }
            _ => {
                self.buf.truncate(start);
                Err(())
            }
        }
    }

    /// Sends the batch to `to`: runs of equal-sized packets in one GSO send each.
    fn send(&self, udp: &Udp, to: SocketAddr, counters: &Counters) {
        let mut offset = 0;
        let mut i = 0;
        while i < self.lens.len() {
            let segment = self.lens[i];
            let mut end = i + 1;
            let mut bytes = segment;
            // A run: equal sizes, the last one may be shorter (and ends it).
            while end < self.lens.len()
                && end - i < MAX_GSO_SEGMENTS
                && bytes + self.lens[end] <= MAX_GSO_BYTES
                && self.lens[end] <= segment
            {
                bytes += self.lens[end];
                end += 1;
                if self.lens[end - 1] < segment {
                    break;
                }
            }
            let _ = udp.send_segments(&self.buf[offset..offset + bytes], segment, to);
            counters.udp_sends.fetch_add(1, Ordering::Relaxed);
            counters
                .packets_sent
                .fetch_add((end - i) as u64, Ordering::Relaxed);
            counters
                .bytes_sent
                .fetch_add(bytes as u64, Ordering::Relaxed);
            offset += bytes;
            i = end;
        }
    }
}

/// Interface to peers: read, cut, encrypt, send.
fn send_loop(shared: Arc<Shared>) {
    let mut frame = vec![0u8; TUN_BUFFER];
    let mut scratch = vec![0u8; 65_535];
    let mut batch = SendBatch::new();
    let vnet = shared.tun.offloads().vnet_hdr;
    let counters = &shared.counters;
    loop {
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        let n = match shared.tun.read(&mut frame) {
            Ok(n) => n,
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                if !wait(&shared, &[shared.tun.as_raw_fd()], None) {
                    return;
                }
                continue;
            }
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => {
                tracing::error!(error = %err, "the userspace WireGuard device cannot read its interface; its sending stopped");
                return;
            }
        };
        counters.tun_reads.fetch_add(1, Ordering::Relaxed);
        let (hdr, packet) = if vnet {
            let Some(hdr) = VnetHdr::parse(&frame[..n]) else {
                continue;
            };
            (hdr, &mut frame[VNET_HDR_LEN..n])
        } else {
            (VnetHdr::default(), &mut frame[..n])
        };
        let Some(dst) = Tunn::dst_address(packet) else {
            continue;
        };
        let state = shared.state();
        let Some(peer) = state.allowed.find(dst).cloned() else {
            counters.dropped_no_peer.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let Some(endpoint) = peer.endpoint() else {
            counters.dropped_no_endpoint.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        let Some(udp) = state.udp_for(endpoint).cloned() else {
            counters.dropped_no_endpoint.fetch_add(1, Ordering::Relaxed);
            continue;
        };
        drop(state);
        batch.clear();
        {
            let mut tunn = lock(&peer.tunn);
            let result = offload::segment(&hdr, packet, &mut scratch, |segment| {
                if batch.encapsulate(&mut tunn, segment).is_err() {
                    counters.dropped_invalid.fetch_add(1, Ordering::Relaxed);
                }
            });
            if let Err(err) = result {
                tracing::debug!(error = %err, "a packet from the interface could not be segmented");
                counters.dropped_invalid.fetch_add(1, Ordering::Relaxed);
            }
        }
        batch.send(&udp, endpoint, counters);
    }
}

/// Where decrypted packets go: coalesced when the interface takes segments, one by one otherwise.
struct TunWriter<'a> {
    shared: &'a Shared,
    coalescer: Option<Coalescer>,
    frame: Vec<u8>,
}

impl TunWriter<'_> {
    fn push(&mut self, packet: &[u8]) {
        let shared = self.shared;
        let mut write = |frame: &[u8]| {
            let _ = shared.tun.write(frame);
            shared.counters.tun_writes.fetch_add(1, Ordering::Relaxed);
        };
        match &mut self.coalescer {
            Some(coalescer) => coalescer.push(packet, &mut write),
            None if shared.tun.offloads().vnet_hdr => {
                self.frame.clear();
                self.frame.resize(VNET_HDR_LEN, 0);
                VnetHdr {
                    flags: offload::F_DATA_VALID,
                    ..VnetHdr::default()
                }
                .write(&mut self.frame);
                self.frame.extend_from_slice(packet);
                write(&self.frame);
            }
            None => write(packet),
        }
    }

    fn flush(&mut self) {
        let shared = self.shared;
        if let Some(coalescer) = &mut self.coalescer {
            coalescer.flush(&mut |frame: &[u8]| {
                let _ = shared.tun.write(frame);
                shared.counters.tun_writes.fetch_add(1, Ordering::Relaxed);
            });
        }
    }
}

/// Peers to interface: receive, decrypt, coalesce, write; and answer handshakes.
fn receive_loop(shared: Arc<Shared>) {
    let mut datagrams = vec![0u8; MAX_GRO_BYTES];
    let mut plain = vec![0u8; 65_535];
    let mut reply = SendBatch::new();
    let mut writer = TunWriter {
        shared: &shared,
        coalescer: shared.tun.offloads().tso.then(Coalescer::new),
        frame: Vec::with_capacity(VNET_HDR_LEN + 65_535),
    };
    let sockets = || -> Vec<Arc<Udp>> {
        let state = shared.state();
        state
            .udp4
            .iter()
            .chain(state.udp6.iter())
            .cloned()
            .collect()
    };
    let mut udp = sockets();
    // Which sockets may have datagrams waiting: all at first, then what poll(2) says.
    let mut ready = vec![true; udp.len()];
    loop {
        if shared.stopping.load(Ordering::Acquire) {
            return;
        }
        let mut drained = true;
        for (socket, ready) in udp.iter().zip(ready.iter_mut()) {
            if !*ready {
                continue;
            }
            // A bounded turn per socket, so one busy peer does not starve the other family.
            let mut budget = 64;
            loop {
                let received = match socket.recv(&mut datagrams) {
                    Ok(received) => received,
                    Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        *ready = false;
                        break;
                    }
                };
                shared.counters.udp_receives.fetch_add(1, Ordering::Relaxed);
                let mut batch = ReceiveBatch::new(&shared, socket, received.from);
                for datagram in datagrams[..received.len].chunks(received.segment.max(1)) {
                    batch.handle(datagram, &mut plain, &mut reply, &mut writer);
                }
                drop(batch);
                writer.flush();
                budget -= 1;
                if budget == 0 {
                    drained = false;
                    break;
                }
            }
        }
        if !drained {
            continue;
        }
        writer.flush();
        let mut fds: Vec<RawFd> = udp.iter().map(|socket| socket.as_raw_fd()).collect();
        fds.push(shared.sockets_changed.as_raw_fd());
        let Some(readable) = wait_ready(&shared, &fds, None) else {
            return;
        };
        if readable & (1 << udp.len()) != 0 {
            drain(&shared.sockets_changed);
            udp = sockets();
            ready = vec![true; udp.len()];
        } else {
            for (i, ready) in ready.iter_mut().enumerate() {
                *ready = readable & (1 << i) != 0;
            }
        }
    }
}

/// The datagrams of one receive (one sender), handled under one look at the device's state:
/// the peer, its allowed-source check and its endpoint are looked up once per change, not once
/// per datagram.
struct ReceiveBatch<'a> {
    shared: &'a Shared,
    state: std::sync::RwLockReadGuard<'a, State>,
    udp: &'a Udp,
    from: SocketAddr,
    /// The last data packet's peer, by receiver index.
    peer: Option<(u32, Arc<Peer>)>,
    /// The last source address checked against the peer's allowed IPs, and the answer.
    source: Option<(IpAddr, bool)>,
    /// The peer whose endpoint was last set to `from`.
    noted: Option<Arc<Peer>>,
}

impl<'a> ReceiveBatch<'a> {
    fn new(shared: &'a Shared, udp: &'a Udp, from: SocketAddr) -> ReceiveBatch<'a> {
        ReceiveBatch {
            shared,
            state: shared.state(),
            udp,
            from,
            peer: None,
            source: None,
            noted: None,
        }
    }

    fn peer_by_index(&mut self, index: u32) -> Option<Arc<Peer>> {
        if let Some((known, peer)) = &self.peer {
            if *known == index {
                return Some(peer.clone());
            }
        }
        let peer = self.state.by_index.get(&index)?.clone();
        self.peer = Some((index, peer.clone()));
        self.source = None;
        Some(peer)
    }

    /// Whether `peer` may send from `source` (cryptokey routing).
    fn allowed(&mut self, peer: &Arc<Peer>, source: IpAddr) -> bool {
        if let Some((known, answer)) = self.source {
            if known == source {
                return answer;
            }
        }
        let answer = self
            .state
            .allowed
            .find(source)
            .is_some_and(|owner| Arc::ptr_eq(owner, peer));
        self.source = Some((source, answer));
        answer
    }

    /// Roaming: an authenticated packet from a new address moves the peer's endpoint there.
    fn note_endpoint(&mut self, peer: &Arc<Peer>) {
        if self
            .noted
            .as_ref()
            .is_some_and(|noted| Arc::ptr_eq(noted, peer))
        {
            return;
        }
        let mut config = lock(&peer.config);
        if config.endpoint != Some(self.from) {
            config.endpoint = Some(self.from);
        }
        self.noted = Some(peer.clone());
    }

    fn handle(
        &mut self,
        datagram: &[u8],
        plain: &mut [u8],
        reply: &mut SendBatch,
        writer: &mut TunWriter<'_>,
    ) {
        let counters = &self.shared.counters;
        counters.packets_received.fetch_add(1, Ordering::Relaxed);
        counters
            .bytes_received
            .fetch_add(datagram.len() as u64, Ordering::Relaxed);
        let kind = datagram
            .get(..4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]));
        let peer = if kind == Some(MESSAGE_DATA) {
            // The hot path: the receiver index names the session, and with it the peer.
            datagram
                .get(4..8)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) >> 8)
                .and_then(|index| self.peer_by_index(index))
        } else {
            find_handshake_peer(&self.state, self.udp, datagram, self.from)
        };
        let Some(peer) = peer else {
            counters.dropped_invalid.fetch_add(1, Ordering::Relaxed);
            return;
        };
        let mut tunn = lock(&peer.tunn);
        let (packet, source) = match tunn.decapsulate(Some(self.from.ip()), datagram, plain) {
            TunnResult::WriteToTunnelV4(packet, source) => (packet, IpAddr::V4(source)),
            TunnResult::WriteToTunnelV6(packet, source) => (packet, IpAddr::V6(source)),
            TunnResult::WriteToNetwork(message) => {
                // A handshake answer; then the packets that waited for the session.
                let _ = self.udp.send_to(message, self.from);
                counters.udp_sends.fetch_add(1, Ordering::Relaxed);
                counters.packets_sent.fetch_add(1, Ordering::Relaxed);
                reply.clear();
                loop {
                    let start = reply.buf.len();
                    reply.buf.resize(start + 65_535 + DATA_OVERHEAD, 0);
                    match tunn.decapsulate(None, &[], &mut reply.buf[start..]) {
                        TunnResult::WriteToNetwork(out) => {
                            let len = out.len();
                            reply.buf.truncate(start + len);
                            reply.lens.push(len);
                        }
                        _ => {
                            reply.buf.truncate(start);
                            break;
                        }
                    }
                }
                drop(tunn);
                self.note_endpoint(&peer);
                reply.send(self.udp, self.from, counters);
                return;
            }
            TunnResult::Done => {
                // A keepalive, or a handshake that needs nothing sent.
                drop(tunn);
                self.note_endpoint(&peer);
                return;
            }
            TunnResult::Err(_) => {
                counters.dropped_invalid.fetch_add(1, Ordering::Relaxed);
                return;
            }
        };
        drop(tunn);
        self.note_endpoint(&peer);
        if self.allowed(&peer, source) {
            writer.push(packet);
        } else {
            counters.dropped_invalid.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The peer a handshake message belongs to: by the initiator's static key for an initiation
/// (after the cheap MAC check, and cookies under load), by receiver index otherwise.
fn find_handshake_peer(
    state: &State,
    udp: &Udp,
    datagram: &[u8],
    from: SocketAddr,
) -> Option<Arc<Peer>> {
    let limiter = state.rate_limiter.as_ref()?;
    let mut cookie = [0u8; 64];
    let packet = match limiter.verify_packet(Some(from.ip()), datagram, &mut cookie) {
        Ok(packet) => packet,
        Err(TunnResult::WriteToNetwork(reply)) => {
            let _ = udp.send_to(reply, from);
            return None;
        }
        Err(_) => return None,
    };
    match packet {
        Packet::HandshakeInit(init) => {
            let (secret, public) = state.key.as_ref()?;
            let half = parse_handshake_anon(secret, public, &init).ok()?;
            state.peers.get(&half.peer_static_public).cloned()
        }
        Packet::HandshakeResponse(p) => state.by_index.get(&(p.receiver_idx >> 8)).cloned(),
        Packet::PacketCookieReply(p) => state.by_index.get(&(p.receiver_idx >> 8)).cloned(),
        Packet::PacketData(p) => state.by_index.get(&(p.receiver_idx >> 8)).cloned(),
    }
}

/// Runs every peer's timers: handshake retries, keepalives, rekeying.
fn timer_loop(shared: Arc<Shared>) {
    let mut buf = vec![0u8; MIN_MESSAGE_BUFFER.max(256)];
    let mut last_reset = Instant::now();
    loop {
        if !wait(&shared, &[], Some(TIMER_TICK)) {
            return;
        }
        let state = shared.state();
        if last_reset.elapsed() >= Duration::from_secs(1) {
            if let Some(limiter) = &state.rate_limiter {
                limiter.reset_count();
            }
            last_reset = Instant::now();
        }
        for peer in state.peers.values() {
            let Some(endpoint) = peer.endpoint() else {
                continue;
            };
            let mut tunn = lock(&peer.tunn);
            if let TunnResult::WriteToNetwork(message) = tunn.update_timers(&mut buf) {
                if let Some(udp) = state.udp_for(endpoint) {
                    let _ = udp.send_to(message, endpoint);
                    shared.counters.udp_sends.fetch_add(1, Ordering::Relaxed);
                    shared.counters.packets_sent.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }
}
