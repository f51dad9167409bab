//! The replicator: pushes this Machine's writes to a few up peers as they are made, and pulls
//! what this store lacks from one random up peer every interval. See the
//! [module documentation](super).

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use axum::body::Bytes;
use axum::http::{header, Method, Request, StatusCode};
use futures_util::FutureExt as _;
use http_body_util::{BodyExt as _, Full, Limited};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use ployz_core::api::ApiError;
use ployz_core::MachineId;
use ployz_store::{Digest, KeyPrefix, Store, StoreError, SyncRequest, WatchEvent};
use rand::seq::SliceRandom as _;
use serde::de::DeserializeOwned;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use super::{
    bounded_batch, paths, PullAnswer, PullRequest, PushAnswer, DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_BATCH_RECORDS, MACHINE_HEADER, MAX_BODY_BYTES,
};

/// A peer to replicate with: a Machine currently observed `up`, at its Management Address's
/// management port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SyncPeer {
    /// The peer's Machine ID; an address answering as another Machine is refused.
    pub id: MachineId,
    /// Where its peer routes are served (`[Management Address]:51000`).
    pub addr: SocketAddr,
}

/// How a [`Replicator`] replicates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicationSettings {
    /// To how many up peers each local write is pushed (taken in turn among the up peers). 0
    /// pushes nothing: local writes then travel by anti-entropy only.
    pub fanout: usize,
    /// How often an anti-entropy round runs with one random up peer (at least 10 ms).
    pub anti_entropy_interval: Duration,
    /// At most this many records per pushed batch or pull answer (at least 1).
    pub max_batch_records: usize,
    /// About this many bytes per pushed batch or pull answer at most (one larger record still
    /// travels, alone; at least 1).
    pub max_batch_bytes: usize,
    /// How long one exchange with a peer may take, connecting included.
    pub request_timeout: Duration,
}

impl Default for ReplicationSettings {
    fn default() -> ReplicationSettings {
        ReplicationSettings {
            fanout: 3,
            anti_entropy_interval: Duration::from_secs(1),
            max_batch_records: DEFAULT_MAX_BATCH_RECORDS,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
            request_timeout: Duration::from_secs(5),
        }
    }
}

/// What replication has done, for metrics: since the replicator started, over every peer or
/// for one ([`PeerReport::counters`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReplicationCounters {
    /// Records sent in pushes the peers took.
    pub records_pushed: u64,
    /// Records received in pull answers.
    pub records_pulled: u64,
    /// Received records that won here (the others were already held, or something newer).
    pub records_applied: u64,
    /// Request bodies sent, in bytes.
    pub bytes_sent: u64,
    /// Answer bodies received, in bytes.
    pub bytes_received: u64,
    /// Pushes the peers took.
    pub pushes: u64,
    /// Pull answers applied.
    pub pulls: u64,
    /// Anti-entropy rounds started.
    pub anti_entropy_rounds: u64,
    /// Exchanges that failed (no answer, a refusal, or this store refusing what came back).
    pub failures: u64,
}

/// The last failure of replication with a peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerError {
    /// When it failed.
    pub at: SystemTime,
    /// What failed, naming the request and the peer's address.
    pub message: String,
}

/// Replication with one peer, as this Machine sees it (`ployz machine ls`, debugging).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerReport {
    /// The peer's Machine ID.
    pub id: MachineId,
    /// Where its peer routes were last reached (or are to be).
    pub addr: SocketAddr,
    /// Whether the peer is in the current list of up peers.
    pub up: bool,
    /// Where the peer was last known to stand for this Machine's own records (its digest
    /// entry for this Machine); `None` before first contact.
    pub position: Option<u64>,
    /// What replication with this peer has done.
    pub counters: ReplicationCounters,
    /// When an exchange with it last succeeded.
    pub last_success: Option<SystemTime>,
    /// Its last failure, kept after later successes.
    pub last_error: Option<PeerError>,
}

