//! This Machine in its Cluster: the member roster, joining (both sides), removal and updates.
//!
//! The roster is cluster-scoped (`c/members/<machine-id>`): the Machine that admits a new one
//! writes its record, so every Machine, the new one included, can make a WireGuard peer of it
//! before the new Machine has written anything itself. `machine rename` and `machine update`
//! change a member's record wherever they run; `machine rm` deletes it. What a Machine says about
//! itself (its phase, its advertised endpoints, its release) stays machine-owned
//! (`m/machines/<id>/info`), written by it alone.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;

use ployz_core::api::{
    Admission, AdmitRequest, JoinGrant, JoinRequest, MachineInfo, MachineList, MachineView, Member,
    UpdateMachineRequest, API_VERSION,
};
use ployz_core::{
    LocalMachinePhase, MachineId, MachineName, MembershipObservation, PartialResult, TargetFailure,
};
use ployz_store::machines::{INFO, MACHINES_NAMESPACE};
use ployz_store::{Key, KeyPrefix, Store, StoreError};

use super::{io, publish, publish_public_addresses, LocalMachine, MachineError, PublicAddressMode};
use crate::identity::{LocalIdentity, PendingJoin};

/// Store namespace of the member roster (cluster-scoped).
pub const MEMBERS_NAMESPACE: &str = "members";

/// The record key of a member.
pub fn member_key(id: &MachineId) -> Key {
    Key::cluster(MEMBERS_NAMESPACE, id.as_str())
}

/// Every member in the store, skipping records that do not decode. A store that cannot be read
/// is an error, never "no members".
pub fn roster(store: &Store) -> Result<Vec<Member>, StoreError> {
    Ok(store
        .scan_live(&KeyPrefix::cluster_namespace(MEMBERS_NAMESPACE))?
        .into_iter()
        .filter_map(|r| serde_json::from_slice(&r.value).ok())
        .collect())
}

/// Writes `member` unless the store already holds exactly it.
pub(super) fn write_member(store: &Store, member: &Member) -> Result<(), MachineError> {
    let key = member_key(&member.id);
    let value = serde_json::to_vec(member).expect("member serialises");
    let current = store.get(&key)?;
    if current.as_ref().and_then(|r| r.live_value()) != Some(value.as_slice()) {
        store.put(&key, value)?;
    }
    Ok(())
}

/// A Machine that founded its Cluster before the roster existed writes its own member record,
/// once: never over a deletion (`machine rm` deleted it), never for a Machine that joined (its
/// admitting Machine wrote it).
pub(super) fn ensure_member(store: &Store, identity: &LocalIdentity) -> Result<(), MachineError> {
    if identity.bootstrap.is_empty() && store.get(&member_key(&identity.id))?.is_none() {
        write_member(store, &identity.member())?;
    }
    Ok(())
}

/// Every machine-owned self-description in the store, by Machine ID.
fn infos(store: &Store) -> Result<BTreeMap<MachineId, Result<MachineInfo, String>>, StoreError> {
    let mut out = BTreeMap::new();
    for record in store.scan_live(&KeyPrefix::machine_namespace(MACHINES_NAMESPACE))? {
        if record.key.name() != INFO {
            continue;
        }
        let decoded = serde_json::from_slice::<MachineInfo>(&record.value)
            .map_err(|e| format!("its machine record does not decode: {e}"));
        out.insert(record.origin.clone(), decoded);
    }
    Ok(out)
}

/// What this observer knows of one peer beyond the store: its Membership Observation and the
/// WireGuard endpoint it selected for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerObservation {
    pub membership: Option<MembershipObservation>,
    pub selected_endpoint: Option<SocketAddr>,
}

/// A WireGuard peer to have: a member other than this Machine, with every endpoint to try, in
/// order (given by hand first, then what it advertises).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MeshMember {
    pub member: Member,
    pub endpoints: Vec<SocketAddr>,
}

fn refused(message: impl Into<String>, fix: impl Into<String>) -> MachineError {
    MachineError::Refused {
        message: message.into(),
        fix: fix.into(),
    }
}

