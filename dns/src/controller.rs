//! The DnsController: rebuilds the [`DnsSnapshot`] when container observations or Machine
//! records change, off the query path, and publishes it with one atomic swap.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use ployz_core::MachineId;
use ployz_store::machines::{stored_machines, MACHINES_NAMESPACE};
use ployz_store::observations::{stored_observations, CONTAINERS_NAMESPACE};
use ployz_store::{KeyPrefix, Store};
use tokio::sync::watch;

use crate::snapshot::DnsSnapshot;

/// Owns the published [`DnsSnapshot`] the DNS server answers from.
#[derive(Clone, Default)]
pub struct DnsController {
    snapshot: Arc<ArcSwap<DnsSnapshot>>,
}

impl std::fmt::Debug for DnsController {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.snapshot.load();
        f.debug_struct("DnsController")
            .field("generation", &s.generation())
            .field("names", &s.len())
            .finish()
    }
}

impl DnsController {
    /// A controller publishing the empty snapshot (every `.internal` name is unknown until the
    /// first build).
    pub fn new() -> DnsController {
        DnsController::default()
    }

    /// A controller publishing a fixed snapshot (a zone file, for benchmarks).
    pub fn fixed(snapshot: DnsSnapshot) -> DnsController {
        DnsController {
            snapshot: Arc::new(ArcSwap::from_pointee(snapshot)),
        }
    }

    /// The published snapshot, for the server's hot path (one atomic load per query) and for
    /// [`crate::lookup`].
    pub fn snapshot(&self) -> &Arc<ArcSwap<DnsSnapshot>> {
        &self.snapshot
    }

    /// Rebuilds from the store as `local` observes it and publishes if any answer changed.
    /// Returns the new generation when it published.
    pub fn rebuild(&self, store: &Store, local: &MachineId) -> Option<u64> {
        let built = DnsSnapshot::build(&stored_observations(store), &stored_machines(store), local);
        let current = self.snapshot.load();
        if built.same_answers(&current) {
            return None;
        }
        let generation = current.generation() + 1;
        self.snapshot
            .store(Arc::new(built.with_generation(generation)));
        Some(generation)
    }

    /// Keeps the snapshot current until `shutdown` turns true (or its sender is dropped): a
    /// rebuild at start and after every change to container observations or Machine records.
    pub async fn run(
        &self,
        store: Arc<Store>,
        local_machine_id: MachineId,
        mut shutdown: watch::Receiver<bool>,
    ) {
        let mut containers = store.watch(KeyPrefix::machine_namespace(CONTAINERS_NAMESPACE));
        let mut machines = store.watch(KeyPrefix::machine_namespace(MACHINES_NAMESPACE));
        loop {
            let (s, this, local) = (store.clone(), self.clone(), local_machine_id.clone());
            let published = tokio::task::spawn_blocking(move || this.rebuild(&s, &local))
                .await
                .unwrap_or_default();
            if let Some(generation) = published {
                let names = self.snapshot.load().len();
                tracing::info!(generation, names, "internal DNS snapshot published");
            }
            tokio::select! {
                changed = shutdown.changed() => {
                    if changed.is_err() || *shutdown.borrow() {
                        return;
                    }
                }
                event = containers.next() => if event.is_none() { return },
                event = machines.next() => if event.is_none() { return },
            }
            // Coalesce a burst of changes into one rebuild.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
}