/// Replicates the local store with the up peers until shut down. See the
/// [module documentation](super). Cheap to clone: clones share the one running task.
#[derive(Clone)]
pub struct Replicator {
    shared: Arc<Shared>,
    done: watch::Receiver<bool>,
}

impl std::fmt::Debug for Replicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicator")
            .field("local", self.shared.store.local())
            .field("settings", &self.shared.settings)
            .finish()
    }
}

impl Replicator {
    /// Starts replicating `store` with the peers `peers` says are up, until `shutdown` turns
    /// true (or its sender is dropped) or the store is gone. Must be called within a tokio
    /// runtime. A dropped `peers` sender keeps the last list.
    pub fn spawn(
        store: Arc<Store>,
        peers: watch::Receiver<Vec<SyncPeer>>,
        settings: ReplicationSettings,
        shutdown: watch::Receiver<bool>,
    ) -> Replicator {
        let settings = ReplicationSettings {
            anti_entropy_interval: settings
                .anti_entropy_interval
                .max(Duration::from_millis(10)),
            max_batch_records: settings.max_batch_records.max(1),
            max_batch_bytes: settings.max_batch_bytes.max(1),
            ..settings
        };
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        connector.set_connect_timeout(Some(settings.request_timeout));
        let client = Client::builder(TokioExecutor::new())
            // Below the management API's idle keep-alive deadline, so the client gives a
            // connection up before the server closes it under a request.
            .pool_idle_timeout(Duration::from_secs(4))
            .pool_max_idle_per_host(2)
            .build(connector);
        let shared = Arc::new(Shared {
            store,
            settings,
            client,
            totals: Counts::default(),
            peers: Mutex::new(BTreeMap::new()),
            caught_up: AtomicBool::new(false),
        });
        let (done_tx, done) = watch::channel(false);
        let task = shared.clone();
        tokio::spawn(async move {
            run(task, peers, shutdown).await;
            let _ = done_tx.send(true);
        });
        Replicator { shared, done }
    }

    /// Whether an anti-entropy round has completed with a peer since the start: this store
    /// then held everything that peer held (its digest compared, nothing left to ask for).
    pub fn caught_up(&self) -> bool {
        self.shared.caught_up.load(Ordering::Relaxed)
    }

    /// The counters over every peer since the start.
    pub fn counters(&self) -> ReplicationCounters {
        self.shared.totals.snapshot()
    }

    /// Every peer replicated with since the start (up or not any more), by Machine ID.
    pub fn peers(&self) -> Vec<PeerReport> {
        lock(&self.shared.peers)
            .values()
            .map(|p| p.report())
            .collect()
    }

    /// Waits until the replicator has stopped (after shutdown, every request in flight
    /// abandoned).
    pub async fn stopped(&self) {
        let mut done = self.done.clone();
        let _ = done.wait_for(|d| *d).await;
    }
}

/// What the replicator's tasks share.
struct Shared {
    store: Arc<Store>,
    settings: ReplicationSettings,
    client: Client<HttpConnector, Full<Bytes>>,
    totals: Counts,
    peers: Mutex<BTreeMap<MachineId, Arc<PeerState>>>,
    /// An anti-entropy round has completed: this store held what one peer's digest promised.
    caught_up: AtomicBool,
}

/// One peer, as the replicator keeps it.
struct PeerState {
    id: MachineId,
    addr: Mutex<SocketAddr>,
    up: AtomicBool,
    /// The peer's digest entry for this Machine, as last known.
    position: Mutex<Option<u64>>,
    counts: Counts,
    health: Mutex<Health>,
    /// Wakes the peer's push worker; one stored permit coalesces every write made meanwhile.
    push: Notify,
}

#[derive(Default)]
struct Health {
    last_success: Option<SystemTime>,
    last_error: Option<PeerError>,
    /// The kinds of exchange ([`Exchange`]) whose current streak fails; each streak is logged
    /// when it starts and when it ends.
    failing: [bool; 2],
}

