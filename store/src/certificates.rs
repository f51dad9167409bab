//! Where the store keeps the records of certificate issuance, so the modules that write them
//! and the ones that read them meet here and nowhere else:
//!
//! | record | key | value |
//! |---|---|---|
//! | Certificate Material | [`certificate_key`]: `c/certificates/HOSTNAME` | [`CertificateMaterial`] |
//! | HTTP-01 challenge | [`challenge_key`]: `c/acme-challenges/TOKEN` | [`ChallengeRecord`] |
//! | Certificate Policy | [`policy_key`]: `c/certificate-policy/policy` | [`CertificatePolicy`] |
//! | ACME account | [`account_key`]: `c/acme-accounts/SHA256(DIRECTORY URL)` | [`StoredAccount`] |
//! | certificate status | [`status_key`]: `m/certificate-status/ISSUER/HOSTNAME` | [`CertificateStatus`] |
//!
//! The certificate issuer writes material, challenges, accounts and statuses; `ployz cert
//! import` writes material and `ployz cert policy` the policy; the edge serves material and
//! challenge responses; `ployz cert ls` reads the statuses.

use std::collections::BTreeMap;

use ployz_core::{
    CertificateMaterial, CertificatePolicy, CertificateStatus, MachineId, PolicyError,
};
use serde::{Deserialize, Serialize};

use crate::{Key, KeyPrefix, Store, StoreError};

/// Store namespace of Certificate Material (cluster-scoped, named by hostname).
pub const CERTIFICATES_NAMESPACE: &str = "certificates";

/// The record key of a hostname's Certificate Material.
pub fn certificate_key(hostname: &str) -> Key {
    Key::cluster(CERTIFICATES_NAMESPACE, hostname)
}

/// Store namespace of HTTP-01 challenge records (cluster-scoped, named by token).
pub const CHALLENGES_NAMESPACE: &str = "acme-challenges";

/// The record key of an HTTP-01 challenge.
pub fn challenge_key(token: &str) -> Key {
    Key::cluster(CHALLENGES_NAMESPACE, token)
}

/// The path prefix of HTTP-01 challenge requests.
pub const CHALLENGE_PATH_PREFIX: &str = "/.well-known/acme-challenge/";

/// The longest token accepted. RFC 8555 tokens carry at least 128 bits of entropy in base64url
/// (22+ characters); authorities use 43. Anything far longer is not a token.
pub const MAX_TOKEN_LEN: usize = 256;

/// One pending HTTP-01 challenge, as stored under [`challenge_key`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChallengeRecord {
    /// The challenge token (base64url).
    pub token: String,
    /// The response body: `token.thumbprint`. Public by design (the authority fetches it over
    /// plain HTTP); it reveals nothing of the account key.
    pub key_authorization: String,
    /// The Ingress Hostname being validated.
    pub hostname: String,
    /// After this (Unix seconds) the record is stale: it is not served and any issuer removes it.
    pub expires_at: i64,
}

/// Whether `token` can be an ACME token: 1 to [`MAX_TOKEN_LEN`] characters of the base64url
/// alphabet `[A-Za-z0-9_-]`. Checked before the token goes anywhere near a store key.
pub fn is_valid_token(token: &str) -> bool {
    !token.is_empty()
        && token.len() <= MAX_TOKEN_LEN
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The token of a request path, if the path is an HTTP-01 challenge path with a valid token.
pub fn token_from_path(path: &str) -> Option<&str> {
    let token = path.strip_prefix(CHALLENGE_PATH_PREFIX)?;
    is_valid_token(token).then_some(token)
}

/// Every challenge record in the store, skipping records that do not decode or whose name is
/// not their token.
pub fn stored_challenges(store: &Store) -> Vec<ChallengeRecord> {
    store
        .scan_live(&KeyPrefix::cluster_namespace(CHALLENGES_NAMESPACE))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|r| {
            let c: ChallengeRecord = serde_json::from_slice(&r.value).ok()?;
            (r.key.name() == c.token && is_valid_token(&c.token)).then_some(c)
        })
        .collect()
}

