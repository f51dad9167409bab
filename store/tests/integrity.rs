//! A store that lost what it acknowledged is refused when it opens, whatever happened to its
//! files, and opens only when told to accept the loss; an interrupted snapshot's leftover is
//! cleaned up, not fatal.

use std::path::{Path, PathBuf};

use ployz_core::MachineId;
use ployz_store::{Key, KeyPrefix, OpenOptions, Store, StoreError};

/// A data dir with a store and its acknowledgement record beside it.
struct Dir {
    _tmp: tempfile::TempDir,
    store: PathBuf,
    ack: PathBuf,
    id: MachineId,
}

impl Dir {
    fn new() -> Dir {
        let tmp = tempfile::tempdir().unwrap();
        Dir {
            store: tmp.path().join("store"),
            ack: tmp.path().join("store.ack"),
            id: MachineId::generate(),
            _tmp: tmp,
        }
    }

    fn options(&self, accept_loss: bool) -> OpenOptions {
        OpenOptions {
            acknowledged: Some(self.ack.clone()),
            accept_loss,
        }
    }

    fn open(&self) -> Result<Store, StoreError> {
        Store::open_with(&self.store, self.id.clone(), &self.options(false)).map(|(s, _)| s)
    }

    fn db_file(&self) -> PathBuf {
        self.store.join("db")
    }
}

fn policy() -> Key {
    Key::cluster("acme", "policy")
}

fn certificate(i: usize) -> Key {
    Key::cluster("certificates", format!("host{i}.example"))
}

/// Writes what a Machine holds after a while: certificates, a policy changed a few times, its
/// own records. Returns the last sequence written.
fn populate(store: &Store) -> u64 {
    for i in 0..20 {
        let value = format!("certificate-material-{i}-").repeat(40).into_bytes();
        store.put(&certificate(i), value).unwrap();
    }
    for v in 1..=5 {
        store
            .put(&policy(), format!("renew-fraction-0.{v}").into_bytes())
            .unwrap();
    }
    store
        .put(
            &Key::machine(store.local(), "machines", "info"),
            b"this machine".to_vec(),
        )
        .unwrap()
        .seq
}

/// A populated store, closed: (dir, last acknowledged sequence).
fn closed_store() -> (Dir, u64) {
    let dir = Dir::new();
    let store = dir.open().unwrap();
    let last = populate(&store);
    drop(store);
    // Reopening untouched is fine and loses nothing.
    let store = dir.open().unwrap();
    assert_eq!(store.digest().unwrap().get(&dir.id), last);
    drop(store);
    (dir, last)
}

/// The offset just past the last non-zero byte: where written data ends.
fn data_end(path: &Path) -> usize {
    let bytes = std::fs::read(path).unwrap();
    bytes.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1)
}

/// Opening refuses as a loss; accepting the loss opens, and the next write is numbered after
/// everything acknowledged.
fn assert_refused_then_accepted(dir: &Dir, last: u64, shape: &str) {
    let err = dir.open().expect_err(shape);
    eprintln!("{shape}: {err}");
    assert!(err.is_loss(), "{shape}: not a loss: {err}");
    let text = err.to_string();
    assert!(
        text.contains(&dir.store.display().to_string())
            || text.contains(&dir.ack.display().to_string()),
        "{shape}: the message names no file: {text}"
    );
    if let StoreError::Behind { missing, .. } = &err {
        assert!(
            missing.iter().any(|m| m
                .contains(&format!("acknowledged writes up to sequence {last}"))
                || m.contains("last write this Machine acknowledged")
                || m.contains("another version")),
            "{shape}: {missing:?}"
        );
    }
    let (store, report) =
        Store::open_with(&dir.store, dir.id.clone(), &dir.options(true)).expect(shape);
    assert!(
        !report.accepted_losses.is_empty(),
        "{shape}: a loss was accepted without being reported"
    );
    let next = store.put(&policy(), b"after the loss".to_vec()).unwrap();
    assert!(next.seq > last, "{shape}: sequence {} reused", next.seq);
    drop(store);
    // From now on the store is what was accepted: it opens without the flag.
    let store = dir.open().unwrap_or_else(|e| panic!("{shape}: {e}"));
    assert_eq!(
        store.get(&policy()).unwrap().unwrap().value,
        b"after the loss"
    );
}

