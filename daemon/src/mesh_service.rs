//! The mesh as a module of the daemon: once this Machine is initialised, brings up the WireGuard
//! interface, the firewall chain, membership gossip, the management API's mesh listener and
//! replication, and every second puts the peers, routes and Selected Endpoints in line with the
//! member roster (and the firewall every `reconcile_interval_ms`). A peer's reset request
//! (`machine rm` elsewhere) tears it all down, deletes this Machine's identity and starts the
//! daemon again, uninitialised.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;
use axum::routing::post;
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
use crate::mesh::{MeshMetrics, MeshView, PEER_RESET};
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
}

/// Everything the mesh runs once it is up.
struct Running {
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
    last_firewall: Instant,
    firewall_repairs: u64,
    public_key: String,
    /// The subnet collisions last logged.
    collisions_logged: u64,
    /// When this Machine's self-description was last written (it is written again every
    /// [`REPUBLISH`]).
    published: Option<Instant>,
    /// Whether the last reconciliation failed (a failing streak is logged once).
    failing: bool,
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
        let Some(initialised) = self.machine.initialised(&mut shutdown).await else {
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
        loop {
            tokio::select! {
                _ = shutdown.changed() => break,
                _ = tick.tick() => {}
                event = changes.next() => if event.is_none() { break },
                _ = resets.changed() => {
                    let stop_containers = resets.borrow_and_update().unwrap_or(false);
                    self.reset(running, stop_containers, &initialised).await;
                    return;
                }
            }
            // The first tick comes at once: the first reconciliation follows the start.
            match self.step(&settings, &mut running).await {
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
        running.membership.shutdown().await;
        running.stop.send_replace(true);
        let _ = running.listener.await;
    }
}

impl MeshService {
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
        // record alone up to 16 MiB): not the management API's 2 MiB.
        let (stop, stopping) = tokio::sync::watch::channel(false);
        let app = crate::replication::routes(initialised.store.clone()).merge(
            Router::new()
                .route(PEER_RESET, post(peer_reset))
                .with_state(self.view.clone()),
        );
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
        Ok(Running {
            interface,
            firewall,
            membership,
            replicator,
            up_peers,
            stop,
            listener,
            selector: EndpointSelector::new(),
            last_firewall: Instant::now(),
            firewall_repairs: 0,
            public_key,
            collisions_logged: 0,
            published: None,
            failing: false,
        })
    }

    /// One reconciliation: phase, peers, endpoints, membership, replication peers, firewall,
    /// and what the API shows.
    async fn step(&self, settings: &MeshSettings, running: &mut Running) -> anyhow::Result<()> {
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
        let interface = running.interface.clone();
        let changed = tokio::task::spawn_blocking(move || {
            interface
                .lock()
                .expect("mesh interface poisoned")
                .set_peers(&peers)
        })
        .await??;
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
        if running.last_firewall.elapsed() >= Duration::from_millis(settings.reconcile_interval_ms)
        {
            running.last_firewall = Instant::now();
            let fw = running.firewall.clone();
            let repaired = tokio::task::spawn_blocking(move || fw.reconcile()).await??;
            if repaired > 0 {
                tracing::warn!(rules = repaired, "firewall rules put back");
                running.firewall_repairs += repaired as u64;
            }
        }
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
            }));
        }
        let gossip = running.membership.counters();
        let clock_refusals = self
            .machine
            .store()
            .map(|s| s.clock_refusals())
            .unwrap_or_default();
        self.view.set_metrics(MeshMetrics {
            backend: Some(interface.backend().as_str()),
            membership: by_state,
            subnet_collisions: collisions,
            clock_refusals,
            replication: running.replicator.counters(),
            gossip: [
                gossip.datagrams_sent,
                gossip.datagrams_received,
                gossip.bytes_sent,
                gossip.bytes_received,
            ],
            firewall_repairs: running.firewall_repairs,
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
async fn peer_reset(
    axum::extract::State(view): axum::extract::State<Arc<MeshView>>,
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
