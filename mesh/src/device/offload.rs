//! Segmentation and coalescing for the TUN device's virtio offloads.
//!
//! The TUN device is opened with `IFF_VNET_HDR` and `TUNSETOFFLOAD(TUN_F_CSUM | TUN_F_TSO4 |
//! TUN_F_TSO6)`, so every read and every write on it starts with a 10-byte
//! `struct virtio_net_hdr` describing the IP packet that follows. This lets the kernel hand us
//! TCP "super-packets" of up to 64 KiB with an unfinished checksum (TSO), and lets us hand it
//! the same (GRO), which moves bulk data with far fewer system calls and far less per-packet
//! work in the kernel's TCP stack.
//!
//! - Outbound, [`segment`] cuts a packet read from the device into the wire-sized TCP segments
//!   the kernel would otherwise have sent itself, each a complete IP packet with valid
//!   checksums: the peer may be kernel WireGuard or another implementation that writes them to
//!   a TUN device without offloads.
//! - Inbound, [`Coalescer`] joins consecutive TCP segments of one flow, as decrypted from the
//!   tunnel, into one super-packet written with a single system call.
//!
//! The rules follow Linux's `tcp_gso_segment` and `tcp_gro_receive`, and wireguard-go's
//! `tun/offload_linux.go`. Checksums are Internet checksums (RFC 1071); the helpers
//! [`checksum_add`], [`checksum_fold`], [`checksum`] and [`pseudo_header_sum`] are public for
//! the rest of the device.

/// Length of the legacy `struct virtio_net_hdr` that precedes every packet on the device.
pub const VNET_HDR_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: the checksum at `csum_start + csum_offset` holds only the
/// pseudo-header sum and must be completed over the bytes from `csum_start` to the end.
pub const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`: the packet's checksums need not be verified by the receiver.
pub const F_DATA_VALID: u8 = 2;
/// `VIRTIO_NET_HDR_GSO_NONE`: the packet is a single packet, not to be segmented.
pub const GSO_NONE: u8 = 0;
/// `VIRTIO_NET_HDR_GSO_TCPV4`: a TCP over IPv4 super-packet, segmented at `gso_size`.
pub const GSO_TCPV4: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_UDP`: UDP fragmentation offload (not requested, so not supported).
pub const GSO_UDP: u8 = 3;
/// `VIRTIO_NET_HDR_GSO_TCPV6`: a TCP over IPv6 super-packet, segmented at `gso_size`.
pub const GSO_TCPV6: u8 = 4;
/// `VIRTIO_NET_HDR_GSO_UDP_L4`: UDP segmentation offload (not requested, so not supported).
pub const GSO_UDP_L4: u8 = 5;
/// `VIRTIO_NET_HDR_GSO_ECN`: flag bit on `gso_type`; the super-packet carries ECN (CWR) state.
pub const GSO_ECN: u8 = 0x80;
/// The largest IP packet a coalesced write may hold.
pub const MAX_COALESCED: usize = 65_535;

/// At most this many segments are joined into one write, as in Linux's GRO.
const MAX_SEGMENTS: usize = 64;
/// How many flows may each have a pending super-packet at once.
const MAX_FLOWS: usize = 8;
/// The largest IP packet there is without jumbograms: an IPv6 header and a 65,535-byte payload.
const MAX_PACKET: usize = IPV6_HDR + 65_535;

const IPV4_HDR: usize = 20;
const IPV6_HDR: usize = 40;
const TCP_HDR: usize = 20;
const PROTO_TCP: u8 = 6;
/// Where the checksum sits in a TCP header.
const TCP_CSUM_OFFSET: usize = 16;

const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_ACK: u8 = 0x10;
const TCP_CWR: u8 = 0x80;

/// The legacy `struct virtio_net_hdr` (all fields in native byte order), which describes the
/// offloads that apply to the packet following it on the TUN device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    /// `F_NEEDS_CSUM` and/or `F_DATA_VALID`.
    pub flags: u8,
    /// One of the `GSO_*` types, possibly with the `GSO_ECN` bit.
    pub gso_type: u8,
    /// Length of the headers (IP and transport) repeated in front of every segment.
    pub hdr_len: u16,
    /// Payload bytes per segment.
    pub gso_size: u16,
    /// Where the checksummed region (the transport header) starts.
    pub csum_start: u16,
    /// Where the checksum field sits, counted from `csum_start`.
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Reads the header from the first 10 bytes; None when shorter.
    pub fn parse(bytes: &[u8]) -> Option<VnetHdr> {
        let b = bytes.get(..VNET_HDR_LEN)?;
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u16::from_ne_bytes([b[2], b[3]]),
            gso_size: u16::from_ne_bytes([b[4], b[5]]),
            csum_start: u16::from_ne_bytes([b[6], b[7]]),
            csum_offset: u16::from_ne_bytes([b[8], b[9]]),
        })
    }

    /// Writes the header into the first 10 bytes of `out` (panics if shorter).
    pub fn write(&self, out: &mut [u8]) {
        let out = &mut out[..VNET_HDR_LEN];
        out[0] = self.flags;
        out[1] = self.gso_type;
        out[2..4].copy_from_slice(&self.hdr_len.to_ne_bytes());
        out[4..6].copy_from_slice(&self.gso_size.to_ne_bytes());
        out[6..8].copy_from_slice(&self.csum_start.to_ne_bytes());
        out[8..10].copy_from_slice(&self.csum_offset.to_ne_bytes());
    }
}

/// Why a packet read from the TUN device could not be turned into wire packets.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum OffloadError {
    /// The frame read from the device is shorter than its virtio header.
    #[error("frame of {len} bytes is shorter than the {VNET_HDR_LEN}-byte virtio header")]
    TruncatedHeader {
        /// Length of the frame.
        len: usize,
    },
    /// The virtio header asks for a segmentation offload that was never enabled.
    #[error("unsupported virtio gso_type {0:#04x}")]
    UnsupportedGsoType(u8),
    /// A TCP segmentation request with a segment size of zero.
    #[error("virtio gso_size is 0 for a segmentation request")]
    ZeroGsoSize,
    /// The virtio header's `hdr_len` points past the end of the packet.
    #[error("virtio hdr_len {hdr_len} is past the end of the {len}-byte packet")]
    HdrLenPastEnd {
        /// The header's `hdr_len`.
        hdr_len: u16,
        /// Length of the packet.
        len: usize,
    },
    /// The checksum field to complete does not lie within the packet.
    #[error("checksum at {csum_start} + {csum_offset} is past the end of the {len}-byte packet")]
    CsumPastEnd {
        /// The header's `csum_start`.
        csum_start: u16,
        /// The header's `csum_offset`.
        csum_offset: u16,
        /// Length of the packet.
        len: usize,
    },
    /// The packet's IP version does not match the segmentation type.
    #[error("IP version {version} does not match virtio gso_type {gso_type:#04x}")]
    IpVersionMismatch {
        /// The header's `gso_type`.
        gso_type: u8,
        /// The version nibble of the packet.
        version: u8,
    },
    /// An IPv4 header length below the 20-byte minimum.
    #[error("IPv4 header length {0} is below 20 bytes")]
    BadIpv4HeaderLen(usize),
    /// A TCP segmentation request whose packet does not carry TCP.
    #[error("TCP segmentation requested for IP protocol {protocol}")]
    NotTcp {
        /// The IPv4 protocol or IPv6 next header found where TCP was expected.
        protocol: u8,
    },
    /// A TCP header length (data offset) below the 20-byte minimum.
    #[error("TCP header length {0} is below 20 bytes")]
    BadTcpHeaderLen(usize),
    /// The packet ends inside its IP or TCP headers.
    #[error("packet of {len} bytes ends inside its headers")]
    TruncatedPacket {
        /// Length of the packet.
        len: usize,
    },
    /// A segment would be longer than an IP packet can be.
    #[error("segment of {len} bytes is longer than an IP packet can be")]
    SegmentTooLong {
        /// Length the segment would have.
        len: usize,
    },
    /// The scratch buffer cannot hold the largest segment.
    #[error("scratch buffer of {have} bytes cannot hold a {need}-byte segment")]
    ScratchTooSmall {
        /// Length of the largest segment.
        need: usize,
        /// Length of the scratch buffer.
        have: usize,
    },
}

// ---------------------------------------------------------------------------------------------
// Internet checksum
// ---------------------------------------------------------------------------------------------

/// Adds `data` to a running Internet checksum sum and returns the new, unfolded sum.
///
/// `data` is taken as a sequence of big-endian 16-bit words (a final odd byte is padded with a
/// zero byte), so it must start at an even offset of the checksummed region. The sum is kept in
/// a `u64` with end-around carries; start with 0 (or a [`pseudo_header_sum`]), chain further
/// calls, and finish with [`checksum_fold`] or [`checksum`]. Summing runs over 32-bit words in
/// native byte order (RFC 1071's byte-order independence), which compilers vectorise.
#[inline]
pub fn checksum_add(data: &[u8], sum: u64) -> u64 {
    let mut total = sum;
    // Blocks keep the 32-bit word accumulator below 2^64 whatever the slice length.
    for block in data.chunks(1 << 30) {
        total = add_carry(total, u64::from(sum_block(block)));
    }
    total
}

/// One's-complement sum of `data` as big-endian 16-bit words, folded to 16 bits.
#[inline]
fn sum_block(data: &[u8]) -> u16 {
    let mut acc: u64 = 0;
    let mut wide = data.chunks_exact(32);
    for c in &mut wide {
        let mut lanes = 0u64;
        for w in c.chunks_exact(4) {
            lanes += u64::from(u32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
        }
        acc += lanes;
    }
    let mut words = wide.remainder().chunks_exact(4);
    for w in &mut words {
        acc += u64::from(u32::from_ne_bytes([w[0], w[1], w[2], w[3]]));
    }
    let rest = words.remainder();
    let mut tail = [0u8; 4];
    tail[..rest.len()].copy_from_slice(rest);
    acc += u64::from(u32::from_ne_bytes(tail));
    let folded = checksum_fold(acc);
    if cfg!(target_endian = "little") {
        folded.swap_bytes()
    } else {
        folded
    }
}

/// Adds with the end-around carry of one's-complement arithmetic.
#[inline]
fn add_carry(a: u64, b: u64) -> u64 {
    let (sum, carry) = a.overflowing_add(b);
    sum + u64::from(carry)
}

/// Folds a running sum (from [`checksum_add`] or [`pseudo_header_sum`]) into 16 bits, not
/// complemented: the value a partial (`F_NEEDS_CSUM`) checksum field holds.
#[inline]
pub fn checksum_fold(sum: u64) -> u16 {
    let mut s = (sum & 0xffff_ffff) + (sum >> 32);
    s = (s & 0xffff_ffff) + (s >> 32);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s as u16
}

/// The finished Internet checksum of `data` on top of the running sum `initial`: the
/// complement of the folded sum, to be stored big-endian in the checksum field (which must be
/// zero, or left out of `data`, while summing).
#[inline]
pub fn checksum(data: &[u8], initial: u64) -> u16 {
    !checksum_fold(checksum_add(data, initial))
}

/// The unfolded sum of the TCP/UDP pseudo-header: source and destination addresses (4 bytes
/// each for IPv4, 16 for IPv6), the protocol (next header) number and the transport length
/// (TCP/UDP header plus payload). Pass it as `initial` to [`checksum`], or fold it with
/// [`checksum_fold`] for a partial checksum field.
#[inline]
pub fn pseudo_header_sum(src: &[u8], dst: &[u8], protocol: u8, len: u32) -> u64 {
    checksum_add(dst, checksum_add(src, u64::from(protocol) + u64::from(len)))
}

// ---------------------------------------------------------------------------------------------
// Byte helpers (callers bound every index first)
// ---------------------------------------------------------------------------------------------

#[inline]
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline]
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

