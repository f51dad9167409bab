//! Deploy types: observations a Deploy reads, and the plan and outcome it produces.

use std::net::Ipv4Addr;

use serde::{Deserialize, Serialize};

use crate::api::MachineView;
use crate::{
    ContainerId, HostProtocol, MachineId, PartialResult, PreDeployHook, ServiceId, ServiceMode,
    ServiceName, ServiceSpec, UpdateOrder, VolumeSpec,
};

/// Docker's lifecycle state of a container at the moment it was observed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerState {
    Created,
    Running,
    Paused,
    Restarting,
    Exited,
    Removing,
    Dead,
    /// A state this version of Ployz does not know.
    #[serde(other)]
    Unknown,
}

impl ContainerState {
    /// Parses Docker's word for a state; anything unknown is [`ContainerState::Unknown`].
    pub fn from_docker(s: &str) -> ContainerState {
        match s {
            "created" => ContainerState::Created,
            "running" => ContainerState::Running,
            "paused" => ContainerState::Paused,
            "restarting" => ContainerState::Restarting,
            "exited" => ContainerState::Exited,
            "removing" => ContainerState::Removing,
            "dead" => ContainerState::Dead,
            _ => ContainerState::Unknown,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            ContainerState::Created => "created",
            ContainerState::Running => "running",
            ContainerState::Paused => "paused",
            ContainerState::Restarting => "restarting",
            ContainerState::Exited => "exited",
            ContainerState::Removing => "removing",
            ContainerState::Dead => "dead",
            ContainerState::Unknown => "unknown",
        }
    }
}

/// Docker's health verdict, for a container that has a Healthcheck.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContainerHealth {
    Starting,
    Healthy,
    Unhealthy,
}

/// Whether a managed container serves a Service or runs its pre-deploy hook.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum ContainerKind {
    #[default]
    Service,
    Hook,
}

/// A point-in-time observation of one managed container: its Docker lifecycle state and health,
/// its Container Address, which Service it belongs to and the Resolved Service Spec it carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContainerRuntimeObservation {
    pub id: ContainerId,
    /// The display name, `<service>-<4>`; not an identity.
    pub name: String,
    pub machine_id: MachineId,
    pub service_id: ServiceId,
    pub service_name: ServiceName,
    pub kind: ContainerKind,
    pub state: ContainerState,
    /// `None` when the container has no Healthcheck.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<ContainerHealth>,
    /// How many times Docker restarted it (a crash loop shows here).
    #[serde(default)]
    pub restart_count: u32,
    /// The Container Address on the Machine's `ployz` network.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<Ipv4Addr>,
    /// The image reference it was created from.
    pub image: String,
    /// Creation time, seconds since the Unix epoch.
    pub created_at: i64,
    /// The Resolved Service Spec from its label; `None` when the label is missing or unreadable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec: Option<ServiceSpec>,
    /// The Plan ID of the bound Deploy (`ployz deploy --plan-id`) that ran it, from its label.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_id: Option<String>,
    /// The fencing token of the Machine lease the command that created it held, from its label;
    /// `None` for a container created without a lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_token: Option<u64>,
}

impl ContainerRuntimeObservation {
    /// Running, and not crash-looping.
    pub fn is_running(&self) -> bool {
        self.state == ContainerState::Running
    }

    /// A Serving Container: running, healthy or without a Healthcheck, with a Container Address.
    pub fn is_serving(&self) -> bool {
        self.kind == ContainerKind::Service
            && self.is_running()
            && self.address.is_some()
            && matches!(self.health, None | Some(ContainerHealth::Healthy))
    }

    /// A short, human status such as `running (healthy)`.
    pub fn status(&self) -> String {
        match self.health {
            Some(h) if self.is_running() => format!(
                "{} ({})",
                self.state.as_str(),
                match h {
                    ContainerHealth::Starting => "starting",
                    ContainerHealth::Healthy => "healthy",
                    ContainerHealth::Unhealthy => "unhealthy",
                }
            ),
            _ => self.state.as_str().to_owned(),
        }
    }
}

