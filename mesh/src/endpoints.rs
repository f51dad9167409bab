//! Advertised Endpoints (where this Machine says WireGuard can reach it) and each observer's
//! Selected Endpoint per peer (which of a peer's Advertised Endpoints this Machine uses now).
//!
//! Selection is a KubeSpan-style state machine, driven by [`EndpointSelector::tick`] once a
//! second with what WireGuard reports ([`PeerStats`]):
//! - a peer starts on its first Advertised Endpoint, and keeps its current one while that is
//!   still advertised;
//! - for [`UNKNOWN_PERIOD`] (15 s) after a change its status is `unknown`;
//! - it is `down` when no handshake happened since the change once that period is over, or when
//!   an established link has had no handshake for [`ESTABLISHED_TIMEOUT`] (275 s: WireGuard's
//!   180 s reject-after plus 5 s rekey timeout plus 90 s of retries);
//! - a down peer rotates to its next Advertised Endpoint;
//! - an endpoint WireGuard learned from the peer's own handshake (the stats show another endpoint
//!   with a handshake since the last change) is adopted.
//!
//! The state is this observer's own: another Machine may select another endpoint for the same
//! peer. Nothing here does IO except [`interface_addresses`]; time is always passed in, so the
//! machine is tested with a hand-driven clock.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime};

use serde::{Deserialize, Serialize};

use crate::wireguard::PeerStats;

/// How long a peer's status stays `unknown` after its Selected Endpoint changed.
pub const UNKNOWN_PERIOD: Duration = Duration::from_secs(15);
/// How long an established link may go without a handshake before it is `down`.
pub const ESTABLISHED_TIMEOUT: Duration = Duration::from_secs(275);

// === Advertised Endpoints ===

/// One address held by one interface of this Machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceAddress {
    /// The interface's name.
    pub interface: String,
    /// The address.
    pub address: IpAddr,
    /// Whether the interface is up.
    pub up: bool,
}

/// The addresses of every interface in the calling thread's network namespace.
pub fn interface_addresses() -> std::io::Result<Vec<InterfaceAddress>> {
    let addrs = nix::ifaddrs::getifaddrs().map_err(std::io::Error::from)?;
    Ok(addrs
        .filter_map(|a| {
            let storage = a.address?;
            let address = if let Some(v4) = storage.as_sockaddr_in() {
                IpAddr::V4(v4.ip())
            } else {
                IpAddr::V6(storage.as_sockaddr_in6()?.ip())
            };
            Some(InterfaceAddress {
                interface: a.interface_name,
                address,
                up: a.flags.contains(nix::net::if_::InterfaceFlags::IFF_UP),
            })
        })
        .collect())
}

/// Interfaces whose addresses are never advertised: Docker's bridges and veths. Loopback and
/// the mesh interface are skipped by name.
const SKIPPED_PREFIXES: [&str; 3] = ["docker", "br-", "veth"];

/// Whether an address can reach this Machine from another: global unicast in Go's sense (private
/// ranges included, loopback, link-local, multicast, broadcast and unspecified excluded), and
/// never a Management Address (`fdcc::/16`, only reachable through the mesh itself).
fn is_advertisable(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => {
            !(v4.is_loopback()
                || v4.is_link_local()
                || v4.is_unspecified()
                || v4.is_multicast()
                || v4.is_broadcast())
        }
        IpAddr::V6(v6) => {
            let first = v6.segments()[0];
            !(v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || first & 0xffc0 == 0xfe80
                || first == 0xfdcc)
        }
    }
}

