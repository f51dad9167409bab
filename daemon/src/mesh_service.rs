//! The mesh as a module of the daemon: once this Machine is initialised, brings up the WireGuard
//! interface, the firewall chain, membership gossip, the management API's mesh listener and
//! replication, and every second puts the peers, routes and Selected Endpoints in line with the
//! member roster (each pass of peers and routes recorded by the [`Reconciler`], which also
//! checks the interface and the firewall this module hands it). A peer's reset request
//! (`machine rm` elsewhere) tears it all down, deletes this Machine's identity and starts the
//! daemon again, uninitialised.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use axum::routing::{get, post};
use axum::Router;
use pingora::server::ShutdownWatch;
use ployz_core::api::{MeshPeer, MeshStatus};
use ployz_core::{MachineId, MembershipObservation};
use ployz_mesh::endpoints::{EndpointSelector, PeerAdvertisement};
use ployz_mesh::firewall::{Firewall, FirewallConfig};
use ployz_mesh::membership::{Membership, MembershipConfig, Profile};
use ployz_mesh::wireguard::{
    choose_backend, BackendSetting, KernelProbe, MeshConfig, MeshInterface, PeerConfig, PrivateKey,
};

use crate::config::{MembershipProfileSetting, MeshSettings, WireGuardBackendSetting};
use crate::local_machine::{LocalMachine, MeshMember, PeerObservation};
use crate::mesh::{MeshMetrics, MeshView, PEER_GRANT, PEER_RESET};
use crate::reconcile::{Concern, MeshParts, Outcome, PeerLedger, Reconciler, Trigger};
use crate::replication::{ReplicationSettings, Replicator, SyncPeer};

/// How often peers, endpoints and observations are brought in line.
const TICK: Duration = Duration::from_secs(1);
/// How often this Machine writes its self-description again.
const REPUBLISH: Duration = Duration::from_secs(60);
/// How long a failed start waits before trying again.
const RETRY: Duration = Duration::from_secs(5);

pub(crate) struct MeshService {
    pub machine: Arc<LocalMachine>,
    pub view: Arc<MeshView>,
    /// The management API's header deadline, which the mesh listener shares.
    pub header_timeout: Duration,
    /// The management API over this Machine, which the mesh listener serves to members (calls
    /// forwarded by the Machine a CLI reached).
    pub api: Router,
    /// This Machine's reconciliation: it records the passes of peers and routes, and checks the
    /// interface and firewall handed to it.
    pub reconcile: Arc<Reconciler>,
    /// The daemon's handover stage: a mesh stopping because a next process takes the Machine
    /// over does not leave the Cluster.
    pub handover: tokio::sync::watch::Receiver<crate::handover::Stage>,
}

/// Everything the mesh runs once it is up.
struct Running {
    /// When this Machine last said its clock went back (`None`: it has not, or it caught up).
    clock_report: std::sync::Mutex<Option<Instant>>,
    interface: Arc<Mutex<MeshInterface>>,
    firewall: Arc<Firewall>,
    membership: Membership,
    replicator: Replicator,
    /// Feeds the replicator the peers observed up.
    up_peers: tokio::sync::watch::Sender<Vec<SyncPeer>>,
    /// Stops the replicator and the mesh listener.
    stop: tokio::sync::watch::Sender<bool>,
    listener: tokio::task::JoinHandle<()>,
    selector: EndpointSelector,
    /// Firewall rules put back (by the reconciler).
    firewall_repairs: Arc<AtomicU64>,
    /// Set by the reconciler when it made the interface again.
    interface_recreated: Arc<AtomicBool>,
    /// What the last pass of peers and routes applied.
    ledger: PeerLedger,
    /// The members observed up at the last tick (one newly up triggers a pass of every concern).
    up: BTreeSet<MachineId>,
    public_key: String,
    /// The subnet collisions last logged.
    collisions_logged: u64,
    /// When this Machine's self-description was last written (it is written again every
    /// [`REPUBLISH`]).
    published: Option<Instant>,
    /// Whether the last reconciliation failed (a failing streak is logged once).
    failing: bool,
    /// The userspace device's throughput between publications.
    datapath: std::sync::Mutex<DataPathRates>,
}

/// Turns the userspace device's byte counters into rates between two observations.
#[derive(Debug, Default)]
struct DataPathRates {
    last: Option<(Instant, u64, u64)>,
    send_rate: u64,
    receive_rate: u64,
    peak_send_rate: u64,
    peak_receive_rate: u64,
}

