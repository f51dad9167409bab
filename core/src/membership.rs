//! One Machine's judgment of another's membership.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One Machine's potentially incomplete or stale judgment of another Machine. It says nothing
/// authoritative about the observed Machine's lifecycle (that is its
/// [`crate::LocalMachinePhase`]) or liveness.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MembershipObservation {
    /// The observer has no judgment yet.
    Unknown,
    /// The observer believes the Machine is reachable. A Machine always observes itself as up.
    Up,
    /// The observer has missed probes and suspects the Machine.
    Suspect,
    /// The observer believes the Machine is unreachable.
    Down,
}

impl MembershipObservation {
    /// The observation's word, as the CLI prints it.
    pub fn as_str(self) -> &'static str {
        match self {
            MembershipObservation::Unknown => "unknown",
            MembershipObservation::Up => "up",
            MembershipObservation::Suspect => "suspect",
            MembershipObservation::Down => "down",
        }
    }
}

impl fmt::Display for MembershipObservation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
