//! The store itself: local writes, merges and the sync answers, and how it stays honest about
//! what is on disk.
//!
//! Layout: one sled tree, four kinds of entry told apart by their first byte, so that every
//! change is one atomic sled batch:
//!
//! - `r` + key: the record currently winning for the key;
//! - `l` + origin + seq (big-endian): the key that record was written under, for the records
//!   currently held (an entry is removed when its record is superseded);
//! - `d` + origin: the highest sequence incorporated from that origin (the digest);
//! - `h`: the clock's last timestamp;
//! - `f` + origin: a Machine forgotten ([`Store::forget_origin`]), its records for
//!   machine-owned keys ignored from then on.
//!
//! Durability. A change is applied as one batch and flushed before the call returns, and readers
//! wait meanwhile, so no read shows a change the disk has not taken. When the disk refuses
//! (full, read-only, failing), sled refuses every later write until it is opened again: the store
//! then *freezes*. It serves reads from a copy of what was durable (the failed change left out),
//! refuses writes saying why, and reopens itself from disk once a probe write to its directory
//! succeeds ([`Store::recover`], also tried by every write). A failed local write that reached
//! the disk after all is undone on reopening, so a write reported failed never shows up later.
//!
//! Clocks. A remote record whose HLC is further ahead of this store's wall clock than the drift
//! bound ([`Store::set_max_drift`], 500 ms by default) is not merged: a Machine whose clock runs
//! ahead would otherwise win every cluster-scoped key it writes until the others' clocks caught
//! up. The rest of the call merges; the refusals are counted per origin
//! ([`Store::clock_refusals`]) and logged once per origin per minute. The store's wall clock can
//! be shifted ([`Store::set_clock_offset_ms`], for tests of exactly this).
//!
//! Opening. Files an interrupted snapshot left behind are removed; sled failing to open or
//! panicking, and entries that do not decode, make the store unreadable; with an acknowledgement
//! record ([`OpenOptions::acknowledged`]), a store holding less than it acknowledged is refused.
//! [`OpenOptions::accept_loss`] opens anyway, keeping what can be kept.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::{Bound, ControlFlow};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use ployz_core::MachineId;
use tokio::sync::{broadcast, watch};

use crate::acknowledged::{Acknowledged, AcknowledgedWrite};
use crate::hlc::{wall_now_ms, Clock};
use crate::opening::{
    last_local_write, move_aside, open_and_read, read_acknowledged, set_aside_sled_metadata,
    shortfalls,
};
use crate::{
    Change, Digest, Hlc, Key, KeyPrefix, Owner, Record, StoreError, SyncBatch, SyncRequest, Watch,
};

/// How many changes a slow watcher may fall behind before it is told to rescan.
const WATCH_BUFFER: usize = 4096;

pub(crate) const RECORD: u8 = b'r';
pub(crate) const LOG: u8 = b'l';
pub(crate) const DIGEST: u8 = b'd';
pub(crate) const CLOCK: &[u8] = b"h";
pub(crate) const FORGOTTEN: u8 = b'f';

/// How far ahead of this store's wall clock a remote record's HLC may be, by default.
pub const DEFAULT_MAX_DRIFT: Duration = Duration::from_millis(500);
/// How often refusals of one origin's records for its clock are logged, at most.
const CLOCK_WARNING_EVERY: Duration = Duration::from_secs(60);

/// The sled tree holding everything.
pub(crate) const TREE: &str = "ployz";
/// Bytes a frozen store writes (and removes) to see whether its disk takes writes again.
const PROBE_BYTES: usize = 64 * 1024;
/// The probe file, inside the store's directory.
const PROBE_FILE: &str = "space-probe";

/// What a merge did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeReport {
    /// Records that won and replaced (or created) their key's version.
    pub applied: usize,
    /// Records that lost to, or equalled, the version already held, and records for the
    /// machine-owned keys of a forgotten Machine ([`Store::forget_origin`]).
    pub ignored: usize,
    /// Records refused because their HLC is further ahead of this store's wall clock than the
    /// drift bound ([`Store::set_max_drift`]); a later sync round brings them again.
    pub too_far_ahead: usize,
}

/// How [`Store::open_with`] opens a store.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// Where the acknowledgement record lives: outside the store's directory, so that losing
    /// the directory does not lose the record. `None`: no record is kept or compared.
    pub acknowledged: Option<PathBuf>,
    /// Open even though acknowledged data is lost: an unreadable store is moved aside and
    /// started empty, entries that do not decode are removed, a store behind its record is kept
    /// as it is (its own sequence raised to what was acknowledged, so no number is used twice),
    /// and an untrustworthy record is replaced.
    pub accept_loss: bool,
}

/// What opening did beyond opening.
#[derive(Debug, Default)]
pub struct OpenReport {
    /// What was accepted as lost (only with [`OpenOptions::accept_loss`]), a sentence each.
    pub accepted_losses: Vec<String>,
    /// Files an interrupted snapshot left behind, removed before opening.
    pub removed_leftovers: Vec<PathBuf>,
}

/// One Machine's local store. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Store {
    local: MachineId,
    /// sled's directory; `None` for a temporary store.
    path: Option<PathBuf>,
    /// The acknowledgement record's file, when one is kept.
    acknowledged: Option<PathBuf>,
    /// Readers share it; a change holds it exclusively from its first read to its flush.
    backend: RwLock<Backend>,
    /// Serialises writes, merges and recovery.
    writer: Mutex<Writer>,
    changes: broadcast::Sender<Change>,
    /// Why writes are refused, while they are.
    writability: watch::Sender<Option<String>>,
    /// How far ahead of the wall clock a remote record's HLC may be, in milliseconds.
    max_drift_ms: AtomicU64,
    /// Milliseconds added to the system's wall clock ([`Store::set_clock_offset_ms`]).
    clock_offset_ms: AtomicI64,
    /// Records refused for their clock, per origin.
    clock_refusals: Mutex<ClockRefusals>,
    /// While set, reads fail ([`Store::fail_reads`], [`Store::fail_reads_under`]).
    #[cfg(any(test, feature = "test-hooks"))]
    read_failure: Mutex<Option<ReadFailure>>,
}

/// Records refused because their origin's clock runs ahead.
#[derive(Default)]
struct ClockRefusals {
    counts: BTreeMap<MachineId, u64>,
    /// When each origin's refusals were last logged.
    warned: HashMap<MachineId, Instant>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("local", &self.local).finish()
    }
}

pub(crate) struct Sled {
    pub(crate) db: sled::Db,
    pub(crate) tree: sled::Tree,
}

/// Where reads come from.
enum Backend {
    Open(Sled),
    /// What was durable when a write failed, served until the store reopens; `Err` when even
    /// that could not be read back.
    Frozen(Result<BTreeMap<Vec<u8>, sled::IVec>, String>),
}