impl DataPathRates {
    /// Observes the counters at `now`; rates are measured over at least a second.
    fn observe(&mut self, now: Instant, sent: u64, received: u64) {
        if let Some((then, sent_then, received_then)) = self.last {
            let secs = now.duration_since(then).as_secs_f64();
            if secs < 1.0 {
                return;
            }
            self.send_rate = (sent.saturating_sub(sent_then) as f64 / secs) as u64;
            self.receive_rate = (received.saturating_sub(received_then) as f64 / secs) as u64;
            self.peak_send_rate = self.peak_send_rate.max(self.send_rate);
            self.peak_receive_rate = self.peak_receive_rate.max(self.receive_rate);
        }
        self.last = Some((now, sent, received));
    }

    fn view(&self, stats: &ployz_mesh::device::Stats) -> ployz_core::api::MeshDataPath {
        ployz_core::api::MeshDataPath {
            tun_offload: stats.tun_offload,
            udp_gso: stats.udp_gso,
            udp_gro: stats.udp_gro,
            bytes_sent: stats.bytes_sent,
            bytes_received: stats.bytes_received,
            packets_sent: stats.packets_sent,
            packets_received: stats.packets_received,
            tun_reads: stats.tun_reads,
            tun_writes: stats.tun_writes,
            udp_sends: stats.udp_sends,
            udp_receives: stats.udp_receives,
            dropped: stats.dropped_no_peer + stats.dropped_no_endpoint + stats.dropped_invalid,
            send_rate: self.send_rate,
            receive_rate: self.receive_rate,
            peak_send_rate: self.peak_send_rate,
            peak_receive_rate: self.peak_receive_rate,
        }
    }
}

fn backend_setting(s: WireGuardBackendSetting) -> BackendSetting {
    match s {
        WireGuardBackendSetting::Auto => BackendSetting::Auto,
        WireGuardBackendSetting::Kernel => BackendSetting::Kernel,
        WireGuardBackendSetting::Userspace => BackendSetting::Userspace,
    }
}

fn profile(s: MembershipProfileSetting) -> Profile {
    match s {
        MembershipProfileSetting::Lan => Profile::Lan,
        MembershipProfileSetting::Wan => Profile::Wan,
    }
}

fn mgmt(addr: &ployz_core::ManagementAddress, port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::V6(addr.addr()), port)
}

#[async_trait]
impl pingora::services::background::BackgroundService for MeshService {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        let settings = self.view.settings().clone();
        if !settings.enabled {
            return;
        }
        let Some(initialised) = self.wait_initialised(&settings, &shutdown).await else {
            return;
        };
        let mut resets = self.view.reset_requests();
        let mut running = loop {
            match self.bring_up(&settings, &initialised).await {
                Ok(r) => break r,
                Err(e) => {
                    let reason = format!("the mesh could not start: {e:#}");
                    tracing::error!("{reason}; trying again in {} s", RETRY.as_secs());
                    self.view.set_not_running(reason);
                    tokio::select! {
                        _ = shutdown.changed() => return,
                        _ = tokio::time::sleep(RETRY) => {}
                    }
                }
            }
        };
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut changes = initialised.store.watch_any(vec![
            ployz_store::KeyPrefix::cluster_namespace(crate::local_machine::MEMBERS_NAMESPACE),
            ployz_store::KeyPrefix::machine_namespace(ployz_store::machines::MACHINES_NAMESPACE),
        ]);
        let mut trigger = Trigger::Start;
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => {}
                event = changes.next() => if event.is_none() { break },
                asked = self.reconcile.mesh_pass_requested() => trigger = asked,
                _ = resets.changed() => {
                    let stop_containers = resets.borrow_and_update().unwrap_or(false);
                    self.reset(running, stop_containers, &initialised).await;
                    return;
                }
            }
            // The first tick comes at once: the first reconciliation follows the start.
            let this = std::mem::replace(&mut trigger, Trigger::Declaration);
            match self.step(&settings, &mut running, &this).await {
                Ok(()) if running.failing => {
                    running.failing = false;
                    tracing::info!("mesh reconciliation works again");
                }
                Ok(()) => {}
                Err(e) if !running.failing => {
                    running.failing = true;
                    tracing::warn!(error = %format!("{e:#}"), "mesh reconciliation failed; trying again every second (logged once until it works)");
                }
                Err(_) => {}
            }
        }
        self.reconcile.detach_mesh();
        if *self.handover.borrow() >= crate::handover::Stage::Releasing {
            // The Machine is not leaving: the next process's membership replaces this one at
            // its peers (a newer start wins). Leaving would have them observe it down for the
            // moment in between, and end every exchange their edges have with its containers.
            running.membership.abort().await;
        } else {
            running.membership.shutdown().await;
        }
        running.stop.send_replace(true);
        let _ = running.listener.await;
    }
}

/// How often a Machine holding a Join Token asks the inviting Machine for its grant.
const GRANT_POLL: Duration = Duration::from_secs(2);
/// How long one such ask may take.
const GRANT_TIMEOUT: Duration = Duration::from_secs(3);
/// Failed asks before the next of the inviting Machine's endpoints is tried.
const TRIES_PER_ENDPOINT: u32 = 3;

