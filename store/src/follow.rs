//! Keeping a view of the store published: the loop every module shares that answers from
//! something built off the store (the edge's route table and certificate table, the internal
//! DNS snapshot).
//!
//! The view is rebuilt at start, after every change under the prefixes it is built from (a
//! burst of changes coalesced into one rebuild), when the view's own nudge fires, and, while the store cannot be read, again
//! every [`RETRY_AFTER_FAILURE`]. A rebuild that fails leaves what was published: a store
//! that cannot be read is never taken for an empty one. The failure streak is logged once
//! when it starts and once when it ends; counting failures is the view's business (its
//! `rebuild` is called for every try).

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::{KeyPrefix, Store, StoreError};

/// How long after a failed rebuild the next one is tried, when no change comes first.
pub const RETRY_AFTER_FAILURE: Duration = Duration::from_secs(1);

/// How long a burst of changes may take to settle into one rebuild.
const COALESCE: Duration = Duration::from_millis(2);

/// A view built off the store and published for readers that must not wait for the store.
pub trait View: Send + 'static {
    /// What is published, for log lines: `route table`, `internal DNS snapshot`.
    fn what(&self) -> &'static str;

    /// Rebuilds from the store and publishes when anything changed; runs on a blocking thread.
    /// `Ok(Some(generation))` when it published. On an error nothing is published.
    fn rebuild(&mut self, store: &Store) -> Result<Option<u64>, StoreError>;

    /// What is published now, in a few words for log lines (`7 hostnames`).
    fn size(&self) -> String;

    /// A signal to rebuild on besides the store's changes (what the view is built from that
    /// the store does not hold: which Machines are observed down); `None`: the store alone.
    fn nudge(&self) -> Option<Arc<tokio::sync::Notify>> {
        None
    }
}

/// Keeps `view` current until `shutdown` turns true (or its sender is dropped) or the store
/// is gone. See the module's documentation.
pub async fn follow<V: View>(
    store: Arc<Store>,
    prefixes: Vec<KeyPrefix>,
    view: V,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut changes = store.watch_any(prefixes);
    let nudge = view.nudge();
    let mut view = Some(view);
    let mut failing = false;
    loop {
        let Some(mut v) = view.take() else { return };
        let s = store.clone();
        let rebuilt = tokio::task::spawn_blocking(move || {
            let outcome = v.rebuild(&s);
            (v, outcome)
        })
        .await;
        let (v, outcome) = match rebuilt {
            Ok(done) => done,
            Err(e) => {
                // The view went with the task that panicked: nothing is left to publish.
                tracing::error!(error = %e, "a rebuild from the store failed; its view stays as it was published");
                return;
            }
        };
        match outcome {
            Ok(published) => {
                if failing {
                    tracing::info!(view = v.what(), "rebuilt again: the store reads again");
                    failing = false;
                }
                if let Some(generation) = published {
                    tracing::info!(view = v.what(), generation, size = %v.size(), "published");
                }
            }
            Err(reason) => {
                if !failing {
                    tracing::warn!(
                        view = v.what(),
                        error = %reason,
                        size = %v.size(),
                        "not rebuilt: the store cannot be read; what was published stays until \
                         a rebuild succeeds"
                    );
                    failing = true;
                }
            }
        }
        view = Some(v);
        let retry = async {
            if failing {
                tokio::time::sleep(RETRY_AFTER_FAILURE).await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    return;
                }
            }
            event = changes.next() => if event.is_none() { return },
            _ = retry => {}
            _ = async {
                match &nudge {
                    Some(n) => n.notified().await,
                    None => std::future::pending().await,
                }
            } => {}
        }
        tokio::time::sleep(COALESCE).await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use ployz_core::MachineId;

    use super::*;
    use crate::Key;

    /// Publishes how many records the store holds under `things`.
    struct Counting {
        published: Arc<AtomicU64>,
        rebuilds: Arc<AtomicU64>,
        generation: u64,
    }

    impl View for Counting {
        fn what(&self) -> &'static str {
            "thing count"
        }
        fn rebuild(&mut self, store: &Store) -> Result<Option<u64>, StoreError> {
            self.rebuilds.fetch_add(1, Ordering::SeqCst);
            let n = store
                .scan_live(&KeyPrefix::machine_namespace("things"))?
                .len() as u64;
            if n == self.published.load(Ordering::SeqCst) && self.generation > 0 {
                return Ok(None);
            }
            self.published.store(n, Ordering::SeqCst);
            self.generation += 1;
            Ok(Some(self.generation))
        }
        fn size(&self) -> String {
            format!("{} things", self.published.load(Ordering::SeqCst))
        }
    }

    async fn until(what: &str, mut done: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while !done() {
            assert!(tokio::time::Instant::now() < deadline, "never: {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    fn put(store: &Store, name: &str) {
        let key = Key::machine(store.local(), "things", name);
        store.put(&key, b"{}".to_vec()).unwrap();
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_view_follows_changes_keeps_what_it_published_while_reads_fail_and_stops() {
        let store = Arc::new(Store::temporary(MachineId::generate()).unwrap());
        put(&store, "a");
        let published = Arc::new(AtomicU64::new(0));
        let rebuilds = Arc::new(AtomicU64::new(0));
        let view = Counting {
            published: published.clone(),
            rebuilds: rebuilds.clone(),
            generation: 0,
        };
        let (stop, shutdown) = watch::channel(false);
        let following = tokio::spawn(follow(
            store.clone(),
            vec![KeyPrefix::machine_namespace("things")],
            view,
            shutdown,
        ));
        until("the first build", || published.load(Ordering::SeqCst) == 1).await;

        put(&store, "b");
        until("the change is followed", || {
            published.load(Ordering::SeqCst) == 2
        })
        .await;

        // Reads fail: the rebuild the change asks for cannot read, what was published stays,
        // and the rebuild is tried again with no further change.
        let tries = rebuilds.load(Ordering::SeqCst);
        store.fail_reads(Some("injected read failure"));
        put(&store, "c");
        until("the change's rebuild and a retry", || {
            rebuilds.load(Ordering::SeqCst) >= tries + 2
        })
        .await;
        assert_eq!(published.load(Ordering::SeqCst), 2);
        store.fail_reads(None);
        until("the retry catches up", || {
            published.load(Ordering::SeqCst) == 3
        })
        .await;

        stop.send_replace(true);
        tokio::time::timeout(Duration::from_secs(20), following)
            .await
            .expect("follow returns at shutdown")
            .unwrap();
    }
}
