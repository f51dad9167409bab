//! The DNS wire format, as much of it as a stub-facing server needs: a query's header, its one
//! question and its EDNS OPT record, and responses written straight into a reused buffer.
//!
//! Everything here is bounds-checked slice arithmetic on borrowed bytes; nothing allocates except
//! the growth of the caller's output buffer. A malformed packet is an `Err`, never a panic.

use std::net::Ipv4Addr;

/// The response codes this server sends: the management API's, so that a lookup reports what
/// the server would send.
pub(crate) use ployz_core::api::Rcode;

/// Length of the fixed DNS header.
pub(crate) const HEADER_LEN: usize = 12;
/// Longest name on the wire (RFC 1035 §3.1), length octets and the root label included.
pub(crate) const MAX_WIRE_NAME: usize = 255;
/// Longest label (RFC 1035 §2.3.4).
const MAX_LABEL: usize = 63;
/// The UDP payload every client accepts (RFC 1035 §4.2.1).
pub const CLASSIC_UDP_PAYLOAD: usize = 512;
/// The most this server puts in one UDP datagram, whatever a client advertises: the size DNS
/// Flag Day 2020 settled on, which fits any sane MTU without fragmentation.
pub const MAX_UDP_PAYLOAD: usize = 1232;

/// Record types this server speaks of.
pub(crate) mod rtype {
    pub const A: u16 = 1;
    pub const SOA: u16 = 6;
    pub const OPT: u16 = 41;
    pub const ANY: u16 = 255;
}

/// The Internet class.
pub(crate) const CLASS_IN: u16 = 1;

/// Header flag bits (second 16-bit word).
const QR: u16 = 0x8000;
const AA: u16 = 0x0400;
const TC: u16 = 0x0200;
const RD: u16 = 0x0100;
const RA: u16 = 0x0080;
const CD: u16 = 0x0010;

/// Offsets of the section counts in the header.
const QDCOUNT: usize = 4;
const ANCOUNT: usize = 6;
const NSCOUNT: usize = 8;
const ARCOUNT: usize = 10;

/// A compression pointer to the question name, which always starts right after the header.
pub(crate) const QNAME_POINTER: u16 = 0xC000 | HEADER_LEN as u16;

/// What a query's OPT record told us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Edns {
    /// The UDP payload size the client accepts.
    pub udp_payload: u16,
    /// The EDNS version the client speaks.
    pub version: u8,
    /// The DO bit: the client wants DNSSEC records.
    pub dnssec_ok: bool,
}

/// A parsed query: borrowed from the packet it came in.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Query<'a> {
    pub id: u16,
    /// Opcode bits of the header, echoed in the response.
    opcode: u8,
    /// Recursion Desired and Checking Disabled, echoed in the response.
    pub rd: bool,
    pub cd: bool,
    /// The question section exactly as received (QNAME, QTYPE, QCLASS): echoed verbatim, so a
    /// client's case randomisation survives.
    pub question: &'a [u8],
    pub qtype: u16,
    pub qclass: u16,
    pub edns: Option<Edns>,
}

impl<'a> Query<'a> {
    /// The QNAME in wire form (labels and root).
    pub fn qname(&self) -> &'a [u8] {
        &self.question[..self.question.len() - 4]
    }

    /// How large a UDP response to this query may be.
    pub fn udp_limit(&self) -> usize {
        udp_limit(self.edns)
    }
}

/// How large a UDP response may be: 512 bytes without EDNS, else what the client advertised,
/// between 512 and [`MAX_UDP_PAYLOAD`].
pub(crate) fn udp_limit(edns: Option<Edns>) -> usize {
    match edns {
        None => CLASSIC_UDP_PAYLOAD,
        Some(e) => usize::from(e.udp_payload).clamp(CLASSIC_UDP_PAYLOAD, MAX_UDP_PAYLOAD),
    }
}

/// Why a packet is not a query this server answers normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Malformed {
    /// Not worth a reply: shorter than a header, or itself a response (answering a response
    /// invites loops and reflection).
    Ignore,
    /// Answer with a bare header carrying `rcode`.
    Reply {
        id: u16,
        opcode: u8,
        rd: bool,
        rcode: Rcode,
    },
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// Length of the uncompressed name starting at `start`, validating its labels; `None` if it is
/// truncated, compressed, uses an extended label type or is longer than 255 octets.
fn plain_name_len(packet: &[u8], start: usize) -> Option<usize> {
    let mut pos = start;
    loop {
        let len = usize::from(*packet.get(pos)?);
        if len == 0 {
            let total = pos + 1 - start;
            return (total <= MAX_WIRE_NAME).then_some(total);
        }
        if len > MAX_LABEL {
            return None;
        }
        pos += 1 + len;
        if pos - start >= MAX_WIRE_NAME {
            return None;
        }
    }
}

