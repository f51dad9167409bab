//! Where the store keeps drain marks ([`DrainMark`]), so the daemon that sets and lifts them and
//! the edges that read them meet here and nowhere else.
//!
//! A mark is a machine-owned record named by Container ID, written by the Machine that runs the
//! container. Any live record counts as a mark for the edges, whether its value decodes or not:
//! a mark stands until it is lifted. One that does not decode (written before marks named their
//! setter and deadline) is read as set by no known command and already lapsed, so the daemon
//! lifts it.

use std::collections::HashSet;

use ployz_core::{ContainerId, DrainMark, MachineId};

use crate::{Key, KeyPrefix, Owner, Record, Store, StoreError};

/// Store namespace of drain marks: machine-owned, named by Container ID. A container with a mark
/// receives no new requests from any edge.
pub const DRAINING_NAMESPACE: &str = "draining";

/// The drain mark key of a container, written by the Machine that runs it.
pub fn draining_key(machine: &MachineId, container: &ContainerId) -> Key {
    Key::machine(machine, DRAINING_NAMESPACE, container.as_str())
}

/// Containers some Machine marked draining. A store that cannot be read is an error, never "no
/// marks": an edge that took it for one would route to containers being drained.
pub fn draining_containers(store: &Store) -> Result<HashSet<ContainerId>, StoreError> {
    Ok(store
        .scan_live(&KeyPrefix::machine_namespace(DRAINING_NAMESPACE))?
        .iter()
        .filter_map(|r| r.key.name().parse().ok())
        .collect())
}

/// Writes a mark (flushed when this returns).
pub fn put_mark(store: &Store, mark: &DrainMark) -> Result<Record, StoreError> {
    store.put(
        &draining_key(&mark.machine_id, &mark.container_id),
        serde_json::to_vec(mark).expect("a drain mark serialises"),
    )
}

/// The mark a live record holds; `None` for a tombstone or a key that names no container.
pub fn mark_of(record: &Record) -> Option<DrainMark> {
    let value = record.live_value()?;
    if let Ok(mark) = serde_json::from_slice::<DrainMark>(value) {
        return Some(mark);
    }
    let Owner::Machine(machine_id) = record.key.owner() else {
        return None;
    };
    Some(DrainMark {
        container_id: record.key.name().parse().ok()?,
        machine_id: machine_id.clone(),
        lease_token: None,
        set_by: "an unknown command (a mark without setter or deadline)".to_owned(),
        set_at_ms: 0,
        deadline_ms: 0,
    })
}

/// The mark standing on one container, if any.
pub fn stored_mark(
    store: &Store,
    machine: &MachineId,
    container: &ContainerId,
) -> Result<Option<DrainMark>, StoreError> {
    Ok(store
        .get(&draining_key(machine, container))?
        .as_ref()
        .and_then(mark_of))
}

/// Every mark in the store, of every Machine.
pub fn stored_marks(store: &Store) -> Result<Vec<DrainMark>, StoreError> {
    Ok(store
        .scan_live(&KeyPrefix::machine_namespace(DRAINING_NAMESPACE))?
        .iter()
        .filter_map(mark_of)
        .collect())
}

/// The marks one Machine wrote.
pub fn marks_of(store: &Store, machine: &MachineId) -> Result<Vec<DrainMark>, StoreError> {
    Ok(store
        .scan_live(&KeyPrefix::machine_namespace_of(
            DRAINING_NAMESPACE,
            machine,
        ))?
        .iter()
        .filter_map(mark_of)
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(store: &Store, container: &str, token: Option<u64>) -> DrainMark {
        DrainMark {
            container_id: container.parse().unwrap(),
            machine_id: store.local().clone(),
            lease_token: token,
            set_by: "alice@host (pid 1), running `deploy of web`".into(),
            set_at_ms: 1_000,
            deadline_ms: 61_000,
        }
    }

    #[test]
    fn marks_round_trip_and_every_live_record_counts_for_the_edges() {
        let store = Store::temporary(MachineId::generate()).unwrap();
        let a = mark(&store, "aa01", Some(7));
        put_mark(&store, &a).unwrap();
        // A record from before marks carried a value: still a mark, read as already lapsed.
        let legacy: ContainerId = "bb02".parse().unwrap();
        store
            .put(&draining_key(store.local(), &legacy), Vec::new())
            .unwrap();

        let mut all = stored_marks(&store).unwrap();
        all.sort_by(|x, y| x.container_id.as_str().cmp(y.container_id.as_str()));
        assert_eq!(all.len(), 2);
        assert_eq!(all[0], a);
        assert_eq!(all[1].container_id, legacy);
        assert_eq!(all[1].deadline_ms, 0);
        assert_eq!(all[1].lease_token, None);
        assert_eq!(marks_of(&store, store.local()).unwrap().len(), 2);
        assert!(marks_of(&store, &MachineId::generate()).unwrap().is_empty());
        assert_eq!(
            stored_mark(&store, store.local(), &a.container_id).unwrap(),
            Some(a.clone())
        );
        assert_eq!(draining_containers(&store).unwrap().len(), 2);

        store
            .delete(&draining_key(store.local(), &a.container_id))
            .unwrap();
        assert_eq!(
            stored_mark(&store, store.local(), &a.container_id).unwrap(),
            None
        );
        assert_eq!(
            draining_containers(&store).unwrap(),
            HashSet::from([legacy.clone()])
        );
    }
}
