//! Two Machines in two network namespaces joined by a veth pair, each with a userspace WireGuard
//! interface made by `MeshInterface`: their Management Addresses reach each other, WireGuard
//! reports the handshake and the traffic, `wg show` reads the interface, peers and routes are
//! reconciled exactly and idempotently, and B's firewall lets its management port be reached
//! through the mesh but not from the underlay while WireGuard's port stays open.
//!
//! One process holds both interfaces: each lives on a worker thread that has `setns`ed into its
//! namespace before creating it. A network namespace is a per-thread attribute on Linux, and
//! threads and processes inherit it from the thread that spawns them, so the TUN device, the
//! boringtun threads and their UDP sockets, and the `ip` commands `MeshInterface` runs all land
//! in the worker's namespace (the test checks the interface is absent from its own). The daemon
//! runs inside its namespace from the start and needs none of this.
//!
//! Namespaces are named `plztw-<pid>-<n>`; each is deleted on drop (also on panic), and ones left
//! by a process that no longer runs are swept at start. Needs root.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime};

use nix::sched::{setns, CloneFlags};
use ployz_mesh::endpoints::{EndpointSelector, LinkStatus, PeerAdvertisement};
use ployz_mesh::firewall::{Firewall, FirewallConfig};
use ployz_mesh::wireguard::{
    egress_mtu, link_exists, Backend, KernelProbe, MeshConfig, MeshInterface, PeerConfig,
    PeerStats, PrivateKey,
};
use ployz_testkit::StreamDigest;

const PREFIX: &str = "plztw";

fn run(program: &str, args: &[&str]) -> Output {
    let output = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|err| panic!("{program} {args:?}: {err}"));
    output
}

