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
///
/// One resync of a Machine at a time, each from its look at Docker to its write: the
/// observer's pass and a removal's (`ployz rm`) may run at once, and the one that looked first
/// could otherwise write last, bringing a removed container back into the store until the
/// next pass.
pub async fn resync(docker: &MachineDocker, store: &Arc<Store>) -> Result<usize, String> {
    resync_from(docker.resyncs.clone(), docker.observe(), store).await
}

/// [`resync`] with the look at Docker given.
async fn resync_from(
    one_at_a_time: Arc<tokio::sync::Mutex<()>>,
    look: impl std::future::Future<
        Output = Result<Vec<ployz_core::ContainerRuntimeObservation>, crate::docker::DockerError>,
    >,
    store: &Arc<Store>,
) -> Result<usize, String> {
    let one = one_at_a_time.lock_owned().await;
    let observed = look.await.map_err(|e| e.to_string())?;
    let store = store.clone();
    // The write holds the lock to its end, even if the caller stops waiting for it.
    tokio::task::spawn_blocking(move || {
        let _one = one;
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

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_core::{
        ContainerKind, ContainerRuntimeObservation, ContainerState, MachineId, ServiceId,
    };

    fn observation(machine: &MachineId) -> ContainerRuntimeObservation {
        ContainerRuntimeObservation {
            id: format!("{:064x}", 7).parse().unwrap(),
            name: "patient-aes0".into(),
            machine_id: machine.clone(),
            service_id: ServiceId::generate(),
            service_name: "patient".parse().unwrap(),
            kind: ContainerKind::Service,
            state: ContainerState::Running,
            health: None,
            restart_count: 0,
            address: None,
            image: "app".into(),
            created_at: 0,
            spec: None,
            plan_id: None,
            lease_token: None,
        }
    }

    /// A resync that looked at Docker before a container was removed, and one that looked
    /// after: however their writes would interleave, the store ends with the later look (the
    /// container gone), not the earlier one.
    #[tokio::test]
    async fn a_resync_that_looked_earlier_never_writes_after_one_that_looked_later() {
        let dir = tempfile::tempdir().unwrap();
        let machine = MachineId::generate();
        let store = Arc::new(Store::open(dir.path().join("store"), machine.clone()).unwrap());
        let lock = Arc::new(tokio::sync::Mutex::new(()));
        let before = observation(&machine);
        resync_from(lock.clone(), async { Ok(vec![before.clone()]) }, &store)
            .await
            .unwrap();

        // The earlier look: taken, its write held back until told.
        let (looked_tx, looked) = tokio::sync::oneshot::channel();
        let (write_tx, write) = tokio::sync::oneshot::channel::<()>();
        let earlier = tokio::spawn({
            let (lock, store, before) = (lock.clone(), store.clone(), before.clone());
            async move {
                let look = async move {
                    looked_tx.send(()).unwrap();
                    write.await.unwrap();
                    Ok(vec![before])
                };
                resync_from(lock.clone(), look, &store).await
            }
        });
        looked.await.unwrap();
        // The later look: the container removed. Given a moment, it would finish first were
        // nothing keeping the order.
        let mut later = tokio::spawn({
            let (lock, store) = (lock.clone(), store.clone());
            async move { resync_from(lock.clone(), async { Ok(Vec::new()) }, &store).await }
        });
        let finished_first = tokio::time::timeout(Duration::from_millis(200), &mut later)
            .await
            .is_ok();
        write_tx.send(()).unwrap();
        earlier.await.unwrap().unwrap();
        if !finished_first {
            later.await.unwrap().unwrap();
        }
        let mine = KeyPrefix::machine_namespace_of(CONTAINERS_NAMESPACE, &machine);
        let held: Vec<String> = store
            .scan_live(&mine)
            .unwrap()
            .into_iter()
            .map(|r| r.key.name().to_owned())
            .collect();
        assert!(
            held.is_empty(),
            "the earlier look was written last: {held:?} (the later finished first: {finished_first})"
        );
    }
}
