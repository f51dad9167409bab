//! What the store holds, kept in memory, and how a change is laid down on disk.
//!
//! On disk, the records live in *chunks*: a change writes the records it installs together,
//! as few sled entries (`c` + chunk number) as their size allows, so merging thousands of
//! records costs a few sled inserts rather than one or two per record. Every record a chunk
//! holds either still wins for its key or has been superseded; each record that wins lives in
//! exactly one chunk. The change that supersedes a chunk's last winning record removes the
//! chunk, in the same atomic batch; a change that removes a record (a forgotten Machine's)
//! moves the other winning records of its chunk into its own and removes the chunk, so the
//! removed record cannot come back. A change that would leave more superseded records on disk
//! than winning ones (and at least [`COMPACT_AFTER`]) also moves the winning records of the
//! sparsest chunks into its own and removes those chunks, at most [`COMPACT_MOST`] records at a
//! time, so the disk holds at most about twice what wins.
//!
//! In memory, the [`Index`]: every record that wins for its key (and the chunk it lives in),
//! the log `(origin, seq) -> key` of those records (what a sync answer walks), per chunk how
//! many records it stores and how many of them still win, the digest and the forgotten
//! Machines. It is rebuilt from the chunks on opening, and changed only after sled has taken a
//! change and flushed it, so it always shows what is durable: reads never touch the disk.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::ops::Bound;

use ployz_core::MachineId;

use crate::record::HEADER;
use crate::store::{digest_key, forgotten_key, CLOCK};
use crate::{Digest, Hlc, Key, Record, StoreError};

/// The first byte of a chunk's sled key.
pub(crate) const CHUNK: u8 = b'c';
/// The layout version a chunk's value starts with.
const CHUNK_VERSION: u8 = 1;
/// Bytes of records a chunk holds at most; a record larger than that has a chunk of its own.
/// Below sled's threshold for keeping a value in a file of its own.
pub(crate) const CHUNK_BYTES: usize = 64 * 1024;
/// Superseded records the disk may hold beyond as many as win before a change compacts.
pub(crate) const COMPACT_AFTER: usize = 1024;
/// Winning records one change moves at most while compacting.
pub(crate) const COMPACT_MOST: usize = 16 * 1024;
/// The chunk number records of the store's earlier layout (an entry per key) are held under
/// while the store opens; opening moves them into chunks.
pub(crate) const EARLIER_LAYOUT: u64 = 0;

pub(crate) fn chunk_key(n: u64) -> [u8; 9] {
    let mut k = [0u8; 9];
    k[0] = CHUNK;
    k[1..].copy_from_slice(&n.to_be_bytes());
    k
}

/// A chunk's on-disk form: the version byte, then per record its key's length (u32 BE), its
/// key, its encoded value's length (u32 BE) and the encoded value ([`Record::encode_value`]).
fn encode_chunk(records: &[(&[u8], &Record)]) -> Vec<u8> {
    let size = records.iter().map(|(k, r)| entry_len(k, r)).sum::<usize>();
    let mut out = Vec::with_capacity(1 + size);
    out.push(CHUNK_VERSION);
    for (k, r) in records {
        out.extend_from_slice(&(k.len() as u32).to_be_bytes());
        out.extend_from_slice(k);
        out.extend_from_slice(&((HEADER + r.value.len()) as u32).to_be_bytes());
        r.encode_value_into(&mut out);
    }
    out
}

/// The bytes a record takes in a chunk, under its encoded key.
fn entry_len(key: &[u8], record: &Record) -> usize {
    8 + key.len() + HEADER + record.value.len()
}

