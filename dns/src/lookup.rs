//! "What would this Machine answer?": the same resolution the server does, as data the
//! management API can carry to the CLI.

use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::answer::{resolve, Resolution, Selector};
use crate::snapshot::DnsSnapshot;
use crate::wire::{rtype, Rcode, CLASS_IN};

/// A DNS record type (QTYPE), written as its mnemonic (`A`, `AAAA`, `ANY`...) or `TYPE<n>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct QueryType(pub u16);

const MNEMONICS: [(&str, u16); 12] = [
    ("A", 1),
    ("NS", 2),
    ("CNAME", 5),
    ("SOA", 6),
    ("PTR", 12),
    ("HINFO", 13),
    ("MX", 15),
    ("TXT", 16),
    ("AAAA", 28),
    ("SRV", 33),
    ("HTTPS", 65),
    ("ANY", 255),
];

impl QueryType {
    /// An IPv4 address record.
    pub const A: QueryType = QueryType(rtype::A);
    /// An IPv6 address record.
    pub const AAAA: QueryType = QueryType(28);
    /// The zone's start of authority.
    pub const SOA: QueryType = QueryType(rtype::SOA);
    /// Anything (answered minimally, RFC 8482).
    pub const ANY: QueryType = QueryType(rtype::ANY);
}

/// A text that names no record type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("'{0}' is not a DNS record type; use a mnemonic such as A, AAAA or ANY, or TYPE<number>")]
pub struct QueryTypeError(String);

impl FromStr for QueryType {
    type Err = QueryTypeError;
    fn from_str(s: &str) -> Result<QueryType, QueryTypeError> {
        let upper = s.trim().to_ascii_uppercase();
        if let Some((_, code)) = MNEMONICS.iter().find(|(m, _)| *m == upper) {
            return Ok(QueryType(*code));
        }
        upper
            .strip_prefix("TYPE")
            .and_then(|n| n.parse().ok())
            .map(QueryType)
            .ok_or_else(|| QueryTypeError(s.to_owned()))
    }
}

impl fmt::Display for QueryType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match MNEMONICS.iter().find(|(_, code)| *code == self.0) {
            Some((m, _)) => f.write_str(m),
            None => write!(f, "TYPE{}", self.0),
        }
    }
}

impl TryFrom<String> for QueryType {
    type Error = QueryTypeError;
    fn try_from(s: String) -> Result<QueryType, QueryTypeError> {
        s.parse()
    }
}

impl From<QueryType> for String {
    fn from(t: QueryType) -> String {
        t.to_string()
    }
}

/// Who answers a name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnswerKind {
    /// An `.internal` name this Machine holds: an Internal DNS Answer.
    Internal,
    /// A name outside `.internal`: the upstream resolvers answer it.
    Forwarded,
    /// An `.internal` name this Machine does not hold (NXDOMAIN), or not a name at all.
    Unknown,
}

/// What the DNS server of one Machine would answer for a name, as of one snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LookupAnswer {
    /// The name asked, lowercase, with its trailing dot.
    pub name: String,
    /// The record type asked.
    pub qtype: QueryType,
    /// Who answers it.
    pub kind: AnswerKind,
    /// The response code; absent for forwarded names (the upstream decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rcode: Option<Rcode>,
    /// How the server orders the addresses; absent when there are none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<Selector>,
    /// The A records, those in the observing Machine's subnet first, each group in address
    /// order (the server shuffles them per query as `selector` says).
    pub addresses: Vec<Ipv4Addr>,
    /// How many of `addresses`, from the front, lie in the observing Machine's subnet.
    pub local_addresses: usize,
    /// The generation of the snapshot that answered.
    pub generation: u64,
}

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
        assert_eq!(a.selector, Some(Selector::Nearest));
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

    #[test]
    fn query_types_parse_and_print() {
        assert_eq!("aaaa".parse::<QueryType>().unwrap(), QueryType::AAAA);
        assert_eq!("TYPE65534".parse::<QueryType>().unwrap(), QueryType(65534));
        assert_eq!(QueryType(65534).to_string(), "TYPE65534");
        assert_eq!(QueryType::ANY.to_string(), "ANY");
        assert!("BOGUS".parse::<QueryType>().is_err());
    }
}