fn must(program: &str, args: &[&str]) -> String {
    let output = run(program, args);
    assert!(
        output.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Deletes namespaces with this file's prefix whose creating process is gone, and userspace
/// control sockets of test interfaces nobody listens on any more.
fn sweep_leftovers() {
    if let Ok(entries) = std::fs::read_dir("/var/run/wireguard") {
        for entry in entries.flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("plzt")
                && name.ends_with(".sock")
                && std::os::unix::net::UnixStream::connect(&path).is_err()
            {
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let listing = must("ip", &["netns", "list"]);
    for line in listing.lines() {
        let name = line.split_whitespace().next().unwrap_or_default();
        let Some(rest) = name.strip_prefix(&format!("{PREFIX}-")) else {
            continue;
        };
        let pid = rest.split('-').next().unwrap_or_default();
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run("ip", &["netns", "del", name]);
        }
    }
}

fn unique(tag: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    format!(
        "{PREFIX}-{}-{}{tag}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// A network namespace, deleted on drop.
struct Netns {
    name: String,
}

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = unique(tag);
        must("ip", &["netns", "add", &name]);
        let netns = Netns { name };
        netns.ip(&["link", "set", "lo", "up"]);
        netns
    }

    fn ip(&self, args: &[&str]) -> String {
        let mut full = vec!["-n", self.name.as_str()];
        full.extend_from_slice(args);
        must("ip", &full)
    }

    fn exec(&self, args: &[&str]) -> Output {
        let mut full = vec!["netns", "exec", self.name.as_str()];
        full.extend_from_slice(args);
        run("ip", &full)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run("ip", &["netns", "del", &self.name]);
    }
}

type Job = Box<dyn FnOnce(&mut Option<MeshInterface>) + Send>;

/// A thread inside a namespace, owning that namespace's `MeshInterface` and running jobs on it.
/// Dropping it ends the thread, which drops the interface there.
struct Worker {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<JoinHandle<()>>,
}

impl Worker {
    fn new(netns: &Netns) -> Worker {
        let path = format!("/var/run/netns/{}", netns.name);
        let (jobs, receiver) = mpsc::channel::<Job>();
        let (ready, entered) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let entered = File::open(&path)
                .map_err(|e| e.to_string())
                .and_then(|file| setns(&file, CloneFlags::CLONE_NEWNET).map_err(|e| e.to_string()));
            let ok = entered.is_ok();
            let _ = ready.send(entered);
            if !ok {
                return;
            }
            let mut interface = None;
            while let Ok(job) = receiver.recv() {
                job(&mut interface);
            }
            if let Some(interface) = interface.take() {
                let _ = interface.down();
            }
        });
        entered
            .recv()
            .expect("the worker reports")
            .expect("setns into the namespace");
        Worker {
            jobs: Some(jobs),
            thread: Some(thread),
        }
    }

    fn run<T: Send + 'static>(
        &self,
        job: impl FnOnce(&mut Option<MeshInterface>) -> T + Send + 'static,
    ) -> T {
        let (sender, receiver) = mpsc::channel();
        let job: Job = Box::new(move |interface| {
            let _ = sender.send(job(interface));
        });
        self.jobs
            .as_ref()
            .expect("the worker runs")
            .send(job)
            .expect("the worker takes jobs");
        receiver.recv().expect("the job finished without panicking")
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One Machine: a namespace, a worker in it, its key and addresses. The worker is declared
/// first so it (and the interface) goes before the namespace.
struct Machine {
    worker: Worker,
    netns: Netns,
    key: PrivateKey,
    interface: String,
    subnet: ployz_core::MachineSubnet,
    underlay: Ipv4Addr,
}

impl Machine {
    fn peer_config(&self) -> PeerConfig {
        PeerConfig {
            public_key: self.key.public_key_base64(),
            management_address: self.key.management_address().addr(),
            subnet: self.subnet,
            endpoint: Some(SocketAddr::new(IpAddr::V4(self.underlay), 51820)),
        }
    }

    fn up(&self) {
        let config = MeshConfig {
            interface: self.interface.clone(),
            backend: Backend::Userspace,
            private_key: self.key.clone(),
            listen_port: 51820,
            management_address: self.key.management_address(),
            gateway: self.subnet.gateway(),
            mtu: None,
        };
        self.worker.run(move |slot| {
            *slot = Some(MeshInterface::up(config).expect("the interface comes up"));
        });
    }

    fn set_peers(&self, peers: Vec<PeerConfig>) -> ployz_mesh::wireguard::PeerChanges {
        self.worker.run(move |slot| {
            slot.as_mut()
                .expect("up")
                .set_peers(&peers)
                .expect("set_peers")
        })
    }

    fn stats(&self) -> Vec<PeerStats> {
        self.worker
            .run(|slot| slot.as_ref().expect("up").stats().expect("stats"))
    }

    /// A UDP socket made in this Machine's namespace (it stays there wherever it is used).
    fn bind(&self, address: IpAddr) -> UdpSocket {
        self.worker.run(move |_| {
            let mut last = None;
            let bound = wait_until(Duration::from_secs(5), || {
                match UdpSocket::bind((address, 0)) {
                    Ok(socket) => {
                        last = Some(Ok(socket));
                        true
                    }
                    Err(err) => {
                        last = Some(Err(err));
                        false
                    }
                }
            });
            match last {
                Some(Ok(socket)) if bound => socket,
                other => panic!("binding {address} in the namespace: {other:?}"),
            }
        })
    }

    fn routes(&self) -> std::collections::BTreeMap<String, Option<IpAddr>> {
        self.worker
            .run(|slot| slot.as_ref().expect("up").routes().expect("routes"))
    }
}

/// ENETUNREACH.
fn libc_enetunreach() -> i32 {
    nix::errno::Errno::ENETUNREACH as i32
}

/// Sends datagrams from `from` to `to` until one arrives (true) or 20 s pass (false), and checks
/// the receiver sees the sender's own address.
fn exchange(from: &UdpSocket, to: &UdpSocket) -> bool {
    let target = to.local_addr().expect("bound");
    let source = from.local_addr().expect("bound");
    to.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("a read timeout");
    let mut buf = [0u8; 64];
    wait_until(Duration::from_secs(20), || {
        let _ = from.send_to(b"ployz", target);
        match to.recv_from(&mut buf) {
            Ok((n, peer)) => {
                assert_eq!(&buf[..n], b"ployz");
                assert_eq!(
                    peer.ip(),
                    source.ip(),
                    "the receiver sees the sender's own address"
                );
                true
            }
            Err(_) => false,
        }
    })
}

/// Runs `check` until it returns true (true) or `limit` passes (false).
fn wait_until(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !check() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    true
}

/// What a failed exchange looks like from each Machine.
fn diagnose(machines: &[&Machine]) -> String {
    let mut out = String::new();
    for m in machines {
        for args in [&["addr"][..], &["-6", "route"], &["route"], &["-s", "link"]] {
            let mut full = vec!["-n", m.netns.name.as_str()];
            full.extend_from_slice(args);
            let o = run("ip", &full);
            out.push_str(&format!(
                "\n$ ip {}\n{}{}",
                full.join(" "),
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            ));
        }
        let o = run("wg", &["show", &m.interface]);
        out.push_str(&format!(
            "\n$ wg show {}\n{}{}",
            m.interface,
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ));
        let o = m.netns.exec(&["ss", "-uanp"]);
        out.push_str(&format!(
            "\n$ ss -uanp\n{}",
            String::from_utf8_lossy(&o.stdout)
        ));
    }
    out
}

fn random_suffix() -> String {
    format!("{:06x}", rand::random::<u32>() & 0xff_ffff)
}

#[test]
#[ignore = "needs root"]
fn two_machines_reach_each_other_over_userspace_wireguard() {
    let (suffix, ns_a, ns_b, veth_a, veth_b) = linked_namespaces();
    // A's egress (its default route's device) has a smaller MTU than B's, which has no route
    // out at all.
    ns_a.ip(&["link", "set", &veth_a, "mtu", "1400"]);
    ns_b.ip(&["link", "set", &veth_b, "mtu", "1400"]);
    ns_a.ip(&["route", "add", "default", "via", "198.18.0.2"]);
    ns_a.ip(&["addr", "add", "2001:db8::1/64", "dev", &veth_a, "nodad"]);
    ns_b.ip(&["addr", "add", "2001:db8::2/64", "dev", &veth_b, "nodad"]);

    let a = Machine {
        worker: Worker::new(&ns_a),
        netns: ns_a,
        key: PrivateKey::generate(),
        interface: format!("plzt{suffix}a"),
        subnet: "10.210.0.0/24".parse().unwrap(),
        underlay: Ipv4Addr::new(198, 18, 0, 1),
    };
    let b = Machine {
        worker: Worker::new(&ns_b),
        netns: ns_b,
        key: PrivateKey::generate(),
        interface: format!("plzt{suffix}b"),
        subnet: "10.210.1.0/24".parse().unwrap(),
        underlay: Ipv4Addr::new(198, 18, 0, 2),
    };
    a.up();
    b.up();
    assert!(
        !link_exists(&a.interface) && !link_exists(&b.interface),
        "the interfaces live in their namespaces, not in the test's"
    );
    assert_eq!(a.worker.run(|_| egress_mtu()), Some(1400));
    assert_eq!(
        a.worker.run(|slot| slot.as_ref().map(MeshInterface::mtu)),
        Some(1320)
    );
    let links = a.netns.ip(&["-j", "link", "show", "dev", &a.interface]);
    assert!(links.contains("\"mtu\":1320"), "egress 1400 - 80; {links}");
    assert_eq!(b.worker.run(|_| egress_mtu()), None);
    let links = b.netns.ip(&["-j", "link", "show", "dev", &b.interface]);
    assert!(
        links.contains("\"mtu\":1420"),
        "no egress route: the default MTU; {links}"
    );
    let addrs = a.netns.ip(&["-6", "addr", "show", "dev", &a.interface]);
    let mgmt_a = a.key.management_address().to_string();
    assert!(addrs.contains(&format!("{mgmt_a}/128")), "{addrs}");

    // A's Selected Endpoint for B starts on B's first Advertised Endpoint.
    let mut selector = EndpointSelector::new();
    let initial = selector.set_advertised(
        SystemTime::now(),
        &[PeerAdvertisement {
            public_key: b.key.public_key_base64(),
            endpoints: vec![b.peer_config().endpoint.expect("B has an endpoint")],
        }],
    );
    assert_eq!(initial.len(), 1);
    let mut b_as_seen_by_a = b.peer_config();
    b_as_seen_by_a.endpoint = Some(initial[0].endpoint);
    let first = a.set_peers(vec![b_as_seen_by_a]);
    assert_eq!((first.added, first.routes_set), (1, 2), "{first:?}");
    b.set_peers(vec![a.peer_config()]);

    // Management Address to Management Address, through the tunnel, both ways.
    let mgmt_b = b.key.management_address().to_string();
    let sock_a = a.bind(a.key.management_address().addr().into());
    let sock_b = b.bind(b.key.management_address().addr().into());
    assert!(
        exchange(&sock_a, &sock_b),
        "A does not reach B's Management Address: {}",
        diagnose(&[&a, &b])
    );
    assert!(
        exchange(&sock_b, &sock_a),
        "B does not reach A's Management Address"
    );

    let stats = a.stats();
    assert_eq!(stats.len(), 1);
    let peer = &stats[0];
    assert_eq!(peer.public_key, b.key.public_key_base64());
    assert_eq!(peer.endpoint, Some("198.18.0.2:51820".parse().unwrap()));
    let handshake = peer.last_handshake.expect("a handshake happened");
    let age = SystemTime::now()
        .duration_since(handshake)
        .unwrap_or(Duration::ZERO);
    assert!(
        age < Duration::from_secs(60),
        "a recent handshake, not {age:?} ago"
    );
    assert!(peer.rx_bytes > 0 && peer.tx_bytes > 0, "{peer:?}");

    // The real handshake brings the link up in A's endpoint selection, with nothing to change.
    assert!(selector.tick(SystemTime::now(), &stats).is_empty());
    let view = &selector.peers()[0];
    assert_eq!(view.status, LinkStatus::Up);
    assert_eq!(view.last_handshake, Some(handshake));

    // `wg show` (wireguard-tools) reads the userspace interface through its control socket.
    match Command::new("wg").args(["show", &a.interface]).output() {
        Ok(output) => {
            assert!(output.status.success(), "wg show: {output:?}");
            let shown = String::from_utf8_lossy(&output.stdout);
            assert!(shown.contains(&b.key.public_key_base64()), "{shown}");
            assert!(shown.contains("latest handshake"), "{shown}");
            assert!(
                shown.contains("persistent keepalive: every 25 seconds"),
                "{shown}"
            );
            assert!(shown.contains("10.210.1.0/24"), "{shown}");
        }
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            eprintln!("wireguard-tools is not installed: `wg show` not checked");
        }
        Err(err) => panic!("wg show: {err}"),
    }

    // Without the Machine Gateway present the subnet route has no source; once the Docker
    // bridge's stand-in holds it, the next reconcile adds it, and the subnets talk.
    assert_eq!(a.routes().get("10.210.1.0/24"), Some(&None));
    for m in [&a, &b] {
        m.netns.ip(&["link", "add", "plztbr", "type", "bridge"]);
        let gateway = format!("{}/24", m.subnet.gateway());
        m.netns.ip(&["addr", "add", &gateway, "dev", "plztbr"]);
        m.netns.ip(&["link", "set", "plztbr", "up"]);
    }
    let with_source = a.set_peers(vec![b.peer_config()]);
    assert_eq!(
        (
            with_source.added,
            with_source.updated,
            with_source.routes_set
        ),
        (0, 0, 1)
    );
    b.set_peers(vec![a.peer_config()]);
    let routes = a.routes();
    assert_eq!(
        routes.get("10.210.1.0/24"),
        Some(&Some(IpAddr::V4(a.subnet.gateway())))
    );
    assert_eq!(routes.get(&format!("{mgmt_b}/128")), Some(&None));
    let from_gateway_a = a.bind(a.subnet.gateway().into());
    let at_gateway_b = b.bind(b.subnet.gateway().into());
    assert!(
        exchange(&from_gateway_a, &at_gateway_b),
        "Machine Subnet to Machine Subnet: {}",
        diagnose(&[&a, &b])
    );

    // The firewall on B: its management port is reached through the mesh, not from the underlay.
    let mgmt_port = SocketAddr::new(b.key.management_address().addr().into(), 51000);
    let underlay_port: SocketAddr = "[2001:db8::2]:51000".parse().unwrap();
    let _listener = b
        .worker
        .run(|_| TcpListener::bind("[::]:51000").expect("listen in B"));
    let connects = |target: SocketAddr, wait: Duration| {
        a.worker
            .run(move |_| TcpStream::connect_timeout(&target, wait).map_err(|e| e.kind()))
            .is_ok()
    };
    assert!(
        connects(underlay_port, Duration::from_secs(5)),
        "open before the firewall"
    );
    let firewall_config = FirewallConfig {
        mesh_interface: b.interface.clone(),
        docker_bridge: "plztbr".into(),
        wireguard_port: 51820,
        management_port: 51000,
        gossip_port: 51001,
        machine_subnet: b.subnet,
        cluster_network: ployz_core::ClusterNetwork::default(),
    };
    let restored = b.worker.run(move |_| {
        Firewall::system(firewall_config.clone())
            .reconcile()
            .map_err(|e| e.to_string())
    });
    assert_eq!(restored, Ok(14));
    assert!(
        connects(mgmt_port, Duration::from_secs(5)),
        "through the mesh"
    );
    assert!(
        !connects(underlay_port, Duration::from_millis(500)),
        "dropped from the underlay"
    );
    assert!(exchange(&sock_a, &sock_b), "WireGuard's port stays open");

    // The same set again changes nothing.
    assert!(a.set_peers(vec![b.peer_config()]).is_empty());
    assert!(a.set_peers(vec![b.peer_config()]).is_empty());

    // An endpoint change is applied (remove and re-add on userspace).
    let mut moved = b.peer_config();
    moved.endpoint = Some("198.18.0.2:51821".parse().unwrap());
    assert_eq!(a.set_peers(vec![moved]).updated, 1);
    assert_eq!(
        a.stats()[0].endpoint,
        Some("198.18.0.2:51821".parse().unwrap())
    );

    // Removing the peer removes its routes.
    let removed = a.set_peers(Vec::new());
    assert_eq!(
        (removed.removed, removed.routes_removed),
        (1, 2),
        "{removed:?}"
    );
    assert!(a.routes().is_empty());
    assert!(a.stats().is_empty());
    let unreachable = sock_a
        .send_to(b"ployz", sock_b.local_addr().unwrap())
        .expect_err("no route to B's Management Address any more");
    assert_eq!(
        unreachable.raw_os_error(),
        Some(libc_enetunreach()),
        "{unreachable}"
    );

    // Down removes the interface from its namespace.
    let name = a.interface.clone();
    let gone = a.worker.run(move |slot| {
        slot.take().expect("up").down().expect("down");
        !link_exists(&name)
    });
    assert!(gone);
    assert!(!std::path::Path::new(&format!("/var/run/wireguard/{}.sock", a.interface)).exists());
}

#[test]
#[ignore = "needs root"]
fn an_interface_name_taken_by_another_device_is_refused() {
    sweep_leftovers();
    let netns = Netns::new("c");
    let taken = format!("plzt{}c", random_suffix());
    netns.ip(&["link", "add", &taken, "type", "bridge"]);
    let worker = Worker::new(&netns);
    for backend in [Backend::Userspace, Backend::Kernel] {
        let config = MeshConfig {
            interface: taken.clone(),
            backend,
            private_key: PrivateKey::generate(),
            listen_port: 51820,
            management_address: PrivateKey::generate().management_address(),
            gateway: Ipv4Addr::new(10, 210, 0, 1),
            mtu: Some(1420),
        };
        let err = worker
            .run(move |_| MeshInterface::up(config).map(|_| ()))
            .expect_err("the name is taken");
        let text = err.to_string();
        assert!(
            text.contains(&format!("interface {taken} already exists")),
            "{backend}: {text}"
        );
        assert!(text.contains("[mesh] interface"), "{text}");
    }
    // The bridge is untouched.
    let kind = netns.ip(&["-d", "-j", "link", "show", "dev", &taken]);
    assert!(kind.contains("\"info_kind\":\"bridge\""), "{kind}");

    // The kernel path runs as far as the host lets it: without the module, creating the link
    // is what fails, and nothing is left behind.
    let free = format!("plzt{}k", random_suffix());
    let config = MeshConfig {
        interface: free.clone(),
        backend: Backend::Kernel,
        private_key: PrivateKey::generate(),
        listen_port: 51820,
        management_address: PrivateKey::generate().management_address(),
        gateway: Ipv4Addr::new(10, 210, 0, 1),
        mtu: None,
    };
    let outcome = worker.run(move |_| {
        let outcome = MeshInterface::up(config).and_then(MeshInterface::down);
        (outcome.map_err(|e| e.to_string()), link_exists(&free))
    });
    if KernelProbe::detect().module_present {
        assert_eq!(outcome, (Ok(()), false));
    } else {
        let (result, left) = outcome;
        let err = result.expect_err("no kernel module here");
        assert!(err.contains("create failed"), "{err}");
        assert!(!left);
    }
    drop(worker);
}

/// The signal numbers a set of `/proc` hex masks holds: bit n-1 is signal n.
fn mask_has(mask_hex: &str, signal: i32) -> bool {
    u64::from_str_radix(mask_hex.trim(), 16).expect("a hex signal mask") & (1 << (signal - 1)) != 0
}

/// What `/proc/thread-self/status` says the calling thread blocks.
fn blocked_here() -> String {
    let status = std::fs::read_to_string("/proc/thread-self/status").expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigBlk:"))
        .expect("SigBlk line")
        .trim()
        .to_owned()
}

/// The signal masks of every signalfd this process holds (`sigmask:` in its fdinfo).
fn signalfd_masks() -> Vec<String> {
    let mut masks = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")
        .expect("fd dir")
        .flatten()
    {
        let is_signalfd = std::fs::read_link(entry.path())
            .map(|target| target.to_string_lossy().contains("signalfd"))
            .unwrap_or(false);
        if !is_signalfd {
            continue;
        }
        let info = format!("/proc/self/fdinfo/{}", entry.file_name().to_string_lossy());
        if let Ok(text) = std::fs::read_to_string(info) {
            masks.extend(
                text.lines()
                    .filter_map(|l| l.strip_prefix("sigmask:"))
                    .map(|m| m.trim().to_owned()),
            );
        }
    }
    masks
}

/// The daemon handles SIGTERM itself (drain, then stop). A userspace device that blocked SIGTERM
/// in its creating thread and read it from a signalfd of its own took some of the daemon's
/// SIGTERMs: the device stopped and the daemon never learned it was asked to. The device made
/// here leaves SIGTERM and SIGINT alone, keeps answering, and `wg show` (wireguard-tools) still
/// reads it through the standard control socket.
#[test]
#[ignore = "needs root"]
fn the_userspace_device_takes_no_signals_and_wg_show_reads_it() {
    sweep_leftovers();
    let netns = Netns::new("s");
    let worker = Worker::new(&netns);
    let interface = format!("plzt{}s", random_suffix());
    let key = PrivateKey::generate();
    let config = MeshConfig {
        interface: interface.clone(),
        backend: Backend::Userspace,
        private_key: key.clone(),
        listen_port: 51820,
        management_address: key.management_address(),
        gateway: Ipv4Addr::new(10, 210, 0, 1),
        mtu: Some(1400),
    };
    let (before, after) = worker.run(move |slot| {
        let before = blocked_here();
        *slot = Some(MeshInterface::up(config).expect("the interface comes up"));
        (before, blocked_here())
    });
    assert_eq!(
        before, after,
        "creating the device changed this thread's signal mask"
    );
    assert!(
        !mask_has(&after, nix::libc::SIGTERM),
        "SIGTERM blocked: {after}"
    );
    for mask in signalfd_masks() {
        for signal in [nix::libc::SIGTERM, nix::libc::SIGINT] {
            assert!(
                !mask_has(&mask, signal),
                "a signalfd of this process reads signal {signal} (mask {mask})"
            );
        }
    }

    // The device answers, with the key, port and MTU it was given.
    let peer = PrivateKey::generate();
    let peer_config = PeerConfig {
        public_key: peer.public_key_base64(),
        management_address: peer.management_address().addr(),
        subnet: "10.210.7.0/24".parse().unwrap(),
        endpoint: Some("198.18.0.9:51820".parse().unwrap()),
    };
    let changes = worker.run(move |slot| {
        slot.as_mut()
            .expect("up")
            .set_peers(&[peer_config])
            .expect("set_peers")
    });
    assert_eq!(changes.added, 1, "{changes:?}");
    let link = netns.ip(&["-j", "link", "show", "dev", &interface]);
    assert!(link.contains("\"mtu\":1400"), "{link}");

    // wg(8), from outside the namespace: the control socket is per host, not per namespace.
    let shown = must("wg", &["show", &interface, "dump"]);
    let mut lines = shown.lines();
    let device: Vec<&str> = lines.next().expect("the device line").split('\t').collect();
    assert_eq!(device[1], key.public_key_base64(), "{shown}");
    assert_eq!(device[2], "51820", "{shown}");
    let peer_line: Vec<&str> = lines.next().expect("a peer line").split('\t').collect();
    assert_eq!(peer_line[0], peer.public_key_base64(), "{shown}");
    assert_eq!(peer_line[2], "198.18.0.9:51820", "{shown}");
    assert!(peer_line[3].contains("10.210.7.0/24"), "{shown}");
    assert_eq!(lines.next(), None, "{shown}");
    // A request wg(8) does not make is answered as boringtun answers it, and the device goes on.
    let socket = format!("/var/run/wireguard/{interface}.sock");
    let mut raw = std::os::unix::net::UnixStream::connect(&socket).expect("connect");
    use std::io::{Read as _, Write as _};
    raw.write_all(b"bogus=1\n\n").unwrap();
    let mut answer = String::new();
    raw.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "errno=5\n\n");
    assert_eq!(
        must("wg", &["show", &interface, "peers"]).trim(),
        peer.public_key_base64()
    );

    // Down: the interface and the control socket are gone.
    let name = interface.clone();
    let gone = worker.run(move |slot| {
        slot.take().expect("up").down().expect("down");
        !link_exists(&name)
    });
    assert!(gone);
    assert!(!std::path::Path::new(&socket).exists());
    drop(worker);
}