/// This Machine's Advertised Endpoints: the `explicit` ones first (`machine update --endpoint`,
/// with their own ports), then the `public_ips` (`--public-ip`), then the addresses of interfaces
/// that are up and global unicast (skipping `mesh_interface`, `docker*`, `br-*`, `veth*` and
/// loopback), each with the WireGuard `port`; without duplicates, in that order.
pub fn advertised_endpoints(
    interfaces: &[InterfaceAddress],
    mesh_interface: &str,
    public_ips: &[IpAddr],
    explicit: &[SocketAddr],
    port: u16,
) -> Vec<SocketAddr> {
    let from_interfaces = interfaces
        .iter()
        .filter(|a| {
            a.up && a.interface != mesh_interface
                && a.interface != "lo"
                && !SKIPPED_PREFIXES.iter().any(|p| a.interface.starts_with(p))
                && is_advertisable(a.address)
        })
        .map(|a| a.address);
    let mut endpoints: Vec<SocketAddr> = Vec::new();
    let candidates = explicit.iter().copied().chain(
        public_ips
            .iter()
            .copied()
            .chain(from_interfaces)
            .map(|ip| SocketAddr::new(ip, port)),
    );
    for endpoint in candidates {
        if !endpoints.contains(&endpoint) {
            endpoints.push(endpoint);
        }
    }
    endpoints
}

// === Selected Endpoints ===

/// The state of this observer's link to one peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LinkStatus {
    /// Within 15 s of a change of Selected Endpoint, no handshake yet.
    Unknown,
    /// A handshake since the last change, the latest within 275 s.
    Up,
    /// No handshake 15 s after a change, or none for 275 s on an established link.
    Down,
}

impl LinkStatus {
    /// The word `ployz wg show` prints.
    pub fn as_str(&self) -> &'static str {
        match self {
            LinkStatus::Unknown => "unknown",
            LinkStatus::Up => "up",
            LinkStatus::Down => "down",
        }
    }
}

/// Why a Selected Endpoint changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChangeReason {
    /// A new peer starts on its first Advertised Endpoint.
    Initial,
    /// The selected endpoint is no longer advertised; the first one is taken.
    Readvertised,
    /// The link was down; the next Advertised Endpoint is tried.
    Rotated,
    /// WireGuard learned it from the peer's own handshake. WireGuard already uses it: applying
    /// it changes nothing on the interface, it only keeps the peer configuration in step.
    Learned,
}

/// A Selected Endpoint to apply: the daemon passes it in the peer's [`PeerConfig::endpoint`]
/// at its next [`MeshInterface::set_peers`].
///
/// [`PeerConfig::endpoint`]: crate::wireguard::PeerConfig::endpoint
/// [`MeshInterface::set_peers`]: crate::wireguard::MeshInterface::set_peers
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointChange {
    /// The peer's public key, base64.
    pub public_key: String,
    /// The new Selected Endpoint.
    pub endpoint: SocketAddr,
    /// Why.
    pub reason: ChangeReason,
}

/// One peer's Advertised Endpoints, as its Machine record lists them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAdvertisement {
    /// The peer's public key, base64.
    pub public_key: String,
    /// Its Advertised Endpoints, in its order of preference.
    pub endpoints: Vec<SocketAddr>,
}

/// This observer's view of one peer's link, for `ployz wg show`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerEndpoint {
    /// The peer's public key, base64.
    pub public_key: String,
    /// The Selected Endpoint; `None` while the peer advertises nothing and has not reached us.
    pub selected: Option<SocketAddr>,
    /// Whether the Selected Endpoint was learned from the peer's handshake.
    pub learned: bool,
    /// The link's status.
    pub status: LinkStatus,
    /// Since when the status holds.
    pub since: SystemTime,
    /// The last handshake WireGuard reported at the last tick.
    pub last_handshake: Option<SystemTime>,
    /// What the peer advertises.
    pub advertised: Vec<SocketAddr>,
}

#[derive(Debug, Clone)]
struct PeerState {
    advertised: Vec<SocketAddr>,
    selected: Option<SocketAddr>,
    learned: bool,
    changed_at: SystemTime,
    status: LinkStatus,
    since: SystemTime,
    last_handshake: Option<SystemTime>,
    membership_up: bool,
}

impl PeerState {
    fn select(&mut self, endpoint: Option<SocketAddr>, learned: bool, now: SystemTime) {
        self.selected = endpoint;
        self.learned = learned;
        self.changed_at = now;
        self.set_status(LinkStatus::Unknown, now);
    }

    fn set_status(&mut self, status: LinkStatus, now: SystemTime) {
        if self.status != status {
            self.status = status;
            self.since = now;
        }
    }

