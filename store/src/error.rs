use ployz_core::MachineId;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The disk or sled failed; an `ENOSPC` shows up here. Nothing of the failed call was
    /// acknowledged.
    #[error("store i/o failed: {0}")]
    Io(#[from] sled::Error),
    /// A record on disk or on the wire does not decode.
    #[error("store record is malformed: {0}")]
    Malformed(String),
    /// A record for a machine-owned key arrived from a Machine other than the owner.
    #[error("record for '{key}' comes from Machine {origin}, but only its owner may write it")]
    ForeignWrite { key: String, origin: MachineId },
    /// A local write named another Machine's machine-owned key.
    #[error("this Machine ({local}) may not write '{key}': it belongs to another Machine")]
    NotOwner { key: String, local: MachineId },
}

impl StoreError {
    /// Whether the failure came from the disk (full, read-only, failing) rather than the data.
    pub fn is_io(&self) -> bool {
        matches!(self, StoreError::Io(_))
    }
}
