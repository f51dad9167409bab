//! Certificate Material: the certificate chain and key held in cluster state for one Ingress
//! Hostname, served as given; and the one check every writer makes before storing it
//! ([`CertificateMaterial::check`]: `ployz cert import` and the ACME issuer alike).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
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

/// Why a chain and key are not usable Certificate Material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CertificateError {
    #[error("the certificate file has no PEM certificate ({0})")]
    NoCertificate(String),
    #[error("the key file has no PEM private key ({0})")]
    NoKey(String),
    #[error("the private key is not usable: {0}")]
    BadKey(String),
    #[error("the leaf certificate does not parse: {0}")]
    BadCertificate(String),
    #[error("the private key does not match the certificate; give the key the certificate was issued for")]
    KeyMismatch,
    #[error("the certificate covers {names} but not '{hostname}'; use a certificate issued for that hostname")]
    NotCovered { hostname: String, names: String },
    #[error("the certificate expired at {not_after} (Unix time); renew it before storing it")]
    Expired { not_after: i64 },
}

/// What a chain's leaf certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafInfo {
    /// Start of validity, Unix seconds.
    pub not_before: i64,
    /// End of validity, Unix seconds.
    pub not_after: i64,
    /// DNS names (subject alternative names, else the common name), lowercase.
    pub names: Vec<String>,
    /// The serial number, lowercase hex.
    pub serial: String,
}

/// Whether a certificate name (possibly `*.example.com`, one label) covers `host` (lowercase).
pub fn covers(name: &str, host: &str) -> bool {
    let name = name.to_ascii_lowercase();
    match name.strip_prefix("*.") {
        Some(suffix) => host
            .split_once('.')
            .is_some_and(|(first, rest)| !first.is_empty() && rest == suffix),
        None => name == host,
    }
}

fn leaf_der(chain_pem: &str) -> Result<CertificateDer<'static>, CertificateError> {
    CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .next()
        .ok_or_else(|| CertificateError::NoCertificate("none found".into()))?
        .map_err(|e| CertificateError::NoCertificate(e.to_string()))
}

fn parse_der(der: &[u8]) -> Result<LeafInfo, CertificateError> {
    let (_, cert) = x509_parser::parse_x509_certificate(der)
        .map_err(|e| CertificateError::BadCertificate(e.to_string()))?;
    let mut names: Vec<String> = cert
        .subject_alternative_name()
        .ok()
        .flatten()
        .map(|san| {
            san.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    x509_parser::extensions::GeneralName::DNSName(d) => {
                        Some(d.to_ascii_lowercase())
                    }
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    if names.is_empty() {
        names.extend(
            cert.subject()
                .iter_common_name()
                .filter_map(|cn| cn.as_str().ok())
                .map(str::to_ascii_lowercase),
        );
    }
    Ok(LeafInfo {
        not_before: cert.validity().not_before.timestamp(),
        not_after: cert.validity().not_after.timestamp(),
        names,
        serial: hex::encode(cert.tbs_certificate.raw_serial()),
    })
}

/// Reads the first certificate of a PEM chain.
pub fn read_leaf(chain_pem: &str) -> Result<LeafInfo, CertificateError> {
    parse_der(leaf_der(chain_pem)?.as_ref())
}

impl CertificateMaterial {
    /// Checks a chain and key for `hostname` and returns the Certificate Material to store: the
    /// key must match the leaf, the leaf must name the hostname and must not have expired.
    pub fn check(
        hostname: &str,
        chain_pem: &str,
        key_pem: &str,
        now_unix: i64,
    ) -> Result<CertificateMaterial, CertificateError> {
        let hostname = hostname.trim_end_matches('.').to_ascii_lowercase();
        let leaf = leaf_der(chain_pem)?;
        let info = parse_der(leaf.as_ref())?;
        let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| CertificateError::NoKey(e.to_string()))?;
        let signing = rustls::crypto::ring::sign::any_supported_type(&key)
            .map_err(|e| CertificateError::BadKey(e.to_string()))?;
        let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
            .map_err(|e| CertificateError::BadCertificate(e.to_string()))?;
        let spki = signing.public_key().ok_or(CertificateError::KeyMismatch)?;
        if spki.as_ref() != cert.tbs_certificate.subject_pki.raw {
            return Err(CertificateError::KeyMismatch);
        }
        if !info.names.iter().any(|n| covers(n, &hostname)) {
            return Err(CertificateError::NotCovered {
                hostname,
                names: if info.names.is_empty() {
                    "no DNS name".into()
                } else {
                    info.names.join(", ")
                },
            });
        }
        if info.not_after <= now_unix {
            return Err(CertificateError::Expired {
                not_after: info.not_after,
            });
        }
        Ok(CertificateMaterial {
            hostname,
            chain_pem: chain_pem.to_owned(),
            key_pem: key_pem.to_owned(),
            not_after: info.not_after,
            names: info.names,
            imported: false,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate for `names`, valid between the two Unix times, and its key.
    fn self_signed(names: &[&str], not_before: i64, not_after: i64) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params =
            rcgen::CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.not_before = rcgen::date_time_ymd(1970, 1, 1)
            + std::time::Duration::from_secs(not_before.max(0) as u64);
        params.not_after = rcgen::date_time_ymd(1970, 1, 1)
            + std::time::Duration::from_secs(not_after.max(0) as u64);
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    #[test]
    fn wildcards_cover_exactly_one_label() {
        assert!(covers("app.test", "app.test"));
        assert!(covers("*.example.com", "a.example.com"));
        assert!(!covers("*.example.com", "a.b.example.com"));
        assert!(!covers("*.example.com", "example.com"));
        assert!(!covers("app.test", "b.test"));
    }

    #[test]
    fn leaf_validity_names_and_key_are_checked() {
        let (chain, key) = self_signed(&["App.Test", "www.app.test"], 1_000_000, 2_000_000);
        let info = read_leaf(&chain).unwrap();
        assert_eq!(info.not_before, 1_000_000);
        assert_eq!(info.not_after, 2_000_000);
        assert_eq!(info.names, ["app.test", "www.app.test"]);
        assert!(!info.serial.is_empty());
        let m = CertificateMaterial::check("APP.test.", &chain, &key, 1_500_000).unwrap();
        assert_eq!(m.hostname, "app.test");
        assert_eq!(m.not_after, 2_000_000);
        assert!(!m.imported);
        assert_eq!(
            CertificateMaterial::check("other.test", &chain, &key, 1_500_000),
            Err(CertificateError::NotCovered {
                hostname: "other.test".into(),
                names: "app.test, www.app.test".into()
            })
        );
        assert_eq!(
            CertificateMaterial::check("app.test", &chain, &key, 2_000_000),
            Err(CertificateError::Expired {
                not_after: 2_000_000
            })
        );
        let (_, other_key) = self_signed(&["app.test"], 1_000_000, 2_000_000);
        assert_eq!(
            CertificateMaterial::check("app.test", &chain, &other_key, 1_500_000),
            Err(CertificateError::KeyMismatch)
        );
        assert!(matches!(
            CertificateMaterial::check("app.test", &chain, "no key", 1_500_000),
            Err(CertificateError::NoKey(_))
        ));
        assert!(matches!(
            read_leaf("garbage"),
            Err(CertificateError::NoCertificate(_))
        ));
    }
}
