//! The management API's wire format: JSON over HTTP on the daemon's unix socket.
//!
//! **Architecture Invariant:** this module is the only definition of what crosses the API. The
//! daemon serves these types and the CLI reads them; neither defines its own copies.

use serde::{Deserialize, Serialize};

use crate::{
    ClusterNetwork, LocalMachinePhase, MachineId, MachineName, MachineSubnet, ManagementAddress,
    MembershipObservation, PartialResult,
};

/// The API's paths.
pub mod paths {
    /// `GET`: [`super::VersionInfo`].
    pub const VERSION: &str = "/v1/version";
    /// `GET`: [`super::MachineList`].
    pub const MACHINES: &str = "/v1/machines";
    /// `POST` [`super::MachineInitRequest`]: [`super::MachineView`].
    pub const MACHINE_INIT: &str = "/v1/machines/init";
    /// `GET`: this Machine's [`super::PublicAddresses`]; `PUT`
    /// [`super::SetPublicAddressesRequest`]: the addresses now in force.
    pub const MACHINE_PUBLIC_ADDRESSES: &str = "/v1/machines/public-addresses";
    /// `GET`: this Machine's [`super::JoinRequest`] (an uninitialised Machine makes its key
    /// pair and Machine ID on the first call and keeps them until it joins or is initialised).
    pub const JOIN_REQUEST: &str = "/v1/join/request";
    /// `POST` [`super::AdmitRequest`] to a Machine of a Cluster: it admits the requesting Machine
    /// (allocates its Machine Subnet, writes its member record) and answers an
    /// [`super::Admission`].
    pub const MACHINE_ADMIT: &str = "/v1/machines/admit";
    /// `POST` [`super::JoinGrant`] to the admitted Machine: it takes its identity and starts
    /// joining; answers its [`super::MachineView`].
    pub const JOIN: &str = "/v1/join";
    /// `GET`: a [`super::JoinTokenAnswer`], the Join Token of this Machine (`ployz machine
    /// token`).
    pub const JOIN_TOKEN: &str = "/v1/join/token";
    /// `POST` [`super::PendingJoinRequest`] to an uninitialised Machine: it keeps the Join
    /// Token, reaches the inviting Machine over the mesh, and fetches its grant there once a
    /// Machine of that Cluster has admitted it; answers a [`super::PendingJoin`] with the join
    /// request to admit. `GET`: the [`super::PendingJoin`] it waits on (404 when none).
    pub const JOIN_PENDING: &str = "/v1/join/pending";
    /// `POST` [`super::RemoveMachineRequest`]: [`super::RemoveMachineOutcome`].
    pub const MACHINE_REMOVE: &str = "/v1/machines/remove";
    /// `POST` [`super::UpdateMachineRequest`]: the updated [`super::Member`].
    pub const MACHINE_UPDATE: &str = "/v1/machines/update";
    /// `GET`: [`super::MeshStatus`], this Machine's WireGuard interface and peers as it
    /// observes them.
    pub const MESH: &str = "/v1/mesh";
    /// `GET`: [`super::ReconcileStatus`], this Machine's last reconciliation pass per concern
    /// of its plumbing, and the totals.
    pub const RECONCILE: &str = "/v1/reconcile";
    /// `GET`: [`super::StoreDigest`], how much of each origin this Machine's store holds.
    pub const STORE_DIGEST: &str = "/v1/store/digest";
    /// `GET`: [`super::ScratchRecord`]s; `PUT` [`super::PutScratchRequest`]: writes them;
    /// `DELETE ?name=NAME`: deletes one.
    pub const STORE_SCRATCH: &str = "/v1/store/scratch";
    /// `GET ?service=ID`: the [`super::ServiceRevision`]s kept of one Service, oldest first;
    /// `POST` [`super::RecordRevisionRequest`] records one (and drops all but the newest
    /// [`super::KEPT_REVISIONS`]).
    pub const REVISIONS: &str = "/v1/revisions";
    /// `GET`: [`crate::CertificateSummary`]s; `POST` [`super::ImportCertificateRequest`]
    /// stores Certificate Material.
    pub const CERTIFICATES: &str = "/v1/certificates";
    /// `GET`: the [`crate::CertificatePolicy`] as set (the HMAC key withheld); `PUT`
    /// [`super::SetCertificatePolicyRequest`]: the policy now in force; `DELETE`: back to the
    /// built-in defaults.
    pub const CERTIFICATE_POLICY: &str = "/v1/certificates/policy";
    /// `GET ?name=NAME&type=A`: what this Machine's internal DNS would answer, a
    /// [`super::LookupAnswer`].
    pub const DNS_LOOKUP: &str = "/v1/dns/lookup";
    /// `GET`: the routes this Machine's edge serves now ([`super::EdgeRoutes`]).
    pub const ROUTES: &str = "/v1/routes";
    /// `GET`: the Service Gates; `PUT` ([`super::SetGateRequest`]): set one; `DELETE
    /// ?service=ID`: lift it.
    pub const GATES: &str = "/v1/gates";
    /// `GET`: [`crate::CertificateStatus`]es, one per hostname (the newest of any issuer's).
    pub const CERTIFICATE_STATUS: &str = "/v1/certificates/status";
}

/// Version of the wire format; bumped on an incompatible change.
pub const API_VERSION: u32 = 1;

/// The largest request body the daemon reads (2 MiB); a larger one is refused with 413, and the
/// CLI refuses to send one, naming this limit.
pub const MAX_BODY_BYTES: usize = 2 * 1024 * 1024;

/// What a daemon says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VersionInfo {
    /// The daemon's release (`CARGO_PKG_VERSION`).
    pub version: String,
    /// The wire format it speaks ([`API_VERSION`]).
    pub api: u32,
    /// The answering Machine's own phase.
    pub phase: LocalMachinePhase,
    /// The answering Machine, once initialised.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub machine: Option<MachineId>,
}

/// What a Machine publishes about itself, as a machine-owned record in the store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineInfo {
    pub id: MachineId,
    pub name: MachineName,
    /// The Machine's own phase when it last wrote this record.
    pub phase: LocalMachinePhase,
    pub subnet: MachineSubnet,
    /// The WireGuard public key, base64 as `wg` prints it.
    pub public_key: String,
    pub management_address: ManagementAddress,
    /// The endpoints it advertises for WireGuard (its interface addresses with its WireGuard
    /// port); what peers try after the endpoints given by hand.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub endpoints: Vec<std::net::SocketAddr>,
    /// Its daemon's release, when it said.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// Its WireGuard backend (`kernel` or `userspace`), once its mesh runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wireguard_backend: Option<String>,
    /// The Edge Features its edge enforces ([`crate::EdgeFeature`] names; a later release may
    /// publish names this one does not know). Empty from a daemon older than Edge Features.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub edge_features: Vec<String>,
}

