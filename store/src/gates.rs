//! Where the store keeps Service Gates ([`ServiceGate`]): cluster-scoped records named by
//! Service ID, written by the Machine a person asked (last writer wins), read by every edge.

use ployz_core::{ServiceGate, ServiceId};

use crate::{Key, KeyPrefix, Store, StoreError};

/// Store namespace of Service Gates: cluster-scoped, named by Service ID.
pub const GATES_NAMESPACE: &str = "gates";

fn gate_key(service: &ServiceId) -> Key {
    Key::cluster(GATES_NAMESPACE, service.as_str())
}

/// Sets (or replaces) a Service's gate; flushed when this returns.
pub fn put_gate(store: &Store, gate: &ServiceGate) -> Result<(), StoreError> {
    store.put(
        &gate_key(&gate.service_id),
        serde_json::to_vec(gate).expect("a gate serialises"),
    )?;
    Ok(())
}

/// Lifts a Service's gate; whether there was one.
pub fn delete_gate(store: &Store, service: &ServiceId) -> Result<bool, StoreError> {
    let key = gate_key(service);
    if store
        .get(&key)?
        .as_ref()
        .and_then(|r| r.live_value())
        .is_none()
    {
        return Ok(false);
    }
    store.delete(&key)?;
    Ok(true)
}

/// Every gate in the store; one that does not decode is left out (it gates nothing). A store
/// that cannot be read is an error, never "no gates".
pub fn stored_gates(store: &Store) -> Result<Vec<ServiceGate>, StoreError> {
    Ok(store
        .scan_live(&KeyPrefix::cluster_namespace(GATES_NAMESPACE))?
        .iter()
        .filter_map(|r| r.live_value().and_then(|v| serde_json::from_slice(v).ok()))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_core::{GateState, MachineId};

    #[test]
    fn a_gate_is_set_replaced_read_and_lifted() {
        let store = Store::temporary(MachineId::generate()).unwrap();
        let id = ServiceId::generate();
        let gate = |state| ServiceGate {
            service_id: id.clone(),
            service_name: "web".parse().unwrap(),
            state,
            set_by: "me@here".into(),
            set_at_ms: 1,
        };
        put_gate(&store, &gate(GateState::Paused { until_ms: 9 })).unwrap();
        put_gate(
            &store,
            &gate(GateState::Maintenance {
                message: "soon".into(),
            }),
        )
        .unwrap();
        assert_eq!(
            stored_gates(&store).unwrap(),
            [gate(GateState::Maintenance {
                message: "soon".into()
            })]
        );
        assert!(delete_gate(&store, &id).unwrap());
        assert!(!delete_gate(&store, &id).unwrap());
        assert!(stored_gates(&store).unwrap().is_empty());
    }
}
