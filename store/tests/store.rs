//! Behaviour of one store and of pairs of stores, through the public API.

use ployz_core::MachineId;
use ployz_store::{Hlc, Key, KeyPrefix, Record, Store, StoreError, SyncRequest, WatchEvent};

fn store() -> Store {
    Store::temporary(MachineId::generate()).unwrap()
}

/// Brings `to` up to date with `from` through the sync protocol.
fn sync(from: &Store, to: &Store, limit: usize) {
    loop {
        let requests = to.digest().unwrap().requests_for(&from.digest().unwrap());
        if requests.is_empty() {
            return;
        }
        for req in requests {
            let batch = from.records_after(&req, limit).unwrap();
            to.apply_batch(&batch).unwrap();
        }
    }
}

#[test]
fn local_writes_number_themselves_and_advance_the_clock() {
    let s = store();
    let k = Key::cluster("policy", "acme");
    let a = s.put(&k, b"one".to_vec()).unwrap();
    let b = s.put(&k, b"two".to_vec()).unwrap();
    assert_eq!((a.seq, b.seq), (1, 2));
    assert!(b.hlc > a.hlc);
    assert_eq!(s.get(&k).unwrap().unwrap().value, b"two");
    assert_eq!(s.digest().unwrap().get(s.local()), 2);
}

#[test]
fn a_machine_may_not_write_another_machines_keys() {
    let s = store();
    let other = MachineId::generate();
    let err = s
        .put(&Key::machine(&other, "containers", "x"), vec![])
        .unwrap_err();
    assert!(matches!(err, StoreError::NotOwner { .. }), "{err}");
}

#[test]
fn a_forged_record_for_a_machine_owned_key_is_refused() {
    let owner = store();
    let forger = MachineId::generate();
    let mut r = owner
        .put(
            &Key::machine(owner.local(), "containers", "c1"),
            b"x".to_vec(),
        )
        .unwrap();
    r.origin = forger;
    let victim = store();
    let err = victim.merge(&[r]).unwrap_err();
    assert!(matches!(err, StoreError::ForeignWrite { .. }), "{err}");
    assert!(victim.scan(&KeyPrefix::everything()).unwrap().is_empty());
}

#[test]
fn merge_is_idempotent_and_a_tombstone_never_resurrects() {
    let a = store();
    let b = store();
    let k = Key::cluster("certificates", "app.test");
    let written = a.put(&k, b"cert".to_vec()).unwrap();
    sync(&a, &b, 100);
    let deleted = a.delete(&k).unwrap();
    sync(&a, &b, 100);
    // The old version arrives again, late and twice.
    let report = b.merge(&[written.clone(), written]).unwrap();
    assert_eq!(report.applied, 0);
    let held = b.get(&k).unwrap().unwrap();
    assert!(held.tombstone);
    assert_eq!(held, deleted);
    assert!(b
        .scan_live(&KeyPrefix::cluster_namespace("certificates"))
        .unwrap()
        .is_empty());
}

#[test]
fn equal_clocks_are_broken_by_machine_id_on_every_store() {
    let (x, y) = (MachineId::generate(), MachineId::generate());
    let hlc = Hlc {
        wall_ms: 10,
        counter: 0,
    };
    let k = Key::cluster("policy", "p");
    let rec = |origin: &MachineId, v: &[u8]| Record {
        key: k.clone(),
        value: v.to_vec(),
        origin: origin.clone(),
        hlc,
        seq: 1,
        tombstone: false,
    };
    let (rx, ry) = (rec(&x, b"x"), rec(&y, b"y"));
    let winner = if x > y { b"x" } else { b"y" };
    let s1 = store();
    let s2 = store();
    s1.merge(&[rx.clone(), ry.clone()]).unwrap();
    s2.merge(&[ry, rx]).unwrap();
    assert_eq!(s1.get(&k).unwrap().unwrap().value, winner);
    assert_eq!(s2.get(&k).unwrap().unwrap().value, winner);
}