impl MachineInfo {
    /// The Edge Features it publishes, when this is a record the Machine wrote itself (a roster
    /// entry standing in for a Machine that has not published yet says nothing of them).
    pub fn published_edge_features(&self) -> Option<&[String]> {
        (!self.version.is_empty()).then_some(self.edge_features.as_slice())
    }
}

/// One Machine as the answering Machine observes it: what that Machine published plus the
/// observer's Membership Observation of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineView {
    #[serde(flatten)]
    pub info: MachineInfo,
    pub membership: MembershipObservation,
    /// Where this observer reaches it over WireGuard (its Selected Endpoint), when it is a peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected_endpoint: Option<std::net::SocketAddr>,
    /// Other Machines whose Machine Subnet is the same as this one's (after concurrent joins
    /// through different Machines): a collision to resolve by removing one of them and adding it
    /// again. Empty when the subnet is its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnet_collisions: Vec<MachineId>,
}

/// A Machine of the Cluster as the member roster holds it: the cluster-scoped record the
/// admitting Machine wrote when it joined (changed by `machine rename` and `machine update`,
/// deleted by `machine rm`). Every Machine makes a WireGuard peer of every member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub id: MachineId,
    pub name: MachineName,
    pub subnet: MachineSubnet,
    /// The WireGuard public key, base64 as `wg` prints it.
    pub public_key: String,
    pub management_address: ManagementAddress,
    /// Endpoints given by hand (`--public-ip` at join, `machine update --endpoint`), tried before
    /// the ones the Machine advertises itself.
    #[serde(default)]
    pub endpoints: Vec<std::net::SocketAddr>,
}

/// What a Machine that wants to join says about itself (`GET` [`paths::JOIN_REQUEST`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinRequest {
    /// The daemon's release.
    pub version: String,
    /// The wire format it speaks ([`API_VERSION`]).
    pub api: u32,
    /// Its phase: only an uninitialised Machine can join.
    pub phase: LocalMachinePhase,
    /// The Cluster it is in, when it is in one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<crate::ClusterId>,
    /// The Machine ID it will take.
    pub id: MachineId,
    /// Its WireGuard public key.
    pub public_key: String,
    /// The endpoints it advertises (interface addresses and the WireGuard port).
    pub endpoints: Vec<std::net::SocketAddr>,
    /// Its hostname, the Machine Name when none is given.
    pub hostname: String,
}

/// `POST` [`paths::MACHINE_ADMIT`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmitRequest {
    pub request: JoinRequest,
    /// The Machine Name to give it; absent: its sanitised hostname.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its public address (`--public-ip`): tried first as its endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_ip: Option<std::net::IpAddr>,
    /// The Cluster of the Join Token the request answers, when it came through one: a Machine
    /// of another Cluster refuses it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_cluster: Option<crate::ClusterId>,
}

/// What `ployz machine token` prints, decoded: the Cluster a Machine is invited to and the
/// inviting Machine, enough for the invited one to reach it over WireGuard. Not a secret: it
/// grants nothing. The admission is made on a Machine of the Cluster, by someone who can reach
/// its socket (`ployz machine join REQUEST` there).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JoinToken {
    /// The Cluster.
    pub cluster: crate::ClusterId,
    /// The inviting Machine.
    pub machine: MachineId,
    /// Its Machine Name, for messages.
    pub name: String,
    /// Its WireGuard public key (base64).
    pub public_key: String,
    /// Its Machine Subnet (routed to it once it is a peer).
    pub subnet: MachineSubnet,
    /// Its WireGuard endpoints: given by hand and public first, then advertised.
    pub endpoints: Vec<std::net::SocketAddr>,
    /// The wire format its daemon speaks ([`API_VERSION`]).
    pub api: u32,
    /// Its daemon's release.
    pub version: String,
}

/// Why a text is not a Join Token or a join request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TokenError {
    /// The text does not start with the prefix.
    #[error("not {what}: it does not start with '{prefix}'; copy the whole line {source_command} printed")]
    Prefix {
        what: &'static str,
        prefix: &'static str,
        source_command: &'static str,
    },
    /// The text after the prefix is not what it should be.
    #[error("not {what}: {reason}; copy the whole line {source_command} printed (it is one line, with no spaces)")]
    Garbled {
        what: &'static str,
        reason: String,
        source_command: &'static str,
    },
}

/// The prefix of a Join Token's text form.
pub const JOIN_TOKEN_PREFIX: &str = "ployz-join-token:";
/// The prefix of a join request's text form.
pub const JOIN_REQUEST_PREFIX: &str = "ployz-join-request:";

fn encode_text<T: Serialize>(prefix: &str, value: &T) -> String {
    use base64::Engine as _;
    let json = serde_json::to_vec(value).expect("the token types serialise");
    format!(
        "{prefix}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json)
    )
}

fn decode_text<T: serde::de::DeserializeOwned>(
    text: &str,
    prefix: &'static str,
    what: &'static str,
    source_command: &'static str,
) -> Result<T, TokenError> {
    use base64::Engine as _;
    let garbled = |reason: String| TokenError::Garbled {
        what,
        reason,
        source_command,
    };
    let body = text.trim().strip_prefix(prefix).ok_or(TokenError::Prefix {
        what,
        prefix,
        source_command,
    })?;
    let json = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(body)
        .map_err(|e| garbled(format!("the text after the prefix is not base64url ({e})")))?;
    serde_json::from_slice(&json).map_err(|e| garbled(format!("the decoded text is not one ({e})")))
}

impl JoinToken {
    /// The one-line text form: [`JOIN_TOKEN_PREFIX`] and the base64url of the JSON.
    pub fn to_text(&self) -> String {
        encode_text(JOIN_TOKEN_PREFIX, self)
    }

    /// Reads [`JoinToken::to_text`]'s form (surrounding whitespace ignored).
    pub fn from_text(text: &str) -> Result<JoinToken, TokenError> {
        decode_text(
            text,
            JOIN_TOKEN_PREFIX,
            "a Ployz Join Token",
            "`ployz machine token`",
        )
    }
}

impl AdmitRequest {
    /// The one-line text form an invited Machine prints (`ployz machine join TOKEN`):
    /// [`JOIN_REQUEST_PREFIX`] and the base64url of the JSON.
    pub fn to_text(&self) -> String {
        encode_text(JOIN_REQUEST_PREFIX, self)
    }

