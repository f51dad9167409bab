//! A Machine's own lifecycle phase.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A Machine's own lifecycle phase, as that Machine itself records it. It is not how other
/// Machines see it (that is a [`crate::MembershipObservation`]) and not a readiness signal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LocalMachinePhase {
    /// No Cluster identity exists yet: `ployz machine init` (or a join) has not run.
    Uninitialized,
    /// Identity exists and the Machine is entering a Cluster, catching up included.
    Joining,
    /// The Machine takes part in its Cluster: it serves, observes and replicates.
    Participating,
    /// The Machine is tearing down its Cluster identity and plumbing.
    Resetting,
}

impl LocalMachinePhase {
    /// The phase's word, as the CLI and logs print it.
    pub fn as_str(self) -> &'static str {
        match self {
            LocalMachinePhase::Uninitialized => "uninitialized",
            LocalMachinePhase::Joining => "joining",
            LocalMachinePhase::Participating => "participating",
            LocalMachinePhase::Resetting => "resetting",
        }
    }
}

impl fmt::Display for LocalMachinePhase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