#[test]
fn a_db_truncated_to_1000_bytes_is_refused() {
    let (dir, last) = closed_store();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.db_file())
        .unwrap();
    f.set_len(1000).unwrap();
    drop(f);
    assert_refused_then_accepted(&dir, last, "truncated to 1000 bytes");
}

#[test]
fn an_emptied_db_is_refused() {
    let (dir, last) = closed_store();
    std::fs::write(dir.db_file(), b"").unwrap();
    assert_refused_then_accepted(&dir, last, "emptied");
}

#[test]
fn a_db_with_eight_flipped_bytes_is_refused() {
    let (dir, last) = closed_store();
    let mut bytes = std::fs::read(dir.db_file()).unwrap();
    // Inside the last policy written: the newest acknowledged write of that key.
    let needle = b"renew-fraction-0.5";
    let at = bytes
        .windows(needle.len())
        .rposition(|w| w == needle)
        .expect("the policy is in the file");
    for b in &mut bytes[at..at + 8] {
        *b ^= 0xFF;
    }
    std::fs::write(dir.db_file(), bytes).unwrap();
    assert_refused_then_accepted(&dir, last, "8 bytes flipped");
}

#[test]
fn a_deleted_store_directory_is_refused() {
    let (dir, last) = closed_store();
    std::fs::remove_dir_all(&dir.store).unwrap();
    let err = dir.open().unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "this Machine acknowledged writes up to sequence {last}; the store holds up to 0"
        )),
        "{err}"
    );
    assert_refused_then_accepted(&dir, last, "store directory deleted");
}

#[test]
fn four_kib_of_noise_near_the_end_is_refused() {
    let (dir, last) = closed_store();
    let mut bytes = std::fs::read(dir.db_file()).unwrap();
    let end = data_end(&dir.db_file());
    let start = end.saturating_sub(4096);
    let mut x: u32 = 0x9E37_79B9;
    for b in &mut bytes[start..end] {
        // xorshift: noise that is the same on every run.
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        *b = x as u8;
    }
    std::fs::write(dir.db_file(), bytes).unwrap();
    assert_refused_then_accepted(&dir, last, "4 KiB of noise near the end");
}

#[test]
fn an_older_copy_of_the_store_is_refused() {
    let dir = Dir::new();
    let store = dir.open().unwrap();
    store.put(&policy(), b"old".to_vec()).unwrap();
    drop(store);
    let copy = dir.store.with_file_name("store-copy");
    copy_dir(&dir.store, &copy);
    let store = dir.open().unwrap();
    let newer = store.put(&policy(), b"new".to_vec()).unwrap();
    drop(store);
    std::fs::remove_dir_all(&dir.store).unwrap();
    std::fs::rename(&copy, &dir.store).unwrap();
    let err = dir.open().unwrap_err();
    assert!(
        err.to_string().contains(&format!(
            "this Machine acknowledged writes up to sequence {}; the store holds up to {}",
            newer.seq,
            newer.seq - 1
        )),
        "{err}"
    );
}

