//! The store's on-disk layout, seen from outside: a store of the earlier layout (an entry per
//! record) opens with everything and is rewritten into chunks; after overwrites, merges and
//! forgetting, a store reopens holding exactly what it held, and the disk holds at most about
//! twice what wins.

use std::path::Path;
use std::time::{Duration, Instant};

use ployz_core::MachineId;
use ployz_store::{Digest, Hlc, Key, KeyPrefix, Record, Store, SyncRequest};

/// The sled tree the store keeps everything in.
const TREE: &str = "ployz";

/// Opens the store's sled database directly, waiting for a closed store's lock to go.
fn raw(path: &Path) -> sled::Db {
    let until = Instant::now() + Duration::from_secs(5);
    loop {
        match sled::Config::new().path(path).open() {
            Ok(db) => return db,
            Err(e) if Instant::now() < until => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("sled does not open {}: {e}", path.display()),
        }
    }
}

/// A record's value as the earlier layout stored it under `r` + key: version 1, origin (32
/// ASCII hex), wall ms (u64 BE), counter (u32 BE), seq (u64 BE), tombstone (u8), value.
fn earlier_value(r: &Record) -> Vec<u8> {
    let mut out = vec![1];
    out.extend_from_slice(r.origin.as_str().as_bytes());
    out.extend_from_slice(&r.hlc.wall_ms.to_be_bytes());
    out.extend_from_slice(&r.hlc.counter.to_be_bytes());
    out.extend_from_slice(&r.seq.to_be_bytes());
    out.push(r.tombstone as u8);
    out.extend_from_slice(&r.value);
    out
}

fn record(key: Key, origin: &MachineId, wall_ms: u64, seq: u64, value: &[u8]) -> Record {
    Record {
        key,
        value: value.to_vec(),
        origin: origin.clone(),
        hlc: Hlc {
            wall_ms,
            counter: 0,
        },
        seq,
        tombstone: value.is_empty(),
    }
}

/// The first bytes of every entry in the store's tree, counted.
fn kinds(path: &Path) -> std::collections::BTreeMap<u8, usize> {
    let db = raw(path);
    let tree = db.open_tree(TREE).unwrap();
    let mut out = std::collections::BTreeMap::new();
    for item in tree.iter() {
        let (k, _) = item.unwrap();
        *out.entry(k[0]).or_default() += 1;
    }
    out
}

#[test]
fn a_store_of_the_earlier_layout_opens_with_everything_and_is_rewritten_into_chunks() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let local = MachineId::generate();
    let peer = MachineId::generate();
    let now = 1_790_000_000_000;
    let records = vec![
        record(Key::cluster("policy", "acme"), &local, now, 1, b"mine"),
        record(
            Key::machine(&local, "machines", "info"),
            &local,
            now + 1,
            2,
            b"me",
        ),
        record(
            Key::cluster("certificates", "a.test"),
            &peer,
            now + 2,
            7,
            b"cert",
        ),
        record(
            Key::cluster("certificates", "b.test"),
            &peer,
            now + 3,
            9,
            b"",
        ),
    ];
    {
        let db = raw(&path);
        let tree = db.open_tree(TREE).unwrap();
        for r in &records {
            let key = r.key.to_string().into_bytes();
            let mut rkey = vec![b'r'];
            rkey.extend_from_slice(&key);
            tree.insert(rkey, earlier_value(r)).unwrap();
            let mut lkey = vec![b'l'];
            lkey.extend_from_slice(r.origin.as_str().as_bytes());
            lkey.extend_from_slice(&r.seq.to_be_bytes());
            tree.insert(lkey, key).unwrap();
        }
        for (origin, seq) in [(&local, 2u64), (&peer, 9)] {
            let mut dkey = vec![b'd'];
            dkey.extend_from_slice(origin.as_str().as_bytes());
            tree.insert(dkey, &seq.to_be_bytes()).unwrap();
        }
        let mut clock = (now + 3).to_be_bytes().to_vec();
        clock.extend_from_slice(&0u32.to_be_bytes());
        tree.insert(b"h", clock).unwrap();
        db.flush().unwrap();
    }
    let expected: Vec<Record> = {
        let mut v = records.clone();
        v.sort_by_key(|r| r.key.to_string());
        v
    };
    {
        let store = Store::open(&path, local.clone()).unwrap();
        assert_eq!(store.scan(&KeyPrefix::everything()).unwrap(), expected);
        let mut digest = Digest::default();
        digest.0.insert(local.clone(), 2);
        digest.0.insert(peer.clone(), 9);
        assert_eq!(store.digest().unwrap(), digest);
        let batch = store
            .records_after(
                &SyncRequest {
                    origin: peer.clone(),
                    after: 0,
                },
                10,
            )
            .unwrap();
        assert_eq!(batch.records, records[2..].to_vec());
        // The sequence goes on from the digest; the clock from the stored one.
        let next = store
            .put(&Key::cluster("policy", "acme"), b"again".to_vec())
            .unwrap();
        assert_eq!(next.seq, 3);
        assert!(next.hlc.wall_ms >= now + 3);
    }
    let on_disk = kinds(&path);
    assert!(
        !on_disk.contains_key(&b'r') && !on_disk.contains_key(&b'l'),
        "entries of the earlier layout are left: {on_disk:?}"
    );
    assert!(on_disk.get(&b'c').is_some_and(|&n| n >= 1), "{on_disk:?}");
    let store = Store::open(&path, local.clone()).unwrap();
    let held = store.scan(&KeyPrefix::everything()).unwrap();
    assert_eq!(held.len(), 4);
    assert_eq!(
        store
            .get(&Key::cluster("policy", "acme"))
            .unwrap()
            .unwrap()
            .value,
        b"again"
    );
    let policy = Key::cluster("policy", "acme");
    let others =
        |v: &[Record]| -> Vec<Record> { v.iter().filter(|r| r.key != policy).cloned().collect() };
    assert_eq!(others(&held), others(&expected));
}