    /// Reads [`AdmitRequest::to_text`]'s form (surrounding whitespace ignored).
    pub fn from_text(text: &str) -> Result<AdmitRequest, TokenError> {
        decode_text(
            text,
            JOIN_REQUEST_PREFIX,
            "a Ployz join request",
            "`ployz machine join TOKEN` on the new Machine",
        )
    }
}

/// The answer to `GET` [`paths::JOIN_TOKEN`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinTokenAnswer {
    /// The text to hand to the new Machine.
    pub text: String,
    /// What it says.
    pub token: JoinToken,
}

/// `POST` [`paths::JOIN_PENDING`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PendingJoinRequest {
    /// The Join Token's text.
    pub token: String,
    /// The Machine Name this Machine asks for; absent: its sanitised hostname.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Its public address: tried first as its WireGuard endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub public_ip: Option<std::net::IpAddr>,
}

/// An uninitialised Machine waiting to be admitted through a Join Token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingJoin {
    /// The Join Token it holds.
    pub token: JoinToken,
    /// The join request's text, for a Machine of the Cluster to admit.
    pub request_text: String,
    /// What it asks for.
    pub request: AdmitRequest,
    /// What its last try to fetch its grant from the inviting Machine met, if it tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_attempt: Option<String>,
}

/// What the admitting Machine hands the joining one.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JoinGrant {
    pub cluster: crate::ClusterId,
    pub network: ClusterNetwork,
    /// The joining Machine's own member record.
    pub member: Member,
    /// Every other member the admitting Machine observes, itself included: the joining
    /// Machine's first peers.
    pub peers: Vec<Member>,
    /// The admitting Machine's store digest (per origin, the highest sequence it holds): the
    /// joining Machine is `joining` until its store has caught up to it.
    pub catch_up: std::collections::BTreeMap<MachineId, u64>,
    /// The WireGuard port the admitting Machine's peers listen on.
    pub wireguard_port: u16,
}

/// The answer to [`AdmitRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Admission {
    pub grant: JoinGrant,
    /// Things the admitting Machine noticed that do not stop the join (a Machine Name another
    /// Machine already has).
    #[serde(default)]
    pub warnings: Vec<String>,
}

/// `POST` [`paths::MACHINE_REMOVE`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemoveMachineRequest {
    pub id: MachineId,
    /// Stop and remove its Service Containers too when it is reachable (default: they keep
    /// running, outside any Cluster).
    #[serde(default)]
    pub stop_containers: bool,
}

/// What `machine rm` did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoveMachineOutcome {
    pub id: MachineId,
    pub name: MachineName,
    /// Whether the Machine was reached and reset to uninitialised; when not, why.
    pub reset: Result<(), String>,
}

/// `POST` [`paths::MACHINE_UPDATE`]: every field absent is left as it is.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UpdateMachineRequest {
    #[serde(default)]
    pub id: Option<MachineId>,
    /// A new Machine Name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Replaces the endpoints given by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoints: Option<Vec<std::net::SocketAddr>>,
}

/// How much of each origin this Machine's store holds (`ployz store digest`): equal digests on
/// two Machines mean equal stores.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoreDigest {
    /// Per origin Machine, the highest sequence incorporated.
    pub digest: std::collections::BTreeMap<MachineId, u64>,
    /// Per origin, remote records not merged because they were stamped too far ahead of this
    /// Machine's clock (`mesh.max_clock_drift_ms`).
    #[serde(default)]
    pub clock_refusals: std::collections::BTreeMap<MachineId, u64>,
    /// Machines removed from the Cluster whose records this store dropped.
    #[serde(default)]
    pub forgotten: Vec<MachineId>,
    /// How far this Machine's clock went back behind its own timestamps (milliseconds), when
    /// beyond the drift bound: the others refuse its writes until it catches up.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_went_back_ms: Option<u64>,
}

/// One record of the scratch namespace (`ployz store put`): cluster-scoped values nothing in
/// Ployz reads, for checking replication by hand.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScratchRecord {
    pub name: String,
    pub value: String,
    /// The Machine whose write wins for the name.
    pub origin: MachineId,
    /// Its hybrid-logical-clock timestamp, `wall_ms.counter`.
    pub hlc: String,
}

/// `PUT` [`paths::STORE_SCRATCH`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PutScratchRequest {
    /// Name to value; each is one write.
    pub values: std::collections::BTreeMap<String, String>,
}

/// How many revisions of each Service the store keeps (`ployz history`).
pub const KEPT_REVISIONS: usize = 5;

/// The most revisions of one Service a Compose file may ask to keep (`x-revisions`).
pub const MAX_KEPT_REVISIONS: usize = 100;

/// One Resolved Service Spec that ran, kept in the cluster-scoped store after a Deploy that
/// changed the Service (`ployz history`, `ployz rollback`): an observation of what ran, never a
/// plan. Secrets are in it by digest only.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServiceRevision {
    pub service_id: crate::ServiceId,
    /// Numbered from 1 per Service, in the order they were recorded.
    pub revision: u64,
    /// Unix seconds on the recording Machine's clock.
    pub recorded_at: u64,
    /// Who deployed it: `user@host` of the CLI.
    pub by: String,
    /// `sha256` of the spec, shortened (as `ployz history` shows it).
    pub spec_digest: String,
    pub spec: crate::ServiceSpec,
}

/// `POST` [`paths::REVISIONS`]: record `spec` as the Service's newest revision, unless the
/// newest already has its digest (the daemon computes it).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordRevisionRequest {
    pub service_id: crate::ServiceId,
    pub by: String,
    pub spec: crate::ServiceSpec,
}

/// This Machine's WireGuard interface and its peers, as it observes them (`ployz wg show`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshStatus {
    /// The interface's name.
    pub interface: String,
    /// `kernel` or `userspace`.
    pub backend: String,
    pub public_key: String,
    pub listen_port: u16,
    pub mtu: u32,
    pub management_address: ManagementAddress,
    pub peers: Vec<MeshPeer>,
    /// How the userspace device moves packets, and how fast it has; absent with the kernel
    /// module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datapath: Option<MeshDataPath>,
}

