//! Reconciliation of this Machine's plumbing: the WireGuard interface, its peers and routes, the
//! firewall chain, the Docker `ployz` network, the internal DNS listener and this Machine's own
//! record in the store. Each concern is observed as it really is, compared with what it should
//! be, and corrected when it drifted; every pass is recorded (`ployz machine status`), and
//! every correction logged and counted (`ployz_reconcile_corrections_total{concern}`).
//!
//! Passes run at start, on a declaration (a store change that concerns this Machine; for peers
//! and routes, the mesh's 1 s tick and each roster change), on the timer
//! (`reconcile.interval_secs`; the interface and the firewall also every
//! `mesh.reconcile_interval_ms`), and after a reconnect (Docker answering again, a peer observed
//! up again). The timer is what finds drift nothing announced.
//!
//! Nothing outside what the daemon made is touched: only its own interface, the routes it tags,
//! its firewall rules (`Firewall::rules`), the `ployz` network, its own DNS sockets and its own
//! Machine record.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse as _, Response};
use axum::routing::get;
use axum::{Json, Router};
use pingora::server::ShutdownWatch;
use ployz_core::api::{self, ConcernPass, ConcernStatus, ErrorCode, ReconcileStatus};
use ployz_mesh::firewall::Firewall;
use ployz_mesh::wireguard::{
    LinkObservation, MeshConfig, MeshInterface, ObservedPeer, PeerChanges, PeerConfig,
};

pub use ployz_core::api::ReconcileOutcome as Outcome;

use crate::config::{DaemonConfig, DnsListen};
use crate::local_machine::LocalMachine;

/// One part of this Machine's plumbing that is reconciled on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Concern {
    /// The WireGuard interface: it exists, is up and holds the Management Address.
    Interface,
    /// The WireGuard peers: one per member, with its allowed IPs.
    Peers,
    /// The routes to the peers' Machine Subnets and Management Addresses.
    Routes,
    /// The firewall chain, its rules and the jumps into it.
    Firewall,
    /// The Docker `ployz` network on the Machine Subnet.
    DockerNetwork,
    /// The internal DNS's sockets, answering on their address.
    DnsListener,
    /// This Machine's self-description in the store.
    MachineRecord,
}

impl Concern {
    /// Every concern, in the order a pass takes them.
    pub const ALL: [Concern; 7] = [
        Concern::Interface,
        Concern::Peers,
        Concern::Routes,
        Concern::Firewall,
        Concern::DockerNetwork,
        Concern::DnsListener,
        Concern::MachineRecord,
    ];

    /// The concern's name, as the metric's label and `machine status` show it.
    pub fn as_str(self) -> &'static str {
        match self {
            Concern::Interface => "interface",
            Concern::Peers => "peers",
            Concern::Routes => "routes",
            Concern::Firewall => "firewall",
            Concern::DockerNetwork => "docker_network",
            Concern::DnsListener => "dns_listener",
            Concern::MachineRecord => "machine_record",
        }
    }

    /// Whether the mesh carries it (it is reconciled only while the mesh runs).
    fn is_mesh(self) -> bool {
        matches!(
            self,
            Concern::Interface | Concern::Peers | Concern::Routes | Concern::Firewall
        )
    }
}

/// What started a pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// The daemon (or the mesh) started.
    Start,
    /// A store change that concerns this Machine; for peers and routes also the mesh's tick.
    Declaration,
    /// The timer.
    Timer,
    /// Something came back: Docker answering again, a peer observed up again.
    Reconnect(String),
}

impl std::fmt::Display for Trigger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Trigger::Start => f.write_str("start"),
            Trigger::Declaration => f.write_str("declaration"),
            Trigger::Timer => f.write_str("timer"),
            Trigger::Reconnect(what) => write!(f, "reconnect: {what}"),
        }
    }
}

/// One concern's record: its last pass and totals.
#[derive(Debug, Default)]
struct Record {
    last: Option<(SystemTime, String, Outcome)>,
    passes: u64,
    corrections: u64,
    failures: u64,
    /// Whether the last pass could not; a failing streak is logged once.
    failing: bool,
}

/// What the mesh hands over while it runs: the pieces it brought up, for the reconciler to
/// observe and correct.
pub struct MeshParts {
    pub interface: Arc<Mutex<MeshInterface>>,
    /// What the interface was made from, to make it again if it disappears.
    pub config: MeshConfig,
    pub firewall: Arc<Firewall>,
    /// Firewall rules put back, for `ployz_firewall_repairs_total`.
    pub firewall_repairs: Arc<AtomicU64>,
    /// Set when the interface was made again: the peers and routes it had went with it, and the
    /// mesh's ledger of what it applied starts over.
    pub interface_recreated: Arc<AtomicBool>,
}

/// The internal DNS listener as the DNS service reports it, and the reconciler's way of asking
/// it to bind again.
#[derive(Default)]
pub struct DnsListener {
    bound: Mutex<Option<SocketAddr>>,
    bind_error: Mutex<Option<String>>,
    rebind: tokio::sync::Notify,
    rebound: tokio::sync::Notify,
}

impl DnsListener {
    /// The DNS service bound its sockets on `addr` (`None`: it has none now).
    pub fn set_bound(&self, addr: Option<SocketAddr>) {
        *self.bound.lock().expect("dns listener poisoned") = addr;
        if addr.is_some() {
            *self.bind_error.lock().expect("dns listener poisoned") = None;
            self.rebound.notify_waiters();
        }
    }

    /// The DNS service could not bind: why.
    pub fn set_bind_error(&self, error: String) {
        *self.bind_error.lock().expect("dns listener poisoned") = Some(error);
    }

    /// Where its sockets are bound, if they are.
    pub fn bound(&self) -> Option<SocketAddr> {
        *self.bound.lock().expect("dns listener poisoned")
    }

    /// Resolves when the reconciler asks the DNS service to close its sockets and bind again.
    pub async fn rebind_requested(&self) {
        self.rebind.notified().await
    }
}