/// The writer's state, under [`Store::writer`].
struct Writer {
    clock: Clock,
    trouble: Option<Trouble>,
    /// This Machine's last local write still held, for the acknowledgement record.
    last_local: Option<AcknowledgedWrite>,
}

/// Why writes are refused.
enum Trouble {
    /// sled refused a change; the backend is frozen until the store reopens.
    Frozen {
        reason: String,
        /// The local write that failed, undone if it reached the disk after all.
        failed: Option<Box<FailedWrite>>,
    },
    /// The changes are durable, but the acknowledgement record could not follow them.
    RecordBehind { reason: String },
}

impl Trouble {
    fn describe(&self) -> String {
        match self {
            Trouble::Frozen { reason, .. } => format!(
                "{reason}; reads show what was on disk before; writes resume by themselves once \
                 the store's filesystem takes writes again (free space there if it is full)"
            ),
            Trouble::RecordBehind { reason } => format!(
                "{reason}; writes resume by themselves once it can be written (free space on its \
                 filesystem if it is full)"
            ),
        }
    }
}

/// Reads made to fail, for tests.
#[cfg(any(test, feature = "test-hooks"))]
struct ReadFailure {
    /// Only reads of records whose encoded key starts with this fail; `None`: every read.
    under: Option<Vec<u8>>,
    reason: String,
}

struct FailedWrite {
    record: Record,
    /// What the key held before, durable.
    previous: Option<Record>,
}

pub(crate) fn record_key(key_bytes: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + key_bytes.len());
    k.push(RECORD);
    k.extend_from_slice(key_bytes);
    k
}

pub(crate) fn log_key(origin: &MachineId, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(41);
    k.push(LOG);
    k.extend_from_slice(origin.as_str().as_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

pub(crate) fn forgotten_key(origin: &MachineId) -> Vec<u8> {
    let mut k = Vec::with_capacity(33);
    k.push(FORGOTTEN);
    k.extend_from_slice(origin.as_str().as_bytes());
    k
}

pub(crate) fn digest_key(origin: &MachineId) -> Vec<u8> {
    let mut k = Vec::with_capacity(33);
    k.push(DIGEST);
    k.extend_from_slice(origin.as_str().as_bytes());
    k
}

pub(crate) fn decode_u64(bytes: &[u8]) -> Result<u64, StoreError> {
    bytes
        .try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::Malformed("counter is not 8 bytes".into()))
}

pub(crate) fn encode_hlc(h: Hlc) -> [u8; 12] {
    let mut out = [0u8; 12];
    out[..8].copy_from_slice(&h.wall_ms.to_be_bytes());
    out[8..].copy_from_slice(&h.counter.to_be_bytes());
    out
}

pub(crate) fn decode_hlc(bytes: &[u8]) -> Option<Hlc> {
    let wall: [u8; 8] = bytes.get(..8)?.try_into().ok()?;
    let counter: [u8; 4] = bytes.get(8..)?.try_into().ok()?;
    Some(Hlc {
        wall_ms: u64::from_be_bytes(wall),
        counter: u32::from_be_bytes(counter),
    })
}

pub(crate) fn decode_origin(bytes: &[u8]) -> Option<MachineId> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".into())
}

impl Backend {
    fn get(&self, key: &[u8]) -> Result<Option<sled::IVec>, StoreError> {
        match self {
            Backend::Open(s) => Ok(s.tree.get(key)?),
            Backend::Frozen(Ok(entries)) => Ok(entries.get(key).cloned()),
            Backend::Frozen(Err(reason)) => Err(unreadable_while_frozen(reason)),
        }
    }

    /// Calls `f` on every entry whose key starts with `prefix`, in key order, until it breaks.
    fn each_with_prefix(
        &self,
        prefix: &[u8],
        mut f: impl FnMut(&[u8], &sled::IVec) -> Result<ControlFlow<()>, StoreError>,
    ) -> Result<(), StoreError> {
        match self {
            Backend::Open(s) => {
                for item in s.tree.scan_prefix(prefix) {
                    let (k, v) = item?;
                    if f(&k, &v)?.is_break() {
                        break;
                    }
                }
            }
            Backend::Frozen(Ok(entries)) => {
                let range = entries.range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded));
                for (k, v) in range.take_while(|(k, _)| k.starts_with(prefix)) {
                    if f(k, v)?.is_break() {
                        break;
                    }
                }
            }
            Backend::Frozen(Err(reason)) => return Err(unreadable_while_frozen(reason)),
        }
        Ok(())
    }

    /// Calls `f` on every entry from `start` to `end` (both included), in key order, until it
    /// breaks.
    fn each_between(
        &self,
        start: &[u8],
        end: &[u8],
        mut f: impl FnMut(&[u8], &sled::IVec) -> Result<ControlFlow<()>, StoreError>,
    ) -> Result<(), StoreError> {
        match self {
            Backend::Open(s) => {
                for item in s.tree.range(start..=end) {
                    let (k, v) = item?;
                    if f(&k, &v)?.is_break() {
                        break;
                    }
                }
            }
            Backend::Frozen(Ok(entries)) => {
                let range =
                    entries.range::<[u8], _>((Bound::Included(start), Bound::Included(end)));
                for (k, v) in range {
                    if f(k, v)?.is_break() {
                        break;
                    }
                }
            }
            Backend::Frozen(Err(reason)) => return Err(unreadable_while_frozen(reason)),
        }
        Ok(())
    }
}

fn unreadable_while_frozen(reason: &str) -> StoreError {
    StoreError::Unwritable {
        reason: format!(
            "a write failed and what was on disk could not be read back ({reason}); nothing is \
             served until the store reopens, which it does by itself once its filesystem takes \
             writes again"
        ),
    }
}

/// One atomic change being assembled under the writer lock: a sled batch plus an overlay of
/// what it will have written, so later steps of the same change read their own writes.
///
/// It reads each record key and digest entry at most once, and remembers what every key it
/// writes held before, so that a batch sled refuses can be left out of reads without reading
/// anything again: a record key held the version read (encoded again: the encoding is
/// deterministic), a digest entry the value read; a log entry removed held the key of the
/// version it names (the store keeps the two in step, which opening checks); a log entry
/// inserted is new (an origin never numbers two writes alike). Keys only read are not
/// remembered, so a merge whose records are all held already keeps nothing.
struct Pending<'a> {
    tree: &'a sled::Tree,
    batch: sled::Batch,
    /// Per record key written: the version it holds once the batch applies.
    records: HashMap<Vec<u8>, Option<Record>>,
    digests: HashMap<MachineId, u64>,
    /// Per key written: what it held before the batch (the first value seen counts).
    before: HashMap<Vec<u8>, Option<sled::IVec>>,
}

/// A batch that sled did not take: what its keys held before, and why.
struct Refused {
    before: Vec<(Vec<u8>, Option<sled::IVec>)>,
    error: sled::Error,
}

