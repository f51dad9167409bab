//! This Machine: its identity, its phase and its store, and the operations on them that the
//! management API exposes.

use std::sync::{Arc, Mutex};

use ployz_core::api::PublicAddresses;
use ployz_core::api::{MachineInfo, MachineView};
use ployz_core::{
    ClusterNetwork, LocalMachinePhase, MachineId, MachineName, MembershipObservation, NameError,
};
use ployz_orchestrator::docker::MachineDocker;
use ployz_store::machines::{machine_key, public_addresses_key};
use ployz_store::{OpenOptions, Store, StoreError};

use crate::identity::{DataDir, KeyPair, KeyProblem, LocalIdentity};

mod cluster;
mod token;
pub use cluster::{MeshMember, PeerObservation, MEMBERS_NAMESPACE};

/// The flag that starts the daemon on a data dir that lost acknowledged data.
pub const ACCEPT_DATA_LOSS_FLAG: &str = "--accept-data-loss";

/// Why an operation on this Machine failed.
#[derive(Debug, thiserror::Error)]
pub enum MachineError {
    #[error("this Machine is already initialised as '{name}' ({id})")]
    AlreadyInitialised { name: MachineName, id: MachineId },
    #[error("this Machine is not initialised yet")]
    NotInitialised,
    #[error(transparent)]
    InvalidName(#[from] NameError),
    #[error("the hostname '{0}' does not make a valid Machine Name")]
    UnusableHostname(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{0}")]
    Docker(String),
    /// A join, removal or update refused before anything changed: the message says why, the
    /// fix how to go on.
    #[error("{message}")]
    Refused { message: String, fix: String },
    /// No member has this Machine ID.
    #[error("no Machine with ID {0} is a member of this Cluster")]
    NoSuchMember(MachineId),
    #[error("{action}: {source}")]
    Io {
        action: String,
        source: std::io::Error,
    },
}

struct State {
    identity: Option<LocalIdentity>,
    store: Option<Arc<Store>>,
    docker: Option<MachineDocker>,
}

/// This Machine, as its daemon holds it.
pub struct LocalMachine {
    dir: DataDir,
    /// Where Docker listens (`unix:///path`); `None`: `DOCKER_HOST` or the default socket.
    docker_host: Option<String>,
    state: Mutex<State>,
    /// True from the moment this Machine is initialised (at open, when it already was): what
    /// [`LocalMachine::initialised`] waits for.
    initialised: tokio::sync::watch::Sender<bool>,
    /// The mesh's WireGuard interface, which the Docker network trusts; `None` without a mesh.
    mesh_interface: Mutex<Option<String>>,
    /// The store's drift bound and clock offset (`mesh.max_clock_drift_ms`,
    /// `mesh.clock_offset_ms`), applied to every store this Machine opens.
    store_clock: Mutex<(std::time::Duration, i64)>,
}

/// What an initialised Machine has, for the tasks that wait for it
/// ([`LocalMachine::initialised`]).
#[derive(Clone)]
pub struct Initialised {
    /// Its published self-description.
    pub info: MachineInfo,
    /// Its store.
    pub store: Arc<Store>,
    /// Its Docker.
    pub docker: MachineDocker,
}

fn io(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> MachineError {
    let action = action.into();
    move |source| MachineError::Io { action, source }
}

/// Publishes `info` unless the store already holds exactly it.
fn publish(store: &Store, info: &MachineInfo) -> Result<(), MachineError> {
    let key = machine_key(&info.id);
    let value = serde_json::to_vec(info).expect("machine info serialises");
    let current = store.get(&key)?;
    if current.as_ref().and_then(|r| r.live_value()) != Some(value.as_slice()) {
        store.put(&key, value)?;
    }
    Ok(())
}

/// How to settle this Machine's public addresses.
enum PublicAddressMode {
    /// These, given by the user.
    Given(Vec<std::net::IpAddr>),
    /// Detect them now, replacing given ones.
    Detect,
    /// Keep given ones; detect again if they were detected (daemon start).
    Refresh,
}

/// Writes this Machine's public addresses record unless it already says exactly that.
fn publish_public_addresses(
    store: &Store,
    mode: PublicAddressMode,
) -> Result<PublicAddresses, MachineError> {
    let key = public_addresses_key(store.local());
    let current: Option<PublicAddresses> = store
        .get(&key)?
        .and_then(|r| r.live_value().and_then(|v| serde_json::from_slice(v).ok()));
    let wanted = match (mode, current.clone()) {
        (PublicAddressMode::Given(addresses), _) if !addresses.is_empty() => PublicAddresses {
            addresses,
            detected: false,
        },
        (PublicAddressMode::Refresh, Some(c)) if !c.detected => c,
        _ => PublicAddresses {
            addresses: crate::public_addresses::detect(),
            detected: true,
        },
    };
    if current.as_ref() != Some(&wanted) {
        store.put(
            &key,
            serde_json::to_vec(&wanted).expect("addresses serialise"),
        )?;
        tracing::info!(addresses = ?wanted.addresses, detected = wanted.detected, "public addresses published");
    }
    Ok(wanted)
}

impl LocalMachine {
    /// [`LocalMachine::open_with`] refusing any loss; for tests.
    #[cfg(test)]
    pub fn open(dir: DataDir, docker_host: Option<String>) -> anyhow::Result<LocalMachine> {
        LocalMachine::open_with(dir, docker_host, false)
    }

    /// Loads this Machine from its data dir, opening the store when it is initialised. Once it
    /// is, its WireGuard key must be there and match `machine.json`, and its store must open
    /// holding at least what its acknowledgement record says it acknowledged, and not be
    /// empty. Otherwise the start is refused with what is missing and the ways out, unless
    /// `accept_data_loss`: then what is left is kept, a missing or foreign key is replaced by a
    /// new key pair, and each loss is logged.
    pub fn open_with(
        dir: DataDir,
        docker_host: Option<String>,
        accept_data_loss: bool,
    ) -> anyhow::Result<LocalMachine> {
        std::fs::create_dir_all(dir.root())
            .map_err(|e| anyhow::anyhow!("cannot create data dir {}: {e}", dir.root().display()))?;
        let mut identity = LocalIdentity::load(&dir)?;
        if identity
            .as_ref()
            .is_some_and(|i| i.phase == LocalMachinePhase::Resetting)
        {
            // A reset that did not finish: finish it, and start uninitialised.
            tracing::warn!("finishing a reset to uninitialised that was interrupted");
            remove_identity_files(&dir)
                .map_err(|e| anyhow::anyhow!("cannot finish the reset: {e}"))?;
            identity = None;
        }
        if let Some(identity) = identity.as_mut() {
            check_key(&dir, identity, accept_data_loss)?;
            if identity.cluster.is_none() {
                // Written before Clusters had an identity: this Machine founded its own.
                identity.cluster = Some(ployz_core::ClusterId::generate());
                identity.save(&dir).map_err(|e| {
                    anyhow::anyhow!("cannot write {}: {e}", dir.identity_file().display())
                })?;
            }
        }
        if identity.is_none() && (dir.store_dir().exists() || dir.acknowledged_file().exists()) {
            tracing::warn!(
                "{} is missing, but {} holds a store: if this Machine was initialised, stop the daemon and restore machine.json (from a backup of the data dir); `ployz machine init` or a join sets the store aside as store.lost-<time> and starts anew",
                dir.identity_file().display(),
                dir.root().display()
            );
        }
        let store = match &identity {
            Some(identity) => {
                let store = open_store(&dir, identity, accept_data_loss)?;
                publish(&store, &identity.info())?;
                cluster::ensure_member(&store, identity)?;
                publish_public_addresses(&store, PublicAddressMode::Refresh)?;
                Some(Arc::new(store))
            }
            None => None,
        };
        let docker = match &identity {
            Some(i) => Some(MachineDocker::connect(
                docker_host.as_deref(),
                i.id.clone(),
                i.subnet,
            )?),
            None => None,
        };
        let (initialised, _) = tokio::sync::watch::channel(identity.is_some());
        Ok(LocalMachine {
            dir,
            docker_host,
            state: Mutex::new(State {
                identity,
                store,
                docker,
            }),
            initialised,
            mesh_interface: Mutex::new(None),
            store_clock: Mutex::new((ployz_store::DEFAULT_MAX_DRIFT, 0)),
        })
    }

    /// Sets the store's drift bound and clock offset, now and for a store opened later.
    pub fn set_store_clock(&self, max_drift: std::time::Duration, offset_ms: i64) {
        *self.store_clock.lock().expect("store clock poisoned") = (max_drift, offset_ms);
        if let Some(store) = self.store() {
            self.configure_store(&store);
        }
    }

    /// Applies the store clock settings to `store`.
    fn configure_store(&self, store: &Store) {
        let (max_drift, offset_ms) = *self.store_clock.lock().expect("store clock poisoned");
        store.set_max_drift(max_drift);
        store.set_clock_offset_ms(offset_ms);
    }

    /// The file holding this Machine's WireGuard private key.
    pub fn private_key_file(&self) -> std::path::PathBuf {
        self.dir.private_key_file()
    }

    /// Makes the Docker network trust the mesh's interface (set once at start, before the mesh
    /// runs).
    pub fn set_mesh_interface(&self, interface: &str) {
        *self.mesh_interface.lock().expect("mesh interface poisoned") = Some(interface.to_owned());
        let mut state = self.state.lock().expect("machine state poisoned");
        if let Some(docker) = state.docker.take() {
            state.docker = Some(docker.with_mesh_interface(interface));
        }
    }

    /// This Machine's Docker client for `identity`.
    fn connect_docker(&self, identity: &LocalIdentity) -> Result<MachineDocker, MachineError> {
        let docker = MachineDocker::connect(
            self.docker_host.as_deref(),
            identity.id.clone(),
            identity.subnet,
        )
        .map_err(|e| MachineError::Docker(e.to_string()))?;
        Ok(
            match self
                .mesh_interface
                .lock()
                .expect("mesh interface poisoned")
                .as_deref()
            {
                Some(interface) => docker.with_mesh_interface(interface),
                None => docker,
            },
        )
    }

    /// This Machine's own phase.
    pub fn phase(&self) -> LocalMachinePhase {
        let state = self.state.lock().expect("machine state poisoned");
        state
            .identity
            .as_ref()
            .map_or(LocalMachinePhase::Uninitialized, |i| i.phase)
    }

    /// The store, once this Machine is initialised.
    pub fn store(&self) -> Option<Arc<Store>> {
        self.state
            .lock()
            .expect("machine state poisoned")
            .store
            .clone()
    }

    /// This Machine's Docker, once this Machine is initialised.
    pub fn docker(&self) -> Option<MachineDocker> {
        self.state
            .lock()
            .expect("machine state poisoned")
            .docker
            .clone()
    }

    /// Waits until this Machine is initialised (returns at once if it is) and hands over what
    /// it then has; `None` when `shutdown` comes first. Tasks that can only start on an
    /// initialised Machine (the internal DNS, the observer, the route publisher, the
    /// certificate issuer) begin with it.
    pub async fn initialised(
        &self,
        shutdown: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Option<Initialised> {
        let mut initialised = self.initialised.subscribe();
        tokio::select! {
            // The sender lives in `self`: the wait ends only when the value turns true.
            done = initialised.wait_for(|yes| *yes) => done.ok()?,
            // A dropped shutdown sender means shutdown too.
            _ = shutdown.wait_for(|stop| *stop) => return None,
        };
        let state = self.state.lock().expect("machine state poisoned");
        match (&state.identity, &state.store, &state.docker) {
            (Some(identity), Some(store), Some(docker)) => Some(Initialised {
                info: identity.info(),
                store: store.clone(),
                docker: docker.clone(),
            }),
            _ => None,
        }
    }

    /// This Machine's published self-description, once initialised.
    pub fn info(&self) -> Option<MachineInfo> {
        self.state
            .lock()
            .expect("machine state poisoned")
            .identity
            .as_ref()
            .map(LocalIdentity::info)
    }

    /// Creates this Machine's Cluster identity: Machine ID, Machine Name (`name`, or the
    /// sanitised hostname), the first Machine Subnet, a WireGuard key pair; then participates.
    pub fn init(
        &self,
        name: Option<&str>,
        public_addresses: Vec<std::net::IpAddr>,
    ) -> Result<MachineView, MachineError> {
        let name: MachineName = match name {
            Some(n) => n.parse()?,
            None => {
                let host = hostname();
                MachineName::sanitize_hostname(&host).ok_or(MachineError::UnusableHostname(host))?
            }
        };
        let state = self.state.lock().expect("machine state poisoned");
        if let Some(existing) = &state.identity {
            return Err(MachineError::AlreadyInitialised {
                name: existing.name.clone(),
                id: existing.id.clone(),
            });
        }
        let network = ClusterNetwork::default();
        let subnet = network
            .first_free_subnet(&[])
            .expect("an empty cluster network has a free subnet");
        crate::identity::set_aside(&self.dir.private_key_file()).map_err(io(
            "setting aside the WireGuard key an earlier identity left",
        ))?;
        let keys = KeyPair::generate();
        keys.save_private(&self.dir)
            .map_err(io("writing the WireGuard private key"))?;
        let identity = LocalIdentity {
            id: MachineId::generate(),
            name,
            phase: LocalMachinePhase::Participating,
            cluster_network: network,
            subnet,
            public_key: keys.public_key,
            cluster: Some(ployz_core::ClusterId::generate()),
            bootstrap: Vec::new(),
            catch_up: Default::default(),
            advertised: Vec::new(),
            wireguard_backend: None,
        };
        let docker = self.connect_docker(&identity)?;
        let store = self.fresh_store(&identity.id)?;
        publish(&store, &identity.info())?;
        cluster::write_member(&store, &identity.member())?;
        publish_public_addresses(&store, PublicAddressMode::Given(public_addresses))?;
        tracing::info!(machine_id = %identity.id, machine_name = %identity.name, subnet = %identity.subnet, "machine initialised");
        self.take_identity(state, identity, store, docker)
    }

    /// Opens a new, empty store for this Machine. A store (and acknowledgement record) already
    /// there belongs to no identity: an init or join that crashed before writing it, or a
    /// Machine whose `machine.json` was lost. It is set aside (`store.lost-<time>`), not
    /// deleted: the second is a whole Machine's data.
    fn fresh_store(&self, id: &MachineId) -> Result<Store, MachineError> {
        let store_dir = self.dir.store_dir();
        crate::identity::set_aside(&store_dir)
            .map_err(io("setting aside a store that belongs to no identity"))?;
        let acknowledged = self.dir.acknowledged_file();
        crate::identity::set_aside(&acknowledged).map_err(io(
            "setting aside the acknowledgement record of a store that belongs to no identity",
        ))?;
        let (store, _) = Store::open_with(
            &store_dir,
            id.clone(),
            &OpenOptions {
                acknowledged: Some(acknowledged),
                accept_loss: false,
            },
        )?;
        self.configure_store(&store);
        Ok(store)
    }

    /// Writes the identity file (last: before it, a crash leaves an uninitialised Machine),
    /// drops the pending join offer, and makes this Machine initialised with `store` and
    /// `docker`.
    fn take_identity(
        &self,
        mut state: std::sync::MutexGuard<'_, State>,
        identity: LocalIdentity,
        store: Store,
        docker: MachineDocker,
    ) -> Result<MachineView, MachineError> {
        identity
            .save(&self.dir)
            .map_err(io("writing the identity file"))?;
        let _ = std::fs::remove_file(self.dir.pending_join_file());
        let _ = std::fs::remove_file(self.dir.join_token_file());
        let view = MachineView {
            info: identity.info(),
            membership: MembershipObservation::Up,
            selected_endpoint: None,
            subnet_collisions: Vec::new(),
        };
        state.identity = Some(identity);
        state.store = Some(Arc::new(store));
        state.docker = Some(docker);
        drop(state);
        self.initialised.send_replace(true);
        Ok(view)
    }

    /// The store, when it takes writes now; otherwise why not (503 over the API).
    pub fn writable_store(&self) -> Result<Arc<Store>, MachineError> {
        let store = self.store().ok_or(MachineError::NotInitialised)?;
        if store.write_failure().is_some() && !store.recover() {
            if let Some(reason) = store.write_failure() {
                return Err(MachineError::Store(StoreError::Unwritable { reason }));
            }
        }
        Ok(store)
    }

    /// Tells `report` why the store cannot write (`None`: it writes) each time that changes,
    /// tries every second to make it write again while it cannot, and once it does, brings
    /// this Machine's Container Runtime Observations up to date (a change Docker reported
    /// meanwhile could not be stored). Returns at shutdown, or at once before `machine init`.
    pub async fn follow_store_writability(
        &self,
        report: impl Fn(Option<String>),
        mut shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        let Some(store) = self.store() else {
            return;
        };
        let mut writability = store.writability();
        let mut retry = tokio::time::interval(std::time::Duration::from_secs(1));
        retry.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut was_failing = false;
        loop {
            let failure = writability.borrow_and_update().clone();
            let failing = failure.is_some();
            if was_failing && !failing {
                if let Some(docker) = self.docker() {
                    match ployz_orchestrator::observer::resync(&docker, &store).await {
                        Ok(n) => tracing::info!(changed = n, "observations stored again"),
                        Err(e) => tracing::warn!(error = %e, "container resync failed"),
                    }
                }
            }
            was_failing = failing;
            report(failure);
            tokio::select! {
                _ = shutdown.changed() => return,
                changed = writability.changed() => if changed.is_err() { return },
                _ = retry.tick(), if failing => {
                    let store = store.clone();
                    let _ = tokio::task::spawn_blocking(move || store.recover()).await;
                }
            }
        }
    }

    /// This Machine's public addresses as published.
    pub fn public_addresses(&self) -> Result<PublicAddresses, MachineError> {
        let store = self.store().ok_or(MachineError::NotInitialised)?;
        publish_public_addresses(&store, PublicAddressMode::Refresh)
    }

    /// Replaces this Machine's public addresses; empty: detect them from the interfaces.
    pub fn set_public_addresses(
        &self,
        addresses: Vec<std::net::IpAddr>,
    ) -> Result<PublicAddresses, MachineError> {
        let store = self.store().ok_or(MachineError::NotInitialised)?;
        let mode = if addresses.is_empty() {
            PublicAddressMode::Detect
        } else {
            PublicAddressMode::Given(addresses)
        };
        publish_public_addresses(&store, mode)
    }

    /// Flushes the store; called on shutdown.
    pub fn flush(&self) {
        if let Some(store) = self.store() {
            if let Err(e) = store.flush() {
                tracing::error!(error = %e, "flushing the store on shutdown failed");
            }
        }
    }
}

/// A refused start: what is wrong, then the ways out.
fn refusal(what: impl std::fmt::Display, dir: &DataDir) -> anyhow::Error {
    anyhow::anyhow!(
        "{what}. The daemon does not start on it, so that nothing is served from old or empty \
         state. Ways out: restore the data dir {} from a copy taken while the daemon was \
         stopped; or start once with {ACCEPT_DATA_LOSS_FLAG} to go on with what is left (the \
         rest is lost on this Machine; once it has peers in a mesh, they catch it up with the \
         Cluster's records)",
        dir.root().display()
    )
}

/// Refuses an initialised Machine whose WireGuard key is missing or is not the one
/// `machine.json` names; accepting the loss, makes a new key pair and records it.
fn check_key(
    dir: &DataDir,
    identity: &mut LocalIdentity,
    accept_data_loss: bool,
) -> anyhow::Result<()> {
    let problem = match KeyPair::check(dir, &identity.public_key) {
        Ok(()) => return Ok(()),
        Err(p) => p,
    };
    let what = format!(
        "this Machine's WireGuard private key {} {problem}, while {} names Machine {} with \
         public key {}; a new key would silently change the Machine's identity and Management \
         Address ({})",
        dir.private_key_file().display(),
        dir.identity_file().display(),
        identity.id,
        identity.public_key,
        identity.management_address(),
    );
    if let KeyProblem::CannotRead(_) = problem {
        anyhow::bail!(
            "this Machine's WireGuard private key {} {problem}; fix its permissions (root, \
             mode 0600) or the disk under it",
            dir.private_key_file().display()
        );
    }
    if !accept_data_loss {
        return Err(refusal(what, dir));
    }
    if problem != KeyProblem::Missing {
        let aside = dir.private_key_file().with_extension("key.lost");
        std::fs::rename(dir.private_key_file(), &aside).map_err(|e| {
            anyhow::anyhow!(
                "cannot move {} aside: {e}",
                dir.private_key_file().display()
            )
        })?;
    }
    let keys = KeyPair::generate();
    keys.save_private(dir)
        .map_err(|e| anyhow::anyhow!("cannot write a new WireGuard private key: {e}"))?;
    let before = identity.management_address();
    identity.public_key = keys.public_key;
    identity
        .save(dir)
        .map_err(|e| anyhow::anyhow!("cannot record the new public key in machine.json: {e}"))?;
    tracing::warn!(
        "{what}; accepted: a new key pair replaces it, the Management Address changes from {before} to {}",
        identity.management_address()
    );
    Ok(())
}

/// Opens an initialised Machine's store, refusing one that lost acknowledged data (or, with
/// `accept_data_loss`, logging what was lost).
fn open_store(
    dir: &DataDir,
    identity: &LocalIdentity,
    accept_data_loss: bool,
) -> anyhow::Result<Store> {
    let options = OpenOptions {
        acknowledged: Some(dir.acknowledged_file()),
        accept_loss: accept_data_loss,
    };
    let (store, report) = match Store::open_with(dir.store_dir(), identity.id.clone(), &options) {
        Ok(opened) => opened,
        Err(e) if e.is_loss() => return Err(refusal(e, dir)),
        Err(e) if e.is_io() => {
            return Err(anyhow::anyhow!(
                "cannot open the store {}: {e}; check its filesystem (full? read-only? another \
                 daemon on the same data dir?)",
                dir.store_dir().display()
            ))
        }
        Err(e) => {
            return Err(anyhow::anyhow!(
                "cannot open the store {}: {e}",
                dir.store_dir().display()
            ))
        }
    };
    for loss in &report.accepted_losses {
        tracing::warn!(flag = ACCEPT_DATA_LOSS_FLAG, "accepted: {loss}");
    }
    // An initialised Machine's store holds at least its own description, written before
    // machine.json: an empty one lost everything, acknowledgement record or not.
    if store.digest()?.get(&identity.id) == 0 {
        let what = format!(
            "the store {} holds nothing of this Machine, while {} says it was initialised as \
             Machine {}",
            dir.store_dir().display(),
            dir.identity_file().display(),
            identity.id
        );
        if !accept_data_loss {
            return Err(refusal(what, dir));
        }
        tracing::warn!(flag = ACCEPT_DATA_LOSS_FLAG, "accepted: {what}");
    }
    Ok(store)
}

/// This system's hostname.
/// Deletes this Machine's identity, keys and store, the identity file last: it says
/// `resetting` by then, so a crash midway leaves a reset the next start finishes, not a store
/// without an identity (which an init or join would set aside as another Machine's data). Says
/// which path could not be removed.
pub(crate) fn remove_identity_files(dir: &DataDir) -> Result<(), String> {
    for file in [
        dir.private_key_file(),
        dir.pending_join_file(),
        dir.join_token_file(),
        dir.acknowledged_file(),
    ] {
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("removing {}: {e}", file.display())),
        }
    }
    let store = dir.store_dir();
    if store.exists() {
        std::fs::remove_dir_all(&store)
            .map_err(|e| format!("removing {}: {e}", store.display()))?;
    }
    match std::fs::remove_file(dir.identity_file()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(format!("removing {}: {e}", dir.identity_file().display())),
    }
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[ignore = "needs dockerd: init connects to Docker (scripts/test.sh runs it)"]
    fn init_creates_identity_once_and_survives_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let m = LocalMachine::open_with(DataDir::new(dir.path()), None, false).unwrap();
        assert_eq!(m.phase(), LocalMachinePhase::Uninitialized);
        assert!(matches!(
            m.machines(&Default::default()),
            Err(MachineError::NotInitialised)
        ));
        let view = m.init(Some("alpha"), Vec::new()).unwrap();
        assert_eq!(view.info.subnet.to_string(), "10.210.0.0/24");
        assert_eq!(m.phase(), LocalMachinePhase::Participating);
        let again = m.init(Some("beta"), Vec::new()).unwrap_err();
        assert!(again.to_string().contains("already initialised as 'alpha'"));
        drop(m);
        let reopened = LocalMachine::open_with(DataDir::new(dir.path()), None, false).unwrap();
        let list = reopened.machines(&Default::default()).unwrap();
        assert_eq!(list.values.len(), 1);
        assert_eq!(list.values[0].info, view.info);
        // Reopening republishes nothing when nothing changed (the Machine's description, its
        // public addresses and its member record: three records).
        let store = reopened.store().unwrap();
        assert_eq!(store.digest().unwrap().get(&view.info.id), 3);
    }

    #[test]
    #[ignore = "needs dockerd: init connects to Docker (scripts/test.sh runs it)"]
    fn a_missing_key_or_a_lost_store_is_refused_until_the_loss_is_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let dd = DataDir::new(dir.path());
        let m = LocalMachine::open_with(dd.clone(), None, false).unwrap();
        let view = m.init(Some("alpha"), Vec::new()).unwrap();
        drop(m);

        std::fs::remove_file(dd.private_key_file()).unwrap();
        let err = format!(
            "{:#}",
            LocalMachine::open_with(dd.clone(), None, false)
                .err()
                .unwrap()
        );
        assert!(err.contains("wireguard.key is missing"), "{err}");
        assert!(err.contains(ACCEPT_DATA_LOSS_FLAG), "{err}");
        assert!(
            !dd.private_key_file().exists(),
            "a key was made without being asked"
        );
        let m = LocalMachine::open_with(dd.clone(), None, true).unwrap();
        assert_ne!(m.info().unwrap().public_key, view.info.public_key);
        drop(m);
        drop(LocalMachine::open_with(dd.clone(), None, false).unwrap());

        std::fs::remove_dir_all(dd.store_dir()).unwrap();
        let err = format!(
            "{:#}",
            LocalMachine::open_with(dd.clone(), None, false)
                .err()
                .unwrap()
        );
        assert!(
            err.contains("this Machine acknowledged writes up to sequence"),
            "{err}"
        );
        std::fs::remove_file(dd.acknowledged_file()).unwrap();
        let err = format!(
            "{:#}",
            LocalMachine::open_with(dd.clone(), None, false)
                .err()
                .unwrap()
        );
        assert!(err.contains("holds nothing of this Machine"), "{err}");
        let m = LocalMachine::open_with(dd, None, true).unwrap();
        assert_eq!(m.machines(&Default::default()).unwrap().values.len(), 1);
    }

