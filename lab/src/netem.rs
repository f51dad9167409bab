//! Loss and delay on the underlay where the kernel has no `netem` qdisc (`CONFIG_NET_SCH_NETEM`
//! off, as on the CI VMs): each Machine's namespace queues what leaves its underlay interface to
//! userspace (`iptables -t mangle ... -j NFQUEUE --queue-bypass`, in a lab-owned chain), and a
//! thread of the test process, bound to that namespace's queue over netlink, drops each packet
//! with the given probability and lets the others go after the given delay. A packet between
//! two Machines meets it once, leaving its sender. `--queue-bypass`: if no thread listens,
//! packets pass.

use std::fs::File;
use std::os::unix::io::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _};

/// The lab's chain in each Machine's `mangle` table.
pub(crate) const CHAIN: &str = "PLOYZ-LAB-NETEM";

const NETLINK_NETFILTER: i32 = 12;
const NFNL_SUBSYS_QUEUE: u16 = 3;
const NFQNL_MSG_PACKET: u16 = 0;
const NFQNL_MSG_VERDICT: u16 = 1;
const NFQNL_MSG_CONFIG: u16 = 2;
const NFQA_CFG_CMD: u16 = 1;
const NFQA_CFG_PARAMS: u16 = 2;
const NFQA_CFG_QUEUE_MAXLEN: u16 = 3;
/// Packets the kernel holds for the delayer (its default, 1024, would drop beyond the asked
/// loss once 1024 packets are in flight within one delay).
const QUEUE_MAXLEN: u32 = 65_536;
const NFQA_PACKET_HDR: u16 = 1;
const NFQA_VERDICT_HDR: u16 = 2;
const NFQNL_CFG_CMD_BIND: u8 = 1;
const NFQNL_COPY_META: u8 = 1;
const NF_DROP: u32 = 0;
const NF_ACCEPT: u32 = 1;
const NLMSG_ERROR: u16 = 2;
const NLM_F_REQUEST: u16 = 1;
const NLM_F_ACK: u16 = 4;

