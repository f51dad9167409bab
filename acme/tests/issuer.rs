//! The issuer among several Machines, without an authority: only the rendezvous winner of a
//! hostname orders for it, and a Machine's stale status records of hostnames it no longer issues
//! are removed. The directory is a closed loopback port, so every order fails fast.

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::time::Duration;

use ployz_acme::rendezvous::issuer_for;
use ployz_acme::{CertificateIssuer, IssuerConfig};
use ployz_core::api::MachineInfo;
use ployz_core::{
    CertificatePolicy, CertificateState, CertificateStatus, ContainerKind,
    ContainerRuntimeObservation, ContainerState, IngressProtocol, LocalMachinePhase, MachineId,
    ManagementAddress, PortSpec,
};
use ployz_store::certificates::{status_key, statuses_of, write_policy};
use ployz_store::machines::machine_key;
use ployz_store::observations::container_key;
use ployz_store::{Hlc, Record, Store};

fn closed_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn machine_record(id: &MachineId, n: u8) -> Record {
    let info = MachineInfo {
        id: id.clone(),
        name: format!("m{n}").parse().unwrap(),
        phase: LocalMachinePhase::Participating,
        subnet: format!("10.210.{n}.0/24").parse().unwrap(),
        public_key: "key".into(),
        management_address: ManagementAddress::from_public_key(&[n; 32]),
        endpoints: Vec::new(),
        version: String::new(),
        wireguard_backend: None,
        edge_features: Vec::new(),
    };
    Record {
        key: machine_key(id),
        value: serde_json::to_vec(&info).unwrap(),
        origin: id.clone(),
        hlc: Hlc {
            wall_ms: 1,
            counter: 0,
        },
        seq: 1,
        tombstone: false,
    }
}

/// The record saying `id`'s daemon runs the certificate issuer.
fn issuer_record(id: &MachineId) -> Record {
    Record {
        key: ployz_store::machines::certificate_issuer_key(id),
        value: Vec::new(),
        origin: id.clone(),
        hlc: Hlc {
            wall_ms: 2,
            counter: 0,
        },
        seq: 2,
        tombstone: false,
    }
}

fn observation_record(machine: &MachineId, hosts: &[String]) -> Record {
    let mut spec: ployz_core::ServiceSpec = serde_json::from_value(serde_json::json!({
        "name": "web",
        "container": { "image": "busybox" },
    }))
    .unwrap();
    spec.ports = hosts
        .iter()
        .map(|h| PortSpec::Ingress {
            hostname: Some(h.clone()),
            published: None,
            container_port: 8080,
            protocol: IngressProtocol::Https,
        })
        .collect();
    let o = ContainerRuntimeObservation {
        id: MachineId::generate().as_str().parse().unwrap(),
        name: "web-abcd".into(),
        machine_id: machine.clone(),
        service_id: ployz_core::ServiceId::generate(),
        service_name: "web".parse().unwrap(),
        kind: ContainerKind::Service,
        state: ContainerState::Running,
        health: None,
        restart_count: 0,
        address: None,
        image: "busybox".into(),
        created_at: 0,
        spec: Some(spec),
        plan_id: None,
        lease_token: None,
    };
    Record {
        key: container_key(&o),
        value: serde_json::to_vec(&o).unwrap(),
        origin: machine.clone(),
        hlc: Hlc {
            wall_ms: 2,
            counter: 0,
        },
        seq: 2,
        tombstone: false,
    }
}

