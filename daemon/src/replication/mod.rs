//! Replication between Machines' stores: the transport of the store's sync protocol
//! ([`Digest`], [`SyncRequest`], [`SyncBatch`]) over the mesh.
//!
//! # The routes
//!
//! Served by [`routes`] on the management API's mesh listener (`[Management Address]:51000`):
//!
//! - `GET /v1/peer/sync/digest`: this store's [`Digest`].
//! - `POST /v1/peer/sync/pull`: a [`PullRequest`] (a list of [`SyncRequest`]s) answered by a
//!   [`PullAnswer`] (their [`SyncBatch`]es), bounded: at most [`ServeLimits::max_batch_records`]
//!   records and about [`ServeLimits::max_batch_bytes`] bytes per answer (the asker may ask for
//!   less). A batch cut by the bounds ends below the origin's digest; the asker asks again from
//!   where it now stands. One record larger than the byte bound still travels, alone.
//! - `POST /v1/peer/sync/push`: a [`SyncBatch`] pushed by its sender, applied with
//!   [`Store::apply_batch`], answered by a [`PushAnswer`]: where this store now stands for the
//!   batch's origin, so the sender knows where its next batch starts.
//!
//! Bodies are JSON (a record's value is base64 on the wire), at most [`MAX_BODY_BYTES`]. A body
//! that is not what the route takes gets 400 and changes nothing; a store that refuses writes
//! answers a push with 503 and the reason ([`Store::write_failure`]). Every answer names the
//! serving Machine in [`MACHINE_HEADER`], so a sender notices an address that now belongs to
//! another Machine.
//!
//! # The replicator
//!
//! A [`Replicator`] runs beside the routes, over the peers currently observed `up` (fed by
//! membership as [`SyncPeer`]s):
//!
//! - **Push.** When this Machine writes, its new records (origin = this Machine) are pushed to up
//!   to [`ReplicationSettings::fanout`] up peers, taken in turn so that every peer gets its
//!   share. Each batch starts where that peer was last known to stand for this origin (its push
//!   answer says; its digest on first contact). One request is in flight per peer: writes made
//!   while a peer is slow are coalesced into its next push, never queued.
//! - **Anti-entropy.** Every [`ReplicationSettings::anti_entropy_interval`], with one random up
//!   peer: fetch its digest, pull what this store lacks ([`Digest::requests_for`]), again while
//!   the answers were cut by the bounds. Records of every origin travel this way, so a Machine
//!   that was down catches up from any peer, not only from the writers.
//!
//! # Why HTTP/1.1 over TCP, and not QUIC
//!
//! - The daemon already serves its management API with axum and hyper; the peer routes are more
//!   routes of the same kind, on the same listener, with the same limits and error bodies. QUIC
//!   (`quinn`) would add a second transport stack, its own TLS, certificates and tuning.
//! - The WireGuard mesh already encrypts and authenticates every peer, and the firewall admits
//!   the management port only from the mesh interface: a second layer of crypto buys nothing.
//! - Backpressure comes from TCP itself: a slow receiver fills its window, the sender's single
//!   request in flight to it waits, and the writes made meanwhile are coalesced into the next
//!   batch. Nothing is queued without bound on either side.
//! - Keep-alive connections (one pool per peer in the hyper client) make a push one round trip.
//!   QUIC's gains (no head-of-line blocking across streams, 0-RTT) matter little for one request
//!   at a time per peer inside a LAN or a WireGuard tunnel.

mod replicator;
mod serve;

use ployz_core::MachineId;
use ployz_store::{Record, Store, StoreError, SyncBatch, SyncRequest};
use serde::{Deserialize, Serialize};

#[cfg(doc)]
use ployz_store::Digest;

pub use replicator::{
    PeerError, PeerReport, ReplicationCounters, ReplicationSettings, Replicator, SyncPeer,
};
pub use serve::{routes, routes_with, ServeLimits};

/// The paths of the peer routes.
pub mod paths {
    /// `GET`: the serving store's [`Digest`](ployz_store::Digest).
    pub const DIGEST: &str = "/v1/peer/sync/digest";
    /// `POST` a [`PullRequest`](super::PullRequest), answered by a
    /// [`PullAnswer`](super::PullAnswer).
    pub const PULL: &str = "/v1/peer/sync/pull";
    /// `POST` a [`SyncBatch`](ployz_store::SyncBatch), answered by a
    /// [`PushAnswer`](super::PushAnswer).
    pub const PUSH: &str = "/v1/peer/sync/push";
}

/// The largest request or answer body of the peer routes: 16 MiB. A record whose JSON form is
/// larger cannot travel.
pub const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// The header naming the Machine that answered (its Machine ID).
pub const MACHINE_HEADER: &str = "x-ployz-machine";

/// The default bound on the records of one batch or pull answer.
pub const DEFAULT_MAX_BATCH_RECORDS: usize = 4096;

/// The default bound on the bytes of one batch or pull answer: 1 MiB.
pub const DEFAULT_MAX_BATCH_BYTES: usize = 1024 * 1024;

/// The body of `POST /v1/peer/sync/pull`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullRequest {
    /// What the asker lacks, per origin.
    pub requests: Vec<SyncRequest>,
    /// At most this many records in the answer (the server's own bound applies when lower).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_records: Option<usize>,
    /// About this many bytes in the answer at most (the server's own bound applies when lower).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<usize>,
}