impl LocalMachine {
    /// This Machine's identity, once initialised.
    pub fn identity(&self) -> Option<LocalIdentity> {
        self.state
            .lock()
            .expect("machine state poisoned")
            .identity
            .clone()
    }

    /// What this Machine says when asked to join a Cluster. An uninitialised Machine makes (once)
    /// the key pair and Machine ID it will join with; an initialised one answers with its own,
    /// and its Cluster, which the admitting Machine refuses.
    pub fn join_request(&self, endpoints: Vec<SocketAddr>) -> Result<JoinRequest, MachineError> {
        let base = |phase, cluster, id, public_key| JoinRequest {
            version: env!("CARGO_PKG_VERSION").to_owned(),
            api: API_VERSION,
            phase,
            cluster,
            id,
            public_key,
            endpoints: endpoints.clone(),
            hostname: super::hostname(),
        };
        let state = self.state.lock().expect("machine state poisoned");
        if let Some(identity) = &state.identity {
            return Ok(base(
                identity.phase,
                identity.cluster.clone(),
                identity.id.clone(),
                identity.public_key.clone(),
            ));
        }
        let pending =
            PendingJoin::load_or_make(&self.dir).map_err(io("writing this Machine's join key"))?;
        Ok(base(
            LocalMachinePhase::Uninitialized,
            None,
            pending.id,
            pending.public_key,
        ))
    }

    /// Admits the Machine that made `request` into this Machine's Cluster: checks it can join,
    /// picks the first Machine Subnet free as this Machine observes the roster, writes its member
    /// record, and answers the grant the new Machine joins with. Nothing is written when it is
    /// refused.
    pub fn admit(
        &self,
        request: AdmitRequest,
        wireguard_port: u16,
        own_endpoints: Vec<SocketAddr>,
    ) -> Result<Admission, MachineError> {
        let identity = self.identity().ok_or(MachineError::NotInitialised)?;
        let store = self.writable_store()?;
        let joining = &request.request;
        if identity.phase != LocalMachinePhase::Participating {
            return Err(refused(
                format!(
                    "this Machine is {}, so its view of the Cluster may be incomplete",
                    identity.phase
                ),
                "add the Machine through a participating Machine (`ployz machine ls` shows each one's phase)",
            ));
        }
        if let Some(answered) = &request.token_cluster {
            if Some(answered) != identity.cluster.as_ref() {
                return Err(refused(
                    format!(
                        "the join request answers a Join Token of Cluster {answered}, and this Machine is in Cluster {}",
                        identity.cluster.as_ref().map(|c| c.to_string()).unwrap_or_else(|| "(none)".into())
                    ),
                    "run `ployz machine join REQUEST` on a Machine of the Cluster that made the token",
                ));
            }
        }
        if joining.api != API_VERSION {
            return Err(refused(
                format!(
                    "the joining Machine's daemon (release {}) speaks API version {}, this one (release {}) speaks {API_VERSION}",
                    joining.version,
                    joining.api,
                    env!("CARGO_PKG_VERSION")
                ),
                "install the same Ployz release on both Machines, then add it again",
            ));
        }
        let members = roster(&store)?;
        let already_here = members
            .iter()
            .find(|m| m.id == joining.id || m.public_key == joining.public_key);
        if let Some(m) = already_here {
            return Err(refused(
                format!(
                    "the Machine is already a member of this Cluster, as '{}' ({})",
                    m.name, m.id
                ),
                "`ployz machine ls` lists it; nothing to do",
            ));
        }
        if joining.phase != LocalMachinePhase::Uninitialized || joining.cluster.is_some() {
            let which = match &joining.cluster {
                Some(c) if Some(c) == identity.cluster.as_ref() => {
                    "this Cluster (it was removed from the roster or is not replicated here yet)"
                        .to_owned()
                }
                Some(c) => format!("another Cluster ({c})"),
                None => "a Cluster".to_owned(),
            };
            return Err(refused(
                format!(
                    "the Machine is already initialised ({}) and in {which}",
                    joining.phase
                ),
                "remove it from its Cluster first (`ployz machine rm` run there), then add it again",
            ));
        }
        let name: MachineName = match &request.name {
            Some(n) => n.parse()?,
            None => MachineName::sanitize_hostname(&joining.hostname)
                .ok_or_else(|| MachineError::UnusableHostname(joining.hostname.clone()))?,
        };
        let mut warnings = Vec::new();
        for m in members.iter().filter(|m| m.name == name) {
            warnings.push(format!(
                "Machine Name '{name}' is already taken by {}; both keep it, so refer to them by Machine ID",
                m.id
            ));
        }
        let subnet = ployz_mesh::join::allocate_subnet(&identity.cluster_network, &members)
            .map_err(|e| refused(e.to_string(), "remove Machines that are gone for good"))?;
        let public_key: [u8; 32] = base64::Engine::decode(
            &base64::engine::general_purpose::STANDARD,
            &joining.public_key,
        )
        .ok()
        .and_then(|v| v.try_into().ok())
        .ok_or_else(|| {
            refused(
                "the joining Machine's public key is not a base64 32-byte WireGuard key",
                "check that the host runs a Ployz daemon",
            )
        })?;
        let mut endpoints: Vec<SocketAddr> = request
            .public_ip
            .map(|ip| SocketAddr::new(ip, wireguard_port))
            .into_iter()
            .collect();
        for e in &joining.endpoints {
            if !endpoints.contains(e) {
                endpoints.push(*e);
            }
        }
        let member = Member {
            id: joining.id.clone(),
            name,
            subnet,
            public_key: joining.public_key.clone(),
            management_address: ployz_core::ManagementAddress::from_public_key(&public_key),
            endpoints,
        };
        let peers = members;
        write_member(&store, &member)?;
        let grant = self.grant(
            &store,
            &identity,
            member,
            peers,
            wireguard_port,
            own_endpoints,
        )?;
        tracing::info!(machine_id = %grant.member.id, machine_name = %grant.member.name, subnet = %grant.member.subnet, "machine admitted");
        Ok(Admission { grant, warnings })
    }