/// The userspace WireGuard device's offloads and throughput on one Machine, since its daemon
/// started. Rates are encrypted bytes per second over the last observation interval; peaks are
/// the highest such rate seen.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshDataPath {
    /// The TUN interface hands over and takes back TCP segments of up to 64 KiB.
    pub tun_offload: bool,
    /// UDP sends are segmented by the kernel (GSO).
    pub udp_gso: bool,
    /// UDP receives are coalesced by the kernel (GRO).
    pub udp_gro: bool,
    pub bytes_sent: u64,
    pub bytes_received: u64,
    pub packets_sent: u64,
    pub packets_received: u64,
    /// System calls that moved packets: TUN reads and writes, UDP sends and receives.
    pub tun_reads: u64,
    pub tun_writes: u64,
    pub udp_sends: u64,
    pub udp_receives: u64,
    /// Packets dropped: to an address no peer holds, to a peer without an endpoint, or not
    /// valid WireGuard from a peer.
    pub dropped: u64,
    pub send_rate: u64,
    pub receive_rate: u64,
    pub peak_send_rate: u64,
    pub peak_receive_rate: u64,
}

/// What one Machine's daemon last did to keep its own plumbing (interface, peers, routes,
/// firewall, Docker network, DNS listener, Machine record) as it should be (`ployz machine
/// status`): Live Observation of that Machine's record of its passes, as of `observed_at`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReconcileStatus {
    /// The Machine whose passes these are (the one that answered).
    pub machine: MachineId,
    pub machine_name: MachineName,
    /// Seconds between timer passes (`reconcile.interval_secs`).
    pub interval_secs: u64,
    /// Unix seconds on the answering Machine's clock when this was read.
    pub observed_at: u64,
    /// One entry per concern it reconciles, in a fixed order.
    pub concerns: Vec<ConcernStatus>,
}

/// One concern's last pass and its totals since the daemon started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConcernStatus {
    /// `interface`, `peers`, `routes`, `firewall`, `docker_network`, `dns_listener` or
    /// `machine_record`.
    pub concern: String,
    /// The last pass; `None` before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<ConcernPass>,
    /// Passes run.
    pub passes: u64,
    /// Passes that found drift and corrected it.
    pub corrections: u64,
    /// Passes that could not observe or correct.
    pub failures: u64,
}

/// One pass of one concern.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConcernPass {
    /// Seconds before `observed_at` the pass ended.
    pub secs_ago: u64,
    /// What started it: `start`, `declaration`, `timer` or `reconnect: ...`.
    pub trigger: String,
    pub outcome: ReconcileOutcome,
}

/// What one pass found and did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReconcileOutcome {
    /// What is there is what should be: nothing done.
    InSync,
    /// Drift found and corrected.
    Corrected { found: String, done: String },
    /// It could not observe or correct; tried again at the next pass.
    CouldNot { error: String },
}

/// One WireGuard peer as this Machine observes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MeshPeer {
    pub id: MachineId,
    pub name: MachineName,
    pub public_key: String,
    pub subnet: MachineSubnet,
    /// The endpoint this Machine selected for it, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected_endpoint: Option<std::net::SocketAddr>,
    /// `unknown`, `up` or `down`: the Selected Endpoint's state.
    pub endpoint_status: String,
    /// Every endpoint it advertises, in the order they are tried.
    pub endpoints: Vec<std::net::SocketAddr>,
    /// Seconds since the last WireGuard handshake, when there was one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_handshake_secs: Option<u64>,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    /// This Machine's Membership Observation of it.
    pub membership: MembershipObservation,
}

impl crate::Identified for MachineView {
    fn id(&self) -> &str {
        self.info.id.as_str()
    }
    fn name(&self) -> &str {
        self.info.name.as_str()
    }
}

/// `ployz machine ls`: every Machine the answering Machine observes, with per-Machine failures.
pub type MachineList = PartialResult<MachineView>;

/// `ployz machine init`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MachineInitRequest {
    /// The Machine Name; the daemon uses its sanitised hostname when absent. Validated by the
    /// daemon so that a bad one is refused with the rule it broke.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The Machine's public addresses (what Ingress Hostnames should resolve to); empty: the
    /// daemon detects them from its interfaces.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub public_addresses: Vec<std::net::IpAddr>,
}

/// A Machine's public addresses, which the Cluster DNS Verdict compares an Ingress Hostname's
/// addresses with. A machine-owned record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PublicAddresses {
    pub addresses: Vec<std::net::IpAddr>,
    /// Detected from the Machine's interfaces (global unicast addresses) rather than given with
    /// `--public-ip`; detected addresses are detected again at every daemon start.
    #[serde(default)]
    pub detected: bool,
}

/// `PUT` [`paths::MACHINE_PUBLIC_ADDRESSES`]: replace this Machine's public addresses; empty
/// means detect them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetPublicAddressesRequest {
    #[serde(default)]
    pub addresses: Vec<std::net::IpAddr>,
}

/// How a caller should react to a failed API call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorCode {
    /// The request is wrong; fix the named field.
    InvalidArgument,
    /// The Machine is not in a phase where this makes sense (e.g. `init` twice).
    FailedPrecondition,
    /// The thing asked for does not exist.
    NotFound,
    /// Try again later.
    Unavailable,
    /// A fault in the daemon; its log says more.
    Internal,
}

