//! This Machine's public addresses: given with `--public-ip`, or detected from its interfaces.

use std::net::IpAddr;

/// Whether an address can be reached from the internet: not loopback, link-local, private
/// (RFC 1918, unique local), shared (100.64/10), documentation or unspecified.
pub fn is_public(addr: &IpAddr) -> bool {
    match addr {
        IpAddr::V4(a) => {
            let o = a.octets();
            !(a.is_loopback()
                || a.is_private()
                || a.is_link_local()
                || a.is_unspecified()
                || a.is_broadcast()
                || a.is_documentation()
                || a.is_multicast()
                || (o[0] == 100 && (o[1] & 0xc0) == 64))
        }
        IpAddr::V6(a) => {
            let s = a.segments();
            !(a.is_loopback()
                || a.is_unspecified()
                || a.is_multicast()
                || (s[0] & 0xfe00) == 0xfc00
                || (s[0] & 0xffc0) == 0xfe80
                || s[0] == 0x2001 && s[1] == 0x0db8)
        }
    }
}

/// The public addresses on this Machine's interfaces, sorted, without duplicates.
pub fn detect() -> Vec<IpAddr> {
    let mut found = interface_addresses()
        .into_iter()
        .filter(is_public)
        .collect::<Vec<_>>();
    found.sort();
    found.dedup();
    found
}

/// Every address on this Machine's interfaces (`getifaddrs`); none when they cannot be listed.
pub fn interface_addresses() -> Vec<IpAddr> {
    let interfaces = match nix::ifaddrs::getifaddrs() {
        Ok(interfaces) => interfaces,
        Err(e) => {
            tracing::warn!(error = %e, "cannot list this Machine's interface addresses");
            return Vec::new();
        }
    };
    interfaces
        .filter_map(|interface| {
            let address = interface.address?;
            if let Some(v4) = address.as_sockaddr_in() {
                Some(IpAddr::V4(v4.ip()))
            } else {
                address.as_sockaddr_in6().map(|v6| IpAddr::V6(v6.ip()))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_internet_reachable_addresses_are_public() {
        for public in ["203.0.114.7", "8.8.8.8", "2a01:4f8::1", "100.128.0.1"] {
            assert!(is_public(&public.parse().unwrap()), "{public}");
        }
        for private in [
            "127.0.0.1",
            "10.210.0.1",
            "172.17.0.1",
            "192.168.1.2",
            "169.254.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "2001:db8::1",
            "192.0.2.1",
        ] {
            assert!(!is_public(&private.parse().unwrap()), "{private}");
        }
    }

    #[test]
    fn detection_reads_the_interfaces_and_keeps_only_public_ones() {
        // Loopback is always there and never public.
        assert!(interface_addresses().contains(&"127.0.0.1".parse().unwrap()));
        assert!(detect().iter().all(is_public));
    }
}