/// The records of a chunk's on-disk form ([`encode_chunk`]).
pub(crate) fn decode_chunk(bytes: &[u8]) -> Result<Vec<Record>, StoreError> {
    let malformed = |why: &str| StoreError::Malformed(format!("a chunk of records {why}"));
    match bytes.first() {
        Some(&CHUNK_VERSION) => {}
        Some(v) => return Err(malformed(&format!("has an unknown layout ({v})"))),
        None => return Err(malformed("is empty")),
    }
    let mut rest = &bytes[1..];
    let take = |rest: &mut &[u8]| -> Result<Vec<u8>, StoreError> {
        let len: [u8; 4] = rest
            .get(..4)
            .and_then(|b| b.try_into().ok())
            .ok_or_else(|| malformed("ends inside a length"))?;
        let len = u32::from_be_bytes(len) as usize;
        let part = rest
            .get(4..4 + len)
            .ok_or_else(|| malformed("ends inside a record"))?
            .to_vec();
        *rest = &rest[4 + len..];
        Ok(part)
    };
    let mut records = Vec::new();
    while !rest.is_empty() {
        let key = Key::decode(&take(&mut rest)?)?;
        let value = take(&mut rest)?;
        records.push(Record::decode(key, &value)?);
    }
    Ok(records)
}

/// A record that wins for its key, and the chunk it lives in.
#[derive(Debug, Clone)]
pub(crate) struct Held {
    pub(crate) record: Record,
    pub(crate) chunk: u64,
}

/// How many records a chunk stores, and how many of them still win.
#[derive(Debug, Clone, Copy, Default)]
struct ChunkUse {
    stored: usize,
    live: usize,
}

/// Everything the store holds, as durable on disk. See the module's documentation.
#[derive(Debug, Default)]
pub(crate) struct Index {
    /// By encoded key ([`Key::encode`]), in key order. Boxed: a tree node then moves pointers,
    /// not records, as keys come and go.
    records: BTreeMap<Vec<u8>, Box<Held>>,
    /// `(origin, seq)` of every record in `records`, to its encoded key.
    log: BTreeMap<(MachineId, u64), Vec<u8>>,
    chunks: BTreeMap<u64, ChunkUse>,
    /// Records stored in all chunks, winning or not.
    stored: usize,
    pub(crate) digest: Digest,
    pub(crate) forgotten: BTreeSet<MachineId>,
}

impl Index {
    /// The record that wins for the encoded key.
    pub(crate) fn get(&self, key: &[u8]) -> Option<&Record> {
        self.records.get(key).map(|h| &h.record)
    }