    /// The grant for `member`: the Cluster, the other members (every endpoint this Machine
    /// knows for each, so the new Machine can reach them before its store holds their
    /// self-descriptions) and this store's digest to catch up to.
    fn grant(
        &self,
        store: &Store,
        identity: &LocalIdentity,
        member: Member,
        members: Vec<Member>,
        wireguard_port: u16,
        own_endpoints: Vec<SocketAddr>,
    ) -> Result<JoinGrant, MachineError> {
        let cluster = identity
            .cluster
            .clone()
            .ok_or(MachineError::NotInitialised)?;
        let own = identity.id.clone();
        let infos = infos(store)?;
        let peers: Vec<Member> = members
            .into_iter()
            .filter(|m| m.id != member.id)
            .map(|mut m| {
                let advertised = if m.id == own {
                    own_endpoints.clone()
                } else {
                    infos
                        .get(&m.id)
                        .and_then(|i| i.as_ref().ok())
                        .map(|i| i.endpoints.clone())
                        .unwrap_or_default()
                };
                for e in advertised {
                    if !m.endpoints.contains(&e) {
                        m.endpoints.push(e);
                    }
                }
                m
            })
            .collect();
        let catch_up = store.digest()?.0;
        Ok(JoinGrant {
            cluster,
            network: identity.cluster_network,
            member,
            peers,
            catch_up,
            wireguard_port,
        })
    }