/// Two fresh namespaces joined by a veth pair, up, with 198.18.0.1/24 and 198.18.0.2/24: the
/// run's suffix, the namespaces and the two ends' names. The pair is made in this namespace
/// under unique names and moved at once.
fn linked_namespaces() -> (String, Netns, Netns, String, String) {
    sweep_leftovers();
    let suffix = random_suffix();
    let ns_a = Netns::new("a");
    let ns_b = Netns::new("b");
    let veth_a = format!("plztv{suffix}a");
    let veth_b = format!("plztv{suffix}b");
    must(
        "ip",
        &[
            "link", "add", &veth_a, "netns", &ns_a.name, "type", "veth", "peer", "name", &veth_b,
            "netns", &ns_b.name,
        ],
    );
    ns_a.ip(&["addr", "add", "198.18.0.1/24", "dev", &veth_a]);
    ns_b.ip(&["addr", "add", "198.18.0.2/24", "dev", &veth_b]);
    ns_a.ip(&["link", "set", &veth_a, "up"]);
    ns_b.ip(&["link", "set", &veth_b, "up"]);
    (suffix, ns_a, ns_b, veth_a, veth_b)
}

/// Two Machines on a veth pair (198.18.0.1 and .2, MTU 1500), each with its userspace
/// interface up; peers are not set yet.
fn two_machines() -> (Machine, Machine) {
    let (suffix, ns_a, ns_b, _, _) = linked_namespaces();
    let machine = |netns: Netns, tag: &str, subnet: &str, underlay: Ipv4Addr| Machine {
        worker: Worker::new(&netns),
        netns,
        key: PrivateKey::generate(),
        interface: format!("plzt{suffix}{tag}"),
        subnet: subnet.parse().unwrap(),
        underlay,
    };
    let a = machine(ns_a, "a", "10.210.0.0/24", Ipv4Addr::new(198, 18, 0, 1));
    let b = machine(ns_b, "b", "10.210.1.0/24", Ipv4Addr::new(198, 18, 0, 2));
    a.up();
    b.up();
    (a, b)
}