/// The two kinds of exchange with a peer, each with its own failure streak.
#[derive(Debug, Clone, Copy)]
enum Exchange {
    Push = 0,
    AntiEntropy = 1,
}

impl Exchange {
    fn what(self) -> &'static str {
        match self {
            Exchange::Push => "push",
            Exchange::AntiEntropy => "anti-entropy",
        }
    }
}

impl PeerState {
    fn new(id: MachineId, addr: SocketAddr) -> PeerState {
        PeerState {
            id,
            addr: Mutex::new(addr),
            up: AtomicBool::new(false),
            position: Mutex::new(None),
            counts: Counts::default(),
            health: Mutex::new(Health::default()),
            push: Notify::new(),
        }
    }

    fn addr(&self) -> SocketAddr {
        *lock(&self.addr)
    }

    fn position(&self) -> Option<u64> {
        *lock(&self.position)
    }

    fn set_position(&self, seq: Option<u64>) {
        *lock(&self.position) = seq;
    }

    fn report(&self) -> PeerReport {
        let health = lock(&self.health);
        PeerReport {
            id: self.id.clone(),
            addr: self.addr(),
            up: self.up.load(Ordering::Relaxed),
            position: self.position(),
            counters: self.counts.snapshot(),
            last_success: health.last_success,
            last_error: health.last_error.clone(),
        }
    }
}

#[derive(Default)]
struct Counts {
    records_pushed: AtomicU64,
    records_pulled: AtomicU64,
    records_applied: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    pushes: AtomicU64,
    pulls: AtomicU64,
    anti_entropy_rounds: AtomicU64,
    failures: AtomicU64,
}

impl Counts {
    fn snapshot(&self) -> ReplicationCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ReplicationCounters {
            records_pushed: get(&self.records_pushed),
            records_pulled: get(&self.records_pulled),
            records_applied: get(&self.records_applied),
            bytes_sent: get(&self.bytes_sent),
            bytes_received: get(&self.bytes_received),
            pushes: get(&self.pushes),
            pulls: get(&self.pulls),
            anti_entropy_rounds: get(&self.anti_entropy_rounds),
            failures: get(&self.failures),
        }
    }
}

impl Shared {
    /// Adds `n` to one counter, for the peer and in the totals.
    fn count(&self, peer: &PeerState, counter: fn(&Counts) -> &AtomicU64, n: u64) {
        counter(&peer.counts).fetch_add(n, Ordering::Relaxed);
        counter(&self.totals).fetch_add(n, Ordering::Relaxed);
    }

    fn succeeded(&self, peer: &PeerState, exchange: Exchange) {
        let mut health = lock(&peer.health);
        health.last_success = Some(SystemTime::now());
        if std::mem::take(&mut health.failing[exchange as usize]) {
            tracing::info!(
                peer = %peer.id,
                addr = %peer.addr(),
                "{} with the peer works again",
                exchange.what()
            );
        }
    }

    fn failed(&self, peer: &PeerState, exchange: Exchange, error: &str) {
        self.count(peer, |c| &c.failures, 1);
        let what = exchange.what();
        let mut health = lock(&peer.health);
        health.last_error = Some(PeerError {
            at: SystemTime::now(),
            message: format!("{what}: {error}"),
        });
        if !std::mem::replace(&mut health.failing[exchange as usize], true) {
            tracing::warn!(
                peer = %peer.id,
                addr = %peer.addr(),
                error = %error,
                "{what} with the peer failed; retrying (logged again only once it works)"
            );
        }
    }