    /// The grant of the member whose Management Address is `caller`, asked over the mesh by a
    /// Machine admitted through a Join Token (WireGuard vouches for the address: only the
    /// holder of that member's key can send from it).
    pub fn grant_for_peer(
        &self,
        caller: std::net::Ipv6Addr,
        wireguard_port: u16,
        own_endpoints: Vec<SocketAddr>,
    ) -> Result<JoinGrant, MachineError> {
        let identity = self.identity().ok_or(MachineError::NotInitialised)?;
        let store = self.store().ok_or(MachineError::NotInitialised)?;
        let members = roster(&store)?;
        let member = members
            .iter()
            .find(|m| m.management_address.addr() == caller && m.id != identity.id)
            .cloned()
            .ok_or_else(|| {
                refused(
                    format!("no Member Record here has the Management Address {caller}: it is not admitted (yet)"),
                    "run `ployz machine join REQUEST` on a Machine of the Cluster",
                )
            })?;
        self.grant(
            &store,
            &identity,
            member,
            members,
            wireguard_port,
            own_endpoints,
        )
    }

    /// Takes the identity a grant gives this (uninitialised) Machine and starts joining: the
    /// phase is `joining` until the store has caught up to the admitting Machine's digest.
    pub fn join(&self, grant: JoinGrant) -> Result<MachineView, MachineError> {
        let state = self.state.lock().expect("machine state poisoned");
        if let Some(existing) = &state.identity {
            return Err(MachineError::AlreadyInitialised {
                name: existing.name.clone(),
                id: existing.id.clone(),
            });
        }
        let pending = PendingJoin::load(&self.dir);
        let matches = pending
            .as_ref()
            .is_some_and(|p| p.id == grant.member.id && p.public_key == grant.member.public_key);
        if !matches {
            return Err(refused(
                "the grant is for another Machine, or this Machine's join key changed since it was asked",
                "start the join again (`ployz machine add` asks this Machine afresh)",
            ));
        }
        let identity = LocalIdentity {
            id: grant.member.id.clone(),
            name: grant.member.name.clone(),
            phase: LocalMachinePhase::Joining,
            cluster_network: grant.network,
            subnet: grant.member.subnet,
            public_key: grant.member.public_key.clone(),
            cluster: Some(grant.cluster.clone()),
            bootstrap: grant.peers.clone(),
            catch_up: grant.catch_up.clone(),
            advertised: Vec::new(),
            wireguard_backend: None,
        };
        let docker = self.connect_docker(&identity)?;
        let store = self.fresh_store(&identity.id)?;
        publish(&store, &identity.info())?;
        publish_public_addresses(&store, PublicAddressMode::Detect)?;
        tracing::info!(machine_id = %identity.id, machine_name = %identity.name, subnet = %identity.subnet, cluster = %grant.cluster, "joining the cluster");
        self.take_identity(state, identity, store, docker)
    }

    /// Brings this Machine's phase and name in line with its store: `joining` becomes
    /// `participating` once the store holds at least the admitting Machine's digest of every
    /// origin; a rename written to its member record elsewhere is taken. Returns the phase when
    /// it changed.
    pub fn settle(&self) -> Result<Option<LocalMachinePhase>, MachineError> {
        let Some(store) = self.store() else {
            return Ok(None);
        };
        let digest = store.digest()?;
        let own = store.get(&member_key(store.local()))?;
        let mut state = self.state.lock().expect("machine state poisoned");
        let Some(identity) = state.identity.as_mut() else {
            return Ok(None);
        };
        let mut changed = false;
        let mut phase_changed = None;
        if identity.phase == LocalMachinePhase::Joining
            && identity
                .catch_up
                .iter()
                .all(|(origin, seq)| digest.get(origin) >= *seq)
        {
            identity.phase = LocalMachinePhase::Participating;
            phase_changed = Some(identity.phase);
            changed = true;
            tracing::info!("caught up with the cluster: participating");
        }
        if let Some(member) = own
            .as_ref()
            .and_then(|r| r.live_value())
            .and_then(|v| serde_json::from_slice::<Member>(v).ok())
        {
            if member.name != identity.name {
                tracing::info!(from = %identity.name, to = %member.name, "machine renamed");
                identity.name = member.name;
                changed = true;
            }
        }
        if changed {
            identity
                .save(&self.dir)
                .map_err(io("writing the identity file"))?;
            let info = identity.info();
            drop(state);
            publish(&store, &info)?;
        }
        Ok(phase_changed)
    }