impl crate::Identified for ContainerRuntimeObservation {
    fn id(&self) -> &str {
        self.id.as_str()
    }
    fn name(&self) -> &str {
        &self.name
    }
}

/// A machine-local Docker storage resource; its name means something only with its Machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DockerVolume {
    pub machine_id: MachineId,
    pub name: String,
    pub driver: String,
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
}

/// What one Machine showed a Deploy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MachineSnapshot {
    pub machine: MachineView,
    pub containers: Vec<ContainerRuntimeObservation>,
    pub volumes: Vec<DockerVolume>,
    /// Image references present on the Machine (`repo:tag`).
    pub images: Vec<String>,
    /// The image ID each of `images` names on the Machine (empty from a daemon that does not
    /// report them): what binds a plan to the image a mutable tag named when it was reviewed.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub image_ids: std::collections::BTreeMap<String, String>,
    /// The drain marks standing on the Machine's containers (empty from a daemon that does not
    /// report them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub drains: Vec<DrainMark>,
    /// The ports the Machine's daemon itself listens on (the edge, metrics, DNS), which no
    /// container can bind there (empty from a daemon that does not report them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<Listener>,
    /// The commands whose lease on the Machine ended without their release (killed, or cut
    /// off when their lease lapsed), and no live holder's: what they left is reviewed before
    /// anything is planned from it (empty from a daemon that does not report them).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub interrupted: Vec<crate::api::InterruptedLease>,
}

/// A port the daemon itself listens on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Listener {
    /// Which of the daemon's listeners it is.
    pub role: ListenerRole,
    /// The address it listens on, as text: `0.0.0.0`, `::`, `127.0.0.1`, `10.210.0.1`.
    pub address: String,
    pub port: u16,
    pub protocol: HostProtocol,
}

impl Listener {
    /// `address:port`, IPv6 addresses in brackets.
    pub fn socket_text(&self) -> String {
        if self.address.contains(':') {
            format!("[{}]:{}", self.address, self.port)
        } else {
            format!("{}:{}", self.address, self.port)
        }
    }
}

/// What a daemon listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ListenerRole {
    /// The edge's plain-HTTP listener (80 by default).
    EdgeHttp,
    /// The edge's HTTPS listener (443 by default).
    EdgeHttps,
    /// The Prometheus metrics listener.
    Metrics,
    /// The internal DNS.
    Dns,
    /// A listener this version of Ployz does not know.
    #[serde(other)]
    Other,
}

impl ListenerRole {
    /// Whether it is one of the edge's listeners: a web port belongs behind it, in `x-ports`.
    pub fn is_edge(self) -> bool {
        matches!(self, ListenerRole::EdgeHttp | ListenerRole::EdgeHttps)
    }
}

impl std::fmt::Display for ListenerRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ListenerRole::EdgeHttp => "edge HTTP listener",
            ListenerRole::EdgeHttps => "edge HTTPS listener",
            ListenerRole::Metrics => "metrics listener",
            ListenerRole::Dns => "internal DNS",
            ListenerRole::Other => "listener",
        })
    }
}

/// A container's drain mark: while it stands, no edge sends the container new requests. A drain
/// sets it before the container is stopped. It names who set it and when it lapses, so it never
/// outlives the command that set it: the Machine's daemon lifts it when its deadline passes, and
/// as soon as that command is gone while the container still runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DrainMark {
    pub container_id: ContainerId,
    /// The Machine that runs the container and wrote the mark.
    pub machine_id: MachineId,
    /// The fencing token of the Machine lease its setter held; `None`: set by a call made
    /// without a lease.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_token: Option<u64>,
    /// Who set it, as the lease names its holder (`alice@build-1 (pid 4242), running deploy of
    /// web`).
    pub set_by: String,
    /// When it was set, milliseconds since the Unix epoch.
    pub set_at_ms: u64,
    /// When it lapses whatever else happens, milliseconds since the Unix epoch.
    pub deadline_ms: u64,
}