/// [`two_machines`] made peers of each other, with a UDP socket on each Management Address,
/// once a datagram has crossed from A to B.
fn peered_machines() -> (Machine, Machine, UdpSocket, UdpSocket) {
    let (a, b) = two_machines();
    a.set_peers(vec![b.peer_config()]);
    b.set_peers(vec![a.peer_config()]);
    let sock_a = a.bind(a.key.management_address().addr().into());
    let sock_b = b.bind(b.key.management_address().addr().into());
    assert!(
        exchange(&sock_a, &sock_b),
        "A reaches B: {}",
        diagnose(&[&a, &b])
    );
    (a, b, sock_a, sock_b)
}

/// A stream of `total` pseudo-random bytes (each MiB numbered, so lost, repeated or reordered
/// data changes the digest) and its digest.
struct Payload {
    block: Vec<u8>,
    total: u64,
}

impl Payload {
    fn new(total: u64) -> Payload {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let block = (0..1 << 20)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        Payload { block, total }
    }

    /// Writes the stream, and answers its digest.
    fn send(&self, stream: &mut impl std::io::Write) -> std::io::Result<StreamDigest> {
        let mut digest = StreamDigest::default();
        let mut block = self.block.clone();
        let mut sent = 0u64;
        let mut n = 0u64;
        while sent < self.total {
            block[..8].copy_from_slice(&n.to_le_bytes());
            let len = (self.total - sent).min(block.len() as u64) as usize;
            stream.write_all(&block[..len])?;
            digest.update(&block[..len]);
            sent += len as u64;
            n += 1;
        }
        Ok(digest)
    }
}