    /// One exchange with `peer`: the answer's body when it answered 2xx as the Machine
    /// expected, within the request timeout.
    async fn call(
        &self,
        peer: &PeerState,
        method: Method,
        path: &str,
        body: Vec<u8>,
    ) -> Result<Bytes, String> {
        let addr = peer.addr();
        let what = format!("{method} http://{addr}{path}");
        let sent = body.len() as u64;
        let request = Request::builder()
            .method(method)
            .uri(format!("http://{addr}{path}"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| format!("{what}: the request cannot be made: {e}"))?;
        let exchange = async {
            let response = self
                .client
                .request(request)
                .await
                .map_err(|e| format!("{what}: {}", ployz_core::error_chain(&e)))?;
            let status = response.status();
            let machine = response
                .headers()
                .get(MACHINE_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned);
            let bytes = Limited::new(response.into_body(), MAX_BODY_BYTES)
                .collect()
                .await
                .map_err(|e| format!("{what}: the answer could not be read: {e}"))?
                .to_bytes();
            Ok::<_, String>((status, machine, bytes))
        };
        let timeout = self.settings.request_timeout;
        let (status, machine, bytes) = tokio::time::timeout(timeout, exchange)
            .await
            .map_err(|_| format!("{what}: no answer within {} ms", timeout.as_millis()))??;
        self.count(peer, |c| &c.bytes_sent, sent);
        self.count(peer, |c| &c.bytes_received, bytes.len() as u64);
        if let Some(found) = machine.filter(|m| m != peer.id.as_str()) {
            return Err(format!(
                "{what}: answered by Machine {found}, not by the peer {}; the address belongs to \
                 another Machine now (membership will correct it)",
                peer.id
            ));
        }
        if status != StatusCode::OK {
            let message = match serde_json::from_slice::<ApiError>(&bytes) {
                Ok(e) => e.to_string(),
                Err(_) => String::from_utf8_lossy(&bytes).trim().to_owned(),
            };
            return Err(format!("{what} answered {status}: {message}"));
        }
        Ok(bytes)
    }

    async fn digest_of(&self, peer: &PeerState) -> Result<Digest, String> {
        let bytes = self
            .call(peer, Method::GET, paths::DIGEST, Vec::new())
            .await?;
        decode(&bytes, "digest")
    }

    /// Pushes this Machine's records the peer lacks, batch after batch, until it has them all.
    async fn push_to(&self, peer: &PeerState) -> Result<(), String> {
        let local = self.store.local().clone();
        // Answers that did not move the peer forward; a few in a row end the pass (the peer's
        // own anti-entropy, or the next write, tries again).
        let mut stalled = 0;
        loop {
            let store = self.store.clone();
            let have = on_store(move || store.digest()).await?.get(&local);
            let position = match peer.position() {
                Some(p) => p,
                None => {
                    let p = self.digest_of(peer).await?.get(&local);
                    peer.set_position(Some(p));
                    p
                }
            };
            if position >= have {
                return Ok(());
            }
            let (store, settings) = (self.store.clone(), self.settings.clone());
            let request = SyncRequest {
                origin: local.clone(),
                after: position,
            };
            let (records, body) = on_store(move || {
                let batch = bounded_batch(
                    &store,
                    &request,
                    settings.max_batch_records,
                    settings.max_batch_bytes,
                    true,
                )?;
                let body = serde_json::to_vec(&batch).map_err(|e| {
                    StoreError::Malformed(format!("a sync batch does not serialise: {e}"))
                })?;
                Ok((batch.records.len(), body))
            })
            .await?;
            let bytes = self.call(peer, Method::POST, paths::PUSH, body).await?;
            let answer: PushAnswer = decode(&bytes, "push answer")?;
            self.count(peer, |c| &c.pushes, 1);
            self.count(peer, |c| &c.records_pushed, records as u64);
            peer.set_position(Some(answer.seq));
            if answer.seq > position {
                stalled = 0;
            } else {
                stalled += 1;
                if stalled >= 3 {
                    return Err(format!(
                        "the peer stays at {} for this Machine's records after 3 pushes from \
                         there; anti-entropy will carry them",
                        answer.seq
                    ));
                }
            }
        }
    }

    /// One anti-entropy round with `peer`: pulls what this store lacks of its digest, again
    /// while the answers were cut by the bounds.
    async fn pull_from(&self, peer: &PeerState) -> Result<(), String> {
        let remote = self.digest_of(peer).await?;
        let local = self.store.local().clone();
        let theirs = remote.get(&local);
        if peer.position().is_none() {
            peer.set_position(Some(theirs));
        }
        loop {
            let store = self.store.clone();
            let mine = on_store(move || store.digest()).await?;
            if theirs < mine.get(&local) {
                // The peer lacks some of this Machine's records: its push worker brings them.
                peer.push.notify_one();
            }
            let requests = mine.requests_for(&remote);
            if requests.is_empty() {
                return Ok(());
            }
            let request = PullRequest {
                requests,
                max_records: Some(self.settings.max_batch_records),
                max_bytes: Some(self.settings.max_batch_bytes),
            };
            let body = serde_json::to_vec(&request)
                .map_err(|e| format!("a pull request does not serialise: {e}"))?;
            let bytes = self.call(peer, Method::POST, paths::PULL, body).await?;
            let store = self.store.clone();
            let outcome = tokio::task::spawn_blocking(move || {
                let answer: PullAnswer = decode(&bytes, "pull answer")?;
                let (mut received, mut applied, mut progressed) = (0u64, 0u64, false);
                for batch in &answer.batches {
                    progressed |= batch.up_to > batch.after;
                    let report = store.apply_batch(batch).map_err(|e| {
                        format!(
                            "this Machine's store did not take a batch of {} records of \
                             origin {}: {e}",
                            batch.records.len(),
                            batch.origin
                        )
                    })?;
                    received += batch.records.len() as u64;
                    applied += report.applied as u64;
                }
                Ok::<_, String>((received, applied, progressed))
            })
            .await
            .map_err(|e| format!("applying a pull answer failed: {e}"))?;
            let (received, applied, progressed) = outcome?;
            self.count(peer, |c| &c.pulls, 1);
            self.count(peer, |c| &c.records_pulled, received);
            self.count(peer, |c| &c.records_applied, applied);
            if !progressed {
                // The peer answered nothing new for what its digest promised: asked again next
                // round, never in a loop.
                return Ok(());
            }
        }
    }
}

/// The replicator's main loop: follows the up peers, wakes push workers on local writes, and
/// starts an anti-entropy round every interval.
async fn run(
    shared: Arc<Shared>,
    mut peers: watch::Receiver<Vec<SyncPeer>>,
    mut shutdown: watch::Receiver<bool>,
) {
    if *shutdown.borrow_and_update() {
        return;
    }
    let local = shared.store.local().clone();
    let mut changes = shared.store.watch(KeyPrefix::everything());
    let mut workers: HashMap<MachineId, JoinHandle<()>> = HashMap::new();
    let mut up: Vec<Arc<PeerState>> = Vec::new();
    let list = peers.borrow_and_update().clone();
    follow_peers(&shared, &list, &mut workers, &mut up);
    let mut peers_open = true;
    let mut rotation = 0usize;
    let mut round: Option<JoinHandle<()>> = None;
    let mut tick = tokio::time::interval(shared.settings.anti_entropy_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            changed = peers.changed(), if peers_open => match changed {
                Ok(()) => {
                    let list = peers.borrow_and_update().clone();
                    follow_peers(&shared, &list, &mut workers, &mut up);
                }
                Err(_) => peers_open = false,
            },
            event = changes.next() => {
                let mut local_write = match event {
                    None => break,
                    Some(WatchEvent::Changed(change)) => change.record.origin == local,
                    Some(WatchEvent::Lagged) => true,
                };
                // Coalesce what is already there into one round.
                for _ in 0..4096 {
                    match changes.next().now_or_never() {
                        Some(Some(WatchEvent::Changed(change))) => {
                            local_write |= change.record.origin == local;
                        }
                        Some(Some(WatchEvent::Lagged)) => local_write = true,
                        Some(None) | None => break,
                    }
                }
                if local_write {
                    push_round(&up, shared.settings.fanout, &mut rotation);
                }
            }
            _ = tick.tick() => {
                if round.as_ref().is_none_or(JoinHandle::is_finished) {
                    if let Some(peer) = up.choose(&mut rand::thread_rng()).cloned() {
                        let shared = shared.clone();
                        round = Some(tokio::spawn(async move {
                            shared.count(&peer, |c| &c.anti_entropy_rounds, 1);
                            match shared.pull_from(&peer).await {
                                Ok(()) => {
                                    shared.caught_up.store(true, Ordering::Relaxed);
                                    shared.succeeded(&peer, Exchange::AntiEntropy)
                                }
                                Err(e) => shared.failed(&peer, Exchange::AntiEntropy, &e),
                            }
                        }));
                    }
                }
            }
        }
        if *shutdown.borrow() {
            break;
        }
    }
    if let Some(round) = round {
        round.abort();
    }
    for (_, worker) in workers {
        worker.abort();
    }
}

