//! The RouteController: rebuilds the route table when container observations or drain marks
//! change, and answers the questions a drain asks ("does the edge still route to it? how many
//! requests are in flight to it?").

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use ployz_core::ContainerId;
pub use ployz_store::drains::{draining_containers, draining_key, DRAINING_NAMESPACE};
use ployz_store::observations::{stored_observations, CONTAINERS_NAMESPACE};
use ployz_store::{KeyPrefix, Store};
use tokio::sync::watch;

use crate::route_table::{Fingerprint, InFlightCounters, RouteTable};

#[derive(Default)]
struct Counters(Mutex<HashMap<ContainerId, Arc<AtomicUsize>>>);

impl InFlightCounters for Counters {
    fn counter(&self, container: &ContainerId) -> Arc<AtomicUsize> {
        self.0
            .lock()
            .expect("counters lock")
            .entry(container.clone())
            .or_default()
            .clone()
    }
}

/// Owns the published [`RouteTable`] and the per-container in-flight counters.
#[derive(Clone, Default)]
pub struct RouteController {
    table: Arc<ArcSwap<RouteTable>>,
    counters: Arc<Counters>,
}

impl RouteController {
    /// A controller publishing an empty table (every host is unknown until the first build).
    pub fn new() -> RouteController {
        RouteController::default()
    }

    /// A controller publishing a fixed table (the edge alone).
    pub fn fixed(table: RouteTable) -> RouteController {
        let c = RouteController::default();
        c.table.store(Arc::new(table));
        c
    }

    /// The published table, for the hot path: one atomic load.
    pub fn table(&self) -> &Arc<ArcSwap<RouteTable>> {
        &self.table
    }

    /// Requests this edge has in flight to `container`.
    pub fn in_flight(&self, container: &ContainerId) -> usize {
        self.counters
            .0
            .lock()
            .expect("counters lock")
            .get(container)
            .map_or(0, |c| c.load(Ordering::SeqCst))
    }

    /// Rebuilds from the store and publishes if anything changed. Returns the new generation
    /// when it published.
    pub fn rebuild(&self, store: &Store, last: &mut Fingerprint) -> Option<u64> {
        let observations = stored_observations(store);
        let draining = draining_containers(store);
        let generation = self.table.load().generation() + 1;
        let table = RouteTable::build(
            &observations,
            &draining,
            store.local(),
            self.counters.as_ref(),
            generation,
        );
        // Counters of containers that are gone are dropped (in-flight requests keep theirs).
        {
            let live: HashSet<&ContainerId> = observations.iter().map(|o| &o.id).collect();
            self.counters
                .0
                .lock()
                .expect("counters lock")
                .retain(|id, c| live.contains(id) || c.load(Ordering::Relaxed) > 0);
        }
        let fp = table.fingerprint();
        if &fp == last {
            return None;
        }
        *last = fp;
        self.table.store(Arc::new(table));
        Some(generation)
    }

    /// Keeps the table current until `shutdown` turns true: a rebuild at start and after every
    /// change to container observations or drain marks.
    pub async fn run(&self, store: Arc<Store>, mut shutdown: watch::Receiver<bool>) {
        let mut containers = store.watch(KeyPrefix::machine_namespace(CONTAINERS_NAMESPACE));
        let mut drains = store.watch(KeyPrefix::machine_namespace(DRAINING_NAMESPACE));
        let mut last = Fingerprint::new();
        loop {
            let s = store.clone();
            let this = self.clone();
            let mut fp = std::mem::take(&mut last);
            let (fp, published) = tokio::task::spawn_blocking(move || {
                let g = this.rebuild(&s, &mut fp);
                (fp, g)
            })
            .await
            .unwrap_or_default();
            last = fp;
            if let Some(generation) = published {
                let t = self.table.load();
                tracing::info!(generation, hostnames = t.len(), "route table published");
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                event = containers.next() => if event.is_none() { return },
                event = drains.next() => if event.is_none() { return },
            }
            // Coalesce a burst of changes into one rebuild.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}
