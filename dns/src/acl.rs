//! Who may ask: the server answers only sources inside configured networks, so it is never an
//! open resolver.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

pub use ipnet::IpNet;
use ipnet::{Ipv4Net, Ipv6Net};
use ployz_core::MachineSubnet;

/// The networks whose hosts may query the server. Queries from anywhere else get REFUSED.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AllowedSources {
    networks: Vec<IpNet>,
}

impl AllowedSources {
    /// Exactly these networks (none: every query is refused).
    pub fn new(networks: impl IntoIterator<Item = IpNet>) -> AllowedSources {
        AllowedSources {
            networks: networks.into_iter().collect(),
        }
    }

    /// The loopback networks, `127.0.0.0/8` and `::1/128`.
    pub fn loopback() -> AllowedSources {
        AllowedSources::new([
            IpNet::V4(Ipv4Net::new(Ipv4Addr::new(127, 0, 0, 0), 8).expect("valid prefix")),
            IpNet::V6(Ipv6Net::new(Ipv6Addr::LOCALHOST, 128).expect("valid prefix")),
        ])
    }

    /// These networks and `network`.
    pub fn with(mut self, network: IpNet) -> AllowedSources {
        self.networks.push(network);
        self
    }

    /// These networks and a Machine Subnet (the Machine's containers).
    pub fn with_machine_subnet(self, subnet: MachineSubnet) -> AllowedSources {
        self.with(IpNet::V4(
            Ipv4Net::new(subnet.network(), 24).expect("a /24 is a valid prefix"),
        ))
    }

    /// The allowed networks.
    pub fn networks(&self) -> &[IpNet] {
        &self.networks
    }

    /// Whether `source` lies in an allowed network. An IPv4-mapped IPv6 source (a dual-stack
    /// socket's view of an IPv4 client) is matched as the IPv4 address it is.
    pub fn allows(&self, source: IpAddr) -> bool {
        let source = source.to_canonical();
        self.networks.iter().any(|n| n.contains(&source))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_by_network_and_family() {
        let acl = AllowedSources::loopback().with("10.210.3.0/24".parse().unwrap());
        assert!(acl.allows("127.0.0.1".parse().unwrap()));
        assert!(acl.allows("127.9.9.9".parse().unwrap()));
        assert!(acl.allows("::1".parse().unwrap()));
        assert!(acl.allows("10.210.3.77".parse().unwrap()));
        assert!(acl.allows("::ffff:10.210.3.77".parse().unwrap()));
        assert!(!acl.allows("10.210.4.1".parse().unwrap()));
        assert!(!acl.allows("::2".parse().unwrap()));
        assert!(!AllowedSources::default().allows("127.0.0.1".parse().unwrap()));
        let subnet = "10.210.7.0/24".parse().unwrap();
        let acl = AllowedSources::default().with_machine_subnet(subnet);
        assert!(acl.allows("10.210.7.1".parse().unwrap()));
        assert!(acl.allows("10.210.7.254".parse().unwrap()));
        assert!(!acl.allows("10.210.8.1".parse().unwrap()));
    }

    #[test]
    fn ipv6_networks_match_ipv6_sources() {
        let acl = AllowedSources::new(["fdcc::/16".parse().unwrap()]);
        assert!(acl.allows("fdcc:1234::9".parse().unwrap()));
        assert!(!acl.allows("fdcd::9".parse().unwrap()));
        assert!(!acl.allows("10.0.0.1".parse().unwrap()));
    }
}