/// The offset just past the name at `start`, which may end in a compression pointer.
fn skip_name(packet: &[u8], start: usize) -> Option<usize> {
    let mut pos = start;
    loop {
        let len = *packet.get(pos)?;
        match len & 0xC0 {
            0x00 if len == 0 => return Some(pos + 1),
            0x00 => {
                pos += 1 + usize::from(len);
                if pos - start >= MAX_WIRE_NAME {
                    return None;
                }
            }
            0xC0 => return (pos + 2 <= packet.len()).then_some(pos + 2),
            _ => return None,
        }
    }
}

/// Parses a query: a header, exactly one question, nothing in the answer and authority
/// sections, and at most one OPT record among the additional records.
pub(crate) fn parse_query(packet: &[u8]) -> Result<Query<'_>, Malformed> {
    if packet.len() < HEADER_LEN {
        return Err(Malformed::Ignore);
    }
    let id = be16(packet, 0);
    let flags = be16(packet, 2);
    if flags & QR != 0 {
        return Err(Malformed::Ignore);
    }
    let opcode = ((flags >> 11) & 0x0f) as u8;
    let rd = flags & RD != 0;
    let fail = |rcode| Malformed::Reply {
        id,
        opcode,
        rd,
        rcode,
    };
    if opcode != 0 {
        return Err(fail(Rcode::NotImp));
    }
    if be16(packet, QDCOUNT) != 1 || be16(packet, ANCOUNT) != 0 || be16(packet, NSCOUNT) != 0 {
        return Err(fail(Rcode::FormErr));
    }
    let name_len = plain_name_len(packet, HEADER_LEN).ok_or(fail(Rcode::FormErr))?;
    let question_end = HEADER_LEN + name_len + 4;
    if question_end > packet.len() {
        return Err(fail(Rcode::FormErr));
    }
    let qtype = be16(packet, HEADER_LEN + name_len);
    let qclass = be16(packet, HEADER_LEN + name_len + 2);

    let mut edns = None;
    let mut pos = question_end;
    for _ in 0..be16(packet, ARCOUNT) {
        let owner = pos;
        pos = skip_name(packet, pos).ok_or(fail(Rcode::FormErr))?;
        if pos + 10 > packet.len() {
            return Err(fail(Rcode::FormErr));
        }
        let rr_type = be16(packet, pos);
        let class = be16(packet, pos + 2);
        let ttl = u32::from_be_bytes([
            packet[pos + 4],
            packet[pos + 5],
            packet[pos + 6],
            packet[pos + 7],
        ]);
        let rdlen = usize::from(be16(packet, pos + 8));
        pos += 10 + rdlen;
        if pos > packet.len() {
            return Err(fail(Rcode::FormErr));
        }
        if rr_type == rtype::OPT {
            // RFC 6891 §6.1.1: the owner is the root, and there is only one.
            if edns.is_some() || packet[owner] != 0 {
                return Err(fail(Rcode::FormErr));
            }
            edns = Some(Edns {
                udp_payload: class,
                version: (ttl >> 16) as u8,
                dnssec_ok: ttl & 0x8000 != 0,
            });
        }
    }
    Ok(Query {
        id,
        opcode,
        rd,
        cd: flags & CD != 0,
        question: &packet[HEADER_LEN..question_end],
        qtype,
        qclass,
        edns,
    })
}

/// Writes the wire-form `qname` as lowercase dotted text without the trailing dot (the root is
/// empty). `None` when a label holds a dot or is not ASCII: no name this server owns looks
/// like that, and flattening it to text could make it alias one that does.
pub(crate) fn lower_dotted<'b>(qname: &[u8], buf: &'b mut [u8; MAX_WIRE_NAME]) -> Option<&'b [u8]> {
    let mut pos = 0;
    let mut len = 0;
    while let Some(&label) = qname.get(pos) {
        let label = usize::from(label);
        if label == 0 {
            break;
        }
        let text = qname.get(pos + 1..pos + 1 + label)?;
        if len > 0 {
            *buf.get_mut(len)? = b'.';
            len += 1;
        }
        let dst = buf.get_mut(len..len + label)?;
        for (d, s) in dst.iter_mut().zip(text) {
            if *s == b'.' || !s.is_ascii() {
                return None;
            }
            *d = s.to_ascii_lowercase();
        }
        len += label;
        pos += 1 + label;
    }
    Some(&buf[..len])
}

