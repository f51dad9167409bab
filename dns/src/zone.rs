//! A static source of answers: an RFC 1035 zone file of A records for the `internal.` zone, so a
//! benchmark can serve the same names a reference server does.
//!
//! Understood: `$ORIGIN` and `$TTL` lines, `;` comments, `@`, relative and absolute owners, a
//! blank owner repeating the previous one, optional TTL and class (IN) in either order, and
//! parentheses spanning lines. A records give addresses; records of other types (the SOA and
//! NS a zone file carries) only make their owner exist. TTLs are read and ignored: every
//! Internal DNS Answer has TTL 0.

use std::net::Ipv4Addr;
use std::path::Path;

use crate::answer::in_zone;
use crate::snapshot::{DnsSnapshot, ZONE};
use crate::DnsError;

/// A zone file line this parser cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("zone file line {line}: {message}")]
pub struct ZoneError {
    /// 1-based line number where the record starts.
    pub line: usize,
    /// What is wrong with it.
    pub message: String,
}

/// One logical entry: the tokens of a record or directive, gathered across parentheses.
struct Entry {
    line: usize,
    /// The entry started with white space: its owner is the previous one.
    blank_owner: bool,
    tokens: Vec<String>,
}

/// Splits a zone file into entries: comments dropped, quoted strings kept whole, lines inside
/// parentheses joined.
fn entries(text: &str) -> Result<Vec<Entry>, ZoneError> {
    let mut out: Vec<Entry> = Vec::new();
    let mut depth = 0usize;
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        if depth == 0 {
            out.push(Entry {
                line,
                blank_owner: raw.starts_with([' ', '\t']),
                tokens: Vec::new(),
            });
        }
        let entry = out.last_mut().expect("pushed above");
        let mut token = String::new();
        let mut quoted = false;
        let flush = |token: &mut String, tokens: &mut Vec<String>| {
            if !token.is_empty() {
                tokens.push(std::mem::take(token));
            }
        };
        for c in raw.chars() {
            match c {
                '"' => {
                    quoted = !quoted;
                    token.push(c);
                }
                _ if quoted => token.push(c),
                ';' => break,
                '(' => {
                    flush(&mut token, &mut entry.tokens);
                    depth += 1;
                }
                ')' => {
                    flush(&mut token, &mut entry.tokens);
                    depth = depth.checked_sub(1).ok_or_else(|| ZoneError {
                        line,
                        message: "')' without '('".into(),
                    })?;
                }
                c if c.is_whitespace() => flush(&mut token, &mut entry.tokens),
                c => token.push(c),
            }
        }
        if quoted {
            return Err(ZoneError {
                line,
                message: "unterminated quoted string".into(),
            });
        }
        flush(&mut token, &mut entry.tokens);
    }
    if depth > 0 {
        return Err(ZoneError {
            line: out.last().map_or(0, |e| e.line),
            message: "'(' never closed".into(),
        });
    }
    out.retain(|e| !e.tokens.is_empty());
    Ok(out)
}

/// A name made absolute against `origin` (both without trailing dot), lowercase and checked.
fn absolute(name: &str, origin: &str) -> Result<String, String> {
    if name.contains('\\') {
        return Err(format!("'{name}': escapes in names are not supported"));
    }
    let full = if name == "@" {
        origin.to_owned()
    } else if let Some(abs) = name.strip_suffix('.') {
        abs.to_owned()
    } else if origin.is_empty() {
        name.to_owned()
    } else {
        format!("{name}.{origin}")
    };
    let full = full.to_ascii_lowercase();
    if full.split('.').any(|l| l == "*") {
        return Err(format!("'{name}': wildcards are not supported"));
    }
    if full.len() > 253 || full.split('.').any(|l| !(1..=63).contains(&l.len())) {
        return Err(format!("'{name}' is not a valid domain name"));
    }
    Ok(full)
}

fn is_ttl(token: &str) -> bool {
    token.starts_with(|c: char| c.is_ascii_digit())
        && token
            .chars()
            .all(|c| c.is_ascii_digit() || "smhdwSMHDW".contains(c))
}

const CLASSES: [&str; 4] = ["IN", "CH", "HS", "CS"];

