//! `x-routes`: which paths of the Service's Ingress Hostnames reach it.
//!
//! ```yaml
//! x-ports: [example.com:8080/https]
//! x-routes:
//!   - path: /api            # /api, /api/ and everything under /api/
//!     strip_prefix: true    # the container sees /users for /api/users
//!   - exact: /healthz       # that path alone
//!   - hostname: example.com # needed when the Service publishes more than one hostname
//!     path: /static
//!   - hostname: www.example.com   # the edge answers a redirect itself,
//!     redirect: https://example.com  # path and query kept; status 308 unless `status:`
//!   - path: /admin
//!     basic_auth: { users_file: ./admins.htpasswd }  # bcrypt or argon2 hashes only
//!     timeout: 120s          # how long the container may take to answer
//!     max_body_size: 50m     # larger request bodies get 413
//!     error_pages: { 502: ./errors/502.html }  # the edge's own 502, 503 and 504
//! ```
//!
//! Paths are plain text, never patterns: a prefix matches on a segment boundary, longest first,
//! and an exact path wins over every prefix. The query is not part of the match. A hostname
//! with routes is served at those paths only; one without is served whole.

use std::collections::BTreeSet;

use std::collections::BTreeMap;

use ployz_core::{BasicAuth, HeaderRules, PathMatch, PortSpec, Redirect, RouteSpec, SecretValue};

use super::keys::nested_keys;
use super::shapes::{boolean, kv_entries, string_list, text};
use super::{Node, ServiceCtx};

const KEY: &str = "x-routes";

/// The longest path a route may name.
const MAX_PATH: usize = 1024;

/// The largest users list or error page a route reads from a file.
const MAX_FILE: u64 = 64 * 1024;

/// The statuses a route may give its own error page.
const ERROR_STATUSES: [u16; 3] = [502, 503, 504];

/// The longest a route may let a container take to answer.
const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// One entry as written, before the hostnames of `x-ports` are known.
pub(super) struct RawRoute {
    key: String,
    hostname: Option<String>,
    path: PathMatch,
    strip_prefix: bool,
    redirect: Option<Redirect>,
    request_headers: HeaderRules,
    response_headers: HeaderRules,
    allow: Vec<String>,
    auth: Option<RawAuth>,
    timeout_ms: Option<u64>,
    max_body_bytes: Option<u64>,
    error_pages: BTreeMap<u16, String>,
}

/// `basic_auth:` as written: a realm and where its users list comes from.
struct RawAuth {
    realm: String,
    users: UsersSource,
}

enum UsersSource {
    /// Read from `users_file:` already.
    File(SecretValue),
    /// A top-level secret, read by the project.
    Secret(String),
}

/// A route whose users list is a top-level secret, for the project to read: the route's key,
/// hostname and path, the secret's name and the realm.
#[derive(Debug, Clone)]
pub(crate) struct PendingUsers {
    pub key: String,
    pub hostname: String,
    pub path: PathMatch,
    pub secret: String,
    pub realm: String,
}

/// Reads `x-routes:`: a list of entries, each with `path` or `exact`, and optionally `hostname`
/// and `strip_prefix`. Entries with errors are recorded and left out.
pub(super) fn read(ctx: &mut ServiceCtx<'_>, n: &Node) -> Vec<RawRoute> {
    let items = match n {
        Node::Null => return Vec::new(),
        Node::Seq(items) => items,
        other => {
            ctx.bad(
                KEY,
                other,
                format!(
                    "expected a list of routes, found {}; write e.g. x-routes: [{{path: /api}}]",
                    other.kind()
                ),
            );
            return Vec::new();
        }
    };
    items
        .iter()
        .enumerate()
        .filter_map(|(i, item)| entry(ctx, format!("{KEY}[{i}]"), item))
        .collect()
}

