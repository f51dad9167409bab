//! Certificate Material: the certificate chain and key held in cluster state for one Ingress
//! Hostname, served as given.

use serde::{Deserialize, Serialize};

/// The certificate chain (leaf first) and private key for one Ingress Hostname, both PEM. It is
/// a cluster-scoped record; every edge serves it for SNI `hostname`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertificateMaterial {
    /// The Ingress Hostname, lowercase.
    pub hostname: String,
    pub chain_pem: String,
    pub key_pem: String,
    /// The leaf's expiry, seconds since the Unix epoch.
    pub not_after: i64,
    /// The DNS names the leaf covers.
    pub names: Vec<String>,
    /// Stored by `ployz cert import`: the certificate issuer leaves it alone until it expires
    /// or stops covering the hostname, instead of renewing it by ACME.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub imported: bool,
}

impl std::fmt::Debug for CertificateMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The key never reaches a log.
        f.debug_struct("CertificateMaterial")
            .field("hostname", &self.hostname)
            .field("not_after", &self.not_after)
            .field("names", &self.names)
            .field("imported", &self.imported)
            .finish_non_exhaustive()
    }
}

/// What `ployz cert ls` shows of one Certificate Material (no key).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CertificateSummary {
    pub hostname: String,
    pub names: Vec<String>,
    pub not_after: i64,
    /// Stored by `ployz cert import` rather than issued by ACME.
    #[serde(default)]
    pub imported: bool,
}

impl From<&CertificateMaterial> for CertificateSummary {
    fn from(m: &CertificateMaterial) -> Self {
        CertificateSummary {
            hostname: m.hostname.clone(),
            names: m.names.clone(),
            not_after: m.not_after,
            imported: m.imported,
        }
    }
}
