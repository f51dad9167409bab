//! What replication between Machines needs of the store: big batches merged in one step, a
//! bound on how far ahead a peer's clock may run, batches bounded in bytes, and forgetting a
//! removed Machine.

use std::time::Duration;

use ployz_core::MachineId;
use ployz_store::{
    Key, KeyPrefix, OpenOptions, Record, Store, StoreError, SyncBatch, SyncRequest, Watch,
    WatchEvent, DEFAULT_MAX_DRIFT,
};

fn store() -> Store {
    Store::temporary(MachineId::generate()).unwrap()
}

/// One sync round: `to` asks `from` for every origin where it is behind, in batches of `limit`,
/// until nothing more moves. Returns the merge reports.
fn sync(from: &Store, to: &Store, limit: usize) -> Vec<ployz_store::MergeReport> {
    let mut reports = Vec::new();
    for _ in 0..1000 {
        let requests = to.digest().unwrap().requests_for(&from.digest().unwrap());
        let mut moved = false;
        for req in requests {
            let batch = from.records_after(&req, limit).unwrap();
            let before = to.digest().unwrap().get(&req.origin);
            reports.push(to.apply_batch(&batch).unwrap());
            moved |= to.digest().unwrap().get(&req.origin) > before;
        }
        if !moved {
            return reports;
        }
    }
    panic!("sync did not settle");
}

const HOUR_MS: i64 = 3_600_000;

fn policy() -> Key {
    Key::cluster("policy", "acme")
}

// ----- Merge of big batches -----

#[test]
fn ten_thousand_records_merge_in_one_call_and_every_one_is_announced_and_durable() {
    let dir = tempfile::tempdir().unwrap();
    let source = store();
    let n = 10_000usize;
    for i in 0..n {
        source
            .put(
                &Key::machine(source.local(), "containers", i.to_string()),
                vec![1u8; 64],
            )
            .unwrap();
    }
    let batch = source
        .records_after(
            &SyncRequest {
                origin: source.local().clone(),
                after: 0,
            },
            n,
        )
        .unwrap();
    let local = MachineId::generate();
    {
        let target = Store::open(dir.path().join("s"), local.clone()).unwrap();
        let mut watch = target.watch(KeyPrefix::machine_namespace("containers"));
        let report = target.apply_batch(&batch).unwrap();
        assert_eq!(report.applied, n);
        assert_eq!(target.digest().unwrap().get(source.local()), n as u64);
        // The watch buffer holds 4096 changes: a watcher this far behind is told to rescan,
        // then gets the last 4096.
        let told = next_events(&mut watch, 4097);
        assert!(matches!(told[0], WatchEvent::Lagged));
        let last: Vec<String> = told[1..]
            .iter()
            .map(|e| match e {
                WatchEvent::Changed(c) => c.record.key.name().to_owned(),
                WatchEvent::Lagged => panic!("lagged twice"),
            })
            .collect();
        let expected: Vec<String> = (n - 4096..n).map(|i| i.to_string()).collect();
        assert_eq!(last, expected);
        // Again: every record is held already.
        let again = target.apply_batch(&batch).unwrap();
        assert_eq!((again.applied, again.ignored), (0, n));
    }
    // Durable: opened again, every record is there, in step with its log.
    let reopened = Store::open(dir.path().join("s"), local).unwrap();
    assert_eq!(
        reopened
            .scan(&KeyPrefix::machine_namespace("containers"))
            .unwrap()
            .len(),
        n
    );
    let again = reopened
        .records_after(
            &SyncRequest {
                origin: source.local().clone(),
                after: 0,
            },
            n,
        )
        .unwrap();
    assert_eq!(again.records, batch.records);
}

#[test]
fn a_batch_holding_two_versions_of_a_key_keeps_the_winner_and_its_log_entry_only() {
    let a = store();
    let k = policy();
    let first = a.put(&k, b"one".to_vec()).unwrap();
    let second = a.put(&k, b"two".to_vec()).unwrap();
    let b = store();
    let report = b.merge(&[first.clone(), second.clone(), first]).unwrap();
    assert_eq!((report.applied, report.ignored), (2, 1));
    assert_eq!(b.get(&k).unwrap().unwrap(), second);
    // Only the winner's log entry remains: a request for a's range returns it once.
    let c = store();
    let batch = SyncBatch {
        origin: a.local().clone(),
        after: 0,
        up_to: 2,
        records: vec![second.clone()],
    };
    c.apply_batch(&batch).unwrap();
    // b holds the same, and answers for a's range (it never raised its digest: merge does not).
    b.apply_batch(&batch).unwrap();
    let answer = b
        .records_after(
            &SyncRequest {
                origin: a.local().clone(),
                after: 0,
            },
            10,
        )
        .unwrap();
    assert_eq!(answer.records, vec![second]);
}

