//! The store itself: local writes, merges and the sync answers, and how it stays honest about
//! what is on disk.
//!
//! Layout: one sled tree, entries told apart by their first byte, so that every change is one
//! atomic sled batch:
//!
//! - `c` + chunk number (big-endian): a chunk of records, the ones a change installed (see
//!   [`index`](crate::index): a merge of thousands of records is a few sled entries, not one per
//!   record);
//! - `d` + origin: the highest sequence incorporated from that origin (the digest);
//! - `h`: the clock's last timestamp;
//! - `f` + origin: a Machine forgotten ([`Store::forget_origin`]), its records for
//!   machine-owned keys ignored from then on.
//!
//! The store's earlier layout (`r` + key: the record winning for the key; `l` + origin + seq:
//! the key of a record held) is rewritten into chunks when such a store opens.
//!
//! Everything held is also kept in memory (the [`Index`]), changed only once sled has taken
//! and flushed a change: reads never touch the disk, and never show what it has not taken.
//!
//! Durability. A change is applied as one batch and flushed before the call returns, and only
//! then shown to readers. When the disk refuses (full, read-only, failing), sled refuses every
//! later write until it is opened again: the store then *freezes*. It goes on serving what was
//! durable (the index, which never took the failed change), refuses writes saying why, and reopens itself from disk once a probe write to its directory
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
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use ployz_core::MachineId;
use tokio::sync::{broadcast, watch};

use crate::acknowledged::{Acknowledged, AcknowledgedWrite};
use crate::hlc::{wall_now_ms, Clock};
use crate::index::{Index, Pending, EARLIER_LAYOUT};
use crate::opening::{
    last_local_write, move_aside, open_and_read, read_acknowledged, set_aside_sled_metadata,
    shortfalls, Inventory,
};
use crate::{
    Change, Digest, Hlc, Key, KeyPrefix, Owner, Record, StoreError, SyncBatch, SyncRequest, Watch,
};

/// How many changes a slow watcher may fall behind before it is told to rescan.
const WATCH_BUFFER: usize = 4096;

/// The first byte of an entry of the earlier layout holding a record (`r` + key).
pub(crate) const RECORD: u8 = b'r';
/// The first byte of an entry of the earlier layout naming a record held (`l` + origin + seq).
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
    /// What the store holds, as durable: a change is applied to it once flushed.
    index: RwLock<Index>,
    /// Serialises writes, merges and recovery; holds sled.
    writer: Mutex<Writer>,
    changes: broadcast::Sender<Change>,
    /// Why writes are refused, while they are.
    writability: watch::Sender<Option<String>>,
    /// How far ahead of the wall clock a remote record's HLC may be, in milliseconds.
    max_drift_ms: AtomicU64,
    /// The wall time of the writer's clock (its last timestamp), kept beside it for readers
    /// that must not wait for the writer ([`Store::clock_ahead`]).
    clock_wall_ms: AtomicU64,
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

/// The writer's state, under [`Store::writer`].
struct Writer {
    /// `None` while the store is frozen: dropping sled lets it be opened again.
    sled: Option<Sled>,
    clock: Clock,
    trouble: Option<Trouble>,
    /// This Machine's last local write still held, for the acknowledgement record.
    last_local: Option<AcknowledgedWrite>,
}

/// How a reopen that failed because the store's directory still refuses writes begins.
const STILL_REFUSES: &str = "its directory still refuses writes";

/// Why writes are refused.
enum Trouble {
    /// sled refused a change; the store is frozen until it reopens.
    Frozen {
        reason: String,
        /// The local write that failed, undone if it reached the disk after all.
        failed: Option<Box<FailedWrite>>,
        /// Why the last attempt to reopen failed, when its directory did take writes again:
        /// then it does not resume by itself.
        cannot_reopen: Option<String>,
    },
    /// The changes are durable, but the acknowledgement record could not follow them.
    RecordBehind { reason: String },
    /// This process handed its files to the daemon process taking over from it
    /// ([`Store::hand_over`]); it never writes again.
    HandedOver,
}

