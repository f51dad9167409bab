//! The `x-ports` grammar and Ingress Hostname validation.
//!
//! - Ingress: `[hostname:][lb_port:]container_port[/http|https]`. A hostname makes the protocol
//!   default to `https`; without one the protocol must be written.
//! - Ingress Port: `[published:]container_port/tcp|udp`, forwarded by every Machine's edge.
//! - Host: `[host_ip|[ipv6]|cidr:][host_port:]container_port[/tcp|udp]@host`; without a host
//!   port (`3000/tcp@host`, `127.0.0.1::3000/tcp@host`) Docker picks a free one.
//!
//! And Compose's short `ports:` syntax, `[host_ip:][host_port[-end]:]container_port[-end][/proto]`
//! as docker compose reads it (go-connections' `nat.ParsePortSpec`): every entry is a host port
//! on the Machine that runs the container, one [`PortSpec`] per port of a range.

use std::net::IpAddr;

use ployz_core::{HostProtocol, IngressProtocol, PortSpec, ServiceName};

/// The longest DNS name.
const MAX_HOSTNAME_LEN: usize = 253;
/// The longest DNS label.
const MAX_LABEL_LEN: usize = 63;

/// Parses one `x-ports` entry into its canonical [`PortSpec`]. The error is one sentence that
/// says what is wrong and what to write instead.
pub fn parse_port(text: &str, service: &ServiceName) -> Result<PortSpec, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("a port must not be empty".into());
    }
    // Whitespace inside a hostname is the hostname's fault: its check below says so.
    let in_hostname = |c: usize| {
        !t.contains('@')
            && t[..c].find(':').is_none()
            && t.find(':')
                .is_some_and(|colon| !t[..colon].chars().all(|d| d.is_ascii_digit()))
    };
    if let Some((_, c)) = t
        .char_indices()
        .find(|&(i, c)| c.is_whitespace() && !in_hostname(i))
    {
        return Err(format!(
            "a port must not contain whitespace ({c:?}); write e.g. '{}.example.com:8080/https'",
            service.dns_label()
        ));
    }
    match t.matches('@').count() {
        0 => parse_ingress(t, service),
        1 => {
            let (body, mode) = t.split_once('@').unwrap_or((t, ""));
            if mode != "host" {
                return Err(format!(
                    "unknown port mode '@{mode}'; the only mode is '@host' (e.g. '8080:80/tcp@host'), or leave it out for ingress"
                ));
            }
            parse_host(body)
        }
        _ => Err("a port may contain '@' only once, as in '8080:80/tcp@host'".into()),
    }
}

/// Splits `a:b:c` into at most three parts; an IPv6 host address keeps its colons.
fn split_parts(body: &str) -> Vec<&str> {
    let colons: Vec<usize> = body.match_indices(':').map(|(i, _)| i).collect();
    if colons.len() <= 2 {
        return body.split(':').collect();
    }
    let second_last = colons[colons.len() - 2];
    let last = colons[colons.len() - 1];
    vec![
        &body[..second_last],
        &body[second_last + 1..last],
        &body[last + 1..],
    ]
}

/// A port number 1-65535 written as plain digits.
pub(crate) fn parse_port_number(text: &str, what: &str) -> Result<u16, String> {
    if text.is_empty() {
        return Err(format!("the {what} is missing"));
    }
    if text.contains('-')
        && text
            .split('-')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
    {
        return Err(format!(
            "port ranges such as '{text}' are not supported; publish each port on its own line"
        ));
    }
    if !text.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!(
            "the {what} '{text}' is not a port number (1-65535)"
        ));
    }
    match text.parse::<u32>() {
        Ok(n) if (1..=65535).contains(&n) => Ok(n as u16),
        _ => Err(format!(
            "the {what} {text} is out of range; ports are 1-65535"
        )),
    }
}