/// This Machine's reconciliation: what each concern's last pass found and did, the totals, and
/// the triggers. Shared by the reconcile service, the mesh (peers and routes), the DNS service,
/// the API and the metrics listener.
pub struct Reconciler {
    machine: Arc<LocalMachine>,
    interval: Duration,
    mesh_interval: Duration,
    /// The concerns this Machine reconciles (the mesh's and the DNS listener's only where they
    /// run).
    concerns: Vec<Concern>,
    records: Mutex<BTreeMap<Concern, Record>>,
    triggers: tokio::sync::mpsc::UnboundedSender<Trigger>,
    receiver: Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<Trigger>>>,
    mesh: Mutex<Option<Arc<MeshParts>>>,
    /// A pass of peers and routes the mesh is asked for, and why.
    mesh_pass: Mutex<Option<Trigger>>,
    mesh_wake: tokio::sync::Notify,
    dns: Option<Arc<DnsListener>>,
}

impl Reconciler {
    /// The reconciliation of `machine` as `config` says: its timer, and which concerns run.
    pub fn new(machine: Arc<LocalMachine>, config: &DaemonConfig) -> Arc<Reconciler> {
        let dns = config.dns.listen != DnsListen::Off;
        let concerns = Concern::ALL
            .into_iter()
            .filter(|c| !c.is_mesh() || config.mesh.enabled)
            .filter(|c| *c != Concern::DnsListener || dns)
            .collect();
        let (triggers, receiver) = tokio::sync::mpsc::unbounded_channel();
        Arc::new(Reconciler {
            machine,
            interval: config.reconcile.interval(),
            mesh_interval: Duration::from_millis(config.mesh.reconcile_interval_ms),
            concerns,
            records: Mutex::default(),
            triggers,
            receiver: Mutex::new(Some(receiver)),
            mesh: Mutex::default(),
            mesh_pass: Mutex::default(),
            mesh_wake: tokio::sync::Notify::new(),
            dns: dns.then(Arc::default),
        })
    }

    /// The DNS listener's shared state (`None` when `dns.listen = "off"`).
    pub fn dns_listener(&self) -> Option<Arc<DnsListener>> {
        self.dns.clone()
    }

    /// Asks for a pass over every concern.
    pub fn trigger(&self, trigger: Trigger) {
        let _ = self.triggers.send(trigger);
    }

    /// The mesh is up: its pieces are reconciled from now on.
    pub fn attach_mesh(&self, parts: MeshParts) {
        *self.mesh.lock().expect("reconciler poisoned") = Some(Arc::new(parts));
    }

    /// The mesh is going down (a reset, shutdown): its pieces are left alone from now on.
    pub fn detach_mesh(&self) {
        *self.mesh.lock().expect("reconciler poisoned") = None;
    }

    /// Whether `concern` has had a pass in this process.
    fn has_passed(&self, concern: Concern) -> bool {
        self.records
            .lock()
            .expect("reconciler poisoned")
            .get(&concern)
            .is_some_and(|r| r.passes > 0)
    }

    fn mesh_parts(&self) -> Option<Arc<MeshParts>> {
        self.mesh.lock().expect("reconciler poisoned").clone()
    }

    /// Asks the mesh for a pass of peers and routes now.
    fn request_mesh_pass(&self, trigger: Trigger) {
        *self.mesh_pass.lock().expect("reconciler poisoned") = Some(trigger);
        self.mesh_wake.notify_one();
    }

    /// Resolves when a pass of peers and routes is asked for, with its trigger.
    pub async fn mesh_pass_requested(&self) -> Trigger {
        loop {
            if let Some(t) = self.mesh_pass.lock().expect("reconciler poisoned").take() {
                return t;
            }
            self.mesh_wake.notified().await;
        }
    }

    /// Records one pass of `concern`: counts it, and logs a correction (one line) or the first
    /// failure of a streak.
    pub fn record(&self, concern: Concern, trigger: &Trigger, outcome: Outcome) {
        let mut records = self.records.lock().expect("reconciler poisoned");
        let record = records.entry(concern).or_default();
        record.passes += 1;
        let name = concern.as_str();
        let trigger = trigger.to_string();
        match &outcome {
            Outcome::InSync => {
                if record.failing {
                    tracing::info!(concern = name, %trigger, "reconciliation works again");
                }
                record.failing = false;
            }
            Outcome::Corrected { found, done } => {
                record.corrections += 1;
                record.failing = false;
                tracing::warn!(concern = name, %trigger, found = %found, done = %done, "drift corrected");
            }
            Outcome::CouldNot { error } => {
                record.failures += 1;
                if !record.failing {
                    tracing::warn!(concern = name, %trigger, error = %error, "reconciliation could not; trying again at the next pass (logged once until it works)");
                }
                record.failing = true;
            }
        }
        record.last = Some((SystemTime::now(), trigger, outcome));
    }

    /// What `machine status` shows: per concern this Machine reconciles, its last pass and
    /// totals; `None` before this Machine is initialised.
    pub fn status(&self) -> Option<ReconcileStatus> {
        let info = self.machine.info()?;
        let now = SystemTime::now();
        let records = self.records.lock().expect("reconciler poisoned");
        let concerns = self
            .concerns
            .iter()
            .map(|c| {
                let r = records.get(c);
                ConcernStatus {
                    concern: c.as_str().to_owned(),
                    last: r
                        .and_then(|r| r.last.as_ref())
                        .map(|(at, trigger, outcome)| ConcernPass {
                            secs_ago: now.duration_since(*at).map_or(0, |d| d.as_secs()),
                            trigger: trigger.clone(),
                            outcome: outcome.clone(),
                        }),
                    passes: r.map_or(0, |r| r.passes),
                    corrections: r.map_or(0, |r| r.corrections),
                    failures: r.map_or(0, |r| r.failures),
                }
            })
            .collect();
        Some(ReconcileStatus {
            machine: info.id,
            machine_name: info.name,
            interval_secs: self.interval.as_secs(),
            observed_at: now
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            concerns,
        })
    }

