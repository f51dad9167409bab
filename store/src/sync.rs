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
//! Batches are bounded by a number of records and of bytes
//! ([`Store::records_after_within`](crate::Store::records_after_within)); a batch cut short says
//! so in `up_to`, and the next request starts there.
//!
//! Why it converges: a store whose digest for O reaches `n` holds, for every write of O numbered up
//! to `n` that still wins for its key, that very record (by induction along the chain of batches
//! that raised the digest, back to O itself). Once every digest matches, every store holds every
//! winning record, and merge picks the same winner everywhere.
//!
//! **Records too far ahead.** A store refuses a record whose HLC is further ahead of its own wall
//! clock than its drift bound (`Store::set_max_drift`), and merges the rest of the batch. It must
//! then not claim the refused record: raising the digest for O to `up_to` would say "I hold every
//! winning write of O up to here", no later round would ask for the record again, and the store
//! would lack it for good once the clocks agree. So the digest is raised only to just below the
//! first refused record's place in the range: for a record of O itself, its sequence minus one;
//! for a record of another Machine standing at one of O's entries (whose sequence in O's range the
//! batch does not carry), the highest sequence of O among the records before it, a place known to
//! be before it. The batch is in log order ([`SyncBatch::records`]), so every entry up to that
//! place was merged or ignored, and the invariant above holds. The records after the refused one
//! merged all the same; the next round asks for O after that place, gets them again (merging
//! them again changes nothing) together with the refused record, and takes it once the clocks
//! agree or the bound is raised. Meanwhile the two stores' digests differ, so every round asks
//! again: that is what brings the record in without anyone having to notice.
//!
//! **Forgotten Machines.** A Machine removed from the Cluster is forgotten by each store
//! (`Store::forget_origin`): the records of its machine-owned keys are removed, and records for
//! those keys arriving later are ignored. The rule depends on the record alone (its key's owner),
//! not on when each store forgot, so merge stays idempotent and commutative, and stores that have
//! all forgotten the Machine converge. Cluster-scoped records the Machine wrote are *not* ignored
//! and stay, with their log entries and its digest entry: dropping them, or ignoring them once
//! forgotten, would leave the stores that received them before forgetting with another winner
//! than the stores that had not, for good. While only some stores have forgotten a Machine, a
//! store that has not may get a batch of its range without the removed records and raise its
//! digest past them: the invariant above then holds for every record except those of a forgotten
//! Machine's machine-owned keys, which that store drops too once it forgets the Machine.

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
    /// For each log entry in range, in log order, the record that currently wins for its key. A
    /// key whose origin write was superseded by another Machine's appears with that Machine's
    /// record.
    pub records: Vec<Record>,
}
