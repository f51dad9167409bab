//! Opening a store: what an interrupted snapshot left is removed, sled is opened (a panic
//! caught), every entry is read back and checked against the others, and the store is compared
//! with its acknowledgement record.

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ployz_core::MachineId;

use crate::acknowledged::{temp_path, Acknowledged, AcknowledgedWrite};
use crate::error::sled_error_text;
use crate::hlc::wall_now_ms;
use crate::index::{decode_chunk, Index, CHUNK, EARLIER_LAYOUT};
use crate::store::{
    decode_hlc, decode_origin, decode_u64, panic_message, Sled, CLOCK, DIGEST, FORGOTTEN, LOG,
    RECORD, TREE,
};
use crate::{Hlc, Key, OpenOptions, OpenReport, Owner, Record, StoreError};

/// Reads the acknowledgement record, refusing (or, accepting loss, forgetting) one that
/// cannot be trusted.
pub(crate) fn read_acknowledged(
    path: &Path,
    local: &MachineId,
    options: &OpenOptions,
    report: &mut OpenReport,
) -> Result<Option<Acknowledged>, StoreError> {
    let _ = std::fs::remove_file(temp_path(path));
    let reason = match Acknowledged::read(path) {
        Ok(Some(a)) if &a.machine_id != local => format!(
            "it belongs to Machine {}, not to this Machine ({local})",
            a.machine_id
        ),
        Ok(a) => return Ok(a),
        Err(reason) => reason,
    };
    let e = StoreError::AcknowledgementUnreadable {
        path: path.to_path_buf(),
        reason,
    };
    if !options.accept_loss {
        return Err(e);
    }
    report
        .accepted_losses
        .push(format!("{e}; a new one is written"));
    Ok(None)
}

/// What reading every entry back found.
#[derive(Default)]
pub(crate) struct Inventory {
    pub(crate) entries: usize,
    /// Everything that reads back, with the records of the earlier layout under chunk
    /// [`EARLIER_LAYOUT`].
    pub(crate) index: Index,
    pub(crate) clock: Option<Hlc>,
    /// Entries that do not decode or do not agree with the others, and why. Their records are
    /// not in the index.
    pub(crate) bad: Vec<(Vec<u8>, String)>,
    /// The entries of the earlier layout (a record, or a log entry, each), to remove once their
    /// records are in chunks.
    pub(crate) earlier: Vec<Vec<u8>>,
    /// The highest local write numbered beyond the digest, and what that says: the digest went
    /// back, and the next write would reuse a number. The records stay; accepting the loss
    /// raises the digest past them.
    pub(crate) local_beyond: Option<(u64, String)>,
}

/// Memory sled may use to cache the store's pages.
const STORE_CACHE_BYTES: u64 = 64 * 1024 * 1024;

/// Opens sled in `path` and reads every entry back.
pub(crate) fn open_and_read(
    path: &Path,
    local: &MachineId,
    report: &mut OpenReport,
) -> Result<(Sled, Inventory), StoreError> {
    report
        .removed_leftovers
        .extend(remove_interrupted_snapshots(path)?);
    let open = || {
        catch_unwind(AssertUnwindSafe(|| -> sled::Result<Sled> {
            // sled keeps up to 1 GiB of pages in memory by default; a Machine's store is far
            // smaller, and its memory stays bounded however long the Machine lives.
            let db = sled::Config::new()
                .path(path)
                .cache_capacity(STORE_CACHE_BYTES)
                .open()?;
            let tree = db.open_tree(TREE)?;
            Ok(Sled { db, tree })
        }))
    };
    // sled's lock on its files outlives a closed store for a moment (its background threads
    // let go of it last): a store closed and opened again in one process waits for that.
    // Another process holding it is refused once the wait is over.
    let locked_until = Instant::now() + LOCK_WAIT;
    let mut opened = open();
    while matches!(&opened, Ok(Err(e)) if is_locked(e)) && Instant::now() < locked_until {
        std::thread::sleep(LOCK_RETRY);
        opened = open();
    }
    let unreadable = |reason: String| StoreError::Unreadable {
        path: path.to_path_buf(),
        reason,
    };
    let sled = match opened {
        Ok(Ok(sled)) => sled,
        Ok(Err(e)) if is_locked(&e) => {
            return Err(StoreError::InUse {
                path: path.to_path_buf(),
            })
        }
        Ok(Err(e)) if is_environmental(&e) => return Err(StoreError::Io(e)),
        Ok(Err(e)) => {
            return Err(unreadable(format!(
                "sled cannot open it: {}",
                sled_error_text(&e)
            )))
        }
        Err(panic) => {
            return Err(unreadable(format!(
                "sled panicked opening it ({})",
                panic_message(&*panic)
            )))
        }
    };
    match catch_unwind(AssertUnwindSafe(|| inventory(&sled.tree, local))) {
        Ok(Ok(inventory)) => Ok((sled, inventory)),
        Ok(Err(e)) => Err(unreadable(format!("reading it back failed ({e})"))),
        Err(panic) => Err(unreadable(format!(
            "sled panicked reading it back ({})",
            panic_message(&*panic)
        ))),
    }
}

