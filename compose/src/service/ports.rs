//! `ports:` and `x-ports:`, which cannot be used together. `x-ports` says everything Ployz
//! needs (an Ingress Hostname and http/https, or a host port); `ports` is accepted in its long
//! syntax with `mode: host`, and every other form is an error with the nearest working spelling.

use std::collections::BTreeMap;

use ployz_core::{HostProtocol, PortSpec};

use crate::port::{parse_host_ip, parse_port, parse_port_number};

use super::keys::warn_unknown_keys;
use super::shapes::text;
use super::{Node, ServiceCtx};

/// The keys of a long-syntax port.
const LONG_PORT_KEYS: &[&str] = &[
    "target",
    "published",
    "host_ip",
    "protocol",
    "mode",
    "name",
    "app_protocol",
];

/// The service's ports from `ports:` or `x-ports:`, sorted, each host port bound once.
pub(super) fn ports(
    ctx: &mut ServiceCtx<'_>,
    compose_ports: Option<&Node>,
    x_ports: Option<&Node>,
) -> Vec<PortSpec> {
    let ports = match (compose_ports, x_ports) {
        (Some(p), Some(x)) => {
            ctx.err(
                "x-ports",
                None,
                "ports and x-ports cannot be used together on one service",
                Some("use only x-ports (e.g. app.example.com:8080/https, 8080:80/tcp@host), or only ports with mode: host"),
            );
            // Each key's own problems are still worth reporting in the same run.
            let _ = compose_ports_key(ctx, p);
            let _ = x_ports_key(ctx, x);
            Vec::new()
        }
        (Some(p), None) => compose_ports_key(ctx, p),
        (None, Some(x)) => x_ports_key(ctx, x),
        (None, None) => Vec::new(),
    };
    let ports_key = if x_ports.is_some() {
        "x-ports"
    } else {
        "ports"
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

/// `ports:`: long-syntax entries become host ports; short-syntax ones are errors.
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
            Node::Map(_) => {
                if let Some(p) = long_port(ctx, &key, item) {
                    out.push(p);
                }
            }
            other => {
                let Some(t) = ctx.get(&key, other, text) else {
                    continue;
                };
                short_port(ctx, &key, &t);
            }
        }
    }
    out
}

/// A short-syntax `ports` entry publishes in ingress mode, which Ployz cannot route without a
/// protocol: always an error, with the nearest working spelling.
fn short_port(ctx: &mut ServiceCtx<'_>, key: &str, t: &str) {
    let (body, proto) = t.rsplit_once('/').unwrap_or((t, "tcp"));
    let parts: Vec<&str> = body.rsplitn(3, ':').collect();
    let target = parts.first().copied().unwrap_or("");
    let published = parts.get(1).copied();
    if target.contains('-') || published.is_some_and(|p| p.contains('-')) {
        ctx.err(
            key,
            Some(t.to_owned()),
            "published port ranges are not supported",
            Some("publish each port on its own line"),
        );
        return;
    }
    let fix = match published {
        Some(p) if !p.is_empty() => format!(
            "use x-ports for a web port (e.g. x-ports: ['app.example.com:{target}/https']), or bind it on the Machine with the long syntax (target: {target}, published: {p}, protocol: {proto}, mode: host) or x-ports: ['{p}:{target}/{proto}@host']"
        ),
        _ => format!(
            "use x-ports for a web port (e.g. x-ports: ['{target}/https']), or bind it on the Machine with the long syntax (target: {target}, published: {target}, mode: host)"
        ),
    };
    ctx.err(
        key,
        Some(t.to_owned()),
        "short syntax ports publish in ingress mode, which Ployz routes only for http or https",
        Some(&fix),
    );
}