/// Reads a stream to its end: its digest.
fn receive(stream: &mut impl std::io::Read) -> std::io::Result<StreamDigest> {
    let mut digest = StreamDigest::default();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = stream.read(&mut buf)?;
        if n == 0 {
            return Ok(digest);
        }
        digest.update(&buf[..n]);
    }
}

/// Sends `total` bytes over TCP from `from`'s namespace to a listener on `to_addr` in `to`'s,
/// and checks they arrive whole and in order. Answers the rate in MB/s.
fn transfer(from: &Worker, to: &Worker, to_addr: IpAddr, port: u16, total: u64) -> f64 {
    let listener = to.run(move |_| TcpListener::bind((to_addr, port)).expect("listen"));
    let receiver = std::thread::spawn(move || {
        let (mut stream, _) = listener.accept().expect("accept");
        receive(&mut stream).expect("receive")
    });
    let addr = SocketAddr::new(to_addr, port);
    let mut stream = from.run(move |_| {
        TcpStream::connect_timeout(&addr, Duration::from_secs(20))
            .expect("connect through the mesh")
    });
    let payload = Payload::new(total);
    let started = Instant::now();
    let sent = payload.send(&mut stream).expect("send");
    stream
        .shutdown(std::net::Shutdown::Write)
        .expect("shutdown");
    let received = receiver.join().expect("the receiver ran");
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(received.len(), total, "every byte arrived");
    assert_eq!(received, sent, "the bytes arrived unchanged and in order");
    total as f64 / secs / 1e6
}