#[tokio::test]
async fn only_the_rendezvous_winner_orders_and_stale_statuses_are_removed() {
    let a = MachineId::generate();
    let b = MachineId::generate();
    let hosts: Vec<String> = (0..12).map(|i| format!("h{i}.example.test")).collect();
    let machines = [a.clone(), b.clone()];
    // Both Machines hold the same replicated records: both Machine records, one observation
    // (written by a third Machine) publishing every hostname.
    let runner = MachineId::generate();
    let shared = vec![
        machine_record(&a, 1),
        machine_record(&b, 2),
        issuer_record(&a),
        issuer_record(&b),
        observation_record(&runner, &hosts),
    ];
    let policy = CertificatePolicy {
        directory_url: Some(format!("https://127.0.0.1:{}/dir", closed_port())),
        backoff_min_secs: Some(30),
        backoff_max_secs: Some(60),
        ..Default::default()
    };
    let store_a = Store::temporary(a.clone()).unwrap();
    let store_b = Store::temporary(b.clone()).unwrap();
    for s in [&store_a, &store_b] {
        s.merge(&shared).unwrap();
        write_policy(s, &policy).unwrap();
    }
    let winner_is = |m: &MachineId| -> BTreeSet<String> {
        hosts
            .iter()
            .filter(|h| issuer_for(h, &machines) == Some(m))
            .cloned()
            .collect()
    };
    let (of_a, of_b) = (winner_is(&a), winner_is(&b));
    assert!(
        !of_a.is_empty() && !of_b.is_empty(),
        "12 hostnames all went one way"
    );

    // A holds a stale status for a hostname B issues (say, from before B joined).
    let stale_host = of_b.iter().next().unwrap().clone();
    let stale = CertificateStatus {
        hostname: stale_host.clone(),
        state: CertificateState::Valid,
        not_after: Some(1),
        renew_at: Some(1),
        issuer: a.clone(),
        last_error: None,
        consecutive_failures: 0,
        last_attempt_at: None,
        next_attempt_at: None,
        verdict: None,
        updated_at: 1,
    };
    store_a
        .put(
            &status_key(&a, &stale_host),
            serde_json::to_vec(&stale).unwrap(),
        )
        .unwrap();

    let mut issuer_a = CertificateIssuer::new(IssuerConfig::new(a.clone()));
    let mut issuer_b = CertificateIssuer::new(IssuerConfig::new(b.clone()));
    let wait_a = issuer_a.pass(&store_a).await;
    issuer_b.pass(&store_b).await;

    for (store, me, mine) in [(&store_a, &a, &of_a), (&store_b, &b, &of_b)] {
        let statuses = statuses_of(store, me);
        let hosts: BTreeSet<String> = statuses.keys().cloned().collect();
        assert_eq!(
            &hosts, mine,
            "{me} has statuses for exactly its own hostnames"
        );
        for s in statuses.values() {
            assert_eq!(s.state, CertificateState::Failed, "{s:?}");
            assert_eq!(&s.issuer, me);
            assert!(
                s.last_error.as_deref().unwrap().contains("127.0.0.1"),
                "{s:?}"
            );
            let (l, n) = (s.last_attempt_at.unwrap(), s.next_attempt_at.unwrap());
            assert!((l + 30..=l + 60 + 1).contains(&n), "{s:?}");
        }
    }
    assert!(!statuses_of(&store_a, &a).contains_key(&stale_host));
    // The next pass is due at the earliest retry: at least the minimum backoff away.
    assert!(
        wait_a >= Duration::from_secs(29) && wait_a <= Duration::from_secs(61),
        "{wait_a:?}"
    );

    // A second pass inside the backoff orders nothing and changes nothing.
    let before = statuses_of(&store_a, &a);
    issuer_a.pass(&store_a).await;
    assert_eq!(statuses_of(&store_a, &a), before);

    // B leaves (its record is deleted): A takes over every hostname, B's included.
    let mut gone = machine_record(&b, 2);
    gone.tombstone = true;
    gone.value.clear();
    gone.hlc.wall_ms = 3;
    gone.seq = 3;
    store_a.merge(&[gone]).unwrap();
    issuer_a.pass(&store_a).await;
    let all: BTreeSet<String> = hosts.iter().cloned().collect();
    let now_mine: BTreeSet<String> = statuses_of(&store_a, &a).keys().cloned().collect();
    assert_eq!(now_mine, all);
}

#[tokio::test]
async fn a_restarted_issuer_keeps_the_backoff_it_promised() {
    let a = MachineId::generate();
    let store = Store::temporary(a.clone()).unwrap();
    store
        .merge(&[observation_record(&a, &["keep.example.test".to_owned()])])
        .unwrap();
    write_policy(
        &store,
        &CertificatePolicy {
            directory_url: Some(format!("https://127.0.0.1:{}/dir", closed_port())),
            backoff_min_secs: Some(300),
            backoff_max_secs: Some(600),
            ..Default::default()
        },
    )
    .unwrap();
    let mut first = CertificateIssuer::new(IssuerConfig::new(a.clone()));
    first.pass(&store).await;
    let failed = statuses_of(&store, &a)["keep.example.test"].clone();
    assert_eq!(failed.state, CertificateState::Failed);
    assert_eq!(failed.consecutive_failures, 1);

    // A new issuer (the daemon restarted) reads the promise back and does not retry early.
    let mut second = CertificateIssuer::new(IssuerConfig::new(a.clone()));
    second.restore(&store);
    let wait = second.pass(&store).await;
    assert_eq!(statuses_of(&store, &a)["keep.example.test"], failed);
    assert!(wait >= Duration::from_secs(290), "{wait:?}");
}