/// While this Machine holds a Join Token: a WireGuard interface with the inviting Machine as
/// its only peer, over which it asks for its grant.
struct PendingSession {
    token: ployz_core::api::JoinToken,
    interface: Arc<Mutex<MeshInterface>>,
    inviting: SocketAddr,
    endpoint: usize,
    failures: u32,
    last_ask: Option<Instant>,
}

impl PendingSession {
    async fn down(self) {
        let interface = self.interface;
        let name = lock(&interface).name().to_owned();
        let down = move || match Arc::try_unwrap(interface) {
            Ok(only) => only
                .into_inner()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .down(),
            // A reconciliation still holds it; it goes when that one lets go.
            Err(_) => Ok(()),
        };
        match tokio::task::spawn_blocking(down).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::warn!(interface = %name, error = %e, "the interface used while joining did not go away")
            }
            Err(e) => {
                tracing::warn!(interface = %name, error = %e, "taking down the interface used while joining failed")
            }
        }
    }
}

impl MeshService {
    /// Waits until this Machine is initialised; meanwhile, whenever it holds a Join Token, keeps
    /// a WireGuard interface to the inviting Machine and asks it for the grant every
    /// [`GRANT_POLL`], taking the grant when it comes. `None` at shutdown.
    async fn wait_initialised(
        &self,
        settings: &MeshSettings,
        shutdown: &ShutdownWatch,
    ) -> Option<crate::local_machine::Initialised> {
        let mut waiting = shutdown.clone();
        let initialised = self.machine.initialised(&mut waiting);
        tokio::pin!(initialised);
        let mut session: Option<PendingSession> = None;
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                done = &mut initialised => {
                    if let Some(s) = session.take() {
                        s.down().await;
                    }
                    return done;
                }
                _ = tick.tick() => {}
            }
            if let Err(e) = self.pending_step(settings, &mut session).await {
                let text = format!("{e:#}");
                self.view.set_pending_attempt(Some(text.clone()));
                self.view.set_not_running(format!(
                    "this Machine is not initialised; it holds a Join Token and waits to be admitted: {text}"
                ));
            }
        }
    }

    /// One step of waiting with a Join Token: the session follows the token held (none: no
    /// session), and every [`GRANT_POLL`] the inviting Machine is asked for the grant.
    async fn pending_step(
        &self,
        settings: &MeshSettings,
        session: &mut Option<PendingSession>,
    ) -> anyhow::Result<()> {
        let machine = self.machine.clone();
        let held = tokio::task::spawn_blocking(move || machine.pending_join()).await?;
        let Some(pending) = held else {
            if let Some(s) = session.take() {
                s.down().await;
            }
            return Ok(());
        };
        if session.as_ref().is_some_and(|s| s.token != pending.token) {
            if let Some(s) = session.take() {
                s.down().await;
            }
        }
        if session.is_none() {
            *session = Some(self.pending_session(settings, pending.token).await?);
        }
        let s = session.as_mut().expect("made above");
        if s.last_ask.is_some_and(|at| at.elapsed() < GRANT_POLL) {
            return Ok(());
        }
        s.last_ask = Some(Instant::now());
        let inviting = format!("'{}' ({})", s.token.name, s.token.machine);
        let asked = tokio::time::timeout(
            GRANT_TIMEOUT,
            crate::mesh::peer_request(s.inviting, "GET", crate::mesh::PEER_GRANT, None),
        )
        .await;
        let (status, text) = match asked {
            Ok(Ok(answer)) => answer,
            failed => {
                s.failures += 1;
                let endpoint = s.token.endpoints[s.endpoint];
                if s.failures.is_multiple_of(TRIES_PER_ENDPOINT) && s.token.endpoints.len() > 1 {
                    s.endpoint = (s.endpoint + 1) % s.token.endpoints.len();
                    let next = s.token.endpoints[s.endpoint];
                    let peer = inviting_peer(&s.token, next)?;
                    let interface = s.interface.clone();
                    tokio::task::spawn_blocking(move || lock(&interface).set_peers(&[peer]))
                        .await??;
                }
                let why = match failed {
                    Ok(Err(e)) => format!("{e}"),
                    _ => format!("no answer within {} s", GRANT_TIMEOUT.as_secs()),
                };
                anyhow::bail!(
                    "the inviting Machine {inviting} is not reached over WireGuard at {endpoint} ({why}); it answers once a Machine of its Cluster has admitted this one (`ployz machine join REQUEST` there), and UDP {} must pass between the two",
                    settings.wireguard_port
                );
            }
        };
        if !status.is_success() {
            anyhow::bail!("the inviting Machine {inviting} answered {status}: {text}");
        }
        let grant: ployz_core::api::JoinGrant = serde_json::from_str(&text).map_err(|e| {
            anyhow::anyhow!(
                "the inviting Machine {inviting} sent a grant that does not decode: {e}"
            )
        })?;
        let machine = self.machine.clone();
        let view = tokio::task::spawn_blocking(move || machine.join(grant)).await??;
        self.view.set_pending_attempt(None);
        tracing::info!(machine_id = %view.info.id, machine_name = %view.info.name, "admitted through a Join Token; joining the Cluster");
        Ok(())
    }

    /// The interface a Machine holding a Join Token uses: its pending key, the inviting Machine
    /// as the only peer.
    async fn pending_session(
        &self,
        settings: &MeshSettings,
        token: ployz_core::api::JoinToken,
    ) -> anyhow::Result<PendingSession> {
        let key_file = self.machine.private_key_file();
        let key_text = std::fs::read(&key_file)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", key_file.display()))?;
        let private_key = PrivateKey::from_file_contents(&key_text)?;
        let backend = choose_backend(backend_setting(settings.backend), KernelProbe::detect())?;
        let config = MeshConfig {
            interface: settings.interface.clone(),
            backend,
            management_address: private_key.management_address(),
            private_key,
            listen_port: settings.wireguard_port,
            gateway: std::net::Ipv4Addr::UNSPECIFIED,
            mtu: None,
        };
        let peer = inviting_peer(&token, token.endpoints[0])?;
        let inviting = SocketAddr::new(
            IpAddr::V6(peer.management_address),
            settings.management_port,
        );
        let interface = tokio::task::spawn_blocking(move || {
            let mut interface = MeshInterface::up(config)?;
            interface.set_peers(&[peer])?;
            Ok::<_, ployz_mesh::wireguard::WireGuardError>(interface)
        })
        .await??;
        tracing::info!(interface = %interface.name(), inviting = %token.machine, "interface up to fetch the grant from the inviting Machine");
        Ok(PendingSession {
            token,
            interface: Arc::new(Mutex::new(interface)),
            inviting,
            endpoint: 0,
            failures: 0,
            last_ask: None,
        })
    }

    async fn bring_up(
        &self,
        settings: &MeshSettings,
        initialised: &crate::local_machine::Initialised,
    ) -> anyhow::Result<Running> {
        let identity = self
            .machine
            .identity()
            .ok_or_else(|| anyhow::anyhow!("this Machine is not initialised"))?;
        let key_file = self.machine.private_key_file();
        let key_text = std::fs::read(&key_file)
            .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", key_file.display()))?;
        let private_key = PrivateKey::from_file_contents(&key_text)?;
        let backend = choose_backend(backend_setting(settings.backend), KernelProbe::detect())?;
        // The Machine Gateway lives on the Docker network: make sure it exists, so routes to
        // peers can take it as their source.
        let bridge = initialised
            .docker
            .bridge_name()
            .await
            .map_err(|e| anyhow::anyhow!("the Docker network: {e}"))?;
        let config = MeshConfig {
            interface: settings.interface.clone(),
            backend,
            private_key,
            listen_port: settings.wireguard_port,
            management_address: identity.management_address(),
            gateway: identity.subnet.gateway(),
            mtu: None,
        };
        let made_from = config.clone();
        let interface = tokio::task::spawn_blocking(move || MeshInterface::up(config)).await??;
        tracing::info!(interface = %interface.name(), backend = %interface.backend(), mtu = interface.mtu(), "mesh interface up");
        let firewall = Arc::new(Firewall::system(FirewallConfig {
            mesh_interface: settings.interface.clone(),
            docker_bridge: bridge,
            wireguard_port: settings.wireguard_port,
            management_port: settings.management_port,
            gossip_port: settings.gossip_port,
            machine_subnet: identity.subnet,
            cluster_network: identity.cluster_network,
        }));
        let fw = firewall.clone();
        tokio::task::spawn_blocking(move || fw.reconcile()).await??;
        let own_mgmt = identity.management_address();
        // The listener waits until the Management Address can be bound; gossip binds it after.
        let tcp = bind_when_address_exists(mgmt(&own_mgmt, settings.management_port)).await?;
        let membership = Membership::spawn(MembershipConfig::new(
            identity.id.clone(),
            mgmt(&own_mgmt, settings.gossip_port),
            profile(settings.profile),
        ))?;
        // The replication routes keep their own body limit (batches of about 1 MiB, one large
        // record alone up to 16 MiB): not the management API's 2 MiB (`api::body_limit`).
        let (stop, stopping) = tokio::sync::watch::channel(false);
        // Forwarded management calls are for this Machine only; they, replication and a reset
        // are for members only; the grant is for the Machine being admitted, which asks for it
        // before it is anything else (grant_for_peer finds it by its address). Nothing is for a
        // caller on this host (its own Management Address, over loopback).
        let peer_routes = PeerRoutes {
            machine: self.machine.clone(),
            view: self.view.clone(),
        };
        let api = self.api.clone().layer(axum::middleware::from_fn_with_state(
            self.machine.clone(),
            crate::forward::no_second_hop,
        ));
        let app = crate::replication::routes(initialised.store.clone())
            .merge(
                Router::new()
                    .route(PEER_RESET, post(peer_reset))
                    .with_state(peer_routes.clone()),
            )
            .merge(api)
            .layer(axum::middleware::from_fn_with_state(
                self.machine.clone(),
                crate::forward::only_members,
            ))
            .merge(
                Router::new()
                    .route(PEER_GRANT, get(peer_grant))
                    .with_state(peer_routes),
            )
            .layer(axum::middleware::from_fn_with_state(
                self.machine.clone(),
                crate::forward::from_another_machine,
            ));
        let header_timeout = self.header_timeout;
        let listener = tokio::spawn(crate::api::serve(
            tcp,
            app,
            header_timeout,
            crate::api::MAX_CONNECTIONS,
            stopping.clone(),
        ));
        let (up_peers, peers_rx) = tokio::sync::watch::channel(Vec::new());
        let replicator = Replicator::spawn(
            initialised.store.clone(),
            peers_rx,
            ReplicationSettings::default(),
            stopping,
        );
        let public_key = identity.public_key.clone();
        let interface = Arc::new(Mutex::new(interface));
        let firewall_repairs = Arc::new(AtomicU64::new(0));
        let interface_recreated = Arc::new(AtomicBool::new(false));
        self.reconcile.attach_mesh(MeshParts {
            interface: interface.clone(),
            config: made_from,
            firewall: firewall.clone(),
            firewall_repairs: firewall_repairs.clone(),
            interface_recreated: interface_recreated.clone(),
        });
        Ok(Running {
            interface,
            firewall,
            membership,
            replicator,
            up_peers,
            stop,
            listener,
            selector: EndpointSelector::new(),
            firewall_repairs,
            interface_recreated,
            ledger: PeerLedger::default(),
            up: BTreeSet::new(),
            public_key,
            collisions_logged: 0,
            published: None,
            failing: false,
            datapath: std::sync::Mutex::default(),
            clock_report: std::sync::Mutex::default(),
        })
    }

    /// One reconciliation: phase, peers, endpoints, membership, replication peers, and what the
    /// API shows; the passes of peers and routes are recorded under `trigger`.
    async fn step(
        &self,
        settings: &MeshSettings,
        running: &mut Running,
        trigger: &Trigger,
    ) -> anyhow::Result<()> {
        let advertised = self.view.advertised_endpoints();
        let backend = running
            .interface
            .lock()
            .expect("mesh interface poisoned")
            .backend()
            .as_str();
        let republish = running.published.is_none_or(|at| at.elapsed() >= REPUBLISH);
        if republish {
            running.published = Some(Instant::now());
        }
        let machine = self.machine.clone();
        let members: Vec<MeshMember> = tokio::task::spawn_blocking(move || {
            machine.set_mesh_facts(advertised, backend, republish)?;
            if let Some(phase) = machine.settle()? {
                tracing::info!(%phase, "local machine phase");
            }
            machine.forget_removed()?;
            machine.mesh_members()
        })
        .await??;
        running.selector.set_advertised(
            SystemTime::now(),
            &members
                .iter()
                .map(|m| PeerAdvertisement {
                    public_key: m.member.public_key.clone(),
                    endpoints: m.endpoints.clone(),
                })
                .collect::<Vec<_>>(),
        );
        running.membership.set_peers(
            members
                .iter()
                .map(|m| {
                    (
                        m.member.id.clone(),
                        mgmt(&m.member.management_address, settings.gossip_port),
                    )
                })
                .collect(),
        )?;
        let observed = running.membership.observations();
        let up_now: BTreeSet<MachineId> = members
            .iter()
            .filter(|m| {
                observed
                    .get(&m.member.id)
                    .is_some_and(|o| o.state == MembershipObservation::Up)
            })
            .map(|m| m.member.id.clone())
            .collect();
        if let Some(back) = up_now.difference(&running.up).next() {
            // A peer observed up again (or for the first time): its routes and everything that
            // hangs on reaching it are checked now rather than at the next timer.
            self.reconcile
                .trigger(Trigger::Reconnect(format!("peer {back} up")));
        }
        running.up = up_now;
        for m in &members {
            let up = observed
                .get(&m.member.id)
                .is_some_and(|o| o.state == MembershipObservation::Up);
            running.selector.set_membership_up(&m.member.public_key, up);
        }
        let interface = running.interface.clone();
        let stats = tokio::task::spawn_blocking(move || {
            interface.lock().expect("mesh interface poisoned").stats()
        })
        .await??;
        for change in running.selector.tick(SystemTime::now(), &stats) {
            tracing::info!(peer = %change.public_key, endpoint = %change.endpoint, reason = ?change.reason, "selected endpoint changed");
        }
        let peers: Vec<PeerConfig> = members
            .iter()
            .map(|m| PeerConfig {
                public_key: m.member.public_key.clone(),
                management_address: m.member.management_address.addr(),
                subnet: m.member.subnet,
                endpoint: running.selector.selected(&m.member.public_key),
            })
            .collect();
        if running.interface_recreated.swap(false, Ordering::Relaxed) {
            running.ledger.forget();
        }
        let interface = running.interface.clone();
        let mut ledger = std::mem::take(&mut running.ledger);
        let (passed, ledger) = tokio::task::spawn_blocking(move || {
            let mut interface = interface.lock().expect("mesh interface poisoned");
            let passed = crate::reconcile::peers_and_routes(&mut interface, &peers, &mut ledger);
            (passed, ledger)
        })
        .await?;
        running.ledger = ledger;
        let changed = match passed {
            Ok((peers, routes, changed)) => {
                self.reconcile.record(Concern::Peers, trigger, peers);
                self.reconcile.record(Concern::Routes, trigger, routes);
                changed
            }
            Err(error) => {
                for concern in [Concern::Peers, Concern::Routes] {
                    self.reconcile.record(
                        concern,
                        trigger,
                        Outcome::CouldNot {
                            error: error.clone(),
                        },
                    );
                }
                anyhow::bail!("setting the WireGuard peers: {error}");
            }
        };
        if !changed.is_empty() {
            tracing::info!(
                added = changed.added,
                updated = changed.updated,
                removed = changed.removed,
                "mesh peers changed"
            );
        }
        let up: Vec<SyncPeer> = members
            .iter()
            .filter(|m| {
                observed
                    .get(&m.member.id)
                    .is_some_and(|o| o.state == MembershipObservation::Up)
            })
            .map(|m| SyncPeer {
                id: m.member.id.clone(),
                addr: mgmt(&m.member.management_address, settings.management_port),
            })
            .collect();
        running.up_peers.send_if_modified(|current| {
            if *current == up {
                false
            } else {
                *current = up;
                true
            }
        });
        let collisions = self.machine.subnet_collision_count().unwrap_or(0);
        if collisions != running.collisions_logged {
            if collisions > 0 {
                tracing::error!(machines = collisions, "machine subnet collision: several members hold one subnet; `ployz machine ls` names them; remove one and add it again");
            } else {
                tracing::info!("machine subnet collisions resolved");
            }
            running.collisions_logged = collisions;
        }
        self.publish(settings, running, &members, &observed, &stats, collisions);
        Ok(())
    }

    /// What the API and metrics show.
    fn publish(
        &self,
        settings: &MeshSettings,
        running: &Running,
        members: &[MeshMember],
        observed: &BTreeMap<MachineId, ployz_mesh::membership::PeerObservation>,
        stats: &[ployz_mesh::wireguard::PeerStats],
        collisions: u64,
    ) {
        let endpoints: BTreeMap<String, ployz_mesh::endpoints::PeerEndpoint> = running
            .selector
            .peers()
            .into_iter()
            .map(|p| (p.public_key.clone(), p))
            .collect();
        let mut observations = BTreeMap::new();
        let mut peers = Vec::new();
        let mut by_state: BTreeMap<&'static str, u64> = BTreeMap::new();
        let now = SystemTime::now();
        for m in members {
            let membership = observed
                .get(&m.member.id)
                .map(|o| o.state)
                .unwrap_or(MembershipObservation::Unknown);
            *by_state.entry(membership.as_str()).or_default() += 1;
            let endpoint = endpoints.get(&m.member.public_key);
            let stat = stats.iter().find(|s| s.public_key == m.member.public_key);
            observations.insert(
                m.member.id.clone(),
                PeerObservation {
                    membership: Some(membership),
                    selected_endpoint: endpoint.and_then(|e| e.selected),
                },
            );
            peers.push(MeshPeer {
                id: m.member.id.clone(),
                name: m.member.name.clone(),
                public_key: m.member.public_key.clone(),
                subnet: m.member.subnet,
                selected_endpoint: endpoint.and_then(|e| e.selected),
                endpoint_status: endpoint
                    .map(|e| e.status.as_str())
                    .unwrap_or("unknown")
                    .to_owned(),
                endpoints: m.endpoints.clone(),
                last_handshake_secs: stat
                    .and_then(|s| s.last_handshake)
                    .and_then(|t| now.duration_since(t).ok())
                    .map(|d| d.as_secs()),
                rx_bytes: stat.map_or(0, |s| s.rx_bytes),
                tx_bytes: stat.map_or(0, |s| s.tx_bytes),
                membership,
            });
        }
        self.view.set_observations(observations);
        let interface = running.interface.lock().expect("mesh interface poisoned");
        let datapath = interface.datapath_stats().map(|stats| {
            let mut rates = running.datapath.lock().expect("data path rates poisoned");
            rates.observe(Instant::now(), stats.bytes_sent, stats.bytes_received);
            rates.view(&stats)
        });
        let identity = self.machine.identity();
        if let Some(identity) = identity {
            self.view.set_status(Some(MeshStatus {
                interface: interface.name().to_owned(),
                backend: interface.backend().as_str().to_owned(),
                public_key: running.public_key.clone(),
                listen_port: settings.wireguard_port,
                mtu: interface.mtu(),
                management_address: identity.management_address(),
                peers,
                datapath: datapath.clone(),
            }));
        }
        let gossip = running.membership.counters();
        let clock_refusals = self
            .machine
            .store()
            .map(|s| s.clock_refusals())
            .unwrap_or_default();
        let (clock_ahead, max_drift) = self
            .machine
            .store()
            .map(|s| (s.clock_ahead(), s.max_drift()))
            .unwrap_or_default();
        report_clock(
            &mut lock_clock_report(running),
            (clock_ahead > max_drift).then_some(clock_ahead),
        );
        let clock_ahead_ms = u64::try_from(clock_ahead.as_millis()).unwrap_or(u64::MAX);
        let replication = running.replicator.counters();
        if running.replicator.caught_up() {
            self.view.set_caught_up();
        }
        self.view.set_metrics(MeshMetrics {
            backend: Some(interface.backend().as_str()),
            membership: by_state,
            subnet_collisions: collisions,
            clock_refusals,
            clock_ahead_ms,
            replication,
            gossip: [
                gossip.datagrams_sent,
                gossip.datagrams_received,
                gossip.bytes_sent,
                gossip.bytes_received,
            ],
            firewall_repairs: running.firewall_repairs.load(Ordering::Relaxed),
            datapath,
        });
    }

    /// Tears the mesh down, forgets this Machine's identity (and, if asked, its containers) and
    /// starts the daemon again, uninitialised.
    async fn reset(
        &self,
        running: Running,
        stop_containers: bool,
        initialised: &crate::local_machine::Initialised,
    ) {
        tracing::warn!(
            stop_containers,
            "removed from the cluster: resetting this machine"
        );
        // The reconciler leaves the interface and firewall alone from here: they go now.
        self.reconcile.detach_mesh();
        running.membership.shutdown().await;
        running.stop.send_replace(true);
        let _ = running.listener.await;
        let firewall = running.firewall.clone();
        let interface = running.interface;
        let _ = tokio::task::spawn_blocking(move || {
            if let Err(e) = firewall.remove() {
                tracing::warn!(error = %e, "removing the firewall rules");
            }
            match Arc::try_unwrap(interface) {
                Ok(i) => {
                    if let Err(e) = i.into_inner().expect("mesh interface poisoned").down() {
                        tracing::warn!(error = %e, "removing the mesh interface");
                    }
                }
                Err(_) => {
                    tracing::warn!("the mesh interface is still in use; it goes with the process")
                }
            }
        })
        .await;
        if stop_containers {
            match initialised.docker.observe().await {
                Ok(containers) => {
                    for c in containers {
                        if let Err(e) = initialised.docker.remove(c.id.as_str()).await {
                            tracing::warn!(container = %c.name, error = %e, "removing a container");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "listing containers to remove"),
            }
        }
        let machine = self.machine.clone();
        match tokio::task::spawn_blocking(move || machine.forget_identity()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "the reset did not finish"),
            Err(e) => tracing::error!(error = %e, "the reset did not finish"),
        }
        crate::server::restart_process();
    }
}

