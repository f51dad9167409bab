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
}

/// Version of the wire format; bumped on an incompatible change.
pub const API_VERSION: u32 = 1;

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
pub struct MachineInitRequest {
    /// The Machine Name; the daemon uses its sanitised hostname when absent. Validated by the
    /// daemon so that a bad one is refused with the rule it broke.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
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
