//! The cross-platform WireGuard configuration protocol (the text `wg(8)` and
//! `defguard_wireguard_rs` speak to userspace devices): parsing a `set` request whole before any
//! of it is applied, and writing a `get` answer.
//!
//! A `set` request that fails to parse changes nothing; the errno names the kind of failure as
//! the protocol expects (`EINVAL` for a bad value, `EPROTO` for a line that is not `key=value`).

use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};

/// A parsed `set=1` request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SetRequest {
    pub private_key: Option<[u8; 32]>,
    pub listen_port: Option<u16>,
    /// `Some(0)` clears the mark.
    pub fwmark: Option<u32>,
    pub replace_peers: bool,
    pub peers: Vec<PeerSet>,
}

/// One peer section of a `set` request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerSet {
    pub public_key: [u8; 32],
    pub remove: bool,
    pub update_only: bool,
    /// `Some([0; 32])` clears it.
    pub preshared_key: Option<[u8; 32]>,
    pub endpoint: Option<SocketAddr>,
    /// `Some(0)` turns it off.
    pub keepalive: Option<u16>,
    pub replace_allowed_ips: bool,
    pub allowed_ips: Vec<(IpAddr, u8)>,
}

impl PeerSet {
    fn new(public_key: [u8; 32]) -> PeerSet {
        PeerSet {
            public_key,
            remove: false,
            update_only: false,
            preshared_key: None,
            endpoint: None,
            keepalive: None,
            replace_allowed_ips: false,
            allowed_ips: Vec::new(),
        }
    }
}

/// Parses the lines of a `set` request after `set=1` (an empty line, or the end, ends it).
pub fn parse_set(body: &str) -> Result<SetRequest, i32> {
    let mut request = SetRequest::default();
    for line in body.lines() {
        if line.is_empty() {
            break;
        }
        if line == "set=1" {
            continue;
        }
        let (key, value) = line.split_once('=').ok_or(libc::EPROTO)?;
        match (key, request.peers.last_mut()) {
            ("private_key", None) => request.private_key = Some(parse_key(value)?),
            ("listen_port", None) => request.listen_port = Some(parse(value)?),
            ("fwmark", None) => request.fwmark = Some(parse(value)?),
            ("replace_peers", None) => request.replace_peers = parse_bool(value)?,
            ("public_key", _) => request.peers.push(PeerSet::new(parse_key(value)?)),
            ("remove", Some(peer)) => peer.remove = parse_bool(value)?,
            ("update_only", Some(peer)) => peer.update_only = parse_bool(value)?,
            ("preshared_key", Some(peer)) => peer.preshared_key = Some(parse_key(value)?),
            ("endpoint", Some(peer)) => peer.endpoint = Some(parse_endpoint(value)?),
            ("persistent_keepalive_interval", Some(peer)) => peer.keepalive = Some(parse(value)?),
            ("replace_allowed_ips", Some(peer)) => peer.replace_allowed_ips = parse_bool(value)?,
            ("allowed_ip", Some(peer)) => peer.allowed_ips.push(parse_allowed_ip(value)?),
            ("protocol_version", Some(_)) if value == "1" => {}
            _ => return Err(libc::EINVAL),
        }
    }
    Ok(request)
}

/// Appends `key=value` and a newline.
pub fn line(out: &mut String, key: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "{key}={value}");
}

/// The lowercase hex form keys take in the protocol.
pub fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    for byte in bytes {
        let _ = write!(out, "{byte:02x}");
    }
    out
}

fn parse<T: std::str::FromStr>(value: &str) -> Result<T, i32> {
    value.parse().map_err(|_| libc::EINVAL)
}

fn parse_bool(value: &str) -> Result<bool, i32> {
    match value {
        "true" => Ok(true),
        "false" => Ok(false),
        _ => Err(libc::EINVAL),
    }
}