    /// The status the clock and the last handshake give.
    fn judge(&self, now: SystemTime) -> LinkStatus {
        let elapsed = |t: SystemTime| now.duration_since(t).unwrap_or(Duration::ZERO);
        match self.last_handshake {
            Some(handshake) if handshake >= self.changed_at => {
                if elapsed(handshake) <= ESTABLISHED_TIMEOUT {
                    LinkStatus::Up
                } else {
                    LinkStatus::Down
                }
            }
            _ if elapsed(self.changed_at) < UNKNOWN_PERIOD => LinkStatus::Unknown,
            _ => LinkStatus::Down,
        }
    }

    /// The Advertised Endpoint after the selected one (the first when the selected one is not
    /// advertised).
    fn next_endpoint(&self) -> Option<SocketAddr> {
        let position = self
            .selected
            .and_then(|s| self.advertised.iter().position(|a| *a == s));
        match position {
            Some(i) => self
                .advertised
                .get((i + 1) % self.advertised.len())
                .copied(),
            None => self.advertised.first().copied(),
        }
    }
}

/// Every peer's Selected Endpoint as this Machine observes it.
#[derive(Debug, Clone, Default)]
pub struct EndpointSelector {
    peers: BTreeMap<String, PeerState>,
}

impl EndpointSelector {
    /// No peers yet.
    pub fn new() -> EndpointSelector {
        EndpointSelector::default()
    }

    /// Makes the peer set exactly `peers` with their current Advertised Endpoints: a new peer
    /// starts on its first endpoint; a known one keeps its Selected Endpoint while it is still
    /// advertised (or was learned from the peer and the link is up), otherwise it moves to the
    /// first; peers not listed are forgotten. Returns the endpoints to apply.
    pub fn set_advertised(
        &mut self,
        now: SystemTime,
        peers: &[PeerAdvertisement],
    ) -> Vec<EndpointChange> {
        let mut changes = Vec::new();
        self.peers
            .retain(|key, _| peers.iter().any(|p| p.public_key == *key));
        for peer in peers {
            let change = |endpoint, reason| EndpointChange {
                public_key: peer.public_key.clone(),
                endpoint,
                reason,
            };
            match self.peers.get_mut(&peer.public_key) {
                None => {
                    let first = peer.endpoints.first().copied();
                    self.peers.insert(
                        peer.public_key.clone(),
                        PeerState {
                            advertised: peer.endpoints.clone(),
                            selected: first,
                            learned: false,
                            changed_at: now,
                            status: LinkStatus::Unknown,
                            since: now,
                            last_handshake: None,
                            membership_up: false,
                        },
                    );
                    if let Some(first) = first {
                        changes.push(change(first, ChangeReason::Initial));
                    }
                }
                Some(state) => {
                    state.advertised = peer.endpoints.clone();
                    let keep = match state.selected {
                        Some(s) => {
                            state.advertised.contains(&s)
                                || (state.learned && state.status == LinkStatus::Up)
                        }
                        None => state.advertised.is_empty(),
                    };
                    if !keep {
                        let first = state.advertised.first().copied();
                        if let Some(first) = first {
                            state.select(Some(first), false, now);
                            changes.push(change(first, ChangeReason::Readvertised));
                        }
                    }
                }
            }
        }
        changes
    }

    /// What membership observes of a peer (`up`: gossip reaches it through the mesh). A hint:
    /// while a peer is observed up its Selected Endpoint evidently works and is never rotated
    /// away; the link status itself still comes from WireGuard's handshakes.
    pub fn set_membership_up(&mut self, public_key: &str, up: bool) {
        if let Some(state) = self.peers.get_mut(public_key) {
            state.membership_up = up;
        }
    }