/// How long opening waits for sled's lock on the store's files before it says another process
/// holds them.
const LOCK_WAIT: Duration = Duration::from_secs(2);
/// How often opening tries the lock again meanwhile.
const LOCK_RETRY: Duration = Duration::from_millis(20);

/// Whether sled could not take its lock on the store's files (another process, or a store of
/// this process closed a moment ago, holds it). sled says so only in its message.
fn is_locked(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.raw_os_error().is_none()
        && io.to_string().contains("could not acquire lock"))
}

/// Whether sled failed because of its surroundings (permissions, a full disk, another process
/// holding the store) rather than because of what its files hold.
fn is_environmental(e: &sled::Error) -> bool {
    match e {
        sled::Error::Io(io) => io.raw_os_error().is_some(),
        _ => false,
    }
}

/// Removes the `snap.*.generating` files of snapshots sled was interrupted writing: sled would
/// take the newest for the current snapshot and refuse it as corrupted. A snapshot is only
/// trusted once renamed, so nothing is lost.
fn remove_interrupted_snapshots(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(StoreError::Io(e.into())),
    };
    let mut removed = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with("snap.") && name.ends_with(".generating") {
            let path = entry.path();
            std::fs::remove_file(&path).map_err(|e| StoreError::Io(e.into()))?;
            tracing::warn!(file = %path.display(), "removed what an interrupted snapshot left behind");
            removed.push(path);
        }
    }
    Ok(removed)
}

/// Renames sled's snapshot files and its `conf` in `dir` to `unreadable-*`, where sled no
/// longer looks: snapshots only speed recovery up, and sled writes `conf` anew from the settings
/// it is opened with (always the same here). Returns their new paths.
pub(crate) fn set_aside_sled_metadata(dir: &Path) -> Result<Vec<PathBuf>, StoreError> {
    let mut moved = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(moved);
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("snap.") || name == "conf" {
            let to = dir.join(format!("unreadable-{name}"));
            std::fs::rename(entry.path(), &to).map_err(|e| StoreError::Io(e.into()))?;
            moved.push(to);
        }
    }
    Ok(moved)
}

/// Moves an unreadable store's directory aside: `<path>.lost-<unix seconds>`.
pub(crate) fn move_aside(path: &Path) -> Result<PathBuf, StoreError> {
    let secs = wall_now_ms() / 1000;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "store".into());
    let mut aside = path.with_file_name(format!("{name}.lost-{secs}"));
    let mut n = 1;
    while aside.exists() {
        aside = path.with_file_name(format!("{name}.lost-{secs}-{n}"));
        n += 1;
    }
    std::fs::rename(path, &aside).map_err(|e| StoreError::Io(e.into()))?;
    Ok(aside)
}