/// The answer to a [`PullRequest`]: one batch per request, in the requests' order, until the
/// bounds were reached. A request left out, or a batch whose `up_to` is below the origin's
/// digest, is asked again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PullAnswer {
    /// The batches, in the order of the requests they answer.
    pub batches: Vec<SyncBatch>,
}

/// The answer to a pushed [`SyncBatch`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushAnswer {
    /// The batch's origin.
    pub origin: MachineId,
    /// The receiver's digest for that origin once the batch was applied: the next batch starts
    /// after it.
    pub seq: u64,
    /// Records of the batch that won on the receiver.
    pub applied: usize,
    /// Records of the batch the receiver already held, or held something newer for.
    pub ignored: usize,
}

/// How many records [`bounded_batch`] asks the store for at a time, so that a byte bound is
/// kept without reading far beyond it.
const READ_CHUNK: usize = 64;

/// About how many bytes `record` takes in a JSON body: its key, its value in base64 and the
/// fields around them.
pub(crate) fn wire_size(record: &Record) -> usize {
    const FIELDS: usize = 160;
    record.key.to_string().len() + record.value.len().div_ceil(3) * 4 + FIELDS
}

/// The records of `request` the store holds, bounded: at most `max_records` records and about
/// `max_bytes` bytes. The first record is taken whatever its size when `take_one` (so a record
/// larger than the bound still travels); otherwise a batch may come back empty, its `up_to` at
/// `request.after`, when the first record does not fit. A batch cut by a bound ends (`up_to`)
/// just before the first record left out, so the asker's next request starts there.
pub(crate) fn bounded_batch(
    store: &Store,
    request: &SyncRequest,
    max_records: usize,
    max_bytes: usize,
    take_one: bool,
) -> Result<SyncBatch, StoreError> {
    let mut out = SyncBatch {
        origin: request.origin.clone(),
        after: request.after,
        up_to: request.after,
        records: Vec::new(),
    };
    let mut bytes = 0usize;
    while out.records.len() < max_records {
        let limit = (max_records - out.records.len()).min(READ_CHUNK);
        let chunk = store.records_after(
            &SyncRequest {
                origin: request.origin.clone(),
                after: out.up_to,
            },
            limit,
        )?;
        let complete = chunk.records.len() < limit;
        for record in chunk.records {
            let size = wire_size(&record);
            let may_overflow = take_one && out.records.is_empty();
            // The log holds origin O's records under their own sequence; cutting before one
            // of them leaves exactly the range below it covered.
            if !may_overflow && bytes + size > max_bytes && record.origin == out.origin {
                out.up_to = record.seq.saturating_sub(1).max(out.after);
                return Ok(out);
            }
            bytes += size;
            out.records.push(record);
        }
        out.up_to = out.up_to.max(chunk.up_to);
        if complete {
            break;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_store::Key;

    fn store_with(n: usize, value_len: usize) -> Store {
        let store = Store::temporary(MachineId::generate()).unwrap();
        for i in 0..n {
            store
                .put(
                    &Key::cluster("t", format!("k{i:04}")),
                    vec![b'x'; value_len],
                )
                .unwrap();
        }
        store
    }

    fn from_start(store: &Store) -> SyncRequest {
        SyncRequest {
            origin: store.local().clone(),
            after: 0,
        }
    }

    #[test]
    fn a_batch_is_cut_at_the_record_bound_and_the_rest_follows() {
        let store = store_with(200, 10);
        let first = bounded_batch(&store, &from_start(&store), 70, usize::MAX, true).unwrap();
        assert_eq!(first.records.len(), 70);
        assert_eq!(first.up_to, 70);
        let rest = SyncRequest {
            after: first.up_to,
            ..from_start(&store)
        };
        let second = bounded_batch(&store, &rest, 1000, usize::MAX, true).unwrap();
        assert_eq!(second.records.len(), 130);
        assert_eq!((second.after, second.up_to), (70, 200));
        assert_eq!(second.records[0].seq, 71);
    }

    #[test]
    fn a_batch_is_cut_at_the_byte_bound_but_always_carries_one_record() {
        let store = store_with(10, 3000);
        let one = wire_size(&store.records_after(&from_start(&store), 1).unwrap().records[0]);
        let batch = bounded_batch(&store, &from_start(&store), 100, one * 3 + 1, true).unwrap();
        assert_eq!(batch.records.len(), 3);
        assert_eq!(batch.up_to, 3);
        let tiny = bounded_batch(&store, &from_start(&store), 100, 10, true).unwrap();
        assert_eq!((tiny.records.len(), tiny.up_to), (1, 1));
        let none = bounded_batch(&store, &from_start(&store), 100, 10, false).unwrap();
        assert_eq!((none.records.len(), none.up_to), (0, 0));
    }

    #[test]
    fn a_range_whose_records_were_superseded_comes_back_empty_but_covered() {
        let store = store_with(0, 0);
        for _ in 0..5 {
            store
                .put(&Key::cluster("t", "same"), b"v".to_vec())
                .unwrap();
        }
        let batch = bounded_batch(&store, &from_start(&store), 2, usize::MAX, true).unwrap();
        assert_eq!(batch.records.len(), 1);
        assert_eq!(batch.records[0].seq, 5);
        assert_eq!(batch.up_to, 5);
    }
}