/// What one Machine's edge serves, as it reports it in a machine-owned record: the generation of
/// its published route table and the drains that table applies. A drain on one Machine waits for
/// the report of every Machine it observes up to show the drain applied with nothing in flight.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EdgeReport {
    /// The generation of the route table the edge serves.
    pub generation: u64,
    /// Every drain mark the table honours (the container is in no route).
    pub drains: Vec<AppliedDrain>,
}

/// One drain mark an edge's published route table honours.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AppliedDrain {
    pub container_id: ContainerId,
    /// The mark's `set_at_ms`: which drain of the container it applied.
    pub set_at_ms: u64,
    /// Requests the edge still has in flight to the container.
    pub in_flight: usize,
}

impl EdgeReport {
    /// Whether the edge applied the drain set at `set_at_ms` on `container` and has no request
    /// in flight to it.
    pub fn settled(&self, container: &ContainerId, set_at_ms: u64) -> bool {
        self.drains
            .iter()
            .any(|d| &d.container_id == container && d.set_at_ms == set_at_ms && d.in_flight == 0)
    }
}

/// The observer-relative Machine, container and volume observations gathered for one Deploy:
/// Live Observation, partial where a Machine did not answer.
pub type DeploySnapshot = PartialResult<MachineSnapshot>;

/// The complete desired Services of one Deploy, and which of them this command applies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployIntent {
    pub services: Vec<ServiceSpec>,
    /// The Service Attempts: the Services this command applies. The rest are left unchanged.
    pub attempts: Vec<ServiceName>,
    pub volumes: Vec<VolumeSpec>,
}

impl DeployIntent {
    /// An intent that applies every Service it names.
    pub fn all(services: Vec<ServiceSpec>, volumes: Vec<VolumeSpec>) -> DeployIntent {
        DeployIntent {
            attempts: services.iter().map(|s| s.name.clone()).collect(),
            services,
            volumes,
        }
    }
}

/// A container an operation acts on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRef {
    pub id: ContainerId,
    pub name: String,
}

/// One step of a Deploy Plan, executed against one Machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Operation {
    CreateVolume {
        machine_id: MachineId,
        volume: VolumeSpec,
    },
    RunHook {
        machine_id: MachineId,
        service_id: ServiceId,
        spec: ServiceSpec,
        hook: PreDeployHook,
    },
    RunContainer {
        machine_id: MachineId,
        service_id: ServiceId,
        spec: ServiceSpec,
    },
    ReplaceContainer {
        machine_id: MachineId,
        service_id: ServiceId,
        old: ContainerRef,
        spec: ServiceSpec,
        order: UpdateOrder,
    },
    StopContainer {
        machine_id: MachineId,
        container: ContainerRef,
    },
    RemoveContainer {
        machine_id: MachineId,
        container: ContainerRef,
    },
}

impl Operation {
    pub fn machine_id(&self) -> &MachineId {
        match self {
            Operation::CreateVolume { machine_id, .. }
            | Operation::RunHook { machine_id, .. }
            | Operation::RunContainer { machine_id, .. }
            | Operation::ReplaceContainer { machine_id, .. }
            | Operation::StopContainer { machine_id, .. }
            | Operation::RemoveContainer { machine_id, .. } => machine_id,
        }
    }
}

/// The operations of one Service in a Deploy Plan, with what the preview shows about it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServicePlan {
    pub service_id: ServiceId,
    pub name: ServiceName,
    pub mode: ServiceMode,
    /// No container of this Service existed before.
    pub is_new: bool,
    pub replicas: u32,
    /// The image the existing containers run, when it differs from the requested one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_image: Option<String>,
    pub image: String,
    pub operations: Vec<Operation>,
}

/// The ephemeral sequence of operations for one Deploy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployPlan {
    /// Volumes created before any Service.
    pub volume_operations: Vec<Operation>,
    /// Services in deploy order; a Service with nothing to do has no operations.
    pub services: Vec<ServicePlan>,
    /// Images Machines fetch from other Machines before the operations run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub transfers: Vec<ImageTransfer>,
    /// Containers an interrupted command left that never proved they serve: this Deploy does
    /// not count them as up to date, so their Services' containers are replaced through the
    /// health gates again.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_unverified: Vec<LeftUnverified>,
}

