//! Certificate Material on the edge: validation before it is stored, the SNI-keyed snapshot the
//! TLS handshake reads, and the controller that keeps that snapshot current from the store.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use ployz_core::CertificateMaterial;
use ployz_store::{KeyPrefix, Store};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;

pub use ployz_store::certificates::{certificate_key, CERTIFICATES_NAMESPACE};

/// Why Certificate Material is refused.
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
    #[error("the certificate expired at {not_after} (Unix time); renew it before importing")]
    Expired { not_after: i64 },
}

/// Whether a certificate name (possibly `*.example.com`) covers `host`.
fn covers(name: &str, host: &str) -> bool {
    let name = name.to_ascii_lowercase();
    match name.strip_prefix("*.") {
        Some(suffix) => host
            .split_once('.')
            .is_some_and(|(first, rest)| !first.is_empty() && rest == suffix),
        None => name == host,
    }
}

/// Checks a chain and key for `hostname` and returns the Certificate Material to store: the key
/// must match the leaf, the leaf must name the hostname and must not have expired.
pub fn validate(
    hostname: &str,
    chain_pem: &str,
    key_pem: &str,
    now_unix: i64,
) -> Result<CertificateMaterial, CertificateError> {
    let hostname = hostname.trim_end_matches('.').to_ascii_lowercase();
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(chain_pem.as_bytes())
        .collect::<Result<_, _>>()
        .map_err(|e| CertificateError::NoCertificate(e.to_string()))?;
    let leaf = chain
        .first()
        .ok_or_else(|| CertificateError::NoCertificate("none found".into()))?;
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
    if !names.iter().any(|n| covers(n, &hostname)) {
        return Err(CertificateError::NotCovered {
            hostname,
            names: if names.is_empty() {
                "no DNS name".into()
            } else {
                names.join(", ")
            },
        });
    }
    let not_after = cert.validity().not_after.timestamp();
    if not_after <= now_unix {
        return Err(CertificateError::Expired { not_after });
    }
    Ok(CertificateMaterial {
        hostname,
        chain_pem: chain_pem.to_owned(),
        key_pem: key_pem.to_owned(),
        not_after,
        names,
        imported: false,
    })
}

/// Hostname -> certified key, as the TLS handshake reads it.
#[derive(Default)]
pub struct CertificateTable {
    exact: HashMap<String, Arc<CertifiedKey>>,
}

impl CertificateTable {
    /// Builds from stored Certificate Material; material that does not load is skipped with a
    /// warning, never breaking the others.
    pub fn build(materials: &[CertificateMaterial]) -> CertificateTable {
        let mut exact = HashMap::new();
        for m in materials {
            match certified_key(m) {
                Ok(ck) => {
                    exact.insert(m.hostname.clone(), Arc::new(ck));
                }
                Err(e) => {
                    tracing::warn!(hostname = %m.hostname, error = %e, "skipping certificate material")
                }
            }
        }
        CertificateTable { exact }
    }

    /// The key for an SNI name.
    pub fn get(&self, sni: &str) -> Option<Arc<CertifiedKey>> {
        self.exact.get(sni).cloned()
    }

    pub fn len(&self) -> usize {
        self.exact.len()
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty()
    }
}

fn certified_key(m: &CertificateMaterial) -> Result<CertifiedKey, String> {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(m.chain_pem.as_bytes())
            .collect::<Result<_, _>>()
            .map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_slice(m.key_pem.as_bytes()).map_err(|e| e.to_string())?;
    let signing =
        rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| e.to_string())?;
    Ok(CertifiedKey::new(chain, signing))
}

/// The rustls certificate resolver over the published [`CertificateTable`].
#[derive(Clone, Default)]
pub struct CertificateResolver {
    table: Arc<ArcSwap<CertificateTable>>,
}

impl std::fmt::Debug for CertificateResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CertificateResolver({} hostnames)",
            self.table.load().len()
        )
    }
}

impl ResolvesServerCert for CertificateResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let sni = hello.server_name()?;
        let mut buf = [0u8; 253];
        if sni.len() > buf.len() {
            return None;
        }
        let lower = &mut buf[..sni.len()];
        lower.copy_from_slice(sni.as_bytes());
        lower.make_ascii_lowercase();
        let lower = std::str::from_utf8(lower).ok()?;
        self.table.load().get(lower)
    }
}

impl CertificateResolver {
    /// Reads every Certificate Material from the store and publishes the table.
    pub fn rebuild(&self, store: &Store) {
        let materials: Vec<CertificateMaterial> = store
            .scan_live(&KeyPrefix::cluster_namespace(CERTIFICATES_NAMESPACE))
            .unwrap_or_default()
            .into_iter()
            .filter_map(|r| serde_json::from_slice(&r.value).ok())
            .collect();
        let table = CertificateTable::build(&materials);
        tracing::info!(hostnames = table.len(), "certificate table published");
        self.table.store(Arc::new(table));
    }

    /// Keeps the table current until shutdown: new material is served without a restart.
    pub async fn run(&self, store: Arc<Store>, mut shutdown: watch::Receiver<bool>) {
        let mut changes = store.watch(KeyPrefix::cluster_namespace(CERTIFICATES_NAMESPACE));
        loop {
            let s = store.clone();
            let this = self.clone();
            let _ = tokio::task::spawn_blocking(move || this.rebuild(&s)).await;
            tokio::select! {
                _ = shutdown.changed() => return,
                event = changes.next() => if event.is_none() { return },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcards_cover_exactly_one_label() {
        assert!(covers("app.test", "app.test"));
        assert!(covers("*.example.com", "a.example.com"));
        assert!(!covers("*.example.com", "a.b.example.com"));
        assert!(!covers("*.example.com", "example.com"));
        assert!(!covers("app.test", "b.test"));
    }
}