impl<'a> Pending<'a> {
    fn new(tree: &'a sled::Tree) -> Pending<'a> {
        Pending {
            tree,
            batch: sled::Batch::default(),
            records: HashMap::new(),
            digests: HashMap::new(),
            before: HashMap::new(),
        }
    }

    /// Remembers what `key` held before the batch, unless already known.
    fn held_before(&mut self, key: &[u8], value: Option<sled::IVec>) {
        if !self.before.contains_key(key) {
            self.before.insert(key.to_vec(), value);
        }
    }

    /// Writes `key`; a key not read before is taken to be new.
    fn insert(&mut self, key: Vec<u8>, value: impl Into<sled::IVec>) {
        self.batch.insert(key.as_slice(), value);
        self.before.entry(key).or_insert(None);
    }

    /// Removes `key`, which held `held` before the batch (unless the batch wrote it first).
    fn remove(&mut self, key: Vec<u8>, held: Option<sled::IVec>) {
        self.batch.remove(key.as_slice());
        self.before.entry(key).or_insert(held);
    }

    fn digest(&mut self, origin: &MachineId) -> Result<u64, StoreError> {
        if let Some(n) = self.digests.get(origin) {
            return Ok(*n);
        }
        let key = digest_key(origin);
        let raw = self.tree.get(&key)?;
        let seq = match &raw {
            Some(v) => decode_u64(v)?,
            None => 0,
        };
        self.held_before(&key, raw);
        self.digests.insert(origin.clone(), seq);
        Ok(seq)
    }

    fn set_digest(&mut self, origin: &MachineId, seq: u64) -> Result<(), StoreError> {
        self.digest(origin)?;
        self.insert(digest_key(origin), &seq.to_be_bytes());
        self.digests.insert(origin.clone(), seq);
        Ok(())
    }

    /// Removes the digest entry of `origin`.
    fn remove_digest(&mut self, origin: &MachineId) -> Result<(), StoreError> {
        self.digest(origin)?;
        let key = digest_key(origin);
        self.batch.remove(key.as_slice());
        self.digests.insert(origin.clone(), 0);
        Ok(())
    }

    /// The version `rkey` holds: as this batch leaves it, or as read from the store.
    fn current(&self, key: &Key, rkey: &[u8]) -> Result<Option<Record>, StoreError> {
        if let Some(written) = self.records.get(rkey) {
            return Ok(written.clone());
        }
        match self.tree.get(rkey)? {
            Some(v) => Ok(Some(Record::decode(key.clone(), &v)?)),
            None => Ok(None),
        }
    }

    /// Installs `record` if it beats what is held for its key. Returns whether it did.
    fn merge_one(&mut self, record: &Record) -> Result<bool, StoreError> {
        let key_bytes = record.key.encode();
        let rkey = record_key(&key_bytes);
        let read;
        let held = match self.records.get(&rkey) {
            Some(written) => written.as_ref(),
            None => {
                read = match self.tree.get(&rkey)? {
                    Some(v) => Some(Record::decode(record.key.clone(), &v)?),
                    None => None,
                };
                read.as_ref()
            }
        };
        let (superseded, held_value) = match held {
            Some(current) if current.precedence(record).is_ge() => return Ok(false),
            Some(current) => (
                Some(log_key(&current.origin, current.seq)),
                Some(sled::IVec::from(current.encode_value())),
            ),
            None => (None, None),
        };
        if let Some(lkey) = superseded {
            self.remove(lkey, Some(sled::IVec::from(key_bytes.as_slice())));
        }
        self.held_before(&rkey, held_value);
        self.insert(rkey.clone(), record.encode_value());
        self.insert(log_key(&record.origin, record.seq), key_bytes);
        self.records.insert(rkey, Some(record.clone()));
        Ok(true)
    }

    /// Removes `held`, the version held for its key, and its log entry.
    fn remove_record(&mut self, held: &Record) {
        let key_bytes = held.key.encode();
        let rkey = record_key(&key_bytes);
        self.remove(
            log_key(&held.origin, held.seq),
            Some(key_bytes.as_slice().into()),
        );
        self.remove(rkey.clone(), Some(held.encode_value().into()));
        self.records.insert(rkey, None);
    }

    /// Applies the batch and flushes it. On failure, says what the touched keys held before,
    /// so that reads can go on showing only what is durable.
    fn commit(mut self, clock: Hlc, db: &sled::Db) -> Result<(), Result<Refused, StoreError>> {
        let held_clock = self.tree.get(CLOCK).map_err(|e| Err(e.into()))?;
        self.held_before(CLOCK, held_clock);
        self.batch.insert(CLOCK, &encode_hlc(clock));
        let applied = self
            .tree
            .apply_batch(self.batch)
            .and_then(|()| db.flush().map(drop));
        applied.map_err(|error| {
            Ok(Refused {
                before: self.before.into_iter().collect(),
                error,
            })
        })
    }
}

impl Store {
    /// Opens (or creates) the store in `path` for the Machine `local`, without an
    /// acknowledgement record. Refuses a store that does not read back.
    pub fn open(path: impl AsRef<Path>, local: MachineId) -> Result<Store, StoreError> {
        Store::open_with(path, local, &OpenOptions::default()).map(|(store, _)| store)
    }