    /// Appends `ployz_reconcile_passes_total`, `ployz_reconcile_corrections_total` and
    /// `ployz_reconcile_failures_total`, per concern, in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        use prometheus_client::metrics::counter::Counter;
        use prometheus_client::metrics::family::Family;
        type ByConcern = Family<[(&'static str, &'static str); 1], Counter>;
        let (passes, corrections, failures) = (
            ByConcern::default(),
            ByConcern::default(),
            ByConcern::default(),
        );
        let records = self.records.lock().expect("reconciler poisoned");
        for c in &self.concerns {
            let label = [("concern", c.as_str())];
            let r = records.get(c);
            passes
                .get_or_create(&label)
                .inc_by(r.map_or(0, |r| r.passes));
            corrections
                .get_or_create(&label)
                .inc_by(r.map_or(0, |r| r.corrections));
            failures
                .get_or_create(&label)
                .inc_by(r.map_or(0, |r| r.failures));
        }
        drop(records);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register(
            "ployz_reconcile_passes",
            "Reconciliation passes over this Machine's plumbing, per concern",
            passes,
        );
        registry.register(
            "ployz_reconcile_corrections",
            "Drift found in this Machine's plumbing and corrected, per concern",
            corrections,
        );
        registry.register(
            "ployz_reconcile_failures",
            "Reconciliation passes that could not observe or correct, per concern",
            failures,
        );
        // Writing to a String cannot fail, and nothing registered here fails to encode.
        let _ = prometheus_client::encoding::prometheus_text::encode(out, &registry);
    }
}

// === The pure comparisons ===

/// What a pass of peers compares: per public key, the allowed IPs.
pub type PeerSet = BTreeMap<String, BTreeSet<String>>;
/// What a pass of routes compares: destination -> preferred source.
pub type RouteSet = BTreeMap<String, Option<IpAddr>>;

/// The peers wanted for `peers`, as WireGuard would hold them.
pub fn wanted_peers(peers: &[PeerConfig]) -> PeerSet {
    peers
        .iter()
        .map(|p| {
            (
                p.public_key.clone(),
                ployz_mesh::wireguard::wanted_allowed_ips(p),
            )
        })
        .collect()
}

fn short_key(key: &str) -> &str {
    key.get(..8).unwrap_or(key)
}

/// The drift of the peers WireGuard holds: against `applied` (what the last pass left), the
/// peers that went missing, whose allowed IPs or keepalive changed, or that appeared from
/// outside. A difference the declaration explains (a member added or removed since `applied`)
/// is not drift. With nothing applied yet (`None`) there is no drift to speak of.
pub fn peer_drift(
    applied: Option<&PeerSet>,
    wanted: &PeerSet,
    observed: &[ObservedPeer],
) -> Vec<String> {
    let Some(applied) = applied else {
        return Vec::new();
    };
    let observed: BTreeMap<&str, &ObservedPeer> = observed
        .iter()
        .map(|p| (p.public_key.as_str(), p))
        .collect();
    let mut drift = Vec::new();
    for (key, ips) in wanted {
        if applied.get(key) != Some(ips) {
            continue;
        }
        match observed.get(key.as_str()) {
            None => drift.push(format!("peer {} missing", short_key(key))),
            Some(p) if &p.allowed_ips != ips => drift.push(format!(
                "peer {} allows {} instead of {}",
                short_key(key),
                p.allowed_ips.iter().cloned().collect::<Vec<_>>().join(","),
                ips.iter().cloned().collect::<Vec<_>>().join(",")
            )),
            Some(p)
                if p.persistent_keepalive
                    != Some(ployz_mesh::wireguard::PERSISTENT_KEEPALIVE_SECONDS) =>
            {
                drift.push(format!("peer {} keepalive changed", short_key(key)))
            }
            Some(_) => {}
        }
    }
    for key in observed.keys() {
        if !wanted.contains_key(*key) && !applied.contains_key(*key) {
            drift.push(format!("unexpected peer {}", short_key(key)));
        }
    }
    drift
}

/// The drift of the routes through the interface, as [`peer_drift`] for peers: against
/// `applied`, routes missing or with another source, and routes of ours that appeared from
/// outside.
pub fn route_drift(
    applied: Option<&RouteSet>,
    wanted: &RouteSet,
    observed: &RouteSet,
) -> Vec<String> {
    let Some(applied) = applied else {
        return Vec::new();
    };
    let mut drift = Vec::new();
    for (dst, src) in wanted {
        if applied.get(dst) != Some(src) {
            continue;
        }
        match observed.get(dst) {
            None => drift.push(format!("route {dst} missing")),
            Some(found) if found != src => drift.push(format!(
                "route {dst} from {} instead of {}",
                found.map_or("no source".to_owned(), |s| s.to_string()),
                src.map_or("no source".to_owned(), |s| s.to_string())
            )),
            Some(_) => {}
        }
    }
    for dst in observed.keys() {
        if !wanted.contains_key(dst) && !applied.contains_key(dst) {
            drift.push(format!("unexpected route {dst}"));
        }
    }
    drift
}

/// What is wrong with the interface, from what `ip` shows of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InterfaceDrift {
    /// There is no such link.
    Missing,
    /// It is down.
    Down,
    /// It lacks the Management Address.
    AddressMissing,
}

/// Compares the interface as observed with what it should be: existing, up, holding
/// `management_address`.
pub fn interface_drift(
    observed: &LinkObservation,
    management_address: Ipv6Addr,
) -> Vec<InterfaceDrift> {
    if !observed.exists {
        return vec![InterfaceDrift::Missing];
    }
    let mut drift = Vec::new();
    if !observed.up {
        drift.push(InterfaceDrift::Down);
    }
    if !observed.addresses.contains(&IpAddr::V6(management_address)) {
        drift.push(InterfaceDrift::AddressMissing);
    }
    drift
}

