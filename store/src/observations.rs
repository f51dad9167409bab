//! Where the store keeps Container Runtime Observations, so the module that writes them (the
//! orchestrator's observer) and the ones that read them (edge, DNS) meet here and nowhere else.

use ployz_core::ContainerRuntimeObservation;

use crate::{Key, KeyPrefix, Store, StoreError};

/// Store namespace of Container Runtime Observations (machine-owned, named by Container ID).
pub const CONTAINERS_NAMESPACE: &str = "containers";

/// The record key of one container's observation.
pub fn container_key(o: &ContainerRuntimeObservation) -> Key {
    Key::machine(&o.machine_id, CONTAINERS_NAMESPACE, o.id.as_str())
}

/// Every Container Runtime Observation in the store (all Machines'), skipping records that do
/// not decode. A store that cannot be read is an error, never "no containers": a reader that
/// took it for one would withdraw every route and name.
pub fn stored_observations(store: &Store) -> Result<Vec<ContainerRuntimeObservation>, StoreError> {
    Ok(store
        .scan_live(&KeyPrefix::machine_namespace(CONTAINERS_NAMESPACE))?
        .into_iter()
        .filter_map(|r| serde_json::from_slice(&r.value).ok())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_core::MachineId;

    #[test]
    fn a_store_that_cannot_be_read_is_an_error_not_an_empty_list() {
        let store = Store::temporary(MachineId::generate()).unwrap();
        store
            .put(
                &Key::machine(store.local(), CONTAINERS_NAMESPACE, "aa01"),
                b"{}".to_vec(),
            )
            .unwrap();
        store
            .put(
                &crate::drains::draining_key(store.local(), &"aa01".parse().unwrap()),
                Vec::new(),
            )
            .unwrap();
        assert!(
            stored_observations(&store).unwrap().is_empty(),
            "undecodable"
        );
        assert_eq!(crate::drains::draining_containers(&store).unwrap().len(), 1);

        store.fail_reads(Some("injected read failure"));
        let e = stored_observations(&store).unwrap_err();
        assert!(e.to_string().contains("injected read failure"), "{e}");
        assert!(e.is_io());
        assert!(crate::drains::draining_containers(&store).is_err());
        assert!(crate::machines::stored_machines(&store).is_err());
        assert!(crate::machines::certificate_issuers(&store).is_err());

        // One namespace unreadable, the rest readable.
        store.fail_reads_under(
            &KeyPrefix::machine_namespace(CONTAINERS_NAMESPACE),
            "injected read failure",
        );
        assert!(stored_observations(&store).is_err());
        assert!(store
            .get(&Key::machine(store.local(), CONTAINERS_NAMESPACE, "aa01"))
            .is_err());
        assert_eq!(crate::drains::draining_containers(&store).unwrap().len(), 1);
        assert!(crate::machines::stored_machines(&store).unwrap().is_empty());

        store.fail_reads(None);
        assert_eq!(crate::drains::draining_containers(&store).unwrap().len(), 1);
        assert!(stored_observations(&store).is_ok());
    }
}