// ----- HLC drift bound -----

#[test]
fn a_machine_an_hour_ahead_is_refused_counted_and_taken_once_the_bound_allows() {
    let ahead = store();
    ahead.set_clock_offset_ms(HOUR_MS);
    let b = store();
    let c = store();
    assert_eq!(b.max_drift(), DEFAULT_MAX_DRIFT);
    let k = policy();

    let future = ahead.put(&k, b"from the future".to_vec()).unwrap();
    assert!(
        future.hlc.wall_ms
            > b.put(&Key::cluster("x", "y"), vec![]).unwrap().hlc.wall_ms + 3_000_000,
        "the offset moves local timestamps"
    );

    let reports = sync(&ahead, &b, 10);
    let refused: usize = reports.iter().map(|r| r.too_far_ahead).sum();
    assert_eq!(refused, 1, "{reports:?}");
    assert_eq!(b.get(&k).unwrap(), None);
    assert_eq!(b.clock_refusals().get(ahead.local()), Some(&1));
    assert_eq!(
        b.digest().unwrap().get(ahead.local()),
        0,
        "the refused record is not claimed"
    );
    // b's clock did not jump: its writes and c's keep winning between themselves.
    let from_b = b.put(&k, b"b".to_vec()).unwrap();
    assert!(from_b.hlc.wall_ms < future.hlc.wall_ms - 3_000_000);
    sync(&b, &c, 10);
    assert_eq!(c.get(&k).unwrap().unwrap(), from_b);
    let from_c = c.put(&k, b"c".to_vec()).unwrap();
    sync(&c, &b, 10);
    sync(&ahead, &c, 10);
    assert_eq!(b.get(&k).unwrap().unwrap(), from_c);
    assert_eq!(c.get(&k).unwrap().unwrap(), from_c);
    assert_eq!(c.clock_refusals().get(ahead.local()), Some(&1));

    // Once the bound allows, the next round takes it (it wins: its clock is an hour ahead).
    b.set_max_drift(Duration::from_millis(2 * HOUR_MS as u64));
    let reports = sync(&ahead, &b, 10);
    assert_eq!(reports.iter().map(|r| r.applied).sum::<usize>(), 1);
    assert_eq!(b.get(&k).unwrap().unwrap(), future);
    assert_eq!(
        b.digest().unwrap().get(ahead.local()),
        ahead.digest().unwrap().get(ahead.local())
    );
    // c still refuses it, from b too.
    let reports = sync(&b, &c, 10);
    assert!(reports.iter().any(|r| r.too_far_ahead == 1), "{reports:?}");
    assert_eq!(c.get(&k).unwrap().unwrap(), from_c);
}

#[test]
fn a_store_whose_clock_went_back_knows_it_and_by_how_much() {
    let a = store();
    a.put(&Key::cluster("x", "before"), vec![]).unwrap();
    assert!(a.clock_went_back().is_none());
    assert!(
        a.clock_ahead() < Duration::from_secs(1),
        "{:?}",
        a.clock_ahead()
    );
    // A forward jump of an hour, a write, and the clock set right again.
    a.set_clock_offset_ms(HOUR_MS);
    a.put(&Key::cluster("x", "during"), vec![]).unwrap();
    assert!(
        a.clock_went_back().is_none(),
        "its clock is where its writes are"
    );
    a.set_clock_offset_ms(0);
    let went_back = a.clock_went_back().expect("the clock went back an hour");
    assert!(
        went_back > Duration::from_millis(HOUR_MS as u64 - 60_000)
            && went_back <= Duration::from_millis(HOUR_MS as u64),
        "{went_back:?}"
    );
    // Its next write carries the old time still: a store with the right time refuses it.
    a.put(&Key::cluster("x", "after"), vec![]).unwrap();
    let b = store();
    let reports = sync(&a, &b, 10);
    assert_eq!(reports[0].too_far_ahead, 2, "{reports:?}");
    assert!(b.get(&Key::cluster("x", "before")).unwrap().is_some());
    assert!(b.get(&Key::cluster("x", "during")).unwrap().is_none());
    assert!(
        b.get(&Key::cluster("x", "after")).unwrap().is_none(),
        "a write after the clock was set right was taken"
    );
    // Taking in a record within the drift bound does not count as the clock going back.
    let c = store();
    c.set_clock_offset_ms(400);
    c.put(&Key::cluster("x", "slightly"), vec![]).unwrap();
    let d = store();
    sync(&c, &d, 10);
    assert!(d.clock_went_back().is_none(), "{:?}", d.clock_ahead());
}