    /// Opens (or creates) the store in `path` for the Machine `local`: removes what an
    /// interrupted snapshot left, opens sled (a panic is caught), reads every entry back, and
    /// compares the store with its acknowledgement record when `options` names one. Refuses a
    /// store that lost acknowledged data ([`StoreError::is_loss`]) unless `options` accepts the
    /// loss.
    pub fn open_with(
        path: impl AsRef<Path>,
        local: MachineId,
        options: &OpenOptions,
    ) -> Result<(Store, OpenReport), StoreError> {
        let path = path.as_ref().to_path_buf();
        let mut report = OpenReport::default();
        let acknowledged = match &options.acknowledged {
            None => None,
            Some(ack_path) => read_acknowledged(ack_path, &local, options, &mut report)?,
        };
        let (sled, mut inventory) = match open_and_read(&path, &local, &mut report) {
            Ok(opened) => opened,
            Err(e @ StoreError::Unreadable { .. }) if options.accept_loss => {
                // sled's snapshots and settings file can be done without: its log alone may
                // still hold what the store held (the acknowledgement record says what not).
                let hidden = set_aside_sled_metadata(&path)?;
                match open_and_read(&path, &local, &mut report) {
                    Ok(opened) => {
                        report.accepted_losses.push(format!(
                            "{e}; it was opened from its log alone, with its snapshot and \
                             settings files set aside ({})",
                            hidden
                                .iter()
                                .map(|p| p.display().to_string())
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                        opened
                    }
                    Err(_) => {
                        let aside = move_aside(&path)?;
                        report.accepted_losses.push(format!(
                            "{e}; its files were moved to {} and the store starts empty",
                            aside.display()
                        ));
                        open_and_read(&path, &local, &mut report)?
                    }
                }
            }
            Err(e) => return Err(e),
        };
        let mut repair = sled::Batch::default();
        let mut repairs = 0;
        for (k, v) in &inventory.missing_log {
            repair.insert(k.as_slice(), v.as_slice());
            repairs += 1;
        }
        if !inventory.bad.is_empty() {
            let (first_key, first_reason) = &inventory.bad[0];
            let what = format!(
                "{} of its {} entries do not read back (the first, '{}': {first_reason})",
                inventory.bad.len(),
                inventory.entries,
                String::from_utf8_lossy(first_key)
            );
            if !options.accept_loss {
                return Err(StoreError::Unreadable { path, reason: what });
            }
            for (k, _) in &inventory.bad {
                repair.remove(k.as_slice());
                repairs += 1;
            }
            report
                .accepted_losses
                .push(format!("{what}; they were removed"));
        }
        if let Some(ack) = &acknowledged {
            let missing = shortfalls(&local, ack, &inventory, &sled.tree)?;
            if !missing.is_empty() {
                if !options.accept_loss {
                    return Err(StoreError::Behind { path, missing });
                }
                // Never number a new write like one that may live on elsewhere.
                let acked = ack.digest.get(&local);
                if acked > inventory.digest.get(&local) {
                    repair.insert(digest_key(&local), &acked.to_be_bytes());
                    inventory.digest.0.insert(local.clone(), acked);
                    repairs += 1;
                }
                report.accepted_losses.extend(missing);
            }
        }
        let mut clock = Clock::starting_at(inventory.clock.unwrap_or_default());
        if let Some(ack) = &acknowledged {
            clock.observe(ack.clock);
        }
        if repairs > 0 {
            repair.insert(CLOCK, &encode_hlc(clock.last()));
            sled.tree.apply_batch(repair)?;
            sled.db.flush()?;
        }
        for loss in &report.accepted_losses {
            tracing::warn!(store = %path.display(), "opened accepting a loss: {loss}");
        }
        let last_local = last_local_write(&sled.tree, &local)?;
        let store = Store::assemble(
            sled,
            local,
            Some(path),
            options.acknowledged.clone(),
            clock,
            last_local,
        );
        {
            let mut writer = store.lock_writer();
            store.acknowledge(&mut writer);
            store.publish_writability(&writer);
        }
        Ok((store, report))
    }

    /// A store that lives in memory and in a temporary file removed on drop; for tests.
    pub fn temporary(local: MachineId) -> Result<Store, StoreError> {
        let db = sled::Config::new().temporary(true).open()?;
        let tree = db.open_tree(TREE)?;
        let clock = match tree.get(CLOCK)? {
            Some(v) => decode_hlc(&v)
                .ok_or_else(|| StoreError::Malformed("stored clock is not 12 bytes".into()))?,
            None => Hlc::default(),
        };
        Ok(Store::assemble(
            Sled { db, tree },
            local,
            None,
            None,
            Clock::starting_at(clock),
            None,
        ))
    }

    fn assemble(
        sled: Sled,
        local: MachineId,
        path: Option<PathBuf>,
        acknowledged: Option<PathBuf>,
        clock: Clock,
        last_local: Option<AcknowledgedWrite>,
    ) -> Store {
        let (changes, _) = broadcast::channel(WATCH_BUFFER);
        let (writability, _) = watch::channel(None);
        Store {
            local,
            path,
            acknowledged,
            backend: RwLock::new(Backend::Open(sled)),
            writer: Mutex::new(Writer {
                clock,
                trouble: None,
                last_local,
            }),
            changes,
            writability,
            max_drift_ms: AtomicU64::new(DEFAULT_MAX_DRIFT.as_millis() as u64),
            clock_offset_ms: AtomicI64::new(0),
            clock_refusals: Mutex::new(ClockRefusals::default()),
            #[cfg(any(test, feature = "test-hooks"))]
            read_failure: Mutex::new(None),
        }
    }

    fn lock_writer(&self) -> MutexGuard<'_, Writer> {
        lock(&self.writer)
    }

    fn read_backend(&self) -> RwLockReadGuard<'_, Backend> {
        self.backend.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_backend(&self) -> RwLockWriteGuard<'_, Backend> {
        self.backend.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The Machine this store writes as.
    pub fn local(&self) -> &MachineId {
        &self.local
    }

    /// Why writes are refused right now, or `None` when the store writes.
    pub fn write_failure(&self) -> Option<String> {
        self.writability.borrow().clone()
    }

    /// Follows [`Store::write_failure`]: changes when the store stops or resumes writing.
    pub fn writability(&self) -> watch::Receiver<Option<String>> {
        self.writability.subscribe()
    }

    /// Writes `value` under `key` as this Machine. Durable on disk when it returns.
    pub fn put(&self, key: &Key, value: Vec<u8>) -> Result<Record, StoreError> {
        self.write_local(key, value, false)
    }

    /// Deletes `key` by writing a tombstone. Durable on disk when it returns.
    pub fn delete(&self, key: &Key) -> Result<Record, StoreError> {
        self.write_local(key, Vec::new(), true)
    }

    fn write_local(
        &self,
        key: &Key,
        value: Vec<u8>,
        tombstone: bool,
    ) -> Result<Record, StoreError> {
        if let Owner::Machine(owner) = key.owner() {
            if owner != &self.local {
                return Err(StoreError::NotOwner {
                    key: key.to_string(),
                    local: self.local.clone(),
                });
            }
        }
        let mut writer = self.lock_writer();
        self.ready_to_write(&mut writer)?;
        let record = self.write_local_locked(&mut writer, key, value, tombstone)?;
        drop(writer);
        let _ = self.changes.send(Change {
            record: record.clone(),
        });
        Ok(record)
    }

    /// The local write itself, under the writer lock; announcing it is the caller's job.
    fn write_local_locked(
        &self,
        writer: &mut Writer,
        key: &Key,
        value: Vec<u8>,
        tombstone: bool,
    ) -> Result<Record, StoreError> {
        let mut backend = self.write_backend();
        let Backend::Open(sled) = &*backend else {
            return Err(self.refusal(writer));
        };
        let mut next_clock = writer.clock;
        let hlc = next_clock.tick(self.wall_ms());
        let mut pending = Pending::new(&sled.tree);
        let seq = pending.digest(&self.local)? + 1;
        let record = Record {
            key: key.clone(),
            value,
            origin: self.local.clone(),
            hlc,
            seq,
            tombstone,
        };
        let previous = pending.current(key, &record_key(&key.encode()))?;
        // The clock orders this write after everything held, so it always wins.
        if !pending.merge_one(&record)? {
            return Err(StoreError::Malformed(format!(
                "local write to '{key}' lost to a record already held; the clock went wrong"
            )));
        }
        pending.set_digest(&self.local, seq)?;
        match pending.commit(hlc, &sled.db) {
            Ok(()) => {}
            Err(Err(e)) => return Err(e),
            Err(Ok(refused)) => {
                let failed = Box::new(FailedWrite {
                    record: record.clone(),
                    previous,
                });
                return Err(self.freeze(writer, &mut backend, refused, Some(failed)));
            }
        }
        drop(backend);
        writer.clock = next_clock;
        writer.last_local = Some(AcknowledgedWrite::of(&record));
        self.acknowledge(writer);
        self.publish_writability(writer);
        Ok(record)
    }

    /// Makes every read ([`Store::get`], [`Store::scan`], [`Store::scan_live`],
    /// [`Store::digest`], [`Store::records_after`]) fail with an i/o error saying `reason`, until
    /// called with `None`; writes go on. For tests of what the store's readers do when the disk
    /// fails under them; built only with the `test-hooks` feature.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn fail_reads(&self, reason: Option<&str>) {
        *lock(&self.read_failure) = reason.map(|reason| ReadFailure {
            under: None,
            reason: reason.to_owned(),
        });
    }