/// What is wrong with the Docker `ployz` network.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetworkDrift {
    /// There is none.
    Missing,
    /// There is one, on another subnet: not this daemon's to replace.
    Conflict(String),
}

/// Compares the `ployz` network as observed with one on `subnet`.
pub fn network_drift(
    observed: Option<&ployz_orchestrator::docker::NetworkObservation>,
    subnet: &str,
) -> Option<NetworkDrift> {
    match observed {
        None => Some(NetworkDrift::Missing),
        Some(n) if n.subnets.iter().any(|s| s == subnet) => None,
        Some(n) => Some(NetworkDrift::Conflict(n.subnets.join(","))),
    }
}

/// Compares this Machine's record in the store with its self-description: `None` in sync, or
/// what was found.
pub fn machine_record_drift(
    wanted: &api::MachineInfo,
    stored: Option<Result<api::MachineInfo, String>>,
) -> Option<String> {
    match stored {
        None => Some("no record of this Machine in the store".to_owned()),
        Some(Err(e)) => Some(format!("the record does not decode: {e}")),
        Some(Ok(found)) if &found == wanted => None,
        Some(Ok(found)) => {
            let mut fields = Vec::new();
            if found.name != wanted.name {
                fields.push("name");
            }
            if found.phase != wanted.phase {
                fields.push("phase");
            }
            if found.subnet != wanted.subnet {
                fields.push("subnet");
            }
            if found.public_key != wanted.public_key {
                fields.push("public key");
            }
            if found.management_address != wanted.management_address {
                fields.push("management address");
            }
            if found.endpoints != wanted.endpoints {
                fields.push("endpoints");
            }
            if found.version != wanted.version {
                fields.push("version");
            }
            if found.wireguard_backend != wanted.wireguard_backend {
                fields.push("wireguard backend");
            }
            if found.edge_features != wanted.edge_features {
                fields.push("edge features");
            }
            Some(format!("the record differs in {}", fields.join(", ")))
        }
    }
}

/// A list of findings in one line: the first three, then how many more.
fn summary(items: &[String]) -> String {
    let mut text = items.iter().take(3).cloned().collect::<Vec<_>>().join("; ");
    if items.len() > 3 {
        text.push_str(&format!("; and {} more", items.len() - 3));
    }
    text
}

// === Peers and routes (the mesh's tick) ===

/// What the mesh last applied to its interface: the base against which drift is judged.
#[derive(Debug, Default)]
pub struct PeerLedger {
    peers: Option<PeerSet>,
    routes: Option<RouteSet>,
}

/// One pass of peers and routes: observes what WireGuard and the routing table hold, compares
/// with what was applied and what is wanted, applies `wanted` (the declaration: the member
/// roster with the Selected Endpoints), and returns each concern's outcome. Blocking (`ip`,
/// WireGuard's API): run it off the runtime.
pub fn peers_and_routes(
    interface: &mut MeshInterface,
    wanted: &[PeerConfig],
    ledger: &mut PeerLedger,
) -> Result<(Outcome, Outcome, PeerChanges), String> {
    let observed_peers = interface.observe_peers().map_err(|e| e.to_string())?;
    let observed_routes = interface.routes().map_err(|e| e.to_string())?;
    let wanted_peer_set = wanted_peers(wanted);
    let wanted_route_set = ployz_mesh::wireguard::wanted_routes(wanted, interface.route_source());
    let peers = peer_drift(ledger.peers.as_ref(), &wanted_peer_set, &observed_peers);
    let routes = route_drift(ledger.routes.as_ref(), &wanted_route_set, &observed_routes);
    let changes = interface.set_peers(wanted).map_err(|e| e.to_string())?;
    ledger.peers = Some(wanted_peer_set);
    ledger.routes = Some(wanted_route_set);
    let peers = if peers.is_empty() {
        Outcome::InSync
    } else {
        Outcome::Corrected {
            found: summary(&peers),
            done: format!(
                "peers set again ({} added, {} updated, {} removed)",
                changes.added, changes.updated, changes.removed
            ),
        }
    };
    let routes = if routes.is_empty() {
        Outcome::InSync
    } else {
        Outcome::Corrected {
            found: summary(&routes),
            done: format!(
                "routes set again ({} set, {} removed)",
                changes.routes_set, changes.routes_removed
            ),
        }
    };
    Ok((peers, routes, changes))
}

impl PeerLedger {
    /// Forgets what was applied (the interface was made again: its peers went with it, and
    /// that is the interface's drift, already counted).
    pub fn forget(&mut self) {
        *self = PeerLedger::default();
    }
}

// === The other concerns ===

/// The name a DNS probe asks for: in the `.internal` zone (answered by the server itself,
/// never forwarded) and never a Service's (a label starting with `_`).
const PROBE_NAME: &str = "_ployz-probe.internal";
/// How long one probe waits for the answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// Probes before the listener is judged not answering.
const PROBE_TRIES: usize = 2;
/// How long a rebind may take before the pass gives up (and the next one tries again).
const REBIND_TIMEOUT: Duration = Duration::from_secs(5);

/// A DNS query for `name`, type A, with `id`.
pub fn probe_query(id: u16, name: &str) -> Vec<u8> {
    let mut q = Vec::with_capacity(12 + name.len() + 6);
    q.extend_from_slice(&id.to_be_bytes());
    q.extend_from_slice(&[0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0]);
    for label in name.trim_end_matches('.').split('.') {
        q.push(label.len() as u8);
        q.extend_from_slice(label.as_bytes());
    }
    q.extend_from_slice(&[0, 0, 1, 0, 1]);
    q
}

/// Checks `answer` answers `query`: same ID, a response, the question echoed. `Err` says what
/// is wrong.
pub fn check_probe_answer(query: &[u8], answer: &[u8]) -> Result<(), String> {
    if answer.len() < 12 {
        return Err(format!("an answer of {} bytes", answer.len()));
    }
    if answer[..2] != query[..2] {
        return Err("an answer to another query".to_owned());
    }
    if answer[2] & 0x80 == 0 {
        return Err("a query, not an answer".to_owned());
    }
    let question = &query[12..];
    if answer.get(12..12 + question.len()) != Some(question) {
        return Err("an answer to another question".to_owned());
    }
    Ok(())
}