fn parse_ingress(t: &str, service: &ServiceName) -> Result<PortSpec, String> {
    let (body, protocol) = match t.rsplit_once('/') {
        Some((body, proto)) => match proto.to_ascii_lowercase().as_str() {
            "http" => (body, Some(IngressProtocol::Http)),
            "https" => (body, Some(IngressProtocol::Https)),
            "tcp" | "udp" => return parse_stream(body, proto),
            "" => return Err("the protocol after '/' is missing; write http or https".into()),
            other => {
                return Err(format!(
                    "unknown protocol '{other}'; ingress ports use http or https, host ports (…@host) use tcp or udp"
                ))
            }
        },
        None => (t, None),
    };
    let parts = split_parts(body);
    let container = parts.last().copied().unwrap_or("");
    let container_port = parse_port_number(container, "container port")?;
    let (hostname, published) = match parts.as_slice() {
        [_] => (None, None),
        [first, _] => {
            if first.is_empty() {
                return Err(
                    "nothing before ':'; write 'hostname:container_port' or 'published_port:container_port'"
                        .into(),
                );
            }
            if first.chars().all(|c| c.is_ascii_digit()) || is_range(first) {
                (None, Some(parse_port_number(first, "published port")?))
            } else {
                (Some(validate_hostname(first)?), None)
            }
        }
        [first, lb, _] => {
            let published = parse_port_number(lb, "published port")?;
            let hostname = if first.is_empty() {
                None
            } else {
                Some(validate_hostname(first)?)
            };
            (hostname, Some(published))
        }
        _ => return Err("a port has at most three ':'-separated parts".into()),
    };
    let protocol = match (protocol, &hostname) {
        (Some(p), _) => p,
        (None, Some(_)) => IngressProtocol::Https,
        (None, None) => {
            return Err(format!(
                "'{t}' has neither a hostname nor a protocol; write '{t}/https' (or '/http') to publish it through the ingress, e.g. as {}.<cluster domain>, or 'app.example.com:{container_port}' for your own hostname", service.dns_label()
            ))
        }
    };
    Ok(PortSpec::Ingress {
        hostname,
        published,
        container_port,
        protocol,
    })
}

/// `[published:]container_port/tcp|udp`: an Ingress Port on every Machine's edge.
fn parse_stream(body: &str, proto: &str) -> Result<PortSpec, String> {
    let protocol = if proto.eq_ignore_ascii_case("udp") {
        HostProtocol::Udp
    } else {
        HostProtocol::Tcp
    };
    let proto = proto.to_ascii_lowercase();
    let parts = split_parts(body);
    let (published, container) = match parts.as_slice() {
        [container] => (None, *container),
        [published, container] => (Some(*published), *container),
        _ => {
            return Err(format!(
                "a {proto} ingress port is '[published_port:]container_port/{proto}', with no hostname (the edge forwards the port, not a name); to bind one Machine's address use '{}:{}/{proto}@host'",
                port_hint(body),
                port_hint(body)
            ))
        }
    };
    let container_port = parse_port_number(container, "container port")?;
    let published = match published {
        None => container_port,
        Some(p) if p.chars().all(|c| c.is_ascii_digit()) || is_range(p) => {
            parse_port_number(p, "published port")?
        }
        Some(h) => {
            return Err(format!(
                "'{h}' is not a port: a {proto} ingress port has no hostname (the edge forwards the port, not a name); write '{container_port}/{proto}' or 'published:{container_port}/{proto}'"
            ))
        }
    };
    Ok(PortSpec::Stream {
        published,
        container_port,
        protocol,
    })
}

fn is_range(s: &str) -> bool {
    s.contains('-')
        && s.split('-')
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

/// The container port of a partly parsed body, for hints.
fn port_hint(body: &str) -> &str {
    body.rsplit(':').next().unwrap_or(body)
}

fn parse_host(body: &str) -> Result<PortSpec, String> {
    let (body, protocol) = match body.rsplit_once('/') {
        // A '/' that belongs to a CIDR is followed by more ':'-separated parts.
        Some((b, proto)) if !proto.contains(':') => match proto.to_ascii_lowercase().as_str() {
            "tcp" => (b, HostProtocol::Tcp),
            "udp" => (b, HostProtocol::Udp),
            other => {
                return Err(format!(
                    "host ports use tcp or udp, not '{other}'; for http or https publish through the ingress without '@host'"
                ))
            }
        },
        _ => (body, HostProtocol::Tcp),
    };
    let parts = split_parts(body);
    let (host_ip, host, container) = match parts.as_slice() {
        [container] => (None, "", *container),
        [host, container] => (None, *host, *container),
        [ip, host, container] => (Some(parse_host_ip(ip)?), *host, *container),
        _ => return Err("a port has at most three ':'-separated parts".into()),
    };
    if !host.is_empty() && !host.chars().all(|c| c.is_ascii_digit()) && !is_range(host) {
        return Err(format!(
            "'{host}' is not a host port; a hostname cannot be used with '@host' (host ports bind the Machine's addresses)"
        ));
    }
    let host_port = if host.is_empty() {
        None
    } else {
        Some(parse_port_number(host, "host port")?)
    };
    let container_port = parse_port_number(container, "container port")?;
    Ok(PortSpec::Host {
        host_ip,
        host_port,
        container_port,
        protocol,
    })
}

/// Why a Compose `ports:` entry cannot be read: one sentence, and what to write instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PortError {
    pub message: String,
    pub fix: Option<String>,
}