/// Wakes the push workers of up to `fanout` up peers, taking them in turn.
fn push_round(up: &[Arc<PeerState>], fanout: usize, rotation: &mut usize) {
    if up.is_empty() || fanout == 0 {
        return;
    }
    if up.len() <= fanout {
        up.iter().for_each(|p| p.push.notify_one());
        return;
    }
    for i in 0..fanout {
        up[(*rotation + i) % up.len()].push.notify_one();
    }
    *rotation = (*rotation + fanout) % up.len();
}

/// Makes the workers follow `list`: a worker for every peer in it, none for the others.
fn follow_peers(
    shared: &Arc<Shared>,
    list: &[SyncPeer],
    workers: &mut HashMap<MachineId, JoinHandle<()>>,
    up: &mut Vec<Arc<PeerState>>,
) {
    let local = shared.store.local();
    let mut wanted: BTreeMap<&MachineId, SocketAddr> = BTreeMap::new();
    for p in list.iter().filter(|p| &p.id != local) {
        wanted.insert(&p.id, p.addr);
    }
    let mut states = lock(&shared.peers);
    workers.retain(|id, worker| {
        let keep = wanted.contains_key(id);
        if !keep {
            worker.abort();
            if let Some(state) = states.get(id) {
                state.up.store(false, Ordering::Relaxed);
                // It may come back with less than it had: ask it again then.
                state.set_position(None);
            }
        }
        keep
    });
    up.clear();
    for (id, addr) in wanted {
        let state = states
            .entry(id.clone())
            .or_insert_with(|| Arc::new(PeerState::new(id.clone(), addr)))
            .clone();
        let moved = {
            let mut at = lock(&state.addr);
            std::mem::replace(&mut *at, addr) != addr
        };
        if moved {
            state.set_position(None);
            if let Some(worker) = workers.remove(id) {
                worker.abort();
            }
        }
        state.up.store(true, Ordering::Relaxed);
        if !workers.contains_key(id) {
            let (shared, peer) = (shared.clone(), state.clone());
            workers.insert(id.clone(), tokio::spawn(push_worker(shared, peer)));
            // On first contact, the peer gets what it lacks of this Machine's records.
            state.push.notify_one();
        }
        up.push(state);
    }
}