/// Sends a real DNS query to `addr` and checks the answer; `Err` says what was met.
async fn probe_dns(addr: SocketAddr) -> Result<(), String> {
    let local: SocketAddr = match addr {
        SocketAddr::V4(_) => (std::net::Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let socket = tokio::net::UdpSocket::bind(local)
        .await
        .map_err(|e| format!("cannot open a socket to query {addr}: {e}"))?;
    let mut last = String::new();
    for _ in 0..PROBE_TRIES {
        let id: u16 = rand::random();
        let query = probe_query(id, PROBE_NAME);
        if let Err(e) = socket.send_to(&query, addr).await {
            last = format!("a query to {addr} could not be sent: {e}");
            continue;
        }
        let mut buf = [0u8; 1500];
        match tokio::time::timeout(PROBE_TIMEOUT, socket.recv_from(&mut buf)).await {
            Ok(Ok((n, from))) if from == addr => match check_probe_answer(&query, &buf[..n]) {
                Ok(()) => return Ok(()),
                Err(e) => last = format!("{addr} answered a query for {PROBE_NAME} with {e}"),
            },
            Ok(Ok((_, from))) => last = format!("an answer from {from}, not {addr}"),
            Ok(Err(e)) => last = format!("no answer from {addr}: {e}"),
            Err(_) => {
                last = format!(
                    "no answer from {addr} to a query for {PROBE_NAME} within {} s",
                    PROBE_TIMEOUT.as_secs()
                )
            }
        }
    }
    Err(last)
}

/// Runs the passes of every concern but peers and routes (which the mesh runs, asked here):
/// at start, on the timers, on store changes of this Machine's record, on triggers, and when
/// Docker answers again after it did not.
pub struct ReconcileService {
    pub reconciler: Arc<Reconciler>,
}

/// How often Docker is asked whether it answers again, while it does not.
const DOCKER_RETRY: Duration = Duration::from_secs(1);

#[async_trait]
impl pingora::services::background::BackgroundService for ReconcileService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let r = &self.reconciler;
        let Some(initialised) = r.machine.initialised(&mut shutdown).await else {
            return;
        };
        let Some(mut triggers) = r.receiver.lock().expect("reconciler poisoned").take() else {
            return;
        };
        let own_key = ployz_store::machines::machine_key(&initialised.info.id);
        let mut changes =
            initialised
                .store
                .watch_any(vec![ployz_store::KeyPrefix::machine_namespace(
                    ployz_store::machines::MACHINES_NAMESPACE,
                )]);
        let mut timer = tokio::time::interval(r.interval);
        timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        timer.tick().await;
        let mut mesh_timer = tokio::time::interval(r.mesh_interval);
        mesh_timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        mesh_timer.tick().await;
        let mut docker_retry = tokio::time::interval(DOCKER_RETRY);
        docker_retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut pass = Pass {
            r: r.clone(),
            initialised,
            docker_lost: false,
        };
        pass.run(&Trigger::Start, &Concern::ALL).await;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = timer.tick() => pass.run(&Trigger::Timer, &Concern::ALL).await,
                _ = mesh_timer.tick() => {
                    pass.run(&Trigger::Timer, &[Concern::Interface, Concern::Firewall]).await
                }
                Some(trigger) = triggers.recv() => {
                    // Triggers that came meanwhile are answered by this one pass.
                    while triggers.try_recv().is_ok() {}
                    pass.run(&trigger, &Concern::ALL).await;
                }
                event = changes.next() => match event {
                    None => return,
                    Some(ployz_store::WatchEvent::Changed(c)) if c.record.key != own_key => {}
                    Some(_) => pass.run(&Trigger::Declaration, &[Concern::MachineRecord]).await,
                },
                _ = docker_retry.tick(), if pass.docker_lost => {
                    if pass.initialised.docker.ping().await.is_ok() {
                        pass.docker_lost = false;
                        tracing::info!("Docker answers again: a pass over every concern");
                        pass.run(&Trigger::Reconnect("docker".into()), &Concern::ALL).await;
                    }
                }
            }
        }
    }
}

/// One pass's context.
struct Pass {
    r: Arc<Reconciler>,
    initialised: crate::local_machine::Initialised,
    /// Whether Docker did not answer at the last pass (it is then asked every second).
    docker_lost: bool,
}

impl Pass {
    /// Runs `concerns` (those this Machine reconciles, and the mesh's only while it runs) and
    /// records each.
    async fn run(&mut self, trigger: &Trigger, concerns: &[Concern]) {
        let mesh = self.r.mesh_parts();
        for &concern in concerns {
            if !self.r.concerns.contains(&concern) {
                continue;
            }
            let outcome = match (concern, &mesh) {
                (c, None) if c.is_mesh() => continue,
                (Concern::Peers, _) => {
                    self.r.request_mesh_pass(trigger.clone());
                    continue;
                }
                (Concern::Routes, _) => continue,
                (Concern::Interface, Some(parts)) => interface(parts.clone()).await,
                (Concern::Firewall, Some(parts)) => firewall(parts.clone()).await,
                (Concern::DockerNetwork, _) => self.docker_network().await,
                (Concern::DnsListener, _) => match self.r.dns.clone() {
                    Some(dns) => match dns_listener(&dns, trigger).await {
                        Some(outcome) => outcome,
                        // The DNS service is still binding at start: no pass yet.
                        None => continue,
                    },
                    None => continue,
                },
                (Concern::MachineRecord, _) => self.machine_record().await,
                _ => continue,
            };
            if matches!(outcome, Outcome::Corrected { .. })
                && matches!(concern, Concern::Interface | Concern::DockerNetwork)
            {
                // Routes to peers hang on both (their source is the Machine Gateway).
                self.r.request_mesh_pass(trigger.clone());
            }
            self.r.record(concern, trigger, outcome);
        }
    }

