//! A simulated network between membership and its socket, for tests.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

/// What happens to one outgoing datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkVerdict {
    /// Send it now.
    Deliver,
    /// Never send it, as a lossy network would lose it.
    Drop,
    /// Send it after this long, as a slow network would deliver it late.
    Delay(Duration),
}

/// Decides the fate of every datagram membership sends: a simulated network, so that tests can
/// exercise loss, delay and partitions over real sockets. Production leaves it unset
/// ([`super::MembershipConfig::link`]); only the network is simulated, the protocol runs as it
/// would.
pub trait LinkFilter: Send + Sync + fmt::Debug {
    /// The verdict for `datagram`, about to be sent to `to`.
    fn verdict(&self, to: SocketAddr, datagram: &[u8]) -> LinkVerdict;
}