/// The body of every non-2xx answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiError {
    pub code: ErrorCode,
    /// What went wrong, in one sentence naming the field and value.
    pub message: String,
    /// What to do about it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hint: Option<String>,
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        if let Some(hint) = &self.hint {
            write!(f, "; {hint}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApiError {}

/// Paths of the Machine's Docker operations. `{id}` is a full Container ID.
pub mod docker_paths {
    /// `GET`: the Machine's [`crate::MachineSnapshot`] (Live Observation).
    pub const SNAPSHOT: &str = "/v1/snapshot";
    /// `GET`: every managed container ([`crate::ContainerRuntimeObservation`]s);
    /// `POST` [`super::RunContainerRequest`]: create and start a Service Container.
    pub const CONTAINERS: &str = "/v1/containers";
    /// `GET` one container; `DELETE` removes it.
    pub const CONTAINER: &str = "/v1/containers/{id}";
    /// `POST`: start a stopped container.
    pub const CONTAINER_START: &str = "/v1/containers/{id}/start";
    /// `POST` [`super::StopContainerRequest`].
    pub const CONTAINER_STOP: &str = "/v1/containers/{id}/stop";
    /// `POST` [`super::DrainRequest`]: mark draining, wait until this Machine's edge no longer
    /// routes to it and its in-flight requests finished: [`super::DrainResult`]. `DELETE` lifts
    /// the mark.
    pub const CONTAINER_DRAIN: &str = "/v1/containers/{id}/drain";
    /// `GET ?tail=N&follow=bool&since=T&until=T`: the log as plain text, streamed.
    pub const CONTAINER_LOGS: &str = "/v1/containers/{id}/logs";
    /// `POST` [`super::ExecRequest`]: [`super::ExecResult`].
    pub const CONTAINER_EXEC: &str = "/v1/containers/{id}/exec";
    /// `POST` [`super::RunHookRequest`]: [`super::HookResult`].
    pub const HOOKS: &str = "/v1/hooks";
    /// `GET`: the Container Runtime Observations the store holds, of every Machine
    /// (Replicated Observation: possibly stale).
    pub const STORED_CONTAINERS: &str = "/v1/store/containers";
    /// `GET`: the Machine's [`crate::DockerVolume`]s; `POST` [`crate::VolumeSpec`] creates one.
    pub const VOLUMES: &str = "/v1/volumes";
    /// `DELETE ?force=bool`.
    pub const VOLUME: &str = "/v1/volumes/{name}";
    /// `GET`: every [`crate::DrainMark`] the store holds, of every Machine (Replicated
    /// Observation).
    pub const DRAINS: &str = "/v1/drains";
    /// The Machine lease. `GET`: its holder (`null` when free); `POST`
    /// [`super::LeaseRequest`]: [`super::LeaseAnswer`] (granted, or who holds it); `PUT` with
    /// the token in [`super::LEASE_TOKEN_HEADER`]: renews it, [`super::LeaseHolder`]; `DELETE`
    /// with the token: releases it.
    pub const LEASE: &str = "/v1/lease";
    /// `GET`: the Machine's [`super::ImageSummary`]s; `DELETE ?reference=R&force=bool`:
    /// removes one ([`super::RemovedImage`]).
    pub const IMAGES: &str = "/v1/images";
    /// `GET ?reference=R`: the [`super::ImageOffer`] this Machine would make of its image `R`
    /// (ID, layers, tags); 404 when it has none.
    pub const IMAGE_DESCRIBE: &str = "/v1/images/describe";
    /// `POST` [`super::ImageOffer`]: [`super::OfferAnswer`], whether the Machine has the image
    /// (then its tags are applied) or which of its layers it lacks.
    pub const IMAGE_OFFERS: &str = "/v1/images/offers";
    /// `POST ?id=sha256:...` with a body streamed as it is made: the image as `docker save`
    /// writes it, only the layers the offer's answer named, compressed with zstd
    /// (`application/zstd`): [`super::LoadedImage`] once Docker loaded it and it has that ID.
    pub const IMAGE_LOAD: &str = "/v1/images/load";
    /// `POST` [`super::PeerPullRequest`]: this Machine fetches an image from another Machine
    /// over the mesh (only the layers it lacks): [`super::PeerPullAnswer`].
    pub const IMAGE_PULL_FROM_PEER: &str = "/v1/images/pull-from-peer";
    /// `GET ?id=sha256:...&skip=sha256:...,...`: the image as [`IMAGE_LOAD`] takes it, without
    /// the layers named in `skip` (another Machine's share of a peer pull).
    pub const IMAGE_EXPORT: &str = "/v1/images/export";

    /// A path with `{id}` or `{name}` filled in.
    pub fn fill(template: &str, value: &str) -> String {
        template.replace("{id}", value).replace("{name}", value)
    }
}

/// Percent-encodes a query-string value (everything but letters, digits and `-._~`).
pub fn query_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// One image on a Machine, as `ployz image ls` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSummary {
    /// `sha256:` and 64 hexadecimal digits.
    pub id: String,
    /// `repo:tag` references; empty for an untagged image.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Bytes on disk, shared layers counted in full.
    pub size: u64,
    /// When it was built (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created: Option<String>,
    /// Containers using it, when Docker counted them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub containers: Option<u64>,
}

/// An image offered to a Machine before it is sent: its ID, its layers (diff IDs, bottom
/// first) and the tags it should carry there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageOffer {
    pub id: String,
    pub layers: Vec<String>,
    #[serde(default)]
    pub tags: Vec<String>,
}

/// A Machine's answer to an [`ImageOffer`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OfferAnswer {
    /// The Machine has the image (by ID); the offer's tags now point at it.
    pub present: bool,
    /// The diff IDs of the layers to send (none when present), each once.
    #[serde(default)]
    pub missing: Vec<String>,
}

/// An image that arrived and was loaded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoadedImage {
    pub id: String,
    #[serde(default)]
    pub tags: Vec<String>,
    /// Bytes received (compressed, as they crossed the network).
    pub received: u64,
}

/// The answer to removing an image: what Docker untagged and deleted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemovedImage {
    #[serde(default)]
    pub untagged: Vec<String>,
    #[serde(default)]
    pub deleted: Vec<String>,
}

/// Fetch an image from another Machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerPullRequest {
    /// The reference the plan names (`app:1.2`); the peer resolves it to its image ID.
    pub image: String,
    /// The Machine that has it.
    pub from: crate::MachineId,
}

/// What a peer pull did.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerPullAnswer {
    pub id: String,
    /// Already here: nothing was sent.
    pub present: bool,
    /// Layers fetched, of the image's.
    pub layers_sent: usize,
    pub layers: usize,
    /// Bytes received over the mesh (compressed).
    pub received: u64,
}

/// Create and start one Service Container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunContainerRequest {
    pub service_id: crate::ServiceId,
    pub spec: crate::ServiceSpec,
    /// The Plan ID of the bound Deploy (`ployz deploy --plan-id`) that runs this container;
    /// carried in its `ployz.plan-id` label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_id: Option<String>,
    /// For pulling the spec's image from a private registry (`--with-registry-auth`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_auth: Option<RegistryAuth>,
}

/// Credentials for pulling an image from a private registry, passed with a call that may pull
/// (`ployz deploy --with-registry-auth`, from the CLI's Docker credentials) and used for that
/// pull alone: never stored, logged or shown (`Debug` hides them).
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryAuth {
    /// The registry, as Docker names it (`registry.example.com:5000`, or
    /// `https://index.docker.io/v1/` for Docker Hub).
    pub server: String,
    #[serde(default)]
    pub username: String,
    #[serde(default)]
    pub password: String,
    /// An identity token in place of a password (`docker login` with a credential helper).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity_token: Option<String>,
}

impl std::fmt::Debug for RegistryAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryAuth")
            .field("server", &self.server)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// Stop a container.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopContainerRequest {
    /// Seconds before SIGKILL; the container's own stop timeout when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
}

/// Run a command inside a container, to completion.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExecRequest {
    pub command: Vec<String>,
}