#[tokio::test]
async fn a_machine_observed_down_past_the_grace_has_its_hostnames_issued_by_another() {
    let a = MachineId::generate();
    let b = MachineId::generate();
    let hosts: Vec<String> = (0..12).map(|i| format!("d{i}.example.test")).collect();
    let machines = [a.clone(), b.clone()];
    let of = |m: &MachineId| -> BTreeSet<String> {
        hosts
            .iter()
            .filter(|h| issuer_for(h, &machines) == Some(m))
            .cloned()
            .collect()
    };
    let (of_a, of_b) = (of(&a), of(&b));
    assert!(
        !of_a.is_empty() && !of_b.is_empty(),
        "12 hostnames all went one way"
    );
    let mut m = Membership::new(&machines, &hosts);

    m.pass().await;
    assert_eq!(m.statuses(), of_a, "both up: A issues its own hostnames");

    // B is observed down: within the grace nothing moves, and the pass wakes when it ends.
    m.not_up(&[&b]);
    m.at(10);
    let wait = m.pass().await;
    assert_eq!(m.statuses(), of_a, "B's hostnames moved within the grace");
    assert!(
        (Duration::from_secs(599)..=Duration::from_secs(600)).contains(&wait),
        "the pass does not wake when the grace ends: {wait:?}"
    );
    m.at(300);
    m.pass().await;
    assert_eq!(m.statuses(), of_a, "B's hostnames moved within the grace");

    // Down past the grace: A orders B's hostnames too.
    m.at(611);
    m.pass().await;
    let all: BTreeSet<String> = hosts.iter().cloned().collect();
    assert_eq!(m.statuses(), all, "B's hostnames stayed without an issuer");
    for h in &of_b {
        let s = &statuses_of(&m.store, &a)[h];
        assert_eq!(s.state, CertificateState::Failed, "{s:?}");
        assert!(s.last_attempt_at.is_some(), "{h} was not ordered: {s:?}");
    }

    // B is back: its hostnames are its own again.
    m.not_up(&[]);
    m.at(700);
    m.pass().await;
    assert_eq!(
        m.statuses(),
        of_a,
        "B came back and A still issues its hostnames"
    );

    // B down again: the grace starts over (a flapping Machine does not move hostnames).
    m.not_up(&[&b]);
    m.at(710);
    m.pass().await;
    m.at(1000);
    m.pass().await;
    assert_eq!(m.statuses(), of_a, "the grace did not start over");
    m.at(1311);
    m.pass().await;
    assert_eq!(m.statuses(), all);
    // B's hostnames are A's again, but their orders failed at 611 and wait out the backoff
    // promised then (an authority counts failed validations); their statuses say so.
    for h in &of_b {
        let s = &statuses_of(&m.store, &a)[h];
        assert_eq!(s.state, CertificateState::Failed, "{s:?}");
        assert_eq!(
            s.last_attempt_at,
            Some(m.unix(611)),
            "{h} was ordered again within its backoff: {s:?}"
        );
    }

    // This Machine is never passed over by itself.
    m.not_up(&[&a, &b]);
    m.at(2000);
    m.pass().await;
    m.at(3000);
    m.pass().await;
    assert_eq!(m.statuses(), all);
}

/// An issuer for `machines[0]` among `machines` (each with an issuer record), asked for
/// `hosts`, with a clock the test moves and a membership view it sets. Every order fails at
/// once (a closed port) and is retried only after an hour (and up to a fifth more), so the
/// grace and the membership are what move hostnames.
struct Membership {
    store: Store,
    issuer: CertificateIssuer,
    not_up: tokio::sync::watch::Sender<BTreeSet<MachineId>>,
    now: std::sync::Arc<std::sync::atomic::AtomicI64>,
    start_ms: i64,
    local: MachineId,
}

impl Membership {
    fn new(machines: &[MachineId], hosts: &[String]) -> Membership {
        use std::sync::atomic::{AtomicI64, Ordering};
        use std::sync::Arc;
        use std::time::{SystemTime, UNIX_EPOCH};

        let local = machines[0].clone();
        let store = Store::temporary(local.clone()).unwrap();
        let mut records: Vec<Record> = Vec::new();
        for (i, m) in machines.iter().enumerate() {
            records.push(machine_record(m, i as u8 + 1));
            records.push(issuer_record(m));
        }
        records.push(observation_record(&MachineId::generate(), hosts));
        store.merge(&records).unwrap();
        write_policy(
            &store,
            &CertificatePolicy {
                directory_url: Some(format!("https://127.0.0.1:{}/dir", closed_port())),
                backoff_min_secs: Some(3600),
                backoff_max_secs: Some(7200),
                ..Default::default()
            },
        )
        .unwrap();
        let start_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let now = Arc::new(AtomicI64::new(start_ms));
        let clock_now = now.clone();
        let (not_up, machines_not_up) = tokio::sync::watch::channel(BTreeSet::new());
        let mut config = IssuerConfig::new(local.clone());
        config.clock = ployz_acme::Clock::from_fn(move || {
            UNIX_EPOCH + Duration::from_millis(clock_now.load(Ordering::SeqCst) as u64)
        });
        config.machines_not_up = machines_not_up;
        config.down_grace = Duration::from_secs(600);
        Membership {
            store,
            issuer: CertificateIssuer::new(config),
            not_up,
            now,
            start_ms,
            local,
        }
    }