impl PortError {
    fn new(message: impl Into<String>, fix: Option<String>) -> PortError {
        PortError {
            message: message.into(),
            fix,
        }
    }
}

impl From<String> for PortError {
    fn from(message: String) -> PortError {
        PortError { message, fix: None }
    }
}

/// Parses one short-syntax Compose `ports:` entry (`"80:80"`, `"3000"`, `"127.0.0.1:8080:80"`,
/// `"[::1]:8080:80"`, `"53:53/udp"`, `"8000-8010:8000-8010"`, `"127.0.0.1::80"`) into host
/// ports on the Machine, one per port of a range. Splits as docker compose does: the last part
/// is the container port, the one before it the host port, everything before that the host IP
/// (an IPv6 one with or without brackets).
pub(crate) fn parse_compose_short(text: &str) -> Result<Vec<PortSpec>, PortError> {
    let t = text.trim();
    if t.is_empty() {
        return Err(PortError::new(
            "a port must not be empty",
            Some("write e.g. '8080:80'".into()),
        ));
    }
    if let Some(c) = t.chars().find(|c| c.is_whitespace()) {
        return Err(PortError::new(
            format!("a port must not contain whitespace ({c:?})"),
            Some("write e.g. '8080:80'".into()),
        ));
    }
    let (body, protocol) = match t.rsplit_once('/') {
        Some((body, proto)) => (body, parse_protocol(proto)?),
        None => (t, HostProtocol::Tcp),
    };
    // From the right: container port, host port, then everything left is the host IP.
    let mut parts = body.rsplitn(3, ':');
    let target = parts.next().unwrap_or_default();
    let published = parts.next();
    let host_ip = match parts.next() {
        None | Some("") => None,
        Some(ip) => Some(compose_host_ip(ip)?),
    };
    let published = published.filter(|p| !p.is_empty());
    expand_host_ports(host_ip, published, target, protocol)
}

/// `tcp` or `udp` in any case; `sctp` and anything else are refused with what Ployz takes.
pub(crate) fn parse_protocol(text: &str) -> Result<HostProtocol, PortError> {
    match text.to_ascii_lowercase().as_str() {
        "tcp" => Ok(HostProtocol::Tcp),
        "udp" => Ok(HostProtocol::Udp),
        "sctp" => Err(PortError::new(
            "sctp ports are not supported; Ployz publishes tcp and udp ports",
            Some("use tcp or udp".into()),
        )),
        "" => Err(PortError::new(
            "the protocol after '/' is missing",
            Some("write tcp or udp, or leave '/' out for tcp".into()),
        )),
        other => Err(PortError::new(
            format!("unknown protocol '{other}'"),
            Some("use tcp or udp".into()),
        )),
    }
}

/// A Compose host IP: an address (IPv6 with or without brackets), not a CIDR.
pub(crate) fn compose_host_ip(text: &str) -> Result<String, PortError> {
    if text.contains('/') {
        return Err(PortError::new(
            format!("'{text}' is not an IP address; a Compose host_ip is one address"),
            Some("bind one address, e.g. 127.0.0.1 or ::1 (or x-ports for a CIDR)".into()),
        ));
    }
    let bracketed = if text.contains(':') && !text.starts_with('[') {
        format!("[{text}]")
    } else {
        text.to_owned()
    };
    parse_host_ip(&bracketed).map_err(PortError::from)
}