fn parse_key(value: &str) -> Result<[u8; 32], i32> {
    let bytes = value.as_bytes();
    if bytes.len() != 64 {
        return Err(libc::EINVAL);
    }
    let mut key = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let digit = |c: u8| (c as char).to_digit(16).ok_or(libc::EINVAL);
        key[i] = (digit(pair[0])? * 16 + digit(pair[1])?) as u8;
    }
    Ok(key)
}

/// `1.2.3.4:51820` or `[fd00::1]:51820`.
fn parse_endpoint(value: &str) -> Result<SocketAddr, i32> {
    value.parse().map_err(|_| libc::EINVAL)
}

fn parse_allowed_ip(value: &str) -> Result<(IpAddr, u8), i32> {
    let (addr, cidr) = match value.split_once('/') {
        Some((addr, cidr)) => (parse::<IpAddr>(addr)?, Some(parse::<u8>(cidr)?)),
        None => (parse::<IpAddr>(value)?, None),
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    let cidr = cidr.unwrap_or(max);
    if cidr > max {
        return Err(libc::EINVAL);
    }
    Ok((addr, cidr))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "0101010101010101010101010101010101010101010101010101010101010101";
    const KEY_B: &str = "ab02030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1fff";

    #[test]
    fn a_request_as_defguard_writes_it_parses_whole() {
        let body = format!(
            "set=1\nlisten_port=51820\nprivate_key={KEY_A}\nreplace_peers=true\n\
             public_key={KEY_B}\nendpoint=[fd00::2]:51821\npersistent_keepalive_interval=25\n\
             replace_allowed_ips=true\nallowed_ip=fd00::2/128\nallowed_ip=10.210.1.0/24\n\n"
        );
        let request = parse_set(&body).unwrap();
        assert_eq!(request.listen_port, Some(51820));
        assert_eq!(request.private_key, Some([1; 32]));
        assert!(request.replace_peers);
        assert_eq!(request.peers.len(), 1);
        let peer = &request.peers[0];
        assert_eq!(peer.public_key[0], 0xab);
        assert_eq!(peer.public_key[31], 0xff);
        assert_eq!(peer.endpoint, Some("[fd00::2]:51821".parse().unwrap()));
        assert_eq!(peer.keepalive, Some(25));
        assert!(peer.replace_allowed_ips);
        assert_eq!(
            peer.allowed_ips,
            vec![
                ("fd00::2".parse().unwrap(), 128),
                ("10.210.1.0".parse().unwrap(), 24)
            ]
        );
        assert_eq!(hex(&peer.public_key), KEY_B);
    }

    #[test]
    fn several_peers_and_a_removal() {
        let body =
            format!("public_key={KEY_A}\nremove=true\npublic_key={KEY_B}\nallowed_ip=10.0.0.1\n");
        let request = parse_set(&body).unwrap();
        assert_eq!(request.peers.len(), 2);
        assert!(request.peers[0].remove);
        assert!(!request.peers[1].remove);
        assert_eq!(
            request.peers[1].allowed_ips,
            vec![("10.0.0.1".parse().unwrap(), 32)]
        );
    }

    #[test]
    fn bad_values_are_refused_before_anything_applies() {
        for body in [
            "listen_port=70000".to_owned(),
            "private_key=zz".to_owned(),
            format!("private_key={}", &KEY_A[..62]),
            format!("public_key={KEY_A}\nallowed_ip=10.0.0.0/33"),
            format!("public_key={KEY_A}\nallowed_ip=fd00::/129"),
            format!("public_key={KEY_A}\nendpoint=nowhere"),
            format!("public_key={KEY_A}\nremove=yes"),
            format!("public_key={KEY_A}\nprotocol_version=2"),
            // A peer key before any peer section, and a device key inside one.
            "endpoint=1.2.3.4:5".to_owned(),
            format!("public_key={KEY_A}\nlisten_port=1"),
            "unknown=1".to_owned(),
        ] {
            assert_eq!(parse_set(&body), Err(libc::EINVAL), "{body}");
        }
        assert_eq!(parse_set("no equals sign"), Err(libc::EPROTO));
    }
}