    async fn docker_network(&mut self) -> Outcome {
        let docker = &self.initialised.docker;
        let subnet = self.initialised.info.subnet;
        let observed = match docker.observe_network().await {
            Ok(o) => o,
            Err(e) => {
                if e.is_unreachable() {
                    self.docker_lost = true;
                }
                return Outcome::CouldNot {
                    error: format!("cannot inspect the Docker network: {e}"),
                };
            }
        };
        match network_drift(observed.as_ref(), &subnet.to_string()) {
            None => Outcome::InSync,
            Some(NetworkDrift::Conflict(found)) => Outcome::CouldNot {
                error: format!(
                    "the Docker network '{}' is on {found}, not this Machine's subnet {subnet}; it is left alone: remove it (`docker network rm {}`) and the next pass makes it",
                    ployz_orchestrator::docker::NETWORK,
                    ployz_orchestrator::docker::NETWORK
                ),
            },
            // A Machine's first pass makes the network it never had (a new Machine): that is
            // the declaration applied, not drift.
            Some(NetworkDrift::Missing) if !self.r.has_passed(Concern::DockerNetwork) => {
                match docker.ensure_network().await {
                    Ok(()) => Outcome::InSync,
                    Err(e) => Outcome::CouldNot {
                        error: format!("cannot create the Docker network: {e}"),
                    },
                }
            }
            Some(NetworkDrift::Missing) => match docker.ensure_network().await {
                Ok(()) => Outcome::Corrected {
                    found: format!(
                        "the Docker network '{}' is missing",
                        ployz_orchestrator::docker::NETWORK
                    ),
                    done: format!(
                        "created it on {subnet} with gateway {}",
                        subnet.gateway()
                    ),
                },
                Err(e) => Outcome::CouldNot {
                    error: format!("cannot create the Docker network: {e}"),
                },
            },
        }
    }

    async fn machine_record(&self) -> Outcome {
        let machine = self.r.machine.clone();
        let store = self.initialised.store.clone();
        let done = tokio::task::spawn_blocking(move || {
            use ployz_core::LocalMachinePhase as Phase;
            let Some(wanted) = machine.info() else {
                return Ok(None);
            };
            if matches!(wanted.phase, Phase::Resetting | Phase::Uninitialized) {
                return Ok(None);
            }
            let key = ployz_store::machines::machine_key(&wanted.id);
            let stored = store
                .get(&key)
                .map_err(|e| format!("cannot read this Machine's record: {e}"))?
                .and_then(|r| {
                    r.live_value()
                        .map(|v| serde_json::from_slice(v).map_err(|e| e.to_string()))
                });
            let Some(found) = machine_record_drift(&wanted, stored) else {
                return Ok(None);
            };
            let value = serde_json::to_vec(&wanted).expect("machine info serialises");
            store
                .put(&key, value)
                .map_err(|e| format!("{found}; writing it again failed: {e}"))?;
            Ok(Some(found))
        })
        .await;
        match done {
            Ok(Ok(None)) => Outcome::InSync,
            Ok(Ok(Some(found))) => Outcome::Corrected {
                found,
                done: "wrote this Machine's record again".to_owned(),
            },
            Ok(Err(error)) => Outcome::CouldNot { error },
            Err(e) => Outcome::CouldNot {
                error: e.to_string(),
            },
        }
    }
}

async fn interface(parts: Arc<MeshParts>) -> Outcome {
    let done = tokio::task::spawn_blocking(move || {
        let name = parts.config.interface.clone();
        let address = parts.config.management_address.addr();
        let observed = ployz_mesh::wireguard::observe_link(&name).map_err(|e| e.to_string())?;
        let drift = interface_drift(&observed, address);
        if drift.is_empty() {
            return Ok(None);
        }
        let mut interface = parts
            .interface
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut found = Vec::new();
        let mut done = Vec::new();
        for d in drift {
            match d {
                InterfaceDrift::Missing => {
                    found.push(format!("the WireGuard interface {name} is missing"));
                    interface.recreate(parts.config.clone()).map_err(|e| {
                        format!("the interface {name} is missing and cannot be made again: {e}")
                    })?;
                    parts.interface_recreated.store(true, Ordering::Relaxed);
                    done.push("made it again (its peers and routes follow)".to_owned());
                }
                InterfaceDrift::Down => {
                    found.push(format!("{name} is down"));
                    interface.set_link_up().map_err(|e| e.to_string())?;
                    done.push("set it up".to_owned());
                }
                InterfaceDrift::AddressMissing => {
                    found.push(format!("{name} lacks the Management Address {address}"));
                    interface
                        .restore_address(address)
                        .map_err(|e| e.to_string())?;
                    done.push("put the address back".to_owned());
                }
            }
        }
        Ok(Some((found.join("; "), done.join("; "))))
    })
    .await;
    match done {
        Ok(Ok(None)) => Outcome::InSync,
        Ok(Ok(Some((found, done)))) => Outcome::Corrected { found, done },
        Ok(Err(error)) => Outcome::CouldNot { error },
        Err(e) => Outcome::CouldNot {
            error: e.to_string(),
        },
    }
}

async fn firewall(parts: Arc<MeshParts>) -> Outcome {
    let done = tokio::task::spawn_blocking(move || {
        let missing = parts.firewall.missing().map_err(|e| e.to_string())?;
        if missing.is_empty() {
            return Ok(None);
        }
        let restored = parts.firewall.reconcile().map_err(|e| e.to_string())?;
        parts
            .firewall_repairs
            .fetch_add(restored as u64, Ordering::Relaxed);
        Ok(Some((summary(&missing), restored)))
    })
    .await;
    match done {
        Ok(Ok(None)) => Outcome::InSync,
        Ok(Ok(Some((found, restored)))) => Outcome::Corrected {
            found: format!("missing: {found}"),
            done: format!("firewall rules put back or deleted: {restored}"),
        },
        Ok(Err(error)) => Outcome::CouldNot { error },
        Err(e) => Outcome::CouldNot {
            error: e.to_string(),
        },
    }
}

