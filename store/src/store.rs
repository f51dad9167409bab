//! The store itself: sled trees, local writes, merges and the sync answers.

use std::path::Path;
use std::sync::Mutex;

use ployz_core::MachineId;
use sled::transaction::{ConflictableTransactionError, TransactionalTree};
use sled::Transactional;
use tokio::sync::broadcast;

use crate::hlc::{wall_now_ms, Clock};
use crate::{
    Change, Digest, Hlc, Key, KeyPrefix, Owner, Record, StoreError, SyncBatch, SyncRequest, Watch,
};

/// How many changes a slow watcher may fall behind before it is told to rescan.
const WATCH_BUFFER: usize = 4096;

/// Meta key holding the clock's last timestamp.
const META_HLC: &[u8] = b"hlc";

/// What a merge did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MergeReport {
    /// Records that won and replaced (or created) their key's version.
    pub applied: usize,
    /// Records that lost to, or equalled, the version already held.
    pub ignored: usize,
}

/// One Machine's local store. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Store {
    db: sled::Db,
    /// Key -> the record currently winning for it.
    records: sled::Tree,
    /// (origin, seq) -> key, for the records currently held. Superseded entries are removed.
    log: sled::Tree,
    /// Origin -> highest sequence incorporated.
    digest: sled::Tree,
    /// The clock and other small facts.
    meta: sled::Tree,
    local: MachineId,
    /// Serialises writes and merges; holds the clock so timestamps and sequences agree.
    clock: Mutex<Clock>,
    changes: broadcast::Sender<Change>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("local", &self.local).finish()
    }
}