    /// Every record whose encoded key starts with `prefix`, in key order.
    pub(crate) fn scan<'a>(&'a self, prefix: &'a [u8]) -> impl Iterator<Item = &'a Record> + 'a {
        self.records
            .range::<[u8], _>((Bound::Included(prefix), Bound::Unbounded))
            .take_while(move |(k, _)| k.starts_with(prefix))
            .map(|(_, h)| &h.record)
    }

    /// The records whose log entries are `origin`'s sequences in `from..=to`, in log order:
    /// each `(seq, record)`, the record being the one that wins for the entry's key.
    pub(crate) fn logged(
        &self,
        origin: &MachineId,
        from: u64,
        to: u64,
    ) -> impl Iterator<Item = (u64, &Record)> + '_ {
        self.log
            .range((origin.clone(), from)..=(origin.clone(), to))
            .filter_map(|((_, seq), key)| self.get(key).map(|r| (*seq, r)))
    }

    /// `origin`'s latest write still held.
    pub(crate) fn last_of(&self, origin: &MachineId) -> Option<&Record> {
        let (_, key) = self
            .log
            .range((origin.clone(), 0)..=(origin.clone(), u64::MAX))
            .next_back()?;
        self.get(key)
    }

    /// Every record held, in key order.
    pub(crate) fn all(&self) -> impl Iterator<Item = &Record> {
        self.records.values().map(|h| &h.record)
    }

    /// Records held for their keys.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// Records stored on disk, superseded ones included.
    #[cfg(test)]
    pub(crate) fn stored(&self) -> usize {
        self.stored
    }

    /// Sled entries holding records.
    #[cfg(test)]
    pub(crate) fn chunks(&self) -> usize {
        self.chunks.len()
    }

    /// Chunks none of whose records wins any more.
    pub(crate) fn spent_chunks(&self) -> Vec<u64> {
        self.chunks
            .iter()
            .filter(|(_, c)| c.live == 0)
            .map(|(n, _)| *n)
            .collect()
    }

    /// Takes in the records of chunk `n` as read from disk: each wins for its key or not, by
    /// precedence against what is held already.
    pub(crate) fn load_chunk(&mut self, n: u64, records: Vec<Record>) {
        let chunk = self.chunks.entry(n).or_default();
        chunk.stored += records.len();
        self.stored += records.len();
        for record in records {
            let key = record.key.encode();
            if let Some(held) = self.records.get(&key) {
                if held.record.precedence(&record).is_ge() {
                    continue;
                }
            }
            self.install(key, Box::new(Held { record, chunk: n }));
        }
    }

    /// Makes `held` win for `key`, in place of what was held.
    fn install(&mut self, key: Vec<u8>, held: Box<Held>) {
        let logged = (held.record.origin.clone(), held.record.seq);
        self.chunks.entry(held.chunk).or_default().live += 1;
        let (key, old) = match self.records.entry(key) {
            Entry::Occupied(mut e) => (e.key().clone(), Some(std::mem::replace(e.get_mut(), held))),
            Entry::Vacant(e) => {
                let key = e.key().clone();
                e.insert(held);
                (key, None)
            }
        };
        if let Some(old) = old {
            let Held { record, chunk } = *old;
            self.log.remove(&(record.origin, record.seq));
            if let Some(c) = self.chunks.get_mut(&chunk) {
                c.live = c.live.saturating_sub(1);
            }
        }
        self.log.insert(logged, key);
    }

    /// Moves the record held for `key` to chunk `to`.
    fn rehome(&mut self, key: &[u8], to: u64) {
        let Some(held) = self.records.get_mut(key) else {
            return;
        };
        let from = std::mem::replace(&mut held.chunk, to);
        if let Some(c) = self.chunks.get_mut(&from) {
            c.live = c.live.saturating_sub(1);
        }
        self.chunks.entry(to).or_default().live += 1;
    }

    /// Removes what is held for `key`, if anything.
    fn release(&mut self, key: &[u8]) {
        let Some(old) = self.records.remove(key) else {
            return;
        };
        let Held { record, chunk } = *old;
        self.log.remove(&(record.origin, record.seq));
        if let Some(c) = self.chunks.get_mut(&chunk) {
            c.live = c.live.saturating_sub(1);
        }
    }

    /// Applies a change sled has taken.
    pub(crate) fn apply(&mut self, delta: Delta) {
        for (n, count) in delta.new_chunks {
            self.chunks.insert(n, ChunkUse::default());
            self.chunks.get_mut(&n).expect("inserted").stored = count;
            self.stored += count;
        }
        for (key, held) in delta.installs {
            match held {
                Some(held) => self.install(key, held),
                None => self.release(&key),
            }
        }
        for (key, to) in delta.moved {
            self.rehome(&key, to);
        }
        for n in delta.removed_chunks {
            if let Some(c) = self.chunks.remove(&n) {
                debug_assert_eq!(
                    c.live, 0,
                    "chunk {n} removed while it holds winning records"
                );
                self.stored -= c.stored;
            }
        }
        for (origin, seq) in delta.digests {
            match seq {
                Some(seq) => self.digest.0.insert(origin, seq),
                None => self.digest.0.remove(&origin),
            };
        }
        self.forgotten.extend(delta.forgotten);
    }
}

/// What a change does to the [`Index`] once sled has taken it.
#[derive(Debug, Default)]
pub(crate) struct Delta {
    /// Per encoded key, what wins for it now (`None`: nothing, the key is gone).
    installs: Vec<(Vec<u8>, Option<Box<Held>>)>,
    /// Records moved into another chunk (compaction), by encoded key.
    moved: Vec<(Vec<u8>, u64)>,
    /// Chunks written: number, records stored.
    new_chunks: Vec<(u64, usize)>,
    removed_chunks: Vec<u64>,
    digests: Vec<(MachineId, Option<u64>)>,
    forgotten: Vec<MachineId>,
}

/// One atomic change being assembled under the writer lock, over the index as it is: what
/// wins for each key it touches, digest entries, forgotten Machines. Laid down as one sled
/// batch ([`Pending::lay_down`]) and, once sled has taken it, applied to the index.
pub(crate) struct Pending<'a> {
    index: &'a Index,
    /// Per encoded key written: what wins for it once the change applies.
    writes: HashMap<Vec<u8>, Write>,
    digests: HashMap<MachineId, Option<u64>>,
    forgotten: Vec<MachineId>,
    /// Chunks whose winning records are moved into this change's chunks, whatever their use.
    rewrite: Vec<u64>,
    /// Chunks to remove (none of their records wins).
    spent: Vec<u64>,
    /// Sled entries to remove that the index does not know of.
    raw_removals: Vec<Vec<u8>>,
}