/// Reads every entry of `tree` and checks it against the others.
fn inventory(tree: &sled::Tree, local: &MachineId) -> Result<Inventory, StoreError> {
    let mut inv = Inventory::default();
    // Records by the entry holding them: a chunk's, or one of the earlier layout.
    let mut held: Vec<(Vec<u8>, u64, Vec<Record>)> = Vec::new();
    let mut earlier: Vec<Record> = Vec::new();
    let mut earlier_keys: Vec<Vec<u8>> = Vec::new();
    for item in tree.iter() {
        let (k, v) = item?;
        inv.entries += 1;
        let bad = |why: &str| (k.to_vec(), why.to_owned());
        match k.first() {
            Some(&CHUNK) if k.len() == 9 => match decode_chunk(&v) {
                Ok(records) => held.push((k.to_vec(), decode_u64(&k[1..])?, records)),
                Err(e) => inv.bad.push(bad(&e.to_string())),
            },
            Some(&RECORD) => match Key::decode(&k[1..]).and_then(|key| Record::decode(key, &v)) {
                Ok(r) => {
                    earlier.push(r);
                    earlier_keys.push(k.to_vec());
                }
                Err(e) => inv.bad.push(bad(&e.to_string())),
            },
            // The earlier layout's log is rebuilt from the records it named.
            Some(&LOG) => inv.earlier.push(k.to_vec()),
            Some(&DIGEST) => match (decode_origin(&k[1..]), decode_u64(&v)) {
                (Some(origin), Ok(seq)) => {
                    inv.index.digest.0.insert(origin, seq);
                }
                _ => inv.bad.push(bad("a digest entry that does not decode")),
            },
            Some(&FORGOTTEN) => match decode_origin(&k[1..]) {
                Some(origin) => {
                    inv.index.forgotten.insert(origin);
                }
                None => inv
                    .bad
                    .push(bad("a forgotten Machine's ID does not decode")),
            },
            _ if k.as_ref() == CLOCK => match decode_hlc(&v) {
                Some(h) => inv.clock = Some(h),
                None => inv.bad.push(bad("the clock does not decode")),
            },
            _ => inv.bad.push(bad("an entry of no known kind")),
        }
    }
    // A local write numbered beyond the digest: the digest went back, and the next write
    // would reuse the number.
    let digest = inv.index.digest.get(local);
    let highest_local = held
        .iter()
        .flat_map(|(_, _, records)| records)
        .chain(&earlier)
        .filter(|r| &r.origin == local)
        .map(|r| r.seq)
        .max()
        .unwrap_or(0);
    if highest_local > digest {
        inv.local_beyond = Some((
            highest_local,
            format!("a local write numbered {highest_local} beyond the digest ({digest})"),
        ));
    }
    for (_, n, records) in held {
        inv.index
            .load_chunk(n, without_forgotten(records, &inv.index.forgotten));
    }
    inv.earlier.extend(earlier_keys);
    if !earlier.is_empty() {
        let kept = without_forgotten(earlier, &inv.index.forgotten);
        inv.index.load_chunk(EARLIER_LAYOUT, kept);
    }
    Ok(inv)
}

/// `records` without those of the machine-owned keys of forgotten Machines, which merges
/// ignore (a store forgetting a Machine removes them; none should be on disk).
fn without_forgotten(mut records: Vec<Record>, forgotten: &BTreeSet<MachineId>) -> Vec<Record> {
    if !forgotten.is_empty() {
        records.retain(|r| !matches!(r.key.owner(), Owner::Machine(m) if forgotten.contains(m)));
    }
    records
}

/// What the store lacks of what `ack` says it acknowledged, a sentence each. What it held of a
/// Machine it has forgotten since is not missing.
pub(crate) fn shortfalls(local: &MachineId, ack: &Acknowledged, index: &Index) -> Vec<String> {
    let mut missing = Vec::new();
    for (origin, &acked) in &ack.digest.0 {
        let held = index.digest.get(origin);
        if held >= acked || index.forgotten.contains(origin) {
            continue;
        }
        missing.push(if origin == local {
            format!(
                "this Machine acknowledged writes up to sequence {acked}; the store holds up to {held}"
            )
        } else {
            format!(
                "it acknowledged records of Machine {origin} up to sequence {acked}; the store holds up to {held}"
            )
        });
    }
    if let Some(w) = &ack.last_local {
        let held = index.get(&w.key.encode());
        let ok = match &held {
            Some(r) if &r.origin == local && r.seq == w.seq => w.is(r),
            // Superseded by a later version: fine.
            Some(r) => (r.hlc, &r.origin) > (w.hlc, local),
            None => false,
        };
        if !ok {
            missing.push(match held {
                None => format!(
                    "the last write this Machine acknowledged ('{}', sequence {}) is not in the store",
                    w.key, w.seq
                ),
                Some(_) => format!(
                    "the store holds another version of '{}' than the last write this Machine acknowledged (sequence {})",
                    w.key, w.seq
                ),
            });
        }
    }
    missing
}

/// This Machine's latest write still held.
pub(crate) fn last_local_write(index: &Index, local: &MachineId) -> Option<AcknowledgedWrite> {
    index
        .last_of(local)
        .filter(|r| &r.origin == local)
        .map(AcknowledgedWrite::of)
}