#[inline]
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// The pseudo-header address sum of an IPv4 or IPv6 packet whose fixed header is present.
#[inline]
fn address_sum(packet: &[u8], v6: bool) -> u64 {
    if v6 {
        pseudo_header_sum(&packet[8..24], &packet[24..40], PROTO_TCP, 0)
    } else {
        pseudo_header_sum(&packet[12..16], &packet[16..20], PROTO_TCP, 0)
    }
}

/// Recomputes the checksum of an IPv4 header (`header` is exactly the header, options included).
#[inline]
fn fix_ipv4_checksum(header: &mut [u8]) {
    put16(header, 10, 0);
    let sum = checksum(header, 0);
    put16(header, 10, sum);
}

// ---------------------------------------------------------------------------------------------
// Segmentation (TUN reads)
// ---------------------------------------------------------------------------------------------

/// Turns one packet read from the TUN device into wire packets, each a complete IP packet with
/// valid checksums, passed to `emit` in order; returns how many were emitted.
///
/// `packet` is what follows the virtio header `hdr`; it may be modified in place.
///
/// - Without GSO the packet itself is emitted, its checksum completed first when `hdr` has
///   `F_NEEDS_CSUM` (the field at `csum_start + csum_offset` then holds the pseudo-header sum).
/// - With `GSO_TCPV4`/`GSO_TCPV6` (the `GSO_ECN` bit allowed) it is cut into segments of at
///   most `gso_size` payload bytes, each built in `scratch` (the headers copied from the
///   super-packet, then its slice of the payload): IPv4 total length, identification
///   (incremented per segment, wrapping) and header checksum; IPv6 payload length; the TCP
///   sequence number advanced by the payload already emitted; FIN and PSH kept only on the
///   last segment and CWR only on the first; a full TCP checksum per segment. The header
///   lengths are taken from the packet itself rather than from `hdr_len`, which the kernel may
///   set to the whole first packet on its forwarding path. IPv6 hop-by-hop and destination
///   options headers are carried into every segment; other extension headers are refused.
///
/// Every check happens before the first `emit`, so a packet is either emitted whole or not at
/// all, and an error means nothing was emitted.
pub fn segment(
    hdr: &VnetHdr,
    packet: &mut [u8],
    scratch: &mut [u8],
    mut emit: impl FnMut(&[u8]),
) -> Result<usize, OffloadError> {
    let v6 = match hdr.gso_type & !GSO_ECN {
        GSO_NONE => {
            if hdr.flags & F_NEEDS_CSUM != 0 {
                complete_checksum(hdr, packet)?;
            }
            emit(packet);
            return Ok(1);
        }
        GSO_TCPV4 => false,
        GSO_TCPV6 => true,
        // UDP fragmentation and segmentation offloads are never enabled on the device.
        GSO_UDP | GSO_UDP_L4 => return Err(OffloadError::UnsupportedGsoType(hdr.gso_type)),
        _ => return Err(OffloadError::UnsupportedGsoType(hdr.gso_type)),
    };
    segment_tcp(hdr, packet, scratch, &mut emit, v6)
}

/// Completes a partial checksum in place: sums from `csum_start` to the end on top of the
/// pseudo-header sum the field holds, and stores the complement.
fn complete_checksum(hdr: &VnetHdr, packet: &mut [u8]) -> Result<(), OffloadError> {
    let start = usize::from(hdr.csum_start);
    let at = start + usize::from(hdr.csum_offset);
    if at + 2 > packet.len() {
        return Err(OffloadError::CsumPastEnd {
            csum_start: hdr.csum_start,
            csum_offset: hdr.csum_offset,
            len: packet.len(),
        });
    }
    let initial = be16(packet, at);
    put16(packet, at, 0);
    let sum = checksum(&packet[start..], u64::from(initial));
    // A computed 0 is sent as 0xffff (the same value in one's complement): 0 means "no
    // checksum" to UDP over IPv4 and is forbidden for UDP over IPv6.
    put16(packet, at, if sum == 0 { 0xffff } else { sum });
    Ok(())
}

/// Where the transport header of an IPv6 packet starts and which protocol it is, skipping
/// hop-by-hop and destination options headers.
fn ipv6_transport(packet: &[u8]) -> Result<(usize, u8), OffloadError> {
    let mut next = packet[6];
    let mut offset = IPV6_HDR;
    while next == 0 || next == 60 {
        let ext = packet
            .get(offset..offset + 2)
            .ok_or(OffloadError::TruncatedPacket { len: packet.len() })?;
        next = ext[0];
        offset += (usize::from(ext[1]) + 1) * 8;
    }
    Ok((offset, next))
}

fn segment_tcp(
    hdr: &VnetHdr,
    packet: &[u8],
    scratch: &mut [u8],
    emit: &mut impl FnMut(&[u8]),
    v6: bool,
) -> Result<usize, OffloadError> {
    let len = packet.len();
    if hdr.gso_size == 0 {
        return Err(OffloadError::ZeroGsoSize);
    }
    if usize::from(hdr.hdr_len) > len {
        return Err(OffloadError::HdrLenPastEnd {
            hdr_len: hdr.hdr_len,
            len,
        });
    }
    if len < if v6 { IPV6_HDR } else { IPV4_HDR } {
        return Err(OffloadError::TruncatedPacket { len });
    }
    let version = packet[0] >> 4;
    if version != if v6 { 6 } else { 4 } {
        return Err(OffloadError::IpVersionMismatch {
            gso_type: hdr.gso_type,
            version,
        });
    }
    let ip_hl = if v6 {
        let (offset, next) = ipv6_transport(packet)?;
        if next != PROTO_TCP {
            return Err(OffloadError::NotTcp { protocol: next });
        }
        offset
    } else {
        let ihl = usize::from(packet[0] & 0x0f) * 4;
        if ihl < IPV4_HDR {
            return Err(OffloadError::BadIpv4HeaderLen(ihl));
        }
        if packet[9] != PROTO_TCP {
            return Err(OffloadError::NotTcp {
                protocol: packet[9],
            });
        }
        ihl
    };
    if ip_hl + TCP_HDR > len {
        return Err(OffloadError::TruncatedPacket { len });
    }
    let tcp_hl = usize::from(packet[ip_hl + 12] >> 4) * 4;
    if tcp_hl < TCP_HDR {
        return Err(OffloadError::BadTcpHeaderLen(tcp_hl));
    }
    let hl = ip_hl + tcp_hl;
    if hl > len {
        return Err(OffloadError::TruncatedPacket { len });
    }
    let payload_len = len - hl;
    let gso = usize::from(hdr.gso_size);
    let largest = hl + gso.min(payload_len);
    if largest > if v6 { MAX_PACKET } else { MAX_COALESCED } {
        return Err(OffloadError::SegmentTooLong { len: largest });
    }
    if scratch.len() < largest {
        return Err(OffloadError::ScratchTooSmall {
            need: largest,
            have: scratch.len(),
        });
    }

    let (headers, payload) = packet.split_at(hl);
    let addresses = address_sum(headers, v6);
    let first_id = if v6 { 0 } else { be16(headers, 4) };
    let first_seq = be32(headers, ip_hl + 4);
    let flags = headers[ip_hl + 13];
    let count = payload_len.div_ceil(gso).max(1);
    for i in 0..count {
        let start = i * gso;
        let end = (start + gso).min(payload_len);
        let seg_len = hl + (end - start);
        let out = &mut scratch[..seg_len];
        out[..hl].copy_from_slice(headers);
        out[hl..].copy_from_slice(&payload[start..end]);
        if v6 {
            put16(out, 4, (seg_len - IPV6_HDR) as u16);
        } else {
            put16(out, 2, seg_len as u16);
            put16(out, 4, first_id.wrapping_add(i as u16));
            fix_ipv4_checksum(&mut out[..ip_hl]);
        }
        put32(out, ip_hl + 4, first_seq.wrapping_add(start as u32));
        let mut seg_flags = flags;
        if i + 1 != count {
            seg_flags &= !(TCP_FIN | TCP_PSH);
        }
        if i != 0 {
            seg_flags &= !TCP_CWR;
        }
        out[ip_hl + 13] = seg_flags;
        put16(out, ip_hl + TCP_CSUM_OFFSET, 0);
        let tcp_len = (seg_len - ip_hl) as u64;
        let sum = checksum(&out[ip_hl..], addresses + tcp_len);
        put16(out, ip_hl + TCP_CSUM_OFFSET, sum);
        emit(out);
    }
    Ok(count)
}

// ---------------------------------------------------------------------------------------------
// Coalescing (TUN writes)
// ---------------------------------------------------------------------------------------------

/// Identifies one direction of a TCP connection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct FlowKey {
    v6: bool,
    /// Source then destination address; IPv4 uses the first 8 bytes.
    addrs: [u8; 32],
    /// Source then destination port.
    ports: [u8; 4],
}

/// What a pushed packet is, as far as coalescing is concerned.
enum Class {
    /// Not TCP, or too short or malformed to parse: written alone, no flow to keep order in.
    Other,
    /// Possibly TCP but its ports cannot be read (an IPv4 fragment, IPv6 extension headers):
    /// every pending super-packet is written first, then the packet.
    UnknownFlow,
    /// A TCP packet whose flow is known.
    Tcp(TcpInfo),
}

struct TcpInfo {
    key: FlowKey,
    /// IP header plus TCP header length.
    hl: usize,
    seq: u32,
    flags: u8,
    payload: usize,
    /// Whether the packet may start or extend a super-packet.
    eligible: bool,
}

/// IPv6 extension header numbers, behind which TCP may hide.
fn is_ipv6_extension(next: u8) -> bool {
    matches!(
        next,
        0 | 43 | 44 | 50 | 51 | 60 | 135 | 139 | 140 | 253 | 254
    )
}

fn classify(p: &[u8]) -> Class {
    let Some(&first) = p.first() else {
        return Class::Other;
    };
    let (v6, ip_hl, plain_ip) = match first >> 4 {
        4 => {
            if p.len() < IPV4_HDR || p[9] != PROTO_TCP {
                return Class::Other;
            }
            let ihl = usize::from(first & 0x0f) * 4;
            if ihl < IPV4_HDR {
                return Class::Other;
            }
            // More fragments, or a fragment offset: the ports may not be there.
            if be16(p, 6) & 0x3fff != 0 {
                return Class::UnknownFlow;
            }
            // Whole (no padding, not truncated), no options, and a header checksum that
            // holds: GRO must not repair a header the kernel would have dropped.
            let plain = ihl == IPV4_HDR
                && usize::from(be16(p, 2)) == p.len()
                && checksum(&p[..IPV4_HDR], 0) == 0;
            (false, ihl, plain)
        }
        6 => {
            if p.len() < IPV6_HDR {
                return Class::Other;
            }
            let next = p[6];
            if next != PROTO_TCP {
                return if is_ipv6_extension(next) {
                    Class::UnknownFlow
                } else {
                    Class::Other
                };
            }
            let whole = usize::from(be16(p, 4)) + IPV6_HDR == p.len();
            (true, IPV6_HDR, whole)
        }
        _ => return Class::Other,
    };
    if ip_hl + TCP_HDR > p.len() {
        return Class::Other;
    }
    let tcp = &p[ip_hl..];
    let tcp_hl = usize::from(tcp[12] >> 4) * 4;
    if tcp_hl < TCP_HDR || ip_hl + tcp_hl > p.len() {
        return Class::Other;
    }
    let mut key = FlowKey {
        v6,
        ..FlowKey::default()
    };
    if v6 {
        key.addrs.copy_from_slice(&p[8..40]);
    } else {
        key.addrs[..8].copy_from_slice(&p[12..20]);
    }
    key.ports.copy_from_slice(&tcp[..4]);
    let hl = ip_hl + tcp_hl;
    let flags = tcp[13];
    let payload = p.len() - hl;
    let eligible = plain_ip
        && payload > 0
        && p.len() <= MAX_COALESCED
        && (flags == TCP_ACK || flags == TCP_ACK | TCP_PSH)
        && tcp[12] & 0x0f == 0;
    Class::Tcp(TcpInfo {
        key,
        hl,
        seq: be32(tcp, 4),
        flags,
        payload,
        eligible,
    })
}

