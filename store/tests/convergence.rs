//! Property: any number of stores, any interleaving of writes with sync messages that are
//! duplicated, reordered, delayed and cut into small batches, end with identical contents after a
//! final exchange; and those contents are exactly the winner of every key among all writes ever
//! made (so a tombstone that won never resurrects, and a cluster-scoped key has one winner).
//! Machines are forgotten along the way by some stores ([`Store::forget_origin`]), and by every
//! other store before the final exchange: the stores that remain then hold exactly the winners,
//! less the machine-owned keys of the forgotten Machines.

use std::collections::{BTreeMap, BTreeSet};

use ployz_core::MachineId;
use ployz_store::{Key, KeyPrefix, Owner, Record, Store, SyncBatch};
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Op {
    /// Store `store` writes (or deletes) key `key`: cluster-scoped when `cluster`, else its own.
    Write {
        store: usize,
        key: u8,
        cluster: bool,
        delete: bool,
    },
    /// `to` asks `from` for what it is missing; the answers are queued, not delivered.
    Request {
        from: usize,
        to: usize,
        limit: usize,
    },
    /// `from` pushes its own recent writes (after an arbitrary sequence) to `to` unasked, as a
    /// gossip broadcast would: the batch may start beyond what `to` has.
    Push { from: usize, to: usize, back: u64 },
    /// Delivers a queued message (kept in the queue, so it may be delivered again).
    Deliver { pick: usize },
    /// Delivers a queued message and drops it from the queue.
    DeliverOnce { pick: usize },
    /// Store `store` forgets Machine `target` (never store 0's Machine, so one store always
    /// remains to compare with).
    Forget { store: usize, target: usize },
}

fn op(stores: usize) -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0..stores, 0u8..4, any::<bool>(), prop::bool::weighted(0.25)).prop_map(
            |(store, key, cluster, delete)| Op::Write { store, key, cluster, delete }
        ),
        3 => (0..stores, 0..stores, 1usize..4).prop_map(|(from, to, limit)| Op::Request { from, to, limit }),
        2 => (0..stores, 0..stores, 0u64..3).prop_map(|(from, to, back)| Op::Push { from, to, back }),
        2 => any::<usize>().prop_map(|pick| Op::Deliver { pick }),
        2 => any::<usize>().prop_map(|pick| Op::DeliverOnce { pick }),
        1 => (0..stores, 1..stores).prop_map(|(store, target)| Op::Forget { store, target }),
    ]
}

fn scenario() -> impl Strategy<Value = (usize, Vec<Op>)> {
    (2usize..5).prop_flat_map(|n| (Just(n), prop::collection::vec(op(n), 1..60)))
}

/// Every store's contents as (key -> record).
fn contents(s: &Store) -> BTreeMap<String, Record> {
    s.scan(&KeyPrefix::everything())
        .unwrap()
        .into_iter()
        .map(|r| (r.key.to_string(), r))
        .collect()
}

/// Full anti-entropy until every digest matches (bounded).
fn quiesce(stores: &[Store]) {
    for _ in 0..stores.len() * 4 {
        let mut moved = false;
        for a in stores {
            for b in stores {
                if std::ptr::eq(a, b) {
                    continue;
                }
                for req in b.digest().unwrap().requests_for(&a.digest().unwrap()) {
                    let batch = a.records_after(&req, 2).unwrap();
                    b.apply_batch(&batch).unwrap();
                    moved = true;
                }
            }
        }
        if !moved {
            return;
        }
    }
    panic!("stores did not quiesce");
}

fn run(n: usize, ops: Vec<Op>) {
    let ids: Vec<MachineId> = (0..n).map(|_| MachineId::generate()).collect();
    let stores: Vec<Store> = ids
        .iter()
        .map(|id| Store::temporary(id.clone()).unwrap())
        .collect();
    let mut queue: Vec<(usize, SyncBatch)> = Vec::new();
    let mut written: Vec<Record> = Vec::new();
    let mut forgotten: BTreeSet<usize> = BTreeSet::new();
    for op in ops {
        match op {
            Op::Write {
                store,
                key,
                cluster,
                delete,
            } => {
                let k = if cluster {
                    Key::cluster("shared", key.to_string())
                } else {
                    Key::machine(&ids[store], "own", key.to_string())
                };
                let r = if delete {
                    stores[store].delete(&k).unwrap()
                } else {
                    stores[store].put(&k, vec![key, store as u8]).unwrap()
                };
                written.push(r);
            }
            Op::Request { from, to, limit } => {
                if from == to {
                    continue;
                }
                let wanted = stores[to]
                    .digest()
                    .unwrap()
                    .requests_for(&stores[from].digest().unwrap());
                for req in wanted {
                    queue.push((to, stores[from].records_after(&req, limit).unwrap()));
                }
            }
            Op::Push { from, to, back } => {
                if from == to {
                    continue;
                }
                let origin = ids[from].clone();
                let after = stores[from]
                    .digest()
                    .unwrap()
                    .get(&origin)
                    .saturating_sub(back + 1);
                let req = ployz_store::SyncRequest { origin, after };
                queue.push((to, stores[from].records_after(&req, 8).unwrap()));
            }
            Op::Deliver { pick } if !queue.is_empty() => {
                let (to, batch) = &queue[pick % queue.len()];
                stores[*to].apply_batch(batch).unwrap();
            }
            Op::DeliverOnce { pick } if !queue.is_empty() => {
                let (to, batch) = queue.swap_remove(pick % queue.len());
                stores[to].apply_batch(&batch).unwrap();
            }
            Op::Deliver { .. } | Op::DeliverOnce { .. } => {}
            Op::Forget { store, target } => {
                if store != target {
                    stores[store].forget_origin(&ids[target]).unwrap();
                    forgotten.insert(target);
                }
            }
        }
    }
    // Every store forgets what any store forgot (but itself); stale copies are still queued.
    for &target in &forgotten {
        for (i, s) in stores.iter().enumerate() {
            if i != target {
                s.forget_origin(&ids[target]).unwrap();
            }
        }
    }
    // Late duplicates after everything else, then a final exchange.
    for (to, batch) in &queue {
        stores[*to].apply_batch(batch).unwrap();
    }
    quiesce(&stores);

    let gone: BTreeSet<&MachineId> = forgotten.iter().map(|&i| &ids[i]).collect();
    let mut model: BTreeMap<String, Record> = BTreeMap::new();
    for r in written {
        if matches!(r.key.owner(), Owner::Machine(m) if gone.contains(m)) {
            continue;
        }
        let slot = model.entry(r.key.to_string()).or_insert_with(|| r.clone());
        if r.precedence(slot).is_gt() {
            *slot = r;
        }
    }
    let first = contents(&stores[0]);
    let remaining = (1..n).filter(|i| !forgotten.contains(i));
    for s in remaining.map(|i| &stores[i]) {
        assert_eq!(contents(s), first, "stores differ");
        assert_eq!(s.digest().unwrap(), stores[0].digest().unwrap());
        assert_eq!(s.forgotten().unwrap(), stores[0].forgotten().unwrap());
    }
    assert_eq!(first, model, "contents are not the winner of every write");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn stores_converge_to_the_winner_of_every_key((n, ops) in scenario()) {
        run(n, ops);
    }
}
