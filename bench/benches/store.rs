//! The store's costs: a durable local write, merging 10,000 remote records (applied or all
//! ignored), computing a digest.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use ployz_core::MachineId;
use ployz_store::{Key, OpenOptions, Store, SyncBatch, SyncRequest};

fn on_disk(dir: &tempfile::TempDir) -> Store {
    Store::open(dir.path(), MachineId::generate()).unwrap()
}

/// Durable 512-byte writes to `store`, under `name`.
fn bench_writes(c: &mut Criterion, name: &str, store: &Store) {
    let local = store.local().clone();
    let mut n = 0u64;
    let value = vec![7u8; 512];
    c.bench_function(name, |b| {
        b.iter(|| {
            n += 1;
            store
                .put(
                    &Key::machine(&local, "containers", (n % 1000).to_string()),
                    value.clone(),
                )
                .unwrap()
        })
    });
}

fn local_write(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    bench_writes(c, "store/local_write_durable_512B", &on_disk(&dir));
}

/// The same write as the daemon makes it: the acknowledgement record beside the store is
/// replaced (written, synced, renamed, directory synced) after the flush.
fn local_write_acknowledged(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let options = OpenOptions {
        acknowledged: Some(dir.path().join("store.ack")),
        accept_loss: false,
    };
    let (store, _) =
        Store::open_with(dir.path().join("store"), MachineId::generate(), &options).unwrap();
    bench_writes(c, "store/local_write_durable_acknowledged_512B", &store);
}

/// `count` records written by one origin, as a peer would send them: one batch answering
/// "everything after 0".
fn remote_batch(count: usize) -> SyncBatch {
    let id = MachineId::generate();
    let dir = tempfile::tempdir().unwrap();
    let source = Store::open(dir.path(), id.clone()).unwrap();
    for i in 0..count {
        source
            .put(
                &Key::machine(&id, "containers", i.to_string()),
                vec![1u8; 256],
            )
            .unwrap();
    }
    let batch = source
        .records_after(
            &SyncRequest {
                origin: id,
                after: 0,
            },
            count,
        )
        .unwrap();
    assert_eq!(batch.records.len(), count);
    batch
}

/// Merging 10,000 remote records: into an empty store (by `merge` and by `apply_batch`, each
/// record applied), and into a store already holding them (each ignored). The store's own
/// closing is left out of the measure (the routine hands the store back).
fn merge_10k(c: &mut Criterion) {
    let batch = remote_batch(10_000);
    let mut group = c.benchmark_group("store");
    group.sample_size(10);
    group.throughput(Throughput::Elements(batch.records.len() as u64));
    let empty_store = || {
        let dir = tempfile::tempdir().unwrap();
        let store = on_disk(&dir);
        (dir, store)
    };
    group.bench_function("merge_10k_remote_records", |b| {
        b.iter_batched(
            empty_store,
            |(dir, store)| {
                let report = store.merge(&batch.records).unwrap();
                assert_eq!(report.applied, batch.records.len());
                (dir, store)
            },
            BatchSize::PerIteration,
        )
    });
    group.bench_function("apply_batch_10k_remote_records_into_empty_store", |b| {
        b.iter_batched(
            empty_store,
            |(dir, store)| {
                let report = store.apply_batch(&batch).unwrap();
                assert_eq!(report.applied, batch.records.len());
                (dir, store)
            },
            BatchSize::PerIteration,
        )
    });
    let (_dir, holding) = empty_store();
    holding.apply_batch(&batch).unwrap();
    group.bench_function("apply_batch_10k_remote_records_all_held", |b| {
        b.iter(|| {
            let report = holding.apply_batch(&batch).unwrap();
            assert_eq!(report.ignored, batch.records.len());
        })
    });
    group.finish();
}

fn digest(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = on_disk(&dir);
    // 50 origins, as a Cluster of 50 Machines would leave.
    for _ in 0..50 {
        let other = Store::temporary(MachineId::generate()).unwrap();
        let k = Key::machine(other.local(), "machines", "info");
        let r = other.put(&k, vec![0; 64]).unwrap();
        store
            .apply_batch(&ployz_store::SyncBatch {
                origin: r.origin.clone(),
                after: 0,
                up_to: r.seq,
                records: vec![r],
            })
            .unwrap();
    }
    assert_eq!(store.digest().unwrap().0.len(), 50);
    c.bench_function("store/digest_50_origins", |b| {
        b.iter(|| store.digest().unwrap())
    });
}

criterion_group!(
    benches,
    local_write,
    local_write_acknowledged,
    merge_10k,
    digest
);
criterion_main!(benches);