    /// Like [`Store::fail_reads`], but only the reads of records under `prefix` fail (a `get`
    /// of a key under it, a scan that overlaps it): one namespace unreadable while the rest
    /// reads. Lifted by `fail_reads(None)`. Built only with the `test-hooks` feature.
    #[cfg(any(test, feature = "test-hooks"))]
    pub fn fail_reads_under(&self, prefix: &KeyPrefix, reason: &str) {
        *lock(&self.read_failure) = Some(ReadFailure {
            under: Some(prefix.as_bytes().to_vec()),
            reason: reason.to_owned(),
        });
    }

    /// `Ok` unless reads of records whose encoded keys start with `prefix` (`None`: a read that
    /// is not of records, failing only when every read does) were made to fail
    /// ([`Store::fail_reads`], test builds only).
    #[cfg_attr(not(any(test, feature = "test-hooks")), allow(unused_variables))]
    fn readable(&self, prefix: Option<&[u8]>) -> Result<(), StoreError> {
        #[cfg(any(test, feature = "test-hooks"))]
        if let Some(failure) = lock(&self.read_failure).as_ref() {
            let hit = match (&failure.under, prefix) {
                (None, _) => true,
                (Some(_), None) => false,
                (Some(under), Some(p)) => p.starts_with(under) || under.starts_with(p),
            };
            if hit {
                return Err(StoreError::Io(sled::Error::Io(std::io::Error::other(
                    failure.reason.clone(),
                ))));
            }
        }
        Ok(())
    }

    /// The record currently winning for `key`, tombstones included.
    pub fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        let encoded = key.encode();
        self.readable(Some(&encoded))?;
        match self.read_backend().get(&record_key(&encoded))? {
            Some(bytes) => Ok(Some(Record::decode(key.clone(), &bytes)?)),
            None => Ok(None),
        }
    }

    /// Every record under `prefix`, tombstones included, in key order.
    pub fn scan(&self, prefix: &KeyPrefix) -> Result<Vec<Record>, StoreError> {
        self.readable(Some(prefix.as_bytes()))?;
        let mut out = Vec::new();
        self.read_backend()
            .each_with_prefix(&record_key(prefix.as_bytes()), |k, v| {
                out.push(Record::decode(Key::decode(&k[1..])?, v)?);
                Ok(ControlFlow::Continue(()))
            })?;
        Ok(out)
    }

    /// Every record under `prefix` that is not a tombstone, in key order.
    pub fn scan_live(&self, prefix: &KeyPrefix) -> Result<Vec<Record>, StoreError> {
        let mut all = self.scan(prefix)?;
        all.retain(|r| !r.tombstone);
        Ok(all)
    }

    /// Watches every change under `prefix` from now on.
    pub fn watch(&self, prefix: KeyPrefix) -> Watch {
        self.watch_any(vec![prefix])
    }

    /// Watches the keys under any of `prefixes`, as one stream.
    pub fn watch_any(&self, prefixes: Vec<KeyPrefix>) -> Watch {
        Watch {
            prefixes,
            rx: self.changes.subscribe(),
        }
    }

    /// Merges records from a peer. Each wins or loses against what is held by precedence;
    /// merging the same records again, or in another order, ends the same. The digest is not
    /// raised (that is [`Store::apply_batch`]'s job). Records too far ahead of this store's clock
    /// ([`Store::set_max_drift`]) are left out, and records for the machine-owned keys of a
    /// forgotten Machine ([`Store::forget_origin`]) ignored; the others merge. One atomic batch,
    /// durable when it returns.
    pub fn merge(&self, records: &[Record]) -> Result<MergeReport, StoreError> {
        self.merge_inner(records, None)
    }

    /// Merges a [`SyncBatch`] and, when it starts at or below this store's digest for its origin,
    /// raises the digest to the batch's `up_to` (to just below a record refused for its clock,
    /// when one is: see [`sync`](crate::SyncBatch)), in one atomic step. Durable when it
    /// returns.
    pub fn apply_batch(&self, batch: &SyncBatch) -> Result<MergeReport, StoreError> {
        self.merge_inner(&batch.records, Some(batch))
    }