/// Binds the mesh listener once the Management Address is on the interface (it appears with the
/// interface, but a kernel may take a moment to make it usable).
async fn bind_when_address_exists(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => return Ok(l),
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(%addr, error = %e, "mesh listener not bound yet");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => anyhow::bail!("cannot bind the mesh listener on {addr}: {e}"),
        }
    }
}

/// `POST /v1/peer/reset`: another Machine removed this one from the Cluster. Answers at once;
/// the reset follows.
fn lock(interface: &Mutex<MeshInterface>) -> std::sync::MutexGuard<'_, MeshInterface> {
    interface
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// What the peer routes on the mesh listener use.
#[derive(Clone)]
struct PeerRoutes {
    machine: Arc<LocalMachine>,
    view: Arc<MeshView>,
}

/// The inviting Machine as a WireGuard peer, reached at `endpoint`.
fn inviting_peer(
    token: &ployz_core::api::JoinToken,
    endpoint: SocketAddr,
) -> anyhow::Result<PeerConfig> {
    let key = ployz_mesh::wireguard::parse_public_key(&token.public_key)?;
    Ok(PeerConfig {
        public_key: token.public_key.clone(),
        management_address: ployz_core::ManagementAddress::from_public_key(&key).addr(),
        subnet: token.subnet,
        endpoint: Some(endpoint),
    })
}

