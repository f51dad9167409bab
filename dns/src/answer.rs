//! From a question to a response: which names are ours, what they hold, in which order, and
//! the response bytes. Pure: the server feeds it packets and sends what it writes.

use std::net::Ipv4Addr;

use ployz_core::api::DnsSelector;
use rand::rngs::SmallRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use crate::metrics::QuerySource;
use crate::snapshot::{AddressSet, DnsSnapshot, ZONE};
use crate::wire::{self, rtype, Malformed, Query, Rcode, Section, CLASS_IN, MAX_WIRE_NAME};

/// Splits a selector prefix off a lowercase name. A prefix alone before the zone (`rr.internal`)
/// is a plain name: a Service may be called `rr`.
pub(crate) fn split_selector(name: &[u8]) -> (DnsSelector, &[u8]) {
    for selector in [DnsSelector::RoundRobin, DnsSelector::Nearest] {
        let prefix = selector.prefix().as_bytes();
        if let Some(rest) = name.strip_prefix(prefix).and_then(|r| r.strip_prefix(b".")) {
            if rest != ZONE.as_bytes() {
                return (selector, rest);
            }
        }
    }
    (DnsSelector::RoundRobin, name)
}

/// Whether a lowercase dotted name lies in the `internal.` zone.
pub(crate) fn in_zone(name: &[u8]) -> bool {
    name == ZONE.as_bytes()
        || name
            .strip_suffix(ZONE.as_bytes())
            .is_some_and(|head| head.ends_with(b"."))
}

/// Whether a wire-form name ends in the `internal.` zone (for names [`wire::lower_dotted`]
/// cannot flatten).
fn wire_in_zone(qname: &[u8]) -> bool {
    const APEX: &[u8] = b"\x08internal\x00";
    qname.len() >= APEX.len() && qname[qname.len() - APEX.len()..].eq_ignore_ascii_case(APEX)
}

/// What the table says about one question.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolution<'s> {
    /// Not in `.internal`: the upstream resolvers decide.
    Forward,
    /// In `.internal` but not of class IN.
    Refused,
    /// The zone apex, asked for its SOA (or ANY).
    ApexSoa,
    /// A name with addresses, asked for A (or ANY).
    Addresses {
        set: &'s AddressSet,
        selector: DnsSelector,
    },
    /// A name that exists, asked for a type it has no records of.
    NoData,
    /// An `.internal` name the table does not hold.
    NxDomain,
}

/// Resolves a lowercase dotted name (no trailing dot).
///
/// `ANY` is answered the RFC 8482 way with a subset: the A records for a name that has them,
/// the SOA at the apex, nothing for a name without addresses.
pub(crate) fn resolve<'s>(
    snapshot: &'s DnsSnapshot,
    name: &[u8],
    qtype: u16,
    qclass: u16,
) -> Resolution<'s> {
    if !in_zone(name) {
        return Resolution::Forward;
    }
    if qclass != CLASS_IN {
        return Resolution::Refused;
    }
    let wants_a = matches!(qtype, rtype::A | rtype::ANY);
    if name == ZONE.as_bytes() {
        return match (qtype, snapshot.get(name)) {
            (rtype::SOA | rtype::ANY, _) => Resolution::ApexSoa,
            (_, Some(set)) if wants_a && !set.is_empty() => Resolution::Addresses {
                set,
                selector: DnsSelector::RoundRobin,
            },
            _ => Resolution::NoData,
        };
    }
    // The name itself first: a Machine may be named `rr` or `nearest` (`rr.m.web.internal`).
    let (selector, base) = match snapshot.get(name) {
        Some(_) => (DnsSelector::RoundRobin, name),
        None => split_selector(name),
    };
    match snapshot.get(base) {
        None => Resolution::NxDomain,
        Some(set) if wants_a && !set.is_empty() => Resolution::Addresses { set, selector },
        Some(_) => Resolution::NoData,
    }
}

/// Writes `set`'s addresses into `out` in the order `selector` asks for.
pub(crate) fn order(
    set: &AddressSet,
    selector: DnsSelector,
    rng: &mut impl Rng,
    out: &mut Vec<Ipv4Addr>,
) {
    out.clear();
    out.extend_from_slice(set.addrs());
    match selector {
        DnsSelector::RoundRobin => out.shuffle(rng),
        DnsSelector::Nearest => {
            let (local, other) = out.split_at_mut(set.local());
            local.shuffle(rng);
            other.shuffle(rng);
        }
    }
}