/// What a command run inside a container ended with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExecResult {
    pub exit_code: i64,
    pub stdout: String,
    pub stderr: String,
}

/// Run a Service's pre-deploy hook.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunHookRequest {
    pub service_id: crate::ServiceId,
    pub spec: crate::ServiceSpec,
    pub hook: crate::PreDeployHook,
    /// As [`RunContainerRequest::registry_auth`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_auth: Option<RegistryAuth>,
}

/// What a pre-deploy hook ended with.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookResult {
    pub container: crate::ContainerRef,
    /// `None` when it was stopped at its timeout.
    pub exit_code: Option<i64>,
    pub logs: Vec<String>,
}

/// Store Certificate Material for one Ingress Hostname.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImportCertificateRequest {
    pub hostname: String,
    pub chain_pem: String,
    pub key_pem: String,
}

/// Change the Certificate Policy: the fields `policy` sets replace the stored ones (or the
/// defaults, with `reset`); the daemon validates the result before storing it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SetCertificatePolicyRequest {
    pub policy: crate::CertificatePolicy,
    #[serde(default)]
    pub reset: bool,
}

/// Drain a container before it is stopped.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DrainRequest {
    /// How long to wait for in-flight requests (default 30 s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<u64>,
}

/// What a drain waited for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainResult {
    /// Milliseconds until the edge stopped routing to it and its requests finished.
    pub waited_ms: u64,
    /// Requests still in flight when the timeout ended the wait (0 normally).
    pub in_flight_left: usize,
    /// The Machines (by Name) observed up whose edges did not report the drain applied with
    /// nothing in flight before the timeout (empty normally).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unconfirmed: Vec<String>,
}

/// The header that carries a Machine lease's fencing token on every call its holder makes. A
/// call that changes the Machine's containers or volumes with a token that is not the current
/// holder's is refused, and so is one without a token while the lease is held.
pub const LEASE_TOKEN_HEADER: &str = "x-ployz-lease";

/// The Machines a call is for (Machine Targets resolved to Machine IDs): one Machine ID, and
/// the daemon reached forwards the call to that Machine over the mesh and answers what it
/// answered; several, comma-separated, or `*` (every Machine the daemon reached observes, itself
/// included), and it asks each at once (`GET` only) and answers a [`FanOutAnswer`]. Absent:
/// the daemon reached.
pub const MACHINE_TARGET_HEADER: &str = "x-ployz-machine";

/// One Machine's answer within a [`FanOutAnswer`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineAnswer {
    /// The Machine that answered.
    pub machine: MachineId,
    /// Its Machine Name, as the daemon reached observes it.
    pub name: String,
    /// What it answered (the route's own JSON).
    pub answer: serde_json::Value,
}

/// A call fanned out to several Machines: each one's answer, and per Machine that failed or
/// did not answer within the per-Machine timeout, why (a Partial Result).
pub type FanOutAnswer = PartialResult<MachineAnswer>;

/// Ask for the Machine lease: one command at a time changes a Machine's containers and volumes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    /// Who asks: user, host and process (`alice@build-1 (pid 4242)`).
    pub holder: String,
    /// What for, as the holder's command describes it (`deploy of web, worker`).
    pub command: String,
}

/// Who holds a Machine lease, as the answering daemon sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseHolder {
    /// The fencing token: higher than any the Machine issued before, across daemon restarts.
    pub token: u64,
    pub holder: String,
    pub command: String,
    /// When it was granted, milliseconds since the Unix epoch.
    pub since_ms: u64,
    /// How long it has been held.
    pub held_ms: u64,
    /// How long the lease lasts after its holder's last call (it renews with every call).
    pub ttl_ms: u64,
}

impl std::fmt::Display for LeaseHolder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.since_ms / 1000;
        write!(
            f,
            "{}, running `{}`, since {:02}:{:02}:{:02} UTC ({} s)",
            self.holder,
            self.command,
            secs / 3600 % 24,
            secs / 60 % 60,
            secs % 60,
            self.held_ms / 1000
        )
    }
}

/// A command whose Machine lease ended without its release: it was killed, or its lease lapsed
/// and it was cut off. The daemon keeps the record (the newest few), so a later command knows
/// which containers were made by work that never finished (their `ployz.lease-token` label).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterruptedLease {
    /// The lease's fencing token.
    pub token: u64,
    pub holder: String,
    pub command: String,
    /// When it was granted, milliseconds since the Unix epoch.
    pub since_ms: u64,
}

impl std::fmt::Display for InterruptedLease {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secs = self.since_ms / 1000;
        write!(
            f,
            "`{}` by {} (lease {}, granted {:02}:{:02}:{:02} UTC, never released)",
            self.command,
            self.holder,
            self.token,
            secs / 3600 % 24,
            secs / 60 % 60,
            secs % 60,
        )
    }
}

/// Sets a Service Gate (`ployz service maintenance` / `pause`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SetGateRequest {
    pub service_id: crate::ServiceId,
    pub service_name: crate::ServiceName,
    pub gate: GateRequest,
    /// Who asks (`user@host`).
    pub set_by: String,
}

/// The gate asked for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "gate", rename_all = "snake_case")]
pub enum GateRequest {
    /// Answer the Service's requests 503 with a page carrying `message`.
    Maintenance { message: String },
    /// Hold its new requests for up to `seconds` (1 to 300), or until lifted.
    Paused { seconds: u64 },
}

/// The routes one Machine's edge serves now (`ployz routes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeRoutes {
    /// The generation of the route table.
    pub generation: u64,
    /// By hostname, then path.
    pub routes: Vec<EdgeRouteView>,
    /// The Ingress Ports, by port and protocol.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress_ports: Vec<EdgeIngressPortView>,
}

/// One Ingress Port of an edge: what it listens on, the Service, and its upstreams.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeIngressPortView {
    pub port: u16,
    pub protocol: crate::HostProtocol,
    /// The Service by name.
    pub service: String,
    /// Why this edge is not listening on it, when it is not (the port is taken on the Machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_listening: Option<String>,
    /// Serving Containers, in the order the edge prefers them.
    pub upstreams: Vec<EdgeUpstreamView>,
}

