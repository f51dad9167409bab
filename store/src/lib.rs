//! Ployz's local store, ready to replicate.
//!
//! Every Machine keeps one [`Store`]: a map from [`Key`] to the [`Record`] that currently wins for
//! it. A record carries its origin Machine ID, a hybrid-logical-clock timestamp ([`Hlc`]), a
//! per-origin sequence number and a tombstone flag. Two kinds of key exist:
//!
//! - **machine-owned** keys are written only by their Machine (its observations);
//! - **cluster-scoped** keys are written by any Machine, last writer by HLC wins, ties broken by
//!   Machine ID.
//!
//! Merging a remote record is idempotent, commutative and associative: the winner for a key is
//! the maximum of a total order, so any delivery order of any set of records ends the same.
//! Replication is the [`Digest`]/[`SyncBatch`] exchange in [`sync`](crate::Digest): a store says
//! the highest sequence it has incorporated per origin, and a peer answers with the records of
//! origin O after sequence N. The transport is not this crate's business.
//!
//! A remote record whose HLC runs further ahead of this store's clock than a bound
//! ([`Store::set_max_drift`]) is not merged until the clocks agree; a Machine removed from the
//! Cluster is forgotten ([`Store::forget_origin`]): its machine-owned records go and do not come
//! back.
//!
//! **Architecture Invariant:** sled is used here and nowhere else. Local writes are flushed to
//! disk before they return, and no read shows a change the disk did not take.
//!
//! A store opened with an acknowledgement record ([`OpenOptions::acknowledged`]) writes down,
//! beside itself, what it has acknowledged, and refuses to open holding less
//! ([`StoreError::is_loss`]). A store whose disk refuses a write stops taking writes, keeps
//! serving what was durable, and reopens itself once the disk takes writes again
//! ([`Store::write_failure`], [`Store::recover`]).

mod acknowledged;
pub mod certificates;
pub mod drains;
pub mod edge_reports;
mod error;
pub mod follow;
pub mod gates;
mod hlc;
mod index;
mod key;
pub mod machines;
pub mod observations;
mod opening;
mod record;
pub mod route_users;
mod store;
mod sync;
mod watch;

pub use acknowledged::write_atomic;
pub use error::StoreError;
pub use hlc::Hlc;
pub use key::{Key, KeyPrefix, Owner};
pub use record::Record;
pub use store::{MergeReport, OpenOptions, OpenReport, Store, DEFAULT_MAX_DRIFT};
pub use sync::{Digest, SyncBatch, SyncRequest};
pub use watch::{Change, Watch, WatchEvent};
