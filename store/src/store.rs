//! The store itself: local writes, merges and the sync answers.
//!
//! Layout: one sled tree, four kinds of entry told apart by their first byte, so that every
//! change is one atomic sled batch:
//!
//! - `r` + key: the record currently winning for the key;
//! - `l` + origin + seq (big-endian): the key that record was written under, for the records
//!   currently held (an entry is removed when its record is superseded);
//! - `d` + origin: the highest sequence incorporated from that origin (the digest);
//! - `h`: the clock's last timestamp.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Mutex;

use ployz_core::MachineId;
use tokio::sync::broadcast;

use crate::hlc::{wall_now_ms, Clock};
use crate::{
    Change, Digest, Hlc, Key, KeyPrefix, Owner, Record, StoreError, SyncBatch, SyncRequest, Watch,
};

/// How many changes a slow watcher may fall behind before it is told to rescan.
const WATCH_BUFFER: usize = 4096;

const RECORD: u8 = b'r';
const LOG: u8 = b'l';
const DIGEST: u8 = b'd';
const CLOCK: &[u8] = b"h";

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
    tree: sled::Tree,
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

fn record_key(key_bytes: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + key_bytes.len());
    k.push(RECORD);
    k.extend_from_slice(key_bytes);
    k
}

fn log_key(origin: &MachineId, seq: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(41);
    k.push(LOG);
    k.extend_from_slice(origin.as_str().as_bytes());
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn digest_key(origin: &MachineId) -> Vec<u8> {
    let mut k = Vec::with_capacity(33);
    k.push(DIGEST);
    k.extend_from_slice(origin.as_str().as_bytes());
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

/// One atomic change being assembled under the writer lock: a sled batch plus an overlay of
/// what it will have written, so later steps of the same change read their own writes.
struct Pending<'a> {
    tree: &'a sled::Tree,
    batch: sled::Batch,
    records: HashMap<Vec<u8>, Record>,
    digests: HashMap<MachineId, u64>,
}

impl<'a> Pending<'a> {
    fn new(tree: &'a sled::Tree) -> Pending<'a> {
        Pending {
            tree,
            batch: sled::Batch::default(),
            records: HashMap::new(),
            digests: HashMap::new(),
        }
    }

    fn digest(&self, origin: &MachineId) -> Result<u64, StoreError> {
        if let Some(n) = self.digests.get(origin) {
            return Ok(*n);
        }
        match self.tree.get(digest_key(origin))? {
            Some(v) => decode_u64(&v),
            None => Ok(0),
        }
    }

    fn set_digest(&mut self, origin: &MachineId, seq: u64) {
        self.batch.insert(digest_key(origin), &seq.to_be_bytes());
        self.digests.insert(origin.clone(), seq);
    }

    fn current(&self, key: &Key, rkey: &[u8]) -> Result<Option<Record>, StoreError> {
        if let Some(r) = self.records.get(rkey) {
            return Ok(Some(r.clone()));
        }
        match self.tree.get(rkey)? {
            Some(v) => Ok(Some(Record::decode(key.clone(), &v)?)),
            None => Ok(None),
        }
    }

    /// Installs `record` if it beats what is held for its key. Returns whether it did.
    fn merge_one(&mut self, record: &Record) -> Result<bool, StoreError> {
        let rkey = record_key(&record.key.encode());
        if let Some(current) = self.current(&record.key, &rkey)? {
            if current.precedence(record).is_ge() {
                return Ok(false);
            }
            self.batch.remove(log_key(&current.origin, current.seq));
        }
        self.batch.insert(rkey.as_slice(), record.encode_value());
        self.batch
            .insert(log_key(&record.origin, record.seq), record.key.encode());
        self.records.insert(rkey, record.clone());
        Ok(true)
    }

    fn commit(self, clock: Hlc) -> Result<(), StoreError> {
        let mut batch = self.batch;
        batch.insert(CLOCK, &encode_hlc(clock));
        self.tree.apply_batch(batch)?;
        Ok(())
    }
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
        let tree = db.open_tree("ployz")?;
        let last = match tree.get(CLOCK)? {
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
            tree,
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
        let mut pending = Pending::new(&self.tree);
        let seq = pending.digest(&self.local)? + 1;
        let record = Record {
            key: key.clone(),
            value,
            origin: self.local.clone(),
            hlc,
            seq,
            tombstone,
        };
        // The clock orders this write after everything held, so it always wins.
        if !pending.merge_one(&record)? {
            return Err(StoreError::Malformed(format!(
                "local write to '{key}' lost to a record already held; the clock went wrong"
            )));
        }
        pending.set_digest(&self.local, seq);
        pending.commit(hlc)?;
        // The batch is applied: its timestamp is used, whatever the flush says.
        *clock = next_clock;
        drop(clock);
        self.db.flush()?;
        let _ = self.changes.send(Change {
            record: record.clone(),
        });
        Ok(record)
    }

    /// The record currently winning for `key`, tombstones included.
    pub fn get(&self, key: &Key) -> Result<Option<Record>, StoreError> {
        match self.tree.get(record_key(&key.encode()))? {
            Some(bytes) => Ok(Some(Record::decode(key.clone(), &bytes)?)),
            None => Ok(None),
        }
    }

    /// Every record under `prefix`, tombstones included, in key order.
    pub fn scan(&self, prefix: &KeyPrefix) -> Result<Vec<Record>, StoreError> {
        self.tree
            .scan_prefix(record_key(prefix.as_bytes()))
            .map(|item| {
                let (k, v) = item?;
                Record::decode(Key::decode(&k[1..])?, &v)
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
        let last = next_clock.tick(wall_now_ms());
        let mut pending = Pending::new(&self.tree);
        let mut applied = Vec::new();
        for r in incoming {
            if pending.merge_one(r)? {
                applied.push(r.clone());
            }
            // Our own writes coming back from a peer (after data loss here): never reuse
            // their sequence numbers.
            if r.origin == self.local && r.seq > pending.digest(&self.local)? {
                pending.set_digest(&self.local, r.seq);
            }
        }
        if let Some(b) = batch {
            let have = pending.digest(&b.origin)?;
            if b.after <= have && b.up_to > have {
                pending.set_digest(&b.origin, b.up_to);
            }
        }
        pending.commit(last)?;
        *clock = next_clock;
        drop(clock);
        self.db.flush()?;
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
        for item in self.tree.scan_prefix([DIGEST]) {
            let (k, v) = item?;
            let origin = std::str::from_utf8(&k[1..])
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
        let have = match self.tree.get(digest_key(&request.origin))? {
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
        for item in self.tree.range(start..=end) {
            let (lk, key_bytes) = item?;
            let seq = decode_u64(&lk[33..])?;
            if batch.records.len() == limit {
                batch.up_to = seq - 1;
                break;
            }
            let key = Key::decode(&key_bytes)?;
            if let Some(v) = self.tree.get(record_key(&key_bytes))? {
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