/// One flow's pending super-packet.
struct Slot {
    /// Room for a virtio header and the largest coalesced packet.
    buf: Box<[u8]>,
    active: bool,
    key: FlowKey,
    /// Length of the IP packet in `buf[VNET_HDR_LEN..]`.
    len: usize,
    ip_hl: usize,
    /// IP header plus TCP header length.
    hl: usize,
    /// Payload length of the first segment; every other segment but the last has it too.
    gso_size: usize,
    segs: usize,
    /// The sequence number the next segment must have.
    next_seq: u32,
    /// When the slot last grew, to pick the one to write out when every slot is taken.
    stamp: u64,
}

impl Slot {
    fn new() -> Slot {
        Slot {
            buf: vec![0; VNET_HDR_LEN + MAX_COALESCED].into_boxed_slice(),
            active: false,
            key: FlowKey::default(),
            len: 0,
            ip_hl: 0,
            hl: 0,
            gso_size: 0,
            segs: 0,
            next_seq: 0,
            stamp: 0,
        }
    }

    fn packet(&self) -> &[u8] {
        &self.buf[VNET_HDR_LEN..VNET_HDR_LEN + self.len]
    }

    /// Takes `p` (eligible, at most `MAX_COALESCED` bytes) as the first segment.
    fn start(&mut self, p: &[u8], info: &TcpInfo, stamp: u64) {
        self.buf[VNET_HDR_LEN..VNET_HDR_LEN + p.len()].copy_from_slice(p);
        self.active = true;
        self.key = info.key;
        self.len = p.len();
        self.ip_hl = if info.key.v6 { IPV6_HDR } else { IPV4_HDR };
        self.hl = info.hl;
        self.gso_size = info.payload;
        self.segs = 1;
        self.next_seq = info.seq.wrapping_add(info.payload as u32);
        self.stamp = stamp;
    }

    /// Whether `p` (eligible, of this slot's flow) continues the super-packet.
    fn can_append(&self, p: &[u8], info: &TcpInfo) -> bool {
        if info.seq != self.next_seq
            || info.payload > self.gso_size
            || self.len + info.payload > MAX_COALESCED
            || info.hl != self.hl
        {
            return false;
        }
        let q = self.packet();
        let same_ip = if info.key.v6 {
            // Version, traffic class and flow label; hop limit.
            q[..4] == p[..4] && q[7] == p[7]
        } else {
            // Type of service; flags and fragment offset, TTL.
            q[1] == p[1] && q[6..9] == p[6..9]
        };
        let t = self.ip_hl;
        // Acknowledgement number, window, and the options byte for byte.
        same_ip
            && q[t + 8..t + 12] == p[t + 8..t + 12]
            && q[t + 14..t + 16] == p[t + 14..t + 16]
            && q[t + TCP_HDR..self.hl] == p[t + TCP_HDR..self.hl]
    }

    /// Appends the payload of `p`; returns whether the super-packet can no longer grow.
    fn append(&mut self, p: &[u8], info: &TcpInfo, stamp: u64) -> bool {
        let at = VNET_HDR_LEN + self.len;
        self.buf[at..at + info.payload].copy_from_slice(&p[info.hl..]);
        self.len += info.payload;
        self.segs += 1;
        self.next_seq = self.next_seq.wrapping_add(info.payload as u32);
        self.stamp = stamp;
        let psh = info.flags & TCP_PSH != 0;
        if psh {
            self.buf[VNET_HDR_LEN + self.ip_hl + 13] |= TCP_PSH;
        }
        psh || info.payload < self.gso_size
            || self.segs >= MAX_SEGMENTS
            || self.len + self.gso_size > MAX_COALESCED
    }

    /// Writes the pending packet out (if any) and frees the slot.
    fn write_out<W: FnMut(&[u8])>(&mut self, write: &mut W) {
        if !self.active {
            return;
        }
        self.active = false;
        let hdr = if self.segs == 1 {
            VnetHdr {
                flags: F_DATA_VALID,
                ..VnetHdr::default()
            }
        } else {
            let (ip_hl, len, v6) = (self.ip_hl, self.len, self.key.v6);
            let p = &mut self.buf[VNET_HDR_LEN..VNET_HDR_LEN + len];
            if v6 {
                put16(p, 4, (len - IPV6_HDR) as u16);
            } else {
                put16(p, 2, len as u16);
                fix_ipv4_checksum(&mut p[..IPV4_HDR]);
            }
            let partial = checksum_fold(address_sum(p, v6) + (len - ip_hl) as u64);
            put16(p, ip_hl + TCP_CSUM_OFFSET, partial);
            VnetHdr {
                flags: F_NEEDS_CSUM,
                gso_type: if v6 { GSO_TCPV6 } else { GSO_TCPV4 },
                hdr_len: self.hl as u16,
                gso_size: self.gso_size as u16,
                csum_start: ip_hl as u16,
                csum_offset: TCP_CSUM_OFFSET as u16,
            }
        };
        hdr.write(&mut self.buf);
        write(&self.buf[..VNET_HDR_LEN + self.len]);
    }
}

/// Coalesces decrypted IP packets into TUN writes (GRO).
///
/// Holds one pending super-packet per flow for up to 8 flows (when every slot is taken, the
/// one that grew least recently is written out). [`push`](Coalescer::push) adds a packet and
/// writes out what can no longer grow; [`flush`](Coalescer::flush) writes everything pending
/// and is meant to be called at the end of each batch of received packets. Each call of the
/// `write` callback gets one whole frame: a virtio header followed by the IP packet.
///
/// Only TCP data segments are coalesced: over IPv4 without options, unfragmented and with a
/// valid header checksum, or over IPv6 without extension headers; with flags exactly ACK (or
/// ACK|PSH, which closes the super-packet). A segment extends its flow's pending super-packet
/// only when it continues it exactly (next sequence number; same addresses, ports, IPv4
/// TOS/TTL/DF or IPv6 traffic class/flow label/hop limit, acknowledgement number, window and
/// TCP options) and carries the first segment's payload length, or less, which closes the
/// super-packet. At most 64 segments and [`MAX_COALESCED`] bytes go into one.
///
/// Everything else is written on its own with `F_DATA_VALID`, after any pending super-packet
/// of the same flow, so order within a flow is kept (packets of different flows may overtake
/// each other). A coalesced write carries a partial checksum (`F_NEEDS_CSUM`), so the kernel
/// does not verify the TCP checksums its segments arrived with; that is sound because
/// WireGuard's AEAD has already authenticated every byte, as kernel WireGuard assumes too.
/// `F_DATA_VALID` on a single packet says the same, but the TUN driver may verify that packet's
/// checksum anyway; it arrives with a valid one. A single pending segment is written
/// unchanged, as a plain packet.
///
/// All buffers are allocated in [`new`](Coalescer::new) and reused.
pub struct Coalescer {
    slots: Vec<Slot>,
    /// Frame buffer for packets written on their own.
    direct: Box<[u8]>,
    clock: u64,
}

impl Coalescer {
    /// An empty coalescer, its buffers (about 600 KiB) allocated up front.
    pub fn new() -> Coalescer {
        Coalescer {
            slots: (0..MAX_FLOWS).map(|_| Slot::new()).collect(),
            direct: vec![0; VNET_HDR_LEN + MAX_PACKET].into_boxed_slice(),
            clock: 0,
        }
    }

    /// Adds one decrypted IP packet, writing out through `write` whatever can no longer grow
    /// (and the packet itself when it is not coalesced). A packet longer than any IP packet
    /// can be (65,575 bytes) is dropped.
    pub fn push(&mut self, packet: &[u8], write: &mut impl FnMut(&[u8])) {
        match classify(packet) {
            Class::Other => self.write_alone(packet, write),
            Class::UnknownFlow => {
                self.flush(write);
                self.write_alone(packet, write);
            }
            Class::Tcp(info) if !info.eligible => {
                if let Some(slot) = self
                    .slots
                    .iter_mut()
                    .find(|s| s.active && s.key == info.key)
                {
                    slot.write_out(write);
                }
                self.write_alone(packet, write);
            }
            Class::Tcp(info) => self.coalesce(packet, &info, write),
        }
    }

    /// Writes out every pending super-packet.
    pub fn flush(&mut self, write: &mut impl FnMut(&[u8])) {
        for slot in &mut self.slots {
            slot.write_out(write);
        }
    }

    fn coalesce<W: FnMut(&[u8])>(&mut self, packet: &[u8], info: &TcpInfo, write: &mut W) {
        self.clock += 1;
        let stamp = self.clock;
        let index = match self
            .slots
            .iter()
            .position(|s| s.active && s.key == info.key)
        {
            Some(i) => {
                let slot = &mut self.slots[i];
                if slot.can_append(packet, info) {
                    if slot.append(packet, info, stamp) {
                        slot.write_out(write);
                    }
                    return;
                }
                slot.write_out(write);
                i
            }
            None => match self.slots.iter().position(|s| !s.active) {
                Some(i) => i,
                None => {
                    let i = self
                        .slots
                        .iter()
                        .enumerate()
                        .min_by_key(|(_, s)| s.stamp)
                        .map_or(0, |(i, _)| i);
                    self.slots[i].write_out(write);
                    i
                }
            },
        };
        if info.flags & TCP_PSH != 0 {
            // Nothing may follow a PSH segment: no point in holding it.
            self.write_alone(packet, write);
        } else {
            self.slots[index].start(packet, info, stamp);
        }
    }

    fn write_alone<W: FnMut(&[u8])>(&mut self, packet: &[u8], write: &mut W) {
        let len = VNET_HDR_LEN + packet.len();
        if len > self.direct.len() {
            return;
        }
        VnetHdr {
            flags: F_DATA_VALID,
            ..VnetHdr::default()
        }
        .write(&mut self.direct);
        self.direct[VNET_HDR_LEN..len].copy_from_slice(packet);
        write(&self.direct[..len]);
    }
}