fn entry(ctx: &mut ServiceCtx<'_>, key: String, n: &Node) -> Option<RawRoute> {
    let Node::Map(_) = n else {
        ctx.bad(
            &key,
            n,
            format!(
                "expected a route (path: or exact:), found {}; write e.g. - path: /api",
                n.kind()
            ),
        );
        return None;
    };
    nested_keys(ctx, "x-routes[]", &key, n);
    let hostname = match n.get("hostname") {
        None | Some(Node::Null) => None,
        Some(h) => Some(
            ctx.get(&format!("{key}.hostname"), h, text)?
                .to_ascii_lowercase(),
        ),
    };
    let strip_prefix = match n.get("strip_prefix") {
        None | Some(Node::Null) => false,
        Some(s) => ctx.get(&format!("{key}.strip_prefix"), s, boolean)?,
    };
    let redirect = redirect(ctx, &key, n)?;
    let request_headers = header_rules(ctx, &key, n, Side::Request)?;
    let response_headers = header_rules(ctx, &key, n, Side::Response)?;
    let allow = allow_list(ctx, &key, n)?;
    let auth = basic_auth(ctx, &key, n)?;
    let timeout_ms = match n.get("timeout").filter(|t| !matches!(t, Node::Null)) {
        None => None,
        Some(t) => {
            let field = format!("{key}.timeout");
            let ms = ctx.get(&field, t, super::shapes::duration)?;
            if !(1000..=MAX_TIMEOUT_MS).contains(&ms) {
                ctx.err(
                    &field,
                    Some(format!("{ms}ms")),
                    "a route's timeout is between 1s and 1h",
                    Some("write e.g. timeout: 120s"),
                );
                return None;
            }
            Some(ms)
        }
    };
    let max_body_bytes = match n.get("max_body_size").filter(|t| !matches!(t, Node::Null)) {
        None => None,
        Some(b) => Some(ctx.get(&format!("{key}.max_body_size"), b, super::shapes::size)?),
    };
    let error_pages = error_pages(ctx, &key, n)?;
    let whole = redirect.is_some()
        || !request_headers.is_empty()
        || !response_headers.is_empty()
        || !allow.is_empty()
        || auth.is_some()
        || timeout_ms.is_some()
        || max_body_bytes.is_some()
        || !error_pages.is_empty();
    let path = match (n.get("path"), n.get("exact")) {
        (Some(p), None) => {
            let field = format!("{key}.path");
            let p = ctx.get(&field, p, text)?;
            PathMatch::Prefix(check_path(ctx, &field, &p)?)
        }
        (None, Some(e)) => {
            let field = format!("{key}.exact");
            let e = ctx.get(&field, e, text)?;
            let exact = check_path(ctx, &field, &e)?;
            // `/api/` and `/api` are two exact paths; only prefixes drop the trailing `/`.
            PathMatch::Exact(if e.len() > 1 && e.ends_with('/') {
                format!("{exact}/")
            } else {
                exact
            })
        }
        (Some(_), Some(_)) => {
            ctx.err(
                &key,
                None,
                "a route has path: (a prefix) or exact: (one path), not both",
                Some("split it into two routes"),
            );
            return None;
        }
        // A redirect or header rules without a path take the whole hostname (`www.` to the
        // apex, a security header on every answer).
        (None, None) if whole => PathMatch::root(),
        (None, None) => {
            ctx.err(
                &key,
                None,
                "a route needs path: (a prefix) or exact: (one path)",
                Some("add e.g. path: /api"),
            );
            return None;
        }
    };
    if strip_prefix && !matches!(&path, PathMatch::Prefix(p) if p != "/") {
        ctx.err(
            &format!("{key}.strip_prefix"),
            Some("true".into()),
            format!("strip_prefix needs a path prefix other than /, and this route is {path}"),
            Some("remove strip_prefix, or route a prefix such as path: /api"),
        );
        return None;
    }
    Some(RawRoute {
        key,
        hostname,
        path,
        strip_prefix,
        redirect,
        request_headers,
        response_headers,
        allow,
        auth,
        timeout_ms,
        max_body_bytes,
        error_pages,
    })
}