/// A Service Container created under a lease that ended without its release, which is not
/// Serving: it never passed (or no longer passes) the gate its Deploy was waiting on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeftUnverified {
    pub machine_id: MachineId,
    pub service_name: ServiceName,
    pub container: ContainerRef,
    /// Its state as observed: `running (starting)`, `created`...
    pub status: String,
    /// The command that created it.
    pub lease: crate::api::InterruptedLease,
}

/// An image a Machine gets before a Deploy's operations run, because a container of it is to run
/// there and the Machine lacks it: from another Machine of the snapshot over the mesh (a peer
/// pull, `pull_policy: missing`), or, for an image the CLI built, from the CLI's Docker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageTransfer {
    pub image: String,
    /// The Machine that gets it.
    pub machine_id: MachineId,
    /// The Machine that has it; `None`: the Docker where the CLI runs (a build).
    pub from: Option<MachineId>,
}

/// What one image transfer did. A failed one is not the Deploy's failure: the container's own
/// pull (from its registry) comes next.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferOutcome {
    pub transfer: ImageTransfer,
    /// The Machine had it by then: nothing crossed.
    pub present: bool,
    pub layers_sent: usize,
    pub layers: usize,
    /// Bytes that crossed the mesh (compressed).
    pub bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl DeployPlan {
    /// Every operation, in execution order.
    pub fn operations(&self) -> impl Iterator<Item = &Operation> + '_ {
        self.volume_operations
            .iter()
            .chain(self.services.iter().flat_map(|s| s.operations.iter()))
    }

    /// Whether nothing needs doing.
    pub fn is_empty(&self) -> bool {
        self.operations().next().is_none()
    }
}

/// The plan plus the warnings offered for confirmation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployPreview {
    pub plan: DeployPlan,
    pub warnings: Vec<String>,
    /// The Machines the entry Machine knows of that this Deploy leaves out (observed down, or
    /// they did not answer): it plans and runs on the others, and leaves their containers as
    /// they are (a Partial Result).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub not_included: Vec<NotIncluded>,
}

/// A Machine a Deploy leaves out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NotIncluded {
    pub machine: MachineId,
    pub name: String,
    /// Why, in a sentence: observed down, or what its answer (or the lack of one) was.
    pub reason: String,
    /// The Edge Features its last record published (`None`: no record of its own was read).
    /// Its edge serves the Cluster's routes again when it comes back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge_features: Option<Vec<String>>,
    /// The Services it had containers of, as the Machine reached last observed it (Replicated
    /// Observation: possibly stale). A Service attempted that runs nowhere else is refused:
    /// planned on the others it would be a second Service, with new, empty volumes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<String>,
}

/// One operation that ran, and what it produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletedOperation {
    pub operation: Operation,
    /// The container it created, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerRef>,
}

/// The operation that failed, why, and the failed container's last log lines.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedOperation {
    pub operation: Operation,
    pub reason: String,
    /// The container that failed (kept for inspection), if one was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<ContainerRef>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logs: Vec<String>,
    /// Why the failed container could not be stopped: it may still be running (and serving).
    /// `None` when it was stopped, is gone, or none was created.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_error: Option<String>,
}

/// The narrow compensation a failed replacement attempted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compensation {
    /// What was tried, e.g. "restarted web-ab12 (stop-first replacement)".
    pub action: String,
    /// `None` when it worked, else why not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The evidence of executing a Deploy Plan. No atomicity or rollback is implied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DeployOutcome {
    /// The image transfers run before the operations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<TransferOutcome>,
    pub completed: Vec<CompletedOperation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed: Option<FailedOperation>,
    pub unexecuted: Vec<Operation>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compensation: Option<Compensation>,
}

impl DeployOutcome {
    pub fn succeeded(&self) -> bool {
        self.failed.is_none()
    }
}