/// `GET` [`PEER_GRANT`]: the grant of the member whose Management Address the request comes
/// from. Only mesh peers reach this listener, and WireGuard vouches for their source address.
async fn peer_grant(
    axum::extract::State(routes): axum::extract::State<PeerRoutes>,
    axum::Extension(crate::api::ConnectedFrom(from)): axum::Extension<
        crate::api::ConnectedFrom<SocketAddr>,
    >,
) -> axum::response::Response {
    use axum::response::IntoResponse as _;
    let IpAddr::V6(caller) = from.ip() else {
        return (
            axum::http::StatusCode::FORBIDDEN,
            "only Management Addresses ask for grants",
        )
            .into_response();
    };
    let port = routes.view.settings().wireguard_port;
    let endpoints = routes.view.advertised_endpoints();
    let machine = routes.machine.clone();
    match tokio::task::spawn_blocking(move || machine.grant_for_peer(caller, port, endpoints)).await
    {
        Ok(Ok(grant)) => {
            tracing::info!(machine_id = %grant.member.id, "grant handed over the mesh");
            axum::Json(grant).into_response()
        }
        Ok(Err(e)) => (axum::http::StatusCode::NOT_FOUND, e.to_string()).into_response(),
        Err(e) => (axum::http::StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

async fn peer_reset(
    axum::extract::State(PeerRoutes { view, .. }): axum::extract::State<PeerRoutes>,
    body: axum::body::Bytes,
) -> axum::http::StatusCode {
    #[derive(serde::Deserialize, Default)]
    struct ResetRequest {
        #[serde(default)]
        stop_containers: bool,
    }
    let request: ResetRequest = if body.is_empty() {
        ResetRequest::default()
    } else {
        match serde_json::from_slice(&body) {
            Ok(r) => r,
            Err(_) => return axum::http::StatusCode::BAD_REQUEST,
        }
    };
    view.request_reset(request.stop_containers);
    axum::http::StatusCode::ACCEPTED
}

impl std::fmt::Debug for MeshService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeshService").finish_non_exhaustive()
    }
}

/// How often a clock that went back is reported again while it lasts.
const CLOCK_REPORT_EVERY: Duration = Duration::from_secs(300);

fn lock_clock_report(running: &Running) -> std::sync::MutexGuard<'_, Option<Instant>> {
    running
        .clock_report
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Says, when it starts and every [`CLOCK_REPORT_EVERY`] while it lasts, that this Machine's
/// clock went back: its timestamps never go back, so the others refuse its writes (they count
/// them in `ployz_store_clock_refusals_total`, and nothing said so here). Says when it is over.
fn report_clock(last: &mut Option<Instant>, went_back: Option<Duration>) {
    match (went_back, *last) {
        (Some(by), reported) if reported.is_none_or(|t| t.elapsed() >= CLOCK_REPORT_EVERY) => {
            tracing::warn!(
                behind_s = by.as_secs(),
                "this Machine's clock went back (a jump forward, corrected): its writes carry timestamps ahead of the others' clocks, which refuse them until this clock catches up, in about {} s; its records are not replicated meanwhile (`ployz store digest` shows it)",
                by.as_secs()
            );
            *last = Some(Instant::now());
        }
        (None, Some(_)) => {
            tracing::info!("this Machine's clock caught up with its timestamps: the others take its writes again");
            *last = None;
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::DataPathRates;

    #[test]
    fn data_path_rates_are_measured_over_a_second_or_more_and_keep_their_peak() {
        let start = Instant::now();
        let mut rates = DataPathRates::default();
        rates.observe(start, 0, 0);
        // Half a second is too short to measure: nothing changes, and the baseline stays.
        rates.observe(start + Duration::from_millis(500), 1_000, 1_000);
        assert_eq!(rates.send_rate, 0);
        rates.observe(start + Duration::from_secs(2), 200_000_000, 100_000_000);
        assert_eq!(
            (rates.send_rate, rates.receive_rate),
            (100_000_000, 50_000_000)
        );
        rates.observe(start + Duration::from_secs(4), 220_000_000, 100_000_000);
        assert_eq!((rates.send_rate, rates.receive_rate), (10_000_000, 0));
        assert_eq!(
            (rates.peak_send_rate, rates.peak_receive_rate),
            (100_000_000, 50_000_000)
        );
    }
}
