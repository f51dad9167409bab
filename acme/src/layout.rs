//! Where certificate records live in the store, and typed reads and writes of them.
//!
//! The daemon, the edge and the CLI meet here: the edge serves Certificate Material from
//! [`CERTIFICATES_NAMESPACE`] and challenge responses from [`CHALLENGES_NAMESPACE`]; `ployz cert`
//! reads [`STATUS_NAMESPACE`] and writes the Certificate Policy at [`policy_key`].

use std::collections::BTreeMap;

use ployz_core::{CertificateMaterial, CertificatePolicy, CertificateStatus, MachineId};
use ployz_store::{Key, KeyPrefix, Store, StoreError};
use serde::{Deserialize, Serialize};

pub use ployz_store::certificates::{
    certificate_key, challenge_key, CERTIFICATES_NAMESPACE, CHALLENGES_NAMESPACE,
};
/// Store namespace of the Certificate Policy (cluster-scoped, one record named [`POLICY_NAME`]).
pub const POLICY_NAMESPACE: &str = "certificate-policy";
/// The name of the one Certificate Policy record.
pub const POLICY_NAME: &str = "policy";
/// Store namespace of ACME account credentials (cluster-scoped, named by the hex SHA-256 of the
/// directory URL).
pub const ACCOUNTS_NAMESPACE: &str = "acme-accounts";
/// Store namespace of certificate status records (machine-owned by the issuer, named by
/// hostname).
pub const STATUS_NAMESPACE: &str = "certificate-status";

/// The key of the Certificate Policy.
pub fn policy_key() -> Key {
    Key::cluster(POLICY_NAMESPACE, POLICY_NAME)
}

/// The key of the ACME account used with a directory.
pub fn account_key(directory_url: &str) -> Key {
    let digest = ring::digest::digest(&ring::digest::SHA256, directory_url.as_bytes());
    Key::cluster(ACCOUNTS_NAMESPACE, hex::encode(digest.as_ref()))
}

/// The key of a hostname's certificate status, written by its issuer `machine`.
pub fn status_key(machine: &MachineId, hostname: &str) -> Key {
    Key::machine(machine, STATUS_NAMESPACE, hostname)
}

/// ACME account credentials as stored: instant-acme's serialisable credentials (which hold the
/// account's private key) with what they were created for. [`std::fmt::Debug`] withholds the
/// credentials.
#[derive(Clone, Serialize, Deserialize)]
pub struct StoredAccount {
    /// The directory the account lives at.
    pub directory_url: String,
    /// The external account binding key identifier it was created with, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eab_key_id: Option<String>,
    /// `instant_acme::AccountCredentials` as JSON (holds the account key).
    pub credentials: serde_json::Value,
}

impl std::fmt::Debug for StoredAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredAccount")
            .field("directory_url", &self.directory_url)
            .field("eab_key_id", &self.eab_key_id)
            .field("credentials", &"<withheld>")
            .finish()
    }
}

/// Why the stored Certificate Policy cannot be used. The issuer orders nothing while it holds;
/// it never falls back to the defaults.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PolicyRefusal {
    /// The record does not decode.
    #[error(
        "the stored Certificate Policy does not decode ({0}); write the Certificate Policy again"
    )]
    Undecodable(String),
    /// The record decodes but is refused.
    #[error("the Certificate Policy is refused: {0}")]
    Invalid(#[from] ployz_core::PolicyError),
    /// The store failed.
    #[error("the Certificate Policy could not be read: {0}")]
    Store(String),
}

/// The Certificate Policy in force: the stored one, validated, or the built-in defaults when
/// none is stored.
pub fn stored_policy(store: &Store) -> Result<CertificatePolicy, PolicyRefusal> {
    let record = store
        .get(&policy_key())
        .map_err(|e| PolicyRefusal::Store(e.to_string()))?;
    let Some(value) = record.as_ref().and_then(|r| r.live_value()) else {
        return Ok(CertificatePolicy::default());
    };
    let policy: CertificatePolicy =
        serde_json::from_slice(value).map_err(|e| PolicyRefusal::Undecodable(e.to_string()))?;
    policy.validate()?;
    Ok(policy)
}