fn log_key(origin: &MachineId, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(40);
    k.extend_from_slice(origin.as_str().as_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn decode_u64(bytes: &[u8]) -> Result<u64, StoreError> {
    bytes
        .try_into()
        .map(u64::from_be_bytes)
        .map_err(|_| StoreError::Malformed("counter is not 8 bytes".into()))
}

fn encode_hlc(h: Hlc) -> [u8; 12] {
    let mut out = [0u8; 12];
    out[..8].copy_from_slice(&h.wall_ms.to_be_bytes());
    out[8..].copy_from_slice(&h.counter.to_be_bytes());
    out
}

type TxResult<T> = Result<T, ConflictableTransactionError<StoreError>>;

fn abort<T>(e: StoreError) -> TxResult<T> {
    Err(ConflictableTransactionError::Abort(e))
}

fn tx_digest(d: &TransactionalTree, origin: &MachineId) -> TxResult<u64> {
    match d.get(origin.as_str().as_bytes())? {
        Some(v) => match decode_u64(&v) {
            Ok(n) => Ok(n),
            Err(e) => abort(e),
        },
        None => Ok(0),
    }
}

/// Installs `record` if it beats what `records` holds for its key. Returns whether it did.
fn tx_merge_one(
    records: &TransactionalTree,
    log: &TransactionalTree,
    record: &Record,
) -> TxResult<bool> {
    let key_bytes = record.key.encode();
    if let Some(current) = records.get(&key_bytes)? {
        let current = match Record::decode(record.key.clone(), &current) {
            Ok(c) => c,
            Err(e) => return abort(e),
        };
        if current.precedence(record).is_ge() {
            return Ok(false);
        }
        log.remove(log_key(&current.origin, current.seq))?;
    }
    records.insert(key_bytes.as_slice(), record.encode_value())?;
    log.insert(log_key(&record.origin, record.seq), key_bytes)?;
    Ok(true)
}

impl Store {
    /// Opens (or creates) the store in `path` for the Machine `local`.
    pub fn open(path: impl AsRef<Path>, local: MachineId) -> Result<Store, StoreError> {
        let db = sled::Config::new().path(path.as_ref()).open()?;
        Self::with_db(db, local)
    }

    /// A store that lives in memory and in a temporary file removed on drop; for tests.
    pub fn temporary(local: MachineId) -> Result<Store, StoreError> {
        let db = sled::Config::new().temporary(true).open()?;
        Self::with_db(db, local)
    }

    fn with_db(db: sled::Db, local: MachineId) -> Result<Store, StoreError> {
        let records = db.open_tree("records")?;
        let log = db.open_tree("log")?;
        let digest = db.open_tree("digest")?;
        let meta = db.open_tree("meta")?;
        let last = match meta.get(META_HLC)? {
            Some(v) if v.len() == 12 => Hlc {
                wall_ms: u64::from_be_bytes(v[..8].try_into().expect("8 bytes")),
                counter: u32::from_be_bytes(v[8..].try_into().expect("4 bytes")),
            },
            Some(_) => return Err(StoreError::Malformed("stored clock is not 12 bytes".into())),
            None => Hlc::default(),
        };
        let (changes, _) = broadcast::channel(WATCH_BUFFER);
        Ok(Store {
            db,
            records,
            log,
            digest,
            meta,
            local,
            clock: Mutex::new(Clock::starting_at(last)),
            changes,
        })
    }

    /// The Machine this store writes as.
    pub fn local(&self) -> &MachineId {
        &self.local
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
        let mut clock = self.clock.lock().expect("store clock poisoned");
        let mut next_clock = *clock;
        let hlc = next_clock.tick(wall_now_ms());
        let local = &self.local;
        let record = (&self.records, &self.log, &self.digest, &self.meta).transaction(
            |(records, log, digest, meta)| {
                let seq = tx_digest(digest, local)? + 1;
                let record = Record {
                    key: key.clone(),
                    value: value.clone(),
                    origin: local.clone(),
                    hlc,
                    seq,
                    tombstone,
                };
                tx_merge_one(records, log, &record)?;
                digest.insert(local.as_str().as_bytes(), &seq.to_be_bytes())?;
                meta.insert(META_HLC, &encode_hlc(hlc))?;
                Ok(record)
            },
        )?;
        self.db.flush()?;
        *clock = next_clock;
        drop(clock);
        let _ = self.changes.send(Change {
            record: record.clone(),
        });
        Ok(record)
    }

    /// The record currently winning for `key`, tombstones included.
    pub fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        match self.records.get(key.encode())? {
            Some(bytes) => Ok(Some(Record::decode(key.clone(), &bytes)?)),
            None => Ok(None),
        }
    }

    /// Every record under `prefix`, tombstones included, in key order.
    pub fn scan(&self, prefix: &KeyPrefix) -> Result<Vec<Record>, StoreError> {
        self.records
            .scan_prefix(prefix.as_bytes())
            .map(|item| {
                let (k, v) = item?;
                Record::decode(Key::decode(&k)?, &v)
            })
            .collect()
    }

    /// Every record under `prefix` that is not a tombstone, in key order.
    pub fn scan_live(&self, prefix: &KeyPrefix) -> Result<Vec<Record>, StoreError> {
        let mut all = self.scan(prefix)?;
        all.retain(|r| !r.tombstone);
        Ok(all)
    }

    /// Watches every change under `prefix` from now on.
    pub fn watch(&self, prefix: KeyPrefix) -> Watch {
        Watch {
            prefix,
            rx: self.changes.subscribe(),
        }
    }

    /// Merges records from a peer. Each wins or loses against what is held by precedence;
    /// merging the same records again, or in another order, ends the same. The digest is not
    /// raised (that is [`Store::apply_batch`]'s job). Durable when it returns.
    pub fn merge(&self, records: &[Record]) -> Result<MergeReport, StoreError> {
        self.merge_inner(records, None)
    }

    /// Merges a [`SyncBatch`] and, when it starts at or below this store's digest for its origin,
    /// raises the digest to the batch's `up_to`, in one atomic step. Durable when it returns.
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
        let mut clock = self.clock.lock().expect("store clock poisoned");
        let mut next_clock = *clock;
        for r in incoming {
            next_clock.observe(r.hlc);
        }
        let local = &self.local;
        let last = next_clock.tick(wall_now_ms());
        let applied = (&self.records, &self.log, &self.digest, &self.meta).transaction(
            |(records, log, digest, meta)| {
                let mut applied = Vec::new();
                let mut own_seq = tx_digest(digest, local)?;
                for r in incoming {
                    if tx_merge_one(records, log, r)? {
                        applied.push(r.clone());
                    }
                    // Our own writes coming back from a peer (after data loss here): never
                    // reuse their sequence numbers.
                    if &r.origin == local && r.seq > own_seq {
                        own_seq = r.seq;
                        digest.insert(local.as_str().as_bytes(), &own_seq.to_be_bytes())?;
                    }
                }
                if let Some(b) = batch {
                    let have = tx_digest(digest, &b.origin)?;
                    if b.after <= have && b.up_to > have {
                        digest.insert(b.origin.as_str().as_bytes(), &b.up_to.to_be_bytes())?;
                    }
                }
                meta.insert(META_HLC, &encode_hlc(last))?;
                Ok(applied)
            },
        )?;
        self.db.flush()?;
        *clock = next_clock;
        drop(clock);
        let report = MergeReport {
            applied: applied.len(),
            ignored: incoming.len() - applied.len(),
        };
        for record in applied {
            let _ = self.changes.send(Change { record });
        }
        Ok(report)
    }

    /// Per origin, the highest sequence this store has incorporated.
    pub fn digest(&self) -> Result<Digest, StoreError> {
        let mut out = Digest::default();
        for item in self.digest.iter() {
            let (k, v) = item?;
            let origin = std::str::from_utf8(&k)
                .ok()
                .and_then(|s| s.parse::<MachineId>().ok())
                .ok_or_else(|| StoreError::Malformed("digest origin is not a Machine ID".into()))?;
            out.0.insert(origin, decode_u64(&v)?);
        }
        Ok(out)
    }

    /// Answers "records of origin O after sequence N" with at most `limit` records.
    pub fn records_after(
        &self,
        request: &SyncRequest,
        limit: usize,
    ) -> Result<SyncBatch, StoreError> {
        // Read the digest first: everything it covers is already in the log, so the batch can
        // claim it. Reading it after the log could claim a write the scan missed.
        let have = match self.digest.get(request.origin.as_str().as_bytes())? {
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
        for item in self.log.range(start..=end) {
            let (lk, key_bytes) = item?;
            let seq = decode_u64(&lk[32..])?;
            if batch.records.len() == limit {
                batch.up_to = seq - 1;
                break;
            }
            let key = Key::decode(&key_bytes)?;
            if let Some(v) = self.records.get(&key_bytes)? {
                batch.records.push(Record::decode(key, &v)?);
            }
        }
        Ok(batch)
    }

    /// Flushes everything to disk; called on shutdown.
    pub fn flush(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        Ok(())
    }
}
