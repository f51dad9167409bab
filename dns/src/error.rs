//! What can go wrong when starting the DNS server or loading its inputs.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;

use crate::zone::ZoneError;

/// Why the DNS server could not start, or an input could not be read.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DnsError {
    /// Another program holds the port.
    #[error(
        "cannot serve DNS on {addr} ({protocol}): the address is already in use. Usually \
         systemd-resolved or dnsmasq (libvirt's, NetworkManager's) listens on 0.0.0.0:53 or on \
         {addr}; `ss -lunpt 'sport = :{port}'` shows which program. Free the port: for \
         systemd-resolved set DNSStubListener=no (or leave only its 127.0.0.53 stub) in \
         /etc/systemd/resolved.conf and restart it; for dnsmasq add bind-interfaces and \
         listen-address=127.0.0.1 (or except-interface for the container bridge); then start \
         the daemon again"
    )]
    AddressInUse {
        /// The address asked for.
        addr: SocketAddr,
        /// `UDP` or `TCP`.
        protocol: &'static str,
        /// The port, for the `ss` hint.
        port: u16,
    },
    /// A privileged port without the privilege.
    #[error(
        "cannot serve DNS on {addr}: permission denied; ports below 1024 need root or \
         CAP_NET_BIND_SERVICE"
    )]
    PermissionDenied {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// The address is on no interface.
    #[error(
        "cannot serve DNS on {addr}: no interface has this address (is the Machine's container \
         network up?)"
    )]
    AddressNotAvailable {
        /// The address asked for.
        addr: SocketAddr,
    },
    /// Any other socket failure.
    #[error("cannot serve DNS on {addr} ({protocol}): {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// `UDP` or `TCP`.
        protocol: &'static str,
        /// What the system said.
        source: io::Error,
    },
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the system said.
        source: io::Error,
    },
    /// A zone file could not be parsed.
    #[error("{path}: {source}")]
    Zone {
        /// The file.
        path: PathBuf,
        /// The line that could not be used.
        source: ZoneError,
    },
}

impl DnsError {
    /// The error for a failed bind of `addr`, named for what usually causes it.
    pub(crate) fn bind(addr: SocketAddr, protocol: &'static str, source: io::Error) -> DnsError {
        match source.kind() {
            io::ErrorKind::AddrInUse => DnsError::AddressInUse {
                addr,
                protocol,
                port: addr.port(),
            },
            io::ErrorKind::PermissionDenied => DnsError::PermissionDenied { addr },
            io::ErrorKind::AddrNotAvailable => DnsError::AddressNotAvailable { addr },
            _ => DnsError::Bind {
                addr,
                protocol,
                source,
            },
        }
    }
}
