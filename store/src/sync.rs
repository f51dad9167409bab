//! The sync protocol, independent of any transport.
//!
//! 1. A store publishes its [`Digest`]: per origin, the highest sequence it has incorporated.
//! 2. A peer compares it with its own ([`Digest::requests_for`]) and asks, per origin where it is
//!    behind, for "records of origin O after sequence N" ([`SyncRequest`]).
//! 3. The holder answers with a [`SyncBatch`]: the records its log holds for that range (each the
//!    version that currently wins for its key, whatever its origin) and how far the batch covers.
//! 4. The asker merges the batch and raises its digest for O to `up_to`, but only when the batch
//!    starts at or below what it already has, so a reordered or stale batch never opens a gap.
//!
//! Why it converges: a store whose digest for O reaches `n` holds, for every write of O numbered up
//! to `n` that still wins for its key, that very record (by induction along the chain of batches
//! that raised the digest, back to O itself). Once every digest matches, every store holds every
//! winning record, and merge picks the same winner everywhere.

use std::collections::BTreeMap;

use ployz_core::MachineId;
use serde::{Deserialize, Serialize};

use crate::Record;

/// Per origin Machine, the highest sequence number this store has incorporated.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Digest(pub BTreeMap<MachineId, u64>);

impl Digest {
    /// The highest sequence incorporated from `origin` (0 when none).
    pub fn get(&self, origin: &MachineId) -> u64 {
        self.0.get(origin).copied().unwrap_or(0)
    }

    /// What to ask a peer whose digest is `remote` for: one request per origin where the peer is
    /// ahead of this store.
    pub fn requests_for(&self, remote: &Digest) -> Vec<SyncRequest> {
        remote
            .0
            .iter()
            .filter(|(origin, &seq)| seq > self.get(origin))
            .map(|(origin, _)| SyncRequest {
                origin: origin.clone(),
                after: self.get(origin),
            })
            .collect()
    }
}

/// "Records of origin O after sequence N."
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRequest {
    pub origin: MachineId,
    pub after: u64,
}

/// The answer to a [`SyncRequest`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncBatch {
    /// The origin asked about.
    pub origin: MachineId,
    /// The sequence the request started after.
    pub after: u64,
    /// The batch covers the origin's writes in `(after, up_to]`.
    pub up_to: u64,
    /// For each log entry in range, the record that currently wins for its key. A key whose
    /// origin write was superseded by another Machine's appears with that Machine's record.
    pub records: Vec<Record>,
}