/// How long a woken push worker lets a burst of writes settle before it reads its batch.
const PUSH_COALESCE: Duration = Duration::from_millis(2);

/// Pushes to one peer whenever woken, one request at a time; after a failure, tries again
/// after a backoff (from the anti-entropy interval up to 30 s) unless woken first.
async fn push_worker(shared: Arc<Shared>, peer: Arc<PeerState>) {
    const MAX_BACKOFF: Duration = Duration::from_secs(30);
    let mut backoff: Option<Duration> = None;
    loop {
        match backoff {
            None => peer.push.notified().await,
            Some(delay) => {
                tokio::select! {
                    _ = peer.push.notified() => {}
                    _ = tokio::time::sleep(delay) => {}
                }
            }
        }
        // A burst of writes settles into one batch.
        tokio::time::sleep(PUSH_COALESCE).await;
        match shared.push_to(&peer).await {
            Ok(()) => {
                shared.succeeded(&peer, Exchange::Push);
                backoff = None;
            }
            Err(e) => {
                shared.failed(&peer, Exchange::Push, &e);
                // Where the peer stands is learnt again (its digest) before the next push:
                // anti-entropy may carry the records meanwhile.
                peer.set_position(None);
                backoff = Some(match backoff {
                    None => shared.settings.anti_entropy_interval,
                    Some(d) => (d * 2).min(MAX_BACKOFF),
                });
            }
        }
    }
}

