//! The Docker observer: keeps this Machine's Container Runtime Observations in the store.
//!
//! It resyncs on start, after Docker events (debounced), and every 30 s; a resync writes a
//! machine-owned record per managed container whose observation changed and deletes the record
//! of a container that vanished. Docker going away, or hanging (every call is bounded), is
//! waited out, never fatal: a failed resync starts over from the network check.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use ployz_store::observations::{container_key, CONTAINERS_NAMESPACE};
use ployz_store::{Key, KeyPrefix, Store};
use tokio::sync::watch;

use crate::docker::MachineDocker;

/// Debounce window for Docker events.
const DEBOUNCE: Duration = Duration::from_millis(100);
/// Full resync period.
const RESYNC: Duration = Duration::from_secs(30);

/// Writes what Docker shows now into the store. Returns how many records changed.
pub async fn resync(docker: &MachineDocker, store: &Arc<Store>) -> Result<usize, String> {
    let observed = docker.observe().await.map_err(|e| e.to_string())?;
    let store = store.clone();
    tokio::task::spawn_blocking(move || {
        let mine = KeyPrefix::machine_namespace_of(CONTAINERS_NAMESPACE, store.local());
        let held: BTreeMap<String, Vec<u8>> = store
            .scan_live(&mine)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|r| (r.key.name().to_owned(), r.value))
            .collect();
        let mut changed = 0;
        let mut seen = std::collections::BTreeSet::new();
        for o in &observed {
            seen.insert(o.id.as_str().to_owned());
            let value = serde_json::to_vec(o).expect("an observation serialises");
            if held.get(o.id.as_str()) != Some(&value) {
                store
                    .put(&container_key(o), value)
                    .map_err(|e| e.to_string())?;
                changed += 1;
            }
        }
        for gone in held.keys().filter(|k| !seen.contains(*k)) {
            store
                .delete(&Key::machine(
                    store.local(),
                    CONTAINERS_NAMESPACE,
                    gone.clone(),
                ))
                .map_err(|e| e.to_string())?;
            changed += 1;
        }
        Ok(changed)
    })
    .await
    .map_err(|e| e.to_string())?
}

/// Runs until `shutdown` turns true.
pub async fn run(docker: MachineDocker, store: Arc<Store>, mut shutdown: watch::Receiver<bool>) {
    let mut reported_down = false;
    loop {
        if *shutdown.borrow() {
            return;
        }
        if let Err(e) = docker.ensure_network().await {
            if !reported_down {
                tracing::warn!(error = %e, "Docker is not ready; retrying");
                reported_down = true;
            }
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
            }
        }
        if reported_down {
            tracing::info!("Docker is back");
            reported_down = false;
        }
        if let Err(e) = resync(&docker, &store).await {
            tracing::warn!(error = %e, "container resync failed");
        }
        let mut events = match docker.container_events().await {
            Ok(events) => Box::pin(events),
            Err(e) => {
                tracing::warn!(error = %e, "cannot watch Docker events; retrying");
                tokio::select! {
                    _ = shutdown.changed() => return,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                }
            }
        };
        let mut tick = tokio::time::interval(RESYNC);
        tick.tick().await;
        loop {
            tokio::select! {
                _ = shutdown.changed() => return,
                event = events.next() => match event {
                    Some(Ok(_)) => {
                        // Let a burst of events settle, then look once.
                        let settle = tokio::time::sleep(DEBOUNCE);
                        tokio::pin!(settle);
                        loop {
                            tokio::select! {
                                _ = &mut settle => break,
                                more = events.next() => if more.is_none() { break },
                            }
                        }
                        if let Err(e) = resync(&docker, &store).await {
                            tracing::warn!(error = %e, "container resync failed");
                            break;
                        }
                    }
                    // The event stream broke (Docker restarted?): start over.
                    Some(Err(_)) | None => break,
                },
                _ = tick.tick() => {
                    // A failed resync may mean a hung Docker whose event stream will never
                    // say so: start over, subscribing again once Docker answers.
                    if let Err(e) = resync(&docker, &store).await {
                        tracing::warn!(error = %e, "container resync failed");
                        break;
                    }
                }
            }
        }
    }
}