/// Every Certificate Material in the store, by hostname, skipping records that do not decode.
/// A store that cannot be read yields no material.
pub fn stored_materials(store: &Store) -> BTreeMap<String, CertificateMaterial> {
    store
        .scan_live(&KeyPrefix::cluster_namespace(CERTIFICATES_NAMESPACE))
        .unwrap_or_default()
        .into_iter()
        .filter_map(|r| serde_json::from_slice::<CertificateMaterial>(&r.value).ok())
        .map(|m| (m.hostname.clone(), m))
        .collect()
}

/// One hostname's Certificate Material, if stored and decodable (and the store can be read).
pub fn stored_material(store: &Store, hostname: &str) -> Option<CertificateMaterial> {
    store
        .get(&certificate_key(hostname))
        .ok()
        .flatten()
        .and_then(|r| r.live_value().map(<[u8]>::to_vec))
        .and_then(|v| serde_json::from_slice(&v).ok())
}

/// Store namespace of the Certificate Policy (cluster-scoped, one record named [`POLICY_NAME`]).
pub const POLICY_NAMESPACE: &str = "certificate-policy";
/// The name of the one Certificate Policy record.
pub const POLICY_NAME: &str = "policy";

/// The key of the Certificate Policy.
pub fn policy_key() -> Key {
    Key::cluster(POLICY_NAMESPACE, POLICY_NAME)
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
    Invalid(#[from] PolicyError),
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
    Invalid(#[from] PolicyError),
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

/// Store namespace of ACME account credentials (cluster-scoped, named by the hex SHA-256 of the
/// directory URL).
pub const ACCOUNTS_NAMESPACE: &str = "acme-accounts";

/// The key of the ACME account used with a directory.
pub fn account_key(directory_url: &str) -> Key {
    let digest = ring::digest::digest(&ring::digest::SHA256, directory_url.as_bytes());
    Key::cluster(ACCOUNTS_NAMESPACE, hex::encode(digest.as_ref()))
}

/// ACME account credentials as stored: the ACME client's serialisable credentials (which hold
/// the account's private key) with what they were created for. [`std::fmt::Debug`] withholds
/// the credentials.
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

/// Store namespace of certificate status records (machine-owned by the issuer, named by
/// hostname).
pub const STATUS_NAMESPACE: &str = "certificate-status";

/// The key of a hostname's certificate status, written by its issuer `machine`.
pub fn status_key(machine: &MachineId, hostname: &str) -> Key {
    Key::machine(machine, STATUS_NAMESPACE, hostname)
}

/// Every certificate status record of every Machine (what `ployz cert ls` shows), newest first
/// per hostname: when the issuer of a hostname changed, the previous issuer's record may linger
/// until it is cleaned, and the newer one wins. Records that do not decode are skipped; a store
/// that cannot be read yields no status.
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

/// The status records one Machine wrote, by hostname. Records that do not decode are skipped;
/// a store that cannot be read yields none.
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
        // The hex SHA-256 of the URL: a renamed digest would orphan every stored account.
        assert_eq!(
            a.name(),
            "6d8ba56d5d58fae070e8efd69cb4b20cfd70cb1ff83b84e0e022926d96e44afc"
        );
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

    #[test]
    fn token_charset_is_base64url_only() {
        for ok in [
            "abc",
            "A-b_9",
            "LoqXcYV8q5ONbJQxbmR7SCTNo3tiAXDfowyjxAjEuX0",
        ] {
            assert!(is_valid_token(ok), "{ok}");
        }
        for bad in [
            "",
            "a/b",
            "..",
            "a.b",
            "a b",
            "a%2Fb",
            "tok\n",
            "ü",
            "a+b",
            "a=",
            &"x".repeat(MAX_TOKEN_LEN + 1),
        ] {
            assert!(!is_valid_token(bad), "{bad:?}");
        }
    }

    #[test]
    fn paths_yield_tokens() {
        assert_eq!(
            token_from_path("/.well-known/acme-challenge/abc_-1"),
            Some("abc_-1")
        );
        assert_eq!(token_from_path("/.well-known/acme-challenge/"), None);
        assert_eq!(token_from_path("/.well-known/acme-challenge/a/b"), None);
        assert_eq!(token_from_path("/other/abc"), None);
    }
}