#[test]
fn a_store_reopens_holding_exactly_what_it_held_and_its_disk_stays_within_twice_that() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let local = MachineId::generate();
    let peers: Vec<Store> = (0..3)
        .map(|_| Store::temporary(MachineId::generate()).unwrap())
        .collect();
    let value = vec![5u8; 200];
    let (held, digest) = {
        let store = Store::open(&path, local.clone()).unwrap();
        // Local keys written, then most of them written again, round after round.
        for round in 0..4 {
            for i in 0..400 {
                if round == 0 || i % 4 != 0 {
                    let key = Key::cluster("local", format!("{i}"));
                    store.put(&key, value.clone()).unwrap();
                }
            }
        }
        // Three peers write the same cluster-scoped keys, each but a thirtieth of them, in
        // turn: every earlier batch's chunks keep a few winning records among many superseded
        // ones, which only compaction reclaims. Each also writes keys of its own.
        for (p, peer) in peers.iter().enumerate() {
            for i in 0..3000 {
                if i % 30 != p {
                    let key = Key::cluster("shared", format!("{i}"));
                    peer.put(&key, vec![p as u8; 100]).unwrap();
                }
            }
            for i in 0..300 {
                let key = Key::machine(peer.local(), "containers", format!("{i}"));
                peer.put(&key, vec![p as u8; 100]).unwrap();
            }
            let batch = peer
                .records_after(
                    &SyncRequest {
                        origin: peer.local().clone(),
                        after: 0,
                    },
                    usize::MAX,
                )
                .unwrap();
            store.apply_batch(&batch).unwrap();
        }
        // A Machine removed: its machine-owned records go, its cluster-scoped ones stay.
        let removed = store.forget_origin(peers[1].local()).unwrap();
        assert_eq!(removed, 300);
        (
            store.scan(&KeyPrefix::everything()).unwrap(),
            store.digest().unwrap(),
        )
    };
    assert!(held.iter().all(|r| !matches!(
        r.key.owner(),
        ployz_store::Owner::Machine(m) if m == peers[1].local()
    )));
    // The disk: at most about twice the bytes of what wins.
    let winning: usize = held.iter().map(Record::stored_len).sum();
    let (entries, bytes) = {
        let db = raw(&path);
        let tree = db.open_tree(TREE).unwrap();
        let mut n = 0;
        let mut bytes = 0;
        for item in tree.scan_prefix([b'c']) {
            let (_, v) = item.unwrap();
            n += 1;
            bytes += v.len();
        }
        (n, bytes)
    };
    assert!(
        bytes <= winning * 2 + 64 * 1024,
        "{bytes} bytes in {entries} chunks for {winning} bytes of {} winning records",
        held.len()
    );
    // Here, left to themselves, the superseded records would take 1.74x what wins.
    assert!(
        bytes * 4 <= winning * 5,
        "{bytes} bytes in {entries} chunks for {winning} bytes winning: not compacted"
    );
    let store = Store::open(&path, local).unwrap();
    assert_eq!(store.scan(&KeyPrefix::everything()).unwrap(), held);
    assert_eq!(store.digest().unwrap(), digest);
}

