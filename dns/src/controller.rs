//! The DnsController: rebuilds the [`DnsSnapshot`] when container observations or Machine
//! records change, off the query path, and publishes it with one atomic swap.
//!
//! A store that cannot be read leaves the published snapshot as it is: the failure is counted
//! ([`DnsController::rebuild_failures`]), logged once per streak, and the rebuild tried again.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use arc_swap::ArcSwap;
use ployz_core::MachineId;
use ployz_store::follow::{follow, View};
use ployz_store::machines::{stored_machines, MACHINES_NAMESPACE};
use ployz_store::observations::{stored_observations, CONTAINERS_NAMESPACE};
use ployz_store::{KeyPrefix, Store, StoreError};
use tokio::sync::watch;

use crate::snapshot::DnsSnapshot;

/// Owns the published [`DnsSnapshot`] the DNS server answers from.
#[derive(Clone, Default)]
pub struct DnsController {
    snapshot: Arc<ArcSwap<DnsSnapshot>>,
    /// Rebuilds that failed because the store could not be read.
    rebuild_failures: Arc<AtomicU64>,
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
            rebuild_failures: Arc::default(),
        }
    }

    /// The published snapshot, for the server's hot path (one atomic load per query) and for
    /// [`crate::lookup`].
    pub fn snapshot(&self) -> &Arc<ArcSwap<DnsSnapshot>> {
        &self.snapshot
    }

    /// How many rebuilds failed because the store could not be read (each left the published
    /// snapshot as it was).
    pub fn rebuild_failures(&self) -> u64 {
        self.rebuild_failures.load(Ordering::Relaxed)
    }

    /// Rebuilds from the store as `local` observes it and publishes if any answer changed.
    /// Returns the new generation when it published. When the store cannot be read, the
    /// published snapshot stays as it is, the failure is counted
    /// ([`DnsController::rebuild_failures`]) and returned.
    pub fn rebuild(&self, store: &Store, local: &MachineId) -> Result<Option<u64>, StoreError> {
        let read = stored_observations(store)
            .and_then(|observations| Ok((observations, stored_machines(store)?)));
        let (observations, machines) = match read {
            Ok(read) => read,
            Err(e) => {
                self.rebuild_failures.fetch_add(1, Ordering::Relaxed);
                return Err(e);
            }
        };
        let built = DnsSnapshot::build(&observations, &machines, local);
        let current = self.snapshot.load();
        if built.same_answers(&current) {
            return Ok(None);
        }
        let generation = current.generation() + 1;
        self.snapshot
            .store(Arc::new(built.with_generation(generation)));
        Ok(Some(generation))
    }

    /// Keeps the snapshot current until `shutdown` turns true (or its sender is dropped): a
    /// rebuild at start and after every change to container observations or Machine records,
    /// and again shortly after a rebuild the store could not be read for (the snapshot
    /// published before stays meanwhile).
    pub async fn run(
        &self,
        store: Arc<Store>,
        local_machine_id: MachineId,
        shutdown: watch::Receiver<bool>,
    ) {
        let prefixes = vec![
            KeyPrefix::machine_namespace(CONTAINERS_NAMESPACE),
            KeyPrefix::machine_namespace(MACHINES_NAMESPACE),
        ];
        let view = PublishedSnapshot {
            controller: self.clone(),
            local: local_machine_id,
        };
        follow(store, prefixes, view, shutdown).await;
    }
}

/// The snapshot as a view of the store ([`follow`] keeps it current).
struct PublishedSnapshot {
    controller: DnsController,
    /// The Machine whose view the snapshot answers with.
    local: MachineId,
}

impl View for PublishedSnapshot {
    fn what(&self) -> &'static str {
        "internal DNS snapshot"
    }

    fn rebuild(&mut self, store: &Store) -> Result<Option<u64>, StoreError> {
        self.controller.rebuild(store, &self.local)
    }

    fn size(&self) -> String {
        let s = self.controller.snapshot.load();
        format!("generation {}, {} names", s.generation(), s.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::tests::{machine, serving};
    use ployz_core::ServiceId;
    use ployz_store::machines::machine_key;
    use ployz_store::observations::container_key;
    use std::time::Duration;

    fn store_with_one_container() -> (Store, MachineId) {
        let me = machine("alpha", "10.210.0.0/24");
        let store = Store::temporary(me.id.clone()).unwrap();
        store
            .put(&machine_key(&me.id), serde_json::to_vec(&me).unwrap())
            .unwrap();
        add_container(&store, "web", 2);
        (store, me.id)
    }

    fn add_container(store: &Store, service: &str, last: u8) {
        let o = serving(
            store.local(),
            service,
            &ServiceId::generate(),
            std::net::Ipv4Addr::new(10, 210, 0, last),
        );
        store
            .put(&container_key(&o), serde_json::to_vec(&o).unwrap())
            .unwrap();
    }

    fn answers(c: &DnsController, name: &str) -> bool {
        c.snapshot().load().get(name.as_bytes()).is_some()
    }

    #[test]
    fn a_store_that_cannot_be_read_leaves_the_published_snapshot() {
        let (store, me) = store_with_one_container();
        let c = DnsController::new();
        assert_eq!(c.rebuild(&store, &me).unwrap(), Some(1));
        assert!(answers(&c, "web.internal"));

        store.fail_reads(Some("injected read failure"));
        let e = c.rebuild(&store, &me).unwrap_err();
        assert!(e.to_string().contains("injected read failure"), "{e}");
        assert_eq!(c.rebuild_failures(), 1);
        assert_eq!(c.snapshot().load().generation(), 1);
        assert!(answers(&c, "web.internal"));

        store.fail_reads(None);
        assert_eq!(c.rebuild(&store, &me).unwrap(), None, "nothing changed");
        assert_eq!(c.rebuild_failures(), 1);
    }

    /// Waits (bounded) until `done` holds.
    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !done() {
            assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_running_controller_keeps_its_snapshot_through_a_read_failure_and_catches_up() {
        let (store, me) = store_with_one_container();
        let store = Arc::new(store);
        let c = DnsController::new();
        let (stop, shutdown) = watch::channel(false);
        let running = tokio::spawn({
            let (c, store) = (c.clone(), store.clone());
            async move { c.run(store, me, shutdown).await }
        });
        until("the first snapshot", || answers(&c, "web.internal")).await;

        store.fail_reads(Some("injected read failure"));
        add_container(&store, "api", 3);
        until("a failed rebuild", || c.rebuild_failures() > 0).await;
        assert!(answers(&c, "web.internal"), "the snapshot stays");
        assert!(!answers(&c, "api.internal"));

        // No further change comes: the controller tries again by itself.
        store.fail_reads(None);
        until("the snapshot catches up", || answers(&c, "api.internal")).await;
        assert!(answers(&c, "web.internal"));

        stop.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(30), running)
            .await
            .unwrap()
            .unwrap();
    }
}
