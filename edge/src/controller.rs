//! The RouteController: rebuilds the route table when container observations change.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use ployz_orchestrator::observer::{stored_observations, CONTAINERS_NAMESPACE};
use ployz_store::{KeyPrefix, Store};
use tokio::sync::watch;

use crate::route_table::{Fingerprint, RouteTable};

/// Owns the published [`RouteTable`].
#[derive(Clone, Default)]
pub struct RouteController {
    table: Arc<ArcSwap<RouteTable>>,
}

impl RouteController {
    /// A controller publishing an empty table (every host is unknown until the first build).
    pub fn new() -> RouteController {
        RouteController::default()
    }

    /// The published table, for the hot path: one atomic load.
    pub fn table(&self) -> &Arc<ArcSwap<RouteTable>> {
        &self.table
    }

    /// Rebuilds from the store and publishes if anything changed. Returns the new generation
    /// when it published.
    pub fn rebuild(&self, store: &Store, last: &mut Fingerprint) -> Option<u64> {
        let observations = stored_observations(store);
        let generation = self.table.load().generation() + 1;
        let table = RouteTable::build(&observations, store.local(), generation);
        let fp = table.fingerprint();
        if &fp == last {
            return None;
        }
        *last = fp;
        self.table.store(Arc::new(table));
        Some(generation)
    }

    /// Keeps the table current until `shutdown` turns true: a rebuild at start and after every
    /// change to container observations (bursts coalesced over a few milliseconds).
    pub async fn run(&self, store: Arc<Store>, mut shutdown: watch::Receiver<bool>) {
        let mut watch = store.watch(KeyPrefix::machine_namespace(CONTAINERS_NAMESPACE));
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
                event = watch.next() => {
                    if event.is_none() {
                        return;
                    }
                    // Coalesce a burst of changes into one rebuild.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        }
    }
}