    /// Records the endpoints this Machine advertises and its WireGuard backend, and publishes
    /// its self-description when they changed, or when `republish` (every 60 s: what this
    /// Machine says about itself is refreshed by it alone).
    pub fn set_mesh_facts(
        &self,
        endpoints: Vec<SocketAddr>,
        backend: &str,
        republish: bool,
    ) -> Result<(), MachineError> {
        let Some(store) = self.store() else {
            return Ok(());
        };
        let mut state = self.state.lock().expect("machine state poisoned");
        let Some(identity) = state.identity.as_mut() else {
            return Ok(());
        };
        let changed = identity.advertised != endpoints
            || identity.wireguard_backend.as_deref() != Some(backend);
        if changed {
            identity.advertised = endpoints;
            identity.wireguard_backend = Some(backend.to_owned());
            identity
                .save(&self.dir)
                .map_err(io("writing the identity file"))?;
        }
        let info = identity.info();
        drop(state);
        if republish && !changed {
            store.put(
                &ployz_store::machines::machine_key(&info.id),
                serde_json::to_vec(&info).expect("machine info serialises"),
            )?;
            return Ok(());
        }
        publish(&store, &info)
    }

    /// The WireGuard peers this Machine should have: every member but itself (and, while
    /// joining, the members its grant named, until the store holds them), each with its
    /// endpoints to try.
    pub fn mesh_members(&self) -> Result<Vec<MeshMember>, MachineError> {
        let identity = self.identity().ok_or(MachineError::NotInitialised)?;
        let store = self.store().ok_or(MachineError::NotInitialised)?;
        let mut members: BTreeMap<MachineId, Member> = roster(&store)?
            .into_iter()
            .map(|m| (m.id.clone(), m))
            .collect();
        if identity.phase == LocalMachinePhase::Joining {
            for m in &identity.bootstrap {
                members.entry(m.id.clone()).or_insert_with(|| m.clone());
            }
        }
        members.remove(&identity.id);
        let infos = infos(&store)?;
        Ok(members
            .into_values()
            .map(|member| {
                let mut endpoints = member.endpoints.clone();
                if let Some(Ok(info)) = infos.get(&member.id) {
                    for e in &info.endpoints {
                        if !endpoints.contains(e) {
                            endpoints.push(*e);
                        }
                    }
                }
                MeshMember { member, endpoints }
            })
            .collect())
    }

    /// Every member this Machine observes: its record, what it published about itself (a
    /// Replicated Observation: possibly stale), and this observer's own judgment of it. A member
    /// whose self-description has not arrived is shown with its member record and phase
    /// `joining`; one whose record does not decode is a failure beside the others.
    pub fn machines(
        &self,
        observed: &BTreeMap<MachineId, PeerObservation>,
    ) -> Result<MachineList, MachineError> {
        let identity = self.identity().ok_or(MachineError::NotInitialised)?;
        let store = self.store().ok_or(MachineError::NotInitialised)?;
        let members = roster(&store)?;
        let collisions = ployz_mesh::join::subnet_collisions(&members);
        let infos = infos(&store)?;
        let mut result = PartialResult::default();
        let mut listed = BTreeSet::new();
        for member in &members {
            listed.insert(member.id.clone());
            let info = match infos.get(&member.id) {
                Some(Err(reason)) => {
                    result.failures.push(TargetFailure {
                        target: member.id.to_string(),
                        reason: reason.clone(),
                    });
                    continue;
                }
                Some(Ok(info)) => MachineInfo {
                    // The member record carries renames made anywhere; the subnet and key are
                    // the ones peers use.
                    name: member.name.clone(),
                    ..info.clone()
                },
                None => MachineInfo {
                    id: member.id.clone(),
                    name: member.name.clone(),
                    phase: LocalMachinePhase::Joining,
                    subnet: member.subnet,
                    public_key: member.public_key.clone(),
                    management_address: member.management_address,
                    endpoints: member.endpoints.clone(),
                    version: String::new(),
                    wireguard_backend: None,
                    edge_features: Vec::new(),
                },
            };
            let seen = observed.get(&member.id).copied().unwrap_or_default();
            let membership = if member.id == identity.id {
                MembershipObservation::Up
            } else {
                seen.membership.unwrap_or(MembershipObservation::Unknown)
            };
            result.values.push(MachineView {
                info,
                membership,
                selected_endpoint: seen.selected_endpoint,
                subnet_collisions: collisions.get(&member.id).cloned().unwrap_or_default(),
            });
        }
        if !listed.contains(&identity.id) {
            // Not in the roster it observes (still joining, or removed): itself all the same.
            result.values.push(MachineView {
                info: identity.info(),
                membership: MembershipObservation::Up,
                selected_endpoint: None,
                subnet_collisions: Vec::new(),
            });
        }
        Ok(result)
    }