/// How the query arrived, which bounds the response size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    Udp,
    Tcp,
}

impl Transport {
    fn limit(self, q: &Query<'_>) -> usize {
        match self {
            Transport::Udp => q.udp_limit(),
            Transport::Tcp => usize::from(u16::MAX),
        }
    }
}

/// What to do with a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// Send what was written to the output buffer.
    Reply,
    /// Hand the packet to the forwarder.
    Forward,
    /// Send nothing.
    Drop,
}

/// The outcome of one packet, for the server and its metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Verdict {
    pub action: Action,
    pub source: QuerySource,
    /// The response code sent (none when forwarded or dropped).
    pub rcode: Option<Rcode>,
    /// Whether the response was cut to fit and has TC set.
    pub truncated: bool,
}

impl Verdict {
    fn reply(source: QuerySource, rcode: Rcode) -> Verdict {
        Verdict {
            action: Action::Reply,
            source,
            rcode: Some(rcode),
            truncated: false,
        }
    }
}

/// What a worker reuses from one query to the next so answering allocates nothing.
pub(crate) struct Scratch {
    pub addrs: Vec<Ipv4Addr>,
    pub rng: SmallRng,
}

impl Scratch {
    pub(crate) fn new() -> Scratch {
        Scratch {
            addrs: Vec::new(),
            rng: SmallRng::from_entropy(),
        }
    }
}

/// Who asked and what the server may do for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    /// The source is inside an allowed network.
    pub allowed: bool,
    /// Upstream resolvers are configured.
    pub forwarding: bool,
}

/// Answers one packet from `snapshot`, writing any response into `out`.
///
/// Sources outside the allowed networks get REFUSED (junk from them is dropped); malformed
/// queries get FORMERR or NOTIMP, or nothing when they are too short to answer; names outside
/// `.internal` are left to the forwarder (REFUSED when no upstream is configured).
pub(crate) fn respond(
    snapshot: &DnsSnapshot,
    packet: &[u8],
    policy: Policy,
    transport: Transport,
    out: &mut Vec<u8>,
    scratch: &mut Scratch,
) -> Verdict {
    let q = match wire::parse_query(packet) {
        Ok(q) => q,
        Err(Malformed::Reply {
            id,
            opcode,
            rd,
            rcode,
        }) if policy.allowed => {
            wire::header_only(out, id, opcode, rd, rcode);
            return Verdict::reply(QuerySource::Malformed, rcode);
        }
        Err(_) => {
            return Verdict {
                action: Action::Drop,
                source: QuerySource::Malformed,
                rcode: None,
                truncated: false,
            }
        }
    };
    if !policy.allowed {
        return error_response(out, &q, Rcode::Refused, QuerySource::Refused);
    }
    if q.edns.is_some_and(|e| e.version > 0) {
        return error_response(out, &q, Rcode::BadVers, QuerySource::Malformed);
    }
    let mut buf = [0u8; MAX_WIRE_NAME];
    let resolution = match wire::lower_dotted(q.qname(), &mut buf) {
        Some(name) => resolve(snapshot, name, q.qtype, q.qclass),
        None if wire_in_zone(q.qname()) => Resolution::NxDomain,
        None => Resolution::Forward,
    };
    let serial = snapshot.generation() as u32;
    let apex = || wire::apex_pointer(q.qname().len());
    match resolution {
        Resolution::Forward if policy.forwarding => Verdict {
            action: Action::Forward,
            source: QuerySource::Forwarded,
            rcode: None,
            truncated: false,
        },
        Resolution::Forward => error_response(out, &q, Rcode::Refused, QuerySource::Forwarded),
        Resolution::Refused => error_response(out, &q, Rcode::Refused, QuerySource::Internal),
        Resolution::ApexSoa => {
            wire::start_response(out, &q, Rcode::NoError, true);
            wire::push_soa(out, Section::Answer, apex(), serial);
            finish(out, &q, QuerySource::Internal, Rcode::NoError)
        }
        Resolution::NoData | Resolution::NxDomain => {
            let rcode = if resolution == Resolution::NxDomain {
                Rcode::NxDomain
            } else {
                Rcode::NoError
            };
            wire::start_response(out, &q, rcode, true);
            wire::push_soa(out, Section::Authority, apex(), serial);
            finish(out, &q, QuerySource::Internal, rcode)
        }
        Resolution::Addresses { set, selector } => {
            order(set, selector, &mut scratch.rng, &mut scratch.addrs);
            wire::start_response(out, &q, Rcode::NoError, true);
            let opt = if q.edns.is_some() {
                wire::OPT_RECORD_LEN
            } else {
                0
            };
            let room = transport.limit(&q).saturating_sub(out.len() + opt) / wire::A_RECORD_LEN;
            let fits = scratch.addrs.len().min(room);
            for addr in &scratch.addrs[..fits] {
                wire::push_a(out, wire::QNAME_POINTER, *addr);
            }
            let truncated = fits < scratch.addrs.len();
            if truncated {
                wire::set_truncated(out);
            }
            Verdict {
                truncated,
                ..finish(out, &q, QuerySource::Internal, Rcode::NoError)
            }
        }
    }
}

