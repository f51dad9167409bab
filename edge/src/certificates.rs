//! Certificate Material on the edge: the SNI-keyed snapshot the TLS handshake reads, and the controller that keeps that snapshot current from the store.

use std::collections::HashMap;
use std::sync::Arc;

use arc_swap::ArcSwap;
use ployz_core::CertificateMaterial;
use ployz_store::follow::{follow, View};
use ployz_store::{KeyPrefix, Store, StoreError};
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
    /// Each hostname served and when its certificate expires (Unix seconds), by hostname.
    expiry: Vec<(String, i64)>,
}

impl CertificateTable {
    /// Builds from stored Certificate Material; material that does not load is skipped with a
    /// warning, never breaking the others.
    pub fn build(materials: &[CertificateMaterial]) -> CertificateTable {
        let mut exact = HashMap::new();
        let mut expiry = std::collections::BTreeMap::new();
        for m in materials {
            match certified_key(m) {
                Ok(ck) => {
                    // The last of a hostname wins in both.
                    exact.insert(m.hostname.clone(), Arc::new(ck));
                    expiry.insert(m.hostname.clone(), m.not_after);
                }
                Err(e) => {
                    tracing::warn!(hostname = %m.hostname, error = %e, "skipping certificate material")
                }
            }
        }
        CertificateTable {
            exact,
            expiry: expiry.into_iter().collect(),
        }
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
    /// cannot be read publishes nothing (the last table is served).
    pub fn rebuild(&self, store: &Store) -> Result<(), StoreError> {
        let materials: Vec<CertificateMaterial> = store
            .scan_live(&KeyPrefix::cluster_namespace(CERTIFICATES_NAMESPACE))?
            .into_iter()
            .filter_map(|r| serde_json::from_slice(&r.value).ok())
            .collect();
        self.table
            .store(Arc::new(CertificateTable::build(&materials)));
        self.built.send_replace(true);
        Ok(())
    }

    /// Appends `ployz_edge_certificate_expiry_timestamp_seconds{hostname}` in the Prometheus
    /// text format: when the certificate this edge serves for each hostname expires (Unix
    /// seconds), so an alert can say a certificate nears its end whatever kept it from being
    /// renewed (its issuer down, the authority refusing, a policy that cannot be followed).
    pub fn render_expiry(&self, out: &mut String) {
        use prometheus_client::metrics::family::Family;
        use prometheus_client::metrics::gauge::Gauge;
        let family = Family::<[(&'static str, String); 1], Gauge>::default();
        for (hostname, not_after) in &self.table.load().expiry {
            family
                .get_or_create(&[("hostname", hostname.clone())])
                .set(*not_after);
        }
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register(
            "ployz_edge_certificate_expiry_timestamp_seconds",
            "When the certificate the edge serves for each hostname expires, Unix seconds",
            family,
        );
        // Writing to a String cannot fail, and nothing registered here fails to encode.
        let _ = prometheus_client::encoding::prometheus_text::encode(out, &registry);
    }

    /// Completes once a table read from the store is published.
    pub async fn first_built(&self) {
        let mut built = self.built.subscribe();
        let _ = built.wait_for(|built| *built).await;
    }

    /// Keeps the table current until shutdown ([`follow`]): new material is served without a
    /// restart, and a store that cannot be read is read again, the last table served meanwhile.
    pub async fn run(&self, store: Arc<Store>, shutdown: watch::Receiver<bool>) {
        let view = PublishedCertificates {
            resolver: self.clone(),
            generation: 0,
        };
        let prefixes = vec![KeyPrefix::cluster_namespace(CERTIFICATES_NAMESPACE)];
        follow(store, prefixes, view, shutdown).await;
    }
}

/// The certificate table as a view of the store ([`follow`] keeps it current).
struct PublishedCertificates {
    resolver: CertificateResolver,
    /// Tables published so far.
    generation: u64,
}

impl View for PublishedCertificates {
    fn what(&self) -> &'static str {
        "certificate table"
    }

    fn rebuild(&mut self, store: &Store) -> Result<Option<u64>, StoreError> {
        self.resolver.rebuild(store)?;
        self.generation += 1;
        Ok(Some(self.generation))
    }

    fn size(&self) -> String {
        format!("{} hostnames", self.resolver.table.load().len())
    }
}
