//! The edge as a Pingora service whose listeners close ahead of the rest of the server.
//!
//! Pingora closes every listener when the server shuts down and then gives in-flight work a
//! fixed grace period. The edge needs more: after SIGTERM's drain delay its listeners close
//! while the rest of the daemon still runs, idle connections close between requests, and
//! shutdown goes on as soon as the last request in flight is answered (or a bound passes).
//! [`EdgeService`] wraps the listening service with a shutdown signal of its own, raised by
//! [`EdgeClosing::close`] or by the server's; [`EdgeClosing::closed`] waits for the connections.

use std::fmt;
use std::net::SocketAddr;
use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora::server::{ListenFds, ShutdownWatch};
use pingora::services::listening::Service;
use tokio::sync::{watch, Notify};

use crate::EdgeApp;

/// Closes the edge's listeners and counts the connections still open.
#[derive(Clone)]
pub struct EdgeClosing {
    inner: Arc<Closing>,
}

struct Closing {
    close: watch::Sender<bool>,
    open: AtomicUsize,
    /// Notified when a connection closes.
    left: Notify,
}

impl Default for EdgeClosing {
    fn default() -> EdgeClosing {
        EdgeClosing {
            inner: Arc::new(Closing {
                close: watch::channel(false).0,
                open: AtomicUsize::new(0),
                left: Notify::new(),
            }),
        }
    }
}

impl fmt::Debug for EdgeClosing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EdgeClosing")
            .field("closed", &*self.inner.close.borrow())
            .field("open", &self.open())
            .finish()
    }
}

impl EdgeClosing {
    /// Closes the edge's listeners: no connection is accepted any more, idle ones close
    /// between requests, and requests in flight are answered (with `Connection: close`).
    pub fn close(&self) {
        self.inner.close.send_replace(true);
    }

    /// Connections open now (HTTP/1 and HTTP/2, plain and TLS).
    pub fn open(&self) -> usize {
        self.inner.open.load(Ordering::SeqCst)
    }

    /// Waits until no connection is open, or `within` passed; returns how many are left.
    pub async fn closed(&self, within: Duration) -> usize {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let left = self.inner.left.notified();
            tokio::pin!(left);
            left.as_mut().enable();
            let open = self.open();
            if open == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, left).await.is_err() {
                return self.open();
            }
        }
    }

    /// Counts one connection until the guard drops.
    pub(crate) fn opened(&self) -> OpenConnection {
        self.inner.open.fetch_add(1, Ordering::SeqCst);
        OpenConnection {
            inner: self.inner.clone(),
        }
    }

    fn subscribe(&self) -> watch::Receiver<bool> {
        self.inner.close.subscribe()
    }
}

/// One open connection, counted by [`EdgeClosing`].
pub(crate) struct OpenConnection {
    inner: Arc<Closing>,
}

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.inner.open.fetch_sub(1, Ordering::SeqCst);
        self.inner.left.notify_waiters();
    }
}

/// The edge's listening service: Pingora's, with listeners that [`EdgeClosing::close`] closes.
/// Add listeners to it (it derefs to the listening service), then add it to the server.
pub struct EdgeService {
    inner: Service<EdgeApp>,
    /// One listening service per HTTPS listener, its app the same edge with a TLS acceptor.
    tls: Vec<Service<EdgeApp>>,
    closing: EdgeClosing,
}

impl EdgeService {
    pub(crate) fn new(inner: Service<EdgeApp>, closing: EdgeClosing) -> EdgeService {
        EdgeService {
            inner,
            tls: Vec::new(),
            closing,
        }
    }

    /// Adds an HTTPS listener on `addr`: its connections get a TLS handshake with `config`
    /// (see [`crate::tls::server_config`]) before their first request. It is a listening
    /// service of its own, run with this one and sharing its edge (routes, upstream pool,
    /// connection count), so whether a connection is TLS never depends on its address.
    pub fn add_tls(&mut self, addr: SocketAddr, config: Arc<rustls::ServerConfig>) {
        let app = self
            .inner
            .app_logic()
            .expect("the edge service has its app until it starts")
            .with_tls(config);
        let mut service = Service::new(format!("edge https {addr}"), app);
        service.add_tcp(&addr.to_string());
        self.tls.push(service);
    }

    /// Closes this service's listeners ahead of the server and waits for its connections.
    pub fn closing(&self) -> EdgeClosing {
        self.closing.clone()
    }
}

impl Deref for EdgeService {
    type Target = Service<EdgeApp>;
    fn deref(&self) -> &Service<EdgeApp> {
        &self.inner
    }
}

impl DerefMut for EdgeService {
    fn deref_mut(&mut self) -> &mut Service<EdgeApp> {
        &mut self.inner
    }
}

#[async_trait]
impl pingora::services::Service for EdgeService {
    async fn start_service(
        &mut self,
        fds: Option<ListenFds>,
        shutdown: ShutdownWatch,
        listeners_per_fd: usize,
    ) {
        // The listeners see one signal: the edge's own close, or the server's shutdown.
        let (tx, rx) = watch::channel(false);
        let mut server = shutdown;
        let mut close = self.closing.subscribe();
        let forward = async {
            tokio::select! {
                _ = server.wait_for(|down| *down) => {}
                _ = close.wait_for(|closed| *closed) => {}
            }
            let _ = tx.send(true);
            // The sender stays until the service ends: a dropped one reads as shutdown too, but
            // connections still being answered watch it.
            std::future::pending::<()>().await
        };
        let mut listening =
            vec![self
                .inner
                .start_service(fds.clone(), rx.clone(), listeners_per_fd)];
        for tls in &mut self.tls {
            listening.push(tls.start_service(fds.clone(), rx.clone(), listeners_per_fd));
        }
        tokio::select! {
            _ = futures_util::future::join_all(listening) => {}
            () = forward => {}
        }
    }

    fn name(&self) -> &str {
        pingora::services::Service::name(&self.inner)
    }

    fn threads(&self) -> Option<usize> {
        pingora::services::Service::threads(&self.inner)
    }

    fn listen_addresses(&self) -> Option<Vec<String>> {
        let mut all = pingora::services::Service::listen_addresses(&self.inner).unwrap_or_default();
        for tls in &self.tls {
            all.extend(pingora::services::Service::listen_addresses(tls).unwrap_or_default());
        }
        Some(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn closed_waits_for_the_last_connection_and_no_longer() {
        let closing = EdgeClosing::default();
        assert_eq!(closing.closed(Duration::from_secs(5)).await, 0);
        let a = closing.opened();
        let b = closing.opened();
        assert_eq!(closing.open(), 2);
        assert_eq!(closing.closed(Duration::from_millis(20)).await, 2);
        let start = std::time::Instant::now();
        let waiting = tokio::spawn({
            let closing = closing.clone();
            async move { closing.closed(Duration::from_secs(5)).await }
        });
        drop(a);
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(b);
        assert_eq!(waiting.await.unwrap(), 0);
        assert!(start.elapsed() < Duration::from_secs(2));
    }
}