    fn merge_inner(
        &self,
        incoming: &[Record],
        batch: Option<&SyncBatch>,
    ) -> Result<MergeReport, StoreError> {
        for r in incoming {
            if let Owner::Machine(owner) = r.key.owner() {
                if owner != &r.origin {
                    return Err(StoreError::ForeignWrite {
                        key: r.key.to_string(),
                        origin: r.origin.clone(),
                    });
                }
            }
            if r.tombstone && !r.value.is_empty() {
                return Err(StoreError::Malformed(format!(
                    "tombstone for '{}' carries a value",
                    r.key
                )));
            }
        }
        let mut writer = self.lock_writer();
        self.ready_to_write(&mut writer)?;
        let mut backend = self.write_backend();
        let Backend::Open(sled) = &*backend else {
            return Err(self.refusal(&writer));
        };
        let forgotten = forgotten_in(&sled.tree)?;
        let now = self.wall_ms();
        let max_drift_ms = self.max_drift_ms.load(Ordering::Relaxed);
        let latest_accepted = now.saturating_add(max_drift_ms);
        let mut next_clock = writer.clock;
        let mut pending = Pending::new(&sled.tree);
        let mut applied = Vec::new();
        let mut too_far_ahead: Vec<(&MachineId, u64)> = Vec::new();
        // How far the batch's origin's digest may be raised, and the highest sequence of that
        // origin among the records seen so far (see sync.rs on why).
        let mut raise_to = batch.map_or(0, |b| b.up_to);
        let mut origin_seen = batch.map_or(0, |b| b.after);
        for (i, r) in incoming.iter().enumerate() {
            let of_batch_origin = batch.is_some_and(|b| b.origin == r.origin);
            // Our own writes coming back from a peer (after data loss here): never reuse
            // their sequence numbers, whether they merge or not.
            if r.origin == self.local && r.seq > pending.digest(&self.local)? {
                pending.set_digest(&self.local, r.seq)?;
            }
            if r.hlc.wall_ms > latest_accepted {
                too_far_ahead.push((&r.origin, r.hlc.wall_ms - now));
                let below = if of_batch_origin {
                    r.seq.saturating_sub(1)
                } else {
                    origin_seen
                };
                raise_to = raise_to.min(below);
                continue;
            }
            if of_batch_origin {
                origin_seen = origin_seen.max(r.seq);
            }
            if matches!(r.key.owner(), Owner::Machine(owner) if forgotten.contains(owner)) {
                continue;
            }
            next_clock.observe(r.hlc);
            if pending.merge_one(r)? {
                applied.push(i);
            }
        }
        if let Some(b) = batch {
            let have = pending.digest(&b.origin)?;
            let raise_to = raise_to.min(b.up_to);
            if b.after <= have && raise_to > have {
                pending.set_digest(&b.origin, raise_to)?;
            }
        }
        self.count_clock_refusals(&too_far_ahead, max_drift_ms);
        let last = next_clock.tick(now);
        match pending.commit(last, &sled.db) {
            Ok(()) => {}
            Err(Err(e)) => return Err(e),
            Err(Ok(refused)) => return Err(self.freeze(&mut writer, &mut backend, refused, None)),
        }
        drop(backend);
        writer.clock = next_clock;
        if let Some(mine) = applied
            .iter()
            .rev()
            .map(|&i| &incoming[i])
            .find(|r| r.origin == self.local)
        {
            writer.last_local = Some(AcknowledgedWrite::of(mine));
        }
        self.acknowledge(&mut writer);
        self.publish_writability(&writer);
        drop(writer);
        let report = MergeReport {
            applied: applied.len(),
            ignored: incoming.len() - applied.len() - too_far_ahead.len(),
            too_far_ahead: too_far_ahead.len(),
        };
        for i in applied {
            let _ = self.changes.send(Change {
                record: incoming[i].clone(),
            });
        }
        Ok(report)
    }

    /// Counts records refused for their clock, and logs each origin's once a minute at most.
    fn count_clock_refusals(&self, refused: &[(&MachineId, u64)], max_drift_ms: u64) {
        if refused.is_empty() {
            return;
        }
        let mut ahead_by: BTreeMap<&MachineId, u64> = BTreeMap::new();
        let mut refusals = lock(&self.clock_refusals);
        for &(origin, ahead_ms) in refused {
            *refusals.counts.entry(origin.clone()).or_default() += 1;
            let most = ahead_by.entry(origin).or_default();
            *most = (*most).max(ahead_ms);
        }
        let now = Instant::now();
        for (origin, ahead_ms) in ahead_by {
            let due = refusals
                .warned
                .get(origin)
                .is_none_or(|at| now.duration_since(*at) >= CLOCK_WARNING_EVERY);
            if !due {
                continue;
            }
            refusals.warned.insert(origin.clone(), now);
            let total = refusals.counts.get(origin).copied().unwrap_or(0);
            tracing::warn!(
                %origin,
                ahead_ms,
                max_drift_ms,
                refused_so_far = total,
                "records from Machine {origin} are {ahead_ms} ms ahead of this Machine's clock, \
                 beyond the allowed drift of {max_drift_ms} ms: they are not merged until the \
                 clocks agree; set the clock of whichever Machine is wrong right (NTP), or raise \
                 mesh.max_clock_drift_ms"
            );
        }
    }

    /// How far ahead of this store's wall clock a remote record's HLC may be before the record
    /// is refused ([`MergeReport::too_far_ahead`]). [`DEFAULT_MAX_DRIFT`] until set; the daemon
    /// sets it from `mesh.max_clock_drift_ms`. Takes effect from the next merge.
    pub fn set_max_drift(&self, bound: Duration) {
        let ms = u64::try_from(bound.as_millis()).unwrap_or(u64::MAX);
        self.max_drift_ms.store(ms, Ordering::Relaxed);
    }

    /// The drift bound in force ([`Store::set_max_drift`]).
    pub fn max_drift(&self) -> Duration {
        Duration::from_millis(self.max_drift_ms.load(Ordering::Relaxed))
    }

    /// Shifts this store's wall clock by `offset_ms` milliseconds (negative: behind the system's
    /// clock), for the timestamps of local writes and for the drift check of merges. For tests
    /// of Machines whose clocks disagree (the daemon's `mesh.clock_offset_ms`); 0 by default.
    pub fn set_clock_offset_ms(&self, offset_ms: i64) {
        self.clock_offset_ms.store(offset_ms, Ordering::Relaxed);
    }

    /// This store's wall clock: the system's, shifted by [`Store::set_clock_offset_ms`].
    fn wall_ms(&self) -> u64 {
        wall_now_ms().saturating_add_signed(self.clock_offset_ms.load(Ordering::Relaxed))
    }

    /// Per origin, how many of its records were refused because their HLC ran further ahead of
    /// this store's clock than the drift bound, since the store opened. For a metric.
    pub fn clock_refusals(&self) -> BTreeMap<MachineId, u64> {
        lock(&self.clock_refusals).counts.clone()
    }

    /// Forgets a Machine removed from the Cluster, in one atomic, durable step: removes every
    /// record of its machine-owned keys (`m/*/<machine>/...`) with their log entries, removes its
    /// digest entry when nothing it wrote is held any more, and remembers it as forgotten
    /// (persisted), so that later merges ignore records for its machine-owned keys
    /// ([`MergeReport::ignored`]). Cluster-scoped records it wrote stay, with their log entries
    /// (and its digest entry), so they still travel and every store keeps the same winner; see
    /// [`sync`](crate::SyncBatch). Watchers are told of each removed key by a tombstone that is
    /// not stored (the removed version's origin, HLC and sequence, no value). Forgetting again
    /// does nothing more. Returns how many records were removed.
    pub fn forget_origin(&self, machine: &MachineId) -> Result<usize, StoreError> {
        if machine == &self.local {
            return Err(StoreError::ForgetLocal {
                machine: machine.clone(),
            });
        }
        let mut writer = self.lock_writer();
        self.ready_to_write(&mut writer)?;
        let mut backend = self.write_backend();
        let Backend::Open(sled) = &*backend else {
            return Err(self.refusal(&writer));
        };
        let mut pending = Pending::new(&sled.tree);
        let mut removed = Vec::new();
        let mut still_held = false;
        for item in sled
            .tree
            .range(log_key(machine, 0)..=log_key(machine, u64::MAX))
        {
            let (lkey, key_bytes) = item?;
            let key = Key::decode(&key_bytes)?;
            if !matches!(key.owner(), Owner::Machine(owner) if owner == machine) {
                still_held = true;
                continue;
            }
            match pending.current(&key, &record_key(&key_bytes))? {
                Some(held) => {
                    pending.remove_record(&held);
                    removed.push(held);
                }
                None => pending.remove(lkey.to_vec(), Some(key_bytes)),
            }
        }
        if !still_held {
            pending.remove_digest(machine)?;
        }
        let fkey = forgotten_key(machine);
        let was_forgotten = sled.tree.get(&fkey)?;
        pending.held_before(&fkey, was_forgotten);
        pending.insert(fkey, Vec::new());
        match pending.commit(writer.clock.last(), &sled.db) {
            Ok(()) => {}
            Err(Err(e)) => return Err(e),
            Err(Ok(refused)) => return Err(self.freeze(&mut writer, &mut backend, refused, None)),
        }
        drop(backend);
        self.acknowledge(&mut writer);
        self.publish_writability(&writer);
        drop(writer);
        tracing::info!(%machine, removed = removed.len(), "forgot a removed Machine's records");
        let count = removed.len();
        for held in removed {
            let _ = self.changes.send(Change {
                record: Record {
                    value: Vec::new(),
                    tombstone: true,
                    ..held
                },
            });
        }
        Ok(count)
    }