#[test]
fn batches_are_bounded_and_resume_where_they_stopped() {
    let a = store();
    for i in 0..10 {
        a.put(&Key::machine(a.local(), "obs", i.to_string()), vec![i])
            .unwrap();
    }
    let req = SyncRequest {
        origin: a.local().clone(),
        after: 0,
    };
    let first = a.records_after(&req, 4).unwrap();
    assert_eq!(first.records.len(), 4);
    assert_eq!(first.up_to, 4);
    let b = store();
    b.apply_batch(&first).unwrap();
    assert_eq!(b.digest().unwrap().get(a.local()), 4);
    sync(&a, &b, 4);
    assert_eq!(b.digest().unwrap().get(a.local()), 10);
    assert_eq!(b.scan(&KeyPrefix::everything()).unwrap().len(), 10);
}

#[test]
fn a_batch_that_would_open_a_gap_merges_but_does_not_raise_the_digest() {
    let a = store();
    for i in 0..6u8 {
        a.put(&Key::cluster("c", i.to_string()), vec![i]).unwrap();
    }
    let late = a
        .records_after(
            &SyncRequest {
                origin: a.local().clone(),
                after: 3,
            },
            100,
        )
        .unwrap();
    let b = store();
    b.apply_batch(&late).unwrap();
    assert_eq!(b.digest().unwrap().get(a.local()), 0);
    sync(&a, &b, 100);
    assert_eq!(b.scan(&KeyPrefix::everything()).unwrap().len(), 6);
}

#[test]
fn a_store_that_lost_its_data_never_reuses_its_sequence_numbers() {
    let id = MachineId::generate();
    let first = Store::temporary(id.clone()).unwrap();
    let peer = store();
    for i in 0..3u8 {
        first
            .put(&Key::cluster("c", i.to_string()), vec![i])
            .unwrap();
    }
    sync(&first, &peer, 100);
    let reborn = Store::temporary(id.clone()).unwrap();
    sync(&peer, &reborn, 100);
    let next = reborn.put(&Key::cluster("c", "new"), vec![]).unwrap();
    assert_eq!(next.seq, 4);
}

#[tokio::test]
async fn watches_see_local_and_merged_changes_under_their_prefix_only() {
    let a = store();
    let b = store();
    let mut w = b.watch(KeyPrefix::machine_namespace("containers"));
    a.put(&Key::cluster("policy", "x"), vec![]).unwrap();
    a.put(&Key::machine(a.local(), "containers", "c1"), b"up".to_vec())
        .unwrap();
    sync(&a, &b, 100);
    b.put(&Key::machine(b.local(), "containers", "c2"), b"up".to_vec())
        .unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        match w.next().await.unwrap() {
            WatchEvent::Changed(c) => seen.push(c.record.key.name().to_owned()),
            WatchEvent::Lagged => panic!("lagged"),
        }
    }
    assert_eq!(seen, ["c1", "c2"]);
}

#[test]
fn the_store_reopens_with_everything_and_keeps_counting() {
    let dir = tempfile::tempdir().unwrap();
    let id = MachineId::generate();
    let k = Key::machine(&id, "machines", "info");
    {
        let s = Store::open(dir.path(), id.clone()).unwrap();
        s.put(&k, b"v1".to_vec()).unwrap();
    }
    let s = Store::open(dir.path(), id.clone()).unwrap();
    assert_eq!(s.get(&k).unwrap().unwrap().value, b"v1");
    let again = s.put(&k, b"v2".to_vec()).unwrap();
    assert_eq!(again.seq, 2);
}

#[test]
fn a_store_handed_over_lets_another_open_it_and_never_writes_again() {
    let dir = tempfile::tempdir().unwrap();
    let id = MachineId::generate();
    let old = Store::open(dir.path().join("store"), id.clone()).unwrap();
    let k = Key::cluster("policy", "acme");
    old.put(&k, b"before".to_vec()).unwrap();
    // Held: a second process (here, a second handle) cannot open the files.
    assert!(Store::open(dir.path().join("store"), id.clone()).is_err());
    old.hand_over().unwrap();
    let new = Store::open(dir.path().join("store"), id.clone()).expect("opens once handed over");
    assert_eq!(
        new.get(&k)
            .unwrap()
            .and_then(|r| r.live_value().map(<[u8]>::to_vec)),
        Some(b"before".to_vec())
    );
    // The old handle reads what it had and refuses every write, saying why; it does not
    // take the files back.
    assert!(old.get(&k).unwrap().is_some());
    let err = old.put(&k, b"after".to_vec()).unwrap_err();
    assert!(err.to_string().contains("handed its store"), "{err}");
    assert!(!old.recover());
    new.put(&k, b"after".to_vec()).unwrap();
}