/// A port or an inclusive range `start-end`, as (start, end).
fn parse_port_range(text: &str, what: &str) -> Result<(u16, u16), PortError> {
    match text.split_once('-') {
        None => {
            let p = parse_port_number(text, what)?;
            Ok((p, p))
        }
        Some((_, b)) if b.contains('-') => Err(PortError::new(
            format!("the {what} '{text}' is neither a port nor a range"),
            Some("write a port (8080) or a range (8000-8010)".into()),
        )),
        Some((a, b)) => {
            let start = parse_port_number(a, what)?;
            let end = parse_port_number(b, what)?;
            if end < start {
                return Err(PortError::new(
                    format!("the {what} range '{text}' ends before it starts"),
                    Some(format!("write it as '{end}-{start}'")),
                ));
            }
            Ok((start, end))
        }
    }
}

/// The host ports of one Compose port: `target` a port or a range, `published` (the host side)
/// none (Docker picks), a port or a range as long as `target`'s. A host range for a single
/// container port (Docker would pick one port of it) is refused: the plan could not say which
/// port the container holds.
pub(crate) fn expand_host_ports(
    host_ip: Option<String>,
    published: Option<&str>,
    target: &str,
    protocol: HostProtocol,
) -> Result<Vec<PortSpec>, PortError> {
    let (t_start, t_end) = parse_port_range(target, "container port")?;
    let host = published
        .map(|p| parse_port_range(p, "published port"))
        .transpose()?;
    // The hints below are spelled as written, host IP included.
    let ip = match host_ip.as_deref() {
        Some(ip) if ip.contains(':') => format!("[{ip}]:"),
        Some(ip) => format!("{ip}:"),
        None => String::new(),
    };
    let spec = |host_port: Option<u16>, container_port: u16| PortSpec::Host {
        host_ip: host_ip.clone(),
        host_port,
        container_port,
        protocol,
    };
    match host {
        None => Ok((t_start..=t_end).map(|c| spec(None, c)).collect()),
        Some((h_start, h_end)) if h_end - h_start == t_end - t_start => Ok((t_start..=t_end)
            .zip(h_start..=h_end)
            .map(|(c, h)| spec(Some(h), c))
            .collect()),
        Some((h_start, h_end)) if t_start == t_end => Err(PortError::new(
            format!(
                "the host port range {h_start}-{h_end} for the one container port {t_start} would let Docker pick any port of it, and the plan could not say which"
            ),
            Some(format!(
                "publish one host port ('{ip}{h_start}:{t_start}'), or leave the host port out ('{}') for Docker to pick a free one",
                if ip.is_empty() { t_start.to_string() } else { format!("{ip}:{t_start}") }
            )),
        )),
        Some((h_start, h_end)) => Err(PortError::new(
            format!(
                "the host ports {} hold {} port(s) but the container ports {} hold {}",
                range_text(h_start, h_end),
                u32::from(h_end - h_start) + 1,
                range_text(t_start, t_end),
                u32::from(t_end - t_start) + 1
            ),
            Some(format!(
                "give both sides as many ports, e.g. '{ip}{}:{}'",
                range_text(t_start, t_end),
                range_text(t_start, t_end)
            )),
        )),
    }
}

fn range_text(start: u16, end: u16) -> String {
    if start == end {
        start.to_string()
    } else {
        format!("{start}-{end}")
    }
}

