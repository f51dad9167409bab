//! Ployz's glossary (`CONTEXT.md`) as types.
//!
//! Every term a user, a log line or another crate speaks of has exactly one type here, spelled as
//! the glossary spells it. The semantics are deliberately weak: names may be ambiguous, observations
//! may be stale, results may be partial, and the types make the caller see that instead of hiding it.
//!
//! **Architecture Invariant:** this crate does no IO and starts no task. It is the vocabulary; the
//! management API's wire format lives in [`api`] and nowhere else.

pub mod api;
mod certificate;
pub mod certificate_policy;
mod deploy;
mod edge_feature;
mod error_chain;
pub mod gate;
mod healthcheck;
mod id;
mod membership;
mod name;
mod network;
mod partial;
mod phase;
mod selector;
mod spec;
pub mod users;

pub use certificate::{
    covers, read_leaf, CertificateError, CertificateMaterial, CertificateSummary, LeafInfo,
};
pub use certificate_policy::{
    CertificateKeyType, CertificatePolicy, CertificateState, CertificateStatus, ClusterDnsVerdict,
    PolicyError,
};
pub use deploy::{
    AppliedDrain, Compensation, CompletedOperation, ContainerHealth, ContainerKind, ContainerRef,
    ContainerRuntimeObservation, ContainerState, DeployIntent, DeployOutcome, DeployPlan,
    DeployPreview, DeploySnapshot, DockerVolume, DrainMark, EdgeReport, FailedOperation,
    ImageTransfer, LeftUnverified, Listener, ListenerRole, MachineSnapshot, NotIncluded, Operation,
    ServicePlan, TransferOutcome,
};
pub use edge_feature::EdgeFeature;
pub use error_chain::error_chain;
pub use gate::{GateState, ServiceGate};
pub use healthcheck::{ConfiguredHealthcheck, Healthcheck};
pub use id::{ClusterId, ContainerId, IdError, MachineId, ServiceId};
pub use membership::MembershipObservation;
pub use name::{MachineName, NameError, ServiceName};
pub use network::{
    ClusterNetwork, MachineSubnet, ManagementAddress, NetworkError, DEFAULT_CLUSTER_NETWORK,
};
pub use partial::{PartialResult, TargetFailure};
pub use phase::LocalMachinePhase;
pub use selector::{
    ContainerSelector, FanOutSelector, Identified, MachineTarget, Matches, ResolveError,
    ServiceSelector,
};
pub use spec::{
    BasicAuth, ConfigFile, ContainerSpec, HeaderRules, HostProtocol, IngressProtocol, Logging,
    Mount, PathMatch, PortSpec, PreDeployHook, PullPolicy, Redirect, Resources, RouteSpec,
    ServedPath, ServiceMode, ServiceSpec, Ulimit, UpdateConfig, UpdateOrder, VolumeSpec,
};
pub use spec::{SecretFile, SecretValue};
