//! The edge: every Machine's public face, a Pingora HTTP proxy for Ingress Hostnames.
//!
//! - [`route_table`]: the immutable [`RouteTable`] (Ingress Hostname -> Serving Containers) and
//!   the pure, allocation-free host match the hot path calls;
//! - [`controller`]: the [`RouteController`], which rebuilds the table from the store's
//!   Container Runtime Observations off the hot path and publishes it with one `ArcSwap` store,
//!   skipping publishes that change nothing (a store that cannot be read leaves the published
//!   table as it is), and carries out the edge's side of a drain
//!   ([`RouteController::drain`]), woken by publishes and by the last request in flight ending;
//! - [`proxy`]: the Pingora `ProxyHttp` implementation: machine paths (health, verify), host
//!   routing, round robin with connect retries, forwarding headers, access log;
//! - [`connection`]: [`EdgeApp`], the connection loops with the fast path (HTTP/1, and
//!   HTTP/2 streams in `h2_path`) in front of Pingora's proxy;
//! - [`service`]: [`EdgeService`], the edge's listeners, an acceptor each, and the edge workers
//!   (an event loop each) that serve their connections; the listeners close after SIGTERM's
//!   drain delay while requests in flight are answered;
//! - [`tls`]: the HTTPS listeners' rustls configuration (certificates by SNI, HTTP/2 by ALPN,
//!   resumption by session tickets) and their handshake.
//!
//! **Architecture Invariant:** the edge never talks to Docker; it reads the store.
//!
//! **Architecture Invariant:** the request path loads the table once per request and never
//! awaits the store.

pub mod auth;
pub mod certificates;
pub mod challenges;
pub mod connection;
pub mod controller;
pub mod exchanges;
mod fast_path;
mod h2_path;
pub mod ingress_ports;
pub mod metrics;
pub mod proxy;
pub mod route_table;
pub mod service;
pub mod tls;

pub use certificates::CertificateResolver;
pub use challenges::ChallengeResponder;
pub use connection::EdgeApp;
pub use controller::{paths_served_by_others, Drained, RouteController};
pub use metrics::EdgeMetrics;
pub use proxy::{EdgeLimits, EdgeProxy, EdgeState, DEFAULT_CONNECT_TIMEOUT};
pub use route_table::{valid_host, InFlight, Route, RouteTable, Upstream};
pub use service::{EdgeClosing, EdgeService};

/// The edge as a Pingora service: [`EdgeApp`], the fast path with `proxy` inside Pingora's
/// proxy for the rest. Add listeners to it, then add it to the server; its
/// [`EdgeService::closing`] closes them at the end of SIGTERM's drain delay.
pub fn edge_service(
    conf: &std::sync::Arc<pingora::server::configuration::ServerConf>,
    proxy: EdgeProxy,
) -> EdgeService {
    let workers = conf.threads.max(1);
    let app = EdgeApp::new(
        pingora::proxy::http_proxy(conf, proxy.clone()),
        proxy,
        workers,
    );
    EdgeService::new(app, workers)
}
