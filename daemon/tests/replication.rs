//! Replication between stores over real TCP on 127.0.0.1: each test Machine is a store serving
//! the peer routes and running a replicator with the others as its up peers.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ployz_core::MachineId;
use ployz_daemon::replication::{
    paths, routes, routes_with, PullAnswer, PullRequest, ReplicationSettings, Replicator,
    ServeLimits, SyncPeer, MACHINE_HEADER,
};
use ployz_store::{Digest, Hlc, Key, KeyPrefix, OpenOptions, Record, Store, SyncRequest};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How long a condition may take before a test fails: generous, the machine is shared.
const DEADLINE: Duration = Duration::from_secs(60);

fn settings() -> ReplicationSettings {
    ReplicationSettings {
        anti_entropy_interval: Duration::from_millis(200),
        ..ReplicationSettings::default()
    }
}

/// Serves `app` on `listener`; aborting the task closes the listener and every connection.
fn serve(listener: TcpListener, app: axum::Router) -> JoinHandle<()> {
    tokio::spawn(async move {
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let Ok((io, _)) = listener.accept().await else {
                continue;
            };
            while connections.try_join_next().is_some() {}
            let service = hyper_util::service::TowerToHyperService::new(app.clone());
            connections.spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(io), service)
                    .await;
            });
        }
    })
}

/// One test Machine.
struct Node {
    store: Arc<Store>,
    addr: SocketAddr,
    peers: watch::Sender<Vec<SyncPeer>>,
    server: Option<JoinHandle<()>>,
    running: Option<(Replicator, watch::Sender<bool>)>,
}

impl Node {
    fn new() -> Node {
        let store = Arc::new(Store::temporary(MachineId::generate()).unwrap());
        Node::with_store(store)
    }

    fn with_store(store: Arc<Store>) -> Node {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, ployz_testkit::free_port()));
        Node {
            store,
            addr,
            peers: watch::channel(Vec::new()).0,
            server: None,
            running: None,
        }
    }

    fn peer(&self) -> SyncPeer {
        SyncPeer {
            id: self.store.local().clone(),
            addr: self.addr,
        }
    }

    async fn start_server(&mut self) {
        let listener = TcpListener::bind(self.addr).await.unwrap();
        self.server = Some(serve(listener, routes(self.store.clone())));
    }

    fn start_replicator(&mut self, settings: ReplicationSettings) {
        let (stop, shutdown) = watch::channel(false);
        let replicator = Replicator::spawn(
            self.store.clone(),
            self.peers.subscribe(),
            settings,
            shutdown,
        );
        self.running = Some((replicator, stop));
    }

    async fn start(&mut self, settings: ReplicationSettings) {
        self.start_server().await;
        self.start_replicator(settings);
    }

    /// The whole Machine stops: its server (every connection closed) and its replicator.
    async fn stop(&mut self) {
        if let Some(server) = self.server.take() {
            server.abort();
            let _ = server.await;
        }
        if let Some((replicator, stop)) = self.running.take() {
            stop.send(true).unwrap();
            tokio::time::timeout(DEADLINE, replicator.stopped())
                .await
                .expect("the replicator stops on shutdown");
        }
    }

    fn replicator(&self) -> &Replicator {
        &self.running.as_ref().expect("the replicator runs").0
    }

    fn digest(&self) -> Digest {
        self.store.digest().unwrap()
    }

    fn everything(&self) -> Vec<Record> {
        self.store.scan(&KeyPrefix::everything()).unwrap()
    }

    /// Writes `n` cluster-scoped records `<prefix>-<i>`, off the async workers.
    async fn write(&self, prefix: &str, n: usize, value_len: usize) {
        let store = self.store.clone();
        let prefix = prefix.to_owned();
        tokio::task::spawn_blocking(move || {
            for i in 0..n {
                store
                    .put(
                        &Key::cluster("replication", format!("{prefix}-{i:05}")),
                        vec![b'v'; value_len],
                    )
                    .unwrap();
            }
        })
        .await
        .unwrap();
    }
}

/// Each node's peers are the others.
fn connect(nodes: &[&Node]) {
    for node in nodes {
        let others = nodes
            .iter()
            .filter(|o| o.addr != node.addr)
            .map(|o| o.peer())
            .collect();
        node.peers.send_replace(others);
    }
}

async fn three(settings: ReplicationSettings) -> (Node, Node, Node) {
    let (mut a, mut b, mut c) = (Node::new(), Node::new(), Node::new());
    for node in [&mut a, &mut b, &mut c] {
        node.start(settings.clone()).await;
    }
    connect(&[&a, &b, &c]);
    (a, b, c)
}

