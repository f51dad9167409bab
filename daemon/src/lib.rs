//! The Ployz daemon: `ployz daemon run`, one process per Machine.
//!
//! A Pingora [`Server`](pingora::server::Server) is the process's frame. Today it carries the
//! management API (JSON over HTTP on a unix socket) and the Machine's local identity and store;
//! the edge, orchestrator, mesh, certificates and DNS join it as services of the same server.
//!
//! Lifecycle: [`DaemonConfig`] is loaded (built-in defaults, then a TOML file, then flags, into
//! one typed value) and validated, the socket is bound before anything starts so a second
//! daemon on the same path fails at once, the server runs until SIGTERM (graceful) or SIGINT
//! (fast), and the store is flushed and the socket removed on the way out.

mod api;
mod cert_api;
mod cluster_api;
mod config;
mod docker_api;
mod drain;
mod forward;
mod fsutil;
mod gate_api;
mod handover;
mod identity;
mod images_api;
mod lease;
mod local_machine;
mod mesh;
mod mesh_service;
mod notify;
mod public_addresses;
mod reconcile;
pub mod replication;
mod server;
mod store_api;

pub use config::{
    parse_socket_addr, CertificateSettings, DaemonConfig, DnsListen, DnsSettings, EdgeSettings,
    LimitSettings, LogFormat, MembershipProfileSetting, MeshSettings, ShutdownSettings,
    UnderscoreHeaders, WireGuardBackendSetting,
};
pub use server::{parse_route, run, run_edge_alone, run_taking_over, EdgeTls, PID_FILE};