    /// The Machines this store has forgotten ([`Store::forget_origin`]).
    pub fn forgotten(&self) -> Result<BTreeSet<MachineId>, StoreError> {
        self.readable(None)?;
        let mut out = BTreeSet::new();
        self.read_backend().each_with_prefix(&[FORGOTTEN], |k, _| {
            out.insert(decode_origin(&k[1..]).ok_or_else(|| {
                StoreError::Malformed("a forgotten Machine's ID does not decode".into())
            })?);
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(out)
    }

    /// Per origin, the highest sequence this store has incorporated.
    pub fn digest(&self) -> Result<Digest, StoreError> {
        self.readable(None)?;
        let mut out = Digest::default();
        self.read_backend().each_with_prefix(&[DIGEST], |k, v| {
            let origin = decode_origin(&k[1..])
                .ok_or_else(|| StoreError::Malformed("digest origin is not a Machine ID".into()))?;
            out.0.insert(origin, decode_u64(v)?);
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(out)
    }

    /// Answers "records of origin O after sequence N" with at most `limit` records.
    pub fn records_after(
        &self,
        request: &SyncRequest,
        limit: usize,
    ) -> Result<SyncBatch, StoreError> {
        self.records_after_within(request, limit, usize::MAX)
    }

    /// Answers "records of origin O after sequence N" with at most `max_records` records
    /// totalling at most `max_bytes` ([`Record::stored_len`]), except that a batch holds at
    /// least one record when one is due (and `max_records` is not 0), however large: a record
    /// bigger than the bound still travels, alone. A batch cut short ends (`up_to`) just before
    /// the first record left out.
    pub fn records_after_within(
        &self,
        request: &SyncRequest,
        max_records: usize,
        max_bytes: usize,
    ) -> Result<SyncBatch, StoreError> {
        self.readable(None)?;
        let backend = self.read_backend();
        let have = match backend.get(&digest_key(&request.origin))? {
            Some(v) => decode_u64(&v)?,
            None => 0,
        };
        let mut batch = SyncBatch {
            origin: request.origin.clone(),
            after: request.after,
            up_to: have.max(request.after),
            records: Vec::new(),
        };
        if have <= request.after {
            return Ok(batch);
        }
        let start = log_key(&request.origin, request.after + 1);
        let end = log_key(&request.origin, have);
        let mut bytes = 0usize;
        backend.each_between(&start, &end, |lk, key_bytes| {
            let seq = decode_u64(&lk[33..])?;
            if batch.records.len() == max_records {
                batch.up_to = seq - 1;
                return Ok(ControlFlow::Break(()));
            }
            if let Some(v) = backend.get(&record_key(key_bytes))? {
                let size = key_bytes.len() + v.len();
                if !batch.records.is_empty() && bytes.saturating_add(size) > max_bytes {
                    batch.up_to = seq - 1;
                    return Ok(ControlFlow::Break(()));
                }
                bytes = bytes.saturating_add(size);
                batch
                    .records
                    .push(Record::decode(Key::decode(key_bytes)?, &v)?);
            }
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(batch)
    }

    /// Flushes everything to disk (and the acknowledgement record, if it fell behind); called
    /// on shutdown.
    pub fn flush(&self) -> Result<(), StoreError> {
        let mut writer = self.lock_writer();
        if let Backend::Open(sled) = &*self.read_backend() {
            sled.db.flush()?;
        }
        if let Some(Trouble::RecordBehind { .. }) = writer.trouble {
            writer.trouble = None;
            self.acknowledge(&mut writer);
            self.publish_writability(&writer);
        }
        match &writer.trouble {
            Some(t) => Err(StoreError::Unwritable {
                reason: t.describe(),
            }),
            None => Ok(()),
        }
    }

    /// Tries to make a store that refuses writes write again: writes the acknowledgement
    /// record if it fell behind; reopens a frozen store from disk once a probe write to its
    /// directory succeeds. Returns whether the store writes now. Cheap when nothing is wrong;
    /// every write tries it too.
    pub fn recover(&self) -> bool {
        let mut writer = self.lock_writer();
        self.ready_to_write(&mut writer).is_ok()
    }

    /// Recovers if needed; refuses when the store still cannot write.
    fn ready_to_write(&self, writer: &mut Writer) -> Result<(), StoreError> {
        match writer.trouble.take() {
            None => return Ok(()),
            Some(Trouble::RecordBehind { .. }) => self.acknowledge(writer),
            Some(Trouble::Frozen { reason, failed }) => {
                if let Err(still) = self.reopen(writer, failed.as_deref()) {
                    tracing::debug!(reason = %still, "the store cannot reopen yet");
                    writer.trouble = Some(Trouble::Frozen { reason, failed });
                }
            }
        }
        self.publish_writability(writer);
        match &writer.trouble {
            None => Ok(()),
            Some(_) => Err(self.refusal(writer)),
        }
    }

    fn refusal(&self, writer: &Writer) -> StoreError {
        StoreError::Unwritable {
            reason: writer
                .trouble
                .as_ref()
                .map_or_else(|| "the store is reopening".into(), Trouble::describe),
        }
    }

    fn publish_writability(&self, writer: &Writer) {
        let now = writer.trouble.as_ref().map(Trouble::describe);
        self.writability.send_if_modified(|held| {
            if *held == now {
                return false;
            }
            *held = now;
            true
        });
    }

    /// sled refused a change: serve what was durable from memory from now on, drop sled so it
    /// can be opened again, and refuse writes until it is.
    fn freeze(
        &self,
        writer: &mut Writer,
        backend: &mut Backend,
        refused: Refused,
        failed: Option<Box<FailedWrite>>,
    ) -> StoreError {
        let Refused { before, error } = refused;
        let durable = match &*backend {
            Backend::Open(sled) => {
                catch_unwind(AssertUnwindSafe(|| durable_copy(&sled.tree, before)))
                    .unwrap_or_else(|p| Err(format!("sled panicked ({})", panic_message(&*p))))
            }
            Backend::Frozen(entries) => entries.clone(),
        };
        // Dropping the old handle releases sled's lock on its files.
        *backend = Backend::Frozen(durable);
        let reason = format!("a write failed ({})", StoreError::Io(error));
        tracing::error!(store = ?self.path, %reason, "the store stops taking writes until its disk takes them again");
        writer.trouble = Some(Trouble::Frozen { reason, failed });
        self.publish_writability(writer);
        self.refusal(writer)
    }

    /// Makes a frozen store write again: opens it again from disk (unless an earlier attempt
    /// did), then undoes a local write that was reported failed but reached the disk after all.
    fn reopen(&self, writer: &mut Writer, failed: Option<&FailedWrite>) -> Result<(), String> {
        let frozen = matches!(*self.read_backend(), Backend::Frozen(_));
        let mut differing = if frozen {
            self.open_again(writer)?
        } else {
            Vec::new()
        };
        if let Some(f) = failed {
            let landed = self
                .get(&f.record.key)
                .map_err(|e| e.to_string())?
                .is_some_and(|r| r.origin == f.record.origin && r.seq == f.record.seq);
            if landed {
                let (value, tombstone) = match f.previous.as_ref().and_then(Record::live_value) {
                    Some(v) => (v.to_vec(), false),
                    None => (Vec::new(), true),
                };
                let undo = self
                    .write_local_locked(writer, &f.record.key, value, tombstone)
                    .map_err(|e| format!("cannot undo a write reported failed: {e}"))?;
                tracing::warn!(key = %f.record.key, "a write reported failed had reached the disk; undone");
                differing.retain(|r| r.key != undo.key);
                differing.push(undo);
            }
        }
        self.acknowledge(writer);
        for record in differing {
            let _ = self.changes.send(Change { record });
        }
        Ok(())
    }

    /// Opens the frozen store's files again once a probe write succeeds, checks they hold
    /// what was acknowledged, and serves from them. Returns the records that differ from what
    /// was served meanwhile (what watchers have not been told).
    fn open_again(&self, writer: &mut Writer) -> Result<Vec<Record>, String> {
        let path = self
            .path
            .as_ref()
            .ok_or_else(|| "a temporary store cannot reopen".to_owned())?;
        probe(path).map_err(|e| format!("its directory still refuses writes: {e}"))?;
        let mut report = OpenReport::default();
        let (sled, inventory) =
            open_and_read(path, &self.local, &mut report).map_err(|e| e.to_string())?;
        if let Some((key, reason)) = inventory.bad.first() {
            return Err(format!(
                "after reopening, '{}' does not read back ({reason}); restart the daemon to see \
                 the ways out",
                String::from_utf8_lossy(key)
            ));
        }
        if let Some(ack_path) = &self.acknowledged {
            if let Ok(Some(ack)) = Acknowledged::read(ack_path) {
                let missing = shortfalls(&self.local, &ack, &inventory, &sled.tree)
                    .map_err(|e| e.to_string())?;
                if !missing.is_empty() {
                    return Err(format!(
                        "after reopening, the store holds less than it acknowledged: {}; restart \
                         the daemon to see the ways out",
                        missing.join("; ")
                    ));
                }
            }
        }
        let last_local = last_local_write(&sled.tree, &self.local).map_err(|e| e.to_string())?;
        let mut differing = Vec::new();
        let mut backend = self.write_backend();
        if let Backend::Frozen(Ok(served)) = &*backend {
            for item in sled.tree.scan_prefix([RECORD]) {
                let (k, v) = item.map_err(|e| e.to_string())?;
                if served.get(k.as_ref()) != Some(&v) {
                    if let Ok(r) = Key::decode(&k[1..]).and_then(|key| Record::decode(key, &v)) {
                        differing.push(r);
                    }
                }
            }
        }
        *backend = Backend::Open(sled);
        drop(backend);
        if let Some(clock) = inventory.clock {
            writer.clock.observe(clock);
        }
        writer.last_local = last_local;
        tracing::info!(store = %path.display(), "the store reopened and takes writes again");
        Ok(differing)
    }

    /// Writes the acknowledgement record for what the store holds now. A failure is not the
    /// write's (it is durable): it makes the store refuse writes until the record can follow.
    fn acknowledge(&self, writer: &mut Writer) {
        let Some(path) = &self.acknowledged else {
            return;
        };
        let result = self.digest().map_err(|e| e.to_string()).and_then(|digest| {
            Acknowledged {
                machine_id: self.local.clone(),
                digest,
                clock: writer.clock.last(),
                last_local: writer.last_local.clone(),
            }
            .write(path)
            .map_err(|e| e.to_string())
        });
        if let Err(e) = result {
            let reason = format!(
                "the acknowledgement record {} cannot be written ({e})",
                path.display()
            );
            tracing::error!(%reason, "the store stops taking writes until it can");
            writer.trouble = Some(Trouble::RecordBehind { reason });
        }
    }
}

/// The Machines forgotten in `tree`.
fn forgotten_in(tree: &sled::Tree) -> Result<BTreeSet<MachineId>, StoreError> {
    let mut out = BTreeSet::new();
    for item in tree.scan_prefix([FORGOTTEN]) {
        let (k, _) = item?;
        out.insert(decode_origin(&k[1..]).ok_or_else(|| {
            StoreError::Malformed("a forgotten Machine's ID does not decode".into())
        })?);
    }
    Ok(out)
}

/// Everything in `tree`, with the keys of a refused batch put back as they were.
fn durable_copy(
    tree: &sled::Tree,
    before: Vec<(Vec<u8>, Option<sled::IVec>)>,
) -> Result<BTreeMap<Vec<u8>, sled::IVec>, String> {
    let mut entries = BTreeMap::new();
    for item in tree.iter() {
        let (k, v) = item.map_err(|e| e.to_string())?;
        entries.insert(k.to_vec(), v);
    }
    for (k, v) in before {
        match v {
            Some(v) => entries.insert(k, v),
            None => entries.remove(&k),
        };
    }
    Ok(entries)
}

/// Writes and removes a file in `dir`: whether the filesystem takes writes again.
fn probe(dir: &Path) -> std::io::Result<()> {
    use std::io::Write as _;
    let path = dir.join(PROBE_FILE);
    let result = (|| {
        let mut f = std::fs::File::create(&path)?;
        f.write_all(&[0u8; PROBE_BYTES])?;
        f.sync_all()
    })();
    let _ = std::fs::remove_file(&path);
    result
}