#[test]
fn the_digest_stops_just_below_the_first_refused_record_and_the_rest_merges() {
    let a = store();
    let mut written = Vec::new();
    for i in 0..3u8 {
        written.push(
            a.put(&Key::machine(a.local(), "obs", i.to_string()), vec![i])
                .unwrap(),
        );
    }
    a.set_clock_offset_ms(HOUR_MS);
    written.push(
        a.put(&Key::machine(a.local(), "obs", "3"), vec![3])
            .unwrap(),
    );
    a.set_clock_offset_ms(0);
    // The clock of `a` went back; HLC keeps its writes after the future one, but they carry
    // the future wall time too: only the first refused one matters for the digest.
    written.push(
        a.put(&Key::machine(a.local(), "obs", "4"), vec![4])
            .unwrap(),
    );
    let b = store();
    let batch = a
        .records_after(
            &SyncRequest {
                origin: a.local().clone(),
                after: 0,
            },
            10,
        )
        .unwrap();
    assert_eq!(batch.up_to, 5);
    let report = b.apply_batch(&batch).unwrap();
    assert_eq!((report.applied, report.too_far_ahead), (3, 2));
    assert_eq!(b.digest().unwrap().get(a.local()), 3);
    assert_eq!(
        b.scan(&KeyPrefix::everything()).unwrap(),
        written[..3].to_vec()
    );
    assert_eq!(b.clock_refusals().get(a.local()), Some(&2));

    // Once the bound allows, asking again from where the digest stopped brings the rest.
    b.set_max_drift(Duration::from_millis(2 * HOUR_MS as u64));
    let reports = sync(&a, &b, 10);
    assert_eq!(reports.iter().map(|r| r.applied).sum::<usize>(), 2);
    assert_eq!(b.scan(&KeyPrefix::everything()).unwrap(), written);
    assert_eq!(b.digest().unwrap().get(a.local()), 5);
}

#[test]
fn a_refused_record_of_another_machine_in_a_batch_stops_the_digest_at_the_entries_before_it() {
    // A batch of a's range in which a's entry 3 is answered by another Machine's record (one
    // that superseded a's write for the key), an hour ahead.
    let a = store();
    let written: Vec<Record> = (1..=4u8)
        .map(|i| {
            a.put(&Key::cluster("shared", i.to_string()), vec![i])
                .unwrap()
        })
        .collect();
    let other = store();
    other.set_clock_offset_ms(HOUR_MS);
    let superseding = other.put(&written[2].key, b"later".to_vec()).unwrap();
    let batch = SyncBatch {
        origin: a.local().clone(),
        after: 0,
        up_to: 4,
        records: vec![
            written[0].clone(),
            written[1].clone(),
            superseding,
            written[3].clone(),
        ],
    };
    let b = store();
    let report = b.apply_batch(&batch).unwrap();
    assert_eq!((report.applied, report.too_far_ahead), (3, 1));
    assert_eq!(
        b.digest().unwrap().get(a.local()),
        2,
        "the refused record stands somewhere after a's entry 2"
    );
    assert_eq!(b.clock_refusals().get(other.local()), Some(&1));
    assert_eq!(b.clock_refusals().get(a.local()), None);
}

#[test]
fn a_store_running_behind_refuses_what_its_own_clock_calls_the_future() {
    let a = store();
    let r = a.put(&policy(), b"now".to_vec()).unwrap();
    let behind = store();
    behind.set_clock_offset_ms(-HOUR_MS);
    let report = behind.merge(std::slice::from_ref(&r)).unwrap();
    assert_eq!(report.too_far_ahead, 1);
    behind.set_clock_offset_ms(0);
    let report = behind.merge(&[r]).unwrap();
    assert_eq!(report.applied, 1);
}