    /// Advances every peer's state to `now` with WireGuard's latest `stats` (wall-clock time, as
    /// WireGuard reports handshakes in it; the daemon calls this once a second with
    /// `SystemTime::now()`). Returns the Selected Endpoints to apply.
    pub fn tick(&mut self, now: SystemTime, stats: &[PeerStats]) -> Vec<EndpointChange> {
        let mut changes = Vec::new();
        for (key, state) in &mut self.peers {
            let stat = stats.iter().find(|s| s.public_key == *key);
            state.last_handshake = stat.and_then(|s| s.last_handshake);

            let fresh_handshake = state.last_handshake.filter(|h| {
                *h >= state.changed_at
                    && now.duration_since(*h).unwrap_or(Duration::ZERO) <= ESTABLISHED_TIMEOUT
            });
            if let (Some(reported), Some(_)) = (stat.and_then(|s| s.endpoint), fresh_handshake) {
                if state.selected != Some(reported) {
                    state.selected = Some(reported);
                    state.learned = true;
                    changes.push(EndpointChange {
                        public_key: key.clone(),
                        endpoint: reported,
                        reason: ChangeReason::Learned,
                    });
                }
            }

            let status = state.judge(now);
            state.set_status(status, now);
            if status == LinkStatus::Down && !state.membership_up {
                if let Some(next) = state.next_endpoint() {
                    if state.selected != Some(next) {
                        state.select(Some(next), false, now);
                        changes.push(EndpointChange {
                            public_key: key.clone(),
                            endpoint: next,
                            reason: ChangeReason::Rotated,
                        });
                    }
                }
            }
        }
        changes
    }

    /// A peer's Selected Endpoint.
    pub fn selected(&self, public_key: &str) -> Option<SocketAddr> {
        self.peers.get(public_key).and_then(|s| s.selected)
    }

