//! The userspace mesh's per-packet protocol work on one core, outside any kernel: WireGuard's
//! data message sealed (`Tunn::encapsulate`, ChaCha20-Poly1305 and its framing) and opened
//! (`Tunn::decapsulate`, with its replay check), for a full 1,420-byte packet (the mesh's MTU)
//! and a small one. This is the ceiling of what one core can move through the mesh per
//! direction: the lab's `wireguard` bench (docs/performance.md) runs both Machines' sealing and
//! opening, their TCP and the kernel's copies on the same two cores.

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use defguard_boringtun::noise::{Tunn, TunnResult};
use defguard_boringtun::x25519::{PublicKey, StaticSecret};

/// Room for a packet and WireGuard's 32 bytes of framing.
const BUF: usize = 2048;

/// Two peers with a session: `a` initiated the handshake, and `b` has opened a packet from it
/// (a responder's session is confirmed by the first data it receives).
fn pair() -> (Tunn, Tunn) {
    let (a_secret, b_secret) = (StaticSecret::from([1; 32]), StaticSecret::from([2; 32]));
    let (a_public, b_public) = (PublicKey::from(&a_secret), PublicKey::from(&b_secret));
    let mut a = Tunn::new(a_secret, b_public, None, None, 1, None);
    let mut b = Tunn::new(b_secret, a_public, None, None, 2, None);
    let (mut one, mut two) = ([0u8; BUF], [0u8; BUF]);
    let TunnResult::WriteToNetwork(initiation) = a.format_handshake_initiation(&mut one, false)
    else {
        panic!("no handshake initiation")
    };
    let TunnResult::WriteToNetwork(response) = b.decapsulate(None, initiation, &mut two) else {
        panic!("no handshake response")
    };
    let response = response.to_vec();
    // The initiator answers the response with a keepalive, which confirms the responder's session.
    let TunnResult::WriteToNetwork(keepalive) = a.decapsulate(None, &response, &mut one) else {
        panic!("the initiator did not answer the handshake response")
    };
    let keepalive = keepalive.to_vec();
    assert!(matches!(
        b.decapsulate(None, &keepalive, &mut two),
        TunnResult::Done
    ));
    (a, b)
}

/// An IPv4 UDP packet of `len` bytes from 10.210.0.1 to 10.210.1.1.
fn packet(len: usize) -> Vec<u8> {
    let mut p = vec![0x5a; len];
    p[0] = 0x45;
    p[1] = 0;
    p[2..4].copy_from_slice(&(len as u16).to_be_bytes());
    p[8] = 64;
    p[9] = 17;
    p[12..16].copy_from_slice(&[10, 210, 0, 1]);
    p[16..20].copy_from_slice(&[10, 210, 1, 1]);
    p
}

fn tunnel(c: &mut Criterion) {
    for len in [1420usize, 100] {
        let (mut a, mut b) = pair();
        let plain = packet(len);
        let mut out = [0u8; BUF];
        let mut group = c.benchmark_group(format!("tunnel/{len}B"));
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_function("seal", |bench| {
            bench.iter(|| match a.encapsulate(black_box(&plain), &mut out) {
                TunnResult::WriteToNetwork(sealed) => black_box(sealed.len()),
                _ => panic!("not sealed"),
            })
        });
        // Every message is opened once: the replay check refuses a counter seen before.
        group.bench_function("open", |bench| {
            bench.iter_batched(
                || match a.encapsulate(&plain, &mut out) {
                    TunnResult::WriteToNetwork(sealed) => sealed.to_vec(),
                    _ => panic!("not sealed"),
                },
                |sealed| {
                    let mut opened = [0u8; BUF];
                    match b.decapsulate(None, &sealed, &mut opened) {
                        TunnResult::WriteToTunnelV4(p, _) => black_box(p.len()),
                        _ => panic!("not opened"),
                    }
                },
                BatchSize::SmallInput,
            )
        });
        group.finish();
    }
}

criterion_group!(benches, tunnel);
criterion_main!(benches);