/// Runs a store call off the async workers.
async fn on_store<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, String> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(format!("this Machine's store: {e}")),
        Err(e) => Err(format!("a store call failed: {e}")),
    }
}

fn decode<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("the peer's {what} does not decode: {e}"))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn woken(peers: &[Arc<PeerState>]) -> Vec<usize> {
        (0..peers.len())
            .filter(|&i| peers[i].push.notified().now_or_never().is_some())
            .collect()
    }

    /// The daemon's own listener (`api::serve`, its body limits included) in front of the
    /// routes, as on the mesh.
    async fn served(store: Arc<Store>) -> (SocketAddr, watch::Sender<bool>) {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopping) = watch::channel(false);
        tokio::spawn(crate::api::serve(
            listener,
            super::super::routes(store),
            Duration::from_secs(15),
            16,
            stopping,
        ));
        (addr, stop)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_record_over_the_apis_body_limit_is_pushed_through_the_daemons_listener() {
        let receiver = Arc::new(Store::temporary(MachineId::generate()).unwrap());
        let (addr, stop_serving) = served(receiver.clone()).await;
        let sender = Arc::new(Store::temporary(MachineId::generate()).unwrap());
        // Over 2 MiB as a push body (base64), well under the routes' own 16 MiB.
        let key = ployz_store::Key::cluster("t", "large");
        let value: Vec<u8> = (0..1_700_000u32).map(|i| (i % 251) as u8).collect();
        sender.put(&key, value.clone()).unwrap();
        // Only pushes: anti-entropy would carry it in a pull answer, which no limit refuses.
        let settings = ReplicationSettings {
            anti_entropy_interval: Duration::from_secs(3600),
            ..ReplicationSettings::default()
        };
        let (stop, stopping) = watch::channel(false);
        let (_peers, peers_rx) = watch::channel(vec![SyncPeer {
            id: receiver.local().clone(),
            addr,
        }]);
        let replicator = Replicator::spawn(sender.clone(), peers_rx, settings, stopping);
        sender
            .put(&ployz_store::Key::cluster("t", "wake"), b"v".to_vec())
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while receiver.get(&key).unwrap().is_none() {
            assert!(
                std::time::Instant::now() < deadline,
                "the large record did not arrive: {:?}",
                replicator.peers()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(receiver.get(&key).unwrap().unwrap().value, value);
        stop.send(true).unwrap();
        stop_serving.send(true).unwrap();
    }

    #[test]
    fn pushes_go_to_fanout_peers_taken_in_turn() {
        let peers: Vec<Arc<PeerState>> = (0..5)
            .map(|i| {
                let addr = SocketAddr::from(([127, 0, 0, 1], 51000 + i));
                Arc::new(PeerState::new(MachineId::generate(), addr))
            })
            .collect();
        let mut rotation = 0;
        push_round(&peers, 2, &mut rotation);
        assert_eq!(woken(&peers), vec![0, 1]);
        push_round(&peers, 2, &mut rotation);
        assert_eq!(woken(&peers), vec![2, 3]);
        push_round(&peers, 2, &mut rotation);
        assert_eq!(woken(&peers), vec![0, 4]);
        push_round(&peers, 0, &mut rotation);
        assert_eq!(woken(&peers), Vec::<usize>::new());
        push_round(&peers[..2], 3, &mut rotation);
        assert_eq!(woken(&peers), vec![0, 1]);
    }
}