/// Parses a zone file of the `internal.` zone into `(name, address)` records: names lowercase
/// without trailing dot, the address `None` for a record of another type than A.
pub fn parse_zone(text: &str) -> Result<Vec<(String, Option<Ipv4Addr>)>, ZoneError> {
    let mut origin = ZONE.to_owned();
    let mut owner: Option<String> = None;
    let mut records = Vec::new();
    for e in entries(text)? {
        let err = |message: String| ZoneError {
            line: e.line,
            message,
        };
        let first = e.tokens[0].as_str();
        if !e.blank_owner && first.starts_with('$') {
            match (first.to_ascii_uppercase().as_str(), &e.tokens[1..]) {
                ("$ORIGIN", [name]) => origin = absolute(name, &origin).map_err(err)?,
                ("$TTL", [ttl]) if is_ttl(ttl) => {}
                _ => {
                    return Err(err(format!(
                        "unsupported directive '{}'",
                        e.tokens.join(" ")
                    )))
                }
            }
            continue;
        }
        let mut rest = e.tokens.iter().map(String::as_str);
        if !e.blank_owner {
            let name = rest.next().expect("entries are not empty");
            owner = Some(absolute(name, &origin).map_err(err)?);
        }
        let name = owner
            .clone()
            .ok_or_else(|| err("the first record has no owner name".into()))?;
        if !in_zone(name.as_bytes()) {
            return Err(err(format!("'{name}.' is outside the {ZONE}. zone")));
        }
        let rtype = loop {
            match rest.next() {
                Some(t) if is_ttl(t) => continue,
                Some(t) if t.eq_ignore_ascii_case("IN") => continue,
                Some(t) if CLASSES.iter().any(|c| t.eq_ignore_ascii_case(c)) => {
                    return Err(err(format!("class {t}: only IN records are served")));
                }
                Some(t) => break t.to_ascii_uppercase(),
                None => return Err(err("record without a type".into())),
            }
        };
        let rdata: Vec<&str> = rest.collect();
        match (rtype.as_str(), rdata.as_slice()) {
            ("A", [addr]) => {
                let addr = addr
                    .parse()
                    .map_err(|_| err(format!("'{addr}' is not an IPv4 address")))?;
                records.push((name, Some(addr)));
            }
            ("A", _) => return Err(err("an A record takes one address".into())),
            _ => records.push((name, None)),
        }
    }
    Ok(records)
}

impl DnsSnapshot {
    /// A table from the text of a zone file for `internal.` (see [`parse_zone`]). No address is
    /// local, so the Nearest DNS Selector orders like round robin.
    pub fn from_zone(text: &str) -> Result<DnsSnapshot, ZoneError> {
        Ok(DnsSnapshot::from_records(parse_zone(text)?, None).with_generation(1))
    }

    /// A table from a zone file on disk, such as the benchmark's `ZONE_FILE`.
    pub fn load_zone_file(path: &Path) -> Result<DnsSnapshot, DnsError> {
        let text = std::fs::read_to_string(path).map_err(|source| DnsError::Read {
            path: path.to_owned(),
            source,
        })?;
        DnsSnapshot::from_zone(&text).map_err(|source| DnsError::Zone {
            path: path.to_owned(),
            source,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(name: &str, addr: [u8; 4]) -> (String, Option<Ipv4Addr>) {
        (name.to_owned(), Some(Ipv4Addr::from(addr)))
    }

    #[test]
    fn reads_the_benchmark_zone() {
        let text = "$ORIGIN internal.\n$TTL 300\n\
            @ IN SOA ns.internal. hostmaster.internal. 1 3600 600 86400 300\n\
            @ IN NS ns.internal.\n\
            ns IN A 127.0.0.1\n\
            host1 IN A 10.77.0.2\n\
            host250 IN A 10.77.1.1\n";
        let records = parse_zone(text).unwrap();
        assert_eq!(
            records,
            vec![
                ("internal".to_owned(), None),
                ("internal".to_owned(), None),
                a("ns.internal", [127, 0, 0, 1]),
                a("host1.internal", [10, 77, 0, 2]),
                a("host250.internal", [10, 77, 1, 1]),
            ]
        );
        let s = DnsSnapshot::from_zone(text).unwrap();
        assert_eq!(
            s.get(b"host250.internal").unwrap().addrs(),
            &[Ipv4Addr::new(10, 77, 1, 1)]
        );
    }

    #[test]
    fn ttl_class_order_blank_owners_comments_and_parentheses() {
        let text = "; a comment\n\
            web 60 IN A 10.0.0.1 ; trailing comment\n\
            \t IN 60 A 10.0.0.2\n\
            Db.Internal. A 10.0.0.3\n\
            @ SOA ns hostmaster (\n  1 ; serial\n  3600 600 86400 0 )\n\
            txt TXT \"a ; b ( c\"\n\
            $ORIGIN sub.internal.\n\
            x 1h A 10.0.0.4\n";
        assert_eq!(
            parse_zone(text).unwrap(),
            vec![
                a("web.internal", [10, 0, 0, 1]),
                a("web.internal", [10, 0, 0, 2]),
                a("db.internal", [10, 0, 0, 3]),
                ("internal".to_owned(), None),
                ("txt.internal".to_owned(), None),
                a("x.sub.internal", [10, 0, 0, 4]),
            ]
        );
    }

    #[test]
    fn rejects_what_it_cannot_serve() {
        let line_of = |text: &str| parse_zone(text).unwrap_err().line;
        assert_eq!(line_of("a A 10.0.0.1\nb A 10.0.0.300\n"), 2);
        assert_eq!(line_of("host.example. A 10.0.0.1\n"), 1);
        assert_eq!(line_of("a CH A 10.0.0.1\n"), 1);
        assert_eq!(line_of("$INCLUDE other.zone\n"), 1);
        assert_eq!(line_of("\n  A 10.0.0.1\n"), 2);
        assert_eq!(line_of("a A\n"), 1);
        assert_eq!(line_of("a 300 IN\n"), 1);
        assert_eq!(line_of("* A 10.0.0.1\n"), 1);
        assert_eq!(line_of("a SOA ( 1 2\n"), 1);
        assert_eq!(line_of("a TXT \"open\n"), 1);
        let long = format!("{} A 10.0.0.1\n", "a".repeat(64));
        assert_eq!(line_of(&long), 1);
    }
}
