//! Where the store keeps the users lists of routes' basic authentication: cluster-scoped
//! records named by the list's digest (`sha256:<hex>`), written by each daemon that creates a
//! container of a Service whose route names one, read by every edge.
//!
//! A list is kept after its containers are gone: a rollback deploys a spec that carries the
//! digest alone, and finds the list here.

use ployz_core::SecretValue;

use crate::{Key, KeyPrefix, Store, StoreError};

/// Store namespace of users lists: cluster-scoped, named by digest.
pub const ROUTE_USERS_NAMESPACE: &str = "route-users";

fn users_key(digest: &str) -> Key {
    Key::cluster(ROUTE_USERS_NAMESPACE, digest)
}

/// Keeps a users list under its digest, unless the store has it already; flushed when this
/// returns.
pub fn put_users(store: &Store, users: &SecretValue) -> Result<(), StoreError> {
    let key = users_key(&users.digest());
    if store
        .get(&key)?
        .as_ref()
        .and_then(|r| r.live_value())
        .is_some()
    {
        return Ok(());
    }
    store.put(&key, users.as_bytes().to_vec())?;
    Ok(())
}

/// Whether the store has the users list of `digest`.
pub fn has_users(store: &Store, digest: &str) -> Result<bool, StoreError> {
    Ok(store
        .get(&users_key(digest))?
        .as_ref()
        .and_then(|r| r.live_value())
        .is_some())
}

/// Every users list in the store, as (digest, content). A record whose content does not have
/// the digest it is named by is left out (it authenticates no one).
pub fn stored_users(store: &Store) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
    Ok(store
        .scan_live(&KeyPrefix::cluster_namespace(ROUTE_USERS_NAMESPACE))?
        .iter()
        .filter_map(|r| {
            let value = r.live_value()?;
            let digest = SecretValue::new(value.to_vec()).digest();
            (r.key.name() == digest).then(|| (digest, value.to_vec()))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_core::MachineId;

    #[test]
    fn a_list_is_kept_once_under_its_digest_and_read_back() {
        let store = Store::temporary(MachineId::generate()).unwrap();
        let users = SecretValue::new(b"alice:$2y$...\n".to_vec());
        assert!(!has_users(&store, &users.digest()).unwrap());
        put_users(&store, &users).unwrap();
        put_users(&store, &users).unwrap();
        assert!(has_users(&store, &users.digest()).unwrap());
        assert_eq!(
            stored_users(&store).unwrap(),
            [(users.digest(), users.as_bytes().to_vec())]
        );
    }

    #[test]
    fn a_list_not_matching_its_name_is_left_out() {
        let store = Store::temporary(MachineId::generate()).unwrap();
        store
            .put(&users_key("sha256:00"), b"mallory:x".to_vec())
            .unwrap();
        assert!(stored_users(&store).unwrap().is_empty());
    }
}
