//! Internal DNS: the daemon's DNS server.
//!
//! Names under `.internal` get an **Internal DNS Answer**: an observer-local, TTL-zero,
//! authoritative A answer derived from the replicated observations of healthy Service
//! Containers (Serving Containers). Every other name is forwarded to the host's resolvers.
//!
//! Names answered (case-insensitive, trailing dot optional):
//! - `<service-label>.internal`: every Serving Container of every Service whose Service Name
//!   has that Service DNS Label (the name lowercased, `_` and `.` turned to `-`, edge `-`
//!   dropped: `My_App` answers at `my-app.internal`). Name Ambiguity is preserved: Services
//!   sharing a label answer together.
//! - `<service-id>.internal`: the Serving Containers of one Service ID.
//! - `<machine>.m.<service-label>.internal`, the Machine-Service DNS Selector: one Machine
//!   (by Machine ID, or by Machine Name while that name belongs to exactly one Machine)
//!   together with one Service DNS Label. It is not a Service identity.
//! - the prefixes `rr.` (shuffled per query, also the default) and `nearest.` (the Nearest DNS
//!   Selector: addresses in the observing Machine's subnet first, each group shuffled).
//!
//! Unknown `.internal` names get NXDOMAIN; known names asked for another type (AAAA, TXT...)
//! get NOERROR without answers; both carry the zone's SOA (TTL 0) in the authority section.
//! `ANY` is answered minimally (RFC 8482) with the A records. `internal.` answers its SOA.
//!
//! The pieces, from pure to IO:
//! - [`DnsSnapshot`]: the immutable answer table, built by a pure function from observations
//!   and Machine records ([`DnsSnapshot::build`]) or from a zone file
//!   ([`DnsSnapshot::from_zone`]);
//! - [`lookup`]: what the server would answer, as the management API's
//!   [`LookupAnswer`](ployz_core::api::LookupAnswer) for the CLI;
//! - [`DnsController`]: rebuilds and publishes the snapshot when the store changes;
//! - [`DnsServer`]: UDP and TCP sockets answering from the published snapshot, refusing
//!   sources outside [`AllowedSources`], forwarding the rest, counting in [`DnsMetrics`].
//!
//! Wiring it into the daemon, in its Tokio runtime:
//!
//! ```no_run
//! # async fn wire(
//! #     store: std::sync::Arc<ployz_store::Store>,
//! #     me: ployz_core::api::MachineInfo,
//! #     shutdown: tokio::sync::watch::Receiver<bool>,
//! # ) -> Result<(), ployz_dns::DnsError> {
//! use std::net::SocketAddr;
//! use ployz_dns::{AllowedSources, DnsController, DnsServer, DnsServerConfig};
//!
//! let controller = DnsController::new();
//! let c = controller.clone();
//! let (s, id, rx) = (store.clone(), me.id.clone(), shutdown.clone());
//! tokio::spawn(async move { c.run(s, id, rx).await });
//!
//! let listen = SocketAddr::new(me.subnet.gateway().into(), 53);
//! let mut config = DnsServerConfig::new(listen);
//! config.allowed_sources = AllowedSources::loopback()
//!     .with_machine_subnet(me.subnet)
//!     .with("fdcc::/16".parse().expect("a network"));
//! config.upstreams = ployz_dns::upstreams_from_resolv_conf(
//!     "/etc/resolv.conf".as_ref(),
//!     &[listen],
//! )?;
//! let server = DnsServer::bind(config, controller.snapshot().clone()).await?;
//! let metrics = server.metrics(); // render_prometheus on scrape
//! tokio::spawn(server.run(shutdown));
//! // Management API: ployz_dns::lookup(&controller.snapshot().load(), name, qtype)
//! # let _ = metrics;
//! # Ok(())
//! # }
//! ```
//!
//! The UDP workers are dedicated OS threads (named `ployz-dns-udp-<n>`), so a busy runtime
//! never delays an `.internal` answer; TCP and forwarding run on the runtime.
//!
//! **Architecture Invariant:** the query path takes no lock and, for `.internal` names, does no
//! allocation once warm: one atomic snapshot load, one hash lookup, bytes written into a reused
//! buffer. The wire format is handled by this crate's own small bounds-checked codec
//! (`wire.rs`): one question in, a header, the echoed question and fixed-size A records out.

#![warn(missing_docs)]

mod acl;
mod answer;
mod cache;
mod controller;
mod error;
mod forward;
mod lookup;
mod metrics;
mod server;
mod snapshot;
mod udp;
mod wire;
mod zone;

pub use acl::{AllowedSources, IpNet};
pub use controller::DnsController;
pub use error::DnsError;
pub use forward::{exclude_own_addresses, parse_resolv_conf, upstreams_from_resolv_conf};
pub use lookup::lookup;
pub use metrics::{DnsMetrics, QuerySource};
pub use server::{check_port_free, DnsServer, DnsServerConfig};
pub use snapshot::{DnsSnapshot, MACHINE_LABEL, ZONE};
pub use wire::{CLASSIC_UDP_PAYLOAD, MAX_UDP_PAYLOAD};
pub use zone::{parse_zone, ZoneError};