// ----- Batches bounded in bytes -----

#[test]
fn batches_are_bounded_in_bytes_and_a_huge_record_still_travels_alone() {
    let a = store();
    let mut written = Vec::new();
    for (i, size) in [100usize, 100, 100, 5000, 100, 100].into_iter().enumerate() {
        written.push(
            a.put(
                &Key::machine(a.local(), "obs", i.to_string()),
                vec![i as u8; size],
            )
            .unwrap(),
        );
    }
    let each = written[0].stored_len();
    let req = |after| SyncRequest {
        origin: a.local().clone(),
        after,
    };
    // Room for two small records, not three.
    let bound = 2 * each + each / 2;
    let first = a.records_after_within(&req(0), 100, bound).unwrap();
    assert_eq!(first.records, written[..2].to_vec());
    assert_eq!(first.up_to, 2);
    let second = a.records_after_within(&req(2), 100, bound).unwrap();
    assert_eq!(
        second.records,
        written[2..3].to_vec(),
        "the big one does not fit"
    );
    assert_eq!(second.up_to, 3);
    let third = a.records_after_within(&req(3), 100, bound).unwrap();
    assert_eq!(
        third.records,
        written[3..4].to_vec(),
        "a huge record travels alone"
    );
    assert_eq!(third.up_to, 4);
    let last = a.records_after_within(&req(4), 100, bound).unwrap();
    assert_eq!(last.records, written[4..].to_vec());
    assert_eq!(last.up_to, 6);
    // The record bound still applies, and a zero byte bound still moves one record a batch.
    let one = a.records_after_within(&req(0), 1, usize::MAX).unwrap();
    assert_eq!((one.records.len(), one.up_to), (1, 1));
    let tiny = a.records_after_within(&req(0), 100, 0).unwrap();
    assert_eq!((tiny.records.len(), tiny.up_to), (1, 1));

    // Syncing in byte-bounded batches ends with everything.
    let b = store();
    for _ in 0..100 {
        let Some(r) = b.digest().unwrap().requests_for(&a.digest().unwrap()).pop() else {
            break;
        };
        b.apply_batch(&a.records_after_within(&r, 100, bound).unwrap())
            .unwrap();
    }
    assert_eq!(b.scan(&KeyPrefix::everything()).unwrap(), written);
}

// ----- Forgetting a removed Machine -----

/// A Machine's observation and a cluster-scoped record it wrote.
fn populate(gone: &Store) -> (Vec<Record>, Record) {
    let own = (0..3)
        .map(|i| {
            gone.put(
                &Key::machine(gone.local(), "containers", i.to_string()),
                vec![i],
            )
            .unwrap()
        })
        .collect();
    let shared = gone
        .put(&Key::cluster("certificates", "app.test"), b"cert".to_vec())
        .unwrap();
    (own, shared)
}