impl Trouble {
    fn describe(&self) -> String {
        match self {
            Trouble::Frozen {
                reason,
                cannot_reopen: Some(why),
                ..
            } => {
                let restart = if why.contains("restart the daemon") {
                    ""
                } else {
                    "; restart the daemon to see the ways out"
                };
                format!("{reason}; reads show what was on disk before; the store cannot reopen: {why}{restart}")
            }
            Trouble::Frozen { reason, .. } => format!(
                "{reason}; reads show what was on disk before; writes resume by themselves once \
                 the store's filesystem takes writes again (free space there if it is full)"
            ),
            Trouble::RecordBehind { reason } => format!(
                "{reason}; writes resume by themselves once it can be written (free space on its \
                 filesystem if it is full)"
            ),
            Trouble::HandedOver => "this daemon process handed its store to the process taking \
                 over from it; send the write again, and that process takes it"
                .to_owned(),
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

/// Applies a change to sled and flushes it.
fn write_down(sled: &Sled, batch: sled::Batch) -> sled::Result<()> {
    sled.tree.apply_batch(batch)?;
    sled.db.flush()?;
    Ok(())
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
        let (sled, inventory) = match open_and_read(&path, &local, &mut report) {
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
        let Inventory {
            entries,
            mut index,
            clock: stored_clock,
            bad,
            earlier,
            local_beyond,
        } = inventory;
        let mut raise_local_to = None;
        if let Some((seq, what)) = local_beyond {
            if !options.accept_loss {
                return Err(StoreError::Unreadable { path, reason: what });
            }
            raise_local_to = Some(seq);
            report.accepted_losses.push(format!(
                "{what}; the digest was raised to {seq}, so no number is used twice"
            ));
        }
        if !bad.is_empty() {
            let (first_key, first_reason) = &bad[0];
            let what = format!(
                "{} of its {} entries do not read back (the first, '{}': {first_reason})",
                bad.len(),
                entries,
                String::from_utf8_lossy(first_key)
            );
            if !options.accept_loss {
                return Err(StoreError::Unreadable { path, reason: what });
            }
            report
                .accepted_losses
                .push(format!("{what}; they were removed"));
        }
        if let Some(ack) = &acknowledged {
            let missing = shortfalls(&local, ack, &index);
            if !missing.is_empty() {
                if !options.accept_loss {
                    return Err(StoreError::Behind { path, missing });
                }
                // Never number a new write like one that may live on elsewhere.
                let acked = ack.digest.get(&local);
                if acked > index.digest.get(&local) {
                    raise_local_to = raise_local_to.max(Some(acked));
                }
                report.accepted_losses.extend(missing);
            }
        }
        let mut clock = Clock::starting_at(stored_clock.unwrap_or_default());
        if let Some(ack) = &acknowledged {
            clock.observe(ack.clock);
        }
        // Repairs, one atomic batch: entries that do not read back removed (the loss was
        // accepted above), the earlier layout rewritten into chunks, chunks none of whose
        // records wins any more removed, the local sequence raised.
        let mut pending = Pending::new(&index);
        for (k, _) in bad {
            pending.remove_entry(k);
        }
        if !earlier.is_empty() {
            for k in earlier {
                pending.remove_entry(k);
            }
            pending.rewrite_chunk(EARLIER_LAYOUT);
        }
        for n in index.spent_chunks() {
            if n != EARLIER_LAYOUT {
                pending.remove_spent_chunk(n);
            }
        }
        if let Some(seq) = raise_local_to {
            pending.set_digest(&local, seq);
        }
        if !pending.is_empty() {
            let (batch, delta) = pending.lay_down(clock.last());
            write_down(&sled, batch)?;
            index.apply(delta);
        }
        for loss in &report.accepted_losses {
            tracing::warn!(store = %path.display(), "opened accepting a loss: {loss}");
        }
        let last_local = last_local_write(&index, &local);
        let store = Store::assemble(
            sled,
            index,
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
            Index::default(),
            local,
            None,
            None,
            Clock::starting_at(clock),
            None,
        ))
    }

    fn assemble(
        sled: Sled,
        index: Index,
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
            index: RwLock::new(index),
            clock_wall_ms: AtomicU64::new(clock.last().wall_ms),
            writer: Mutex::new(Writer {
                sled: Some(sled),
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

    fn read_index(&self) -> RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write_index(&self) -> RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(PoisonError::into_inner)
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
        if writer.sled.is_none() {
            return Err(self.refusal(writer));
        }
        let mut next_clock = writer.clock;
        let hlc = next_clock.tick(self.wall_ms());
        let index = self.read_index();
        let mut pending = Pending::new(&index);
        let seq = pending.digest(&self.local) + 1;
        let record = Record {
            key: key.clone(),
            value,
            origin: self.local.clone(),
            hlc,
            seq,
            tombstone,
        };
        let previous = index.get(&key.encode()).cloned();
        // The clock orders this write after everything held, so it always wins.
        if !pending.merge_one(&record) {
            return Err(StoreError::Malformed(format!(
                "local write to '{key}' lost to a record already held; the clock went wrong"
            )));
        }
        pending.set_digest(&self.local, seq);
        let (batch, delta) = pending.lay_down(hlc);
        drop(index);
        if let Err(error) = self.write_down(writer, batch) {
            let failed = Box::new(FailedWrite {
                record: record.clone(),
                previous,
            });
            return Err(self.freeze(writer, error, Some(failed)));
        }
        self.write_index().apply(delta);
        writer.clock = next_clock;
        self.clock_wall_ms
            .store(next_clock.last().wall_ms, Ordering::Relaxed);
        writer.last_local = Some(AcknowledgedWrite::of(&record));
        self.acknowledge(writer);
        self.publish_writability(writer);
        Ok(record)
    }

    /// Applies a change to sled and flushes it; the writer holds sled (not frozen).
    fn write_down(&self, writer: &Writer, batch: sled::Batch) -> sled::Result<()> {
        match &writer.sled {
            Some(sled) => write_down(sled, batch),
            None => Err(sled::Error::Unsupported(
                "the store is frozen: sled is closed".into(),
            )),
        }
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
        Ok(self.read_index().get(&encoded).cloned())
    }

    /// Every record under `prefix`, tombstones included, in key order.
    pub fn scan(&self, prefix: &KeyPrefix) -> Result<Vec<Record>, StoreError> {
        self.readable(Some(prefix.as_bytes()))?;
        Ok(self.read_index().scan(prefix.as_bytes()).cloned().collect())
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
        if writer.sled.is_none() {
            return Err(self.refusal(&writer));
        }
        let index = self.read_index();
        let forgotten = &index.forgotten;
        let now = self.wall_ms();
        let max_drift_ms = self.max_drift_ms.load(Ordering::Relaxed);
        let latest_accepted = now.saturating_add(max_drift_ms);
        let mut next_clock = writer.clock;
        let mut pending = Pending::for_records(&index, incoming.len());
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
            if r.origin == self.local && r.seq > pending.digest(&self.local) {
                pending.set_digest(&self.local, r.seq);
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
            if pending.merge_one(r) {
                applied.push(i);
            }
        }
        if let Some(b) = batch {
            let have = pending.digest(&b.origin);
            let raise_to = raise_to.min(b.up_to);
            if b.after <= have && raise_to > have {
                pending.set_digest(&b.origin, raise_to);
            }
        }
        self.count_clock_refusals(&too_far_ahead, max_drift_ms);
        let last = next_clock.tick(now);
        let (batch, delta) = pending.lay_down(last);
        drop(index);
        if let Err(error) = self.write_down(&writer, batch) {
            return Err(self.freeze(&mut writer, error, None));
        }
        self.write_index().apply(delta);
        writer.clock = next_clock;
        self.clock_wall_ms
            .store(next_clock.last().wall_ms, Ordering::Relaxed);
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

    /// How far this store's clock (the last timestamp it issued or took in) runs ahead of its
    /// wall clock. Taking in remote records moves it by the drift bound at most; more means this
    /// Machine's own clock went back (a forward jump corrected): its timestamps never go back,
    /// so its writes carry the old time, and stores whose clocks are right refuse them as too
    /// far ahead until its wall clock has caught up.
    pub fn clock_ahead(&self) -> Duration {
        let last = self.clock_wall_ms.load(Ordering::Relaxed);
        Duration::from_millis(last.saturating_sub(self.wall_ms()))
    }

    /// Whether [`Store::clock_ahead`] is beyond the drift bound: other Machines refuse this
    /// Machine's writes.
    pub fn clock_went_back(&self) -> Option<Duration> {
        let ahead = self.clock_ahead();
        (ahead > self.max_drift()).then_some(ahead)
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
        if writer.sled.is_none() {
            return Err(self.refusal(&writer));
        }
        let index = self.read_index();
        let mut pending = Pending::new(&index);
        let mut removed = Vec::new();
        let mut still_held = false;
        for (_, held) in index.logged(machine, 0, u64::MAX) {
            if matches!(held.key.owner(), Owner::Machine(owner) if owner == machine) {
                pending.remove(held.key.encode());
                removed.push(held.clone());
            } else {
                still_held = true;
            }
        }
        if !still_held {
            pending.remove_digest(machine);
        }
        pending.forget(machine);
        let (batch, delta) = pending.lay_down(writer.clock.last());
        drop(index);
        if let Err(error) = self.write_down(&writer, batch) {
            return Err(self.freeze(&mut writer, error, None));
        }
        self.write_index().apply(delta);
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
        Ok(self.read_index().forgotten.clone())
    }

    /// Per origin, the highest sequence this store has incorporated.
    pub fn digest(&self) -> Result<Digest, StoreError> {
        self.readable(None)?;
        Ok(self.read_index().digest.clone())
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
        let index = self.read_index();
        let have = index.digest.get(&request.origin);
        let mut batch = SyncBatch {
            origin: request.origin.clone(),
            after: request.after,
            up_to: have.max(request.after),
            records: Vec::new(),
        };
        if have <= request.after {
            return Ok(batch);
        }
        let mut bytes = 0usize;
        for (seq, record) in index.logged(&request.origin, request.after + 1, have) {
            if batch.records.len() == max_records {
                batch.up_to = seq - 1;
                break;
            }
            let size = record.stored_len();
            if !batch.records.is_empty() && bytes.saturating_add(size) > max_bytes {
                batch.up_to = seq - 1;
                break;
            }
            bytes = bytes.saturating_add(size);
            batch.records.push(record.clone());
        }
        Ok(batch)
    }

    /// Flushes everything to disk (and the acknowledgement record, if it fell behind); called
    /// on shutdown.
    pub fn flush(&self) -> Result<(), StoreError> {
        let mut writer = self.lock_writer();
        if let Some(sled) = &writer.sled {
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

    /// Hands the store's files over to another process (a daemon taking over from this one):
    /// flushes, then lets go of sled (and its lock on the files) for good. Reads go on from
    /// what is in memory; every write is refused from now on, saying why.
    pub fn hand_over(&self) -> Result<(), StoreError> {
        let mut writer = self.lock_writer();
        if let Some(sled) = &writer.sled {
            sled.db.flush()?;
        }
        writer.sled = None;
        writer.trouble = Some(Trouble::HandedOver);
        self.publish_writability(&writer);
        Ok(())
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
            Some(Trouble::HandedOver) => writer.trouble = Some(Trouble::HandedOver),
            Some(Trouble::Frozen {
                reason,
                failed,
                cannot_reopen,
            }) => {
                if let Err(still) = self.reopen(writer, failed.as_deref()) {
                    // Its directory refusing writes still is the full disk: that passes.
                    // Anything else does not, and is worth an operator's eye, once.
                    let cannot_reopen = if still.starts_with(STILL_REFUSES) {
                        tracing::debug!(reason = %still, "the store cannot reopen yet");
                        None
                    } else {
                        if cannot_reopen.as_deref() != Some(still.as_str()) {
                            tracing::warn!(reason = %still, "the store cannot reopen");
                        }
                        Some(still)
                    };
                    writer.trouble = Some(Trouble::Frozen {
                        reason,
                        failed,
                        cannot_reopen,
                    });
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

    /// sled refused a change: drop sled so it can be opened again, and refuse writes until it
    /// is. Reads go on from the index, which never took the change.
    fn freeze(
        &self,
        writer: &mut Writer,
        error: sled::Error,
        failed: Option<Box<FailedWrite>>,
    ) -> StoreError {
        // Dropping the handle releases sled's lock on its files.
        writer.sled = None;
        let reason = format!("a write failed ({})", StoreError::Io(error));
        tracing::error!(store = ?self.path, %reason, "the store stops taking writes until its disk takes them again");
        writer.trouble = Some(Trouble::Frozen {
            reason,
            failed,
            cannot_reopen: None,
        });
        self.publish_writability(writer);
        self.refusal(writer)
    }

    /// Makes a frozen store write again: opens it again from disk (unless an earlier attempt
    /// did), then undoes a local write that was reported failed but reached the disk after all.
    fn reopen(&self, writer: &mut Writer, failed: Option<&FailedWrite>) -> Result<(), String> {
        let mut differing = if writer.sled.is_none() {
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
        probe(path).map_err(|e| format!("{STILL_REFUSES}: {e}"))?;
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
        if let Some((_, what)) = &inventory.local_beyond {
            return Err(format!(
                "after reopening, the store holds {what}; restart the daemon to see the ways out"
            ));
        }
        let index = inventory.index;
        if let Some(ack_path) = &self.acknowledged {
            if let Ok(Some(ack)) = Acknowledged::read(ack_path) {
                let missing = shortfalls(&self.local, &ack, &index);
                if !missing.is_empty() {
                    return Err(format!(
                        "after reopening, the store holds less than it acknowledged: {}; restart \
                         the daemon to see the ways out",
                        missing.join("; ")
                    ));
                }
            }
        }
        let last_local = last_local_write(&index, &self.local);
        let mut served = self.write_index();
        let differing = index
            .all()
            .filter(|r| served.get(&r.key.encode()) != Some(*r))
            .cloned()
            .collect();
        *served = index;
        drop(served);
        writer.sled = Some(sled);
        if let Some(clock) = inventory.clock {
            writer.clock.observe(clock);
            self.clock_wall_ms
                .store(writer.clock.last().wall_ms, Ordering::Relaxed);
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