/// One route of an edge: which paths of a hostname, the Service, and its upstreams.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeRouteView {
    pub hostname: String,
    pub path: crate::PathMatch,
    /// The Service by name.
    pub service: String,
    /// The prefix is cut from the path before it goes upstream (`strip_prefix`).
    pub strips: bool,
    /// Plain HTTP is redirected to HTTPS.
    pub https: bool,
    /// The Service's gate, `maintenance` or `paused`, if one stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<String>,
    /// The redirect the edge answers instead (the request's path and query follow the
    /// target).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub redirect: Option<crate::Redirect>,
    /// The route's rules the edge applies, in words (`basic auth 'Staff'`, `timeout 90s`,
    /// `allow 2 networks`, ...).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<String>,
    /// Serving Containers, in the order the edge prefers them.
    pub upstreams: Vec<EdgeUpstreamView>,
}

/// One upstream of a route, as the edge sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeUpstreamView {
    /// The Container Address and port.
    pub address: String,
    pub container_id: crate::ContainerId,
    /// On this Machine.
    pub local: bool,
    /// On a Machine this Machine observes down: tried only when no other is left.
    pub on_down_machine: bool,
    /// A connection to it failed lately: skipped for a few seconds.
    pub failing: bool,
    /// Requests this edge has in flight to it.
    pub in_flight: usize,
}

/// The answer to a [`LeaseRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "lease", rename_all = "snake_case")]
pub enum LeaseAnswer {
    /// The lease is the asker's; `took_over` is the holder whose lease had lapsed.
    Granted {
        holder: LeaseHolder,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        took_over: Option<LeaseHolder>,
    },
    /// Another command holds it.
    Held { holder: LeaseHolder },
    /// No one holds it, but calls made without a lease are still changing the Machine.
    Busy { operations: usize },
}

/// A DNS record type (QTYPE), written as its mnemonic (`A`, `AAAA`, `ANY`...) or `TYPE<n>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct QueryType(pub u16);

/// The mnemonics [`QueryType`] reads and writes, with their codes.
const QUERY_TYPE_MNEMONICS: [(&str, u16); 12] = [
    ("A", 1),
    ("NS", 2),
    ("CNAME", 5),
    ("SOA", 6),
    ("PTR", 12),
    ("HINFO", 13),
    ("MX", 15),
    ("TXT", 16),
    ("AAAA", 28),
    ("SRV", 33),
    ("HTTPS", 65),
    ("ANY", 255),
];

impl QueryType {
    /// An IPv4 address record.
    pub const A: QueryType = QueryType(1);
    /// An IPv6 address record.
    pub const AAAA: QueryType = QueryType(28);
    /// The zone's start of authority.
    pub const SOA: QueryType = QueryType(6);
    /// Anything (answered minimally, RFC 8482).
    pub const ANY: QueryType = QueryType(255);
}

/// A text that names no record type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a DNS record type; use a mnemonic such as A, AAAA or ANY, or TYPE<number>")]
pub struct QueryTypeError(String);

impl std::str::FromStr for QueryType {
    type Err = QueryTypeError;
    fn from_str(s: &str) -> Result<QueryType, QueryTypeError> {
        let upper = s.trim().to_ascii_uppercase();
        if let Some((_, code)) = QUERY_TYPE_MNEMONICS.iter().find(|(m, _)| *m == upper) {
            return Ok(QueryType(*code));
        }
        upper
            .strip_prefix("TYPE")
            .and_then(|n| n.parse().ok())
            .map(QueryType)
            .ok_or_else(|| QueryTypeError(s.to_owned()))
    }
}

impl std::fmt::Display for QueryType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match QUERY_TYPE_MNEMONICS
            .iter()
            .find(|(_, code)| *code == self.0)
        {
            Some((m, _)) => f.write_str(m),
            None => write!(f, "TYPE{}", self.0),
        }
    }
}

impl TryFrom<String> for QueryType {
    type Error = QueryTypeError;
    fn try_from(s: String) -> Result<QueryType, QueryTypeError> {
        s.parse()
    }
}

impl From<QueryType> for String {
    fn from(t: QueryType) -> String {
        t.to_string()
    }
}

/// A DNS response code, as the internal DNS sends it and as [`LookupAnswer`] reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum Rcode {
    /// No error (also the code of an empty "no data" answer).
    NoError,
    /// The query was malformed.
    FormErr,
    /// The server failed: for a forwarded name, no upstream answered usefully.
    ServFail,
    /// The `.internal` name does not exist.
    NxDomain,
    /// The query's opcode is not supported.
    NotImp,
    /// The server will not answer: a source outside the allowed networks, or a name this server
    /// neither owns nor forwards.
    Refused,
    /// The query's EDNS version is not supported (extended code 16).
    BadVers,
}

impl Rcode {
    /// Every code, in the order metrics render them.
    pub const ALL: [Rcode; 7] = [
        Rcode::NoError,
        Rcode::FormErr,
        Rcode::ServFail,
        Rcode::NxDomain,
        Rcode::NotImp,
        Rcode::Refused,
        Rcode::BadVers,
    ];

    /// The code's mnemonic as RFCs and `dig` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Rcode::NoError => "NOERROR",
            Rcode::FormErr => "FORMERR",
            Rcode::ServFail => "SERVFAIL",
            Rcode::NxDomain => "NXDOMAIN",
            Rcode::NotImp => "NOTIMP",
            Rcode::Refused => "REFUSED",
            Rcode::BadVers => "BADVERS",
        }
    }

    /// The 12-bit code.
    pub fn code(self) -> u16 {
        match self {
            Rcode::NoError => 0,
            Rcode::FormErr => 1,
            Rcode::ServFail => 2,
            Rcode::NxDomain => 3,
            Rcode::NotImp => 4,
            Rcode::Refused => 5,
            Rcode::BadVers => 16,
        }
    }

    /// The response code of a 12-bit code; `None` for codes the internal DNS does not name.
    pub fn from_code(code: u16) -> Option<Rcode> {
        Rcode::ALL.into_iter().find(|r| r.code() == code)
    }
}

/// How an Internal DNS Answer orders its addresses, chosen by the name's first label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DnsSelector {
    /// `rr.<name>` and plain `<name>`: every address, shuffled anew for each query.
    RoundRobin,
    /// `nearest.<name>`, the Nearest DNS Selector: addresses inside the observing Machine's
    /// subnet first, then the others, each group shuffled. Subnet locality, not latency.
    Nearest,
}

impl DnsSelector {
    /// The prefix label that selects it.
    pub fn prefix(self) -> &'static str {
        match self {
            DnsSelector::RoundRobin => "rr",
            DnsSelector::Nearest => "nearest",
        }
    }
}

/// Who answers a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerKind {
    /// An `.internal` name this Machine holds: an Internal DNS Answer.
    Internal,
    /// A name outside `.internal`: the upstream resolvers answer it.
    Forwarded,
    /// An `.internal` name this Machine does not hold (NXDOMAIN), or not a name at all.
    Unknown,
}