    /// Every peer's state, ordered by public key, for `ployz wg show`.
    pub fn peers(&self) -> Vec<PeerEndpoint> {
        self.peers
            .iter()
            .map(|(key, s)| PeerEndpoint {
                public_key: key.clone(),
                selected: s.selected,
                learned: s.learned,
                status: s.status,
                since: s.since,
                last_handshake: s.last_handshake,
                advertised: s.advertised.clone(),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000 + seconds)
    }

    fn addr(interface: &str, address: &str, up: bool) -> InterfaceAddress {
        InterfaceAddress {
            interface: interface.into(),
            address: address.parse().unwrap(),
            up,
        }
    }

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn advertised_endpoints_skip_what_cannot_reach_this_machine() {
        let interfaces = [
            addr("lo", "127.0.0.1", true),
            addr("eth0", "198.18.0.2", true),
            addr("eth0", "fe80::1", true),
            addr("eth0", "2001:db8::2", true),
            addr("eth1", "192.168.1.5", false),
            addr("eth2", "169.254.3.3", true),
            addr("docker0", "172.17.0.1", true),
            addr("br-1234", "172.18.0.1", true),
            addr("veth99", "10.0.0.9", true),
            addr("ployz0", "fdcc::1", true),
            addr("eth3", "fdcc::5", true),
            addr("eth4", "10.1.2.3", true),
        ];
        let endpoints = advertised_endpoints(
            &interfaces,
            "ployz0",
            &[
                "203.0.113.7".parse().unwrap(),
                "198.18.0.2".parse().unwrap(),
            ],
            &[sa("203.0.113.9:4000"), sa("203.0.113.9:4000")],
            51820,
        );
        assert_eq!(
            endpoints,
            vec![
                sa("203.0.113.9:4000"),
                sa("203.0.113.7:51820"),
                sa("198.18.0.2:51820"),
                sa("[2001:db8::2]:51820"),
                sa("10.1.2.3:51820"),
            ]
        );
    }

    #[test]
    fn interface_addresses_are_read_from_this_namespace() {
        let addresses = interface_addresses().unwrap();
        assert!(
            addresses
                .iter()
                .any(|a| a.interface == "lo" && a.address == IpAddr::from([127, 0, 0, 1]) && a.up),
            "{addresses:?}"
        );
    }

    fn stats(key: &str, endpoint: &str, handshake: Option<SystemTime>) -> PeerStats {
        PeerStats {
            public_key: key.into(),
            endpoint: Some(sa(endpoint)),
            last_handshake: handshake,
            rx_bytes: 0,
            tx_bytes: 0,
        }
    }

    fn advertise(key: &str, endpoints: &[&str]) -> PeerAdvertisement {
        PeerAdvertisement {
            public_key: key.into(),
            endpoints: endpoints.iter().map(|e| sa(e)).collect(),
        }
    }

    fn status(selector: &EndpointSelector, key: &str) -> LinkStatus {
        selector
            .peers()
            .into_iter()
            .find(|p| p.public_key == key)
            .unwrap()
            .status
    }

    #[test]
    fn a_peer_starts_unknown_on_its_first_endpoint_and_comes_up_with_a_handshake() {
        let mut s = EndpointSelector::new();
        let changes = s.set_advertised(
            at(0),
            &[advertise("A", &["198.18.0.2:51820", "198.18.0.3:51820"])],
        );
        assert_eq!(
            changes,
            vec![EndpointChange {
                public_key: "A".into(),
                endpoint: sa("198.18.0.2:51820"),
                reason: ChangeReason::Initial,
            }]
        );
        assert!(s
            .tick(at(1), &[stats("A", "198.18.0.2:51820", None)])
            .is_empty());
        assert_eq!(status(&s, "A"), LinkStatus::Unknown);
        assert!(s
            .tick(at(3), &[stats("A", "198.18.0.2:51820", Some(at(2)))])
            .is_empty());
        assert_eq!(status(&s, "A"), LinkStatus::Up);
        let view = &s.peers()[0];
        assert_eq!(view.since, at(3));
        assert_eq!(view.last_handshake, Some(at(2)));
        // Handshakes keep coming: it stays up, nothing changes.
        assert!(s
            .tick(at(200), &[stats("A", "198.18.0.2:51820", Some(at(190)))])
            .is_empty());
        assert_eq!(status(&s, "A"), LinkStatus::Up);
        assert_eq!(s.peers()[0].since, at(3));
    }

    #[test]
    fn no_handshake_15_s_after_a_change_is_down_and_rotates() {
        let mut s = EndpointSelector::new();
        s.set_advertised(
            at(0),
            &[advertise("A", &["198.18.0.2:51820", "198.18.0.3:51820"])],
        );
        assert!(s
            .tick(at(14), &[stats("A", "198.18.0.2:51820", None)])
            .is_empty());
        assert_eq!(status(&s, "A"), LinkStatus::Unknown);
        let changes = s.tick(at(15), &[stats("A", "198.18.0.2:51820", None)]);
        assert_eq!(
            changes,
            vec![EndpointChange {
                public_key: "A".into(),
                endpoint: sa("198.18.0.3:51820"),
                reason: ChangeReason::Rotated,
            }]
        );
        // After the rotation it is unknown again for 15 s, then rotates back to the first.
        assert_eq!(status(&s, "A"), LinkStatus::Unknown);
        assert!(s
            .tick(at(29), &[stats("A", "198.18.0.3:51820", None)])
            .is_empty());
        let changes = s.tick(at(30), &[stats("A", "198.18.0.3:51820", None)]);
        assert_eq!(changes[0].endpoint, sa("198.18.0.2:51820"));
        assert_eq!(s.selected("A"), Some(sa("198.18.0.2:51820")));
    }

    #[test]
    fn an_established_link_is_down_after_275_s_without_handshake() {
        let mut s = EndpointSelector::new();
        s.set_advertised(
            at(0),
            &[advertise("A", &["198.18.0.2:51820", "198.18.0.3:51820"])],
        );
        s.tick(at(5), &[stats("A", "198.18.0.2:51820", Some(at(5)))]);
        assert_eq!(status(&s, "A"), LinkStatus::Up);
        assert!(s
            .tick(at(280), &[stats("A", "198.18.0.2:51820", Some(at(5)))])
            .is_empty());
        assert_eq!(status(&s, "A"), LinkStatus::Up);
        let changes = s.tick(at(281), &[stats("A", "198.18.0.2:51820", Some(at(5)))]);
        assert_eq!(changes.len(), 1);
        assert_eq!(changes[0].reason, ChangeReason::Rotated);
        assert_eq!(changes[0].endpoint, sa("198.18.0.3:51820"));
    }

    #[test]
    fn a_single_endpoint_stays_down_without_churn() {
        let mut s = EndpointSelector::new();
        s.set_advertised(at(0), &[advertise("A", &["198.18.0.2:51820"])]);
        assert!(s.tick(at(20), &[]).is_empty());
        assert_eq!(status(&s, "A"), LinkStatus::Down);
        assert_eq!(s.peers()[0].since, at(20));
        assert!(s.tick(at(40), &[]).is_empty());
        assert_eq!(s.peers()[0].since, at(20));
        // A late handshake brings it up.
        s.tick(at(41), &[stats("A", "198.18.0.2:51820", Some(at(41)))]);
        assert_eq!(status(&s, "A"), LinkStatus::Up);
    }

    #[test]
    fn an_endpoint_learned_from_the_peer_is_adopted() {
        let mut s = EndpointSelector::new();
        s.set_advertised(at(0), &[advertise("A", &["198.18.0.2:51820"])]);
        // The peer reached us from behind a NAT: WireGuard now sends to where it came from.
        let changes = s.tick(at(3), &[stats("A", "203.0.113.50:40000", Some(at(2)))]);
        assert_eq!(
            changes,
            vec![EndpointChange {
                public_key: "A".into(),
                endpoint: sa("203.0.113.50:40000"),
                reason: ChangeReason::Learned,
            }]
        );
        assert_eq!(status(&s, "A"), LinkStatus::Up);
        assert!(s.peers()[0].learned);
        // A stale handshake from before a change is not a reason to adopt anything.
        let mut s = EndpointSelector::new();
        s.set_advertised(at(100), &[advertise("A", &["198.18.0.2:51820"])]);
        assert!(s
            .tick(at(101), &[stats("A", "203.0.113.50:40000", Some(at(50)))])
            .is_empty());
        // Re-advertising the same list keeps the learned endpoint while the link is up.
        let mut s = EndpointSelector::new();
        s.set_advertised(at(0), &[advertise("A", &["198.18.0.2:51820"])]);
        s.tick(at(3), &[stats("A", "203.0.113.50:40000", Some(at(2)))]);
        assert!(s
            .set_advertised(at(4), &[advertise("A", &["198.18.0.2:51820"])])
            .is_empty());
        assert_eq!(s.selected("A"), Some(sa("203.0.113.50:40000")));
    }

    #[test]
    fn a_peer_without_endpoints_waits_and_adopts_what_reaches_it() {
        let mut s = EndpointSelector::new();
        assert!(s.set_advertised(at(0), &[advertise("A", &[])]).is_empty());
        assert_eq!(s.selected("A"), None);
        let changes = s.tick(at(2), &[stats("A", "198.18.0.9:51820", Some(at(1)))]);
        assert_eq!(changes[0].reason, ChangeReason::Learned);
        assert_eq!(s.selected("A"), Some(sa("198.18.0.9:51820")));
    }

    #[test]
    fn readvertising_keeps_a_listed_endpoint_and_moves_off_an_unlisted_one() {
        let mut s = EndpointSelector::new();
        s.set_advertised(
            at(0),
            &[advertise("A", &["198.18.0.2:51820", "198.18.0.3:51820"])],
        );
        s.tick(at(15), &[]);
        assert_eq!(s.selected("A"), Some(sa("198.18.0.3:51820")));
        assert!(s
            .set_advertised(
                at(16),
                &[advertise("A", &["198.18.0.7:51820", "198.18.0.3:51820"])]
            )
            .is_empty());
        let changes = s.set_advertised(at(17), &[advertise("A", &["198.18.0.7:51820"])]);
        assert_eq!(changes[0].reason, ChangeReason::Readvertised);
        assert_eq!(changes[0].endpoint, sa("198.18.0.7:51820"));
        assert_eq!(status(&s, "A"), LinkStatus::Unknown);
        // Peers no longer listed are forgotten.
        s.set_advertised(at(18), &[]);
        assert!(s.peers().is_empty());
    }

    #[test]
    fn membership_up_keeps_the_endpoint_from_rotating() {
        let mut s = EndpointSelector::new();
        s.set_advertised(
            at(0),
            &[advertise("A", &["198.18.0.2:51820", "198.18.0.3:51820"])],
        );
        s.set_membership_up("A", true);
        assert!(s.tick(at(20), &[]).is_empty());
        assert_eq!(status(&s, "A"), LinkStatus::Down);
        assert_eq!(s.selected("A"), Some(sa("198.18.0.2:51820")));
        s.set_membership_up("A", false);
        assert_eq!(s.tick(at(21), &[])[0].reason, ChangeReason::Rotated);
    }
}
