//! Addresses a Machine holds: the Cluster network, Machine Subnets, the Machine Gateway and the
//! Management Address.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The Cluster network Machine Subnets are carved from unless told otherwise.
pub const DEFAULT_CLUSTER_NETWORK: &str = "10.210.0.0/16";

/// Why an address text or allocation is not usable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NetworkError {
    #[error("'{value}' is not an IPv4 network in CIDR form such as 10.210.0.0/16")]
    NotCidr { value: String },
    #[error("cluster network '{value}' must have a prefix between /8 and /24, it has /{prefix}")]
    BadClusterPrefix { value: String, prefix: u8 },
    #[error("'{value}' has host bits set; did you mean {network}?")]
    HostBitsSet { value: String, network: String },
    #[error("Machine Subnet '{value}' must be a /24")]
    NotSlash24 { value: String },
    #[error("every /24 of {network} is taken; choose a larger cluster network")]
    Exhausted { network: String },
}

fn parse_cidr(value: &str) -> Result<(Ipv4Addr, u8), NetworkError> {
    let not_cidr = || NetworkError::NotCidr {
        value: value.to_owned(),
    };
    let (addr, prefix) = value.split_once('/').ok_or_else(not_cidr)?;
    let addr: Ipv4Addr = addr.parse().map_err(|_| not_cidr())?;
    let prefix: u8 = prefix.parse().map_err(|_| not_cidr())?;
    if prefix > 32 {
        return Err(not_cidr());
    }
    let mask = if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    };
    let network = Ipv4Addr::from(u32::from(addr) & mask);
    if network != addr {
        return Err(NetworkError::HostBitsSet {
            value: value.to_owned(),
            network: format!("{network}/{prefix}"),
        });
    }
    Ok((addr, prefix))
}

/// The IPv4 range every Machine Subnet of a Cluster is carved from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ClusterNetwork {
    base: Ipv4Addr,
    prefix: u8,
}

impl ClusterNetwork {
    /// The first /24 inside this network that no Machine Subnet in `taken` occupies. This is an
    /// optimistic choice: another Machine choosing concurrently may pick the same one.
    pub fn first_free_subnet(
        &self,
        taken: &[MachineSubnet],
    ) -> Result<MachineSubnet, NetworkError> {
        let count = 1u32 << (24 - self.prefix);
        let base = u32::from(self.base);
        (0..count)
            .map(|i| MachineSubnet {
                base: Ipv4Addr::from(base + (i << 8)),
            })
            .find(|candidate| !taken.contains(candidate))
            .ok_or_else(|| NetworkError::Exhausted {
                network: self.to_string(),
            })
    }

    /// Whether a Machine Subnet lies inside this network.
    pub fn contains(&self, subnet: &MachineSubnet) -> bool {
        let mask = u32::MAX << (32 - self.prefix);
        u32::from(subnet.base) & mask == u32::from(self.base)
    }
}

impl Default for ClusterNetwork {
    fn default() -> Self {
        DEFAULT_CLUSTER_NETWORK
            .parse()
            .expect("the default is valid")
    }
}

impl FromStr for ClusterNetwork {
    type Err = NetworkError;
    fn from_str(s: &str) -> Result<Self, NetworkError> {
        let (base, prefix) = parse_cidr(s)?;
        if !(8..=24).contains(&prefix) {
            return Err(NetworkError::BadClusterPrefix {
                value: s.to_owned(),
                prefix,
            });
        }
        Ok(ClusterNetwork { base, prefix })
    }
}

impl TryFrom<String> for ClusterNetwork {
    type Error = NetworkError;
    fn try_from(s: String) -> Result<Self, NetworkError> {
        s.parse()
    }
}

impl From<ClusterNetwork> for String {
    fn from(n: ClusterNetwork) -> String {
        n.to_string()
    }
}

impl fmt::Display for ClusterNetwork {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.base, self.prefix)
    }
}

/// The IPv4 /24 locally selected for one Machine's containers. It is an optimistic allocation
/// and may overlap another Machine Subnet after concurrent changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct MachineSubnet {
    base: Ipv4Addr,
}

