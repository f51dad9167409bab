//! Where the store keeps each Machine's self-description ([`MachineInfo`]), so the daemon that
//! writes it and the modules that read it (DNS, certificates) meet here and nowhere else.

use ployz_core::api::MachineInfo;
use ployz_core::MachineId;

use crate::{Key, KeyPrefix, Store, StoreError};

/// Store namespace of the records each Machine publishes about itself.
pub const MACHINES_NAMESPACE: &str = "machines";
/// Name of a Machine's self-description within [`MACHINES_NAMESPACE`].
pub const INFO: &str = "info";

/// The record key of a Machine's self-description.
pub fn machine_key(id: &MachineId) -> Key {
    Key::machine(id, MACHINES_NAMESPACE, INFO)
}

/// Every Machine's self-description in the store, skipping records that do not decode. A store
/// that cannot be read is an error, never "no Machines".
pub fn stored_machines(store: &Store) -> Result<Vec<MachineInfo>, StoreError> {
    Ok(store
        .scan_live(&KeyPrefix::machine_namespace(MACHINES_NAMESPACE))?
        .into_iter()
        .filter(|r| r.key.name() == INFO)
        .filter_map(|r| serde_json::from_slice(&r.value).ok())
        .collect())
}

/// Name of a Machine's public addresses within [`MACHINES_NAMESPACE`].
pub const PUBLIC_ADDRESSES: &str = "public-addresses";

/// The record key of a Machine's public addresses ([`ployz_core::api::PublicAddresses`]).
pub fn public_addresses_key(id: &MachineId) -> Key {
    Key::machine(id, MACHINES_NAMESPACE, PUBLIC_ADDRESSES)
}

/// The public addresses of every Machine in the store, together.
pub fn stored_public_addresses(store: &Store) -> std::collections::BTreeSet<std::net::IpAddr> {
    store
        .scan_live(&KeyPrefix::machine_namespace(MACHINES_NAMESPACE))
        .unwrap_or_default()
        .into_iter()
        .filter(|r| r.key.name() == PUBLIC_ADDRESSES)
        .filter_map(|r| serde_json::from_slice::<ployz_core::api::PublicAddresses>(&r.value).ok())
        .flat_map(|p| p.addresses)
        .collect()
}

/// Name of a Machine's certificate-issuer presence within [`MACHINES_NAMESPACE`]: present while
/// the Machine's daemon runs the certificate issuer, deleted when it runs without it.
pub const CERTIFICATE_ISSUER: &str = "certificate-issuer";

/// The record key of a Machine's certificate-issuer presence.
pub fn certificate_issuer_key(id: &MachineId) -> Key {
    Key::machine(id, MACHINES_NAMESPACE, CERTIFICATE_ISSUER)
}

/// The Machines whose daemons run the certificate issuer. A store that cannot be read is an
/// error, never "no issuers".
pub fn certificate_issuers(
    store: &Store,
) -> Result<std::collections::BTreeSet<MachineId>, StoreError> {
    Ok(store
        .scan_live(&KeyPrefix::machine_namespace(MACHINES_NAMESPACE))?
        .into_iter()
        .filter(|r| r.key.name() == CERTIFICATE_ISSUER)
        .filter_map(|r| match r.key.owner() {
            crate::Owner::Machine(id) => Some(id.clone()),
            crate::Owner::Cluster => None,
        })
        .collect())
}