#[test]
#[ignore = "needs root"]
fn a_gigabyte_crosses_the_userspace_mesh_intact_in_large_batches() {
    let (a, b, _sock_a, _sock_b) = peered_machines();
    let mgmt_b = IpAddr::V6(b.key.management_address().addr());

    let rate = transfer(&a.worker, &b.worker, mgmt_b, 17_001, 1 << 30);
    eprintln!("1 GiB A -> B through the userspace mesh: {rate:.0} MB/s");

    let stats = |m: &Machine| {
        m.worker.run(|slot| {
            slot.as_ref()
                .expect("up")
                .datapath_stats()
                .expect("userspace")
        })
    };
    let (sa, sb) = (stats(&a), stats(&b));
    assert!(
        sa.tun_offload && sa.udp_gso && sb.udp_gro && sb.tun_offload,
        "this kernel has every offload: {sa:?} {sb:?}"
    );
    // 1 GiB is ~760k packets at this MTU. With segmentation offload each TUN read carries many
    // of them, and each UDP send many datagrams; on the receiving side GRO and coalescing do
    // the same. One packet per call would be a ratio of 1.
    let ratio = |packets: u64, calls: u64| packets as f64 / calls.max(1) as f64;
    assert!(sa.packets_sent > 700_000, "{sa:?}");
    assert!(
        ratio(sa.packets_sent, sa.tun_reads) > 4.0,
        "TSO on A's interface: {sa:?}"
    );
    assert!(
        ratio(sa.packets_sent, sa.udp_sends) > 4.0,
        "UDP GSO on A: {sa:?}"
    );
    assert!(
        ratio(sb.packets_received, sb.udp_receives) > 2.0,
        "UDP GRO on B: {sb:?}"
    );
    assert!(
        ratio(sb.packets_received, sb.tun_writes) > 2.0,
        "coalesced writes on B: {sb:?}"
    );
    assert_eq!(sb.dropped_invalid, 0, "{sb:?}");

    // The other way, and over IPv4 between the Machine Subnets (an address of each on lo).
    a.netns.ip(&["addr", "add", "10.210.0.1/32", "dev", "lo"]);
    b.netns.ip(&["addr", "add", "10.210.1.1/32", "dev", "lo"]);
    let rate = transfer(
        &b.worker,
        &a.worker,
        "10.210.0.1".parse().unwrap(),
        17_002,
        64 << 20,
    );
    eprintln!("64 MiB B -> A over IPv4: {rate:.0} MB/s");
}