/// A long-syntax `ports` entry: only `mode: host` with `published:` binds a port.
fn long_port(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<PortSpec> {
    warn_unknown_keys(ctx, key, n, LONG_PORT_KEYS);
    let target = port_target(ctx, key, n)?;
    let published = port_published(ctx, key, n)?;
    let protocol = port_protocol(ctx, key, n)?;
    let host_ip = port_host_ip(ctx, key, n)?;
    check_port_mode(ctx, key, n, target, published)?;
    let Some(host_port) = published else {
        ctx.err(
            key,
            Some(n.short()),
            "a host-mode port needs published: (the port bound on the Machine)",
            Some(&format!("add published: {target}")),
        );
        return None;
    };
    Some(PortSpec::Host {
        host_ip,
        host_port,
        container_port: target,
        protocol,
    })
}

/// `target:`, the container port; required.
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
                .then_some("publish each port on its own line");
            ctx.err(&format!("{key}.target"), Some(s), m, fix);
            None
        }
    }
}

/// `published:`, the port on the Machine; not a range. `Some(None)` when not given.
fn port_published(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<Option<u16>> {
    let p = match n.get("published") {
        None | Some(Node::Null) => return Some(None),
        Some(p) => p,
    };
    let s = ctx.get(&format!("{key}.published"), p, text)?;
    if s.contains('-') {
        ctx.err(
            &format!("{key}.published"),
            Some(s),
            "published port ranges are not supported",
            Some("publish each port on its own line"),
        );
        return None;
    }
    match parse_port_number(&s, "published port") {
        Ok(p) => Some(Some(p)),
        Err(m) => {
            ctx.err(&format!("{key}.published"), Some(s), m, None);
            None
        }
    }
}

/// `protocol:`, `tcp` (the default) or `udp`.
fn port_protocol(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<HostProtocol> {
    let p = match n.get("protocol") {
        None | Some(Node::Null) => return Some(HostProtocol::Tcp),
        Some(p) => p,
    };
    match ctx.get(&format!("{key}.protocol"), p, text)?.as_str() {
        "tcp" => Some(HostProtocol::Tcp),
        "udp" => Some(HostProtocol::Udp),
        other => {
            ctx.err(
                &format!("{key}.protocol"),
                Some(other.to_owned()),
                "unknown protocol",
                Some("use tcp or udp"),
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
    let bracketed = if s.contains(':') && !s.starts_with('[') {
        format!("[{s}]")
    } else {
        s.clone()
    };
    match parse_host_ip(&bracketed) {
        Ok(ip) => Some(Some(ip)),
        Err(m) => {
            ctx.err(&format!("{key}.host_ip"), Some(s), m, None);
            None
        }
    }
}

/// `mode:` must be `host`: the default, `ingress`, cannot say http or https.
fn check_port_mode(
    ctx: &mut ServiceCtx<'_>,
    key: &str,
    n: &Node,
    target: u16,
    published: Option<u16>,
) -> Option<()> {
    let mode = match n.get("mode") {
        None | Some(Node::Null) => "ingress".to_owned(),
        Some(m) => ctx.get(&format!("{key}.mode"), m, text)?,
    };
    match mode.as_str() {
        "host" => Some(()),
        "ingress" => {
            let p = published.unwrap_or(target);
            ctx.err(
                &format!("{key}.mode"),
                Some(mode.clone()),
                "ingress-mode ports need http or https, which the ports key cannot say",
                Some(&format!(
                    "use x-ports for a web port (e.g. x-ports: ['app.example.com:{target}/https']), or set mode: host to bind {p} on the Machine"
                )),
            );
            None
        }
        other => {
            ctx.err(
                &format!("{key}.mode"),
                Some(other.to_owned()),
                "unknown port mode",
                Some("use mode: host (or x-ports for http/https through the ingress)"),
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
    let mut seen: BTreeMap<(Option<String>, u16, HostProtocol), u16> = BTreeMap::new();
    for p in &ports {
        if let PortSpec::Host {
            host_ip,
            host_port,
            container_port,
            protocol,
        } = p
        {
            if let Some(other) =
                seen.insert((host_ip.clone(), *host_port, *protocol), *container_port)
            {
                ctx.err(
                    key,
                    Some(p.to_string()),
                    format!("host port {host_port} is bound twice (to container ports {other} and {container_port})"),
                    Some("bind each host port once"),
                );
            }
        }
    }
    ports
}