/// Appends the OPT record a query with EDNS must get back.
fn finish(out: &mut Vec<u8>, q: &Query<'_>, source: QuerySource, rcode: Rcode) -> Verdict {
    if q.edns.is_some() {
        wire::push_opt(out, rcode);
    }
    Verdict::reply(source, rcode)
}

fn error_response(out: &mut Vec<u8>, q: &Query<'_>, rcode: Rcode, source: QuerySource) -> Verdict {
    wire::start_response(out, q, rcode, false);
    finish(out, q, source, rcode)
}

/// Writes a SERVFAIL for a forwarded `packet` (already known to parse). Returns false if it
/// does not parse after all.
pub(crate) fn servfail(packet: &[u8], out: &mut Vec<u8>) -> bool {
    match wire::parse_query(packet) {
        Ok(q) => {
            error_response(out, &q, Rcode::ServFail, QuerySource::Forwarded);
            true
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::snapshot::DnsSnapshot;
    use crate::wire::tests::query;

    fn table(local: &[(&str, [u8; 4])], subnet: Option<&str>) -> DnsSnapshot {
        DnsSnapshot::from_records(
            local
                .iter()
                .map(|(n, a)| (n.to_string(), Some(Ipv4Addr::from(*a)))),
            subnet.map(|s| s.parse().unwrap()),
        )
    }

    const OPEN: Policy = Policy {
        allowed: true,
        forwarding: true,
    };

    fn ask(s: &DnsSnapshot, p: &[u8], transport: Transport) -> (Verdict, Vec<u8>) {
        let mut out = Vec::new();
        let v = respond(s, p, OPEN, transport, &mut out, &mut Scratch::new());
        (v, out)
    }

    fn counts(out: &[u8]) -> [u16; 4] {
        [4, 6, 8, 10].map(|i| u16::from_be_bytes([out[i], out[i + 1]]))
    }

    fn answers(out: &[u8], question_len: usize) -> Vec<Ipv4Addr> {
        let n = counts(out)[1] as usize;
        (0..n)
            .map(|i| {
                let at = 12 + question_len + i * wire::A_RECORD_LEN + 12;
                Ipv4Addr::new(out[at], out[at + 1], out[at + 2], out[at + 3])
            })
            .collect()
    }

    #[test]
    fn selectors_are_prefix_labels() {
        assert_eq!(
            split_selector(b"rr.web.internal"),
            (DnsSelector::RoundRobin, &b"web.internal"[..])
        );
        assert_eq!(
            split_selector(b"nearest.web.internal"),
            (DnsSelector::Nearest, &b"web.internal"[..])
        );
        assert_eq!(
            split_selector(b"web.internal"),
            (DnsSelector::RoundRobin, &b"web.internal"[..])
        );
        assert_eq!(
            split_selector(b"rr.internal"),
            (DnsSelector::RoundRobin, &b"rr.internal"[..])
        );
        assert_eq!(
            split_selector(b"rrweb.internal"),
            (DnsSelector::RoundRobin, &b"rrweb.internal"[..])
        );
    }

    #[test]
    fn a_machine_named_like_a_selector_is_reached_by_its_machine_service_name() {
        use crate::snapshot::tests::{machine, serving};
        let rr = machine("rr", "10.210.0.0/24");
        let web = ployz_core::ServiceId::generate();
        let addr = Ipv4Addr::new(10, 210, 0, 7);
        let s = DnsSnapshot::build(
            &[serving(&rr.id, "web", &web, addr)],
            std::slice::from_ref(&rr),
            &rr.id,
        );
        for name in [
            &b"rr.m.web.internal"[..],
            b"rr.rr.m.web.internal",
            b"nearest.rr.m.web.internal",
        ] {
            match resolve(&s, name, rtype::A, CLASS_IN) {
                Resolution::Addresses { set, .. } => assert_eq!(set.addrs(), [addr]),
                other => panic!("{}: {other:?}", String::from_utf8_lossy(name)),
            }
        }
    }

    #[test]
    fn zone_membership_is_by_label() {
        assert!(in_zone(b"internal"));
        assert!(in_zone(b"web.internal"));
        assert!(!in_zone(b"notinternal"));
        assert!(!in_zone(b"internal.example"));
        assert!(!in_zone(b""));
    }

    #[test]
    fn nxdomain_for_unknown_names_and_nodata_for_other_types() {
        let s = table(&[("web.internal", [10, 0, 0, 1])], None);
        assert_eq!(
            resolve(&s, b"nope.internal", rtype::A, CLASS_IN),
            Resolution::NxDomain
        );
        assert_eq!(
            resolve(&s, b"web.internal", 28, CLASS_IN),
            Resolution::NoData
        );
        assert_eq!(
            resolve(&s, b"web.internal", 16, CLASS_IN),
            Resolution::NoData
        );
        assert!(matches!(
            resolve(&s, b"web.internal", rtype::ANY, CLASS_IN),
            Resolution::Addresses { .. }
        ));
        assert_eq!(
            resolve(&s, b"web.internal", rtype::A, 3),
            Resolution::Refused
        );
        assert_eq!(
            resolve(&s, b"example.com", rtype::A, CLASS_IN),
            Resolution::Forward
        );
        assert_eq!(
            resolve(&s, b"internal", rtype::SOA, CLASS_IN),
            Resolution::ApexSoa
        );
        assert_eq!(
            resolve(&s, b"internal", rtype::A, CLASS_IN),
            Resolution::NoData
        );
    }

    #[test]
    fn nearest_puts_the_local_group_first_and_shuffles_each() {
        let s = table(
            &[
                ("web.internal", [10, 210, 1, 1]),
                ("web.internal", [10, 210, 1, 2]),
                ("web.internal", [10, 210, 5, 1]),
                ("web.internal", [10, 210, 5, 2]),
                ("web.internal", [10, 210, 5, 3]),
            ],
            Some("10.210.5.0/24"),
        );
        let set = s.get(b"web.internal").unwrap();
        let mut rng = SmallRng::seed_from_u64(1);
        let mut out = Vec::new();
        let mut firsts = std::collections::HashSet::new();
        let mut rr_firsts = std::collections::HashSet::new();
        for _ in 0..200 {
            order(set, DnsSelector::Nearest, &mut rng, &mut out);
            assert!(out[..3].iter().all(|a| a.octets()[2] == 5), "{out:?}");
            assert!(out[3..].iter().all(|a| a.octets()[2] == 1), "{out:?}");
            firsts.insert(out[0]);
            order(set, DnsSelector::RoundRobin, &mut rng, &mut out);
            rr_firsts.insert(out[0]);
            assert_eq!(out.len(), 5);
        }
        assert_eq!(firsts.len(), 3, "the local group is shuffled");
        assert_eq!(rr_firsts.len(), 5, "round robin shuffles everything");
    }

    #[test]
    fn answers_are_authoritative_with_ttl_zero() {
        let s = table(&[("web.internal", [10, 0, 0, 1])], None);
        let p = query(42, "WEB.internal", rtype::A, None);
        let (v, out) = ask(&s, &p, Transport::Udp);
        assert_eq!(v.action, Action::Reply);
        assert_eq!(v.rcode, Some(Rcode::NoError));
        assert_eq!(v.source, QuerySource::Internal);
        assert_eq!(&out[..2], &42u16.to_be_bytes());
        assert_eq!(out[2] & 0x04, 0x04, "AA");
        assert_eq!(counts(&out), [1, 1, 0, 0]);
        let q_len = p.len() - 12;
        assert_eq!(&out[12..12 + q_len], &p[12..], "question echoed as sent");
        let ttl_at = 12 + q_len + 6;
        assert_eq!(&out[ttl_at..ttl_at + 4], &[0, 0, 0, 0]);
        assert_eq!(answers(&out, q_len), vec![Ipv4Addr::new(10, 0, 0, 1)]);
    }

    #[test]
    fn negative_answers_carry_the_soa() {
        let s = table(&[("web.internal", [10, 0, 0, 1])], None);
        let (v, out) = ask(
            &s,
            &query(1, "nope.internal", rtype::A, None),
            Transport::Udp,
        );
        assert_eq!(v.rcode, Some(Rcode::NxDomain));
        assert_eq!(out[3] & 0x0f, 3);
        assert_eq!(counts(&out), [1, 0, 1, 0]);
        let (v, out) = ask(
            &s,
            &query(1, "web.internal", 28, Some(1232)),
            Transport::Udp,
        );
        assert_eq!(v.rcode, Some(Rcode::NoError));
        assert_eq!(counts(&out), [1, 0, 1, 1]);
    }

    #[test]
    fn udp_answers_are_truncated_to_the_limit_and_tcp_is_whole() {
        let records: Vec<_> = (0..60u8).map(|i| ("big.internal", [10, 0, 0, i])).collect();
        let s = table(&records, None);
        let p = query(1, "big.internal", rtype::A, None);
        let (v, out) = ask(&s, &p, Transport::Udp);
        assert!(v.truncated);
        assert!(out.len() <= 512);
        assert_eq!(out[2] & 0x02, 0x02, "TC");
        let n = counts(&out)[1] as usize;
        assert_eq!(n, (512 - p.len()) / wire::A_RECORD_LEN);

        let p = query(1, "big.internal", rtype::A, Some(4096));
        let (v, out) = ask(&s, &p, Transport::Udp);
        assert!(!v.truncated, "60 records fit in 1232 bytes");
        assert!(out.len() <= wire::MAX_UDP_PAYLOAD);
        assert_eq!(counts(&out), [1, 60, 0, 1]);

        let p = query(1, "big.internal", rtype::A, None);
        let (v, out) = ask(&s, &p, Transport::Tcp);
        assert!(!v.truncated);
        assert_eq!(counts(&out)[1], 60);
        let mut got = answers(&out, p.len() - 12);
        got.sort();
        assert_eq!(
            got,
            (0..60)
                .map(|i| Ipv4Addr::new(10, 0, 0, i))
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn strangers_are_refused_and_their_junk_dropped() {
        let s = table(&[("web.internal", [10, 0, 0, 1])], None);
        let closed = Policy {
            allowed: false,
            forwarding: true,
        };
        let mut out = Vec::new();
        let p = query(1, "web.internal", rtype::A, None);
        let v = respond(
            &s,
            &p,
            closed,
            Transport::Udp,
            &mut out,
            &mut Scratch::new(),
        );
        assert_eq!(v.rcode, Some(Rcode::Refused));
        assert_eq!(v.source, QuerySource::Refused);
        assert_eq!(counts(&out), [1, 0, 0, 0]);
        let mut junk = p.clone();
        junk[5] = 3;
        let v = respond(
            &s,
            &junk,
            closed,
            Transport::Udp,
            &mut out,
            &mut Scratch::new(),
        );
        assert_eq!(v.action, Action::Drop);
    }

    #[test]
    fn other_names_are_forwarded_or_refused_without_upstreams() {
        let s = DnsSnapshot::empty();
        let p = query(1, "example.com", rtype::A, None);
        let (v, _) = ask(&s, &p, Transport::Udp);
        assert_eq!(v.action, Action::Forward);
        let mut out = Vec::new();
        let lonely = Policy {
            allowed: true,
            forwarding: false,
        };
        let v = respond(
            &s,
            &p,
            lonely,
            Transport::Udp,
            &mut out,
            &mut Scratch::new(),
        );
        assert_eq!(v.rcode, Some(Rcode::Refused));
        assert!(servfail(&p, &mut out));
        assert_eq!(out[3] & 0x0f, 2);
    }

    #[test]
    fn unflattenable_names_in_the_zone_do_not_exist() {
        let s = table(&[("web.internal", [10, 0, 0, 1])], None);
        let mut p = query(1, "xweb.internal", rtype::A, None);
        p[13] = b'.';
        let (v, _) = ask(&s, &p, Transport::Udp);
        assert_eq!(v.rcode, Some(Rcode::NxDomain));
    }

    #[test]
    fn newer_edns_versions_get_badvers() {
        let s = DnsSnapshot::empty();
        let mut p = query(1, "web.internal", rtype::A, Some(1232));
        let version_at = p.len() - 5;
        p[version_at] = 1;
        let (v, out) = ask(&s, &p, Transport::Udp);
        assert_eq!(v.rcode, Some(Rcode::BadVers));
        assert_eq!(out[out.len() - 6], 1, "extended rcode in the OPT TTL");
    }

    mod props {
        use super::*;
        use hickory_proto::op::{Edns, Message, Query as HQuery, ResponseCode};
        use hickory_proto::rr::{Name, RecordType};
        use proptest::prelude::*;

        fn big_table() -> DnsSnapshot {
            let mut records: Vec<(String, Option<Ipv4Addr>)> = (0..80u8)
                .map(|i| ("big.internal".to_owned(), Some(Ipv4Addr::new(10, 1, 0, i))))
                .collect();
            records.push(("web.internal".to_owned(), Some(Ipv4Addr::new(10, 0, 0, 1))));
            records.push(("m.web.internal".to_owned(), None));
            DnsSnapshot::from_records(records, Some("10.1.0.0/24".parse().unwrap()))
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(2000))]

            /// Any bytes at all: no panic, and whatever is sent back is a well-formed response
            /// to the same ID.
            #[test]
            fn arbitrary_packets_never_panic(packet in proptest::collection::vec(any::<u8>(), 0..600)) {
                let s = big_table();
                let mut out = Vec::new();
                let v = respond(&s, &packet, OPEN, Transport::Udp, &mut out, &mut Scratch::new());
                if v.action == Action::Reply {
                    let m = Message::from_vec(&out).expect("our reply parses");
                    prop_assert_eq!(&out[..2], &packet[..2]);
                    prop_assert!(out.len() <= wire::MAX_UDP_PAYLOAD);
                    prop_assert_eq!(m.metadata.message_type, hickory_proto::op::MessageType::Response);
                }
            }

            /// Well-formed queries from another implementation get responses it reads back:
            /// same question, the code `lookup` predicts, within the UDP limit.
            #[test]
            fn real_queries_get_well_formed_answers(
                prefix in prop::sample::select(vec!["", "rr.", "nearest.", "x.", "m.", "RR."]),
                base in prop::sample::select(vec!["big.internal.", "web.internal.", "Web.Internal.",
                    "nope.internal.", "internal.", "example.com.", "web.internal.example."]),
                qtype in prop::sample::select(vec![RecordType::A, RecordType::AAAA, RecordType::ANY,
                    RecordType::TXT, RecordType::SOA]),
                edns in proptest::option::of(0u16..5000),
            ) {
                let s = big_table();
                let name = format!("{prefix}{base}");
                let mut q = Message::query();
                q.add_query(HQuery::query(Name::from_ascii(&name).unwrap(), qtype));
                if let Some(size) = edns {
                    let mut e = Edns::new();
                    e.set_max_payload(size);
                    q.set_edns(e);
                }
                let packet = q.to_vec().unwrap();
                let mut out = Vec::new();
                let v = respond(&s, &packet, OPEN, Transport::Udp, &mut out, &mut Scratch::new());
                let expected = crate::lookup(&s, &name, ployz_core::api::QueryType(u16::from(qtype)));
                if expected.kind == ployz_core::api::AnswerKind::Forwarded {
                    prop_assert_eq!(v.action, Action::Forward);
                    return Ok(());
                }
                let m = Message::from_vec(&out).expect("our reply parses");
                prop_assert_eq!(m.metadata.id, q.metadata.id);
                prop_assert_eq!(&m.queries, &q.queries);
                prop_assert!(out.len() <= q.max_payload().clamp(512, 1232) as usize);
                prop_assert_eq!(m.edns.is_some(), edns.is_some());
                let rcode = match expected.rcode.unwrap() {
                    Rcode::NoError => ResponseCode::NoError,
                    Rcode::NxDomain => ResponseCode::NXDomain,
                    other => panic!("unexpected {other:?}"),
                };
                prop_assert_eq!(m.metadata.response_code, rcode);
                prop_assert!(m.metadata.authoritative);
                let got: Vec<Ipv4Addr> = m.answers.iter().filter_map(|r| match &r.data {
                    hickory_proto::rr::RData::A(a) => Some(a.0),
                    _ => None,
                }).collect();
                if m.metadata.truncation {
                    prop_assert!(got.len() < expected.addresses.len());
                } else {
                    let mut got = got.clone();
                    got.sort();
                    let mut want = expected.addresses.clone();
                    want.sort();
                    prop_assert_eq!(got, want);
                }
                for r in m.answers.iter().chain(&m.authorities) {
                    prop_assert_eq!(r.ttl, 0);
                }
            }
        }
    }
}