/// Waits until `condition` holds, checking every 10 ms, failing after [`DEADLINE`].
async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let started = Instant::now();
    while !condition() {
        assert!(
            started.elapsed() < DEADLINE,
            "{what}: not within {DEADLINE:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn same(nodes: &[&Node]) -> bool {
    let first = nodes[0].digest();
    nodes.iter().all(|n| n.digest() == first)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_records_written_on_one_reach_the_other_two_with_equal_digests() {
    let (a, b, c) = three(settings()).await;
    a.write("one", 1000, 64).await;
    wait_until("the three digests are equal", || same(&[&a, &b, &c])).await;
    assert_eq!(b.digest().get(a.store.local()), 1000);
    assert_eq!(b.everything(), a.everything());
    assert_eq!(c.everything(), a.everything());
    // The pushes' answers tell the writer where each peer stands.
    wait_until("a knows both peers hold its 1000 records", || {
        let reports = a.replicator().peers();
        reports.len() == 2
            && reports
                .iter()
                .all(|r| r.up && r.position == Some(1000) && r.last_success.is_some())
    })
    .await;
    // Every record reached each of the two peers, pushed by a or pulled by the peer.
    wait_until("the counters show 2000 records delivered", || {
        let pushed = a.replicator().counters().records_pushed;
        let pulled =
            b.replicator().counters().records_pulled + c.replicator().counters().records_pulled;
        pushed + pulled >= 2000
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_on_each_side_reaches_all_and_the_same_winner_everywhere() {
    let (a, b, c) = three(settings()).await;
    let common = Key::cluster("replication", "common");
    for (node, name) in [(&a, "a"), (&b, "b"), (&c, "c")] {
        node.write(name, 50, 16).await;
        node.store.put(&common, name.as_bytes().to_vec()).unwrap();
    }
    wait_until("the three digests are equal", || same(&[&a, &b, &c])).await;
    for node in [&a, &b, &c] {
        let digest = node.digest();
        assert_eq!(digest.0.len(), 3, "{digest:?}");
        assert!(digest.0.values().all(|&seq| seq == 51), "{digest:?}");
        assert_eq!(node.everything().len(), 151);
    }
    let winner = a.store.get(&common).unwrap().unwrap();
    assert_eq!(b.store.get(&common).unwrap().unwrap(), winner);
    assert_eq!(c.store.get(&common).unwrap().unwrap(), winner);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_absent_peer_blocks_no_one_and_catches_up_from_a_peer_other_than_the_writer() {
    let (mut a, b, mut c) = three(settings()).await;
    a.write("before", 10, 16).await;
    wait_until("the three digests are equal", || same(&[&a, &b, &c])).await;

    c.stop().await;
    a.write("while-c-is-away", 300, 16).await;
    b.write("b-while-c-is-away", 20, 16).await;
    wait_until("a and b agree while c is away", || same(&[&a, &b])).await;
    assert_eq!(b.digest().get(a.store.local()), 310);
    assert_eq!(c.digest().get(a.store.local()), 10);
    wait_until("a's pushes to the absent c failed", || {
        a.replicator()
            .peers()
            .iter()
            .any(|p| p.id == *c.store.local() && p.last_error.is_some())
    })
    .await;

    // The writer goes away too: c can only catch up on a's records from b.
    a.stop().await;
    c.start(settings()).await;
    wait_until("c catches up from b", || same(&[&b, &c])).await;
    assert_eq!(c.digest().get(a.store.local()), 310);
    assert_eq!(c.everything(), b.everything());
    // The pull's counters are added once its records are applied, which is when the digests
    // can already be seen equal.
    let pulled_from_b = || {
        c.replicator()
            .peers()
            .into_iter()
            .find(|p| p.id == *b.store.local())
            .map_or(0, |p| p.counters.records_pulled)
    };
    wait_until("c counts a's records as pulled from b", || {
        pulled_from_b() >= 300
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_larger_than_the_batch_bound_still_travels() {
    let small = ReplicationSettings {
        max_batch_bytes: 64 * 1024,
        ..settings()
    };
    let (a, b, c) = three(small).await;
    a.write("small-before", 20, 1000).await;
    let big = Key::cluster("replication", "big");
    let value: Vec<u8> = (0..512 * 1024).map(|i| (i % 251) as u8).collect();
    a.store.put(&big, value.clone()).unwrap();
    a.write("small-after", 20, 1000).await;
    wait_until("the three digests are equal", || same(&[&a, &b, &c])).await;
    for node in [&b, &c] {
        assert_eq!(node.store.get(&big).unwrap().unwrap().value, value);
        assert_eq!(node.everything(), a.everything());
    }
}

/// One HTTP/1.1 exchange on a fresh connection: (status, headers and body as text).
async fn http(addr: SocketAddr, method: &str, path: &str, body: &[u8]) -> (u16, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nconnection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes()).await.unwrap();
    stream.write_all(body).await.unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(DEADLINE, stream.read_to_end(&mut answer))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8_lossy(&answer).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {text}"));
    (status, text)
}

fn record(key: Key, origin: &MachineId, seq: u64, value: &[u8], tombstone: bool) -> Record {
    Record {
        key,
        value: value.to_vec(),
        origin: origin.clone(),
        hlc: Hlc {
            wall_ms: 1_700_000_000_000 + seq,
            counter: 0,
        },
        seq,
        tombstone,
    }
}

fn batch_json(origin: &MachineId, after: u64, up_to: u64, records: &[Record]) -> Vec<u8> {
    serde_json::to_vec(&ployz_store::SyncBatch {
        origin: origin.clone(),
        after,
        up_to,
        records: records.to_vec(),
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_push_gets_400_and_changes_nothing() {
    let mut node = Node::new();
    node.start_server().await;
    let sender = MachineId::generate();
    let owner = MachineId::generate();
    let fine = record(Key::cluster("t", "fine"), &sender, 1, b"x", false);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("not JSON", b"{not json".to_vec(), "is not a sync batch"),
        (
            "a bad origin",
            br#"{"origin":"NOT-AN-ID","after":0,"up_to":1,"records":[]}"#.to_vec(),
            "Machine ID 'NOT-AN-ID'",
        ),
        (
            "no records field",
            format!(r#"{{"origin":"{sender}","after":0,"up_to":1}}"#).into_bytes(),
            "missing field `records`",
        ),
        (
            "up_to below after",
            batch_json(&sender, 5, 4, std::slice::from_ref(&fine)),
            "up_to: 4 is below after (5)",
        ),
        (
            "another Machine's key",
            batch_json(
                &sender,
                0,
                2,
                &[
                    fine.clone(),
                    record(Key::machine(&owner, "t", "x"), &sender, 2, b"x", false),
                ],
            ),
            "records[1]:",
        ),
        (
            "a tombstone with a value",
            batch_json(
                &sender,
                0,
                2,
                &[
                    fine.clone(),
                    record(Key::cluster("t", "gone"), &sender, 2, b"x", true),
                ],
            ),
            "carries a value",
        ),
        (
            "a record whose value is not base64",
            format!(
                r#"{{"origin":"{sender}","after":0,"up_to":1,"records":[{{"key":"c/t/k","value":"%%%","origin":"{sender}","hlc":{{"wall_ms":1,"counter":0}},"seq":1,"tombstone":false}}]}}"#
            )
            .into_bytes(),
            "is not a sync batch",
        ),
    ];
    for (case, body, expected) in cases {
        let (status, text) = http(node.addr, "POST", paths::PUSH, &body).await;
        assert_eq!(status, 400, "{case}: {text}");
        assert!(
            text.contains("\"code\":\"invalid_argument\""),
            "{case}: {text}"
        );
        assert!(
            text.contains(expected),
            "{case}: expected {expected:?} in {text}"
        );
        assert_eq!(
            node.digest(),
            Digest::default(),
            "{case} changed the digest"
        );
        assert!(node.everything().is_empty(), "{case} changed the records");
    }
    // The same batch, well formed, is taken.
    let (status, text) = http(
        node.addr,
        "POST",
        paths::PUSH,
        &batch_json(&sender, 0, 1, &[fine]),
    )
    .await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("\"seq\":1"), "{text}");
    assert!(
        text.contains(&format!("{MACHINE_HEADER}: {}", node.store.local())),
        "{text}"
    );
    assert_eq!(node.digest().get(&sender), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_over_the_limit_gets_413() {
    let store = Arc::new(Store::temporary(MachineId::generate()).unwrap());
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, ployz_testkit::free_port()));
    let limits = ServeLimits {
        max_body_bytes: 1024,
        ..ServeLimits::default()
    };
    let server = serve(
        TcpListener::bind(addr).await.unwrap(),
        routes_with(store.clone(), limits),
    );
    let sender = MachineId::generate();
    let big = record(Key::cluster("t", "big"), &sender, 1, &[7u8; 4096], false);
    let (status, text) = http(
        addr,
        "POST",
        paths::PUSH,
        &batch_json(&sender, 0, 1, &[big]),
    )
    .await;
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("over the limit of 1024 bytes"), "{text}");
    assert_eq!(store.digest().unwrap(), Digest::default());
    server.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_answer_is_bounded_and_the_asker_asks_again_for_the_rest() {
    let mut node = Node::new();
    node.start_server().await;
    node.write("pull", 100, 16).await;
    let ask = |after: u64| PullRequest {
        requests: vec![SyncRequest {
            origin: node.store.local().clone(),
            after,
        }],
        max_records: Some(30),
        max_bytes: None,
    };
    let mut after = 0;
    let mut rounds = 0;
    while after < 100 {
        let body = serde_json::to_vec(&ask(after)).unwrap();
        let (status, text) = http(node.addr, "POST", paths::PULL, &body).await;
        assert_eq!(status, 200, "{text}");
        let json = text.split("\r\n\r\n").nth(1).unwrap();
        let answer: PullAnswer = serde_json::from_str(json).unwrap();
        assert_eq!(answer.batches.len(), 1);
        let batch = &answer.batches[0];
        assert!(batch.records.len() <= 30, "{}", batch.records.len());
        assert_eq!(batch.after, after);
        assert_eq!(batch.up_to, (after + 30).min(100));
        after = batch.up_to;
        rounds += 1;
    }
    assert_eq!(rounds, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_store_that_refuses_writes_answers_a_push_with_503_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let ack_dir = dir.path().join("ack");
    std::fs::create_dir(&ack_dir).unwrap();
    let options = OpenOptions {
        acknowledged: Some(ack_dir.join("store.ack")),
        accept_loss: false,
    };
    let (store, _) =
        Store::open_with(dir.path().join("store"), MachineId::generate(), &options).unwrap();
    store
        .put(&Key::cluster("t", "first"), b"1".to_vec())
        .unwrap();
    // The acknowledgement record's directory goes away: the store stops taking writes.
    std::fs::remove_dir_all(&ack_dir).unwrap();
    let _ = store.put(&Key::cluster("t", "second"), b"2".to_vec());
    assert!(store.write_failure().is_some(), "the store refuses writes");

    let mut node = Node::with_store(Arc::new(store));
    node.start_server().await;
    let before = node.digest();
    let sender = MachineId::generate();
    let pushed = record(Key::cluster("t", "pushed"), &sender, 1, b"x", false);
    let (status, text) = http(
        node.addr,
        "POST",
        paths::PUSH,
        &batch_json(&sender, 0, 1, &[pushed]),
    )
    .await;
    assert_eq!(status, 503, "{text}");
    assert!(text.contains("\"code\":\"unavailable\""), "{text}");
    assert!(text.contains("acknowledgement record"), "{text}");
    assert!(
        text.to_ascii_lowercase().contains("retry-after: 1"),
        "{text}"
    );
    assert_eq!(node.digest(), before);
    // It still answers what it holds.
    let (status, text) = http(node.addr, "GET", paths::DIGEST, b"").await;
    assert_eq!(status, 200, "{text}");
}

/// Measures, over loopback, 10,000 records written on one store to equal digests on two others,
/// twice: while they are written (each write pushed as it is made), and as a catch-up of
/// records written before the peers were given (anti-entropy and pushes from the start), with
/// the time the same writes take on a store without peers. The figures are printed
/// (`--nocapture`), never asserted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_records_reach_two_peers_throughput() {
    const N: usize = 10_000;
    let (a, b, c) = three(ReplicationSettings::default()).await;
    let started = Instant::now();
    a.write("live", N, 100).await;
    let written = started.elapsed();
    wait_until("the three digests are equal", || same(&[&a, &b, &c])).await;
    let live = started.elapsed();
    eprintln!(
        "replication, live: {N} records (100-byte values) written in {:.2} s, on two peers with \
         equal digests after {:.2} s: {:.0} records/s",
        written.as_secs_f64(),
        live.as_secs_f64(),
        N as f64 / live.as_secs_f64()
    );

    let (mut d, mut e, mut f) = (Node::new(), Node::new(), Node::new());
    let started = Instant::now();
    d.write("catch-up", N, 100).await;
    eprintln!(
        "for comparison, {N} records written on a store without peers in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    for node in [&mut d, &mut e, &mut f] {
        node.start(ReplicationSettings::default()).await;
    }
    let started = Instant::now();
    connect(&[&d, &e, &f]);
    wait_until("the three digests are equal", || same(&[&d, &e, &f])).await;
    let catch_up = started.elapsed();
    eprintln!(
        "replication, catch-up: {N} records to two peers with equal digests in {:.2} s: {:.0} \
         records/s",
        catch_up.as_secs_f64(),
        N as f64 / catch_up.as_secs_f64()
    );
    assert_eq!(e.digest().get(d.store.local()), N as u64);
    assert_eq!(f.everything().len(), N);
}
