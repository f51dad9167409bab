//! A full disk, for real: the store on a 2 MiB tmpfs. A write the disk refused is never shown,
//! writes are refused with the reason while the disk is full, and they resume once space
//! returns, without reopening the store by hand. Needs root (mount).

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use ployz_core::MachineId;
use ployz_store::{Key, OpenOptions, Record, Store, StoreError};

/// A tmpfs mounted on a temp dir, unmounted when dropped (even when the test fails).
struct Tmpfs {
    dir: tempfile::TempDir,
}

impl Tmpfs {
    fn mount(size: &str) -> Tmpfs {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("mount runs");
        assert!(
            out.status.success(),
            "cannot mount a tmpfs (these tests need root): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs { dir }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let ok = Command::new("umount")
            .arg(self.dir.path())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(self.dir.path())
                .status();
        }
    }
}

/// Fills the filesystem of `dir` with one file; returns its path.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0xA5u8; 4096];
    while f.write_all(&chunk).is_ok() {}
    let _ = f.sync_all();
    path
}

fn options(fs: &Tmpfs) -> OpenOptions {
    OpenOptions {
        acknowledged: Some(fs.path().join("store.ack")),
        accept_loss: false,
    }
}

/// Where the acknowledgement record goes.
#[derive(Clone, Copy, Debug)]
enum AckRecord {
    /// Beside the store, as the daemon keeps it: the record's new file is what the full disk
    /// refuses first.
    Beside,
    /// On another filesystem: sled itself meets the full disk.
    Elsewhere,
}

/// A store on a 2 MiB tmpfs, its acknowledgement record on another filesystem (so sled itself
/// meets a full disk): (the tmpfs, the record's folder, the store).
fn on_a_small_tmpfs_record_elsewhere() -> (Tmpfs, tempfile::TempDir, Store) {
    let fs = Tmpfs::mount("2m");
    let elsewhere = tempfile::tempdir().unwrap();
    let options = OpenOptions {
        acknowledged: Some(elsewhere.path().join("store.ack")),
        accept_loss: false,
    };
    let (store, _) =
        Store::open_with(fs.path().join("store"), MachineId::generate(), &options).unwrap();
    (fs, elsewhere, store)
}

fn policy() -> Key {
    Key::cluster("acme", "policy")
}

/// Writes bigger and bigger values until the disk refuses one: (the last write taken, the
/// refusal).
fn write_until_refused(store: &Store) -> (Option<Record>, StoreError) {
    let mut taken = None;
    for i in 0..64 {
        let value = format!("write-{i}-").repeat(1 << (i % 10)).into_bytes();
        match store.put(&policy(), value) {
            Ok(r) => taken = Some(r),
            Err(e) => return (taken, e),
        }
    }
    panic!("a full disk took 64 writes");
}

#[test]
#[ignore = "needs root to mount a tmpfs (scripts/test.sh runs it)"]
fn a_full_disk_refuses_writes_shows_only_durable_values_and_writes_resume_when_space_returns() {
    full_disk(AckRecord::Beside);
}

#[test]
#[ignore = "needs root to mount a tmpfs (scripts/test.sh runs it)"]
fn when_sled_meets_the_full_disk_the_refused_write_is_never_shown_and_the_store_reopens() {
    full_disk(AckRecord::Elsewhere);
}

fn full_disk(record: AckRecord) {
    let fs = Tmpfs::mount("2m");
    let elsewhere = tempfile::tempdir().unwrap();
    let options = match record {
        AckRecord::Beside => options(&fs),
        AckRecord::Elsewhere => OpenOptions {
            acknowledged: Some(elsewhere.path().join("store.ack")),
            accept_loss: false,
        },
    };
    let id = MachineId::generate();
    let (store, _) = Store::open_with(fs.path().join("store"), id.clone(), &options).unwrap();
    let durable = store.put(&policy(), b"durable".to_vec()).unwrap();
    assert_eq!(store.write_failure(), None);

    let filler = fill(fs.path());
    let (taken, err) = write_until_refused(&store);
    eprintln!("{record:?}: refused: {err}");
    assert!(err.is_io(), "{err}");
    // The refused write is not shown: the last one taken is.
    let last_good = store.get(&policy()).unwrap().unwrap();
    assert_eq!(last_good, taken.unwrap_or(durable));
    assert_eq!(store.digest().unwrap().get(&id), last_good.seq);
    let why = store
        .write_failure()
        .expect("the store says it cannot write");
    assert!(why.contains("No space left on device"), "{why}");
    match record {
        AckRecord::Beside => assert!(why.contains("acknowledgement record"), "{why}"),
        AckRecord::Elsewhere => assert!(why.contains("a write failed"), "{why}"),
    }
    // Refused again, quickly, with the reason; still nothing of it shown.
    let again = store.put(&policy(), b"also refused".to_vec()).unwrap_err();
    assert!(matches!(again, StoreError::Unwritable { .. }), "{again}");
    assert_eq!(store.get(&policy()).unwrap().unwrap(), last_good);
    assert!(!store.recover(), "recovered on a full disk");

    std::fs::remove_file(&filler).unwrap();
    assert!(store.recover(), "{:?}", store.write_failure());
    assert_eq!(store.write_failure(), None);
    // A write reported failed never shows up later.
    assert_eq!(
        store.get(&policy()).unwrap().unwrap().value,
        last_good.value
    );
    let resumed = store.put(&policy(), b"after".to_vec()).unwrap();
    assert!(resumed.seq > last_good.seq);
    drop(store);
    let (store, _) = Store::open_with(fs.path().join("store"), id, &options).unwrap();
    assert_eq!(store.get(&policy()).unwrap().unwrap().value, b"after");
}

