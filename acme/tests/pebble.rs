//! The issuer against a real ACME server: Pebble (Let's Encrypt's test CA) on loopback, with
//! pebble-challtestsrv as its DNS answering 127.0.0.1 for every name. Each test starts its own
//! Pebble on its own ports in its own temporary directory and stops it by PID.
//!
//! A tiny HTTP server on the HTTP-01 port stands in for the edge: it answers
//! `/.well-known/acme-challenge/TOKEN` with the edge's `ChallengeResponder`, exactly what the
//! edge calls.
//!
//! Needs the Debian package `pebble` (`scripts/setup.sh` installs it). Nothing leaves 127.0.0.1.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ployz_acme::{CertificateIssuer, IssuerConfig, PublicAddressSource, VerdictResolver};
use ployz_core::{
    CertificateKeyType, CertificateMaterial, CertificatePolicy, CertificateState,
    CertificateStatus, ClusterDnsVerdict, ContainerKind, ContainerRuntimeObservation,
    ContainerState, MachineId,
};
use ployz_store::certificates::{
    account_key, certificate_key, challenge_key, status_key, stored_material, token_from_path,
    write_policy, CHALLENGES_NAMESPACE,
};
use ployz_store::observations::container_key;
use ployz_store::{KeyPrefix, Store};
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::sync::watch;

#[path = "support/pebble.rs"]
mod pebble_harness;
use pebble_harness::*;

/// The stand-in edge: answers HTTP-01 requests on 127.0.0.1:`port` with the edge's own
/// `ChallengeResponder` over the store, counting the answers it gave.
struct ChallengeServer {
    served: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for ChallengeServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn challenge_server(listener: tokio::net::TcpListener, store: Arc<Store>) -> ChallengeServer {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let store = store.clone();
            let count = count.clone();
            tokio::spawn(async move {
                let mut buf = Vec::new();
                let mut chunk = [0u8; 1024];
                while !buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.len() < 16 * 1024 {
                    match sock.read(&mut chunk).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => buf.extend_from_slice(&chunk[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&buf);
                let path = head
                    .lines()
                    .next()
                    .and_then(|l| l.split_whitespace().nth(1))
                    .unwrap_or_default();
                let responder = ployz_edge::ChallengeResponder::default();
                responder.rebuild(&store);
                let answer = token_from_path(path).and_then(|t| responder.response(t));
                let reply = match answer {
                    Some(body) => {
                        count.fetch_add(1, Ordering::SeqCst);
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    }
                    None => {
                        "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                            .to_owned()
                    }
                };
                let _ = sock.write_all(reply.as_bytes()).await;
                let _ = sock.shutdown().await;
            });
        }
    });
    ChallengeServer { served, task }
}