impl MachineSubnet {
    /// The Machine Gateway: the `.1` address of the subnet, held by the Machine's Docker bridge.
    pub fn gateway(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.base) + 1)
    }

    /// Whether an address lies inside this subnet.
    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        u32::from(addr) & 0xffff_ff00 == u32::from(self.base)
    }

    /// The network address (`.0`).
    pub fn network(&self) -> Ipv4Addr {
        self.base
    }
}

impl FromStr for MachineSubnet {
    type Err = NetworkError;
    fn from_str(s: &str) -> Result<Self, NetworkError> {
        let (base, prefix) = parse_cidr(s)?;
        if prefix != 24 {
            return Err(NetworkError::NotSlash24 {
                value: s.to_owned(),
            });
        }
        Ok(MachineSubnet { base })
    }
}

impl TryFrom<String> for MachineSubnet {
    type Error = NetworkError;
    fn try_from(s: String) -> Result<Self, NetworkError> {
        s.parse()
    }
}

impl From<MachineSubnet> for String {
    fn from(n: MachineSubnet) -> String {
        n.to_string()
    }
}

impl fmt::Display for MachineSubnet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/24", self.base)
    }
}

/// The address that reaches a Machine's management plane over the mesh: `fdcc::/16` followed by
/// the first 14 bytes of the Machine's WireGuard public key, as a /128.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ManagementAddress(Ipv6Addr);

impl ManagementAddress {
    /// The Management Address derived from a WireGuard public key.
    pub fn from_public_key(public_key: &[u8; 32]) -> Self {
        let mut octets = [0u8; 16];
        octets[0] = 0xfd;
        octets[1] = 0xcc;
        octets[2..].copy_from_slice(&public_key[..14]);
        ManagementAddress(Ipv6Addr::from(octets))
    }

    /// The address itself.
    pub fn addr(&self) -> Ipv6Addr {
        self.0
    }
}

impl fmt::Display for ManagementAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_machine_gets_the_first_slash_24() {
        let net = ClusterNetwork::default();
        let s = net.first_free_subnet(&[]).unwrap();
        assert_eq!(s.to_string(), "10.210.0.0/24");
        assert_eq!(s.gateway(), Ipv4Addr::new(10, 210, 0, 1));
        let next = net.first_free_subnet(&[s]).unwrap();
        assert_eq!(next.to_string(), "10.210.1.0/24");
        assert!(net.contains(&next));
        assert!(next.contains(Ipv4Addr::new(10, 210, 1, 77)));
        assert!(!next.contains(Ipv4Addr::new(10, 210, 2, 1)));
    }

    #[test]
    fn a_full_network_is_reported() {
        let net: ClusterNetwork = "10.0.0.0/23".parse().unwrap();
        let a = net.first_free_subnet(&[]).unwrap();
        let b = net.first_free_subnet(&[a]).unwrap();
        let err = net.first_free_subnet(&[a, b]).unwrap_err();
        assert!(err
            .to_string()
            .contains("every /24 of 10.0.0.0/23 is taken"));
    }

    #[test]
    fn bad_networks_say_what_to_write() {
        assert!(matches!(
            "10.210.0.1/16".parse::<ClusterNetwork>(),
            Err(NetworkError::HostBitsSet { .. })
        ));
        assert!("10.210.0.0".parse::<ClusterNetwork>().is_err());
        assert!("10.0.0.0/4".parse::<ClusterNetwork>().is_err());
        assert!("10.210.0.0/25".parse::<MachineSubnet>().is_err());
    }

    #[test]
    fn management_address_comes_from_the_public_key() {
        let mut key = [0u8; 32];
        for (i, b) in key.iter_mut().enumerate() {
            *b = i as u8 + 1;
        }
        let addr = ManagementAddress::from_public_key(&key);
        assert_eq!(addr.to_string(), "fdcc:102:304:506:708:90a:b0c:d0e");
    }
}