#[test]
#[ignore = "needs root to mount a tmpfs (scripts/test.sh runs it)"]
fn a_frozen_store_that_cannot_reopen_once_space_returns_says_why_and_to_restart() {
    let (fs, _elsewhere, store) = on_a_small_tmpfs_record_elsewhere();
    store.put(&policy(), b"durable".to_vec()).unwrap();
    let filler = fill(fs.path());
    write_until_refused(&store);
    assert!(
        store
            .write_failure()
            .is_some_and(|w| w.contains("resume by themselves")),
        "{:?}",
        store.write_failure()
    );
    // Space returns, but the store's files were damaged meanwhile: it cannot reopen, and does
    // not claim it will resume by itself.
    for entry in std::fs::read_dir(fs.path().join("store"))
        .unwrap()
        .flatten()
    {
        if entry.path().is_file() {
            std::fs::OpenOptions::new()
                .write(true)
                .open(entry.path())
                .unwrap()
                .set_len(100)
                .unwrap();
        }
    }
    std::fs::remove_file(&filler).unwrap();
    assert!(!store.recover(), "a damaged store reopened");
    let why = store
        .write_failure()
        .expect("the store says it cannot write");
    assert!(
        why.contains("cannot reopen") && why.contains("restart the daemon"),
        "{why}"
    );
    assert!(!why.contains("resume by themselves"), "{why}");
}

#[test]
#[ignore = "needs root to mount a tmpfs (scripts/test.sh runs it)"]
fn a_store_reopened_on_a_full_disk_opens_once_space_returns_and_keeps_everything() {
    let fs = Tmpfs::mount("2m");
    let id = MachineId::generate();
    let path = fs.path().join("store");
    let (store, _) = Store::open_with(&path, id.clone(), &options(&fs)).unwrap();
    for i in 0..20 {
        store
            .put(
                &Key::cluster("certificates", format!("h{i}")),
                vec![i; 2000],
            )
            .unwrap();
    }
    let kept = store.put(&policy(), b"kept".to_vec()).unwrap();
    let filler = fill(fs.path());
    let (taken, _) = write_until_refused(&store);
    let kept = taken.unwrap_or(kept);
    drop(store);
    // A restart on the full disk: sled may fail to open (and leave a snapshot it could not
    // finish behind); it must not make things worse.
    let on_full = Store::open_with(&path, id.clone(), &options(&fs));
    eprintln!("opening on a full disk: {:?}", on_full.as_ref().map(|_| ()));
    if let Err(e) = &on_full {
        assert!(!e.is_loss(), "a full disk was taken for data loss: {e}");
    }
    drop(on_full);
    std::fs::remove_file(&filler).unwrap();
    let (store, report) = Store::open_with(&path, id.clone(), &options(&fs))
        .expect("the store opens once space returns");
    eprintln!("removed: {:?}", report.removed_leftovers);
    assert_eq!(store.get(&policy()).unwrap().unwrap().value, kept.value);
    assert!(store.digest().unwrap().get(&id) >= kept.seq);
    let leftovers: Vec<_> = std::fs::read_dir(&path)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".generating"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
#[ignore = "needs root to mount a tmpfs (scripts/test.sh runs it)"]
fn a_merge_the_full_disk_refuses_is_never_shown_and_merges_once_space_returns() {
    use ployz_store::{KeyPrefix, SyncRequest};
    let (fs, _elsewhere, store) = on_a_small_tmpfs_record_elsewhere();
    let peer = Store::temporary(MachineId::generate()).unwrap();
    let key = |i: usize| Key::cluster("certificates", format!("h{i}"));
    let batch = |store: &Store| {
        let after = store.digest().unwrap().get(peer.local());
        let request = SyncRequest {
            origin: peer.local().clone(),
            after,
        };
        peer.records_after(&request, usize::MAX).unwrap()
    };
    for i in 0..10 {
        peer.put(&key(i), b"first".to_vec()).unwrap();
    }
    store.apply_batch(&batch(&store)).unwrap();

    let filler = fill(fs.path());
    let mut refused = None;
    for round in 0..64usize {
        // New versions of the keys held, and a new key, bigger every round.
        for i in 0..10 {
            peer.put(&key(i), vec![round as u8; 64 << (round % 10)])
                .unwrap();
        }
        peer.put(&key(100 + round), vec![1; 512]).unwrap();
        let before = (
            store.scan(&KeyPrefix::everything()).unwrap(),
            store.digest().unwrap(),
        );
        let offered = batch(&store);
        match store.apply_batch(&offered) {
            Ok(_) => continue,
            Err(e) => {
                refused = Some((e, before, offered));
                break;
            }
        }
    }
    let (err, before, offered) = refused.expect("a full disk took 64 merges");
    assert!(err.is_io(), "{err}");
    // Nothing of the refused merge is shown: every key reads as before, the digest too.
    assert_eq!(store.scan(&KeyPrefix::everything()).unwrap(), before.0);
    assert_eq!(store.digest().unwrap(), before.1);
    assert!(store.write_failure().is_some());

    std::fs::remove_file(&filler).unwrap();
    assert!(store.recover(), "{:?}", store.write_failure());
    let report = store.apply_batch(&offered).unwrap();
    assert!(report.applied > 0, "{report:?}");
    assert_eq!(
        store.scan(&KeyPrefix::everything()).unwrap(),
        peer.scan(&KeyPrefix::everything()).unwrap()
    );
}
