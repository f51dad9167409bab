//! SWIM membership over real UDP sockets on 127.0.0.1: Machines find each other from a list,
//! a stopped Machine is suspected then observed down, a restarted one is accepted back, a
//! graceful leave is observed at once, removed Machines stop being reported, garbled datagrams
//! are refused, a lossy and slow link causes no false down, a healed partition finds itself, and
//! so does a short cut both ways.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ployz_core::{MachineId, MembershipObservation};
use ployz_mesh::membership::{
    LinkFilter, LinkVerdict, Membership, MembershipConfig, PeerObservation, Profile,
};

use MembershipObservation::{Down, Suspect, Up};

type Observations = BTreeMap<MachineId, PeerObservation>;

/// A Machine of a test Cluster: its identity and gossip address stay the same across restarts.
#[derive(Clone)]
struct Seat {
    id: MachineId,
    addr: SocketAddr,
}

fn seats<const N: usize>() -> [Seat; N] {
    ployz_testkit::free_ports::<N>().map(|port| Seat {
        id: MachineId::generate(),
        addr: SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
    })
}

fn peers(seats: &[Seat]) -> Vec<(MachineId, SocketAddr)> {
    seats.iter().map(|s| (s.id.clone(), s.addr)).collect()
}

fn start(seat: &Seat, all: &[Seat], link: Option<Arc<dyn LinkFilter>>) -> Membership {
    // `TEST_LOG=ployz_mesh=debug,foca=debug` shows what membership and foca did.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("TEST_LOG"))
        .with_test_writer()
        .try_init();
    let mut config = MembershipConfig::new(seat.id.clone(), seat.addr, Profile::Lan);
    config.link = link;
    let membership = Membership::spawn(config).unwrap();
    membership.set_peers(peers(all)).unwrap();
    membership
}

/// Waits, without a fixed sleep, until `check` holds for `membership`'s observations.
async fn wait_until(
    membership: &Membership,
    within: Duration,
    what: &str,
    mut check: impl FnMut(&Observations) -> bool,
) -> Observations {
    let mut rx = membership.subscribe();
    let deadline = tokio::time::Instant::now() + within;
    loop {
        {
            let now = rx.borrow_and_update();
            if check(&now) {
                return now.clone();
            }
        }
        match tokio::time::timeout_at(deadline, rx.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => panic!("membership stopped while waiting for {what}"),
            Err(_) => panic!(
                "{what}: not observed by {} within {within:?}; observations: {:#?}",
                membership.machine_id(),
                *rx.borrow()
            ),
        }
    }
}

fn state_of(observations: &Observations, id: &MachineId) -> Option<MembershipObservation> {
    observations.get(id).map(|o| o.state)
}

async fn wait_all_up(members: &[&Membership], seats: &[Seat], within: Duration) {
    for membership in members {
        let others: Vec<&MachineId> = seats
            .iter()
            .map(|s| &s.id)
            .filter(|id| *id != membership.machine_id())
            .collect();
        let observations = wait_until(membership, within, "every peer up", |obs| {
            others.iter().all(|id| state_of(obs, id) == Some(Up))
        })
        .await;
        assert!(
            !observations.contains_key(membership.machine_id()),
            "the local Machine is reported as a peer: {observations:#?}"
        );
        assert_eq!(observations.len(), others.len(), "{observations:#?}");
    }
}

/// Follows `peer` in `membership`'s observations until it is down; returns whether it was seen
/// suspect first and when (by the observation's own clock) it went down.
async fn follow_until_down(
    membership: &Membership,
    peer: &MachineId,
    within: Duration,
) -> (bool, Instant) {
    let mut saw_suspect = false;
    let observations = wait_until(membership, within, "the stopped peer down", |obs| {
        let state = state_of(obs, peer);
        saw_suspect |= state == Some(Suspect);
        state == Some(Down)
    })
    .await;
    (saw_suspect, observations[peer].since)
}