fn put16(out: &mut [u8], at: usize, v: u16) {
    out[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

fn bump(out: &mut [u8], count_at: usize) {
    let v = be16(out, count_at);
    put16(out, count_at, v.wrapping_add(1));
}

fn header_flags(opcode: u8, rd: bool, cd: bool, authoritative: bool, rcode: Rcode) -> u16 {
    let mut flags = QR | RA | (u16::from(opcode & 0x0f) << 11) | (rcode.code() & 0x0f);
    if authoritative {
        flags |= AA;
    }
    if rd {
        flags |= RD;
    }
    if cd {
        flags |= CD;
    }
    flags
}

/// Starts a response to `q` in `out`: the header and the echoed question. Records are added
/// with the `push_*` functions, which keep the header counts right.
pub(crate) fn start_response(out: &mut Vec<u8>, q: &Query<'_>, rcode: Rcode, authoritative: bool) {
    out.clear();
    out.extend_from_slice(&q.id.to_be_bytes());
    let flags = header_flags(q.opcode, q.rd, q.cd, authoritative, rcode);
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, 0]);
    out.extend_from_slice(q.question);
}

/// A bare header for a packet whose question could not be read.
pub(crate) fn header_only(out: &mut Vec<u8>, id: u16, opcode: u8, rd: bool, rcode: Rcode) {
    out.clear();
    out.extend_from_slice(&id.to_be_bytes());
    let flags = header_flags(opcode, rd, false, false, rcode);
    out.extend_from_slice(&flags.to_be_bytes());
    out.extend_from_slice(&[0; 8]);
}

/// Size of one A record whose owner is a compression pointer.
pub(crate) const A_RECORD_LEN: usize = 2 + 10 + 4;
/// Size of the OPT record this server appends.
pub(crate) const OPT_RECORD_LEN: usize = 11;

/// Appends an A record with TTL 0 owned by the name `owner` points at.
pub(crate) fn push_a(out: &mut Vec<u8>, owner: u16, addr: Ipv4Addr) {
    out.extend_from_slice(&owner.to_be_bytes());
    out.extend_from_slice(&[0, 1, 0, 1, 0, 0, 0, 0, 0, 4]);
    out.extend_from_slice(&addr.octets());
    bump(out, ANCOUNT);
}

/// Which section a record goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Section {
    Answer,
    Authority,
}

/// Appends the zone's SOA (TTL 0, negative-caching TTL 0) owned by the apex `apex` points at:
/// `internal. 0 IN SOA internal. hostmaster.internal. <serial> 3600 600 86400 0`.
pub(crate) fn push_soa(out: &mut Vec<u8>, section: Section, apex: u16, serial: u32) {
    const RNAME_LABEL: &[u8] = b"\x0ahostmaster";
    let rdlen = 2 + RNAME_LABEL.len() + 2 + 20;
    out.extend_from_slice(&apex.to_be_bytes());
    out.extend_from_slice(&rtype::SOA.to_be_bytes());
    out.extend_from_slice(&CLASS_IN.to_be_bytes());
    out.extend_from_slice(&0u32.to_be_bytes());
    out.extend_from_slice(&(rdlen as u16).to_be_bytes());
    out.extend_from_slice(&apex.to_be_bytes());
    out.extend_from_slice(RNAME_LABEL);
    out.extend_from_slice(&apex.to_be_bytes());
    for v in [serial, 3600, 600, 86400, 0] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    bump(
        out,
        match section {
            Section::Answer => ANCOUNT,
            Section::Authority => NSCOUNT,
        },
    );
}

/// Appends this server's OPT record: payload [`MAX_UDP_PAYLOAD`], version 0, and the upper
/// eight bits of `rcode` (non-zero only for BADVERS).
pub(crate) fn push_opt(out: &mut Vec<u8>, rcode: Rcode) {
    out.push(0);
    out.extend_from_slice(&rtype::OPT.to_be_bytes());
    out.extend_from_slice(&(MAX_UDP_PAYLOAD as u16).to_be_bytes());
    out.push((rcode.code() >> 4) as u8);
    out.extend_from_slice(&[0, 0, 0, 0, 0]);
    bump(out, ARCOUNT);
}

/// Sets the TC bit of a response.
pub(crate) fn set_truncated(out: &mut [u8]) {
    let flags = be16(out, 2) | TC;
    put16(out, 2, flags);
}

/// The compression pointer to the zone apex `internal.` inside a question name that ends with
/// it (`qname_len` is the wire length of the name).
pub(crate) fn apex_pointer(qname_len: usize) -> u16 {
    const APEX_WIRE_LEN: usize = b"\x08internal\x00".len();
    0xC000 | (HEADER_LEN + qname_len - APEX_WIRE_LEN) as u16
}

