//! Reading Certificate Material: the leaf's validity and names, and checking an issued chain and
//! key before they are stored (the same checks the edge's `validate` makes).

use ployz_core::CertificateMaterial;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// What the issuer needs to know of a chain's leaf certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeafInfo {
    /// Start of validity, Unix seconds (the issued-at estimate for renewal).
    pub not_before: i64,
    /// End of validity, Unix seconds.
    pub not_after: i64,
    /// DNS names (subject alternative names, else the common name), lowercase.
    pub names: Vec<String>,
    /// The serial number, lowercase hex.
    pub serial: String,
}

/// Why a chain or key is not usable Certificate Material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaterialError {
    /// No PEM certificate in the chain.
    #[error("the chain has no PEM certificate ({0})")]
    NoCertificate(String),
    /// The leaf does not parse.
    #[error("the leaf certificate does not parse: {0}")]
    BadCertificate(String),
    /// The key does not parse or is of an unsupported type.
    #[error("the private key is not usable: {0}")]
    BadKey(String),
    /// The key is not the leaf's.
    #[error("the private key does not match the leaf certificate")]
    KeyMismatch,
    /// The leaf does not cover the hostname.
    #[error("the leaf covers {names} but not '{hostname}'")]
    NotCovered {
        /// The hostname.
        hostname: String,
        /// The names it does cover.
        names: String,
    },
    /// The leaf has expired.
    #[error("the leaf expired at {not_after} (Unix time)")]
    Expired {
        /// Its expiry.
        not_after: i64,
    },
}

/// Whether a certificate name (possibly `*.example.com`) covers `host` (both lowercase).
pub fn covers(name: &str, host: &str) -> bool {
    let name = name.to_ascii_lowercase();
    match name.strip_prefix("*.") {
        Some(suffix) => host
            .split_once('.')
            .is_some_and(|(first, rest)| !first.is_empty() && rest == suffix),
        None => name == host,
    }
}

fn leaf_der(chain_pem: &str) -> Result<CertificateDer<'static>, MaterialError> {
    CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .next()
        .ok_or_else(|| MaterialError::NoCertificate("none found".into()))?
        .map_err(|e| MaterialError::NoCertificate(e.to_string()))
}

/// Parses the first certificate of a PEM chain.
pub fn parse_leaf(chain_pem: &str) -> Result<LeafInfo, MaterialError> {
    let der = leaf_der(chain_pem)?;
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|e| MaterialError::BadCertificate(e.to_string()))?;
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

/// Checks an issued chain and key for `hostname` and returns the Certificate Material to store:
/// the key must match the leaf, the leaf must name the hostname and must not have expired.
pub fn material_from_issued(
    hostname: &str,
    chain_pem: &str,
    key_pem: &str,
    now_unix: i64,
) -> Result<CertificateMaterial, MaterialError> {
    let hostname = hostname.trim_end_matches('.').to_ascii_lowercase();
    let leaf = leaf_der(chain_pem)?;
    let info = parse_leaf(chain_pem)?;
    let key = PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
        .map_err(|e| MaterialError::BadKey(e.to_string()))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| MaterialError::BadKey(e.to_string()))?;
    let (_, cert) = x509_parser::parse_x509_certificate(leaf.as_ref())
        .map_err(|e| MaterialError::BadCertificate(e.to_string()))?;
    let spki = signing.public_key().ok_or(MaterialError::KeyMismatch)?;
    if spki.as_ref() != cert.tbs_certificate.subject_pki.raw {
        return Err(MaterialError::KeyMismatch);
    }
    if !info.names.iter().any(|n| covers(n, &hostname)) {
        return Err(MaterialError::NotCovered {
            hostname,
            names: if info.names.is_empty() {
                "no DNS name".into()
            } else {
                info.names.join(", ")
            },
        });
    }
    if info.not_after <= now_unix {
        return Err(MaterialError::Expired {
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A self-signed certificate for `names`, valid between the two Unix times, and its key.
    pub(crate) fn self_signed(names: &[&str], not_before: i64, not_after: i64) -> (String, String) {
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
        let info = parse_leaf(&chain).unwrap();
        assert_eq!(info.not_before, 1_000_000);
        assert_eq!(info.not_after, 2_000_000);
        assert_eq!(info.names, ["app.test", "www.app.test"]);
        assert!(!info.serial.is_empty());
        let m = material_from_issued("APP.test.", &chain, &key, 1_500_000).unwrap();
        assert_eq!(m.hostname, "app.test");
        assert_eq!(m.not_after, 2_000_000);
        assert_eq!(
            material_from_issued("other.test", &chain, &key, 1_500_000),
            Err(MaterialError::NotCovered {
                hostname: "other.test".into(),
                names: "app.test, www.app.test".into()
            })
        );
        assert_eq!(
            material_from_issued("app.test", &chain, &key, 2_000_000),
            Err(MaterialError::Expired {
                not_after: 2_000_000
            })
        );
        let (_, other_key) = self_signed(&["app.test"], 1_000_000, 2_000_000);
        assert_eq!(
            material_from_issued("app.test", &chain, &other_key, 1_500_000),
            Err(MaterialError::KeyMismatch)
        );
        assert!(matches!(
            parse_leaf("garbage"),
            Err(MaterialError::NoCertificate(_))
        ));
    }
}
