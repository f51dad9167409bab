//! Where the store keeps Container Runtime Observations, so the module that writes them (the
//! orchestrator's observer) and the ones that read them (edge, DNS) meet here and nowhere else.

use ployz_core::ContainerRuntimeObservation;

use crate::{Key, KeyPrefix, Store};

/// Store namespace of Container Runtime Observations (machine-owned, named by Container ID).
pub const CONTAINERS_NAMESPACE: &str = "containers";

/// The record key of one container's observation.
pub fn container_key(o: &ContainerRuntimeObservation) -> Key {
    Key::machine(&o.machine_id, CONTAINERS_NAMESPACE, o.id.as_str())
}

/// Every Container Runtime Observation in the store (all Machines'), skipping records that do
/// not decode.
pub fn stored_observations(store: &Store) -> Vec<ContainerRuntimeObservation> {
    store
        .scan_live(&KeyPrefix::machine_namespace(CONTAINERS_NAMESPACE))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|r| serde_json::from_slice(&r.value).ok())
        .collect()
}