/// Replaces a message's ID.
pub(crate) fn set_id(msg: &mut [u8], id: u16) {
    if msg.len() >= 2 {
        put16(msg, 0, id);
    }
}

/// Whether `reply` answers the query with `id` and `question`: a response, same ID, one
/// question equal to ours (names compared case-insensitively).
pub(crate) fn reply_matches(reply: &[u8], id: u16, question: &[u8]) -> bool {
    reply.len() >= HEADER_LEN + question.len()
        && be16(reply, 0) == id
        && be16(reply, 2) & QR != 0
        && be16(reply, QDCOUNT) == 1
        && reply[HEADER_LEN..HEADER_LEN + question.len()].eq_ignore_ascii_case(question)
}

/// Whether a response has its TC bit set.
pub(crate) fn is_truncated(reply: &[u8]) -> bool {
    reply.len() >= HEADER_LEN && be16(reply, 2) & TC != 0
}

/// The 4-bit response code of a response header.
pub(crate) fn header_rcode(reply: &[u8]) -> u8 {
    if reply.len() < HEADER_LEN {
        return 0;
    }
    (be16(reply, 2) & 0x0f) as u8
}

/// Cuts a forwarded reply that does not fit in `limit` bytes down to its header and question
/// with TC set (and this server's OPT when the client spoke EDNS), so the client retries over
/// TCP. Replies that fit are left alone; returns whether it cut.
pub(crate) fn truncate_reply(reply: &mut Vec<u8>, q: &Query<'_>, limit: usize) -> bool {
    if reply.len() <= limit {
        return false;
    }
    reply.truncate(HEADER_LEN);
    put16(reply, QDCOUNT, 1);
    put16(reply, ANCOUNT, 0);
    put16(reply, NSCOUNT, 0);
    put16(reply, ARCOUNT, 0);
    reply.extend_from_slice(q.question);
    set_truncated(reply);
    if q.edns.is_some() {
        push_opt(reply, Rcode::NoError);
    }
    true
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A query for `name` (dotted, no trailing dot) and `qtype`, optionally with an OPT record.
    pub(crate) fn query(id: u16, name: &str, qtype: u16, edns: Option<u16>) -> Vec<u8> {
        let mut p = Vec::new();
        p.extend_from_slice(&id.to_be_bytes());
        p.extend_from_slice(&0x0100u16.to_be_bytes());
        p.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, u8::from(edns.is_some())]);
        for label in name.split('.').filter(|l| !l.is_empty()) {
            p.push(label.len() as u8);
            p.extend_from_slice(label.as_bytes());
        }
        p.push(0);
        p.extend_from_slice(&qtype.to_be_bytes());
        p.extend_from_slice(&CLASS_IN.to_be_bytes());
        if let Some(size) = edns {
            p.extend_from_slice(&[0, 0, 41]);
            p.extend_from_slice(&size.to_be_bytes());
            p.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
        }
        p
    }

    #[test]
    fn parses_a_plain_query() {
        let p = query(7, "Web.Internal", rtype::A, None);
        let q = parse_query(&p).unwrap();
        assert_eq!(q.id, 7);
        assert_eq!(q.qtype, rtype::A);
        assert_eq!(q.qclass, CLASS_IN);
        assert_eq!(q.edns, None);
        assert_eq!(q.qname(), b"\x03Web\x08Internal\x00");
        let mut buf = [0; MAX_WIRE_NAME];
        assert_eq!(lower_dotted(q.qname(), &mut buf).unwrap(), b"web.internal");
    }

    #[test]
    fn reads_the_edns_payload_size() {
        let p = query(1, "a.internal", rtype::A, Some(4096));
        let q = parse_query(&p).unwrap();
        assert_eq!(
            q.edns,
            Some(Edns {
                udp_payload: 4096,
                version: 0,
                dnssec_ok: false,
            })
        );
        assert_eq!(q.udp_limit(), MAX_UDP_PAYLOAD);
        let small = query(1, "a.internal", rtype::A, Some(100));
        assert_eq!(
            parse_query(&small).unwrap().udp_limit(),
            CLASSIC_UDP_PAYLOAD
        );
        let plain = query(1, "a.internal", rtype::A, None);
        assert_eq!(
            parse_query(&plain).unwrap().udp_limit(),
            CLASSIC_UDP_PAYLOAD
        );
    }

    #[test]
    fn ignores_short_packets_and_responses() {
        assert_eq!(parse_query(&[0; 11]).unwrap_err(), Malformed::Ignore);
        let mut p = query(1, "a.internal", rtype::A, None);
        p[2] |= 0x80;
        assert_eq!(parse_query(&p).unwrap_err(), Malformed::Ignore);
    }

    #[test]
    fn refuses_two_questions_and_odd_opcodes() {
        let mut p = query(9, "a.internal", rtype::A, None);
        p[5] = 2;
        assert!(matches!(
            parse_query(&p),
            Err(Malformed::Reply {
                id: 9,
                rcode: Rcode::FormErr,
                ..
            })
        ));
        let mut p = query(9, "a.internal", rtype::A, None);
        p[5] = 0;
        assert!(matches!(
            parse_query(&p),
            Err(Malformed::Reply {
                rcode: Rcode::FormErr,
                ..
            })
        ));
        let mut p = query(9, "a.internal", rtype::A, None);
        p[2] |= 5 << 3; // UPDATE
        assert!(matches!(
            parse_query(&p),
            Err(Malformed::Reply {
                rcode: Rcode::NotImp,
                ..
            })
        ));
    }

    #[test]
    fn rejects_oversized_and_compressed_names() {
        let long = vec!["a".repeat(63); 4].join(".");
        let p = query(1, &long, rtype::A, None);
        assert!(matches!(
            parse_query(&p),
            Err(Malformed::Reply {
                rcode: Rcode::FormErr,
                ..
            })
        ));
        let mut p = query(1, "", rtype::A, None);
        p[12] = 0xC0;
        p.insert(13, 12);
        assert!(parse_query(&p).is_err());
        let fits = vec!["a".repeat(63); 3].join(".") + "." + &"b".repeat(61);
        assert!(parse_query(&query(1, &fits, rtype::A, None)).is_ok());
    }

    #[test]
    fn rejects_truncated_questions_and_records() {
        let p = query(1, "a.internal", rtype::A, Some(1232));
        for cut in HEADER_LEN..p.len() {
            assert!(
                matches!(parse_query(&p[..cut]), Err(Malformed::Reply { .. })),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn two_opt_records_are_a_format_error() {
        let mut p = query(1, "a.internal", rtype::A, Some(1232));
        p[11] = 2;
        p.extend_from_slice(&[0, 0, 41, 4, 0, 0, 0, 0, 0, 0, 0]);
        assert!(matches!(
            parse_query(&p),
            Err(Malformed::Reply {
                rcode: Rcode::FormErr,
                ..
            })
        ));
    }

    #[test]
    fn names_with_dots_inside_labels_match_nothing() {
        let mut buf = [0; MAX_WIRE_NAME];
        assert_eq!(lower_dotted(b"\x05a.web\x08internal\x00", &mut buf), None);
        assert_eq!(lower_dotted(b"\x00", &mut buf).unwrap(), b"");
    }

    #[test]
    fn responses_echo_the_question_and_count_records() {
        let p = query(0xBEEF, "web.internal", rtype::A, None);
        let q = parse_query(&p).unwrap();
        let mut out = Vec::new();
        start_response(&mut out, &q, Rcode::NoError, true);
        push_a(&mut out, QNAME_POINTER, Ipv4Addr::new(10, 0, 0, 1));
        push_soa(
            &mut out,
            Section::Authority,
            apex_pointer(q.qname().len()),
            3,
        );
        assert_eq!(&out[..2], &[0xBE, 0xEF]);
        assert_eq!(be16(&out, 2), QR | AA | RD | RA);
        assert_eq!(be16(&out, ANCOUNT), 1);
        assert_eq!(be16(&out, NSCOUNT), 1);
        assert!(reply_matches(&out, 0xBEEF, q.question));
        assert!(!reply_matches(&out, 0xBEEE, q.question));
        assert!(!is_truncated(&out));
    }

    #[test]
    fn cuts_oversized_forwarded_replies_to_the_question() {
        let p = query(5, "big.example", rtype::A, Some(1232));
        let q = parse_query(&p).unwrap();
        let mut reply = Vec::new();
        start_response(&mut reply, &q, Rcode::NoError, false);
        for i in 0..100 {
            push_a(&mut reply, QNAME_POINTER, Ipv4Addr::new(10, 0, 0, i));
        }
        let whole = reply.clone();
        assert!(!truncate_reply(&mut reply, &q, 4096));
        assert_eq!(reply, whole);
        assert!(truncate_reply(&mut reply, &q, 512));
        assert!(is_truncated(&reply));
        assert_eq!(be16(&reply, ANCOUNT), 0);
        assert_eq!(be16(&reply, ARCOUNT), 1);
        assert_eq!(reply.len(), HEADER_LEN + q.question.len() + OPT_RECORD_LEN);
    }
}