/// Why a Certificate Policy was not written.
#[derive(Debug, thiserror::Error)]
pub enum WritePolicyError {
    /// The policy is refused; nothing was written.
    #[error(transparent)]
    Invalid(#[from] ployz_core::PolicyError),
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Validates and writes the Certificate Policy (what `ployz cert policy` does). A refused policy
/// is not written.
pub fn write_policy(store: &Store, policy: &CertificatePolicy) -> Result<(), WritePolicyError> {
    policy.validate()?;
    store.put(
        &policy_key(),
        serde_json::to_vec(policy).expect("a policy serialises"),
    )?;
    Ok(())
}

/// Removes the stored Certificate Policy: the built-in defaults apply again.
pub fn clear_policy(store: &Store) -> Result<(), StoreError> {
    store.delete(&policy_key()).map(|_| ())
}

/// Every Certificate Material in the store, by hostname, skipping records that do not decode.
pub fn stored_materials(store: &Store) -> BTreeMap<String, CertificateMaterial> {
    store
        .scan_live(&KeyPrefix::cluster_namespace(CERTIFICATES_NAMESPACE))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|r| serde_json::from_slice::<CertificateMaterial>(&r.value).ok())
        .map(|m| (m.hostname.clone(), m))
        .collect()
}

/// One hostname's Certificate Material, if stored and decodable.
pub fn stored_material(store: &Store, hostname: &str) -> Option<CertificateMaterial> {
    store
        .get(&certificate_key(hostname))
        .ok()
        .flatten()
        .and_then(|r| r.live_value().map(<[u8]>::to_vec))
        .and_then(|v| serde_json::from_slice(&v).ok())
}

/// Every certificate status record of every Machine (what `ployz cert ls` shows), newest first
/// per hostname: when the issuer of a hostname changed, the previous issuer's record may linger
/// until it is cleaned, and the newer one wins.
pub fn stored_statuses(store: &Store) -> Vec<CertificateStatus> {
    let mut by_host: BTreeMap<String, CertificateStatus> = BTreeMap::new();
    for s in store
        .scan_live(&KeyPrefix::machine_namespace(STATUS_NAMESPACE))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|r| serde_json::from_slice::<CertificateStatus>(&r.value).ok())
    {
        match by_host.get(&s.hostname) {
            Some(held) if held.updated_at >= s.updated_at => {}
            _ => {
                by_host.insert(s.hostname.clone(), s);
            }
        }
    }
    by_host.into_values().collect()
}

/// The status records one Machine wrote, by hostname.
pub fn statuses_of(store: &Store, machine: &MachineId) -> BTreeMap<String, CertificateStatus> {
    store
        .scan_live(&KeyPrefix::machine_namespace_of(STATUS_NAMESPACE, machine))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|r| serde_json::from_slice::<CertificateStatus>(&r.value).ok())
        .map(|s| (s.hostname.clone(), s))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_where_the_edge_and_cli_look() {
        assert_eq!(
            certificate_key("app.test").to_string(),
            "c/certificates/app.test"
        );
        assert_eq!(policy_key().to_string(), "c/certificate-policy/policy");
        assert_eq!(
            challenge_key("tok_1-x").to_string(),
            "c/acme-challenges/tok_1-x"
        );
        let m = MachineId::generate();
        assert_eq!(
            status_key(&m, "app.test").to_string(),
            format!("m/certificate-status/{m}/app.test")
        );
        let a = account_key("https://127.0.0.1:14000/dir");
        assert_eq!(a.namespace(), ACCOUNTS_NAMESPACE);
        assert_eq!(a.name().len(), 64);
        assert_ne!(a, account_key("https://127.0.0.1:14001/dir"));
    }

    #[test]
    fn absent_policy_is_the_defaults_and_refused_policy_is_never_defaulted() {
        let store = Store::temporary(MachineId::generate()).unwrap();
        assert_eq!(stored_policy(&store).unwrap(), CertificatePolicy::default());
        let bad = CertificatePolicy {
            challenge: Some("dns-01".into()),
            ..Default::default()
        };
        // write_policy refuses it...
        assert!(matches!(
            write_policy(&store, &bad),
            Err(WritePolicyError::Invalid(_))
        ));
        assert_eq!(stored_policy(&store).unwrap(), CertificatePolicy::default());
        // ...and one that arrives anyway (replicated from an older writer) is refused on read.
        store
            .put(&policy_key(), serde_json::to_vec(&bad).unwrap())
            .unwrap();
        let e = stored_policy(&store).unwrap_err().to_string();
        assert!(e.contains("Ployz performs only http-01"), "{e}");
        store.put(&policy_key(), b"{not json".to_vec()).unwrap();
        assert!(matches!(
            stored_policy(&store),
            Err(PolicyRefusal::Undecodable(_))
        ));
        let good = CertificatePolicy {
            renewal_fraction: Some(0.5),
            ..Default::default()
        };
        write_policy(&store, &good).unwrap();
        assert_eq!(stored_policy(&store).unwrap(), good);
        clear_policy(&store).unwrap();
        assert_eq!(stored_policy(&store).unwrap(), CertificatePolicy::default());
    }

    #[test]
    fn stored_account_debug_withholds_credentials() {
        let a = StoredAccount {
            directory_url: "https://ca/dir".into(),
            eab_key_id: None,
            credentials: serde_json::json!({"key_pkcs8": "SECRETKEY"}),
        };
        assert!(!format!("{a:?}").contains("SECRETKEY"));
    }
}