/// A key a change writes.
struct Write {
    /// What wins for the key once the change applies; `None`: nothing (removed).
    record: Option<Record>,
    /// The chunk of the version the index holds for the key, if it holds one.
    held_in: Option<u64>,
}

impl<'a> Pending<'a> {
    pub(crate) fn new(index: &'a Index) -> Pending<'a> {
        Pending::for_records(index, 1)
    }

    /// A change that will write about `records` records.
    pub(crate) fn for_records(index: &'a Index, records: usize) -> Pending<'a> {
        Pending {
            index,
            writes: HashMap::with_capacity(records),
            digests: HashMap::new(),
            forgotten: Vec::new(),
            rewrite: Vec::new(),
            spent: Vec::new(),
            raw_removals: Vec::new(),
        }
    }

    /// Installs `record` if it beats what is held for its key. Returns whether it did.
    pub(crate) fn merge_one(&mut self, record: &Record) -> bool {
        let key = record.key.encode();
        let (current, held_in) = match self.writes.get(&key) {
            Some(written) => (written.record.as_ref(), written.held_in),
            None => match self.index.records.get(&key) {
                Some(h) => (Some(&h.record), Some(h.chunk)),
                None => (None, None),
            },
        };
        if current.is_some_and(|c| c.precedence(record).is_ge()) {
            return false;
        }
        let record = Some(record.clone());
        self.writes.insert(key, Write { record, held_in });
        true
    }

    /// Removes what wins for the encoded key. Only for the machine-owned keys of a Machine
    /// being forgotten: an older version of the key left in another chunk would win again on
    /// opening, were opening not to leave out every record of a forgotten Machine's keys.
    pub(crate) fn remove(&mut self, key: Vec<u8>) {
        let held_in = match self.writes.get(&key) {
            Some(written) => written.held_in,
            None => self.index.records.get(&key).map(|h| h.chunk),
        };
        let record = None;
        self.writes.insert(key, Write { record, held_in });
    }

    /// The highest sequence incorporated from `origin`, as this change leaves it.
    pub(crate) fn digest(&self, origin: &MachineId) -> u64 {
        match self.digests.get(origin) {
            Some(seq) => seq.unwrap_or(0),
            None => self.index.digest.get(origin),
        }
    }

    pub(crate) fn set_digest(&mut self, origin: &MachineId, seq: u64) {
        self.digests.insert(origin.clone(), Some(seq));
    }

    pub(crate) fn remove_digest(&mut self, origin: &MachineId) {
        self.digests.insert(origin.clone(), None);
    }

    pub(crate) fn forget(&mut self, origin: &MachineId) {
        self.forgotten.push(origin.clone());
    }

    /// Moves the winning records of chunk `n` into this change's chunks and removes it.
    pub(crate) fn rewrite_chunk(&mut self, n: u64) {
        self.rewrite.push(n);
    }

    /// Removes chunk `n`, none of whose records wins.
    pub(crate) fn remove_spent_chunk(&mut self, n: u64) {
        self.spent.push(n);
    }

    /// Removes a sled entry the index does not hold (an entry that does not read back, or one
    /// of an earlier layout).
    pub(crate) fn remove_entry(&mut self, key: Vec<u8>) {
        self.raw_removals.push(key);
    }

    /// Whether the change writes anything at all.
    pub(crate) fn is_empty(&self) -> bool {
        self.writes.is_empty()
            && self.digests.is_empty()
            && self.forgotten.is_empty()
            && self.rewrite.is_empty()
            && self.spent.is_empty()
            && self.raw_removals.is_empty()
    }

    /// The sled batch that makes the change (the clock set to `clock`), and what it does to the
    /// index once sled has taken it.
    pub(crate) fn lay_down(self, clock: Hlc) -> (sled::Batch, Delta) {
        let index = self.index;
        let mut batch = sled::Batch::default();
        let mut delta = Delta::default();
        // First: a batch is a map where the last operation on a key wins, and a chunk this
        // change writes may take the number of an entry removed here that the index never held
        // (a chunk that did not read back).
        for key in self.raw_removals {
            batch.remove(key);
        }
        // Per chunk, how many of its winning records this change supersedes or removes.
        let mut lost: HashMap<u64, usize> = HashMap::new();
        let mut added = 0usize;
        let mut gone = 0usize;
        let mut removed_from: BTreeSet<u64> = BTreeSet::new();
        // In no particular order: where a record sits among a chunk's does not matter.
        let installs: Vec<(Vec<u8>, Option<Record>)> = self
            .writes
            .into_iter()
            .map(|(key, write)| {
                if let Some(chunk) = write.held_in {
                    *lost.entry(chunk).or_default() += 1;
                }
                match (write.held_in.is_some(), write.record.is_some()) {
                    (false, true) => added += 1,
                    (true, false) => gone += 1,
                    _ => {}
                }
                if let (Some(chunk), None) = (write.held_in, &write.record) {
                    // A record removed (not superseded) would come back from its chunk on
                    // opening: the chunk's other records move and the chunk goes.
                    removed_from.insert(chunk);
                }
                (key, write.record)
            })
            .collect();
        let live_after = index.records.len() + added - gone;
        let left = |n: &u64, c: &ChunkUse| c.live.saturating_sub(lost.get(n).copied().unwrap_or(0));
        // Chunks to move records out of: those asked for, and the sparsest when the disk
        // would hold more superseded records than winning ones.
        let mut moving: BTreeSet<u64> = self.rewrite.iter().copied().collect();
        moving.extend(removed_from);
        // Chunks none of whose records wins once the change applies.
        let emptied: Vec<u64> = lost
            .keys()
            .filter(|n| index.chunks.get(n).is_some_and(|c| left(n, c) == 0))
            .copied()
            .collect();
        let emptied_stored: usize = emptied.iter().map(|n| index.chunks[n].stored).sum();
        let written = installs.iter().filter(|(_, r)| r.is_some()).count();
        let stored_after = index.stored - emptied_stored + written;
        if stored_after.saturating_sub(live_after) > live_after.max(COMPACT_AFTER) {
            let mut sparse: Vec<(u64, usize, usize)> = index
                .chunks
                .iter()
                .map(|(n, c)| (*n, left(n, c), c.stored))
                .filter(|&(n, live, stored)| live > 0 && live * 2 < stored && !moving.contains(&n))
                .collect();
            // Sparsest first: fewest winning records per record stored.
            sparse.sort_by(|a, b| (a.1 * b.2).cmp(&(b.1 * a.2)));
            let mut moved = 0;
            for (n, live, _) in sparse {
                if moved > 0 && moved + live > COMPACT_MOST {
                    break;
                }
                moving.insert(n);
                moved += live;
            }
        }
        let mut movers: Vec<(&[u8], &Record)> = Vec::new();
        if !moving.is_empty() {
            let touched: HashSet<&Vec<u8>> = installs.iter().map(|(k, _)| k).collect();
            movers = index
                .records
                .iter()
                .filter(|(k, h)| moving.contains(&h.chunk) && !touched.contains(k))
                .map(|(k, h)| (k.as_slice(), &h.record))
                .collect();
        }
        // The new chunks: the records installed, then the ones moved, packed in order.
        let mut next = index.chunks.keys().next_back().map_or(1, |n| n + 1);
        let mut chunk: Vec<(&[u8], &Record)> = Vec::new();
        let mut chunk_bytes = 0usize;
        let mut placed: Vec<u64> = Vec::new();
        let everything = installs
            .iter()
            .filter_map(|(k, r)| r.as_ref().map(|r| (k.as_slice(), r)))
            .chain(movers.iter().copied());
        for (key, record) in everything {
            let size = entry_len(key, record);
            if !chunk.is_empty() && chunk_bytes + size > CHUNK_BYTES {
                batch.insert(&chunk_key(next), encode_chunk(&chunk));
                delta.new_chunks.push((next, chunk.len()));
                next += 1;
                chunk.clear();
                chunk_bytes = 0;
            }
            chunk.push((key, record));
            chunk_bytes += size;
            placed.push(next);
        }
        if !chunk.is_empty() {
            batch.insert(&chunk_key(next), encode_chunk(&chunk));
            delta.new_chunks.push((next, chunk.len()));
        }
        let mut placed = placed.into_iter();
        let going: BTreeSet<u64> = emptied.into_iter().chain(moving.iter().copied()).collect();
        for n in going {
            batch.remove(&chunk_key(n));
            delta.removed_chunks.push(n);
        }
        for n in self.spent {
            batch.remove(&chunk_key(n));
            delta.removed_chunks.push(n);
        }
        for (key, record) in installs {
            let held = record.map(|record| {
                Box::new(Held {
                    record,
                    chunk: placed.next().expect("a chunk for every record written"),
                })
            });
            delta.installs.push((key, held));
        }
        for (key, _) in movers {
            let to = placed.next().expect("a chunk for every record moved");
            delta.moved.push((key.to_vec(), to));
        }
        for (origin, seq) in self.digests {
            match seq {
                Some(seq) => batch.insert(digest_key(&origin), &seq.to_be_bytes()),
                None => batch.remove(digest_key(&origin)),
            }
            delta.digests.push((origin, seq));
        }
        for origin in self.forgotten {
            batch.insert(forgotten_key(&origin), Vec::new());
            delta.forgotten.push(origin);
        }
        batch.insert(CLOCK, &crate::store::encode_hlc(clock));
        (batch, delta)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(origin: &MachineId, name: &str, wall_ms: u64, seq: u64, size: usize) -> Record {
        Record {
            key: Key::cluster("things", name),
            value: vec![7; size],
            origin: origin.clone(),
            hlc: Hlc {
                wall_ms,
                counter: 0,
            },
            seq,
            tombstone: false,
        }
    }

    /// Applies what the change does, as the store does once sled has taken it.
    fn commit(index: &mut Index, change: impl FnOnce(&mut Pending)) -> sled::Batch {
        let mut pending = Pending::new(index);
        change(&mut pending);
        let (batch, delta) = pending.lay_down(Hlc::default());
        index.apply(delta);
        batch
    }

    #[test]
    fn a_chunk_round_trips_and_a_damaged_one_is_refused() {
        let a = MachineId::generate();
        let records = [record(&a, "x", 1, 1, 10), record(&a, "y", 2, 2, 0)];
        let keys: Vec<Vec<u8>> = records.iter().map(|r| r.key.encode()).collect();
        let entries: Vec<(&[u8], &Record)> =
            keys.iter().map(|k| k.as_slice()).zip(&records).collect();
        let bytes = encode_chunk(&entries);
        assert_eq!(decode_chunk(&bytes).unwrap(), records);
        // Cut anywhere, a chunk is refused or reads as the records before the cut.
        for cut in 1..bytes.len() {
            if let Ok(read) = decode_chunk(&bytes[..cut]) {
                assert!(read.len() < records.len(), "cut at {cut}");
                assert_eq!(read, records[..read.len()], "cut at {cut}");
            }
        }
        assert!(decode_chunk(&[2]).is_err());
        assert!(decode_chunk(&[]).is_err());
        assert_eq!(decode_chunk(&[CHUNK_VERSION]).unwrap(), vec![]);
    }

    #[test]
    fn many_records_take_few_chunks_and_a_chunk_goes_when_its_last_record_is_superseded() {
        let a = MachineId::generate();
        let mut index = Index::default();
        commit(&mut index, |p| {
            for i in 0..1000 {
                assert!(p.merge_one(&record(&a, &i.to_string(), 10, i + 1, 256)));
            }
        });
        assert_eq!(index.len(), 1000);
        assert_eq!(index.stored(), 1000);
        let chunks = index.chunks();
        assert!(chunks < 10, "{chunks} chunks for 1000 records");
        // Supersede every record of the first chunk: it goes.
        let first = *index.chunks.keys().next().unwrap();
        let in_first: Vec<Record> = index
            .records
            .values()
            .filter(|h| h.chunk == first)
            .map(|h| h.record.clone())
            .collect();
        let batch = commit(&mut index, |p| {
            for (i, r) in in_first.iter().enumerate() {
                let newer = Record {
                    hlc: Hlc {
                        wall_ms: 20,
                        counter: 0,
                    },
                    seq: 2000 + i as u64,
                    ..r.clone()
                };
                assert!(p.merge_one(&newer));
            }
        });
        assert!(!index.chunks.contains_key(&first));
        let removal = format!("{:?}: None", chunk_key(first).to_vec());
        assert!(
            format!("{batch:?}").contains(&removal),
            "the batch does not remove chunk {first}"
        );
        assert_eq!(index.len(), 1000);
        assert_eq!(index.stored(), 1000);
        // An older version loses and changes nothing.
        let mut p = Pending::new(&index);
        assert!(!p.merge_one(&record(&a, "0", 5, 1, 1)));
        assert!(p.is_empty());
    }

    #[test]
    fn superseded_records_never_outnumber_winning_ones_for_long() {
        let a = MachineId::generate();
        let mut index = Index::default();
        let mut seq = 0;
        // 5000 keys in big chunks, then one key of each chunk-full rewritten again and again:
        // every chunk keeps some winners, so nothing goes unless compaction moves them.
        commit(&mut index, |p| {
            for i in 0..5000 {
                seq += 1;
                p.merge_one(&record(&a, &i.to_string(), 10, seq, 100));
            }
        });
        for round in 0..40u64 {
            commit(&mut index, |p| {
                for i in (0..5000).filter(|i| i % 7 != 0) {
                    seq += 1;
                    if i % 40 == round {
                        p.merge_one(&record(&a, &i.to_string(), 20 + round, seq, 100));
                    }
                }
            });
            let garbage = index.stored() - index.len();
            assert!(
                garbage <= index.len().max(COMPACT_AFTER) + COMPACT_MOST,
                "round {round}: {garbage} superseded for {} held",
                index.len()
            );
        }
        assert_eq!(index.len(), 5000);
        // Every record is in a chunk the index knows, and the counts add up.
        let live: usize = index.chunks.values().map(|c| c.live).sum();
        assert_eq!(live, index.len());
        for h in index.records.values() {
            assert!(index.chunks.contains_key(&h.chunk));
        }
    }

    #[test]
    fn a_removed_record_takes_its_chunk_with_it_and_the_others_move() {
        let (a, b) = (MachineId::generate(), MachineId::generate());
        let mut index = Index::default();
        commit(&mut index, |p| {
            p.merge_one(&record(&a, "stays", 10, 1, 1));
            p.merge_one(&record(&b, "goes", 11, 1, 1));
        });
        let chunk = *index.chunks.keys().next().unwrap();
        assert_eq!(index.chunks(), 1);
        let batch = commit(&mut index, |p| {
            p.remove(Key::cluster("things", "goes").encode())
        });
        let removal = format!("{:?}: None", chunk_key(chunk).to_vec());
        assert!(
            format!("{batch:?}").contains(&removal),
            "the batch keeps chunk {chunk}, and with it the removed record"
        );
        assert_eq!(index.len(), 1);
        assert_eq!(index.stored(), 1);
        assert!(!index.chunks.contains_key(&chunk));
        let held = index
            .get(&Key::cluster("things", "stays").encode())
            .unwrap();
        assert_eq!(held.origin, a);
    }

    #[test]
    fn the_log_follows_the_winners() {
        let (a, b) = (MachineId::generate(), MachineId::generate());
        let mut index = Index::default();
        commit(&mut index, |p| {
            p.merge_one(&record(&a, "k", 10, 1, 1));
            p.merge_one(&record(&a, "j", 11, 2, 1));
            p.set_digest(&a, 2);
        });
        commit(&mut index, |p| {
            p.merge_one(&record(&b, "k", 12, 1, 1));
        });
        let logged: Vec<u64> = index.logged(&a, 1, 2).map(|(s, _)| s).collect();
        assert_eq!(logged, vec![2]);
        assert_eq!(index.last_of(&a).unwrap().seq, 2);
        assert_eq!(index.last_of(&b).unwrap().origin, b);
        assert_eq!(index.digest.get(&a), 2);
        commit(&mut index, |p| {
            p.remove(Key::cluster("things", "j").encode())
        });
        assert!(index.last_of(&a).is_none());
        assert_eq!(index.len(), 1);
    }
}
