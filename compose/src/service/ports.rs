//! `ports:` and `x-ports:`, merged into one list.
//!
//! `ports` is Compose's: every entry, short syntax (`"80:80"`, `"3000"`, `"127.0.0.1:8080:80"`,
//! `"53:53/udp"`, `"8000-8010:8000-8010"`) or long (with or without `mode`), binds host ports
//! on the Machine that runs the container, as docker compose does on one engine; without a host
//! port Docker picks a free one. `x-ports` is Ployz's: it publishes web ports through the edge by
//! Ingress Hostname (and can bind host ports too, `8080:80/tcp@host`). Both may be used on one
//! Service; a host port bound twice (overlapping addresses, same port and protocol) is an error.

use ployz_core::{HostProtocol, PortSpec};

use crate::port::{
    compose_host_ip, expand_host_ports, parse_compose_short, parse_port, parse_port_number,
    parse_protocol,
};

use super::keys::nested_keys;
use super::shapes::text;
use super::{Node, ServiceCtx};

/// The keys of a long-syntax port.
/// The service's ports from `ports:` and `x-ports:`, sorted, each host port bound once.
pub(super) fn ports(
    ctx: &mut ServiceCtx<'_>,
    compose_ports: Option<&Node>,
    x_ports: Option<&Node>,
) -> Vec<PortSpec> {
    let mut ports = compose_ports
        .map(|p| compose_ports_key(ctx, p))
        .unwrap_or_default();
    ports.extend(x_ports.map(|x| x_ports_key(ctx, x)).unwrap_or_default());
    let ports_key = match (compose_ports, x_ports) {
        (Some(_), Some(_)) => "ports and x-ports",
        (None, Some(_)) => "x-ports",
        _ => "ports",
    };
    check_host_ports(ctx, ports_key, ports)
}

/// `x-ports:`: a list of entries in the `x-ports` grammar.
fn x_ports_key(ctx: &mut ServiceCtx<'_>, n: &Node) -> Vec<PortSpec> {
    let items = match n {
        Node::Null => return Vec::new(),
        Node::Seq(items) => items,
        other => {
            ctx.bad(
                "x-ports",
                other,
                format!("expected a list of ports, found {}", other.kind()),
            );
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let key = format!("x-ports[{i}]");
        let Some(t) = ctx.get(&key, item, text) else {
            continue;
        };
        match parse_port(&t, ctx.name) {
            Ok(p) => out.push(p),
            Err(m) => ctx.err(&key, Some(t), m, None),
        }
    }
    out
}

/// `ports:`: every entry, short or long syntax, publishes host ports on the Machine that runs
/// the container.
fn compose_ports_key(ctx: &mut ServiceCtx<'_>, n: &Node) -> Vec<PortSpec> {
    let items = match n {
        Node::Null => return Vec::new(),
        Node::Seq(items) => items,
        other => {
            ctx.bad(
                "ports",
                other,
                format!("expected a list, found {}", other.kind()),
            );
            return Vec::new();
        }
    };
    let mut out = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let key = format!("ports[{i}]");
        match item {
            Node::Map(_) => out.extend(long_port(ctx, &key, item).unwrap_or_default()),
            other => {
                let Some(t) = ctx.get(&key, other, text) else {
                    continue;
                };
                match parse_compose_short(&t) {
                    Ok(ports) => out.extend(ports),
                    Err(e) => ctx.err(&key, Some(t), e.message, e.fix.as_deref()),
                }
            }
        }
    }
    out
}