    /// The Machine IDs of the roster as this Machine observes it.
    pub fn roster_ids(&self) -> Result<Vec<MachineId>, MachineError> {
        let store = self.store().ok_or(MachineError::NotInitialised)?;
        Ok(roster(&store)?.into_iter().map(|m| m.id).collect())
    }

    /// Machine Names by Machine ID, as the roster holds them (empty before init or when the
    /// store cannot be read: names only label answers).
    pub fn member_names(&self) -> BTreeMap<MachineId, String> {
        let Some(store) = self.store() else {
            return BTreeMap::new();
        };
        let mut names: BTreeMap<MachineId, String> = roster(&store)
            .unwrap_or_default()
            .into_iter()
            .map(|m| (m.id, m.name.to_string()))
            .collect();
        if let Some(identity) = self.identity() {
            names
                .entry(identity.id.clone())
                .or_insert_with(|| identity.name.to_string());
        }
        names
    }

    /// Whether `addr` is the Management Address of a member of the roster this Machine
    /// observes.
    pub fn is_member_address(&self, addr: std::net::Ipv6Addr) -> bool {
        let Some(store) = self.store() else {
            return false;
        };
        // A Machine still joining knows its Cluster by the members it was given (its mesh
        // peers, as `mesh_members` has them) until the roster replicates to it: they may push
        // to it, and reset it (`machine rm` of a join that never finished).
        let bootstrap = self.identity().is_some_and(|i| {
            i.phase == LocalMachinePhase::Joining
                && i.bootstrap
                    .iter()
                    .any(|m| m.management_address.addr() == addr)
        });
        bootstrap
            || roster(&store)
                .map(|members| members.iter().any(|m| m.management_address.addr() == addr))
                .unwrap_or(false)
    }

    /// The member with this ID, as this Machine observes the roster.
    pub fn member(&self, id: &MachineId) -> Result<Member, MachineError> {
        let store = self.store().ok_or(MachineError::NotInitialised)?;
        let record = store.get(&member_key(id))?;
        record
            .as_ref()
            .and_then(|r| r.live_value())
            .and_then(|v| serde_json::from_slice(v).ok())
            .ok_or_else(|| MachineError::NoSuchMember(id.clone()))
    }

    /// Deletes a member's record: every Machine drops it as a peer when the deletion reaches it.
    pub fn remove_member(&self, id: &MachineId) -> Result<Member, MachineError> {
        let store = self.writable_store()?;
        let member = self.member(id)?;
        store.delete(&member_key(id))?;
        tracing::info!(machine_id = %member.id, machine_name = %member.name, "machine removed from the cluster");
        Ok(member)
    }

    /// Changes a member's name or hand-given endpoints.
    pub fn update_member(&self, request: UpdateMachineRequest) -> Result<Member, MachineError> {
        let store = self.writable_store()?;
        let id = match request.id {
            Some(id) => id,
            None => self.identity().ok_or(MachineError::NotInitialised)?.id,
        };
        let mut member = self.member(&id)?;
        if let Some(name) = &request.name {
            member.name = name.parse()?;
        }
        if let Some(endpoints) = request.endpoints {
            member.endpoints = endpoints;
        }
        write_member(&store, &member)?;
        Ok(member)
    }

