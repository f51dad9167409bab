use std::path::PathBuf;

use ployz_core::MachineId;

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The disk or sled failed; an `ENOSPC` shows up here. Nothing of the failed call was
    /// acknowledged, and no read shows it.
    #[error("store i/o failed: {}", sled_error_text(.0))]
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
    /// A Machine was asked to forget itself.
    #[error("this Machine ({machine}) cannot forget its own records: forget a Machine on the others, once it is removed from the Cluster")]
    ForgetLocal { machine: MachineId },
    /// An earlier write failed on disk and the store has not been able to write since; reads
    /// show what was durable. The store reopens itself once the disk takes writes again.
    #[error("the store cannot write: {reason}")]
    Unwritable { reason: String },
    /// The store's files do not open or do not read back: sled refused them or panicked, or
    /// entries do not decode.
    #[error("the store at {} is unreadable: {reason}", path.display())]
    Unreadable { path: PathBuf, reason: String },

    /// Another process holds the store open (sled's lock on its files): nothing is wrong with
    /// the data, and nothing may be done to it while that process runs.
    #[error("the store at {} is in use by another process: is another ployz daemon running with this data dir? Stop it, or give this one its own --data-dir", path.display())]
    InUse { path: PathBuf },
    /// The store holds less than its acknowledgement record says it acknowledged.
    #[error("the store at {} holds less than this Machine acknowledged: {}", path.display(), missing.join("; "))]
    Behind {
        path: PathBuf,
        /// What is missing, one sentence each.
        missing: Vec<String>,
    },
    /// The acknowledgement record is there but cannot be trusted.
    #[error("the acknowledgement record {} cannot be trusted: {reason}", path.display())]
    AcknowledgementUnreadable { path: PathBuf, reason: String },
}

/// sled's error as a sentence: an I/O error as the OS says it (sled prints its debug form).
pub(crate) fn sled_error_text(e: &sled::Error) -> String {
    match e {
        sled::Error::Io(io) => match io.raw_os_error() {
            Some(_) => io.to_string(),
            // sled hands out copies of the error it keeps, made of the original's debug form:
            // take the system's message back out of it.
            None => {
                let text = io.to_string();
                os_message(&text).unwrap_or(text)
            }
        },
        sled::Error::Corruption { at: Some(at), .. } => {
            format!("its files hold corrupted data (found at {at:?})")
        }
        sled::Error::Corruption { at: None, .. } => "its files hold corrupted data".into(),
        other => other.to_string(),
    }
}

/// `No space left on device (os error 28)` out of `Os { code: 28, kind: StorageFull, message:
/// "No space left on device" }`.
fn os_message(debug: &str) -> Option<String> {
    let code = debug
        .split("code: ")
        .nth(1)?
        .split(|c: char| !c.is_ascii_digit())
        .next()?;
    let message = debug.split("message: \"").nth(1)?.split('"').next()?;
    Some(format!("{message} (os error {code})"))
}

impl StoreError {
    /// Whether the failure came from the disk (full, read-only, failing) rather than the data.
    pub fn is_io(&self) -> bool {
        matches!(self, StoreError::Io(_) | StoreError::Unwritable { .. })
    }

    /// Whether opening refused because acknowledged data may be lost: the store is unreadable,
    /// behind its acknowledgement record, or that record cannot be trusted.
    /// [`OpenOptions::accept_loss`](crate::OpenOptions::accept_loss) opens anyway.
    pub fn is_loss(&self) -> bool {
        matches!(
            self,
            StoreError::Unreadable { .. }
                | StoreError::Behind { .. }
                | StoreError::AcknowledgementUnreadable { .. }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_io_error_reads_as_the_system_says_it_even_from_sleds_copies() {
        let original = std::io::Error::from_raw_os_error(28);
        let copy = std::io::Error::new(original.kind(), format!("{original:?}"));
        let expected = "store i/o failed: No space left on device (os error 28)";
        assert_eq!(
            StoreError::Io(sled::Error::Io(original)).to_string(),
            expected
        );
        assert_eq!(StoreError::Io(sled::Error::Io(copy)).to_string(), expected);
    }
}
