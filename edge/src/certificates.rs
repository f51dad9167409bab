//! Certificate Material on the edge: the SNI-keyed snapshot the TLS handshake reads, and the controller that keeps that snapshot current from the store.

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

pub use ployz_core::CertificateError;

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
    /// Turns true with the first table read from the store.
    built: Arc<watch::Sender<bool>>,
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
    /// A resolver serving `materials` and nothing else (the edge alone, with certificates from
    /// files).
    pub fn fixed(materials: &[CertificateMaterial]) -> CertificateResolver {
        let resolver = CertificateResolver::default();
        resolver
            .table
            .store(Arc::new(CertificateTable::build(materials)));
        resolver
    }

    /// Reads every Certificate Material from the store and publishes the table; a store that
    /// cannot be read leaves the last table served (`false`).
    pub fn rebuild(&self, store: &Store) -> bool {
        let records = match store.scan_live(&KeyPrefix::cluster_namespace(CERTIFICATES_NAMESPACE)) {
            Ok(records) => records,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the certificates from the store; the last table is served, and the read tried again in 1 s");
                return false;
            }
        };
        let materials: Vec<CertificateMaterial> = records
            .into_iter()
            .filter_map(|r| serde_json::from_slice(&r.value).ok())
            .collect();
        let table = CertificateTable::build(&materials);
        tracing::info!(hostnames = table.len(), "certificate table published");
        self.table.store(Arc::new(table));
        self.built.send_replace(true);
        true
    }

    /// Completes once a table read from the store is published.
    pub async fn first_built(&self) {
        let mut built = self.built.subscribe();
        let _ = built.wait_for(|built| *built).await;
    }

    /// Keeps the table current until shutdown: new material is served without a restart.
    pub async fn run(&self, store: Arc<Store>, mut shutdown: watch::Receiver<bool>) {
        let mut changes = store.watch(KeyPrefix::cluster_namespace(CERTIFICATES_NAMESPACE));
        loop {
            let s = store.clone();
            let this = self.clone();
            let read = tokio::task::spawn_blocking(move || this.rebuild(&s))
                .await
                .unwrap_or(false);
            tokio::select! {
                _ = shutdown.changed() => return,
                event = changes.next() => if event.is_none() { return },
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)), if !read => {}
            }
        }
    }
}