/// A host address or CIDR in canonical text: `10.0.0.1`, `::1`, `10.0.0.0/8`, `fd00::/8`.
/// IPv6 addresses are written in brackets (`[::1]`, `[fd00::]/8`); an unbracketed IPv6 CIDR is
/// accepted too, as the canonical form prints it that way.
pub(crate) fn parse_host_ip(text: &str) -> Result<String, String> {
    let (addr, prefix) = if let Some(rest) = text.strip_prefix('[') {
        let Some((addr, after)) = rest.split_once(']') else {
            return Err(format!("'{text}' opens '[' without closing it"));
        };
        match after {
            "" => (addr, None),
            p if p.starts_with('/') => (addr, Some(&p[1..])),
            _ => return Err(format!("'{text}' is not a host address")),
        }
    } else {
        match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => {
                if text.contains(':') {
                    return Err(format!(
                        "the IPv6 address '{text}' must be written in brackets, e.g. '[{text}]:53:53/udp@host'"
                    ));
                }
                (text, None)
            }
        }
    };
    let ip: IpAddr = addr.parse().map_err(|_| {
        format!("'{text}' is not an IP address or CIDR (e.g. 127.0.0.1, [::1], 10.0.0.0/8)")
    })?;
    match prefix {
        None => Ok(ip.to_string()),
        Some(p) => {
            let max = if ip.is_ipv4() { 32 } else { 128 };
            let bits: u8 = p
                .parse()
                .ok()
                .filter(|b| *b <= max && p.chars().all(|c| c.is_ascii_digit()))
                .ok_or_else(|| format!("'{text}' has an invalid prefix length; it is 0-{max}"))?;
            Ok(format!("{ip}/{bits}"))
        }
    }
}