    /// Resets this Machine to uninitialised (`machine rm` run elsewhere reached it): the phase
    /// turns `resetting`, then its identity, key and store are deleted. The caller restarts the
    /// daemon afterwards, which comes up uninitialised. Containers are not touched here.
    pub fn forget_identity(&self) -> Result<(), MachineError> {
        {
            let mut state = self.state.lock().expect("machine state poisoned");
            if let Some(identity) = state.identity.as_mut() {
                identity.phase = LocalMachinePhase::Resetting;
                identity
                    .save(&self.dir)
                    .map_err(io("writing the identity file"))?;
            }
            if let Some(store) = &state.store {
                let _ = store.flush();
            }
        }
        super::remove_identity_files(&self.dir).map_err(|e| MachineError::Refused {
            message: format!("the reset did not finish: {e}"),
            fix: "fix the data dir's permissions or disk, then restart the daemon: it finishes the reset".into(),
        })?;
        tracing::info!("machine reset to uninitialised");
        Ok(())
    }

    /// Forgets every Machine whose member record was deleted (`machine rm`): its machine-owned
    /// records leave this store, and later ones from it are ignored. This Machine's own
    /// deletion is left to the reset the removing Machine asks for.
    pub fn forget_removed(&self) -> Result<(), MachineError> {
        let Some(store) = self.store() else {
            return Ok(());
        };
        let forgotten = store.forgotten()?;
        for record in store.scan(&KeyPrefix::cluster_namespace(MEMBERS_NAMESPACE))? {
            if !record.tombstone {
                continue;
            }
            let Ok(id) = record.key.name().parse::<MachineId>() else {
                continue;
            };
            if &id == store.local() || forgotten.contains(&id) {
                continue;
            }
            let removed = store.forget_origin(&id)?;
            tracing::info!(machine_id = %id, records = ?removed, "forgot a removed machine's records");
        }
        Ok(())
    }