impl Default for Coalescer {
    fn default() -> Coalescer {
        Coalescer::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TCP_SYN: u8 = 0x02;
    const TCP_RST: u8 = 0x04;
    const TCP_URG: u8 = 0x20;
    const TCP_ECE: u8 = 0x40;
    /// NOP, NOP, timestamps (TSval 1, TSecr 2).
    const TIMESTAMPS: [u8; 12] = [1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];
    /// An IPv6 hop-by-hop options header (next header TCP) holding a 4-byte PadN option.
    const HOP_BY_HOP: [u8; 8] = [6, 0, 1, 4, 0, 0, 0, 0];

    // --- reference checksum: byte by byte, nothing shared with the code under test ---

    fn ref_sum(data: &[u8]) -> u64 {
        let mut sum = 0u64;
        let mut i = 0;
        while i < data.len() {
            let hi = u64::from(data[i]);
            let lo = if i + 1 < data.len() {
                u64::from(data[i + 1])
            } else {
                0
            };
            sum += (hi << 8) | lo;
            i += 2;
        }
        sum
    }

    fn ref_fold(mut sum: u64) -> u16 {
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        sum as u16
    }

    /// The pseudo-header of an IPv4 or IPv6 packet, as bytes.
    fn ref_pseudo(p: &[u8], proto: u8, l4_len: usize) -> Vec<u8> {
        let mut v = Vec::new();
        if p[0] >> 4 == 4 {
            v.extend_from_slice(&p[12..20]);
            v.extend_from_slice(&[0, proto]);
            v.extend_from_slice(&(l4_len as u16).to_be_bytes());
        } else {
            v.extend_from_slice(&p[8..40]);
            v.extend_from_slice(&(l4_len as u32).to_be_bytes());
            v.extend_from_slice(&[0, 0, 0, proto]);
        }
        v
    }

    /// Whether the transport checksum of `p` (transport header at `l4`) validates.
    fn l4_valid(p: &[u8], l4: usize, proto: u8) -> bool {
        let mut v = ref_pseudo(p, proto, p.len() - l4);
        v.extend_from_slice(&p[l4..]);
        ref_fold(ref_sum(&v)) == 0xffff
    }

    /// Whether the IPv4 header checksum of `p` validates.
    fn ipv4_valid(p: &[u8]) -> bool {
        let ihl = usize::from(p[0] & 0x0f) * 4;
        ref_fold(ref_sum(&p[..ihl])) == 0xffff
    }

    /// The transport checksum for `p` with its checksum field (at `at`) taken as zero.
    fn ref_l4_checksum(p: &[u8], l4: usize, proto: u8, at: usize) -> u16 {
        let mut q = p.to_vec();
        q[at] = 0;
        q[at + 1] = 0;
        let mut v = ref_pseudo(&q, proto, q.len() - l4);
        v.extend_from_slice(&q[l4..]);
        !ref_fold(ref_sum(&v))
    }

    /// Replaces a full transport checksum with the partial form the kernel hands out with
    /// `F_NEEDS_CSUM`: the folded, not complemented, pseudo-header sum.
    fn make_partial(p: &mut [u8], l4: usize, proto: u8, at: usize) {
        let partial = ref_fold(ref_sum(&ref_pseudo(p, proto, p.len() - l4)));
        p[at..at + 2].copy_from_slice(&partial.to_be_bytes());
    }

    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }

        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    // --- packet builders (checksums from the reference) ---

    #[derive(Clone, Debug)]
    struct Tcp {
        v6: bool,
        src: [u8; 16],
        dst: [u8; 16],
        sport: u16,
        dport: u16,
        seq: u32,
        ack: u32,
        flags: u8,
        window: u16,
        options: Vec<u8>,
        /// IPv4 options, or IPv6 extension headers (the first one's number is `ext_next`).
        ip_options: Vec<u8>,
        ext_next: u8,
        id: u16,
        tos: u8,
        ttl: u8,
        frag: u16,
        payload: Vec<u8>,
    }

    fn tcp4(payload: Vec<u8>) -> Tcp {
        let mut src = [0; 16];
        let mut dst = [0; 16];
        src[..4].copy_from_slice(&[10, 0, 0, 1]);
        dst[..4].copy_from_slice(&[10, 0, 0, 2]);
        Tcp {
            v6: false,
            src,
            dst,
            sport: 40_000,
            dport: 5201,
            seq: 1_000_000,
            ack: 77,
            flags: TCP_ACK,
            window: 512,
            options: Vec::new(),
            ip_options: Vec::new(),
            ext_next: 0,
            id: 0x1234,
            tos: 0,
            ttl: 64,
            frag: 0x4000,
            payload,
        }
    }

    fn tcp6(payload: Vec<u8>) -> Tcp {
        let mut t = tcp4(payload);
        t.v6 = true;
        t.src = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
        t.dst = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
        t
    }

    impl Tcp {
        fn ip_hl(&self) -> usize {
            (if self.v6 { 40 } else { 20 }) + self.ip_options.len()
        }

        fn hl(&self) -> usize {
            self.ip_hl() + 20 + self.options.len()
        }

        fn build(&self) -> Vec<u8> {
            let mut tcp = Vec::new();
            tcp.extend_from_slice(&self.sport.to_be_bytes());
            tcp.extend_from_slice(&self.dport.to_be_bytes());
            tcp.extend_from_slice(&self.seq.to_be_bytes());
            tcp.extend_from_slice(&self.ack.to_be_bytes());
            tcp.push((((20 + self.options.len()) / 4) as u8) << 4);
            tcp.push(self.flags);
            tcp.extend_from_slice(&self.window.to_be_bytes());
            tcp.extend_from_slice(&[0, 0, 0, 0]);
            tcp.extend_from_slice(&self.options);
            tcp.extend_from_slice(&self.payload);
            let mut p = Vec::new();
            if self.v6 {
                p.push(0x60 | (self.tos >> 4));
                p.push((self.tos << 4) | 0x1);
                p.extend_from_slice(&[0x23, 0x45]);
                let plen = self.ip_options.len() + tcp.len();
                p.extend_from_slice(&(plen as u16).to_be_bytes());
                p.push(if self.ip_options.is_empty() {
                    6
                } else {
                    self.ext_next
                });
                p.push(self.ttl);
                p.extend_from_slice(&self.src);
                p.extend_from_slice(&self.dst);
                p.extend_from_slice(&self.ip_options);
            } else {
                let ihl = 20 + self.ip_options.len();
                p.push(0x40 | (ihl / 4) as u8);
                p.push(self.tos);
                p.extend_from_slice(&((ihl + tcp.len()) as u16).to_be_bytes());
                p.extend_from_slice(&self.id.to_be_bytes());
                p.extend_from_slice(&self.frag.to_be_bytes());
                p.extend_from_slice(&[self.ttl, 6, 0, 0]);
                p.extend_from_slice(&self.src[..4]);
                p.extend_from_slice(&self.dst[..4]);
                p.extend_from_slice(&self.ip_options);
                let c = !ref_fold(ref_sum(&p));
                p[10..12].copy_from_slice(&c.to_be_bytes());
            }
            let l4 = p.len();
            p.extend_from_slice(&tcp);
            let c = ref_l4_checksum(&p, l4, 6, l4 + 16);
            p[l4 + 16..l4 + 18].copy_from_slice(&c.to_be_bytes());
            p
        }

        /// `n` consecutive segments of `size` payload bytes each, starting with this one's
        /// sequence number and identification, payload from `rng`.
        fn run(&self, n: usize, size: usize, rng: &mut Rng) -> Vec<Vec<u8>> {
            (0..n)
                .map(|i| {
                    let mut s = self.clone();
                    s.seq = self.seq.wrapping_add((i * size) as u32);
                    s.id = self.id.wrapping_add(i as u16);
                    s.payload = rng.bytes(size);
                    s.build()
                })
                .collect()
        }
    }

    fn udp(v6: bool, payload: &[u8]) -> Vec<u8> {
        let t = if v6 {
            tcp6(Vec::new())
        } else {
            tcp4(Vec::new())
        };
        let mut p = t.build();
        let ip_hl = t.ip_hl();
        p.truncate(ip_hl);
        let l4_len = 8 + payload.len();
        if v6 {
            p[4..6].copy_from_slice(&(l4_len as u16).to_be_bytes());
            p[6] = 17;
        } else {
            p[2..4].copy_from_slice(&((ip_hl + l4_len) as u16).to_be_bytes());
            p[9] = 17;
            p[10..12].copy_from_slice(&[0, 0]);
            let c = !ref_fold(ref_sum(&p));
            p[10..12].copy_from_slice(&c.to_be_bytes());
        }
        p.extend_from_slice(&5353u16.to_be_bytes());
        p.extend_from_slice(&53u16.to_be_bytes());
        p.extend_from_slice(&(l4_len as u16).to_be_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend_from_slice(payload);
        let mut c = ref_l4_checksum(&p, ip_hl, 17, ip_hl + 6);
        if c == 0 {
            c = 0xffff;
        }
        p[ip_hl + 6..ip_hl + 8].copy_from_slice(&c.to_be_bytes());
        p
    }

    // --- segmentation helpers ---

    fn gso_hdr(t: &Tcp, gso_size: u16) -> VnetHdr {
        VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: if t.v6 { GSO_TCPV6 } else { GSO_TCPV4 },
            hdr_len: t.hl() as u16,
            gso_size,
            csum_start: t.ip_hl() as u16,
            csum_offset: 16,
        }
    }

    /// The super-packet for `t` as the kernel hands it out: partial TCP checksum.
    fn super_packet(t: &Tcp) -> Vec<u8> {
        let mut p = t.build();
        let l4 = t.ip_hl();
        make_partial(&mut p, l4, 6, l4 + 16);
        p
    }

    fn run_segment(hdr: &VnetHdr, packet: &[u8]) -> Result<Vec<Vec<u8>>, OffloadError> {
        let mut p = packet.to_vec();
        let mut scratch = vec![0; 70_000];
        let mut out = Vec::new();
        let n = segment(hdr, &mut p, &mut scratch, |s| out.push(s.to_vec()))?;
        assert_eq!(n, out.len());
        Ok(out)
    }

    /// Segments `t` as a super-packet and checks every segment field by field and against an
    /// independently built packet.
    fn check_segmentation(t: &Tcp, gso_type: u8, gso: usize) -> Vec<Vec<u8>> {
        let mut hdr = gso_hdr(t, gso as u16);
        hdr.gso_type = gso_type;
        let segs = run_segment(&hdr, &super_packet(t)).unwrap();
        let n = t.payload.len().div_ceil(gso).max(1);
        assert_eq!(segs.len(), n);
        let (ip_hl, hl) = (t.ip_hl(), t.hl());
        let mut joined = Vec::new();
        for (i, s) in segs.iter().enumerate() {
            let size = gso.min(t.payload.len() - i * gso);
            assert_eq!(s.len(), hl + size, "segment {i} length");
            if t.v6 {
                assert_eq!(usize::from(be16(s, 4)), s.len() - 40);
            } else {
                assert_eq!(usize::from(be16(s, 2)), s.len());
                assert_eq!(be16(s, 4), t.id.wrapping_add(i as u16), "segment {i} id");
                assert!(ipv4_valid(s), "segment {i} IPv4 checksum");
            }
            assert!(l4_valid(s, ip_hl, 6), "segment {i} TCP checksum");
            assert_eq!(
                be32(s, ip_hl + 4),
                t.seq.wrapping_add((i * gso) as u32),
                "segment {i} seq"
            );
            let mut flags = t.flags;
            if i + 1 < n {
                flags &= !(TCP_FIN | TCP_PSH);
            }
            if i > 0 {
                flags &= !TCP_CWR;
            }
            assert_eq!(s[ip_hl + 13], flags, "segment {i} flags");
            assert_eq!(s[ip_hl + 20..hl], t.options[..], "segment {i} options");
            let mut expected = t.clone();
            expected.seq = t.seq.wrapping_add((i * gso) as u32);
            expected.id = t.id.wrapping_add(i as u16);
            expected.flags = flags;
            expected.payload = t.payload[i * gso..i * gso + size].to_vec();
            assert_eq!(s, &expected.build(), "segment {i} bytes");
            joined.extend_from_slice(&s[hl..]);
        }
        assert_eq!(joined, t.payload);
        segs
    }

    // --- checksum helpers ---

