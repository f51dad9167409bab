//! "What would this Machine answer?": the same resolution the server does, as data the
//! management API can carry to the CLI (a [`LookupAnswer`], defined with the API's other wire
//! types in `ployz_core::api`).

use ployz_core::api::{AnswerKind, LookupAnswer, QueryType, Rcode};

use crate::answer::{resolve, Resolution};
use crate::snapshot::DnsSnapshot;
use crate::wire::CLASS_IN;

/// Longest name in text, without the trailing dot (RFC 1035 §2.3.4).
const MAX_TEXT_NAME: usize = 253;

/// Lowercase, without surrounding space and trailing dot; `None` unless every label is 1 to 63
/// characters and the whole at most 253.
fn normalize(name: &str) -> Option<String> {
    let name = name.trim();
    let name = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
    let ok = !name.is_empty()
        && name.len() <= MAX_TEXT_NAME
        && name.split('.').all(|l| (1..=63).contains(&l.len()));
    ok.then_some(name)
}

/// Resolves `name` for `qtype` against `snapshot` exactly as the server would (class IN), minus
/// the per-query shuffle. A text that is not a DNS name answers kind `unknown` with FORMERR.
pub fn lookup(snapshot: &DnsSnapshot, name: &str, qtype: QueryType) -> LookupAnswer {
    let mut answer = LookupAnswer {
        name: String::new(),
        qtype,
        kind: AnswerKind::Unknown,
        rcode: Some(Rcode::FormErr),
        selector: None,
        addresses: Vec::new(),
        local_addresses: 0,
        generation: snapshot.generation(),
    };
    let Some(normalized) = normalize(name) else {
        answer.name = name.trim().to_owned();
        return answer;
    };
    answer.name = format!("{normalized}.");
    let (kind, rcode) = match resolve(snapshot, normalized.as_bytes(), qtype.0, CLASS_IN) {
        Resolution::Forward => (AnswerKind::Forwarded, None),
        Resolution::Refused => (AnswerKind::Internal, Some(Rcode::Refused)),
        Resolution::ApexSoa | Resolution::NoData => (AnswerKind::Internal, Some(Rcode::NoError)),
        Resolution::NxDomain => (AnswerKind::Unknown, Some(Rcode::NxDomain)),
        Resolution::Addresses { set, selector } => {
            answer.addresses = set.addrs().to_vec();
            answer.local_addresses = set.local();
            answer.selector = Some(selector);
            (AnswerKind::Internal, Some(Rcode::NoError))
        }
    };
    answer.kind = kind;
    answer.rcode = rcode;
    answer
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use ployz_core::api::DnsSelector;

    use super::*;

    fn table() -> DnsSnapshot {
        DnsSnapshot::from_records(
            [
                (
                    "web.internal".to_owned(),
                    Some(Ipv4Addr::new(10, 210, 1, 2)),
                ),
                (
                    "web.internal".to_owned(),
                    Some(Ipv4Addr::new(10, 210, 0, 2)),
                ),
            ],
            Some("10.210.1.0/24".parse().unwrap()),
        )
        .with_generation(7)
    }

    #[test]
    fn internal_names_list_local_addresses_first() {
        let a = lookup(&table(), "Nearest.WEB.internal.", QueryType::A);
        assert_eq!(a.name, "nearest.web.internal.");
        assert_eq!(a.kind, AnswerKind::Internal);
        assert_eq!(a.rcode, Some(Rcode::NoError));
        assert_eq!(a.selector, Some(DnsSelector::Nearest));
        assert_eq!(
            a.addresses,
            vec![Ipv4Addr::new(10, 210, 1, 2), Ipv4Addr::new(10, 210, 0, 2)]
        );
        assert_eq!(a.local_addresses, 1);
        assert_eq!(a.generation, 7);
    }

    #[test]
    fn unknown_forwarded_and_nodata() {
        let t = table();
        let nx = lookup(&t, "db.internal", QueryType::A);
        assert_eq!(
            (nx.kind, nx.rcode),
            (AnswerKind::Unknown, Some(Rcode::NxDomain))
        );
        let fw = lookup(&t, "example.com", QueryType::A);
        assert_eq!((fw.kind, fw.rcode), (AnswerKind::Forwarded, None));
        let nodata = lookup(&t, "web.internal", QueryType::AAAA);
        assert_eq!(
            (nodata.kind, nodata.rcode),
            (AnswerKind::Internal, Some(Rcode::NoError))
        );
        assert!(nodata.addresses.is_empty());
        let bad = lookup(&t, "a..internal", QueryType::A);
        assert_eq!(
            (bad.kind, bad.rcode),
            (AnswerKind::Unknown, Some(Rcode::FormErr))
        );
        let long = lookup(&t, &format!("{}.internal", "a".repeat(64)), QueryType::A);
        assert_eq!(long.rcode, Some(Rcode::FormErr));
    }

    #[test]
    fn the_api_query_types_are_the_wire_codes() {
        use crate::wire::rtype;
        assert_eq!(QueryType::A.0, rtype::A);
        assert_eq!(QueryType::SOA.0, rtype::SOA);
        assert_eq!(QueryType::ANY.0, rtype::ANY);
    }

    #[test]
    fn round_trips_through_json() {
        let a = lookup(&table(), "web.internal", QueryType::A);
        let json = serde_json::to_string(&a).unwrap();
        assert!(json.contains("\"kind\":\"internal\""), "{json}");
        assert!(json.contains("\"rcode\":\"NOERROR\""), "{json}");
        assert!(json.contains("\"qtype\":\"A\""), "{json}");
        assert!(json.contains("\"selector\":\"round_robin\""), "{json}");
        let back: LookupAnswer = serde_json::from_str(&json).unwrap();
        assert_eq!(back, a);
    }
}