    /// How many members share their Machine Subnet with another, as this Machine observes the
    /// roster; collisions are logged once per change of the count.
    pub fn subnet_collision_count(&self) -> Result<u64, MachineError> {
        let store = self.store().ok_or(MachineError::NotInitialised)?;
        let collisions = ployz_mesh::join::subnet_collisions(&roster(&store)?);
        Ok(collisions.len() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::{DataDir, KeyPair};

    fn machine(dir: &std::path::Path) -> LocalMachine {
        LocalMachine::open_with(DataDir::new(dir), None, false).unwrap()
    }

    fn admit(entry: &LocalMachine, request: JoinRequest) -> Result<Admission, MachineError> {
        entry.admit(
            AdmitRequest {
                request,
                name: Some("new".into()),
                public_ip: None,
                token_cluster: None,
            },
            51820,
            vec![],
        )
    }

    fn refusal(e: MachineError) -> String {
        match e {
            MachineError::Refused { message, fix } => format!("{message} / {fix}"),
            other => panic!("not a refusal: {other}"),
        }
    }

    #[test]
    fn a_join_is_granted_once_and_the_grant_makes_a_joining_machine() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let entry = machine(a.path());
        entry.init(Some("entry"), vec![]).unwrap();
        let new = machine(b.path());
        let request = new
            .join_request(vec!["198.18.0.2:51820".parse().unwrap()])
            .unwrap();
        assert_eq!(request.phase, LocalMachinePhase::Uninitialized);
        // Asking again offers the same key and ID.
        assert_eq!(
            new.join_request(vec![]).unwrap().public_key,
            request.public_key
        );
        let before = entry.store().unwrap().digest().unwrap();
        let admission = admit(&entry, request.clone()).unwrap();
        let grant = admission.grant;
        assert_eq!(grant.member.subnet.to_string(), "10.210.1.0/24");
        assert_eq!(grant.peers.len(), 1);
        assert!(grant.catch_up.values().sum::<u64>() > before.0.values().sum::<u64>());
        // The same Machine again: refused, nothing written.
        let digest = entry.store().unwrap().digest().unwrap();
        let e = refusal(admit(&entry, request).unwrap_err());
        assert!(
            e.contains("already a member of this Cluster, as 'new'"),
            "{e}"
        );
        assert_eq!(entry.store().unwrap().digest().unwrap(), digest);

        let view = new.join(grant.clone()).unwrap();
        assert_eq!(view.info.phase, LocalMachinePhase::Joining);
        assert_eq!(new.identity().unwrap().cluster, Some(grant.cluster.clone()));
        // Twice: already initialised.
        assert!(matches!(
            new.join(grant),
            Err(MachineError::AlreadyInitialised { .. })
        ));
    }

    #[test]
    fn joins_that_must_not_happen_are_refused_with_the_reason_and_the_fix() {
        let (a, b, c) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let entry = machine(a.path());
        entry.init(Some("entry"), vec![]).unwrap();
        let digest = entry.store().unwrap().digest().unwrap();
        let other = machine(b.path());
        other.init(Some("other"), vec![]).unwrap();
        let fresh = machine(c.path());

        let e = refusal(admit(&entry, other.join_request(vec![]).unwrap()).unwrap_err());
        assert!(
            e.contains("already initialised (participating) and in another Cluster"),
            "{e}"
        );
        assert!(e.contains("ployz machine rm"), "{e}");

        let mut request = fresh.join_request(vec![]).unwrap();
        request.api = API_VERSION + 1;
        request.version = "9.9.9".into();
        let e = refusal(admit(&entry, request).unwrap_err());
        assert!(
            e.contains("speaks API version") && e.contains("9.9.9"),
            "{e}"
        );
        assert!(e.contains("install the same Ployz release"), "{e}");

        let mut request = fresh.join_request(vec![]).unwrap();
        request.public_key = "not a key".into();
        let e = refusal(admit(&entry, request).unwrap_err());
        assert!(e.contains("not a base64 32-byte WireGuard key"), "{e}");

        assert_eq!(
            entry.store().unwrap().digest().unwrap(),
            digest,
            "a refusal wrote"
        );

        // A grant for another Machine is refused by the joining one, which stays uninitialised.
        let grant = admit(&entry, other_request(&fresh)).unwrap().grant;
        let mut forged = grant.clone();
        forged.member.public_key = KeyPair::generate().public_key;
        let e = refusal(fresh.join(forged).unwrap_err());
        assert!(e.contains("the grant is for another Machine"), "{e}");
        assert_eq!(fresh.phase(), LocalMachinePhase::Uninitialized);
    }

    fn other_request(m: &LocalMachine) -> JoinRequest {
        m.join_request(vec![]).unwrap()
    }

    #[test]
    fn a_joining_machine_participates_once_its_store_caught_up() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let entry = machine(a.path());
        entry.init(Some("entry"), vec![]).unwrap();
        let new = machine(b.path());
        let grant = admit(&entry, new.join_request(vec![]).unwrap())
            .unwrap()
            .grant;
        new.join(grant).unwrap();
        assert_eq!(
            new.settle().unwrap(),
            None,
            "participating before catching up"
        );
        // Replicate the entry's records by hand, as the replicator would.
        let from = entry.store().unwrap();
        let to = new.store().unwrap();
        for request in to.digest().unwrap().requests_for(&from.digest().unwrap()) {
            to.apply_batch(&from.records_after(&request, 10_000).unwrap())
                .unwrap();
        }
        assert_eq!(
            new.settle().unwrap(),
            Some(LocalMachinePhase::Participating)
        );
        assert_eq!(new.phase(), LocalMachinePhase::Participating);
        // Its view of the roster: both members, no collision.
        let list = new.machines(&BTreeMap::new()).unwrap();
        assert_eq!(list.values.len(), 2);
        assert!(list.values.iter().all(|v| v.subnet_collisions.is_empty()));
    }
}