/// One namespace's delayer: the thread and the switch that ends it.
pub(crate) struct Delayer {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Delayer {
    /// Binds queue 0 of the namespace at `netns` and starts dropping `loss` (0..=1) of its
    /// packets and delaying the others by `delay`. Returns once bound.
    pub(crate) fn start(netns: &Path, loss: f64, delay: Duration) -> anyhow::Result<Delayer> {
        let ns = File::open(netns).with_context(|| format!("cannot open {}", netns.display()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let stop_in = stop.clone();
        let thread = std::thread::Builder::new()
            .name("ployz-lab-netem".into())
            .spawn(move || {
                let fd = match bind_in(&ns) {
                    Ok(fd) => {
                        let _ = ready_tx.send(Ok(()));
                        fd
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(format!("{e:#}")));
                        return;
                    }
                };
                serve(&fd, loss, delay, &stop_in);
            })
            .context("cannot start the netem thread")?;
        match ready_rx.recv_timeout(Duration::from_secs(10)) {
            Ok(Ok(())) => Ok(Delayer {
                stop,
                thread: Some(thread),
            }),
            Ok(Err(e)) => bail!("the netem queue of {} did not bind: {e}", netns.display()),
            Err(_) => bail!(
                "the netem queue of {} did not bind within 10 s",
                netns.display()
            ),
        }
    }
}

impl Drop for Delayer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Hooks the namespace's underlay egress to queue 0 (after the delayer is bound).
pub(crate) fn hook(netns: &Path, interface: &str) -> anyhow::Result<()> {
    let ipt = |args: &[&str]| -> anyhow::Result<()> {
        let out = Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .args(["--", "iptables", "-t", "mangle"])
            .args(args)
            .output()
            .context("cannot run iptables in the Machine's namespace")?;
        if !out.status.success() {
            bail!(
                "iptables -t mangle {args:?} in {} failed: {}",
                netns.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(())
    };
    unhook(netns, interface);
    ipt(&["-N", CHAIN])?;
    ipt(&[
        "-A",
        CHAIN,
        "-j",
        "NFQUEUE",
        "--queue-num",
        "0",
        "--queue-bypass",
    ])?;
    ipt(&["-I", "POSTROUTING", "1", "-o", interface, "-j", CHAIN])
}

/// Removes the hook, if there is one.
pub(crate) fn unhook(netns: &Path, interface: &str) {
    for args in [
        vec!["-D", "POSTROUTING", "-o", interface, "-j", CHAIN],
        vec!["-F", CHAIN],
        vec!["-X", CHAIN],
    ] {
        let _ = Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .args(["--", "iptables", "-t", "mangle"])
            .args(&args)
            .output();
    }
}

/// Whether this kernel has the `netem` qdisc.
pub(crate) fn kernel_has_netem() -> bool {
    let config = Command::new("sh")
        .args(["-c", "zcat /proc/config.gz 2>/dev/null"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if config.contains("CONFIG_NET_SCH_NETEM=y") || config.contains("CONFIG_NET_SCH_NETEM=m") {
        return true;
    }
    if config.contains("# CONFIG_NET_SCH_NETEM is not set") {
        return false;
    }
    // No config to read: a module may load on first use; try it on a throwaway device.
    let name = format!("plznt{}", std::process::id() % 100_000);
    let ok = Command::new("ip")
        .args(["link", "add", &name, "type", "dummy"])
        .status()
        .is_ok_and(|s| s.success())
        && Command::new("tc")
            .args([
                "qdisc", "add", "dev", &name, "root", "netem", "delay", "1ms",
            ])
            .status()
            .is_ok_and(|s| s.success());
    let _ = Command::new("ip").args(["link", "delete", &name]).status();
    ok
}

fn bind_in(ns: &File) -> anyhow::Result<OwnedFd> {
    // SAFETY: setns on this thread only (network namespaces are per thread).
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        bail!("setns: {}", std::io::Error::last_os_error());
    }
    // SAFETY: plain socket(2); the descriptor is owned below.
    let raw = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_RAW | libc::SOCK_CLOEXEC,
            NETLINK_NETFILTER,
        )
    };
    if raw < 0 {
        bail!("netlink socket: {}", std::io::Error::last_os_error());
    }
    // SAFETY: raw is a fresh descriptor nobody else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: a zeroed sockaddr_nl is valid; we set the family.
    let mut addr: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    addr.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: addr is a valid sockaddr_nl of the given size.
    let rc = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            &addr as *const libc::sockaddr_nl as *const libc::sockaddr,
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if rc != 0 {
        bail!("netlink bind: {}", std::io::Error::last_os_error());
    }
    let big: i32 = 8 << 20;
    // SAFETY: an int option of the right size.
    unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUFFORCE,
            &big as *const i32 as *const libc::c_void,
            4,
        );
    }
    // Bind queue 0 for IPv4, then ask for metadata only (the packet's ID is all we need).
    let mut cmd = vec![NFQNL_CFG_CMD_BIND, 0];
    cmd.extend_from_slice(&(libc::AF_INET as u16).to_be_bytes());
    request(&fd, NFQNL_MSG_CONFIG, &[(NFQA_CFG_CMD, cmd)], 1)?;
    let mut params = 0u32.to_be_bytes().to_vec();
    params.push(NFQNL_COPY_META);
    request(&fd, NFQNL_MSG_CONFIG, &[(NFQA_CFG_PARAMS, params)], 2)?;
    let maxlen = QUEUE_MAXLEN.to_be_bytes().to_vec();
    request(&fd, NFQNL_MSG_CONFIG, &[(NFQA_CFG_QUEUE_MAXLEN, maxlen)], 3)?;
    Ok(fd)
}

/// A netfilter-queue message for queue 0.
fn message(kind: u16, flags: u16, seq: u32, attrs: &[(u16, Vec<u8>)]) -> Vec<u8> {
    let mut m = vec![0u8; 16];
    m.extend_from_slice(&[libc::AF_UNSPEC as u8, 0]);
    m.extend_from_slice(&0u16.to_be_bytes());
    for (t, payload) in attrs {
        let len = 4 + payload.len();
        m.extend_from_slice(&(len as u16).to_ne_bytes());
        m.extend_from_slice(&t.to_ne_bytes());
        m.extend_from_slice(payload);
        while !m.len().is_multiple_of(4) {
            m.push(0);
        }
    }
    let total = m.len() as u32;
    m[0..4].copy_from_slice(&total.to_ne_bytes());
    m[4..6].copy_from_slice(&((NFNL_SUBSYS_QUEUE << 8) | kind).to_ne_bytes());
    m[6..8].copy_from_slice(&(NLM_F_REQUEST | flags).to_ne_bytes());
    m[8..12].copy_from_slice(&seq.to_ne_bytes());
    m
}

fn send(fd: &OwnedFd, msg: &[u8]) -> std::io::Result<()> {
    // SAFETY: msg is a valid buffer; the kernel is the default destination of a netlink socket.
    let rc = unsafe {
        libc::send(
            fd.as_raw_fd(),
            msg.as_ptr() as *const libc::c_void,
            msg.len(),
            0,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Sends a config request and waits for its acknowledgement.
fn request(fd: &OwnedFd, kind: u16, attrs: &[(u16, Vec<u8>)], seq: u32) -> anyhow::Result<()> {
    send(fd, &message(kind, NLM_F_ACK, seq, attrs)).context("netlink send")?;
    let mut buf = vec![0u8; 8192];
    // SAFETY: buf is a valid writable buffer of its length.
    let n = unsafe {
        libc::recv(
            fd.as_raw_fd(),
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            0,
        )
    };
    if n < 0 {
        bail!("netlink recv: {}", std::io::Error::last_os_error());
    }
    let buf = &buf[..n as usize];
    if buf.len() >= 20 && u16::from_ne_bytes([buf[4], buf[5]]) == NLMSG_ERROR {
        let code = i32::from_ne_bytes([buf[16], buf[17], buf[18], buf[19]]);
        if code != 0 {
            bail!(
                "the kernel refused the netfilter queue config: {}",
                std::io::Error::from_raw_os_error(-code)
            );
        }
        return Ok(());
    }
    bail!("the kernel did not acknowledge the netfilter queue config")
}

/// A small xorshift generator: loss needs no cryptographic randomness.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn serve(fd: &OwnedFd, loss: f64, delay: Duration, stop: &AtomicBool) {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x9e37_79b9_7f4a_7c15)
        | 1;
    let mut rng = Rng(seed);
    let mut pending: std::collections::VecDeque<(Instant, u32)> = Default::default();
    let mut buf = vec![0u8; 1 << 16];
    let mut seq = 100u32;
    let verdict = |seq: u32, id: u32, v: u32| {
        let mut hdr = v.to_be_bytes().to_vec();
        hdr.extend_from_slice(&id.to_be_bytes());
        let _ = send(
            fd,
            &message(NFQNL_MSG_VERDICT, 0, seq, &[(NFQA_VERDICT_HDR, hdr)]),
        );
    };
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        while pending.front().is_some_and(|(due, _)| *due <= now) {
            if let Some((_, id)) = pending.pop_front() {
                seq = seq.wrapping_add(1);
                verdict(seq, id, NF_ACCEPT);
            }
        }
        let wait = pending
            .front()
            .map(|(due, _)| due.saturating_duration_since(now))
            .unwrap_or(Duration::from_millis(50))
            .min(Duration::from_millis(50));
        let mut pfd = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let ready = unsafe { libc::poll(&mut pfd, 1, wait.as_millis().max(1) as i32) };
        if ready <= 0 {
            continue;
        }
        // SAFETY: buf is a valid writable buffer of its length.
        let n = unsafe {
            libc::recv(
                fd.as_raw_fd(),
                buf.as_mut_ptr() as *mut libc::c_void,
                buf.len(),
                libc::MSG_DONTWAIT,
            )
        };
        if n <= 0 {
            // ENOBUFS: the kernel dropped some queued packets (loss); go on.
            continue;
        }
        let arrived = Instant::now();
        let mut msgs = &buf[..n as usize];
        while msgs.len() >= 16 {
            let len = u32::from_ne_bytes([msgs[0], msgs[1], msgs[2], msgs[3]]) as usize;
            if len < 16 || len > msgs.len() {
                break;
            }
            let kind = u16::from_ne_bytes([msgs[4], msgs[5]]);
            if kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET {
                if let Some(id) = packet_id(&msgs[20..len]) {
                    if rng.unit() < loss {
                        seq = seq.wrapping_add(1);
                        verdict(seq, id, NF_DROP);
                    } else if delay.is_zero() {
                        seq = seq.wrapping_add(1);
                        verdict(seq, id, NF_ACCEPT);
                    } else {
                        pending.push_back((arrived + delay, id));
                    }
                }
            }
            let aligned = (len + 3) & !3;
            msgs = &msgs[aligned.min(msgs.len())..];
        }
    }
    // Stopping: let what waits go now.
    for (_, id) in pending {
        seq = seq.wrapping_add(1);
        verdict(seq, id, NF_ACCEPT);
    }
}

/// The packet ID in a queued packet's attributes.
fn packet_id(mut attrs: &[u8]) -> Option<u32> {
    while attrs.len() >= 4 {
        let len = u16::from_ne_bytes([attrs[0], attrs[1]]) as usize;
        let kind = u16::from_ne_bytes([attrs[2], attrs[3]]) & 0x3fff;
        if len < 4 || len > attrs.len() {
            return None;
        }
        if kind == NFQA_PACKET_HDR && len >= 8 {
            return Some(u32::from_be_bytes([attrs[4], attrs[5], attrs[6], attrs[7]]));
        }
        attrs = &attrs[((len + 3) & !3).min(attrs.len())..];
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_framed_and_padded() {
        let m = message(
            NFQNL_MSG_CONFIG,
            NLM_F_ACK,
            7,
            &[(NFQA_CFG_PARAMS, vec![0, 0, 0, 0, 1])],
        );
        assert_eq!(m.len(), 16 + 4 + 12);
        assert_eq!(
            u32::from_ne_bytes([m[0], m[1], m[2], m[3]]) as usize,
            m.len()
        );
        assert_eq!(u16::from_ne_bytes([m[4], m[5]]), (3 << 8) | 2);
        assert_eq!(u16::from_ne_bytes([m[20], m[21]]), 9);
    }

    #[test]
    fn the_packet_id_is_found_among_attributes() {
        let mut attrs = Vec::new();
        attrs.extend_from_slice(&8u16.to_ne_bytes());
        attrs.extend_from_slice(&5u16.to_ne_bytes());
        attrs.extend_from_slice(&[9, 9, 9, 9]);
        attrs.extend_from_slice(&11u16.to_ne_bytes());
        attrs.extend_from_slice(&NFQA_PACKET_HDR.to_ne_bytes());
        attrs.extend_from_slice(&42u32.to_be_bytes());
        attrs.extend_from_slice(&[8, 0, 3, 0]);
        assert_eq!(packet_id(&attrs), Some(42));
        assert_eq!(packet_id(&[1, 0]), None);
    }

    #[test]
    fn loss_draws_are_fractions() {
        let mut r = Rng(12345);
        let draws: Vec<f64> = (0..1000).map(|_| r.unit()).collect();
        assert!(draws.iter().all(|d| (0.0..1.0).contains(d)));
        let low = draws.iter().filter(|d| **d < 0.2).count();
        assert!((100..300).contains(&low), "{low}");
    }
}