/// One pass of the DNS listener; `None` while the DNS service has not finished its first bind,
/// or at start while it is still binding (the Machine Gateway appears with the network).
async fn dns_listener(dns: &DnsListener, trigger: &Trigger) -> Option<Outcome> {
    let Some(addr) = dns.bound() else {
        if *trigger == Trigger::Start {
            return None;
        }
        let why = dns
            .bind_error
            .lock()
            .expect("dns listener poisoned")
            .clone()?;
        return Some(Outcome::CouldNot {
            error: format!("the internal DNS does not listen: {why}"),
        });
    };
    let found = match probe_dns(addr).await {
        Ok(()) => return Some(Outcome::InSync),
        Err(found) => found,
    };
    Some(rebind(dns, found).await)
}

/// Asks the DNS service to bind again, waits for it, and checks it answers.
async fn rebind(dns: &DnsListener, found: String) -> Outcome {
    let rebound = dns.rebound.notified();
    tokio::pin!(rebound);
    rebound.as_mut().enable();
    dns.rebind.notify_one();
    if tokio::time::timeout(REBIND_TIMEOUT, rebound).await.is_err() {
        return Outcome::CouldNot {
            error: format!(
                "{found}; asked to bind again, it did not within {} s",
                REBIND_TIMEOUT.as_secs()
            ),
        };
    }
    let Some(addr) = dns.bound() else {
        return Outcome::CouldNot {
            error: format!("{found}; bound again, it lost its sockets at once"),
        };
    };
    match probe_dns(addr).await {
        Ok(()) => Outcome::Corrected {
            found,
            done: format!("bound {addr} again; it answers"),
        },
        Err(e) => Outcome::CouldNot {
            error: format!("{found}; bound again, {e}"),
        },
    }
}

// === The API ===

/// `GET /v1/reconcile`: [`ReconcileStatus`].
pub fn router(reconciler: Arc<Reconciler>) -> Router {
    Router::new()
        .route(api::paths::RECONCILE, get(status))
        .with_state(reconciler)
}

