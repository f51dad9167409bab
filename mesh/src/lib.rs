//! The mesh: how this Machine reaches the others.
//!
//! - [`wireguard`]: the WireGuard interface (kernel or userspace backend), its peers, routes
//!   and MTU.
//! - [`endpoints`]: Advertised Endpoints and each observer's Selected Endpoint per peer.
//! - [`firewall`]: the `PLOYZ-INPUT` chain and the forwarding rules mesh traffic needs.
//! - [`membership`]: SWIM membership (foca) over UDP between Management Addresses.
//! - [`join`]: join tokens and Machine Subnet allocation.
//! - [`userspace`]: the userspace WireGuard device and its control socket.

pub mod device;
pub mod endpoints;
pub mod firewall;
pub mod join;
pub mod membership;
pub mod userspace;
pub mod wireguard;