/// `GET` [`paths::DNS_LOOKUP`]: what the DNS server of one Machine would answer for a name, as
/// of one snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupAnswer {
    /// The name asked, lowercase, with its trailing dot.
    pub name: String,
    /// The record type asked.
    pub qtype: QueryType,
    /// Who answers it.
    pub kind: AnswerKind,
    /// The response code; absent for forwarded names (the upstream decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rcode: Option<Rcode>,
    /// How the server orders the addresses; absent when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<DnsSelector>,
    /// The A records, those in the observing Machine's subnet first, each group in address
    /// order (the server shuffles them per query as `selector` says).
    pub addresses: Vec<std::net::Ipv4Addr>,
    /// How many of `addresses`, from the front, lie in the observing Machine's subnet.
    pub local_addresses: usize,
    /// The generation of the snapshot that answered.
    pub generation: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token() -> JoinToken {
        JoinToken {
            cluster: crate::ClusterId::generate(),
            machine: MachineId::generate(),
            name: "one".into(),
            public_key: "u2Pf4Zyz0gxw0bt7zJY0tA1nO2a6HhV6aD2tO4fMZmw=".into(),
            subnet: "10.210.0.0/24".parse().unwrap(),
            endpoints: vec!["198.18.0.10:51820".parse().unwrap()],
            api: API_VERSION,
            version: "0.1.0".into(),
        }
    }

    #[test]
    fn a_join_token_reads_back_from_its_one_line_text() {
        let token = token();
        let text = token.to_text();
        assert!(text.starts_with(JOIN_TOKEN_PREFIX), "{text}");
        assert!(!text.contains(char::is_whitespace), "{text}");
        assert_eq!(JoinToken::from_text(&format!("  {text}\n")).unwrap(), token);
    }

    #[test]
    fn a_garbled_token_or_the_wrong_kind_says_what_to_copy() {
        let text = token().to_text();
        let wrong_prefix = JoinToken::from_text("mtkn:abc").unwrap_err().to_string();
        assert!(
            wrong_prefix.contains("does not start with 'ployz-join-token:'")
                && wrong_prefix.contains("`ployz machine token`"),
            "{wrong_prefix}"
        );
        let cut = JoinToken::from_text(&text[..text.len() - 9]).unwrap_err();
        assert!(matches!(cut, TokenError::Garbled { .. }), "{cut}");
        let spaced = format!("{} {}", &text[..30], &text[30..]);
        let err = JoinToken::from_text(&spaced).unwrap_err().to_string();
        assert!(err.contains("not base64url"), "{err}");
        let request = AdmitRequest::from_text(&text).unwrap_err().to_string();
        assert!(
            request.contains("a Ployz join request") && request.contains("'ployz-join-request:'"),
            "{request}"
        );
    }

    #[test]
    fn a_dns_lookup_answer_keeps_its_json_shape() {
        let text = r#"{"name":"nearest.web.internal.","qtype":"A","kind":"internal","rcode":"NOERROR","selector":"nearest","addresses":["10.210.1.2","10.210.0.2"],"local_addresses":1,"generation":7}"#;
        let answer: LookupAnswer = serde_json::from_str(text).unwrap();
        assert_eq!(
            answer,
            LookupAnswer {
                name: "nearest.web.internal.".into(),
                qtype: QueryType::A,
                kind: AnswerKind::Internal,
                rcode: Some(Rcode::NoError),
                selector: Some(DnsSelector::Nearest),
                addresses: vec![
                    std::net::Ipv4Addr::new(10, 210, 1, 2),
                    std::net::Ipv4Addr::new(10, 210, 0, 2)
                ],
                local_addresses: 1,
                generation: 7,
            }
        );
        assert_eq!(serde_json::to_string(&answer).unwrap(), text);
        // A forwarded name carries neither rcode nor selector; other words round-trip too.
        let text = r#"{"name":"example.com.","qtype":"TYPE65534","kind":"forwarded","addresses":[],"local_addresses":0,"generation":1}"#;
        let answer: LookupAnswer = serde_json::from_str(text).unwrap();
        assert_eq!(
            (answer.qtype, answer.kind, answer.rcode, answer.selector),
            (QueryType(65534), AnswerKind::Forwarded, None, None)
        );
        assert_eq!(serde_json::to_string(&answer).unwrap(), text);
        for (rcode, word) in [
            (Rcode::FormErr, "\"FORMERR\""),
            (Rcode::ServFail, "\"SERVFAIL\""),
            (Rcode::NxDomain, "\"NXDOMAIN\""),
            (Rcode::NotImp, "\"NOTIMP\""),
            (Rcode::Refused, "\"REFUSED\""),
            (Rcode::BadVers, "\"BADVERS\""),
        ] {
            assert_eq!(serde_json::to_string(&rcode).unwrap(), word);
            assert_eq!(format!("\"{}\"", rcode.as_str()), word);
        }
        assert_eq!(
            serde_json::to_string(&DnsSelector::RoundRobin).unwrap(),
            "\"round_robin\""
        );
        assert_eq!(
            serde_json::to_string(&AnswerKind::Unknown).unwrap(),
            "\"unknown\""
        );
        assert!(serde_json::from_str::<QueryType>("\"BOGUS\"").is_err());
    }

    #[test]
    fn query_types_parse_and_print() {
        assert_eq!("aaaa".parse::<QueryType>().unwrap(), QueryType::AAAA);
        assert_eq!(" any ".parse::<QueryType>().unwrap(), QueryType::ANY);
        assert_eq!("TYPE65534".parse::<QueryType>().unwrap(), QueryType(65534));
        assert_eq!("type6".parse::<QueryType>().unwrap(), QueryType::SOA);
        assert_eq!(QueryType(65534).to_string(), "TYPE65534");
        assert_eq!(QueryType::ANY.to_string(), "ANY");
        assert_eq!(
            "BOGUS".parse::<QueryType>().unwrap_err().to_string(),
            "'BOGUS' is not a DNS record type; use a mnemonic such as A, AAAA or ANY, or TYPE<number>"
        );
        assert!("TYPE65536".parse::<QueryType>().is_err());
    }

    #[test]
    fn rcodes_map_to_and_from_their_codes() {
        for r in Rcode::ALL {
            assert_eq!(Rcode::from_code(r.code()), Some(r));
        }
        assert_eq!(Rcode::from_code(16), Some(Rcode::BadVers));
        assert_eq!(Rcode::from_code(6), None);
    }
}
