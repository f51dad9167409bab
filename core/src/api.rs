//! The management API's wire format: JSON over HTTP on the daemon's unix socket.
//!
//! **Architecture Invariant:** this module is the only definition of what crosses the API. The
//! daemon serves these types and the CLI reads them; neither defines its own copies.

use serde::{Deserialize, Serialize};

use crate::{
    LocalMachinePhase, MachineId, MachineName, MachineSubnet, ManagementAddress,
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
    /// `GET`: [`crate::CertificateSummary`]s; `POST` [`super::ImportCertificateRequest`]
    /// stores Certificate Material.
    pub const CERTIFICATES: &str = "/v1/certificates";
    /// `GET`: the [`crate::CertificatePolicy`] as set (the HMAC key withheld); `PUT`
    /// [`super::SetCertificatePolicyRequest`]: the policy now in force; `DELETE`: back to the
    /// built-in defaults.
    pub const CERTIFICATE_POLICY: &str = "/v1/certificates/policy";
    /// `GET ?name=NAME&type=A`: what this Machine's internal DNS would answer (a
    /// `ployz_dns::LookupAnswer`).
    pub const DNS_LOOKUP: &str = "/v1/dns/lookup";
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
}

/// One Machine as the answering Machine observes it: what that Machine published plus the
/// observer's Membership Observation of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MachineView {
    #[serde(flatten)]
    pub info: MachineInfo,
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

    /// A path with `{id}` or `{name}` filled in.
    pub fn fill(template: &str, value: &str) -> String {
        template.replace("{id}", value).replace("{name}", value)
    }
}

/// Create and start one Service Container.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunContainerRequest {
    pub service_id: crate::ServiceId,
    pub spec: crate::ServiceSpec,
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
}

/// The header that carries a Machine lease's fencing token on every call its holder makes. A
/// call that changes the Machine's containers or volumes with a token that is not the current
/// holder's is refused, and so is one without a token while the lease is held.
pub const LEASE_TOKEN_HEADER: &str = "x-ployz-lease";

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