/// The boringtun device that comes with the protocol crate, in a namespace: a WireGuard
/// implementation other than Ployz's, writing to a plain TUN interface (whose kernel checks
/// every checksum).
struct OtherImplementation {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
    control: std::os::unix::net::UnixStream,
}

impl OtherImplementation {
    fn start(netns: &Netns, name: &str) -> OtherImplementation {
        use std::os::fd::IntoRawFd;
        let path = format!("/var/run/netns/{}", netns.name);
        let name = name.to_owned();
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("a socket pair");
        let (stop, stopped) = mpsc::channel::<()>();
        let (ready, started) = mpsc::channel();
        let thread = std::thread::spawn(move || {
            let file = File::open(&path).expect("the namespace");
            setns(&file, CloneFlags::CLONE_NEWNET).expect("setns");
            let config = defguard_boringtun::device::DeviceConfig {
                uapi_fd: theirs.into_raw_fd(),
                use_connected_socket: false,
                ..Default::default()
            };
            let handle = defguard_boringtun::device::DeviceHandle::new(&name, config)
                .expect("boringtun starts");
            ready.send(()).expect("the test waits");
            let _ = stopped.recv();
            drop(handle);
        });
        started.recv().expect("boringtun started");
        ours.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        OtherImplementation {
            stop: Some(stop),
            thread: Some(thread),
            control: ours,
        }
    }

    fn set(&self, body: &str) {
        use std::io::Write;
        (&self.control)
            .write_all(format!("set=1\n{body}\n").as_bytes())
            .expect("write the request");
        let mut reader = std::io::BufReader::new(&self.control);
        let reply = ployz_mesh::userspace::read_reply(&mut reader).expect("a reply");
        assert_eq!(reply.errno, 0, "boringtun took {body}");
    }
}