#[test]
fn a_damaged_acknowledgement_record_is_refused_and_a_missing_one_rewritten() {
    let (dir, _) = closed_store();
    let text = std::fs::read_to_string(&dir.ack).unwrap();
    std::fs::write(&dir.ack, text.replacen("\"seq\": ", "\"seq\": 1", 1)).unwrap();
    let err = dir.open().unwrap_err();
    assert!(
        matches!(err, StoreError::AcknowledgementUnreadable { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("checksum"), "{err}");
    // A missing record is no loss by itself (the store is all there): a new one is written.
    std::fs::remove_file(&dir.ack).unwrap();
    drop(dir.open().unwrap());
    assert!(dir.ack.exists());
}

#[test]
fn a_record_of_another_machine_is_refused() {
    let (dir, _) = closed_store();
    let stranger = Store::open_with(
        &dir.store,
        MachineId::generate(),
        &OpenOptions {
            acknowledged: Some(dir.ack.clone()),
            accept_loss: false,
        },
    )
    .unwrap_err();
    assert!(
        stranger.to_string().contains("belongs to Machine"),
        "{stranger}"
    );
}

#[test]
fn an_interrupted_snapshot_is_removed_and_everything_is_still_there() {
    let (dir, last) = closed_store();
    // What sled leaves when the disk fills while it writes a snapshot: an empty file named
    // after the newest snapshot, which sled would take as the current one.
    let newest = std::fs::read_dir(&dir.store)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("snap."))
        .max()
        .unwrap_or_else(|| "snap.0000000000000000".into());
    let leftover = dir.store.join(format!("{newest}.generating"));
    std::fs::write(&leftover, b"").unwrap();
    let (store, report) = Store::open_with(&dir.store, dir.id.clone(), &dir.options(false))
        .expect("an interrupted snapshot does not stop the store");
    assert_eq!(report.removed_leftovers, vec![leftover.clone()]);
    assert!(!leftover.exists());
    assert_eq!(store.digest().unwrap().get(&dir.id), last);
    assert_eq!(
        store.get(&policy()).unwrap().unwrap().value,
        b"renew-fraction-0.5"
    );
    assert_eq!(
        store
            .scan_live(&KeyPrefix::cluster_namespace("certificates"))
            .unwrap()
            .len(),
        20
    );
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

#[test]
fn a_damaged_snapshot_is_refused_and_accepting_it_keeps_what_the_log_holds() {
    let (dir, last) = closed_store();
    let snapshot = std::fs::read_dir(&dir.store)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .starts_with("snap.")
        })
        .expect("sled wrote a snapshot when the store was reopened");
    let mut bytes = std::fs::read(&snapshot).unwrap();
    let middle = bytes.len() / 2;
    for b in &mut bytes[middle..middle + 8] {
        *b ^= 0xFF;
    }
    std::fs::write(&snapshot, bytes).unwrap();
    let err = dir.open().unwrap_err();
    assert!(matches!(err, StoreError::Unreadable { .. }), "{err}");
    let (store, report) = Store::open_with(&dir.store, dir.id.clone(), &dir.options(true)).unwrap();
    assert!(
        report
            .accepted_losses
            .iter()
            .any(|l| l.contains("log alone")),
        "{:?}",
        report.accepted_losses
    );
    assert_eq!(store.digest().unwrap().get(&dir.id), last);
    assert_eq!(
        store.get(&policy()).unwrap().unwrap().value,
        b"renew-fraction-0.5"
    );
}

#[test]
fn a_store_another_process_holds_is_in_use_not_lost_and_never_moved_aside() {
    let dir = Dir::new();
    let held = dir.open().unwrap();
    let last = populate(&held);

    // Held (sled's lock on its files, as another daemon on the same data dir holds it): refused
    // as in use, which is no loss, and accepting a loss changes nothing about that.
    for accept_loss in [false, true] {
        let e = Store::open_with(&dir.store, dir.id.clone(), &dir.options(accept_loss))
            .map(|_| ())
            .unwrap_err();
        assert!(matches!(e, StoreError::InUse { .. }), "{e:?}");
        assert!(!e.is_loss(), "{e}");
        let text = e.to_string();
        assert!(text.contains("in use by another process"), "{text}");
        assert!(text.contains("--data-dir"), "{text}");
    }
    let beside: Vec<_> = std::fs::read_dir(dir.store.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(
        beside.iter().all(|n| n == "store" || n == "store.ack"),
        "nothing moved aside: {beside:?}"
    );

    // Closed, it opens again at once with everything (sled lets go of its lock a moment after
    // the store is dropped: opening waits for that).
    drop(held);
    let again = dir.open().unwrap();
    assert_eq!(
        again.get(&policy()).unwrap().unwrap().value,
        b"renew-fraction-0.5"
    );
    assert_eq!(
        again.put(&policy(), b"next".to_vec()).unwrap().seq,
        last + 1
    );
}