    /// Moves the clock to `s` seconds after the start.
    fn at(&self, s: i64) {
        self.now.store(
            self.start_ms + s * 1000,
            std::sync::atomic::Ordering::SeqCst,
        );
    }

    /// The Machines observed not up from now on.
    fn not_up(&self, machines: &[&MachineId]) {
        self.not_up
            .send_replace(machines.iter().map(|m| (*m).clone()).collect());
    }

    async fn pass(&mut self) -> Duration {
        self.issuer.pass(&self.store).await
    }

    /// The hostnames this issuer has a status for.
    fn statuses(&self) -> BTreeSet<String> {
        statuses_of(&self.store, &self.local)
            .keys()
            .cloned()
            .collect()
    }

    /// Unix seconds `s` seconds after the start.
    fn unix(&self, s: i64) -> i64 {
        self.start_ms / 1000 + s
    }
}

#[tokio::test]
async fn a_machine_that_observes_fewer_than_half_up_passes_over_none() {
    let a = MachineId::generate();
    let b = MachineId::generate();
    let c = MachineId::generate();
    // Enough that some of B's go to A once B is left out (all to C: 1 in 10^7).
    let hosts: Vec<String> = (0..96).map(|i| format!("q{i}.example.test")).collect();
    let of = |m: &MachineId, among: &[MachineId]| -> BTreeSet<String> {
        hosts
            .iter()
            .filter(|h| issuer_for(h, among) == Some(m))
            .cloned()
            .collect()
    };
    let three = [a.clone(), b.clone(), c.clone()];
    let of_a = of(&a, &three);
    let of_a_without_b = of(&a, &[a.clone(), c.clone()]);
    assert!(
        !of_a.is_empty() && of_a_without_b.len() > of_a.len(),
        "96 hostnames: A got {} of them, {} without B",
        of_a.len(),
        of_a_without_b.len()
    );
    let mut m = Membership::new(&three, &hosts);

    m.pass().await;
    assert_eq!(m.statuses(), of_a, "all up: A issues its own hostnames");

    // A is cut off: it observes neither B nor C up. Past the grace it is one of three up, and
    // orders none of theirs (the others, who observe each other, do).
    m.not_up(&[&b, &c]);
    m.at(10);
    m.pass().await;
    m.at(1000);
    m.pass().await;
    assert_eq!(
        m.statuses(),
        of_a,
        "a Machine that observes only itself up ordered the others' hostnames"
    );

    // C is observed up again: two of three, so B, still past its grace, is passed over.
    m.not_up(&[&b]);
    m.at(1010);
    m.pass().await;
    assert_eq!(
        m.statuses(),
        of_a_without_b,
        "two of three up and B's hostnames still wait for it"
    );

    // Back to one of three: A holds back again, and B's hostnames are left to the others.
    m.not_up(&[&b, &c]);
    m.at(2000);
    m.pass().await;
    assert_eq!(m.statuses(), of_a);

    // C flaps back: B's hostnames are A's again, but their orders failed at 1010 and wait out
    // the hour (and up to a fifth more) promised then: an authority counts failed validations.
    m.not_up(&[&b]);
    m.at(2010);
    m.pass().await;
    assert_eq!(m.statuses(), of_a_without_b);
    let attempted = |store: &Store| -> BTreeSet<Option<i64>> {
        statuses_of(store, &a)
            .iter()
            .filter(|(h, _)| !of_a.contains(*h))
            .map(|(_, s)| s.last_attempt_at)
            .collect()
    };
    assert_eq!(
        attempted(&m.store),
        BTreeSet::from([Some(m.unix(1010))]),
        "B's hostnames were ordered again before their backoff ended"
    );
    m.at(1010 + 3600 * 6 / 5 + 1);
    m.pass().await;
    assert_eq!(
        attempted(&m.store),
        BTreeSet::from([Some(m.unix(1010 + 3600 * 6 / 5 + 1))]),
        "the backoff never ended"
    );
}