/// A long-syntax `ports` entry: `target`, and optionally `published` (a port or a range;
/// without it Docker picks a free host port), `host_ip`, `protocol` and `mode` (`ingress`, the
/// default, or `host`: on one engine both publish on the Machine).
fn long_port(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<Vec<PortSpec>> {
    nested_keys(ctx, "ports[]", key, n);
    let target = port_target(ctx, key, n);
    let published = port_published(ctx, key, n);
    let protocol = port_protocol(ctx, key, n);
    let host_ip = port_host_ip(ctx, key, n);
    let mode = check_port_mode(ctx, key, n);
    let (target, published, protocol, host_ip, ()) =
        (target?, published?, protocol?, host_ip?, mode?);
    match expand_host_ports(host_ip, published.as_deref(), &target.to_string(), protocol) {
        Ok(ports) => Some(ports),
        Err(e) => {
            ctx.err(
                &format!("{key}.published"),
                published,
                e.message,
                e.fix.as_deref(),
            );
            None
        }
    }
}

/// `target:`, the container port; required, one port.
fn port_target(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<u16> {
    let Some(t) = n.get("target") else {
        ctx.bad(key, n, "a port needs target: (the container port)");
        return None;
    };
    let s = ctx.get(&format!("{key}.target"), t, text)?;
    match parse_port_number(&s, "target port") {
        Ok(p) => Some(p),
        Err(m) => {
            let fix = s
                .contains('-')
                .then_some("write one port per entry as target:, or use the short syntax ('8000-8010:8000-8010')");
            ctx.err(&format!("{key}.target"), Some(s), m, fix);
            None
        }
    }
}

/// `published:`, the port or range on the Machine, as written. `Some(None)` when not given.
fn port_published(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<Option<String>> {
    match n.get("published") {
        None | Some(Node::Null) => Some(None),
        Some(p) => ctx
            .get(&format!("{key}.published"), p, text)
            .map(|s| Some(s).filter(|s| !s.is_empty())),
    }
}

/// `protocol:`, `tcp` (the default) or `udp`.
fn port_protocol(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<HostProtocol> {
    let p = match n.get("protocol") {
        None | Some(Node::Null) => return Some(HostProtocol::Tcp),
        Some(p) => p,
    };
    let s = ctx.get(&format!("{key}.protocol"), p, text)?;
    match parse_protocol(&s) {
        Ok(p) => Some(p),
        Err(e) => {
            ctx.err(
                &format!("{key}.protocol"),
                Some(s),
                e.message,
                e.fix.as_deref(),
            );
            None
        }
    }
}

/// `host_ip:`, the Machine address to bind (an IPv6 one with or without brackets). `Some(None)`
/// when not given.
fn port_host_ip(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<Option<String>> {
    let ip = match n.get("host_ip") {
        None | Some(Node::Null) => return Some(None),
        Some(ip) => ip,
    };
    let s = ctx.get(&format!("{key}.host_ip"), ip, text)?;
    if s.is_empty() {
        return Some(None);
    }
    match compose_host_ip(&s) {
        Ok(ip) => Some(Some(ip)),
        Err(e) => {
            ctx.err(
                &format!("{key}.host_ip"),
                Some(s),
                e.message,
                e.fix.as_deref(),
            );
            None
        }
    }
}

/// `mode:`, `ingress` (the default) or `host`: on a single engine, which is what each Machine
/// is, Compose binds both on the Machine's addresses, and so does Ployz.
fn check_port_mode(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<()> {
    let mode = match n.get("mode") {
        None | Some(Node::Null) => return Some(()),
        Some(m) => ctx.get(&format!("{key}.mode"), m, text)?,
    };
    match mode.as_str() {
        "host" | "ingress" => Some(()),
        other => {
            ctx.err(
                &format!("{key}.mode"),
                Some(other.to_owned()),
                "unknown port mode",
                Some("use mode: host or ingress (both bind the port on the Machine), or x-ports to publish http/https through the edge"),
            );
            None
        }
    }
}

/// Sorts and deduplicates ports, and refuses two bindings of one host port.
fn check_host_ports(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    mut ports: Vec<PortSpec>,
) -> Vec<PortSpec> {
    ports.sort();
    ports.dedup();
    // Each fixed binding seen so far: (host IP, port, protocol, container port).
    let mut seen: Vec<(Option<&str>, u16, HostProtocol, u16)> = Vec::new();
    for p in &ports {
        if let PortSpec::Host {
            host_ip,
            host_port: Some(host_port),
            container_port,
            protocol,
        } = p
        {
            let ip = host_ip.as_deref();
            if let Some((_, _, _, other)) = seen.iter().find(|(other_ip, port, proto, _)| {
                port == host_port && proto == protocol && ips_overlap(*other_ip, ip)
            }) {
                ctx.err(
                    key,
                    Some(p.to_string()),
                    format!("host port {host_port} is bound twice (to container ports {other} and {container_port})"),
                    Some("bind each host port once"),
                );
            }
            seen.push((ip, *host_port, *protocol, *container_port));
        }
    }
    // An Ingress Port is held on every Machine: once per port and protocol, and never beside
    // a host port of the same.
    let mut streams: Vec<(u16, HostProtocol, u16)> = Vec::new();
    for p in &ports {
        if let PortSpec::Stream {
            published,
            container_port,
            protocol,
        } = p
        {
            let twice = streams
                .iter()
                .find(|(port, proto, _)| port == published && proto == protocol)
                .map(|(_, _, other)| format!("Ingress Port {published}/{protocol} is published twice (to container ports {other} and {container_port})"))
                .or_else(|| {
                    seen.iter()
                        .any(|(_, port, proto, _)| port == published && proto == protocol)
                        .then(|| format!("port {published}/{protocol} is both an Ingress Port and a host port"))
                });
            if let Some(message) = twice {
                ctx.err(
                    key,
                    Some(p.to_string()),
                    message,
                    Some("publish each port once"),
                );
            }
            streams.push((*published, *protocol, *container_port));
        }
    }
    ports
}

/// Whether two host addresses of one port collide when Docker binds them: no address (every
/// address) or an unspecified one of the same family collides with any address of it.
fn ips_overlap(a: Option<&str>, b: Option<&str>) -> bool {
    let parse = |ip: Option<&str>| {
        ip.and_then(|s| s.trim_matches(['[', ']']).parse::<std::net::IpAddr>().ok())
    };
    match (a, b) {
        (None, _) | (_, None) => true,
        _ => match (parse(a), parse(b)) {
            (Some(x), Some(y)) => {
                x == y || (x.is_ipv4() == y.is_ipv4() && (x.is_unspecified() || y.is_unspecified()))
            }
            // A CIDR or another form: only the same text collides for certain.
            _ => a == b,
        },
    }
}