/// A store for one Machine, with a stand-in edge on a fresh port; returns the port.
async fn store_and_edge() -> (Arc<Store>, ChallengeServer, u16) {
    let store = Arc::new(Store::temporary(MachineId::generate()).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let edge = challenge_server(listener, store.clone()).await;
    (store, edge, port)
}

/// Stores an observation of a running Service container of this Machine publishing `host` over
/// https.
fn publish(store: &Store, host: &str) {
    let mut spec: ployz_core::ServiceSpec = serde_json::from_value(serde_json::json!({
        "name": "web",
        "container": { "image": "busybox" },
    }))
    .unwrap();
    spec.ports = vec![ployz_core::PortSpec::Ingress {
        hostname: Some(host.to_owned()),
        published: None,
        container_port: 8080,
        protocol: ployz_core::IngressProtocol::Https,
    }];
    let id: ployz_core::ContainerId = MachineId::generate().as_str().parse().unwrap();
    let o = ContainerRuntimeObservation {
        id,
        name: "web-abcd".into(),
        machine_id: store.local().clone(),
        service_id: ployz_core::ServiceId::generate(),
        service_name: "web".parse().unwrap(),
        kind: ContainerKind::Service,
        state: ContainerState::Running,
        health: None,
        restart_count: 0,
        address: Some("10.210.0.2".parse().unwrap()),
        image: "busybox".into(),
        created_at: 0,
        spec: Some(spec),
        plan_id: None,
        lease_token: None,
    };
    store
        .put(&container_key(&o), serde_json::to_vec(&o).unwrap())
        .unwrap();
}

/// Runs the issuer until the returned sender is dropped or set.
fn start_issuer(
    store: &Arc<Store>,
    config: IssuerConfig,
) -> (watch::Sender<bool>, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(false);
    let task = tokio::spawn(CertificateIssuer::run(store.clone(), config, rx));
    (tx, task)
}

async fn stop_issuer(tx: watch::Sender<bool>, task: tokio::task::JoinHandle<()>) {
    tx.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("the issuer stops promptly")
        .unwrap();
}

fn status(store: &Store, host: &str) -> Option<CertificateStatus> {
    store
        .get(&status_key(store.local(), host))
        .unwrap()
        .and_then(|r| r.live_value().map(<[u8]>::to_vec))
        .map(|v| serde_json::from_slice(&v).unwrap())
}

/// Polls `f` every 100 ms until it returns `Some`, for at most `within`.
async fn eventually<T>(within: Duration, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for material for `host` that `accept` likes, with a diagnostic on timeout.
async fn material_for(
    store: &Store,
    host: &str,
    within: Duration,
    accept: impl Fn(&CertificateMaterial) -> bool,
) -> CertificateMaterial {
    let deadline = Instant::now() + within;
    loop {
        if let Some(m) = stored_material(store, host).filter(|m| accept(m)) {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "no Certificate Material for {host} within {within:?}; status: {:?}",
            status(store, host)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Checks `material` chains to `root_pem` for `host` (webpki, as a TLS client would).
fn assert_chain_valid(material: &CertificateMaterial, root_pem: &str, host: &str) {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_slice_iter(root_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::ring::default_provider()),
    )
    .build()
    .unwrap();
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(material.chain_pem.as_bytes())
            .collect::<Result<_, _>>()
            .unwrap();
    assert!(chain.len() >= 2, "leaf and intermediate expected");
    verifier
        .verify_server_cert(
            &chain[0],
            &chain[1..],
            &ServerName::try_from(host.to_owned()).unwrap(),
            &[],
            UnixTime::now(),
        )
        .unwrap_or_else(|e| panic!("chain for {host} does not verify: {e}"));
    assert!(
        material.names.iter().any(|n| n == host),
        "{:?}",
        material.names
    );
    assert!(material.key_pem.contains("PRIVATE KEY"));
    assert!(
        !format!("{material:?}").contains("PRIVATE KEY"),
        "Debug leaks the key"
    );
}

fn challenge_records(store: &Store) -> usize {
    store
        .scan_live(&KeyPrefix::cluster_namespace(CHALLENGES_NAMESPACE))
        .unwrap()
        .len()
}

fn config(store: &Store) -> IssuerConfig {
    IssuerConfig::new(store.local().clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs pebble (scripts/test.sh runs it)"]
async fn issues_material_for_each_https_ingress_hostname() {
    let started = Instant::now();
    let (store, edge, http01) = store_and_edge().await;
    let pebble = Pebble::start(http01, false);
    write_policy(&store, &pebble.policy()).unwrap();
    publish(&store, "app.test");
    let (tx, task) = start_issuer(&store, config(&store));

    let m = material_for(&store, "app.test", Duration::from_secs(60), |_| true).await;
    let root = pebble.issuing_root();
    assert_chain_valid(&m, &root, "app.test");
    assert!(m.key_pem.starts_with("-----BEGIN PRIVATE KEY-----"));
    assert!(
        edge.served.load(Ordering::SeqCst) >= 1,
        "the edge answered no challenge"
    );
    let s = eventually(Duration::from_secs(5), "a valid status", || {
        status(&store, "app.test").filter(|s| s.state == CertificateState::Valid)
    })
    .await;
    assert_eq!(s.not_after, Some(m.not_after));
    assert_eq!(&s.issuer, store.local());
    assert!(s.renew_at.unwrap() < m.not_after);
    // No Machine public address is known: the verdict is unknown and ordering went ahead.
    assert!(
        matches!(s.verdict, Some(ClusterDnsVerdict::Unknown { .. })),
        "{:?}",
        s.verdict
    );
    assert!(store
        .get(&account_key(&pebble.directory_url()))
        .unwrap()
        .is_some());
    eventually(Duration::from_secs(5), "challenge records removed", || {
        (challenge_records(&store) == 0).then_some(())
    })
    .await;

    // A second hostname gets material of its own; the first is left alone.
    publish(&store, "second.test");
    let m2 = material_for(&store, "second.test", Duration::from_secs(60), |_| true).await;
    assert_chain_valid(&m2, &root, "second.test");
    assert_ne!(m2.key_pem, m.key_pem);
    assert!(!m2.names.contains(&"app.test".to_owned()));
    assert_eq!(stored_material(&store, "app.test").unwrap(), m);

    stop_issuer(tx, task).await;
    eprintln!("issuance test took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs pebble (scripts/test.sh runs it)"]
async fn renewal_by_policy_replaces_material_with_a_new_serial_and_key_type() {
    let started = Instant::now();
    let (store, _edge, http01) = store_and_edge().await;
    let pebble = Pebble::start(http01, false);
    write_policy(&store, &pebble.policy()).unwrap();
    publish(&store, "renew.test");
    let (tx, task) = start_issuer(&store, config(&store));
    let first = material_for(&store, "renew.test", Duration::from_secs(60), |_| true).await;
    let first_serial = ployz_core::read_leaf(&first.chain_pem).unwrap().serial;
    // Pebble's certificates last years: with the default fraction nothing is due. The issuer
    // says so once it has assessed the material: a valid status whose renewal point lies ahead.
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    let s = eventually(
        Duration::from_secs(10),
        "a valid status for the first material",
        || {
            status(&store, "renew.test").filter(|s| {
                s.state == CertificateState::Valid && s.not_after == Some(first.not_after)
            })
        },
    )
    .await;
    assert!(
        s.renew_at.is_some_and(|at| at > now + 3600),
        "renewal due already with the default fraction: {s:?}"
    );
    assert_eq!(stored_material(&store, "renew.test").unwrap(), first);

    // A fraction close to zero puts the renewal point in the past; the policy also asks RSA.
    let policy = CertificatePolicy {
        renewal_fraction: Some(1e-9),
        key_type: Some(CertificateKeyType::Rsa2048),
        ..pebble.policy()
    };
    write_policy(&store, &policy).unwrap();
    let renewed = material_for(&store, "renew.test", Duration::from_secs(120), |m| {
        ployz_core::read_leaf(&m.chain_pem).unwrap().serial != first_serial
    })
    .await;
    assert_chain_valid(&renewed, &pebble.issuing_root(), "renew.test");
    assert_ne!(renewed.key_pem, first.key_pem);
    let der = rustls::pki_types::PrivateKeyDer::from_pem_slice(renewed.key_pem.as_bytes()).unwrap();
    let signing = rustls::crypto::ring::sign::any_supported_type(&der).unwrap();
    assert_eq!(signing.algorithm(), rustls::SignatureAlgorithm::RSA);
    stop_issuer(tx, task).await;
    eprintln!("renewal test took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs pebble (scripts/test.sh runs it)"]
async fn failures_back_off_within_bounds_and_recover_when_the_authority_returns() {
    let started = Instant::now();
    let (store, _edge, http01) = store_and_edge().await;
    let mut pebble = Pebble::start(http01, false);
    write_policy(&store, &pebble.policy()).unwrap();
    publish(&store, "first.test");
    let (tx, task) = start_issuer(&store, config(&store));
    material_for(&store, "first.test", Duration::from_secs(60), |_| true).await;
    let account_before = store
        .get(&account_key(&pebble.directory_url()))
        .unwrap()
        .expect("an account was registered");

    // The authority goes away; its port now only counts connection attempts.
    pebble.stop();
    let connections = Arc::new(AtomicUsize::new(0));
    let counter = {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", pebble.acme_port))
            .await
            .expect("pebble's port is free again");
        let connections = connections.clone();
        tokio::spawn(async move {
            while let Ok((sock, _)) = listener.accept().await {
                connections.fetch_add(1, Ordering::SeqCst);
                drop(sock);
            }
        })
    };
    publish(&store, "second.test");
    let failed = eventually(Duration::from_secs(20), "a failed status", || {
        status(&store, "second.test").filter(|s| s.state == CertificateState::Failed)
    })
    .await;
    assert!(failed.last_error.as_deref().is_some_and(|e| !e.is_empty()));
    let (last, next) = (
        failed.last_attempt_at.unwrap(),
        failed.next_attempt_at.unwrap(),
    );
    assert!(
        (last + 1..=last + 4 + 2).contains(&next),
        "next attempt {next} not within the backoff bounds after {last}"
    );
    eprintln!("failure recorded: {:?}", failed.last_error);

    // Watch a window: attempts are few (backoff 1, 2, 4, 4... s), never a busy loop.
    let window = Duration::from_secs(10);
    let before = connections.load(Ordering::SeqCst);
    let failures_before = failed.consecutive_failures;
    let mut seen_next = BTreeSet::new();
    let end = Instant::now() + window;
    while Instant::now() < end {
        if let Some(s) = status(&store, "second.test") {
            assert!(
                s.state == CertificateState::Failed || s.state == CertificateState::Ordering,
                "{s:?}"
            );
            if let (Some(l), Some(n)) = (s.last_attempt_at, s.next_attempt_at) {
                assert!(
                    (l + 1..=l + 6).contains(&n),
                    "next attempt out of bounds: {s:?}"
                );
                seen_next.insert(n);
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let s = status(&store, "second.test").unwrap();
    let attempts = s.consecutive_failures - failures_before;
    let conns = connections.load(Ordering::SeqCst) - before;
    eprintln!("in {window:?}: {attempts} attempts, {conns} connections");
    assert!(
        (2..=8).contains(&attempts),
        "{attempts} attempts in {window:?}"
    );
    assert!(
        conns <= 4 * attempts as usize + 4,
        "{conns} connections for {attempts} attempts"
    );
    assert!(
        seen_next.len() >= 2,
        "the next attempt time never moved: {seen_next:?}"
    );

    // The authority returns (with no memory of the account): the issuer registers again and
    // the hostname gets its material within the backoff maximum plus an order.
    counter.abort();
    let _ = counter.await;
    pebble.restart();
    let m = material_for(&store, "second.test", Duration::from_secs(60), |_| true).await;
    assert_chain_valid(&m, &pebble.issuing_root(), "second.test");
    // The restarted authority did not know the stored account: a new one replaced it.
    let account_after = store
        .get(&account_key(&pebble.directory_url()))
        .unwrap()
        .unwrap();
    assert_ne!(account_after.value, account_before.value);
    eventually(Duration::from_secs(5), "a valid status", || {
        status(&store, "second.test")
            .filter(|s| s.state == CertificateState::Valid && s.last_error.is_none())
    })
    .await;
    stop_issuer(tx, task).await;
    eprintln!("failure/recovery test took {:?}", started.elapsed());
}

/// A DNS responder on loopback answering A/AAAA from a map that the test can change.
struct TestDns {
    addr: SocketAddr,
    answers: Arc<Mutex<BTreeMap<String, Vec<IpAddr>>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TestDns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn test_dns() -> TestDns {
    use hickory_proto::op::{Message, ResponseCode};
    use hickory_proto::rr::{RData, Record, RecordType};
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    let addr = socket.local_addr().unwrap();
    let answers: Arc<Mutex<BTreeMap<String, Vec<IpAddr>>>> = Arc::default();
    let table = answers.clone();
    let task = tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        while let Ok((n, peer)) = socket.recv_from(&mut buf).await {
            let Ok(query) = Message::from_vec(&buf[..n]) else {
                continue;
            };
            let mut reply = Message::response(query.metadata.id, query.metadata.op_code);
            reply.metadata.recursion_desired = query.metadata.recursion_desired;
            reply.metadata.recursion_available = true;
            reply.metadata.authoritative = true;
            for q in &query.queries {
                reply.add_query(q.clone());
                let name = q.name().to_string().trim_end_matches('.').to_lowercase();
                let found = table.lock().unwrap().get(&name).cloned();
                match found {
                    None => reply.metadata.response_code = ResponseCode::NXDomain,
                    Some(addrs) => {
                        for a in addrs {
                            let rdata = match (a, q.query_type()) {
                                (IpAddr::V4(v4), RecordType::A) => RData::A(v4.into()),
                                (IpAddr::V6(v6), RecordType::AAAA) => RData::AAAA(v6.into()),
                                _ => continue,
                            };
                            reply.add_answer(Record::from_rdata(q.name().clone(), 1, rdata));
                        }
                    }
                }
            }
            if let Ok(bytes) = reply.to_vec() {
                let _ = socket.send_to(&bytes, peer).await;
            }
        }
    });
    TestDns {
        addr,
        answers,
        task,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs pebble (scripts/test.sh runs it)"]
async fn a_hostname_pointing_elsewhere_is_not_ordered_until_it_points_here() {
    let started = Instant::now();
    let (store, edge, http01) = store_and_edge().await;
    let pebble = Pebble::start(http01, false);
    write_policy(&store, &pebble.policy()).unwrap();
    let dns = test_dns().await;
    let here: IpAddr = "203.0.113.7".parse().unwrap();
    let elsewhere: IpAddr = "198.51.100.9".parse().unwrap();
    dns.answers
        .lock()
        .unwrap()
        .insert("away.test".into(), vec![elsewhere]);
    publish(&store, "away.test");
    let mut cfg = config(&store);
    cfg.verdict_resolver = VerdictResolver::At(dns.addr);
    cfg.public_addresses = PublicAddressSource::Fixed(BTreeSet::from([here]));
    let (tx, task) = start_issuer(&store, cfg);

    let s = eventually(
        Duration::from_secs(10),
        "a not-pointing-here status",
        || status(&store, "away.test").filter(|s| s.state == CertificateState::NotPointingHere),
    )
    .await;
    assert_eq!(
        s.verdict,
        Some(ClusterDnsVerdict::ElsewhereOrUnresolved {
            resolved: vec![elsewhere],
            expected: vec![here],
        })
    );
    let why = s.last_error.clone().unwrap();
    assert!(
        why.contains("198.51.100.9") && why.contains("203.0.113.7"),
        "{why}"
    );
    assert!(s.next_attempt_at.is_some());
    eprintln!("status says: {why}");
    // Hold for two more rechecks (each counts in the status): still nothing is ordered (no
    // account, no challenge, no material).
    let rechecked = s.consecutive_failures + 2;
    eventually(Duration::from_secs(30), "two more rechecks", || {
        status(&store, "away.test").filter(|s| s.consecutive_failures >= rechecked)
    })
    .await;
    assert!(stored_material(&store, "away.test").is_none());
    assert!(store
        .get(&account_key(&pebble.directory_url()))
        .unwrap()
        .is_none());
    assert_eq!(edge.served.load(Ordering::SeqCst), 0);
    assert_eq!(
        status(&store, "away.test").unwrap().state,
        CertificateState::NotPointingHere
    );

    // DNS now points at a Machine: the next recheck orders.
    dns.answers
        .lock()
        .unwrap()
        .insert("away.test".into(), vec![here, elsewhere]);
    let m = material_for(&store, "away.test", Duration::from_secs(60), |_| true).await;
    assert_chain_valid(&m, &pebble.issuing_root(), "away.test");
    let s = eventually(Duration::from_secs(5), "a valid status", || {
        status(&store, "away.test").filter(|s| s.state == CertificateState::Valid)
    })
    .await;
    assert!(
        matches!(s.verdict, Some(ClusterDnsVerdict::Points { .. })),
        "{:?}",
        s.verdict
    );
    stop_issuer(tx, task).await;
    eprintln!("verdict test took {:?}", started.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs pebble (scripts/test.sh runs it)"]
async fn external_account_binding_is_used_and_a_wrong_key_is_reported() {
    let started = Instant::now();
    let (store, _edge, http01) = store_and_edge().await;
    let pebble = Pebble::start(http01, true);
    // A key the authority does not know: refused, reported, retried with backoff.
    let wrong = CertificatePolicy {
        eab_key_id: Some(EAB_KID.into()),
        eab_hmac_key: Some("d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmc".into()),
        ..pebble.policy()
    };
    write_policy(&store, &wrong).unwrap();
    publish(&store, "eab.test");
    let (tx, task) = start_issuer(&store, config(&store));
    let s = eventually(Duration::from_secs(30), "a failed status", || {
        status(&store, "eab.test").filter(|s| s.state == CertificateState::Failed)
    })
    .await;
    let e = s.last_error.unwrap();
    eprintln!("wrong EAB key reported as: {e}");
    assert!(e.contains("registering an ACME account"), "{e}");
    assert!(
        !e.contains("d3Jvbmc"),
        "the HMAC key leaked into the status: {e}"
    );
    assert!(store
        .get(&account_key(&pebble.directory_url()))
        .unwrap()
        .is_none());

    // The right key: the policy change ends the backoff and the order succeeds.
    let right = CertificatePolicy {
        eab_hmac_key: Some(EAB_HMAC.into()),
        ..wrong
    };
    write_policy(&store, &right).unwrap();
    let m = material_for(&store, "eab.test", Duration::from_secs(60), |_| true).await;
    assert_chain_valid(&m, &pebble.issuing_root(), "eab.test");
    let account = store
        .get(&account_key(&pebble.directory_url()))
        .unwrap()
        .unwrap();
    let account: serde_json::Value = serde_json::from_slice(&account.value).unwrap();
    assert_eq!(account["eab_key_id"], EAB_KID);
    stop_issuer(tx, task).await;
    eprintln!("EAB test took {:?}", started.elapsed());
}

/// No Pebble needed: a refused Certificate Policy stops issuance, never falls back to defaults.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_policy_orders_nothing_and_says_why() {
    let store = Arc::new(Store::temporary(MachineId::generate()).unwrap());
    // A directory that counts every connection: none may come.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let connections = Arc::new(AtomicUsize::new(0));
    let c = connections.clone();
    let counter = tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            c.fetch_add(1, Ordering::SeqCst);
            drop(s);
        }
    });
    let refused = CertificatePolicy {
        directory_url: Some(format!("https://127.0.0.1:{port}/dir")),
        challenge: Some("dns-01".into()),
        ..Default::default()
    };
    // Written raw, as a record replicated from elsewhere would arrive.
    store
        .put(
            &ployz_store::certificates::policy_key(),
            serde_json::to_vec(&refused).unwrap(),
        )
        .unwrap();
    publish(&store, "refused.test");
    let (tx, task) = start_issuer(&store, config(&store));
    let s = eventually(Duration::from_secs(10), "a policy-refused status", || {
        status(&store, "refused.test").filter(|s| s.state == CertificateState::PolicyRefused)
    })
    .await;
    let e = s.last_error.unwrap();
    assert!(
        e.contains("challenge 'dns-01' cannot be performed: Ployz performs only http-01"),
        "{e}"
    );
    // Another hostname makes the issuer pass again; once its refusal is written, that pass is
    // over too, and still nothing was ordered.
    publish(&store, "refused-too.test");
    eventually(
        Duration::from_secs(10),
        "a second policy-refused status",
        || {
            status(&store, "refused-too.test")
                .filter(|s| s.state == CertificateState::PolicyRefused)
        },
    )
    .await;
    assert_eq!(connections.load(Ordering::SeqCst), 0);
    assert!(stored_material(&store, "refused.test").is_none());
    assert!(store
        .get(&certificate_key("refused.test"))
        .unwrap()
        .is_none());
    assert!(store.get(&challenge_key("x")).unwrap().is_none());
    stop_issuer(tx, task).await;
    counter.abort();
}
