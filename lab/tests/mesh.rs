//! The mesh's data path between two daemons: a gigabyte crosses it intact, the userspace
//! device reports its offloads and throughput (`ployz wg show`, `/metrics`), and the daemon's
//! memory comes back to where it was idle.

mod common;

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::Duration;

use common::*;
use ployz_lab::Lab;
use ployz_testkit::StreamDigest;

/// Moves the calling thread into Machine `i`'s network namespace.
fn enter(lab: &Lab, i: usize) {
    use std::os::fd::AsRawFd;
    let path = PathBuf::from("/var/run/netns").join(lab.netns(i));
    let file = std::fs::File::open(&path).expect("the Machine's namespace");
    // SAFETY: setns on this thread only, with a valid namespace descriptor.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {}", std::io::Error::last_os_error());
}

/// The daemon's resident memory, in KiB.
fn rss_kib(lab: &Lab, i: usize) -> u64 {
    let pid = lab.daemon_pid(i).expect("the daemon runs");
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("its status");
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

#[test]
#[ignore = "needs root, dockerd and the lab (scripts/test.sh runs it)"]
fn a_gigabyte_crosses_the_mesh_intact_and_the_daemon_gives_its_memory_back() {
    const TOTAL: u64 = 1 << 30;
    let lab = cluster(2);
    // Idle: the Cluster formed a few seconds ago; the figure is taken as the lowest of a few
    // readings, as RSS settles after start.
    let idle: Vec<u64> = (0..2)
        .map(|i| {
            (0..5)
                .map(|_| {
                    std::thread::sleep(Duration::from_millis(200));
                    rss_kib(&lab, i)
                })
                .max()
                .unwrap()
        })
        .collect();

    // A listener on m1's Machine Gateway, reached from m0 through the WireGuard interface.
    let gateway = Ipv4Addr::new(10, 210, 1, 1);
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let receiver = {
        // A socket stays in the namespace it was made in, whichever thread uses it.
        let listener = std::thread::scope(|s| {
            s.spawn(|| {
                enter(&lab, 1);
                TcpListener::bind(("0.0.0.0", 17_100)).expect("listen in m1")
            })
            .join()
            .expect("bound")
        });
        std::thread::spawn(move || {
            ready_tx.send(()).unwrap();
            let (mut stream, _) = listener.accept().expect("accept");
            let mut digest = StreamDigest::default();
            let mut buf = vec![0u8; 1 << 16];
            loop {
                let n = stream.read(&mut buf).expect("read");
                if n == 0 {
                    return digest;
                }
                digest.update(&buf[..n]);
            }
        })
    };
    ready_rx.recv().unwrap();
    let sent = std::thread::scope(|s| {
        s.spawn(|| {
            enter(&lab, 0);
            let mut stream = TcpStream::connect_timeout(
                &SocketAddr::new(gateway.into(), 17_100),
                Duration::from_secs(20),
            )
            .expect("m0 reaches m1's gateway through the mesh");
            let mut digest = StreamDigest::default();
            let mut chunk = vec![0u8; 1 << 16];
            let mut x = 0x9e37_79b9_7f4a_7c15u64;
            let mut sent = 0u64;
            while sent < TOTAL {
                for b in chunk.iter_mut() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    *b = x as u8;
                }
                stream.write_all(&chunk).expect("write");
                digest.update(&chunk);
                sent += chunk.len() as u64;
            }
            stream.shutdown(std::net::Shutdown::Write).unwrap();
            digest
        })
        .join()
        .expect("the sender ran")
    });
    let received = receiver.join().expect("the receiver ran");
    assert_eq!(received.len(), TOTAL, "every byte arrived");
    assert_eq!(received, sent, "the bytes arrived unchanged and in order");

    // What m0's daemon shows of it, once its next observation has counted the transfer.
    let datapath = wait_for(
        &lab,
        "m0's wg show counts the gigabyte",
        Duration::from_secs(30),
        || {
            let status = lab.json(0, &["wg", "show", "--json"]);
            let d = status.get("datapath")?.clone();
            (d["bytes_sent"].as_u64()? >= TOTAL).then_some(d)
        },
    );
    assert_eq!(datapath["tun_offload"], true, "{datapath}");
    assert_eq!(datapath["udp_gso"], true, "{datapath}");
    assert!(
        datapath["peak_send_rate"].as_u64().unwrap() > 0,
        "a measured rate: {datapath}"
    );
    let shown = text(&ok(&lab, 0, &["wg", "show"]));
    assert!(shown.contains("TUN segmentation on"), "{shown}");
    assert!(shown.contains("throughput"), "{shown}");
    let metrics = lab.exec_in(0, &["curl", "-s", "http://127.0.0.1:51090/metrics"]);
    let metrics = String::from_utf8_lossy(&metrics.stdout);
    assert!(
        metrics.contains("ployz_mesh_datapath_offload{kind=\"tun_tso\"} 1"),
        "{metrics}"
    );
    let sent: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("ployz_mesh_datapath_bytes_total{direction=\"sent\"} "))
        .and_then(|v| v.parse().ok())
        .expect("the sent bytes series");
    assert!(sent >= TOTAL, "{sent}");

    // Memory: each daemon's RSS comes back within 10% of idle (buffers are sized at start;
    // nothing the transfer grew may stay).
    for (i, idle) in idle.iter().enumerate() {
        let limit = idle + idle / 10;
        eprintln!(
            "Machine {i}: RSS {idle} KiB idle, {} KiB after the gigabyte",
            rss_kib(&lab, i)
        );
        wait_for(
            &lab,
            &format!("Machine {i}'s daemon RSS back within 10% of idle ({idle} KiB)"),
            Duration::from_secs(30),
            || (rss_kib(&lab, i) <= limit).then_some(()),
        );
    }
}
