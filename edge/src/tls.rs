//! The edge's TLS: the server configuration its HTTPS listeners share. The handshake itself
//! is the connection loop's first step on an HTTPS listener (`EdgeApp::handshake`).
//!
//! The edge builds its own rustls [`ServerConfig`] rather than Pingora's: Pingora's keeps 256
//! sessions and issues no tickets, so a site with more than about a hundred returning visitors
//! between two of a visitor's visits makes every one of them a full handshake (a certificate
//! signature each, and on TLS 1.2 a round trip more). Here a returning client resumes with a
//! session ticket, encrypted under a key that rotates every 6 hours (the previous one is still
//! accepted), kept in memory only and never shared between Machines: a ticket from another
//! Machine, or from before a restart, is a full handshake, as with nginx's and haproxy's
//! defaults. TLS 1.3 resumption still makes a fresh key exchange (`psk_dhe_ke`), so a stolen
//! ticket key does not open recorded TLS 1.3 sessions; a TLS 1.2 ticket carries its session's
//! master secret, so the key in use (up to 12 hours of it) opens the TLS 1.2 sessions that got
//! tickets under it, as with those servers. TLS 1.2 clients that do not take tickets resume
//! from a bounded cache of session IDs. 0-RTT data is never accepted: it can be replayed.
//!
//! Certificates come from the resolver, by SNI; ALPN offers HTTP/2 and HTTP/1.1.

use std::sync::Arc;

use rustls::server::{ResolvesServerCert, ServerSessionMemoryCache};
pub use rustls::ServerConfig;

/// TLS 1.2 sessions kept for clients that resume by session ID rather than by ticket (each
/// a few hundred bytes).
pub const SESSION_CACHE: usize = 8192;

/// The server configuration every HTTPS listener of the edge uses: TLS 1.2 and 1.3,
/// certificates from `certificates` by SNI, HTTP/2 and HTTP/1.1 by ALPN, resumption by
/// tickets (and by session ID for TLS 1.2).
pub fn server_config(
    certificates: Arc<dyn ResolvesServerCert>,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?
        .with_no_client_auth()
        .with_cert_resolver(certificates);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    config.ticketer = rustls::crypto::ring::Ticketer::new()?;
    config.session_storage = ServerSessionMemoryCache::new(SESSION_CACHE);
    config.max_early_data_size = 0;
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_offers_h2_and_tickets_and_refuses_early_data() {
        let config = server_config(Arc::new(crate::CertificateResolver::default())).unwrap();
        assert_eq!(
            config.alpn_protocols,
            [b"h2".to_vec(), b"http/1.1".to_vec()]
        );
        assert!(config.ticketer.enabled());
        assert_eq!(config.max_early_data_size, 0);
        assert!(config.session_storage.can_cache());
    }
}