#[test]
fn forgetting_removes_the_machines_own_records_and_a_stale_batch_does_not_bring_them_back() {
    let gone = store();
    let (own, shared) = populate(&gone);
    let also_gone_only_owned = store();
    also_gone_only_owned
        .put(
            &Key::machine(also_gone_only_owned.local(), "machines", "info"),
            vec![1],
        )
        .unwrap();
    let keeper = store();
    let peer = store();
    for s in [&keeper, &peer] {
        sync(&gone, s, 2);
        sync(&also_gone_only_owned, s, 2);
    }
    let mut watch = keeper.watch_any(vec![KeyPrefix::everything()]);

    let removed = keeper.forget_origin(gone.local()).unwrap();
    assert_eq!(removed, own.len());
    assert_eq!(
        keeper.forget_origin(also_gone_only_owned.local()).unwrap(),
        1
    );
    let forgotten = keeper.forgotten().unwrap();
    assert!(forgotten.contains(gone.local()) && forgotten.contains(also_gone_only_owned.local()));
    assert!(keeper
        .scan(&KeyPrefix::machine_namespace("containers"))
        .unwrap()
        .is_empty());
    assert_eq!(
        keeper.get(&shared.key).unwrap().unwrap(),
        shared,
        "cluster-scoped stays"
    );
    // Its digest entry goes when nothing of it is held; it stays while its cluster-scoped
    // record does, so that record still travels.
    let digest = keeper.digest().unwrap();
    assert!(!digest.0.contains_key(also_gone_only_owned.local()));
    assert_eq!(digest.get(gone.local()), 4);
    let answer = keeper
        .records_after(
            &SyncRequest {
                origin: gone.local().clone(),
                after: 0,
            },
            10,
        )
        .unwrap();
    assert_eq!(answer.records, vec![shared.clone()]);

    // Watchers are told of each removed key, as a deletion.
    let mut told = Vec::new();
    for event in next_events(&mut watch, 4) {
        match event {
            WatchEvent::Changed(c) => {
                assert!(c.record.tombstone && c.record.value.is_empty());
                assert_eq!(keeper.get(&c.record.key).unwrap(), None);
                told.push(c.record.key);
            }
            other => panic!("expected a change, got {other:?}"),
        }
    }
    let mut expected: Vec<Key> = own.iter().map(|r| r.key.clone()).collect();
    expected.push(Key::machine(
        also_gone_only_owned.local(),
        "machines",
        "info",
    ));
    told.sort();
    expected.sort();
    assert_eq!(told, expected);

    // A peer that still holds the records sends them again, as a batch and as a merge: they
    // are ignored, not errors.
    let stale = peer
        .records_after(
            &SyncRequest {
                origin: gone.local().clone(),
                after: 0,
            },
            10,
        )
        .unwrap();
    let report = keeper.apply_batch(&stale).unwrap();
    assert_eq!((report.applied, report.ignored), (0, 4));
    let report = keeper.merge(&own).unwrap();
    assert_eq!((report.applied, report.ignored), (0, 3));
    sync(&peer, &keeper, 2);
    sync(&gone, &keeper, 2);
    assert!(keeper
        .scan(&KeyPrefix::machine_namespace("containers"))
        .unwrap()
        .is_empty());
    // Even its new writes for its own keys.
    let later = gone
        .put(&Key::machine(gone.local(), "containers", "new"), vec![9])
        .unwrap();
    assert_eq!(keeper.merge(&[later]).unwrap().ignored, 1);
    // Its cluster-scoped writes are records like any other's: every store keeps one winner.
    let newer = gone.put(&shared.key, b"renewed".to_vec()).unwrap();
    sync(&gone, &keeper, 2);
    assert_eq!(keeper.get(&shared.key).unwrap().unwrap(), newer);

    assert!(matches!(
        keeper.forget_origin(keeper.local()),
        Err(StoreError::ForgetLocal { .. })
    ));
}

#[test]
fn forgetting_is_durable_and_the_acknowledgement_record_does_not_call_it_a_loss() {
    let dir = tempfile::tempdir().unwrap();
    let options = OpenOptions {
        acknowledged: Some(dir.path().join("store.ack")),
        accept_loss: false,
    };
    let local = MachineId::generate();
    let gone = store();
    let (_, shared) = populate(&gone);
    let only_owned = store();
    only_owned
        .put(
            &Key::machine(only_owned.local(), "machines", "info"),
            vec![1],
        )
        .unwrap();
    {
        let (s, _) = Store::open_with(dir.path().join("s"), local.clone(), &options).unwrap();
        sync(&gone, &s, 10);
        sync(&only_owned, &s, 10);
        s.forget_origin(gone.local()).unwrap();
        s.forget_origin(only_owned.local()).unwrap();
    }
    let (s, report) = Store::open_with(dir.path().join("s"), local, &options).unwrap();
    assert!(
        report.accepted_losses.is_empty(),
        "{:?}",
        report.accepted_losses
    );
    let forgotten = s.forgotten().unwrap();
    assert!(forgotten.contains(gone.local()) && forgotten.contains(only_owned.local()));
    assert_eq!(
        s.scan(&KeyPrefix::everything()).unwrap(),
        vec![shared.clone()]
    );
    let report = s
        .merge(&[only_owned
            .put(
                &Key::machine(only_owned.local(), "machines", "info"),
                vec![2],
            )
            .unwrap()])
        .unwrap();
    assert_eq!(report.ignored, 1, "still forgotten after reopening");
}

/// The next `n` events of `watch`, which the store sent before its call returned (bounded
/// wait, in case it did not).
fn next_events(watch: &mut Watch, n: usize) -> Vec<WatchEvent> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let event = tokio::time::timeout(Duration::from_secs(5), watch.next())
                .await
                .expect("the change was announced")
                .expect("the store is there");
            out.push(event);
        }
        out
    })
}