    #[tokio::test]
    #[ignore = "needs dockerd: init connects to Docker (scripts/test.sh runs it)"]
    async fn initialised_waits_for_init_and_ends_at_shutdown() {
        let dir = tempfile::tempdir().unwrap();
        let m = Arc::new(LocalMachine::open_with(DataDir::new(dir.path()), None, false).unwrap());
        let (stop, shutdown) = tokio::sync::watch::channel(false);
        let waiting = tokio::spawn({
            let (m, mut shutdown) = (m.clone(), shutdown.clone());
            async move { m.initialised(&mut shutdown).await.map(|i| i.info) }
        });
        // It waits: the Machine is not initialised and nothing stops.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiting.is_finished());

        let view = m.init(Some("alpha"), Vec::new()).unwrap();
        let within = std::time::Duration::from_secs(10);
        let info = tokio::time::timeout(within, waiting)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(info, Some(view.info.clone()));

        // Already initialised: at once, also for a new waiter.
        let mut shutdown_again = shutdown.clone();
        let now = tokio::time::timeout(within, m.initialised(&mut shutdown_again)).await;
        assert_eq!(now.unwrap().map(|i| i.info), Some(view.info));

        // Not initialised, shut down: None.
        let other = tempfile::tempdir().unwrap();
        let m = Arc::new(LocalMachine::open_with(DataDir::new(other.path()), None, false).unwrap());
        let waiting = tokio::spawn({
            let (m, mut shutdown) = (m.clone(), shutdown.clone());
            async move { m.initialised(&mut shutdown).await.is_none() }
        });
        tokio::task::yield_now().await;
        stop.send_replace(true);
        assert!(tokio::time::timeout(within, waiting)
            .await
            .unwrap()
            .unwrap());
    }

    #[test]
    fn a_bad_name_is_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().unwrap();
        let m = LocalMachine::open_with(DataDir::new(dir.path()), None, false).unwrap();
        let err = m.init(Some("Bad_Name"), Vec::new()).unwrap_err();
        assert!(err.to_string().contains("Machine Name 'Bad_Name'"), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