/// A chunk's value: version 1, then per record its key's length (u32 BE), its key, its
/// value's length (u32 BE) and the value as [`earlier_value`] encodes it.
fn chunk_value(records: &[Record]) -> Vec<u8> {
    let mut out = vec![1];
    for r in records {
        let key = r.key.to_string().into_bytes();
        let value = earlier_value(r);
        out.extend_from_slice(&(key.len() as u32).to_be_bytes());
        out.extend_from_slice(&key);
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(&value);
    }
    out
}

fn chunk_key(n: u64) -> Vec<u8> {
    let mut k = vec![b'c'];
    k.extend_from_slice(&n.to_be_bytes());
    k
}

fn digest_entry(tree: &sled::Tree, origin: &MachineId, seq: u64) {
    let mut k = vec![b'd'];
    k.extend_from_slice(origin.as_str().as_bytes());
    tree.insert(k, &seq.to_be_bytes()).unwrap();
}

fn accepting_loss() -> ployz_store::OpenOptions {
    ployz_store::OpenOptions {
        acknowledged: None,
        accept_loss: true,
    }
}

#[test]
fn a_damaged_chunk_removed_on_opening_never_takes_the_chunk_written_in_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let local = MachineId::generate();
    let peer = MachineId::generate();
    let records: Vec<Record> = (0..3)
        .map(|i| {
            let key = Key::cluster("certificates", format!("{i}.test"));
            record(key, &peer, 1_790_000_000_000 + i, i + 1, b"cert")
        })
        .collect();
    {
        // Records of the earlier layout, to be rewritten into a new chunk on opening, and a
        // damaged chunk numbered as that new chunk will be.
        let db = raw(&path);
        let tree = db.open_tree(TREE).unwrap();
        for r in &records {
            let mut rkey = vec![b'r'];
            rkey.extend_from_slice(r.key.to_string().as_bytes());
            tree.insert(rkey, earlier_value(r)).unwrap();
        }
        tree.insert(chunk_key(1), b"\x01\x00\x00".to_vec()).unwrap();
        digest_entry(&tree, &peer, 3);
        db.flush().unwrap();
    }
    let refused = Store::open(&path, local.clone()).unwrap_err();
    assert!(
        refused.to_string().contains("do not read back"),
        "{refused}"
    );
    let (store, report) = Store::open_with(&path, local.clone(), &accepting_loss()).unwrap();
    assert_eq!(
        report.accepted_losses.len(),
        1,
        "{:?}",
        report.accepted_losses
    );
    assert_eq!(store.scan(&KeyPrefix::everything()).unwrap(), records);
    drop(store);
    let store = Store::open(&path, local).unwrap();
    assert_eq!(store.scan(&KeyPrefix::everything()).unwrap(), records);
}

#[test]
fn a_local_write_beyond_the_digest_is_refused_and_accepting_it_keeps_every_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let local = MachineId::generate();
    let peer = MachineId::generate();
    let now = 1_790_000_000_000;
    let mut records: Vec<Record> = (0..3)
        .map(|i| {
            record(
                Key::cluster("certificates", format!("{i}.test")),
                &peer,
                now + i,
                i + 1,
                b"c",
            )
        })
        .collect();
    // One of this Machine's own writes, numbered 5, in the same chunk; its digest entry lost.
    records.push(record(
        Key::cluster("policy", "acme"),
        &local,
        now + 9,
        5,
        b"mine",
    ));
    {
        let db = raw(&path);
        let tree = db.open_tree(TREE).unwrap();
        tree.insert(chunk_key(1), chunk_value(&records)).unwrap();
        digest_entry(&tree, &peer, 3);
        db.flush().unwrap();
    }
    let refused = Store::open(&path, local.clone()).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("a local write numbered 5 beyond the digest (0)"),
        "{refused}"
    );
    let (store, report) = Store::open_with(&path, local.clone(), &accepting_loss()).unwrap();
    assert!(
        report.accepted_losses[0].contains("the digest was raised to 5"),
        "{:?}",
        report.accepted_losses
    );
    let mut expected = records.clone();
    expected.sort_by_key(|r| r.key.to_string());
    assert_eq!(store.scan(&KeyPrefix::everything()).unwrap(), expected);
    assert_eq!(store.digest().unwrap().get(&local), 5);
    let next = store
        .put(&Key::cluster("policy", "other"), b"x".to_vec())
        .unwrap();
    assert_eq!(next.seq, 6);
    drop(store);
    let store = Store::open(&path, local).unwrap();
    assert_eq!(store.scan(&KeyPrefix::everything()).unwrap().len(), 5);
}