/// Three Machines, each observing the others up.
async fn three_up(seats: &[Seat; 3]) -> [Membership; 3] {
    let started = seats.clone().map(|seat| start(&seat, seats, None));
    let [ma, mb, mc] = &started;
    wait_all_up(&[ma, mb, mc], seats, Duration::from_secs(10)).await;
    started
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_machine_is_suspected_then_down_and_accepted_back_after_a_restart() {
    let seats = seats::<3>();
    let [_, _, c] = seats.clone();
    let [ma, mb, mc] = three_up(&seats).await;
    let first_bump = ma.observations()[&c.id].bump.unwrap();

    // Abruptly: no leave, peers find out by failed probes.
    mc.abort().await;
    let stopped = Instant::now();
    let (on_a, on_b) = tokio::join!(
        follow_until_down(&ma, &c.id, Duration::from_secs(8)),
        follow_until_down(&mb, &c.id, Duration::from_secs(8)),
    );
    for (who, (saw_suspect, down_at)) in [("a", on_a), ("b", on_b)] {
        let took = down_at.saturating_duration_since(stopped);
        eprintln!("observer {who}: stopped Machine down after {took:?} (suspect seen first: {saw_suspect})");
        assert!(
            saw_suspect,
            "observer {who} saw the stopped Machine down without suspecting it"
        );
        assert!(
            took < Duration::from_secs(8),
            "observer {who} took {took:?}"
        );
    }
    assert!(
        ma.counters().probes_failed + mb.counters().probes_failed > 0,
        "a Machine was declared down without any failed probe"
    );

    // The same Machine ID at the same address starts again, with a newer bump.
    let mc = start(&c, &seats, None);
    for observer in [&ma, &mb] {
        let observations = wait_until(observer, Duration::from_secs(10), "the restart up", |obs| {
            state_of(obs, &c.id) == Some(Up)
        })
        .await;
        assert!(
            observations[&c.id].bump.unwrap() > first_bump,
            "{observations:#?}"
        );
    }
    wait_all_up(&[&mc], &seats, Duration::from_secs(10)).await;

    for m in [ma, mb, mc] {
        m.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_shutdown_is_observed_down_without_suspicion() {
    let seats = seats::<3>();
    let [a, b, c] = seats.clone();
    let ma = start(&a, &seats, None);
    let mb = start(&b, &seats, None);
    let mc = start(&c, &seats, None);
    wait_all_up(&[&ma, &mb, &mc], &seats, Duration::from_secs(10)).await;

    let stopping = Instant::now();
    mc.shutdown().await;
    let (on_a, on_b) = tokio::join!(
        follow_until_down(&ma, &c.id, Duration::from_secs(8)),
        follow_until_down(&mb, &c.id, Duration::from_secs(8)),
    );
    for (who, (saw_suspect, down_at)) in [("a", on_a), ("b", on_b)] {
        let took = down_at.saturating_duration_since(stopping);
        eprintln!("observer {who}: departed Machine down {took:?} after shutdown began");
        // Told, not found out: the failure detector never got to suspect it.
        assert!(
            !saw_suspect,
            "observer {who} suspected a Machine that left gracefully"
        );
    }
    // The port is free again: the socket was closed.
    UdpSocket::bind(c.addr).expect("the departed Machine's socket is still open");

    ma.shutdown().await;
    mb.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_handle_leaves_the_cluster_too() {
    let seats = seats::<2>();
    let [a, b] = seats.clone();
    let ma = start(&a, &seats, None);
    let mb = start(&b, &seats, None);
    wait_all_up(&[&ma, &mb], &seats, Duration::from_secs(10)).await;

    drop(mb);
    let (saw_suspect, _) = follow_until_down(&ma, &b.id, Duration::from_secs(8)).await;
    assert!(
        !saw_suspect,
        "a dropped membership was found out by probes, not told"
    );
    ma.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_removed_from_the_set_is_no_longer_reported() {
    let seats = seats::<3>();
    let [a, b, c] = seats.clone();
    let ma = start(&a, &seats, None);
    let mb = start(&b, &seats, None);
    let mc = start(&c, &seats, None);
    wait_all_up(&[&ma, &mb, &mc], &seats, Duration::from_secs(10)).await;

    ma.set_peers(peers(&[a.clone(), b.clone()])).unwrap();
    let observations = wait_until(
        &ma,
        Duration::from_secs(5),
        "the removed Machine gone",
        |obs| !obs.contains_key(&c.id),
    )
    .await;
    assert_eq!(observations.keys().collect::<Vec<_>>(), vec![&b.id]);
    // Only a's report changed: b still reports c.
    assert_eq!(state_of(&mb.observations(), &c.id), Some(Up));

    // Put back, it is reported again with foca's current judgment.
    ma.set_peers(peers(&seats)).unwrap();
    wait_until(&ma, Duration::from_secs(5), "the Machine back", |obs| {
        state_of(obs, &c.id) == Some(Up)
    })
    .await;

    for m in [ma, mb, mc] {
        m.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbled_datagrams_are_counted_and_ignored() {
    let seats = seats::<2>();
    let [a, b] = seats.clone();
    let ma = start(&a, &seats, None);
    let mb = start(&b, &seats, None);
    wait_all_up(&[&ma, &mb], &seats, Duration::from_secs(10)).await;
    let before = ma.counters();

    let sender = UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let garbage: Vec<Vec<u8>> = vec![
        vec![],
        vec![0xff],
        vec![0xff; 64],
        b"not a foca datagram at all".to_vec(),
        // Larger than any datagram membership accepts.
        vec![0u8; 4000],
        // A plausible start (a varint length) that runs off the end.
        vec![0x20, b'a', b'b'],
    ];
    for datagram in &garbage {
        sender.send_to(datagram, a.addr).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while ma.counters().datagrams_rejected < before.datagrams_rejected + garbage.len() as u64 {
        assert!(
            Instant::now() < deadline,
            "garbled datagrams not all refused: {:?}",
            ma.counters()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Still running and still observing.
    ma.set_peers(peers(&seats)).unwrap();
    assert_eq!(state_of(&ma.observations(), &b.id), Some(Up));
    assert_eq!(state_of(&mb.observations(), &a.id), Some(Up));
    assert!(ma.counters().datagrams_received > before.datagrams_received);

    ma.shutdown().await;
    mb.shutdown().await;
}

/// A link that delivers everything and keeps a copy of what went to one address.
#[derive(Debug)]
struct Recorder {
    to: SocketAddr,
    sent: Mutex<Vec<Vec<u8>>>,
}

impl LinkFilter for Recorder {
    fn verdict(&self, to: SocketAddr, datagram: &[u8]) -> LinkVerdict {
        if to == self.to {
            self.sent.lock().unwrap().push(datagram.to_vec());
        }
        LinkVerdict::Deliver
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peers_datagram_from_another_address_is_refused() {
    let seats = seats::<2>();
    let [a, b] = seats.clone();
    let recorder = Arc::new(Recorder {
        to: a.addr,
        sent: Mutex::new(Vec::new()),
    });
    let ma = start(&a, &seats, None);
    let mb = start(&b, &seats, Some(recorder.clone()));
    wait_all_up(&[&ma, &mb], &seats, Duration::from_secs(10)).await;

    // b's own datagrams to a, sent again from an address that is no peer's (as a local process
    // could, over loopback, from the Machine's own address): not taken as b's word.
    let replayed: Vec<Vec<u8>> = recorder.sent.lock().unwrap().clone();
    assert!(!replayed.is_empty(), "b sent a nothing");
    let before = ma.counters();
    let sender = UdpSocket::bind((Ipv4Addr::new(127, 0, 0, 2), 0)).unwrap();
    for datagram in &replayed {
        sender.send_to(datagram, a.addr).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while ma.counters().datagrams_rejected < before.datagrams_rejected + replayed.len() as u64 {
        assert!(
            Instant::now() < deadline,
            "{} datagrams from 127.0.0.2 not all refused: before {before:?}, now {:?}",
            replayed.len(),
            ma.counters()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The same datagrams from b's address are still heard: b stays up.
    assert_eq!(state_of(&ma.observations(), &b.id), Some(Up));

    ma.shutdown().await;
    mb.shutdown().await;
}

/// A link losing `loss` of the datagrams and delaying the others by `delay`.
#[derive(Debug)]
struct Lossy {
    loss: f64,
    delay: Duration,
}

impl LinkFilter for Lossy {
    fn verdict(&self, _to: SocketAddr, _datagram: &[u8]) -> LinkVerdict {
        if rand::random::<f64>() < self.loss {
            LinkVerdict::Drop
        } else {
            LinkVerdict::Delay(self.delay)
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lossy_slow_link_causes_no_false_down_in_lan_profile() {
    let seats = seats::<3>();
    let link: Arc<dyn LinkFilter> = Arc::new(Lossy {
        loss: 0.2,
        delay: Duration::from_millis(50),
    });
    let members: Vec<Membership> = seats
        .iter()
        .map(|s| start(s, &seats, Some(Arc::clone(&link))))
        .collect();
    let refs: Vec<&Membership> = members.iter().collect();
    wait_all_up(&refs, &seats, Duration::from_secs(20)).await;

    // Watch every observer for 30 s: any down is a false one.
    let downs = Arc::new(Mutex::new(Vec::new()));
    let suspects = Arc::new(Mutex::new(0u32));
    let mut watchers = tokio::task::JoinSet::new();
    for membership in &members {
        let mut rx = membership.subscribe();
        let observer = membership.machine_id().clone();
        let (downs, suspects) = (Arc::clone(&downs), Arc::clone(&suspects));
        watchers.spawn(async move {
            let mut last: BTreeMap<MachineId, MembershipObservation> = BTreeMap::new();
            while rx.changed().await.is_ok() {
                for (peer, observation) in rx.borrow_and_update().iter() {
                    if last.insert(peer.clone(), observation.state) != Some(observation.state) {
                        match observation.state {
                            Down => downs.lock().unwrap().push((observer.clone(), peer.clone())),
                            Suspect => *suspects.lock().unwrap() += 1,
                            _ => {}
                        }
                    }
                }
            }
        });
    }
    let window = tokio::time::timeout(Duration::from_secs(30), async {
        // The watchers end only when a membership stops, which this test does after the window.
        while watchers.join_next().await.is_some() {}
    })
    .await;
    assert!(
        window.is_err(),
        "a watcher ended early: a membership stopped during the window"
    );

    let counters: Vec<_> = members.iter().map(|m| m.counters()).collect();
    eprintln!(
        "30 s at 20% loss and 50 ms delay: {} suspicions observed, probes failed {:?}",
        *suspects.lock().unwrap(),
        counters.iter().map(|c| c.probes_failed).collect::<Vec<_>>()
    );
    assert!(
        counters.iter().all(|c| c.datagrams_dropped_by_link > 0),
        "the link dropped nothing: {counters:?}"
    );
    assert_eq!(
        *downs.lock().unwrap(),
        vec![],
        "false downs (observer, peer)"
    );
    for membership in &members {
        let observations = membership.observations();
        assert!(
            observations.values().all(|o| o.state != Down),
            "{observations:#?}"
        );
    }
    for m in members {
        m.shutdown().await;
    }
}

/// A link that, while `cut` is set, drops every datagram crossing between `side` and the rest.
#[derive(Debug)]
struct Partition {
    me_on_side: bool,
    side: BTreeSet<SocketAddr>,
    cut: Arc<AtomicBool>,
}

impl LinkFilter for Partition {
    fn verdict(&self, to: SocketAddr, _datagram: &[u8]) -> LinkVerdict {
        if self.cut.load(Ordering::SeqCst) && self.side.contains(&to) != self.me_on_side {
            LinkVerdict::Drop
        } else {
            LinkVerdict::Deliver
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_healed_partition_finds_itself_again() {
    let seats = seats::<3>();
    let [a, b, c] = seats.clone();
    let cut = Arc::new(AtomicBool::new(false));
    let side: BTreeSet<SocketAddr> = [a.addr].into();
    let link = |seat: &Seat| -> Option<Arc<dyn LinkFilter>> {
        Some(Arc::new(Partition {
            me_on_side: side.contains(&seat.addr),
            side: side.clone(),
            cut: Arc::clone(&cut),
        }))
    };
    let ma = start(&a, &seats, link(&a));
    let mb = start(&b, &seats, link(&b));
    let mc = start(&c, &seats, link(&c));
    wait_all_up(&[&ma, &mb, &mc], &seats, Duration::from_secs(10)).await;

    cut.store(true, Ordering::SeqCst);
    let within = Duration::from_secs(10);
    wait_until(&ma, within, "both others down across the cut", |obs| {
        state_of(obs, &b.id) == Some(Down) && state_of(obs, &c.id) == Some(Down)
    })
    .await;
    for observer in [&mb, &mc] {
        wait_until(observer, within, "a down across the cut", |obs| {
            state_of(obs, &a.id) == Some(Down)
        })
        .await;
    }
    // The side that kept its quorum still sees itself.
    assert_eq!(state_of(&mb.observations(), &c.id), Some(Up));

    cut.store(false, Ordering::SeqCst);
    wait_all_up(&[&ma, &mb, &mc], &seats, Duration::from_secs(20)).await;
    assert!(
        ma.counters().renewals + mb.counters().renewals + mc.counters().renewals > 0,
        "healing went through no renewal, yet a down identity cannot come back"
    );

    for m in [ma, mb, mc] {
        m.shutdown().await;
    }
}

/// A daemon handing its Machine to a next process stops its membership without leaving, and the
/// next start (a newer bump at the same address) replaces it: its peers never observe the
/// Machine down in between (a leave would: see the test above), so their edges keep their
/// exchanges with its containers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_started_again_without_leaving_is_never_observed_down() {
    let seats = seats::<3>();
    let [_, _, c] = seats.clone();
    let [ma, mb, mc] = three_up(&seats).await;
    let first_bump = ma.observations()[&c.id].bump.unwrap();

    mc.abort().await;
    let mc = start(&c, &seats, None);
    for observer in [&ma, &mb] {
        let mut seen = Vec::new();
        wait_until(
            observer,
            Duration::from_secs(10),
            "the next start up",
            |obs| {
                let o = &obs[&c.id];
                seen.push(o.state);
                o.state == Up && o.bump.unwrap() > first_bump
            },
        )
        .await;
        assert!(
            !seen.contains(&Down),
            "{} observed the Machine down while it was started again: {seen:?}",
            observer.machine_id()
        );
    }
    for m in [ma, mb, mc] {
        m.shutdown().await;
    }
}

/// A link between two Machines that can be cut both ways, and whose one side can be made slow.
#[derive(Debug)]
struct CutOrSlow {
    cut: Arc<AtomicBool>,
    slow: Arc<AtomicBool>,
}

impl LinkFilter for CutOrSlow {
    fn verdict(&self, _to: SocketAddr, _datagram: &[u8]) -> LinkVerdict {
        if self.cut.load(Ordering::SeqCst) {
            LinkVerdict::Drop
        } else if self.slow.load(Ordering::SeqCst) {
            LinkVerdict::Delay(Duration::from_millis(250))
        } else {
            LinkVerdict::Deliver
        }
    }
}

/// A cut both ways, healed after both sides suspect each other but before either suspicion ends,
/// is observed whole again soon after. When one side's suspicion ends first, it declares the
/// other down, and the other renews its identity (it cannot refute: the suspicion was sent out
/// while it could not hear). Its own suspicion, started just before, then outlives foca's timer,
/// which a renewal cancels: without `down_stale_suspects` it stayed suspect for good (on the
/// first cut, in 3 runs of 3).
///
/// One side's first datagrams are slow (250 ms), which sets the two sides' probe rounds apart,
/// so their suspicions rarely end together (when they do, both renew and nothing sticks).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_short_cut_both_ways_heals() {
    for cut_for in [2400u64, 2700, 3000] {
        let seats = seats::<2>();
        let [a, b] = seats.clone();
        let cut = Arc::new(AtomicBool::new(false));
        let slow = Arc::new(AtomicBool::new(true));
        let link = |slow: &Arc<AtomicBool>| -> Option<Arc<dyn LinkFilter>> {
            Some(Arc::new(CutOrSlow {
                cut: Arc::clone(&cut),
                slow: Arc::clone(slow),
            }))
        };
        let ma = start(&a, &seats, link(&slow));
        let mb = start(&b, &seats, link(&Arc::new(AtomicBool::new(false))));
        wait_all_up(&[&ma, &mb], &seats, Duration::from_secs(10)).await;
        slow.store(false, Ordering::SeqCst);

        cut.store(true, Ordering::SeqCst);
        let cut_at = tokio::time::Instant::now();
        for (observer, peer) in [(&ma, &b.id), (&mb, &a.id)] {
            wait_until(
                observer,
                Duration::from_secs(3),
                "the peer suspect across the cut",
                |obs| state_of(obs, peer) == Some(Suspect),
            )
            .await;
        }
        // Both suspect. The heal comes `cut_for` after the cut, before either suspicion ends
        // (2.5 s after it began, itself up to a probe period after the cut).
        tokio::time::sleep_until(cut_at + Duration::from_millis(cut_for)).await;
        cut.store(false, Ordering::SeqCst);
        let healed = Instant::now();
        wait_all_up(&[&ma, &mb], &seats, Duration::from_secs(12)).await;
        eprintln!(
            "a cut of about {cut_for} ms: whole again {} ms after it healed",
            healed.elapsed().as_millis()
        );
        for m in [ma, mb] {
            m.shutdown().await;
        }
    }
}