    #[test]
    fn checksum_matches_reference() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let data = rng.bytes(5000);
        for len in (0..300).chain([1499, 1500, 4095, 4096, 4999]) {
            for start in [0, 1, 2, 3] {
                let d = &data[start..start + len.min(5000 - start)];
                let initial = rng.next() >> 40;
                assert_eq!(
                    checksum_fold(checksum_add(d, initial)),
                    ref_fold(ref_sum(d) + initial),
                    "len {len} start {start}"
                );
                assert_eq!(checksum(d, 0), !ref_fold(ref_sum(d)));
            }
        }
        // Chained sums equal one sum over the concatenation (even split points).
        let (a, b) = data.split_at(1000);
        assert_eq!(
            checksum_fold(checksum_add(b, checksum_add(a, 0))),
            checksum_fold(checksum_add(&data, 0))
        );
        assert_eq!(checksum_add(&[], 0), 0);
        assert_eq!(checksum_fold(0), 0);
        assert_eq!(checksum_fold(0xffff), 0xffff);
        assert_eq!(checksum_fold(0x1_0000), 1);
        assert_eq!(checksum_fold(u64::MAX), 0xffff);
        // A sum already at the top of the range keeps its end-around carry.
        assert_eq!(checksum_fold(checksum_add(&[0, 1], u64::MAX)), 1);
        assert_eq!(checksum(&[0xff; 64], 0), 0);
        assert_eq!(checksum(&[0; 64], 0), 0xffff);
    }

    #[test]
    fn pseudo_header_sum_matches_reference() {
        for t in [tcp4(vec![1, 2, 3]), tcp6(vec![1, 2, 3])] {
            let p = t.build();
            let ip_hl = t.ip_hl();
            let (src, dst) = if t.v6 {
                (&p[8..24], &p[24..40])
            } else {
                (&p[12..16], &p[16..20])
            };
            let sum = pseudo_header_sum(src, dst, 6, (p.len() - ip_hl) as u32);
            assert_eq!(
                checksum_fold(sum),
                ref_fold(ref_sum(&ref_pseudo(&p, 6, p.len() - ip_hl)))
            );
            // The TCP checksum the builder stored validates against it.
            assert_eq!(checksum(&p[ip_hl..], sum), 0);
        }
    }

    #[test]
    fn vnet_hdr_round_trip_and_layout() {
        let h = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV6 | GSO_ECN,
            hdr_len: 0x0102,
            gso_size: 0x0304,
            csum_start: 0x0506,
            csum_offset: 0x0708,
        };
        let mut b = [0xaa; 12];
        h.write(&mut b);
        assert_eq!(b[0], F_NEEDS_CSUM);
        assert_eq!(b[1], 0x84);
        assert_eq!(b[2..4], 0x0102u16.to_ne_bytes());
        assert_eq!(b[4..6], 0x0304u16.to_ne_bytes());
        assert_eq!(b[6..8], 0x0506u16.to_ne_bytes());
        assert_eq!(b[8..10], 0x0708u16.to_ne_bytes());
        assert_eq!(b[10..], [0xaa, 0xaa]);
        assert_eq!(VnetHdr::parse(&b), Some(h));
        assert_eq!(VnetHdr::parse(&b[..10]), Some(h));
        assert_eq!(VnetHdr::parse(&b[..9]), None);
        assert_eq!(VnetHdr::parse(&[]), None);
    }

    // --- segmentation ---

    #[test]
    fn segments_tcpv4_super_packet() {
        let mut rng = Rng(7);
        let mut t = tcp4(rng.bytes(10_000));
        t.flags = TCP_ACK | TCP_PSH | TCP_FIN;
        let segs = check_segmentation(&t, GSO_TCPV4, 1448);
        assert_eq!(segs.len(), 7);
        assert_eq!(segs[6].len(), 40 + 10_000 - 6 * 1448);
    }

    #[test]
    fn segments_tcpv4_with_timestamps() {
        let mut rng = Rng(8);
        let mut t = tcp4(rng.bytes(20_001));
        t.options = TIMESTAMPS.to_vec();
        t.flags = TCP_ACK | TCP_PSH;
        let segs = check_segmentation(&t, GSO_TCPV4, 1436);
        assert_eq!(segs.len(), 14);
    }

    #[test]
    fn segments_tcpv4_with_ecn_and_cwr() {
        let mut rng = Rng(9);
        let mut t = tcp4(rng.bytes(5000));
        t.options = TIMESTAMPS.to_vec();
        t.flags = TCP_ACK | TCP_CWR | TCP_ECE | TCP_PSH;
        t.tos = 0x02;
        let segs = check_segmentation(&t, GSO_TCPV4 | GSO_ECN, 1000);
        assert_eq!(segs.len(), 5);
        assert_eq!(segs[0][20 + 13], TCP_ACK | TCP_CWR | TCP_ECE);
        for s in &segs[1..4] {
            assert_eq!(s[20 + 13], TCP_ACK | TCP_ECE);
        }
        assert_eq!(segs[4][20 + 13], TCP_ACK | TCP_ECE | TCP_PSH);
        assert!(segs.iter().all(|s| s[1] == 0x02));
    }

    #[test]
    fn segments_tcpv4_with_ip_options() {
        let mut rng = Rng(10);
        let mut t = tcp4(rng.bytes(3000));
        // Router alert.
        t.ip_options = vec![0x94, 0x04, 0x00, 0x00];
        check_segmentation(&t, GSO_TCPV4, 1200);
    }

    #[test]
    fn segments_tcpv6_super_packet() {
        let mut rng = Rng(11);
        let mut t = tcp6(rng.bytes(30_000));
        t.flags = TCP_ACK | TCP_PSH | TCP_FIN;
        let segs = check_segmentation(&t, GSO_TCPV6, 1428);
        assert_eq!(segs.len(), 22);
        let mut t = tcp6(rng.bytes(30_000));
        t.options = TIMESTAMPS.to_vec();
        t.flags = TCP_ACK | TCP_CWR | TCP_PSH;
        check_segmentation(&t, GSO_TCPV6 | GSO_ECN, 1416);
    }

    #[test]
    fn segments_tcpv6_with_hop_by_hop_header() {
        let mut rng = Rng(12);
        let mut t = tcp6(rng.bytes(4000));
        t.ip_options = HOP_BY_HOP.to_vec();
        t.ext_next = 0;
        t.options = TIMESTAMPS.to_vec();
        let segs = check_segmentation(&t, GSO_TCPV6, 1400);
        assert!(segs.iter().all(|s| s[6] == 0 && s[40] == 6));
    }

    #[test]
    fn segmentation_wraps_id_and_sequence() {
        let mut rng = Rng(13);
        let mut t = tcp4(rng.bytes(4000));
        t.id = 0xfffe;
        t.seq = u32::MAX - 1500;
        let segs = check_segmentation(&t, GSO_TCPV4, 1000);
        assert_eq!(be16(&segs[2], 4), 0);
        assert_eq!(be32(&segs[2], 24), 499);
    }

    #[test]
    fn segmentation_edge_sizes() {
        let mut rng = Rng(14);
        // An exact multiple: the last segment is full.
        let t = tcp4(rng.bytes(4000));
        let segs = check_segmentation(&t, GSO_TCPV4, 1000);
        assert!(segs.iter().all(|s| s.len() == 1040));
        // Less than one segment of payload.
        let t = tcp6(rng.bytes(100));
        assert_eq!(check_segmentation(&t, GSO_TCPV6, 1000).len(), 1);
        // No payload at all: the headers alone, fixed up.
        let mut t = tcp4(Vec::new());
        t.flags = TCP_ACK | TCP_FIN;
        assert_eq!(check_segmentation(&t, GSO_TCPV4, 1000).len(), 1);
        // gso_size 1.
        let t = tcp4(rng.bytes(50));
        assert_eq!(check_segmentation(&t, GSO_TCPV4, 1).len(), 50);
    }

    #[test]
    fn segmentation_ignores_a_whole_packet_hdr_len() {
        // On its forwarding path the kernel may set hdr_len to the first packet's length.
        let mut rng = Rng(15);
        let t = tcp4(rng.bytes(3000));
        let mut hdr = gso_hdr(&t, 1000);
        hdr.hdr_len = 1040;
        let segs = run_segment(&hdr, &super_packet(&t)).unwrap();
        assert_eq!(segs, check_segmentation(&t, GSO_TCPV4, 1000));
    }

    #[test]
    fn segment_uses_only_the_scratch_it_needs() {
        let mut rng = Rng(16);
        let t = tcp4(rng.bytes(3000));
        let mut p = super_packet(&t);
        let mut scratch = vec![0; 1040];
        let mut count = 0;
        let n = segment(&gso_hdr(&t, 1000), &mut p, &mut scratch, |s| {
            assert!(l4_valid(s, 20, 6));
            count += 1;
        })
        .unwrap();
        assert_eq!((n, count), (3, 3));
    }

    #[test]
    fn completes_partial_checksums_without_gso() {
        let mut rng = Rng(17);
        let mut cases = Vec::new();
        for v6 in [false, true] {
            for len in [0, 1, 2, 3, 100, 1399] {
                let mut t = if v6 {
                    tcp6(rng.bytes(len))
                } else {
                    tcp4(rng.bytes(len))
                };
                t.flags = TCP_ACK | TCP_PSH;
                let l4 = t.ip_hl();
                cases.push((t.build(), l4, 16));
                let u = udp(v6, &rng.bytes(len));
                let l4 = if v6 { 40 } else { 20 };
                cases.push((u, l4, 6));
            }
        }
        for (full, l4, off) in cases {
            let proto = full[if full[0] >> 4 == 4 { 9 } else { 6 }];
            assert!(l4_valid(&full, l4, proto));
            let mut partial = full.clone();
            make_partial(&mut partial, l4, proto, l4 + off);
            assert_ne!(partial, full);
            let hdr = VnetHdr {
                flags: F_NEEDS_CSUM,
                csum_start: l4 as u16,
                csum_offset: off as u16,
                ..VnetHdr::default()
            };
            assert_eq!(run_segment(&hdr, &partial).unwrap(), vec![full.clone()]);
            // Without F_NEEDS_CSUM the packet goes out untouched.
            assert_eq!(
                run_segment(&VnetHdr::default(), &partial).unwrap(),
                vec![partial.clone()]
            );
        }
    }

    #[test]
    fn completed_udp_checksum_is_never_zero() {
        // Find a payload whose checksum comes out as zero, then check 0xffff is sent.
        let mut found = false;
        for x in 0..=u16::MAX {
            let mut p = udp(false, &[0, 0]);
            p[28..30].copy_from_slice(&x.to_be_bytes());
            if ref_l4_checksum(&p, 20, 17, 26) != 0 {
                continue;
            }
            make_partial(&mut p, 20, 17, 26);
            let hdr = VnetHdr {
                flags: F_NEEDS_CSUM,
                csum_start: 20,
                csum_offset: 6,
                ..VnetHdr::default()
            };
            let out = run_segment(&hdr, &p).unwrap();
            assert_eq!(be16(&out[0], 26), 0xffff);
            assert!(l4_valid(&out[0], 20, 17));
            found = true;
            break;
        }
        assert!(found);
    }

    #[test]
    fn segment_errors_emit_nothing() {
        let mut rng = Rng(18);
        let t = tcp4(rng.bytes(3000));
        let p = super_packet(&t);
        let hdr = gso_hdr(&t, 1000);
        let t6 = tcp6(rng.bytes(3000));
        let p6 = super_packet(&t6);
        let hdr6 = gso_hdr(&t6, 1000);
        let len = p.len();

        let mut cases: Vec<(VnetHdr, Vec<u8>, usize, OffloadError)> = Vec::new();
        let big = 70_000;
        cases.push((
            VnetHdr { gso_size: 0, ..hdr },
            p.clone(),
            big,
            OffloadError::ZeroGsoSize,
        ));
        for gso_type in [GSO_UDP_L4, GSO_UDP, 2, 0x7f, GSO_UDP_L4 | GSO_ECN] {
            cases.push((
                VnetHdr { gso_type, ..hdr },
                p.clone(),
                big,
                OffloadError::UnsupportedGsoType(gso_type),
            ));
        }
        cases.push((
            VnetHdr {
                hdr_len: len as u16 + 1,
                ..hdr
            },
            p.clone(),
            big,
            OffloadError::HdrLenPastEnd {
                hdr_len: len as u16 + 1,
                len,
            },
        ));
        cases.push((
            VnetHdr { hdr_len: 0, ..hdr },
            p[..30].to_vec(),
            big,
            OffloadError::TruncatedPacket { len: 30 },
        ));
        cases.push((
            VnetHdr { hdr_len: 0, ..hdr },
            p[..19].to_vec(),
            big,
            OffloadError::TruncatedPacket { len: 19 },
        ));
        cases.push((
            VnetHdr { hdr_len: 0, ..hdr6 },
            p6[..39].to_vec(),
            big,
            OffloadError::TruncatedPacket { len: 39 },
        ));
        cases.push((
            VnetHdr { hdr_len: 0, ..hdr },
            Vec::new(),
            big,
            OffloadError::TruncatedPacket { len: 0 },
        ));
        cases.push((
            hdr,
            p.clone(),
            1039,
            OffloadError::ScratchTooSmall {
                need: 1040,
                have: 1039,
            },
        ));
        cases.push((
            hdr,
            p.clone(),
            0,
            OffloadError::ScratchTooSmall {
                need: 1040,
                have: 0,
            },
        ));
        cases.push((
            hdr,
            p6.clone(),
            big,
            OffloadError::IpVersionMismatch {
                gso_type: GSO_TCPV4,
                version: 6,
            },
        ));
        cases.push((
            hdr6,
            p.clone(),
            big,
            OffloadError::IpVersionMismatch {
                gso_type: GSO_TCPV6,
                version: 4,
            },
        ));
        let u = udp(false, &[0; 3000]);
        cases.push((
            VnetHdr { hdr_len: 28, ..hdr },
            u,
            big,
            OffloadError::NotTcp { protocol: 17 },
        ));
        let mut routed = t6.clone();
        routed.ip_options = vec![6, 0, 0, 0, 0, 0, 0, 0];
        routed.ext_next = 43;
        cases.push((
            hdr6,
            super_packet(&routed),
            big,
            OffloadError::NotTcp { protocol: 43 },
        ));
        let mut bad = p.clone();
        bad[32] = 0x40;
        cases.push((hdr, bad, big, OffloadError::BadTcpHeaderLen(16)));
        let mut bad = p.clone();
        bad[32] = 0xf0;
        cases.push((
            VnetHdr { hdr_len: 0, ..hdr },
            bad[..60].to_vec(),
            big,
            OffloadError::TruncatedPacket { len: 60 },
        ));
        let mut bad = p.clone();
        bad[0] = 0x44;
        cases.push((hdr, bad, big, OffloadError::BadIpv4HeaderLen(16)));
        // A 65,535-byte payload behind 40 bytes of headers cannot be one IPv4 segment.
        let mut huge = tcp4(vec![0; 65_535]).build();
        huge[2..4].copy_from_slice(&[0xff, 0xff]);
        cases.push((
            VnetHdr {
                gso_size: u16::MAX,
                ..hdr
            },
            huge,
            big,
            OffloadError::SegmentTooLong { len: 65_575 },
        ));
        cases.push((
            VnetHdr {
                gso_type: GSO_NONE,
                flags: F_NEEDS_CSUM,
                csum_start: len as u16 - 1,
                csum_offset: 0,
                ..hdr
            },
            p.clone(),
            big,
            OffloadError::CsumPastEnd {
                csum_start: len as u16 - 1,
                csum_offset: 0,
                len,
            },
        ));
        cases.push((
            VnetHdr {
                gso_type: GSO_NONE,
                flags: F_NEEDS_CSUM,
                csum_start: u16::MAX,
                csum_offset: u16::MAX,
                ..hdr
            },
            p.clone(),
            big,
            OffloadError::CsumPastEnd {
                csum_start: u16::MAX,
                csum_offset: u16::MAX,
                len,
            },
        ));

        for (i, (hdr, packet, scratch_len, expected)) in cases.into_iter().enumerate() {
            let mut packet = packet;
            let original = packet.clone();
            let mut scratch = vec![0; scratch_len];
            let mut emitted = 0;
            assert!(!expected.to_string().is_empty());
            let r = segment(&hdr, &mut packet, &mut scratch, |_| emitted += 1);
            assert_eq!(r, Err(expected), "case {i}");
            assert_eq!(emitted, 0, "case {i}");
            assert_eq!(packet, original, "case {i} modified the packet");
        }
    }

    // --- coalescing helpers ---

    fn push_all(c: &mut Coalescer, packets: &[Vec<u8>]) -> (Vec<Vec<u8>>, usize) {
        let mut out = Vec::new();
        let mut w = |f: &[u8]| out.push(f.to_vec());
        for p in packets {
            c.push(p, &mut w);
        }
        let mut rest = Vec::new();
        c.flush(&mut |f: &[u8]| rest.push(f.to_vec()));
        let before = out.len();
        out.extend(rest);
        (out, before)
    }

    fn alone(p: &[u8]) -> Vec<u8> {
        let mut f = vec![F_DATA_VALID, 0, 0, 0, 0, 0, 0, 0, 0, 0];
        f.extend_from_slice(p);
        f
    }

    /// Checks a coalesced frame (header, lengths, IPv4 checksum, partial TCP checksum, the
    /// checksum once completed) and that segmenting it again gives back `originals` exactly.
    fn check_gso_frame(frame: &[u8], originals: &[Vec<u8>]) {
        let hdr = VnetHdr::parse(frame).unwrap();
        let p = &frame[VNET_HDR_LEN..];
        let v6 = p[0] >> 4 == 6;
        let ip_hl = if v6 { 40 } else { 20 };
        let hl = ip_hl + usize::from(p[ip_hl + 12] >> 4) * 4;
        assert!(originals.len() > 1);
        assert_eq!(hdr.flags, F_NEEDS_CSUM);
        assert_eq!(hdr.gso_type, if v6 { GSO_TCPV6 } else { GSO_TCPV4 });
        assert_eq!(usize::from(hdr.hdr_len), hl);
        assert_eq!(usize::from(hdr.gso_size), originals[0].len() - hl);
        assert_eq!(usize::from(hdr.csum_start), ip_hl);
        assert_eq!(hdr.csum_offset, 16);
        assert!(p.len() <= MAX_COALESCED);
        assert!(originals.len() <= 64);
        if v6 {
            assert_eq!(usize::from(be16(p, 4)), p.len() - 40);
        } else {
            assert_eq!(usize::from(be16(p, 2)), p.len());
            assert_eq!(be16(p, 4), be16(&originals[0], 4), "first IPv4 id kept");
            assert!(ipv4_valid(p));
        }
        let partial = ref_fold(ref_sum(&ref_pseudo(p, 6, p.len() - ip_hl)));
        assert_eq!(be16(p, ip_hl + 16), partial);
        // Complete it as the kernel would: sum from csum_start over the partial value.
        let mut done = p.to_vec();
        let c = !ref_fold(ref_sum(&done[ip_hl..]));
        done[ip_hl + 16..ip_hl + 18].copy_from_slice(&c.to_be_bytes());
        assert!(l4_valid(&done, ip_hl, 6));
        let payload: Vec<u8> = originals.iter().flat_map(|o| o[hl..].to_vec()).collect();
        assert_eq!(&p[hl..], &payload[..]);
        assert_eq!(run_segment(&hdr, p).unwrap(), originals);
    }

    // --- coalescing ---

    #[test]
    fn round_trip_tcpv4_one_frame() {
        let mut rng = Rng(21);
        let mut t = tcp4(rng.bytes(64 * 1000));
        t.options = TIMESTAMPS.to_vec();
        t.flags = TCP_ACK | TCP_PSH;
        let segs = check_segmentation(&t, GSO_TCPV4, 1000);
        assert_eq!(segs.len(), 64);
        let mut c = Coalescer::new();
        let (frames, before) = push_all(&mut c, &segs);
        assert_eq!(frames.len(), 1);
        assert_eq!(before, 1, "the 64th (PSH) segment closes the super-packet");
        check_gso_frame(&frames[0], &segs);
        assert_ne!(frames[0][VNET_HDR_LEN + 20 + 13] & TCP_PSH, 0);
    }

    #[test]
    fn round_trip_tcpv6_one_frame() {
        let mut rng = Rng(22);
        let mut t = tcp6(rng.bytes(40 * 1400 + 77));
        t.options = TIMESTAMPS.to_vec();
        let segs = check_segmentation(&t, GSO_TCPV6, 1400);
        let mut c = Coalescer::new();
        let (frames, before) = push_all(&mut c, &segs);
        assert_eq!(frames.len(), 1);
        assert_eq!(before, 1, "the short last segment closes the super-packet");
        check_gso_frame(&frames[0], &segs);
        assert_eq!(frames[0][VNET_HDR_LEN + 40 + 13], TCP_ACK);
    }

    #[test]
    fn round_trip_splits_at_the_size_limit() {
        let mut rng = Rng(23);
        let t = tcp4(rng.bytes(100 * 1448));
        let mut hdr = gso_hdr(&t, 1448);
        hdr.hdr_len = 0;
        let mut p = t.build();
        let mut scratch = vec![0; 1500];
        let mut segs = Vec::new();
        segment(&hdr, &mut p, &mut scratch, |s| segs.push(s.to_vec())).unwrap();
        assert_eq!(segs.len(), 100);
        let mut c = Coalescer::new();
        let (frames, _) = push_all(&mut c, &segs);
        // 45 segments of 1448 bytes fit in 65,535 bytes, 46 do not.
        assert_eq!(frames.len(), 3);
        check_gso_frame(&frames[0], &segs[..45]);
        check_gso_frame(&frames[1], &segs[45..90]);
        check_gso_frame(&frames[2], &segs[90..]);
    }

    #[test]
    fn round_trip_splits_at_64_segments() {
        let mut rng = Rng(24);
        let t = tcp6(Vec::new());
        let segs = t.run(150, 300, &mut rng);
        let mut c = Coalescer::new();
        let (frames, before) = push_all(&mut c, &segs);
        assert_eq!(frames.len(), 3);
        assert_eq!(before, 2);
        check_gso_frame(&frames[0], &segs[..64]);
        check_gso_frame(&frames[1], &segs[64..128]);
        check_gso_frame(&frames[2], &segs[128..]);
    }

    #[test]
    fn single_segment_is_written_unchanged() {
        let mut rng = Rng(25);
        for t in [tcp4(Vec::new()), tcp6(Vec::new())] {
            let segs = t.run(1, 1000, &mut rng);
            let mut c = Coalescer::new();
            let (frames, before) = push_all(&mut c, &segs);
            assert_eq!(before, 0, "held until the flush");
            assert_eq!(frames, vec![alone(&segs[0])]);
        }
    }

    type Packets = Vec<Vec<u8>>;

    /// Pushes two coalescable segments of `t`'s flow, then `x`; returns the frames written by
    /// then and the frames of the final flush.
    fn after_pending(t: &Tcp, x: &[u8]) -> (Packets, Packets, Packets) {
        let mut rng = Rng(26);
        let segs = t.run(2, 1000, &mut rng);
        let mut c = Coalescer::new();
        let mut out = Vec::new();
        let mut w = |f: &[u8]| out.push(f.to_vec());
        for p in &segs {
            c.push(p, &mut w);
        }
        c.push(x, &mut w);
        let mut rest = Vec::new();
        c.flush(&mut |f: &[u8]| rest.push(f.to_vec()));
        (segs, out, rest)
    }

    #[test]
    fn ineligible_packets_of_the_flow_follow_its_pending_data() {
        let mut rng = Rng(27);
        for base in [tcp4(Vec::new()), tcp6(Vec::new())] {
            let next = base.seq.wrapping_add(2000);
            let mut variants = Vec::new();
            for flags in [
                TCP_ACK,
                TCP_SYN,
                TCP_SYN | TCP_ACK,
                TCP_ACK | TCP_FIN,
                TCP_ACK | TCP_FIN | TCP_PSH,
                TCP_RST,
                TCP_ACK | TCP_URG,
                TCP_ACK | TCP_ECE,
                TCP_ACK | TCP_CWR,
                0,
            ] {
                let mut x = base.clone();
                x.seq = next;
                x.flags = flags;
                // A pure ACK has no payload; the others carry some.
                x.payload = if flags == TCP_ACK {
                    Vec::new()
                } else {
                    rng.bytes(1000)
                };
                variants.push(x.build());
            }
            // The reserved/AE bits set.
            let mut x = base.clone();
            x.seq = next;
            x.payload = rng.bytes(1000);
            let mut p = x.build();
            p[base.ip_hl() + 12] |= 0x01;
            variants.push(p);
            if !base.v6 {
                // IPv4 options.
                let mut x = base.clone();
                x.seq = next;
                x.ip_options = vec![0x94, 0x04, 0, 0];
                x.payload = rng.bytes(1000);
                variants.push(x.build());
                // A bad header checksum.
                let mut x = base.clone();
                x.seq = next;
                x.payload = rng.bytes(1000);
                let mut p = x.build();
                p[11] ^= 0x01;
                variants.push(p);
                // A length field that disagrees with the packet.
                let mut x = base.clone();
                x.seq = next;
                x.payload = rng.bytes(1000);
                let mut p = x.build();
                p.extend_from_slice(&[0; 4]);
                variants.push(p);
            } else {
                let mut x = base.clone();
                x.seq = next;
                x.payload = rng.bytes(1000);
                let mut p = x.build();
                p[4] ^= 0x01;
                variants.push(p);
            }
            for x in variants {
                let (segs, out, rest) = after_pending(&base, &x);
                assert_eq!(out.len(), 2, "pending data, then the packet");
                check_gso_frame(&out[0], &segs);
                assert_eq!(out[1], alone(&x));
                assert!(rest.is_empty());
            }
        }
    }

    #[test]
    fn breaks_in_the_stream_start_a_new_super_packet() {
        let mut rng = Rng(28);
        for base in [tcp4(Vec::new()), tcp6(Vec::new())] {
            let mut changes: Vec<Tcp> = Vec::new();
            let mut next = base.clone();
            next.seq = base.seq.wrapping_add(2000);
            next.payload = rng.bytes(1000);
            let mut x = next.clone();
            x.seq += 1000; // a gap
            changes.push(x);
            let mut x = next.clone();
            x.seq -= 1000; // a retransmission
            changes.push(x);
            let mut x = next.clone();
            x.ack += 1;
            changes.push(x);
            let mut x = next.clone();
            x.window += 1;
            changes.push(x);
            let mut x = next.clone();
            x.options = TIMESTAMPS.to_vec();
            changes.push(x);
            let mut x = next.clone();
            x.ttl -= 1;
            changes.push(x);
            let mut x = next.clone();
            x.tos = 0x03; // CE
            changes.push(x);
            if !base.v6 {
                let mut x = next.clone();
                x.frag = 0; // DF cleared
                changes.push(x);
            }
            let mut x = next.clone();
            x.payload = rng.bytes(1001); // longer than the first segment
            changes.push(x);
            for x in changes {
                let p = x.build();
                let (segs, out, rest) = after_pending(&base, &p);
                assert_eq!(out.len(), 1, "{x:?}");
                check_gso_frame(&out[0], &segs);
                // The packet now waits on its own, and goes out unchanged.
                assert_eq!(rest, vec![alone(&p)]);
            }
        }
        // Options that differ from the first segment's.
        let mut base = tcp4(Vec::new());
        base.options = TIMESTAMPS.to_vec();
        let mut x = base.clone();
        x.seq += 2000;
        x.options[11] = 3;
        x.payload = rng.bytes(1000);
        let p = x.build();
        let (segs, out, rest) = after_pending(&base, &p);
        check_gso_frame(&out[0], &segs);
        assert_eq!(rest, vec![alone(&p)]);
    }

    #[test]
    fn other_flows_and_protocols_do_not_disturb_a_pending_flow() {
        let base = tcp4(Vec::new());
        let u = udp(false, &[1, 2, 3]);
        let u6 = udp(true, &[1, 2, 3]);
        let mut other = base.clone();
        other.sport += 1;
        other.flags = TCP_ACK | TCP_SYN;
        let mut reverse = base.clone();
        std::mem::swap(&mut reverse.sport, &mut reverse.dport);
        std::mem::swap(&mut reverse.src, &mut reverse.dst);
        let junk = vec![0x45, 1, 2];
        for x in [u, u6, other.build(), reverse.build(), junk, Vec::new()] {
            let (segs, out, rest) = after_pending(&base, &x);
            assert_eq!(out, vec![alone(&x)]);
            assert_eq!(rest.len(), 1);
            check_gso_frame(&rest[0], &segs);
        }
    }

    #[test]
    fn unknown_flows_flush_everything_first() {
        let mut rng = Rng(29);
        let a = tcp4(Vec::new());
        let mut b = a.clone();
        b.sport += 1;
        let sa = a.run(3, 500, &mut rng);
        let sb = b.run(3, 500, &mut rng);
        let mut fragment = a.clone();
        fragment.frag = 0x2000; // MF
        fragment.seq += 1500;
        fragment.payload = rng.bytes(100);
        let mut later_fragment = fragment.clone();
        later_fragment.frag = 0x0010;
        let mut ext6 = tcp6(rng.bytes(100));
        ext6.ip_options = HOP_BY_HOP.to_vec();
        ext6.ext_next = 0;
        for x in [fragment.build(), later_fragment.build(), ext6.build()] {
            let mut c = Coalescer::new();
            let mut packets = sa.clone();
            packets.extend(sb.clone());
            packets.push(x.clone());
            let (frames, before) = push_all(&mut c, &packets);
            assert_eq!(before, 3);
            assert_eq!(frames.len(), 3);
            let (mut fa, mut fb) = (0, 0);
            for f in &frames[..2] {
                if f[VNET_HDR_LEN + 20] == sa[0][20] && f[VNET_HDR_LEN + 21] == sa[0][21] {
                    check_gso_frame(f, &sa);
                    fa += 1;
                } else {
                    check_gso_frame(f, &sb);
                    fb += 1;
                }
            }
            assert_eq!((fa, fb), (1, 1));
            assert_eq!(frames[2], alone(&x));
        }
    }

    #[test]
    fn a_short_segment_closes_the_super_packet() {
        let mut rng = Rng(30);
        for base in [tcp4(Vec::new()), tcp6(Vec::new())] {
            let mut segs = base.run(3, 1000, &mut rng);
            let mut short = base.clone();
            short.seq += 3000;
            short.id += 3;
            short.payload = rng.bytes(10);
            segs.push(short.build());
            let mut after = base.clone();
            after.seq += 3010;
            after.id += 4;
            let more = after.run(2, 1000, &mut rng);
            let mut c = Coalescer::new();
            let mut out = Vec::new();
            for p in &segs {
                c.push(p, &mut |f: &[u8]| out.push(f.to_vec()));
            }
            assert_eq!(out.len(), 1, "written as soon as it closed");
            for p in &more {
                c.push(p, &mut |f: &[u8]| out.push(f.to_vec()));
            }
            assert_eq!(out.len(), 1);
            c.flush(&mut |f: &[u8]| out.push(f.to_vec()));
            assert_eq!(out.len(), 2);
            check_gso_frame(&out[0], &segs);
            check_gso_frame(&out[1], &more);
        }
    }

    #[test]
    fn a_psh_segment_closes_the_super_packet() {
        let mut rng = Rng(31);
        for base in [tcp4(Vec::new()), tcp6(Vec::new())] {
            let mut segs = base.run(3, 1000, &mut rng);
            let mut last = base.clone();
            last.seq += 3000;
            last.id += 3;
            last.flags = TCP_ACK | TCP_PSH;
            last.payload = rng.bytes(1000);
            segs.push(last.build());
            let mut after = base.clone();
            after.seq += 4000;
            after.id += 4;
            let more = after.run(2, 1000, &mut rng);
            let mut all = segs.clone();
            all.extend(more.clone());
            let mut c = Coalescer::new();
            let (frames, before) = push_all(&mut c, &all);
            assert_eq!(before, 1);
            assert_eq!(frames.len(), 2);
            check_gso_frame(&frames[0], &segs);
            assert_ne!(frames[0][VNET_HDR_LEN + base.ip_hl() + 13] & TCP_PSH, 0);
            check_gso_frame(&frames[1], &more);
            assert_eq!(frames[1][VNET_HDR_LEN + base.ip_hl() + 13], TCP_ACK);
            // A PSH segment with nothing pending goes straight out.
            let mut c = Coalescer::new();
            let (frames, before) = push_all(&mut c, &segs[3..]);
            assert_eq!((frames, before), (vec![alone(&segs[3])], 1));
        }
    }

    #[test]
    fn interleaved_flows_coalesce_per_flow() {
        let mut rng = Rng(32);
        let mut flows = Vec::new();
        for i in 0..3u16 {
            let mut t = if i == 1 {
                tcp6(Vec::new())
            } else {
                tcp4(Vec::new())
            };
            t.sport += i;
            flows.push(t.run(10, 1200, &mut rng));
        }
        let mut packets = Vec::new();
        for k in 0..10 {
            for f in &flows {
                packets.push(f[k].clone());
            }
        }
        let mut c = Coalescer::new();
        let (frames, before) = push_all(&mut c, &packets);
        assert_eq!(before, 0);
        assert_eq!(frames.len(), 3);
        for f in &frames {
            let matching = flows
                .iter()
                .find(|segs| {
                    let hl = f.len() - VNET_HDR_LEN - 10 * 1200;
                    let ip_hl = hl - 20;
                    f[VNET_HDR_LEN + ip_hl..VNET_HDR_LEN + ip_hl + 4] == segs[0][ip_hl..ip_hl + 4]
                        && f[VNET_HDR_LEN] >> 4 == segs[0][0] >> 4
                })
                .unwrap();
            check_gso_frame(f, matching);
        }
    }

    /// The TCP header (checksum zeroed) and payload of a TCP packet, and its flow.
    fn tcp_view(p: &[u8]) -> (Vec<u8>, Vec<u8>) {
        let ip_hl = if p[0] >> 4 == 6 {
            40
        } else {
            usize::from(p[0] & 0x0f) * 4
        };
        let mut body = p[ip_hl..].to_vec();
        body[16] = 0;
        body[17] = 0;
        let flow = if p[0] >> 4 == 6 {
            [&p[8..40], &p[ip_hl..ip_hl + 4]].concat()
        } else {
            [&p[12..20], &p[ip_hl..ip_hl + 4]].concat()
        };
        (flow, body)
    }

    /// Splits written frames back into packets: coalesced frames are segmented again.
    fn unframe(frames: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut packets = Vec::new();
        for f in frames {
            let hdr = VnetHdr::parse(f).unwrap();
            if hdr.gso_type == GSO_NONE {
                assert_eq!(hdr, VnetHdr::parse(&alone(&[])).unwrap());
                packets.push(f[VNET_HDR_LEN..].to_vec());
            } else {
                check_gso_frame(f, &run_segment(&hdr, &f[VNET_HDR_LEN..]).unwrap());
                packets.extend(run_segment(&hdr, &f[VNET_HDR_LEN..]).unwrap());
            }
        }
        packets
    }

    /// Every packet comes out exactly once, and within each flow in the order pushed.
    fn check_order_per_flow(pushed: &[Vec<u8>], frames: &[Vec<u8>]) {
        let out = unframe(frames);
        assert_eq!(out.len(), pushed.len());
        let per_flow = |packets: &[Vec<u8>]| {
            let mut flows: Vec<(Vec<u8>, Vec<Vec<u8>>)> = Vec::new();
            let mut others: Vec<Vec<u8>> = Vec::new();
            for p in packets {
                let tcp = p.len() >= 40
                    && ((p[0] >> 4 == 4 && p[9] == 6) || (p[0] >> 4 == 6 && p[6] == 6));
                if !tcp {
                    others.push(p.clone());
                    continue;
                }
                let (flow, body) = tcp_view(p);
                match flows.iter_mut().find(|(f, _)| *f == flow) {
                    Some((_, list)) => list.push(body),
                    None => flows.push((flow, vec![body])),
                }
            }
            flows.sort();
            others.sort();
            (flows, others)
        };
        assert_eq!(per_flow(&out), per_flow(pushed));
    }

    #[test]
    fn more_flows_than_slots_lose_nothing() {
        let mut rng = Rng(33);
        let mut flows = Vec::new();
        for i in 0..12u16 {
            let mut t = if i % 2 == 0 {
                tcp4(Vec::new())
            } else {
                tcp6(Vec::new())
            };
            t.sport += i;
            flows.push(t.run(6, 700, &mut rng));
        }
        let mut packets = Vec::new();
        for k in 0..6 {
            for f in &flows {
                packets.push(f[k].clone());
            }
        }
        let mut c = Coalescer::new();
        let (frames, _) = push_all(&mut c, &packets);
        check_order_per_flow(&packets, &frames);
        // With 8 flows round-robin every flow keeps its slot.
        let mut packets = Vec::new();
        for k in 0..6 {
            for f in &flows[..8] {
                packets.push(f[k].clone());
            }
        }
        let (frames, _) = push_all(&mut c, &packets);
        assert_eq!(frames.len(), 8);
        check_order_per_flow(&packets, &frames);
    }

    #[test]
    fn random_streams_keep_every_packet_and_flow_order() {
        let mut rng = Rng(34);
        let mut c = Coalescer::new();
        let mut coalesced = 0;
        for round in 0..60 {
            let nflows = 1 + rng.below(12);
            let mut flows: Vec<Tcp> = (0..nflows)
                .map(|i| {
                    let mut t = if rng.below(2) == 0 {
                        tcp4(Vec::new())
                    } else {
                        tcp6(Vec::new())
                    };
                    t.sport = i as u16;
                    t.seq = rng.next() as u32;
                    t.id = rng.next() as u16;
                    if rng.below(2) == 0 {
                        t.options = TIMESTAMPS.to_vec();
                    }
                    t
                })
                .collect();
            let sizes = [1, 100, 536, 1000, 1448];
            let mut packets = Vec::new();
            for _ in 0..(50 + rng.below(300)) {
                let f = rng.below(nflows);
                let t = &mut flows[f];
                let size = match rng.below(10) {
                    0 => rng.below(1500),
                    1 => 0,
                    _ => sizes[usize::from(t.sport) % sizes.len()],
                };
                let mut s = t.clone();
                s.payload = rng.bytes(size);
                s.flags = match rng.below(30) {
                    0 => TCP_ACK | TCP_PSH,
                    1 => TCP_ACK | TCP_FIN,
                    2 => TCP_ACK | TCP_CWR,
                    _ => TCP_ACK,
                };
                match rng.below(40) {
                    0 => s.seq = s.seq.wrapping_sub(1000),
                    1 => s.ack += 1,
                    2 => s.ttl -= 1,
                    _ => {}
                }
                t.seq = s.seq.wrapping_add(size as u32);
                t.id = t.id.wrapping_add(1);
                packets.push(s.build());
                if rng.below(50) == 0 {
                    let v6 = rng.below(2) == 0;
                    let len = rng.below(200);
                    packets.push(udp(v6, &rng.bytes(len)));
                }
            }
            let mut out = Vec::new();
            let mut w = |f: &[u8]| out.push(f.to_vec());
            let mut start = 0;
            while start < packets.len() {
                let end = (start + 1 + rng.below(100)).min(packets.len());
                for p in &packets[start..end] {
                    c.push(p, &mut w);
                }
                c.flush(&mut w);
                start = end;
            }
            assert!(
                out.len() < packets.len(),
                "round {round}: nothing coalesced"
            );
            check_order_per_flow(&packets, &out);
            coalesced += out.iter().filter(|f| f[1] != GSO_NONE).count();
        }
        assert!(coalesced > 500, "{coalesced} coalesced frames");
    }

    // --- robustness ---

    #[test]
    fn segment_survives_garbage() {
        let mut rng = Rng(35);
        let mut valid = Vec::new();
        for v6 in [false, true] {
            for opts in [false, true] {
                let mut t = if v6 {
                    tcp6(rng.bytes(5000))
                } else {
                    tcp4(rng.bytes(5000))
                };
                if opts {
                    t.options = TIMESTAMPS.to_vec();
                }
                valid.push((super_packet(&t), gso_hdr(&t, 1000)));
            }
        }
        let types = [
            GSO_NONE,
            GSO_TCPV4,
            GSO_TCPV6,
            GSO_TCPV4 | GSO_ECN,
            GSO_TCPV6 | GSO_ECN,
            GSO_UDP,
            GSO_UDP_L4,
        ];
        let mut scratch = vec![0; 70_000];
        for i in 0..30_000 {
            let (mut packet, hdr) = match i % 3 {
                0 => {
                    let len = rng.below(300);
                    let mut p = rng.bytes(len);
                    if len > 0 && rng.below(2) == 0 {
                        p[0] = if rng.below(2) == 0 { 0x45 } else { 0x60 };
                    }
                    let hdr = VnetHdr {
                        flags: rng.next() as u8,
                        gso_type: types[rng.below(types.len())],
                        hdr_len: rng.below(400) as u16,
                        gso_size: rng.below(300) as u16,
                        csum_start: rng.below(300) as u16,
                        csum_offset: rng.below(40) as u16,
                    };
                    (p, hdr)
                }
                1 => {
                    let (p, hdr) = &valid[rng.below(valid.len())];
                    let len = rng.below(p.len() + 1);
                    (p[..len].to_vec(), *hdr)
                }
                _ => {
                    let (p, hdr) = &valid[rng.below(valid.len())];
                    let mut p = p.clone();
                    for _ in 0..1 + rng.below(4) {
                        let at = rng.below(80);
                        p[at] = rng.next() as u8;
                    }
                    let mut hdr = *hdr;
                    if rng.below(4) == 0 {
                        hdr.gso_size = 1 + rng.below(3000) as u16;
                    }
                    (p, hdr)
                }
            };
            let scratch_len = if rng.below(4) == 0 {
                rng.below(3000)
            } else {
                scratch.len()
            };
            let mut emitted = 0;
            let tcp_gso = hdr.gso_type & !GSO_ECN != GSO_NONE;
            let r = segment(&hdr, &mut packet, &mut scratch[..scratch_len], |s| {
                emitted += 1;
                if tcp_gso {
                    let v6 = s[0] >> 4 == 6;
                    if !v6 {
                        assert!(ipv4_valid(s));
                        assert!(l4_valid(s, usize::from(s[0] & 0x0f) * 4, 6));
                    } else if s[6] == 6 {
                        assert!(l4_valid(s, 40, 6));
                    }
                }
            });
            match r {
                Ok(n) => assert_eq!(n, emitted),
                Err(_) => assert_eq!(emitted, 0),
            }
        }
    }

    /// How many packets, and how many bytes, a written frame stands for.
    fn frame_content(f: &[u8]) -> (usize, usize) {
        let hdr = VnetHdr::parse(f).unwrap();
        let len = f.len() - VNET_HDR_LEN;
        if hdr.gso_type == GSO_NONE {
            return (1, len);
        }
        let hl = usize::from(hdr.hdr_len);
        let segs = (len - hl).div_ceil(usize::from(hdr.gso_size));
        (segs, len + (segs - 1) * hl)
    }

    #[test]
    fn coalescer_survives_garbage_and_keeps_every_byte() {
        let mut rng = Rng(36);
        let mut c = Coalescer::default();
        let mut bases = Vec::new();
        for i in 0..10u16 {
            let mut t = if i % 2 == 0 {
                tcp4(Vec::new())
            } else {
                tcp6(Vec::new())
            };
            t.sport = i;
            if i % 3 == 0 {
                t.options = TIMESTAMPS.to_vec();
            }
            bases.push(t);
        }
        let (mut packets_in, mut bytes_in) = (0, 0);
        let (mut packets_out, mut bytes_out) = (0, 0);
        let mut coalesced = 0;
        for _ in 0..200 {
            let mut out = Vec::new();
            let mut w = |f: &[u8]| out.push(f.to_vec());
            for _ in 0..rng.below(200) {
                let t = &mut bases[rng.below(10)];
                let size = if rng.below(8) == 0 {
                    rng.below(1500)
                } else {
                    1000
                };
                let mut s = t.clone();
                s.payload = rng.bytes(size);
                t.seq = t.seq.wrapping_add(size as u32);
                let mut p = s.build();
                match rng.below(6) {
                    0 => {
                        let len = rng.below(p.len() + 1);
                        p.truncate(len);
                    }
                    1 => {
                        for _ in 0..1 + rng.below(3) {
                            let at = rng.below(p.len().min(80));
                            p[at] = rng.next() as u8;
                        }
                    }
                    2 => {
                        let len = rng.below(100);
                        p = rng.bytes(len);
                    }
                    _ => {}
                }
                packets_in += 1;
                bytes_in += p.len();
                c.push(&p, &mut w);
            }
            c.flush(&mut w);
            coalesced += out.iter().filter(|f| f[1] != GSO_NONE).count();
            for f in &out {
                let (n, b) = frame_content(f);
                packets_out += n;
                bytes_out += b;
            }
        }
        assert_eq!((packets_out, bytes_out), (packets_in, bytes_in));
        assert!(coalesced > 100, "{coalesced} coalesced frames");
    }

    #[test]
    fn oversized_input_is_dropped_without_panic() {
        let mut c = Coalescer::new();
        let mut written = 0;
        c.push(&vec![0x45; MAX_PACKET + 1], &mut |_: &[u8]| written += 1);
        c.push(&vec![0x60; MAX_PACKET], &mut |_: &[u8]| written += 1);
        assert_eq!(written, 1);
    }
}