async fn status(State(r): State<Arc<Reconciler>>) -> Response {
    match r.status() {
        Some(s) => Json(s).into_response(),
        None => crate::api::failure(
            StatusCode::CONFLICT,
            ErrorCode::FailedPrecondition,
            "this Machine is not initialised: nothing of its plumbing is reconciled yet".to_owned(),
            Some("run `ployz machine init` or join it to a Cluster"),
        )
        .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(key: &str, ips: &[&str]) -> ObservedPeer {
        ObservedPeer {
            public_key: key.to_owned(),
            allowed_ips: ips.iter().map(|s| (*s).to_owned()).collect(),
            persistent_keepalive: Some(ployz_mesh::wireguard::PERSISTENT_KEEPALIVE_SECONDS),
            endpoint: None,
        }
    }

    fn set(entries: &[(&str, &[&str])]) -> PeerSet {
        entries
            .iter()
            .map(|(k, ips)| {
                (
                    (*k).to_owned(),
                    ips.iter().map(|s| (*s).to_owned()).collect(),
                )
            })
            .collect()
    }

    const A: &str = "AAAAAAAAkeyA";
    const B: &str = "BBBBBBBBkeyB";
    const C: &str = "CCCCCCCCkeyC";

    #[test]
    fn a_peer_gone_from_the_interface_is_drift_but_a_new_member_is_not() {
        let applied = set(&[(A, &["10.210.1.0/24"])]);
        let wanted = set(&[(A, &["10.210.1.0/24"]), (B, &["10.210.2.0/24"])]);
        // B is new in the declaration; A went missing from the interface.
        assert_eq!(
            peer_drift(Some(&applied), &wanted, &[]),
            ["peer AAAAAAAA missing"]
        );
        // Everything in place: no drift.
        let observed = [peer(A, &["10.210.1.0/24"])];
        assert!(peer_drift(Some(&applied), &wanted, &observed).is_empty());
        // Before anything was applied there is nothing to have drifted from.
        assert!(peer_drift(None, &wanted, &[]).is_empty());
    }

    #[test]
    fn a_peer_changed_or_added_from_outside_is_drift_and_a_removed_member_is_not() {
        let applied = set(&[(A, &["10.210.1.0/24"]), (B, &["10.210.2.0/24"])]);
        let wanted = set(&[(A, &["10.210.1.0/24"])]);
        let observed = [
            peer(A, &["10.210.9.0/24"]),
            peer(B, &["10.210.2.0/24"]),
            peer(C, &["10.210.3.0/24"]),
        ];
        assert_eq!(
            peer_drift(Some(&applied), &wanted, &observed),
            [
                "peer AAAAAAAA allows 10.210.9.0/24 instead of 10.210.1.0/24",
                "unexpected peer CCCCCCCC",
            ]
        );
        let mut no_keepalive = peer(A, &["10.210.1.0/24"]);
        no_keepalive.persistent_keepalive = None;
        assert_eq!(
            peer_drift(Some(&applied), &wanted, &[no_keepalive]),
            ["peer AAAAAAAA keepalive changed"]
        );
    }

    #[test]
    fn routes_drift_against_what_was_applied() {
        let gw: IpAddr = "10.210.0.1".parse().unwrap();
        let applied: RouteSet = [
            ("10.210.1.0/24".to_owned(), Some(gw)),
            ("fdcc::1/128".to_owned(), None),
        ]
        .into();
        let observed: RouteSet = [
            ("10.210.1.0/24".to_owned(), None),
            ("10.210.7.0/24".to_owned(), None),
        ]
        .into();
        assert_eq!(
            route_drift(Some(&applied), &applied, &observed),
            [
                "route 10.210.1.0/24 from no source instead of 10.210.0.1",
                "route fdcc::1/128 missing",
                "unexpected route 10.210.7.0/24",
            ]
        );
        // The source changed in the declaration (the Machine Gateway went): not drift.
        let wanted: RouteSet = [
            ("10.210.1.0/24".to_owned(), None),
            ("fdcc::1/128".to_owned(), None),
        ]
        .into();
        let observed: RouteSet = [("fdcc::1/128".to_owned(), None)].into();
        assert!(route_drift(Some(&applied), &wanted, &observed).is_empty());
    }

    #[test]
    fn the_interface_is_compared_for_presence_state_and_address() {
        let address: Ipv6Addr = "fdcc::1".parse().unwrap();
        assert_eq!(
            interface_drift(&LinkObservation::default(), address),
            [InterfaceDrift::Missing]
        );
        let down = LinkObservation {
            exists: true,
            up: false,
            addresses: BTreeSet::new(),
        };
        assert_eq!(
            interface_drift(&down, address),
            [InterfaceDrift::Down, InterfaceDrift::AddressMissing]
        );
        let fine = LinkObservation {
            exists: true,
            up: true,
            addresses: [IpAddr::V6(address)].into(),
        };
        assert!(interface_drift(&fine, address).is_empty());
    }

    #[test]
    fn the_network_is_compared_by_subnet() {
        use ployz_orchestrator::docker::NetworkObservation;
        let ours = NetworkObservation {
            subnets: vec!["10.210.3.0/24".into()],
            bridge: Some("ployz".into()),
            containers: 0,
        };
        assert_eq!(
            network_drift(None, "10.210.3.0/24"),
            Some(NetworkDrift::Missing)
        );
        assert_eq!(network_drift(Some(&ours), "10.210.3.0/24"), None);
        assert_eq!(
            network_drift(Some(&ours), "10.210.4.0/24"),
            Some(NetworkDrift::Conflict("10.210.3.0/24".into()))
        );
    }

    #[test]
    fn the_machine_record_is_compared_field_by_field() {
        let key = ployz_mesh::wireguard::PrivateKey::generate();
        let wanted = api::MachineInfo {
            id: ployz_core::MachineId::generate(),
            name: "m0".parse().unwrap(),
            phase: ployz_core::LocalMachinePhase::Participating,
            subnet: "10.210.3.0/24".to_owned().try_into().unwrap(),
            public_key: key.public_key_base64(),
            management_address: key.management_address(),
            endpoints: vec![],
            version: "1".into(),
            wireguard_backend: None,
            edge_features: Vec::new(),
        };
        assert_eq!(
            machine_record_drift(&wanted, Some(Ok(wanted.clone()))),
            None
        );
        assert_eq!(
            machine_record_drift(&wanted, None).as_deref(),
            Some("no record of this Machine in the store")
        );
        let mut renamed = wanted.clone();
        renamed.name = "old".parse().unwrap();
        renamed.endpoints = vec!["198.18.0.10:51820".parse().unwrap()];
        assert_eq!(
            machine_record_drift(&wanted, Some(Ok(renamed))).as_deref(),
            Some("the record differs in name, endpoints")
        );
        // A record written by the release before: the upgraded daemon publishes its edge's
        // features again.
        let upgraded = api::MachineInfo {
            edge_features: ployz_core::EdgeFeature::published(),
            ..wanted.clone()
        };
        assert_eq!(
            machine_record_drift(&upgraded, Some(Ok(wanted))).as_deref(),
            Some("the record differs in edge features")
        );
    }

    #[test]
    fn a_probe_answer_must_answer_the_probe() {
        let query = probe_query(0x1234, PROBE_NAME);
        assert_eq!(&query[..2], &[0x12, 0x34]);
        assert_eq!(query[12], 12, "the first label, _ployz-probe");
        let mut answer = query.clone();
        answer[2] |= 0x84;
        answer[3] = 0x03;
        assert_eq!(check_probe_answer(&query, &answer), Ok(()));
        let mut other = answer.clone();
        other[1] = 0x35;
        assert!(check_probe_answer(&query, &other).is_err());
        assert!(
            check_probe_answer(&query, &query).is_err(),
            "not a response"
        );
        assert!(check_probe_answer(&query, &answer[..10]).is_err());
        let other_question = {
            let mut q = probe_query(0x1234, "other.internal");
            q[2] |= 0x80;
            q
        };
        assert!(check_probe_answer(&query, &other_question).is_err());
    }

    #[test]
    fn counts_are_rendered_per_concern() {
        let mut text = String::new();
        let (_dir, r) = test_reconciler();
        r.record(Concern::Firewall, &Trigger::Timer, Outcome::InSync);
        r.record(
            Concern::Firewall,
            &Trigger::Timer,
            Outcome::Corrected {
                found: "missing: chain PLOYZ-INPUT (iptables)".into(),
                done: "firewall rules put back: 2".into(),
            },
        );
        r.record(
            Concern::DockerNetwork,
            &Trigger::Start,
            Outcome::CouldNot {
                error: "Docker does not answer".into(),
            },
        );
        r.render(&mut text);
        for line in [
            "ployz_reconcile_corrections_total{concern=\"firewall\"} 1\n",
            "ployz_reconcile_passes_total{concern=\"firewall\"} 2\n",
            "ployz_reconcile_failures_total{concern=\"docker_network\"} 1\n",
            "ployz_reconcile_corrections_total{concern=\"dns_listener\"} 0\n",
            "# TYPE ployz_reconcile_corrections_total counter\n",
        ] {
            assert!(text.contains(line), "{line} in:\n{text}");
        }
    }

    fn test_reconciler() -> (tempfile::TempDir, Arc<Reconciler>) {
        let dir = tempfile::tempdir().unwrap();
        let machine = Arc::new(
            LocalMachine::open_with(crate::identity::DataDir::new(dir.path()), None, false)
                .unwrap(),
        );
        let mut config = DaemonConfig::default();
        config.dns.listen = DnsListen::Gateway;
        (dir, Reconciler::new(machine, &config))
    }
}