/// Validates an Ingress Hostname and returns it lowercased: a DNS name with at least one dot,
/// labels of 1-63 characters of `a-z`, `0-9` and `-` that do not start or end with `-`, at most
/// 253 characters in total.
pub(crate) fn validate_hostname(text: &str) -> Result<String, String> {
    let h = text.to_ascii_lowercase();
    let fail = |why: String| Err(format!("'{text}' is not a valid hostname: {why}"));
    if h.is_empty() {
        return fail("it is empty".into());
    }
    if h.len() > MAX_HOSTNAME_LEN {
        return fail(format!(
            "it is {} characters long; the limit is {MAX_HOSTNAME_LEN}",
            h.len()
        ));
    }
    if let Some(c) = h
        .chars()
        .find(|c| !matches!(c, 'a'..='z' | '0'..='9' | '-' | '.'))
    {
        return fail(format!(
            "'{c}' is not allowed; hostnames use letters, digits, '-' and '.' (write internationalised names in punycode)"
        ));
    }
    if !h.contains('.') {
        return fail("it has no dot; write the full domain, e.g. 'app.example.com'".into());
    }
    if h.ends_with('.') {
        return fail("it ends with '.'; leave the trailing dot out".into());
    }
    for label in h.split('.') {
        if label.is_empty() {
            return fail("it has an empty label ('..' or a leading '.')".into());
        }
        if label.len() > MAX_LABEL_LEN {
            return fail(format!(
                "the label '{label}' is {} characters long; the limit is {MAX_LABEL_LEN}",
                label.len()
            ));
        }
        if label.starts_with('-') || label.ends_with('-') {
            return fail(format!("the label '{label}' starts or ends with '-'"));
        }
    }
    if h.rsplit('.')
        .next()
        .is_some_and(|tld| tld.chars().all(|c| c.is_ascii_digit()))
    {
        return fail(
            "it looks like an IP address; an ingress port needs a DNS name, and a port bound on an address is written '<ip>:<host_port>:<container_port>/tcp@host'"
                .into(),
        );
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc() -> ServiceName {
        "web".parse().unwrap()
    }

    fn ok(text: &str) -> String {
        parse_port(text, &svc())
            .unwrap_or_else(|e| panic!("{text}: {e}"))
            .to_string()
    }

    fn err(text: &str) -> String {
        match parse_port(text, &svc()) {
            Ok(p) => panic!("{text} parsed as {p}"),
            Err(e) => e,
        }
    }

    #[test]
    fn ingress_forms_parse_to_canonical_text() {
        let cases = [
            ("app.example.com:8080", "app.example.com:8080/https"),
            ("App.Example.COM:8080/http", "app.example.com:8080/http"),
            (
                "app.example.com:443:8080/https",
                "app.example.com:443:8080/https",
            ),
            ("8000/https", "8000/https"),
            ("8000/HTTP", "8000/http"),
            ("80:8000/http", "80:8000/http"),
            (":80:8000/http", "80:8000/http"),
            (" a.b:1 ", "a.b:1/https"),
        ];
        for (input, want) in cases {
            assert_eq!(ok(input), want, "{input}");
        }
        assert_eq!(
            parse_port("app.example.com:8080", &svc()).unwrap(),
            PortSpec::Ingress {
                hostname: Some("app.example.com".into()),
                published: None,
                container_port: 8080,
                protocol: IngressProtocol::Https
            }
        );
    }

    #[test]
    fn host_forms_parse_to_canonical_text() {
        let cases = [
            ("8080:80@host", "8080:80/tcp@host"),
            ("53:5353/udp@host", "53:5353/udp@host"),
            ("127.0.0.1:8080:80/tcp@host", "127.0.0.1:8080:80/tcp@host"),
            ("[::1]:53:53/udp@host", "[::1]:53:53/udp@host"),
            ("[0:0::1]:53:53/udp@host", "[::1]:53:53/udp@host"),
            ("10.0.0.0/8:80:80@host", "10.0.0.0/8:80:80/tcp@host"),
            ("[fd00::]/8:80:80/tcp@host", "fd00::/8:80:80/tcp@host"),
            ("fd00::/8:80:80/tcp@host", "fd00::/8:80:80/tcp@host"),
            ("3000@host", "3000/tcp@host"),
            ("3000/udp@host", "3000/udp@host"),
            ("5432/tcp", "5432/tcp"),
            ("15432:5432/TCP", "15432:5432/tcp"),
            ("53/udp", "53/udp"),
            ("5353:53/udp", "5353:53/udp"),
            ("5432:5432/tcp", "5432/tcp"),
            ("127.0.0.1::3000/tcp@host", "127.0.0.1::3000/tcp@host"),
            ("[::1]::3000/tcp@host", "[::1]::3000/tcp@host"),
        ];
        for (input, want) in cases {
            assert_eq!(ok(input), want, "{input}");
            // The canonical text parses back to the same value.
            assert_eq!(ok(want), want, "{want}");
        }
    }

    #[test]
    fn broken_ports_say_what_to_write() {
        let cases = [
            ("8000", "write '8000/https'"),
            ("0/tcp", "out of range"),
            (
                "db:5432/tcp",
                "'db' is not a port: a tcp ingress port has no hostname",
            ),
            ("0/https", "out of range"),
            ("70000/https", "out of range"),
            ("a.b:0", "out of range"),
            ("8000-8001:80/http", "port ranges"),
            ("8000-8001:80@host", "port ranges"),
            ("bad host.com:80", "'bad host.com' is not a valid hostname"),
            (
                "app.example.com:80 /https",
                "a port must not contain whitespace",
            ),
            ("80 80@host", "a port must not contain whitespace"),
            ("a..b.com:80", "empty label"),
            ("{x}.com:80", "'{' is not allowed"),
            ("x;y.com:80", "';' is not allowed"),
            ("localhost:80", "has no dot"),
            ("a.com.:80", "ends with '.'"),
            ("-a.com:80", "starts or ends with '-'"),
            ("127.0.0.1:80:80", "looks like an IP address"),
            (
                "app.example.com:80:5432/tcp",
                "a tcp ingress port is '[published_port:]container_port/tcp', with no hostname",
            ),
            ("app.com:80:80@host", "not an IP address"),
            ("app.com:80@host", "hostname cannot be used with '@host'"),
            ("8080:80/http@host", "host ports use tcp or udp"),
            ("8080:80@swarm", "unknown port mode"),
            ("1:2@host@host", "'@' only once"),
            ("::1:53:53@host", "must be written in brackets"),
            ("10.0.0.0/33:80:80@host", "invalid prefix length"),
            ("80/ftp", "unknown protocol 'ftp'"),
            ("", "must not be empty"),
            ("a:b:c:d/https", "is not a port number"),
            ("8000/", "protocol after '/' is missing"),
            (":80/http", "nothing before ':'"),
        ];
        for (input, want) in cases {
            let e = err(input);
            assert!(e.contains(want), "{input}: {e}");
        }
        let label = "a".repeat(64);
        assert!(err(&format!("{label}.com:80")).contains("64 characters long"));
        let long = format!("{}.com", ["abcdefghij"; 23].join("."));
        assert!(long.len() > 253);
        assert!(err(&format!("{long}:80")).contains("the limit is 253"));
    }
}