/// Reads a file a route names, relative to the Compose file's folder, of at most
/// [`MAX_FILE`] bytes. Messages name the path, never the content.
fn route_file(ctx: &mut ServiceCtx<'_>, field: &str, path: &str) -> Option<Vec<u8>> {
    let full = ctx.dir.join(path);
    let problem = match std::fs::metadata(&full) {
        Ok(m) if !m.is_file() => "is not a file".to_owned(),
        Ok(m) if m.len() > MAX_FILE => format!("has {} bytes; at most 64 KiB", m.len()),
        Ok(_) => match std::fs::read(&full) {
            Ok(bytes) => return Some(bytes),
            Err(e) => format!("cannot be read: {e}"),
        },
        Err(e) => format!("cannot be read: {e}"),
    };
    ctx.err(
        field,
        Some(path.to_owned()),
        format!("{} {problem}", full.display()),
        Some("name a file relative to the Compose file's folder"),
    );
    None
}

/// `basic_auth:` of a route entry: `users_file:` or `users_secret:` (one of them) and an
/// optional `realm:`. `Some(None)` without one, `None` (the error recorded) when it is wrong.
fn basic_auth(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<Option<RawAuth>> {
    let Some(auth) = n.get("basic_auth").filter(|a| !matches!(a, Node::Null)) else {
        return Some(None);
    };
    let at = format!("{key}.basic_auth");
    let Node::Map(_) = auth else {
        // The value is not shown: it may well be a password.
        ctx.err(
            &at,
            None,
            format!(
                "expected users_file: or users_secret:, found {}; a password is never written in the Compose file",
                auth.kind()
            ),
            Some(USERS_FIX),
        );
        return None;
    };
    nested_keys(ctx, "x-routes[].basic_auth", &at, auth);
    let realm = match auth.get("realm") {
        None | Some(Node::Null) => "restricted".to_owned(),
        Some(r) => {
            let field = format!("{at}.realm");
            let realm = ctx.get(&field, r, text)?;
            if realm.is_empty()
                || realm.len() > 128
                || realm
                    .chars()
                    .any(|c| c.is_control() || c == '"' || c == '\\')
            {
                ctx.err(
                    &field,
                    Some(realm.chars().take(60).collect()),
                    "a realm is one line of at most 128 characters with no quote or backslash",
                    Some("write e.g. realm: Staff"),
                );
                return None;
            }
            realm
        }
    };
    let users = match (auth.get("users_file"), auth.get("users_secret")) {
        (Some(f), None) => {
            let field = format!("{at}.users_file");
            let path = ctx.get(&field, f, text)?;
            let bytes = route_file(ctx, &field, &path)?;
            if let Err(e) = ployz_core::users::parse_users(&bytes) {
                ctx.err(&field, Some(path), format!("{e}"), Some(USERS_FIX));
                return None;
            }
            UsersSource::File(SecretValue::new(bytes))
        }
        (None, Some(s)) => UsersSource::Secret(ctx.get(&format!("{at}.users_secret"), s, text)?),
        (Some(_), Some(_)) => {
            ctx.err(
                &at,
                None,
                "basic_auth takes its users from users_file: or users_secret:, not both",
                Some("keep one of them"),
            );
            return None;
        }
        (None, None) => {
            ctx.err(
                &at,
                None,
                "basic_auth needs a users list: users_file: (htpasswd lines) or users_secret: (a top-level secret holding them)",
                Some(USERS_FIX),
            );
            return None;
        }
    };
    Some(Some(RawAuth { realm, users }))
}

/// How to make a users list a route accepts.
pub(crate) const USERS_FIX: &str = "write one user:hash line per user with a bcrypt or argon2 hash, e.g. htpasswd -nBC 12 alice >> admins.htpasswd";

/// `error_pages:` of a route entry: a map of 502, 503 or 504 to an HTML file.
fn error_pages(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<BTreeMap<u16, String>> {
    let Some(pages) = n.get("error_pages").filter(|p| !matches!(p, Node::Null)) else {
        return Some(BTreeMap::new());
    };
    let at = format!("{key}.error_pages");
    let Node::Map(entries) = pages else {
        ctx.bad(
            &at,
            pages,
            format!(
                "expected a mapping of status to file, found {}; write e.g. error_pages: {{502: ./502.html}}",
                pages.kind()
            ),
        );
        return None;
    };
    let mut out = BTreeMap::new();
    for (status, file) in entries {
        let field = format!("{at}.{status}");
        let Some(code) = status
            .parse::<u16>()
            .ok()
            .filter(|c| ERROR_STATUSES.contains(c))
        else {
            ctx.err(
                &field,
                Some(status.chars().take(20).collect()),
                "the edge's own error pages are for 502, 503 and 504",
                Some("use 502 (the container failed), 503 (no container serves) or 504 (the container took too long)"),
            );
            return None;
        };
        let path = ctx.get(&field, file, text)?;
        let bytes = route_file(ctx, &field, &path)?;
        let Ok(page) = String::from_utf8(bytes) else {
            ctx.err(
                &field,
                Some(path),
                "an error page is UTF-8 text (HTML)",
                Some("save the page as UTF-8"),
            );
            return None;
        };
        out.insert(code, page);
    }
    Some(out)
}

/// `allow:` of a route entry: addresses and networks (`10.0.0.0/8`, `192.0.2.7`, `2001:db8::/32`)
/// as networks, sorted and unique; `None` (the error recorded) for one that is neither.
fn allow_list(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<Vec<String>> {
    let Some(list) = n.get("allow").filter(|l| !matches!(l, Node::Null)) else {
        return Some(Vec::new());
    };
    let field = format!("{key}.allow");
    let entries = ctx.get(&field, list, string_list)?;
    if entries.is_empty() {
        ctx.err(
            &field,
            None,
            "an empty allow list would admit no one",
            Some("name the networks to admit, or leave allow: out to admit every client"),
        );
        return None;
    }
    let mut out = Vec::new();
    for entry in entries {
        let net = entry.parse::<ipnet::IpNet>().ok().or_else(|| {
            entry
                .parse::<std::net::IpAddr>()
                .ok()
                .map(ipnet::IpNet::from)
        });
        match net {
            Some(net) => out.push(net.trunc().to_string()),
            None => {
                ctx.err(
                    &field,
                    Some(entry.chars().take(60).collect()),
                    "is not an IP address or network",
                    Some("write addresses or networks such as 192.0.2.7, 10.0.0.0/8 or 2001:db8::/32"),
                );
                return None;
            }
        }
    }
    out.sort();
    out.dedup();
    Some(out)
}

/// Which message of the exchange header rules change.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    Request,
    Response,
}

impl Side {
    fn key(self) -> &'static str {
        match self {
            Side::Request => "request_headers",
            Side::Response => "response_headers",
        }
    }

    /// Fields no rule may touch: the framing and hop-by-hop ones, which the edge itself
    /// decides, and on requests `Host` and the forwarding fields, which the container must be
    /// able to trust.
    fn reserved(self, name: &str) -> bool {
        const FRAMING: [&str; 8] = [
            "connection",
            "keep-alive",
            "proxy-connection",
            "transfer-encoding",
            "content-length",
            "te",
            "trailer",
            "upgrade",
        ];
        const FORWARDING: [&str; 5] = [
            "host",
            "forwarded",
            "x-forwarded-for",
            "x-forwarded-proto",
            "x-forwarded-host",
        ];
        FRAMING.contains(&name) || (self == Side::Request && FORWARDING.contains(&name))
    }
}

/// A header field name a rule may change, lowercase; `None` (the error recorded) otherwise.
fn header_name(ctx: &mut ServiceCtx<'_>, field: &str, name: &str, side: Side) -> Option<String> {
    let lower = name.to_ascii_lowercase();
    let token = !lower.is_empty()
        && lower
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
    if !token {
        ctx.err(
            field,
            Some(name.chars().take(80).collect()),
            "is not a header field name",
            Some("use letters, digits and - (e.g. Strict-Transport-Security)"),
        );
        return None;
    }
    if side.reserved(&lower) {
        ctx.err(
            field,
            Some(name.to_owned()),
            format!("the edge decides the {lower} field itself; a route cannot change it"),
            Some("leave it out; hop-by-hop, framing and (on requests) Host and the forwarding fields are the edge's"),
        );
        return None;
    }
    Some(lower)
}

/// `request_headers:` or `response_headers:` of a route entry (`remove:` a list of names,
/// `set:` and `add:` maps of name to value); empty without one, `None` (the error recorded)
/// when it is wrong.
fn header_rules(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node, side: Side) -> Option<HeaderRules> {
    let Some(rules) = n.get(side.key()).filter(|r| !matches!(r, Node::Null)) else {
        return Some(HeaderRules::default());
    };
    let at = format!("{key}.{}", side.key());
    let Node::Map(_) = rules else {
        ctx.bad(
            &at,
            rules,
            format!("expected set:, add: and remove:, found {}", rules.kind()),
        );
        return None;
    };
    nested_keys(ctx, &format!("x-routes[].{}", side.key()), &at, rules);
    let mut out = HeaderRules::default();
    let mut ok = true;
    if let Some(list) = rules.get("remove") {
        let field = format!("{at}.remove");
        for name in ctx.get(&field, list, string_list)? {
            match header_name(ctx, &field, &name, side) {
                Some(name) if !out.remove.contains(&name) => out.remove.push(name),
                Some(_) => {}
                None => ok = false,
            }
        }
        out.remove.sort();
    }
    for which in ["set", "add"] {
        let Some(map) = rules.get(which) else {
            continue;
        };
        let field = format!("{at}.{which}");
        for (name, value) in ctx.get(&field, map, kv_entries)? {
            let Some(name) = header_name(ctx, &field, &name, side) else {
                ok = false;
                continue;
            };
            let value = value.unwrap_or_default();
            if value.len() > 4096 || value.chars().any(|c| c.is_control() && c != '\t') {
                ctx.err(
                    &format!("{field}.{name}"),
                    None,
                    "a header value is one line of at most 4096 bytes",
                    Some("remove the line breaks and control characters"),
                );
                ok = false;
                continue;
            }
            let target = if which == "set" {
                &mut out.set
            } else {
                &mut out.add
            };
            target.insert(name, value);
        }
    }
    ok.then_some(out)
}

/// The statuses a redirect may answer with.
const REDIRECT_STATUSES: [u16; 5] = [301, 302, 303, 307, 308];

/// `redirect:` and `status:` of a route entry: `Some(None)` without a redirect, `None` (the
/// error recorded) when either is wrong.
fn redirect(ctx: &mut ServiceCtx<'_>, key: &str, n: &Node) -> Option<Option<Redirect>> {
    let status = match n.get("status") {
        None | Some(Node::Null) => None,
        Some(s) => Some(ctx.get(&format!("{key}.status"), s, super::shapes::u32_of)?),
    };
    let Some(to) = n.get("redirect").filter(|r| !matches!(r, Node::Null)) else {
        if let Some(status) = status {
            ctx.err(
                &format!("{key}.status"),
                Some(status.to_string()),
                "status: is the status of a redirect, and this route has no redirect:",
                Some("add redirect: https://example.com, or remove status:"),
            );
            return None;
        }
        return Some(None);
    };
    let field = format!("{key}.redirect");
    let to = ctx.get(&field, to, text)?;
    let Some(target) = check_redirect_target(&to) else {
        ctx.err(
            &field,
            Some(to.chars().take(80).collect()),
            "a redirect goes to http:// or https://, a host name, an optional port and an optional plain path, with no query or fragment",
            Some("write e.g. redirect: https://example.com (the request's path and query are added)"),
        );
        return None;
    };
    let status = status.unwrap_or(308);
    let Some(status) = u16::try_from(status)
        .ok()
        .filter(|s| REDIRECT_STATUSES.contains(s))
    else {
        ctx.err(
            &format!("{key}.status"),
            Some(status.to_string()),
            "a redirect answers 301, 302, 303, 307 or 308",
            Some("use 308 (permanent, the default) or 307 (temporary), which keep the method"),
        );
        return None;
    };
    Some(Some(Redirect { to: target, status }))
}

/// A redirect target as routes keep it (scheme and host lowercase, no trailing `/`), or `None`
/// when it is not `http(s)://host[:port][/plain/path]`.
fn check_redirect_target(to: &str) -> Option<String> {
    let lower = to.trim();
    let (scheme, rest) = lower.split_once("://")?;
    let scheme = scheme.to_ascii_lowercase();
    if scheme != "http" && scheme != "https" {
        return None;
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (authority, None),
    };
    let host_ok = !host.is_empty()
        && host.len() <= 253
        && host.contains('.')
        && host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-');
    let port_ok = port.is_none_or(|p| p.parse::<u16>().is_ok_and(|n| n > 0));
    let path_ok = path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~!&'+,;=:@/%".contains(&b))
        && !path.contains("//");
    if !(host_ok && port_ok && path_ok) {
        return None;
    }
    let path = path.trim_end_matches('/');
    Some(format!(
        "{scheme}://{}{}{path}",
        host.to_ascii_lowercase(),
        port.map_or(String::new(), |p| format!(":{p}"))
    ))
}

/// Whether a redirect of `hostname`'s `path` to `to` would come back to the same route: the
/// same host (no port named) and a base path the route takes again.
fn redirect_loops(hostname: &str, path: &PathMatch, to: &str) -> bool {
    let Some((_, rest)) = to.split_once("://") else {
        return false;
    };
    let (authority, base) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    if !authority.eq_ignore_ascii_case(hostname) {
        return false;
    }
    match path {
        PathMatch::Prefix(p) if p == "/" => true,
        PathMatch::Prefix(p) => {
            base == p
                || base
                    .strip_prefix(p.as_str())
                    .is_some_and(|r| r.starts_with('/'))
        }
        // An exact path loops only when the request path added to the base is itself: never
        // for a non-empty base, and for an empty one it lands on the same path.
        PathMatch::Exact(_) => base.is_empty(),
    }
}

/// Whether `path` has a `%XX` encoding a letter, a digit, `-`, `.`, `_`, `~` or `/`, or a `%`
/// not followed by two hex digits.
fn encodes_plain_byte(path: &str) -> bool {
    let b = path.as_bytes();
    b.iter()
        .enumerate()
        .filter(|(_, c)| **c == b'%')
        .any(|(i, _)| {
            let hex = |j: usize| b.get(j).and_then(|c| (*c as char).to_digit(16));
            match (hex(i + 1), hex(i + 2)) {
                (Some(h), Some(l)) => {
                    let d = (h * 16 + l) as u8;
                    d.is_ascii_alphanumeric() || b"-._~/".contains(&d)
                }
                _ => true,
            }
        })
}

/// Checks one route path and answers it as routes keep it: without a trailing `/` (but `/`).
fn check_path(ctx: &mut ServiceCtx<'_>, field: &str, path: &str) -> Option<String> {
    let shown = || Some(path.chars().take(80).collect::<String>());
    let problem = if path.contains(['*', '^', '$', '(', ')', '[', ']', '{', '}', '|', '\\', '+']) {
        Some("route paths are plain text, not patterns: a prefix already takes everything under it")
    } else if !path.starts_with('/') {
        Some("a route path starts with /")
    } else if path.len() > MAX_PATH {
        Some("a route path is at most 1024 bytes")
    } else if path.contains(['?', '#']) {
        Some("a route path has no query or fragment: the query is never matched")
    } else if path.contains("//") {
        Some("a route path has no empty segment (//)")
    } else if path.split('/').any(|s| s == "." || s == "..") {
        Some("a route path has no . or .. segment")
    } else if path.contains(';') {
        Some("a route path has no ; (the edge refuses path parameters on a host routed by path, since servers drop them)")
    } else if !path
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._~!&'+,=:@/%".contains(&b))
    {
        Some("a route path holds letters, digits and - . _ ~ ! & ' , = : @ / %, with other bytes percent-encoded")
    } else if encodes_plain_byte(path) {
        Some("a route path writes letters, digits, - . _ ~ and / themselves, not percent-encoded (requests with them encoded are refused)")
    } else {
        None
    };
    if let Some(problem) = problem {
        ctx.err(
            field,
            shown(),
            problem,
            Some(
                "write a path such as /api (a prefix: /api, /api/ and /api/v1) or exact: /healthz",
            ),
        );
        return None;
    }
    let trimmed = path.trim_end_matches('/');
    Some(if trimmed.is_empty() {
        "/".to_owned()
    } else {
        trimmed.to_owned()
    })
}

/// Settles the routes against the Service's ports: each names (or implies) an Ingress Hostname
/// of `x-ports`, and no two take the same path of one hostname. Sorted; beside them, the
/// routes whose users list is a top-level secret, for the project to read.
pub(super) fn settle(
    ctx: &mut ServiceCtx<'_>,
    raw: Vec<RawRoute>,
    ports: &[PortSpec],
) -> (Vec<RouteSpec>, Vec<PendingUsers>) {
    let hostnames: BTreeSet<&str> = ports
        .iter()
        .filter_map(|p| match p {
            PortSpec::Ingress {
                hostname: Some(h), ..
            } => Some(h.as_str()),
            _ => None,
        })
        .collect();
    let mut out: Vec<RouteSpec> = Vec::new();
    let mut pending = Vec::new();
    for r in raw {
        let hostname = match r.hostname {
            Some(h) if hostnames.contains(h.as_str()) => h,
            Some(h) => {
                let published = if hostnames.is_empty() {
                    "none yet".to_owned()
                } else {
                    hostnames.iter().copied().collect::<Vec<_>>().join(", ")
                };
                let fix = format!(
                    "publish it in x-ports (e.g. x-ports: [{h}:8080/https]) or name one it publishes: {published}"
                );
                ctx.err(
                    &format!("{}.hostname", r.key),
                    Some(h),
                    "routes a hostname the Service does not publish in x-ports",
                    Some(&fix),
                );
                continue;
            }
            None if hostnames.len() == 1 => hostnames.iter().next().expect("one").to_string(),
            None => {
                ctx.err(
                    &r.key,
                    None,
                    if hostnames.is_empty() {
                        "a route needs an Ingress Hostname, and the Service publishes none in x-ports".to_owned()
                    } else {
                        format!(
                            "the Service publishes {} hostnames, so the route names one with hostname:",
                            hostnames.len()
                        )
                    },
                    Some("publish one in x-ports (e.g. x-ports: [app.example.com:8080/https]), and name it with hostname: when there are several"),
                );
                continue;
            }
        };
        if let Some(redirect) = &r.redirect {
            if redirect_loops(&hostname, &r.path, &redirect.to) {
                ctx.err(
                    &format!("{}.redirect", r.key),
                    Some(redirect.to.clone()),
                    format!(
                        "redirects {hostname}{} back to itself: the edge would answer the redirected request with the same redirect",
                        r.path
                    ),
                    Some("redirect to another hostname (www.example.com to example.com), or to a path this route does not take"),
                );
                continue;
            }
        }
        let basic_auth = match r.auth {
            None => None,
            Some(RawAuth {
                realm,
                users: UsersSource::File(users),
            }) => Some(BasicAuth::new(realm, users)),
            Some(RawAuth {
                realm,
                users: UsersSource::Secret(secret),
            }) => {
                pending.push(PendingUsers {
                    key: format!("{}.basic_auth.users_secret", r.key),
                    hostname: hostname.clone(),
                    path: r.path.clone(),
                    secret,
                    realm,
                });
                None
            }
        };
        let route = RouteSpec {
            hostname,
            path: r.path,
            strip_prefix: r.strip_prefix,
            redirect: r.redirect,
            request_headers: r.request_headers,
            response_headers: r.response_headers,
            allow: r.allow,
            basic_auth,
            timeout_ms: r.timeout_ms,
            max_body_bytes: r.max_body_bytes,
            error_pages: r.error_pages,
        };
        if let Some(same) = out
            .iter()
            .find(|o| o.hostname == route.hostname && o.path == route.path)
        {
            ctx.err(
                &r.key,
                Some(format!("{}{}", same.hostname, route.path)),
                "two routes of the Service take the same path of one hostname",
                Some("keep one of them"),
            );
            continue;
        }
        out.push(route);
    }
    out.sort();
    (out, pending)
}