impl Drop for OtherImplementation {
    fn drop(&mut self) {
        let _ = self.control.shutdown(std::net::Shutdown::Both);
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn hex(key: [u8; 32]) -> String {
    key.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
#[ignore = "needs root"]
fn the_userspace_mesh_interoperates_with_another_wireguard_implementation() {
    let (a, b) = two_machines();
    // B's interface is replaced by boringtun's own device under another name.
    b.worker.run(|slot| {
        if let Some(interface) = slot.take() {
            interface.down().expect("down");
        }
    });
    let other = format!("{}o", b.interface);
    let device = OtherImplementation::start(&b.netns, &other);
    let b_secret: [u8; 32] = rand::random();
    let b_key = PrivateKey::from_bytes(b_secret);
    device.set(&format!(
        "private_key={}\nlisten_port=51820\npublic_key={}\nendpoint=198.18.0.1:51820\nallowed_ip={}/128\nallowed_ip=10.210.0.0/24\n",
        hex(b_secret),
        hex(a.key.public_key()),
        a.key.management_address().addr(),
    ));
    let mgmt_b = b_key.management_address().addr();
    b.netns
        .ip(&["-6", "addr", "add", &format!("{mgmt_b}/128"), "dev", &other]);
    b.netns
        .ip(&["link", "set", "dev", &other, "mtu", "1420", "up"]);
    b.netns.ip(&[
        "-6",
        "route",
        "add",
        &format!("{}/128", a.key.management_address().addr()),
        "dev",
        &other,
    ]);
    b.netns.ip(&["addr", "add", "10.210.1.1/32", "dev", "lo"]);
    b.netns
        .ip(&["route", "add", "10.210.0.0/24", "dev", &other]);
    a.netns.ip(&["addr", "add", "10.210.0.1/32", "dev", "lo"]);
    a.set_peers(vec![PeerConfig {
        public_key: b_key.public_key_base64(),
        management_address: mgmt_b,
        subnet: b.subnet,
        endpoint: Some(SocketAddr::new(IpAddr::V4(b.underlay), 51820)),
    }]);

    let sock_a = a.bind(a.key.management_address().addr().into());
    let sock_b = b.bind(mgmt_b.into());
    assert!(
        exchange(&sock_a, &sock_b),
        "A reaches boringtun's B: {}",
        diagnose(&[&a])
    );
    // Large segments cut by Ployz's device arrive at a plain TUN interface, which drops any
    // packet whose checksum is wrong: TCP would stall, not complete.
    transfer(&a.worker, &b.worker, mgmt_b.into(), 17_003, 64 << 20);
    transfer(
        &a.worker,
        &b.worker,
        "10.210.1.1".parse().unwrap(),
        17_004,
        64 << 20,
    );
    // And what boringtun sends, one packet at a time, is coalesced into Ployz's interface.
    transfer(
        &b.worker,
        &a.worker,
        "10.210.0.1".parse().unwrap(),
        17_005,
        64 << 20,
    );
    drop(device);
}

#[test]
#[ignore = "needs root"]
fn the_userspace_device_applies_a_configuration_whole_and_changes_peers_in_place() {
    sweep_leftovers();
    let netns = Netns::new("c");
    let worker = Worker::new(&netns);
    let name = format!("plzt{}c", random_suffix());
    let peer = hex(PrivateKey::generate().public_key());
    let key = hex(rand::random::<[u8; 32]>());
    let gets = worker.run(move |_| {
        let device = ployz_mesh::userspace::UserspaceDevice::create(&name).expect("the device");
        let set = |body: &str| device.set(body).expect("an answer").errno;
        let get = || device.get().expect("an answer").body;
        let mut seen = Vec::new();
        // A peer before the device has a key is refused, whole: the port with it is not taken.
        seen.push(set(&format!(
            "listen_port=0\npublic_key={peer}\nallowed_ip=10.0.0.1/32\n"
        )));
        seen.push(i32::from(get().contains("public_key=") || get().contains("listen_port=")));
        // A malformed line changes nothing either.
        seen.push(set(&format!("private_key={key}\nlisten_port=x\n")));
        seen.push(i32::from(get().contains("private_key=")));
        // Key and port, then a mark on the live sockets (no rebinding of the port).
        seen.push(set(&format!("private_key={key}\nlisten_port=0\n")));
        seen.push(set("fwmark=77\n"));
        let listing = get();
        seen.push(i32::from(listing.contains("fwmark=77") && listing.contains("listen_port=")));
        // A peer, then its allowed IPs and endpoint changed in place.
        seen.push(set(&format!(
            "public_key={peer}\nendpoint=198.18.0.9:51820\nreplace_allowed_ips=true\nallowed_ip=10.0.0.1/32\n"
        )));
        seen.push(set(&format!(
            "public_key={peer}\nendpoint=198.18.0.10:51820\nreplace_allowed_ips=true\nallowed_ip=10.0.1.0/24\n"
        )));
        let listing = get();
        seen.push(i32::from(
            listing.contains("allowed_ip=10.0.1.0/24")
                && !listing.contains("allowed_ip=10.0.0.1/32")
                && listing.contains("endpoint=198.18.0.10:51820"),
        ));
        seen.push(set(&format!("public_key={peer}\nremove=true\n")));
        seen.push(i32::from(get().contains("public_key=")));
        seen
    });
    assert_eq!(
        gets,
        vec![
            nix::errno::Errno::ENOKEY as i32, // peer before key: refused
            0,                                // nothing of it applied
            nix::errno::Errno::EINVAL as i32, // malformed
            0,                                // nothing of it applied
            0,                                // key and port
            0,                                // the mark on live sockets
            1,                                // both shown
            0,                                // the peer
            0,                                // changed in place
            1,                                // the new allowed IPs and endpoint, the old gone
            0,                                // removed
            0,                                // and gone
        ]
    );
}

#[test]
#[ignore = "needs root"]
fn garbage_at_the_wireguard_port_is_dropped_and_the_tunnel_carries_on() {
    let (a, b, sock_a, sock_b) = peered_machines();
    let dropped_before = b
        .worker
        .run(|slot| {
            slot.as_ref()
                .expect("up")
                .datapath_stats()
                .expect("userspace")
        })
        .dropped_invalid;

    // From A's namespace, on the underlay, straight at B's WireGuard port: random bytes of
    // every size, and datagrams that look like each WireGuard message type (right type and
    // length, random indices, counters and MACs).
    let target = SocketAddr::new(IpAddr::V4(b.underlay), 51820);
    let sent = a.worker.run(move |_| {
        let socket = UdpSocket::bind(("198.18.0.1", 0)).expect("a socket on the underlay");
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut sent = 0;
        for i in 0..20_000usize {
            let len = match i % 6 {
                0 => (next() % 2000) as usize,
                1 => 148,                           // handshake initiation
                2 => 92,                            // handshake response
                3 => 64,                            // cookie reply
                4 => 32 + (next() % 1400) as usize, // data
                _ => (next() % 8) as usize,
            };
            let mut datagram: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if (1..=4).contains(&(i % 6)) {
                let kind = [1u8, 2, 3, 4][i % 6 - 1];
                datagram[..4].copy_from_slice(&[kind, 0, 0, 0]);
            }
            if socket.send_to(&datagram, target).is_ok() {
                sent += 1;
            }
        }
        sent
    });
    assert!(sent > 19_000, "{sent} sent");

    // B counted them as invalid, and the tunnel still carries traffic both ways.
    let ok = wait_until(Duration::from_secs(10), || {
        b.worker
            .run(|slot| {
                slot.as_ref()
                    .expect("up")
                    .datapath_stats()
                    .expect("userspace")
            })
            .dropped_invalid
            >= dropped_before + 10_000
    });
    assert!(ok, "B counts the garbage as invalid");
    assert!(
        exchange(&sock_a, &sock_b),
        "A still reaches B: {}",
        diagnose(&[&a, &b])
    );
    assert!(
        exchange(&sock_b, &sock_a),
        "B still reaches A: {}",
        diagnose(&[&a, &b])
    );
}
