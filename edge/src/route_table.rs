//! The route table: Ingress Hostname and path -> Serving Containers, immutable once built.
//!
//! Matching is pure: no Pingora types, no allocation, no await. Hosts are compared
//! ASCII-case-insensitively after dropping a `:port` suffix and a trailing dot. Within a
//! hostname, an exact path (`x-routes` `exact:`) wins, then the longest prefix on a segment
//! boundary (`path:`), then the whole hostname; each is one hash lookup, so matching costs
//! the same among ten routes or ten thousand.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use ployz_core::{
    ContainerId, ContainerKind, ContainerRuntimeObservation, GateState, HeaderRules, HostProtocol,
    IngressProtocol, MachineId, PathMatch, RouteSpec, ServiceId,
};

/// The longest DNS name; longer Host headers never match.
const MAX_HOST: usize = 253;

/// One Serving Container behind a route.
#[derive(Debug, Clone)]
pub struct Upstream {
    pub addr: SocketAddr,
    pub container_id: ContainerId,
    /// Whether it runs on this Machine (local upstreams are listed first).
    pub local: bool,
    /// The Machine it runs on; `None` for a fixed route's upstream.
    pub machine: Option<MachineId>,
    /// Whether it runs on a Machine this Machine observes down: tried only when no other
    /// upstream is left (never dropped: membership is an observation, and may be wrong).
    pub on_down_machine: bool,
    /// Requests this edge has in flight to the container; shared across table generations so a
    /// drain can wait for them.
    pub in_flight: Arc<InFlight>,
}

impl PartialEq for Upstream {
    fn eq(&self, other: &Upstream) -> bool {
        self.addr == other.addr && self.container_id == other.container_id
    }
}

/// The requests this edge has in flight to one container, shared by every table generation.
///
/// The request path takes a count with [`InFlight::acquire`] and gives it back with
/// [`InFlight::release`]: one atomic operation each, no lock. A drain waiting for the count to
/// reach zero ([`InFlight::wait_for_zero`]) is woken by the release that brings it there: only
/// that release, and only while a drain waits, does more than the one atomic operation (a
/// notify).
#[derive(Debug, Default)]
pub struct InFlight {
    /// The requests in flight (low 32 bits) and the drains waiting for none (high 32 bits), in
    /// one word so that a release reads both with the one operation that counts it down.
    state: AtomicU64,
    /// Signalled when the count reaches zero while a drain waits.
    zero: tokio::sync::Notify,
}

/// The requests-in-flight part of [`InFlight::state`].
const IN_FLIGHT_MASK: u64 = u32::MAX as u64;
/// One waiting drain in [`InFlight::state`].
const ONE_WAITER: u64 = 1 << 32;

impl InFlight {
    /// A counter at zero.
    pub fn new() -> InFlight {
        InFlight::default()
    }

    /// Requests in flight now.
    pub fn get(&self) -> usize {
        (self.state.load(Ordering::SeqCst) & IN_FLIGHT_MASK) as usize
    }

    /// One more request in flight (the request path).
    pub fn acquire(&self) {
        self.state.fetch_add(1, Ordering::SeqCst);
    }

    /// One request less in flight (the request path); wakes the drains waiting for zero when
    /// it was the last. Called once per [`InFlight::acquire`], never more.
    pub fn release(&self) {
        let before = self.state.fetch_sub(1, Ordering::SeqCst);
        if before & IN_FLIGHT_MASK == 1 && before >= ONE_WAITER {
            self.zero.notify_waiters();
        }
    }

    /// Waits until no request is in flight, or until `deadline`. Returns the requests still in
    /// flight (0 unless the deadline came first). Woken by the release that reaches zero; it
    /// never polls.
    pub async fn wait_for_zero(&self, deadline: tokio::time::Instant) -> usize {
        /// Counts this drain among the waiting ones while it lives.
        struct Waiting<'a>(&'a AtomicU64);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(ONE_WAITER, Ordering::SeqCst);
            }
        }
        self.state.fetch_add(ONE_WAITER, Ordering::SeqCst);
        let _waiting = Waiting(&self.state);
        loop {
            // Created before the count is read: a release reaching zero after the read wakes
            // it (a `Notified` sees every `notify_waiters` after its creation).
            let zero = self.zero.notified();
            if self.get() == 0 {
                return 0;
            }
            if tokio::time::timeout_at(deadline, zero).await.is_err() {
                return self.get();
            }
        }
    }

    /// How many drains wait for zero.
    #[cfg(test)]
    fn waiters(&self) -> u64 {
        self.state.load(Ordering::SeqCst) >> 32
    }
}

/// Hands out the in-flight counter of each container, the same one for every table generation.
pub trait InFlightCounters {
    /// The counter of `container`.
    fn counter(&self, container: &ContainerId) -> Arc<InFlight>;
}

/// Counters that are not shared (tests, benches).
pub struct FreshCounters;

impl InFlightCounters for FreshCounters {
    fn counter(&self, _: &ContainerId) -> Arc<InFlight> {
        Arc::new(InFlight::new())
    }
}

/// One path of an Ingress Hostname (the whole hostname, a prefix or an exact path) and where
/// it goes.
#[derive(Debug)]
pub struct Route {
    pub hostname: Box<str>,
    /// Which paths of the hostname it takes.
    pub path: PathMatch,
    /// The Service (by name) whose containers serve it; several, comma-separated, only if
    /// records from elsewhere claim one path twice (a Deploy refuses that).
    pub service: Box<str>,
    /// How many bytes of the path are cut before it goes upstream: a `strip_prefix` route's
    /// prefix; 0 for none.
    pub strip: usize,
    /// Serving Containers, this Machine's first.
    pub upstreams: Box<[Upstream]>,
    /// Some Service publishes the hostname with `https`.
    pub https: bool,
    /// The Service's gate: its requests answered with a maintenance page, or held.
    pub gate: Option<RouteGate>,
    /// The edge answers with this redirect (status, `Location` before the request's path and
    /// query) instead of sending requests on.
    pub redirect: Option<(u16, Arc<str>)>,
    /// Header fields the edge changes: in the request, in the response.
    pub headers: Option<Arc<(HeaderRules, HeaderRules)>>,
    /// The client networks admitted; others get 403. `None`: every client.
    pub allow: Option<Arc<[ipnet::IpNet]>>,
    /// Basic authentication, timeout, body limit and error pages, when the route has any.
    pub policy: Option<Arc<RoutePolicy>>,
    /// For an Ingress Port, its port and protocol: the route of every connection (TCP) or
    /// flow (UDP) to it, with an empty hostname.
    pub ingress_port: Option<(u16, HostProtocol)>,
    next: AtomicUsize,
    /// Per upstream, until when (ms on the caller's clock) it is marked failed.
    down_until: Box<[AtomicU64]>,
}

/// The rules of a route beyond where it goes: what only the edge's full proxy applies.
#[derive(Debug, Default)]
pub struct RoutePolicy {
    pub auth: Option<crate::auth::RouteAuth>,
    /// How long the container may take to answer, and between reads of its answer.
    pub timeout: Option<std::time::Duration>,
    /// The largest request body, in bytes; larger ones get 413.
    pub max_body: Option<u64>,
    /// Pages for the edge's own 502, 503 and 504.
    pub error_pages: std::collections::BTreeMap<u16, Arc<str>>,
}

impl RoutePolicy {
    /// As a fingerprint shows it: a users list arriving changes it, so the table is published
    /// again.
    fn describe(&self) -> String {
        let auth = self.auth.as_ref().map_or(String::new(), |a| {
            format!(
                " auth {} {} {}",
                a.realm,
                a.digest,
                if a.users.is_some() {
                    "known"
                } else {
                    "unknown"
                }
            )
        });
        let pages: Vec<(u16, usize)> = self
            .error_pages
            .iter()
            .map(|(s, p)| (*s, p.len()))
            .collect();
        format!(
            "{auth} timeout {:?} max_body {:?} pages {pages:?}",
            self.timeout, self.max_body
        )
    }

    /// The policy of a route entry, its users list looked up in `users`; `None` for a route
    /// with none of these rules.
    fn of(route: &RouteSpec, users: &HashMap<String, Arc<crate::auth::Users>>) -> Option<Self> {
        let policy = RoutePolicy {
            auth: route.basic_auth.as_ref().map(|a| crate::auth::RouteAuth {
                realm: a.realm.as_str().into(),
                digest: a.digest.as_str().into(),
                users: users.get(&a.digest).cloned(),
            }),
            timeout: route.timeout_ms.map(std::time::Duration::from_millis),
            max_body: route.max_body_bytes,
            error_pages: route
                .error_pages
                .iter()
                .map(|(status, page)| (*status, page.as_str().into()))
                .collect(),
        };
        let some = policy.auth.is_some()
            || policy.timeout.is_some()
            || policy.max_body.is_some()
            || !policy.error_pages.is_empty();
        some.then_some(policy)
    }
}

/// What stands beside the observations when a table is built: its generation, the Service
/// Gates, and the users lists routes' basic authentication names (by digest).
#[derive(Debug, Clone, Copy)]
pub struct Standing<'a> {
    pub generation: u64,
    pub gates: &'a HashMap<ServiceId, GateState>,
    pub users: &'a HashMap<String, Arc<crate::auth::Users>>,
}

/// What a Service Gate makes of a route's requests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RouteGate {
    /// Answered 503 with this page.
    Maintenance { page: Arc<str> },
    /// Held until the gate is lifted or this time passes (ms since the Unix epoch).
    Paused { until_ms: u64 },
}

impl RouteGate {
    fn of(state: &GateState) -> RouteGate {
        match state {
            GateState::Maintenance { message } => RouteGate::Maintenance {
                page: ployz_core::gate::maintenance_page(message).into(),
            },
            GateState::Paused { until_ms } => RouteGate::Paused {
                until_ms: *until_ms,
            },
        }
    }

    /// As a fingerprint and `ployz routes` show it.
    pub fn describe(&self) -> String {
        match self {
            RouteGate::Maintenance { .. } => "maintenance".to_owned(),
            RouteGate::Paused { until_ms } => format!("paused until {until_ms}"),
        }
    }
}

impl Route {
    /// A route of `hostname` with nothing behind it yet.
    fn new(
        hostname: &str,
        path: PathMatch,
        service: String,
        strip: usize,
        upstreams: Box<[Upstream]>,
        https: bool,
    ) -> Route {
        Route {
            hostname: hostname.into(),
            path,
            service: service.into_boxed_str(),
            strip,
            down_until: upstreams.iter().map(|_| AtomicU64::new(0)).collect(),
            upstreams,
            https,
            gate: None,
            redirect: None,
            headers: None,
            allow: None,
            policy: None,
            ingress_port: None,
            next: AtomicUsize::new(0),
        }
    }

    /// Whether the route has rules only the edge's full proxy applies (a gate, a redirect,
    /// header rules, an allow list, authentication, a timeout, a body limit or error pages):
    /// the fast paths decline it.
    pub fn needs_proxy(&self) -> bool {
        self.gate.is_some()
            || self.redirect.is_some()
            || self.headers.is_some()
            || self.allow.is_some()
            || self.policy.is_some()
    }

    /// The route's rules in words, as `ployz routes` shows them.
    pub fn rules(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(nets) = &self.allow {
            out.push(match nets.len() {
                1 => format!("allow {}", nets[0]),
                n => format!("allow {n} networks"),
            });
        }
        if self.headers.is_some() {
            out.push("header rules".to_owned());
        }
        let Some(policy) = &self.policy else {
            return out;
        };
        if let Some(auth) = &policy.auth {
            out.push(match auth.users {
                Some(_) => format!("basic auth '{}'", auth.realm),
                None => format!(
                    "basic auth '{}' (its users list has not reached this Machine: 503)",
                    auth.realm
                ),
            });
        }
        if let Some(t) = policy.timeout {
            out.push(format!("timeout {}s", t.as_secs()));
        }
        if let Some(n) = policy.max_body {
            out.push(format!("body at most {n} bytes"));
        }
        if !policy.error_pages.is_empty() {
            let statuses: Vec<String> = policy.error_pages.keys().map(u16::to_string).collect();
            out.push(format!("own pages for {}", statuses.join(", ")));
        }
        out
    }

    /// Whether a client at `ip` may use the route (an IPv4 address mapped into IPv6 counts as
    /// the IPv4 one).
    pub fn admits(&self, ip: IpAddr) -> bool {
        let ip = match ip {
            IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
            v4 => v4,
        };
        self.allow
            .as_ref()
            .is_none_or(|nets| nets.iter().any(|n| n.contains(&ip)))
    }

    /// The index of the next upstream in round-robin order that is not in `exclude` and not
    /// marked failed at `now_ms`, preferring upstreams on Machines not observed down. When every
    /// remaining upstream is marked, the marks are ignored (trying beats refusing). `None` when
    /// nothing is left.
    pub fn pick(&self, now_ms: u64, exclude: &[usize]) -> Option<usize> {
        let n = self.upstreams.len();
        if n == 0 {
            return None;
        }
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        let candidates = (0..n)
            .map(|i| (start + i) % n)
            .filter(|i| !exclude.contains(i));
        let mut on_down = None;
        let mut fallback = None;
        for i in candidates {
            if self.down_until[i].load(Ordering::Relaxed) > now_ms {
                fallback.get_or_insert(i);
            } else if self.upstreams[i].on_down_machine {
                on_down.get_or_insert(i);
            } else {
                return Some(i);
            }
        }
        on_down.or(fallback)
    }

    /// Whether upstream `i` is marked failed at `now_ms`.
    pub fn marked_failed(&self, i: usize, now_ms: u64) -> bool {
        self.down_until
            .get(i)
            .is_some_and(|d| d.load(Ordering::Relaxed) > now_ms)
    }

    /// Marks upstream `i` as failed until `until_ms`.
    pub fn mark_failed(&self, i: usize, until_ms: u64) {
        if let Some(slot) = self.down_until.get(i) {
            slot.store(until_ms, Ordering::Relaxed);
        }
    }
}

/// Writes the request target `target` (path and query) as the upstream gets it through a
/// route stripping `strip` bytes of prefix: without them, and `/` for a path that was the
/// prefix alone (`/api?x=1` as `/?x=1`).
pub fn write_target(out: &mut Vec<u8>, target: &[u8], strip: usize) {
    match target.get(strip..) {
        Some(rest) if strip > 0 => {
            if rest.first() != Some(&b'/') {
                out.push(b'/');
            }
            out.extend_from_slice(rest);
        }
        _ => out.extend_from_slice(target),
    }
}

/// Maps keyed by names and paths of the Cluster's own Services, never a client's: they hash
/// with foldhash rather than SipHash, as a lookup is on every request's path.
type FastMap<V> = HashMap<Box<[u8]>, V, foldhash::fast::RandomState>;

/// The routes of one Ingress Hostname.
#[derive(Debug, Default)]
pub struct HostRoutes {
    /// The whole hostname (a Service without `x-routes` for it).
    root: Option<Arc<Route>>,
    /// Path prefixes, written without a trailing `/`.
    prefixes: FastMap<Arc<Route>>,
    /// Exact paths.
    exact: FastMap<Arc<Route>>,
}

impl HostRoutes {
    /// Adds `route`, which takes `path`, replacing any route of that path.
    fn insert(&mut self, path: PathMatch, route: Arc<Route>) {
        match path {
            PathMatch::Prefix(p) if p == "/" => self.root = Some(route),
            PathMatch::Prefix(p) => {
                self.prefixes
                    .insert(p.into_bytes().into_boxed_slice(), route);
            }
            PathMatch::Exact(p) => {
                self.exact.insert(p.into_bytes().into_boxed_slice(), route);
            }
        }
    }

    /// The route a request target (path and query) takes: its exact path, else its longest
    /// prefix on a segment boundary, else the whole hostname. No allocation.
    ///
    /// On a hostname routed by path, a path that is not in its plain form (an encoded letter,
    /// digit or `/`, a `.` or `..` segment, `//`, a backslash or `;`) takes no route: the
    /// container behind it could read it as a path another route takes (`/%61dmin`,
    /// `/x/../admin` and `/admin;x` are `/admin` to many servers), past that route's rules.
    pub fn route_for(&self, target: &[u8]) -> Option<&Arc<Route>> {
        if self.prefixes.is_empty() && self.exact.is_empty() {
            return self.root.as_ref();
        }
        let path = match target.iter().position(|b| *b == b'?') {
            Some(i) => &target[..i],
            None => target,
        };
        if !plain_path(path) {
            return None;
        }
        if let Some(r) = self.exact.get(path) {
            return Some(r);
        }
        if !self.prefixes.is_empty() {
            // The path itself, then the path up to each `/`, longest first: `/a/b/` tries
            // `/a/b/`, `/a/b`, `/a`.
            let mut end = path.len();
            while end > 1 {
                if let Some(r) = self.prefixes.get(&path[..end]) {
                    return Some(r);
                }
                end = match path[..end].iter().rposition(|b| *b == b'/') {
                    Some(i) => i,
                    None => break,
                };
            }
        }
        self.root.as_ref()
    }

    /// Every route of the hostname: the whole hostname first, then prefixes, then exact paths.
    pub fn routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.root
            .iter()
            .chain(self.prefixes.values())
            .chain(self.exact.values())
    }
}

/// An immutable snapshot of every route, with the generation that built it.
#[derive(Debug, Default)]
pub struct RouteTable {
    generation: u64,
    /// Keyed by lowercase hostname.
    hosts: FastMap<HostRoutes>,
    /// The Ingress Ports, by port and protocol.
    streams: HashMap<(u16, HostProtocol), Arc<Route>>,
}

/// One route's content in a [`Fingerprint`]: hostname, path, Service, bytes stripped, https,
/// gate, and per upstream its address, container, whether it is local and whether on a
/// Machine observed down.
pub type RouteFingerprint = (
    String,
    String,
    String,
    usize,
    bool,
    String,
    Vec<(SocketAddr, ContainerId, bool, bool)>,
);

/// What decides a route table's content; equal fingerprints mean an identical table.
pub type Fingerprint = Vec<RouteFingerprint>;

/// Whether a `Host` value is a host name, an IPv4 address or a bracketed IPv6 address, with an
/// optional numeric port: nothing else is routed or passed on (a Host such as
/// `app.test:1@elsewhere` would otherwise match `app.test` and reach the application).
pub fn valid_host(host: &[u8]) -> bool {
    let (name, port) = match host.strip_prefix(b"[") {
        Some(rest) => match rest.iter().position(|b| *b == b']') {
            Some(end) => {
                let literal = &rest[..end];
                if literal.is_empty()
                    || !literal
                        .iter()
                        .all(|b| b.is_ascii_hexdigit() || matches!(b, b':' | b'.'))
                {
                    return false;
                }
                match &rest[end + 1..] {
                    [] => return true,
                    [b':', port @ ..] => (&b"ipv6"[..], Some(port)),
                    _ => return false,
                }
            }
            None => return false,
        },
        None => match host.iter().position(|b| *b == b':') {
            Some(i) => (&host[..i], Some(&host[i + 1..])),
            None => (host, None),
        },
    };
    let port_ok =
        port.is_none_or(|p| !p.is_empty() && p.len() <= 5 && p.iter().all(u8::is_ascii_digit));
    port_ok
        && !name.is_empty()
        && name.len() <= MAX_HOST + 1
        && name
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

/// Lowercases the name of a Host value into `buf`, without its `:port` and trailing dot; `None`
/// when the port is not one to five digits (`app.test:1@elsewhere` names no route) or the name
/// cannot be an Ingress Hostname (a bracketed IP literal, empty, too long). A name with bytes
/// a host name cannot hold equals no route's, so matching needs no [`valid_host`] pass.
fn normalize<'b>(host: &[u8], buf: &'b mut [u8; MAX_HOST]) -> Option<&'b [u8]> {
    let name = match host.iter().position(|b| *b == b':') {
        Some(i) => {
            let port = &host[i + 1..];
            if port.is_empty() || port.len() > 5 || !port.iter().all(u8::is_ascii_digit) {
                return None;
            }
            &host[..i]
        }
        None => host,
    };
    let name = name.strip_suffix(b".").unwrap_or(name);
    if name.is_empty() || name.len() > MAX_HOST {
        return None;
    }
    let out = &mut buf[..name.len()];
    for (o, b) in out.iter_mut().zip(name) {
        *o = b.to_ascii_lowercase();
    }
    Some(out)
}

impl RouteTable {
    /// Builds the table from Container Runtime Observations: every Serving Container of every
    /// Service that publishes an ingress port with a hostname. `local` orders that Machine's
    /// containers first and those on `down` Machines (observed down) last; otherwise upstreams
    /// sort by address so equal inputs build equal tables.
    pub fn build(
        observations: &[ContainerRuntimeObservation],
        draining: &HashSet<ContainerId>,
        (local, down): (&MachineId, &HashSet<MachineId>),
        counters: &dyn InFlightCounters,
        generation: u64,
    ) -> RouteTable {
        RouteTable::build_gated(
            observations,
            draining,
            (local, down),
            counters,
            Standing {
                generation,
                gates: &HashMap::new(),
                users: &HashMap::new(),
            },
        )
    }

    /// [`RouteTable::build`], with what stands beside the observations: a route of a gated
    /// Service carries its gate, and one with basic authentication the users list of its
    /// digest.
    pub fn build_gated(
        observations: &[ContainerRuntimeObservation],
        draining: &HashSet<ContainerId>,
        (local, down): (&MachineId, &HashSet<MachineId>),
        counters: &dyn InFlightCounters,
        standing: Standing<'_>,
    ) -> RouteTable {
        /// One route being gathered: its Services, bytes stripped, upstreams, gate, redirect,
        /// header rules, allow list and policy.
        type Gathered = (
            std::collections::BTreeSet<String>,
            usize,
            Vec<Upstream>,
            Option<RouteGate>,
            Option<(u16, Arc<str>)>,
            Option<Arc<(HeaderRules, HeaderRules)>>,
            Option<Arc<[ipnet::IpNet]>>,
            Option<Arc<RoutePolicy>>,
        );
        let Standing {
            generation,
            gates,
            users,
        } = standing;
        let mut by_host: HashMap<String, (bool, HashMap<PathMatch, Gathered>)> = HashMap::new();
        #[allow(clippy::type_complexity)]
        let mut by_port: HashMap<
            (u16, HostProtocol),
            (std::collections::BTreeSet<String>, Vec<Upstream>),
        > = HashMap::new();
        for o in observations {
            let gate = gates.get(&o.service_id);
            let serving = o.is_serving() && !draining.contains(&o.id);
            // A gated Service keeps its routes with no Serving Container left (its containers
            // stopped for maintenance): the gate still answers; so do redirects, which need no
            // container.
            let Some(spec) = o.spec.as_ref().filter(|_| o.kind == ContainerKind::Service) else {
                continue;
            };
            let redirects = spec.routes.iter().any(|r| r.redirect.is_some());
            // A route with its own 503 page stays with no Serving Container, to answer it.
            let kept = |r: Option<&RouteSpec>| {
                r.is_some_and(|r| r.redirect.is_some() || r.error_pages.contains_key(&503))
            };
            let pages = spec.routes.iter().any(|r| r.error_pages.contains_key(&503));
            if !(serving || gate.is_some() || redirects || pages) {
                continue;
            }
            let ip = o.address.filter(|_| serving);
            for served in spec.served_paths() {
                if !serving && gate.is_none() && !kept(served.route) {
                    continue;
                }
                let host = served.hostname;
                // Compose checks hostnames and paths; a record from elsewhere that is not one
                // (a port, a quote, a path that is not plain) is not routed, so no Host can
                // match it or carry it into `Forwarded`.
                if !valid_host(host.as_bytes())
                    || host.contains(':')
                    || !valid_route_path(&served.path)
                {
                    continue;
                }
                let entry = by_host
                    .entry(host.trim_end_matches('.').to_ascii_lowercase())
                    .or_default();
                entry.0 |= served.protocol == IngressProtocol::Https;
                let strip = match &served.path {
                    PathMatch::Prefix(p) if served.strip_prefix && p != "/" => p.len(),
                    _ => 0,
                };
                let route = entry.1.entry(served.path.clone()).or_default();
                route.0.insert(spec.name.to_string());
                if route.3.is_none() {
                    route.3 = gate.map(RouteGate::of);
                }
                route.1 = route.1.max(strip);
                if let Some((request, response)) = served.headers {
                    route
                        .5
                        .get_or_insert_with(|| Arc::new((request.clone(), response.clone())));
                }
                if !served.allow.is_empty() && route.6.is_none() {
                    // Compose checks the networks; one from elsewhere that does not parse
                    // admits no one rather than everyone.
                    let nets: Vec<ipnet::IpNet> =
                        served.allow.iter().filter_map(|n| n.parse().ok()).collect();
                    route.6 = Some(nets.into());
                }
                if route.7.is_none() {
                    route.7 = served
                        .route
                        .and_then(|r| RoutePolicy::of(r, users))
                        .map(Arc::new);
                }
                if let Some(r) = served.redirect {
                    route
                        .4
                        .get_or_insert_with(|| (r.status, r.to.as_str().into()));
                    continue;
                }
                let Some(ip) = ip.filter(|_| serving) else {
                    continue;
                };
                let up = Upstream {
                    addr: SocketAddr::new(IpAddr::V4(ip), served.container_port),
                    container_id: o.id.clone(),
                    local: &o.machine_id == local,
                    machine: Some(o.machine_id.clone()),
                    on_down_machine: down.contains(&o.machine_id),
                    in_flight: counters.counter(&o.id),
                };
                if !route.2.contains(&up) {
                    route.2.push(up);
                }
            }
            // Ingress Ports: every Serving Container, by port and protocol.
            let Some(ip) = o.address.filter(|_| serving) else {
                continue;
            };
            for (published, container_port, protocol) in spec.ingress_ports() {
                let entry = by_port.entry((published, protocol)).or_default();
                entry.0.insert(spec.name.to_string());
                let up = Upstream {
                    addr: SocketAddr::new(IpAddr::V4(ip), container_port),
                    container_id: o.id.clone(),
                    local: &o.machine_id == local,
                    machine: Some(o.machine_id.clone()),
                    on_down_machine: down.contains(&o.machine_id),
                    in_flight: counters.counter(&o.id),
                };
                if !entry.1.contains(&up) {
                    entry.1.push(up);
                }
            }
        }
        let streams = by_port
            .into_iter()
            .map(|((port, protocol), (services, mut ups))| {
                ups.sort_by_key(|u| (u.on_down_machine, !u.local, u.addr));
                let service = services.into_iter().collect::<Vec<_>>().join(", ");
                let mut route = Route::new(
                    "",
                    PathMatch::root(),
                    service,
                    0,
                    ups.into_boxed_slice(),
                    false,
                );
                route.ingress_port = Some((port, protocol));
                ((port, protocol), Arc::new(route))
            })
            .collect();
        let hosts = by_host
            .into_iter()
            .map(|(host, (https, routes))| {
                let mut entry = HostRoutes::default();
                for (path, (services, strip, mut ups, gate, redirect, headers, allow, policy)) in
                    routes
                {
                    ups.sort_by_key(|u| (u.on_down_machine, !u.local, u.addr));
                    let service = services.into_iter().collect::<Vec<_>>().join(", ");
                    let mut route = Route::new(
                        &host,
                        path.clone(),
                        service,
                        strip,
                        ups.into_boxed_slice(),
                        https,
                    );
                    route.gate = gate;
                    route.redirect = redirect;
                    route.headers = headers;
                    route.allow = allow;
                    route.policy = policy;
                    entry.insert(path, Arc::new(route));
                }
                (host.into_bytes().into_boxed_slice(), entry)
            })
            .collect();
        RouteTable {
            generation,
            hosts,
            streams,
        }
    }

    /// A table of fixed routes, `HOST[PATH]` -> upstream addresses (the edge alone, for
    /// benchmarks and debugging; a Machine's edge builds from observations instead). A path
    /// ending in `/*` is a prefix (`shop.test/api/*`), another an exact path; none is the
    /// whole hostname. Entries [`parse_static_route`] refuses are left out.
    pub fn from_static(routes: &[(String, Vec<SocketAddr>)]) -> RouteTable {
        let mut hosts: FastMap<HostRoutes> = FastMap::default();
        for (spec, addrs) in routes {
            let Some((host, path)) = parse_static_route(spec) else {
                continue;
            };
            let upstreams: Box<[Upstream]> = addrs
                .iter()
                .enumerate()
                .map(|(i, addr)| Upstream {
                    addr: *addr,
                    container_id: format!("{i:064x}").parse().expect("hex"),
                    local: true,
                    machine: None,
                    on_down_machine: false,
                    in_flight: Arc::new(InFlight::new()),
                })
                .collect();
            let route = Arc::new(Route::new(
                &host,
                path.clone(),
                String::new(),
                0,
                upstreams,
                false,
            ));
            hosts
                .entry(host.into_bytes().into_boxed_slice())
                .or_default()
                .insert(path, route);
        }
        RouteTable {
            generation: 1,
            hosts,
            streams: HashMap::new(),
        }
    }

    /// The generation that built this table (0 for the empty table at start).
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// How many hostnames route somewhere.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Whether no hostname routes anywhere.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// The routes of a `Host` header value, matched case-insensitively; none for a value that
    /// is not a [`valid_host`]. No allocation.
    pub fn match_hostname(&self, host: &[u8]) -> Option<&HostRoutes> {
        // What clients send most: the name as the route has it, so no copy to make.
        let normal = !host.is_empty()
            && host.len() <= MAX_HOST
            && host.last() != Some(&b'.')
            && !host.iter().any(|b| *b == b':' || b.is_ascii_uppercase());
        if normal {
            return self.hosts.get(host);
        }
        let mut buf = [0u8; MAX_HOST];
        let key = normalize(host, &mut buf)?;
        self.hosts.get(key)
    }

    /// The route a request takes by its `Host` value and target (path and query). No
    /// allocation.
    pub fn match_request(&self, host: &[u8], target: &[u8]) -> Option<&Arc<Route>> {
        self.match_hostname(host)?.route_for(target)
    }

    /// The route of `/` for a `Host` value: where a hostname served whole sends everything.
    pub fn match_host(&self, host: &[u8]) -> Option<&Arc<Route>> {
        self.match_request(host, b"/")
    }

    /// Every route, in no order.
    pub fn routes(&self) -> impl Iterator<Item = &Arc<Route>> {
        self.hosts
            .values()
            .flat_map(HostRoutes::routes)
            .chain(self.streams.values())
    }

    /// The route of Ingress Port `port`/`protocol`.
    pub fn stream(&self, port: u16, protocol: HostProtocol) -> Option<&Arc<Route>> {
        self.streams.get(&(port, protocol))
    }

    /// The Ingress Ports the table routes.
    pub fn ingress_ports(&self) -> impl Iterator<Item = (u16, HostProtocol)> + '_ {
        self.streams.keys().copied()
    }

    /// Whether any route sends requests to `container`.
    pub fn routes_to(&self, container: &ContainerId) -> bool {
        self.routes()
            .any(|r| r.upstreams.iter().any(|u| &u.container_id == container))
    }

    /// Whether the route of `hostname` (lowercase) taking `path` has at least one upstream.
    pub fn has_upstream(&self, hostname: &str, path: &PathMatch) -> bool {
        self.hosts
            .get(hostname.as_bytes())
            .and_then(|h| h.routes().find(|r| &r.path == path))
            .is_some_and(|r| !r.upstreams.is_empty())
    }

    /// The table's content, sorted, for "did anything change?".
    pub fn fingerprint(&self) -> Fingerprint {
        let mut fp: Fingerprint = self
            .routes()
            .map(|r| {
                (
                    match r.ingress_port {
                        Some((port, protocol)) => format!(":{port}/{protocol}"),
                        None => r.hostname.to_string(),
                    },
                    r.path.to_string(),
                    r.service.to_string(),
                    r.strip,
                    r.https,
                    format!(
                        "{}{}",
                        r.gate.as_ref().map(RouteGate::describe).unwrap_or_default(),
                        r.redirect
                            .as_ref()
                            .map_or(String::new(), |(s, to)| format!(" redirect {s} {to}"))
                    ) + &r
                        .headers
                        .as_ref()
                        .map_or(String::new(), |h| format!(" headers {:?}", h.as_ref()))
                        + &r.allow
                            .as_ref()
                            .map_or(String::new(), |a| format!(" allow {a:?}"))
                        + &r.policy.as_ref().map_or(String::new(), |p| p.describe()),
                    r.upstreams
                        .iter()
                        .map(|u| (u.addr, u.container_id.clone(), u.local, u.on_down_machine))
                        .collect(),
                )
            })
            .collect();
        fp.sort();
        fp
    }
}

/// A fixed route's `HOST[PATH]` as the table keys it: the hostname lowercase, without a
/// trailing dot, and its path (`/api/*` a prefix, `/*` or none the whole hostname, another an
/// exact path); `None` when the hostname is not one or the path not plain.
pub fn parse_static_route(spec: &str) -> Option<(String, PathMatch)> {
    let (host, path) = match spec.find('/') {
        Some(i) => (&spec[..i], Some(&spec[i..])),
        None => (spec, None),
    };
    if !valid_host(host.as_bytes()) || host.contains(':') {
        return None;
    }
    let path = match path {
        None | Some("/*") => PathMatch::root(),
        Some(p) => match p.strip_suffix("/*") {
            Some(prefix) => PathMatch::Prefix(prefix.to_owned()),
            None => PathMatch::Exact(p.to_owned()),
        },
    };
    valid_route_path(&path).then(|| (host.trim_end_matches('.').to_ascii_lowercase(), path))
}

/// Whether a route's path is one the table can hold: plain bytes, from `/`. Compose refuses
/// anything else; this keeps a record from elsewhere from routing oddly.
/// Whether a request path (without its query) is in its plain form: no byte a server would
/// read as another path. Not plain: a `%XX` that encodes a letter, a digit, `-`, `.`, `_`, `~`
/// or `/` (or is not two hex digits), a `.` or `..` segment, an empty segment (`//`), a
/// backslash and `;` (path parameters, dropped by some servers). No allocation.
pub fn plain_path(path: &[u8]) -> bool {
    if path.contains(&b'\\') || path.contains(&b';') {
        return false;
    }
    let hex = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
    let mut i = 0;
    while let Some(off) = path[i..].iter().position(|b| *b == b'%') {
        let at = i + off;
        let decoded = match (hex(path.get(at + 1)), hex(path.get(at + 2))) {
            (Some(h), Some(l)) => (h * 16 + l) as u8,
            _ => return false,
        };
        if decoded.is_ascii_alphanumeric() || b"-._~/".contains(&decoded) {
            return false;
        }
        i = at + 3;
    }
    // Segments after the leading `/`: none empty (but the last), none `.` or `..`.
    let segments = path.strip_prefix(b"/").unwrap_or(path);
    let count = segments.split(|b| *b == b'/').count();
    segments
        .split(|b| *b == b'/')
        .enumerate()
        .all(|(n, s)| (n + 1 == count || !s.is_empty()) && s != b"." && s != b"..")
}

fn valid_route_path(path: &PathMatch) -> bool {
    let p = path.path().as_bytes();
    p.first() == Some(&b'/')
        && p.len() <= 1024
        && p.iter()
            .all(|b| b.is_ascii_alphanumeric() || b"-._~!&'+,;=:@/%".contains(b))
}

#[cfg(test)]
pub(crate) mod tests {
    #[test]
    fn hosts_with_a_bad_port_or_an_ip_literal_match_no_route() {
        let t = RouteTable::from_static(&[
            ("app.test".into(), vec!["127.0.0.1:1".parse().unwrap()]),
            ("bad\"name".into(), vec!["127.0.0.1:2".parse().unwrap()]),
            ("dotted.test.".into(), vec!["127.0.0.1:3".parse().unwrap()]),
        ]);
        assert_eq!(t.len(), 2, "a name that is not a host name is not routed");
        for good in [
            &b"app.test"[..],
            b"APP.test.",
            b"app.test:80",
            b"dotted.test",
            b"dotted.test.:8",
        ] {
            assert!(
                t.match_host(good).is_some(),
                "{}",
                String::from_utf8_lossy(good)
            );
        }
        for bad in [
            &b"app.test:"[..],
            b"app.test:1:2",
            b"app.test:123456",
            b"app.test:1@evil.test",
            b"app.test:1\";proto=https",
            b"[::1]",
            b"[::1]:80",
            b"bad\"name",
        ] {
            assert!(
                t.match_host(bad).is_none(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    #[test]
    fn only_names_and_addresses_with_a_numeric_port_are_valid_hosts() {
        for good in [
            &b"app.test"[..],
            b"App.Test.",
            b"app.test:8080",
            b"a_b-c.example",
            b"10.0.0.1:80",
            b"[::1]",
            b"[fe80::1]:443",
        ] {
            assert!(valid_host(good), "{}", String::from_utf8_lossy(good));
        }
        for bad in [
            &b""[..],
            b":80",
            b"app.test:",
            b"app.test:1@evil.com",
            b"app.test:80:80",
            b"app.test:123456",
            b"app test",
            b"app.test\";proto=https",
            b"user@app.test",
            b"[::1",
            b"[]",
            b"[::1]x",
            b"[::g]",
            b"app.test/x",
        ] {
            assert!(!valid_host(bad), "{}", String::from_utf8_lossy(bad));
        }
    }

    use super::*;
    use ployz_core::{ContainerSpec, ContainerState, ServiceId, ServiceMode, ServiceSpec};

    fn build(
        obs: &[ContainerRuntimeObservation],
        local: &MachineId,
        generation: u64,
    ) -> RouteTable {
        RouteTable::build(
            obs,
            &HashSet::new(),
            (local, &HashSet::new()),
            &FreshCounters,
            generation,
        )
    }

    /// A Service Container `web-<n>` at 10.210.0.<n> serving `hosts`, in `state`.
    pub(crate) fn obs(
        machine: &MachineId,
        n: u8,
        hosts: &[(&str, u16, IngressProtocol)],
        state: ContainerState,
        health: Option<ployz_core::ContainerHealth>,
    ) -> ContainerRuntimeObservation {
        ContainerRuntimeObservation {
            id: format!("{n:064x}").parse().unwrap(),
            name: format!("web-{n}"),
            machine_id: machine.clone(),
            service_id: ServiceId::generate(),
            service_name: "web".parse().unwrap(),
            kind: ContainerKind::Service,
            state,
            health,
            restart_count: 0,
            address: Some(std::net::Ipv4Addr::new(10, 210, 0, n)),
            image: "app".into(),
            created_at: 0,
            spec: Some(ServiceSpec {
                name: "web".parse().unwrap(),
                mode: ServiceMode::Replicated,
                replicas: 1,
                container: ContainerSpec::default(),
                ports: hosts
                    .iter()
                    .map(|(h, p, proto)| ployz_core::PortSpec::Ingress {
                        hostname: Some((*h).into()),
                        published: None,
                        container_port: *p,
                        protocol: *proto,
                    })
                    .collect(),
                machines: vec![],
                update: Default::default(),
                pre_deploy: None,
                depends_on: vec![],
                revisions: None,
                routes: vec![],
            }),
            plan_id: None,
            lease_token: None,
        }
    }

    #[test]
    fn hosts_match_case_insensitively_without_port_or_trailing_dot() {
        let m = MachineId::generate();
        let t = build(
            &[obs(
                &m,
                2,
                &[("app.test", 80, IngressProtocol::Http)],
                ContainerState::Running,
                None,
            )],
            &m,
            1,
        );
        let cases: &[(&[u8], bool)] = &[
            (b"app.test", true),
            (b"APP.Test", true),
            (b"app.test:8080", true),
            (b"app.test.", true),
            (b"App.Test.:443", true),
            (b"app.test2", false),
            (b"pp.test", false),
            (b"", false),
            (b":80", false),
            (b"[::1]:80", false),
            (&[b'a'; 300], false),
        ];
        for (host, want) in cases {
            assert_eq!(
                t.match_host(host).is_some(),
                *want,
                "{:?}",
                String::from_utf8_lossy(host)
            );
        }
    }

    proptest::proptest! {
        /// A host already in normal form is looked up as sent, without the copy: the same
        /// route (or none) as its normal form names, for any host.
        #[test]
        fn a_host_matched_as_sent_names_the_route_its_normal_form_names(
            host in "[aAbB.:0-9]{0,10}",
        ) {
            let t = RouteTable::from_static(&[
                ("a.b".into(), vec!["127.0.0.1:1".parse().unwrap()]),
                ("ab".into(), vec!["127.0.0.1:2".parse().unwrap()]),
                ("b".into(), vec!["127.0.0.1:3".parse().unwrap()]),
                ("a.".into(), vec!["127.0.0.1:4".parse().unwrap()]),
            ]);
            let mut buf = [0u8; MAX_HOST];
            let normal = normalize(host.as_bytes(), &mut buf)
                .and_then(|k| t.hosts.get(k))
                .and_then(|h| h.route_for(b"/"));
            proptest::prop_assert_eq!(
                t.match_host(host.as_bytes()).map(|r| &r.hostname),
                normal.map(|r| &r.hostname)
            );
        }
    }

    #[test]
    fn a_host_longer_than_a_host_name_matches_nothing_in_any_case() {
        let long = "a".repeat(MAX_HOST + 1);
        let t = RouteTable::from_static(&[(
            "a".repeat(MAX_HOST),
            vec!["127.0.0.1:1".parse().unwrap()],
        )]);
        assert_eq!(t.len(), 1);
        assert!(t.match_host("a".repeat(MAX_HOST).as_bytes()).is_some());
        assert!(t.match_host("A".repeat(MAX_HOST).as_bytes()).is_some());
        assert!(t.match_host(long.as_bytes()).is_none());
        assert!(t.match_host(long.to_uppercase().as_bytes()).is_none());
    }

    #[test]
    fn only_serving_containers_route_and_local_ones_come_first() {
        let local = MachineId::generate();
        let other = MachineId::generate();
        let h = [("app.test", 8080, IngressProtocol::Https)];
        let t = build(
            &[
                obs(&other, 2, &h, ContainerState::Running, None),
                obs(
                    &local,
                    9,
                    &h,
                    ContainerState::Running,
                    Some(ployz_core::ContainerHealth::Healthy),
                ),
                obs(
                    &local,
                    3,
                    &h,
                    ContainerState::Running,
                    Some(ployz_core::ContainerHealth::Unhealthy),
                ),
                obs(&local, 4, &h, ContainerState::Exited, None),
                obs(
                    &local,
                    5,
                    &h,
                    ContainerState::Running,
                    Some(ployz_core::ContainerHealth::Starting),
                ),
            ],
            &local,
            1,
        );
        let r = t.match_host(b"app.test").unwrap();
        assert!(r.https);
        let addrs: Vec<String> = r.upstreams.iter().map(|u| u.addr.to_string()).collect();
        assert_eq!(addrs, ["10.210.0.9:8080", "10.210.0.2:8080"]);
        assert!(r.upstreams[0].local && !r.upstreams[1].local);
    }

    /// A container of Service `name` serving `app.test` at `routes` (none: the whole host).
    fn routed(
        m: &MachineId,
        n: u8,
        name: &str,
        routes: &[(PathMatch, bool)],
    ) -> ContainerRuntimeObservation {
        let mut o = obs(
            m,
            n,
            &[("app.test", 80, IngressProtocol::Http)],
            ContainerState::Running,
            None,
        );
        let spec = o.spec.as_mut().unwrap();
        spec.name = name.parse().unwrap();
        spec.routes = routes
            .iter()
            .map(|(path, strip)| ployz_core::RouteSpec {
                hostname: "app.test".into(),
                path: path.clone(),
                strip_prefix: *strip,
                redirect: None,
                request_headers: Default::default(),
                response_headers: Default::default(),
                allow: vec![],
                ..Default::default()
            })
            .collect();
        o
    }

    fn prefix(p: &str) -> PathMatch {
        PathMatch::Prefix(p.into())
    }

    #[test]
    fn exact_paths_then_the_longest_prefix_on_a_segment_boundary_then_the_whole_host() {
        let m = MachineId::generate();
        let t = build(
            &[
                routed(&m, 1, "site", &[]),
                routed(&m, 2, "api", &[(prefix("/api"), true)]),
                routed(&m, 3, "v2", &[(prefix("/api/v2"), false)]),
                routed(
                    &m,
                    4,
                    "health",
                    &[(PathMatch::Exact("/api/health".into()), false)],
                ),
            ],
            &m,
            1,
        );
        let to = |target: &str| {
            t.match_request(b"APP.test:80", target.as_bytes())
                .map(|r| r.service.to_string())
                .unwrap_or_default()
        };
        for (target, service) in [
            ("/", "site"),
            ("/index.html", "site"),
            ("/apis", "site"),
            ("/api", "api"),
            ("/api/", "api"),
            ("/api?x=/api/v2", "api"),
            ("/api/users/7", "api"),
            ("/api/v2", "v2"),
            ("/api/v2/", "v2"),
            ("/api/v2x", "api"),
            ("/api/v2/a/b/c?d", "v2"),
            ("/api/health", "health"),
            ("/api/health?verbose", "health"),
            ("/api/health/", "api"),
            // Not in its plain form: no route (a server could read it as /api).
            ("//api", ""),
        ] {
            assert_eq!(to(target), service, "{target}");
        }
        assert!(t.match_request(b"other.test", b"/api").is_none());

        // Without a route of the whole host, a path no route takes matches nothing.
        let t = build(&[routed(&m, 2, "api", &[(prefix("/api"), true)])], &m, 2);
        assert!(t.match_request(b"app.test", b"/elsewhere").is_none());
        assert!(t.match_request(b"app.test", b"/").is_none());
        assert_eq!(t.match_request(b"app.test", b"/api/x").unwrap().strip, 4);
    }

    #[test]
    fn a_gated_service_carries_its_gate_and_keeps_its_route_with_no_container_serving() {
        let m = MachineId::generate();
        let mut stopped = routed(&m, 1, "site", &[]);
        stopped.state = ContainerState::Exited;
        let other = routed(&m, 2, "api", &[(prefix("/api"), false)]);
        let gates: HashMap<ServiceId, GateState> = [(
            stopped.service_id.clone(),
            GateState::Maintenance {
                message: "back <soon>".into(),
            },
        )]
        .into();
        let t = RouteTable::build_gated(
            &[stopped.clone(), other.clone()],
            &HashSet::new(),
            (&m, &HashSet::new()),
            &FreshCounters,
            Standing {
                generation: 1,
                gates: &gates,
                users: &HashMap::new(),
            },
        );
        let site = t.match_request(b"app.test", b"/").unwrap();
        assert!(site.upstreams.is_empty());
        match &site.gate {
            Some(RouteGate::Maintenance { page }) => assert!(page.contains("back &lt;soon&gt;")),
            other => panic!("{other:?}"),
        }
        assert_eq!(t.match_request(b"app.test", b"/api").unwrap().gate, None);
        // Without the gate, a stopped container makes no route; the gate is in the fingerprint.
        let plain = build(&[stopped, other], &m, 2);
        assert!(plain.match_request(b"app.test", b"/").is_none());
        assert_ne!(plain.fingerprint(), t.fingerprint());
    }

    #[test]
    fn a_redirect_route_needs_no_serving_container_and_has_no_upstream() {
        let m = MachineId::generate();
        let mut o = routed(&m, 1, "site", &[(prefix("/old"), true)]);
        o.state = ContainerState::Exited;
        o.spec.as_mut().unwrap().routes[0].redirect = Some(ployz_core::Redirect {
            to: "https://example.com/new".into(),
            status: 301,
        });
        let t = build(&[o], &m, 1);
        let r = t.match_request(b"app.test", b"/old/x?y").unwrap();
        assert_eq!(r.redirect, Some((301, "https://example.com/new".into())));
        assert!(r.upstreams.is_empty());
        assert_eq!(r.strip, 4);
        let mut location = r.redirect.as_ref().unwrap().1.as_bytes().to_vec();
        write_target(&mut location, b"/old/x?y", r.strip);
        assert_eq!(location, b"https://example.com/new/x?y");
        // The stopped container's other paths are not routed.
        assert!(t.match_request(b"app.test", b"/").is_none());
    }

    #[test]
    fn an_allow_list_admits_its_networks_and_ipv4_mapped_addresses() {
        let m = MachineId::generate();
        let mut o = routed(&m, 1, "admin", &[(prefix("/admin"), false)]);
        o.spec.as_mut().unwrap().routes[0].allow = vec![
            "10.0.0.0/8".into(),
            "2001:db8::/32".into(),
            "not a network".into(),
        ];
        let t = build(&[o], &m, 1);
        let r = t.match_request(b"app.test", b"/admin").unwrap();
        for (ip, admitted) in [
            ("10.1.2.3", true),
            ("::ffff:10.1.2.3", true),
            ("2001:db8::7", true),
            ("11.0.0.1", false),
            ("::1", false),
        ] {
            assert_eq!(r.admits(ip.parse().unwrap()), admitted, "{ip}");
        }
        let open = build(&[routed(&m, 2, "site", &[])], &m, 2);
        assert!(open
            .match_host(b"app.test")
            .unwrap()
            .admits("192.0.2.1".parse().unwrap()));
    }

    #[test]
    fn a_route_with_rules_carries_its_policy_and_its_users_list_once_known() {
        let m = MachineId::generate();
        let mut o = routed(&m, 1, "admin", &[(prefix("/admin"), false)]);
        let list = ployz_core::SecretValue::new(
            b"alice:$2y$04$abcdefghijklmnopqrstuuAbCdEfGhIjKlMnOpQrStUvWxYz01234\n".to_vec(),
        );
        {
            let route = &mut o.spec.as_mut().unwrap().routes[0];
            route.basic_auth = Some(ployz_core::BasicAuth::new("Staff".into(), list.clone()));
            route.timeout_ms = Some(2_000);
            route.max_body_bytes = Some(1024);
            route.error_pages = [(504, "<p>slow</p>".to_owned())].into();
        }
        let o = ContainerRuntimeObservation {
            spec: o.spec.as_ref().map(|s| s.without_secret_values()),
            ..o
        };
        let built = |users: &HashMap<String, Arc<crate::auth::Users>>| {
            RouteTable::build_gated(
                std::slice::from_ref(&o),
                &HashSet::new(),
                (&m, &HashSet::new()),
                &FreshCounters,
                Standing {
                    generation: 1,
                    gates: &HashMap::new(),
                    users,
                },
            )
        };
        let unknown = built(&HashMap::new());
        let r = unknown.match_request(b"app.test", b"/admin/x").unwrap();
        assert!(r.needs_proxy());
        let policy = r.policy.as_ref().unwrap();
        assert_eq!(policy.timeout, Some(std::time::Duration::from_secs(2)));
        assert_eq!(policy.max_body, Some(1024));
        assert_eq!(policy.error_pages[&504].as_ref(), "<p>slow</p>");
        let auth = policy.auth.as_ref().unwrap();
        assert_eq!((&*auth.realm, auth.users.is_none()), ("Staff", true));

        let users = [(
            list.digest(),
            Arc::new(crate::auth::Users::parse(list.as_bytes()).unwrap()),
        )]
        .into();
        let known = built(&users);
        let r = known.match_request(b"app.test", b"/admin").unwrap();
        assert!(r
            .policy
            .as_ref()
            .unwrap()
            .auth
            .as_ref()
            .unwrap()
            .users
            .is_some());
        // The list arriving publishes the table again.
        assert_ne!(unknown.fingerprint(), known.fingerprint());
        // A route without rules has no policy and stays on the fast paths.
        let plain = build(&[routed(&m, 2, "site", &[])], &m, 2);
        assert!(!plain.match_host(b"app.test").unwrap().needs_proxy());
    }

    #[test]
    fn a_path_not_in_its_plain_form_takes_no_route_on_a_host_routed_by_path() {
        for (path, plain) in [
            (&b"/admin"[..], true),
            (b"/admin/", true),
            (b"/", true),
            (b"/caf%C3%A9", true),
            (b"/a%20b", true),
            (b"/%61dmin", false),
            (b"/admin%2Fx", false),
            (b"/x/%2e%2e/admin", false),
            (b"/x/../admin", false),
            (b"/./admin", false),
            (b"/x/..", false),
            (b"//admin", false),
            (b"/a//b", false),
            (b"/admin;x=1", false),
            (b"/admin\\x", false),
            (b"/bad%zz", false),
            (b"/trailing%", false),
        ] {
            assert_eq!(plain_path(path), plain, "{}", String::from_utf8_lossy(path));
        }
        let m = MachineId::generate();
        let t = build(
            &[
                routed(&m, 1, "site", &[]),
                routed(&m, 2, "admin", &[(prefix("/admin"), false)]),
            ],
            &m,
            1,
        );
        let to = |target: &[u8]| {
            t.match_request(b"app.test", target)
                .map(|r| r.service.to_string())
        };
        assert_eq!(to(b"/admin/x"), Some("admin".into()));
        assert_eq!(to(b"/x/y?q=%61"), Some("site".into()));
        assert_eq!(to(b"/%61dmin/x"), None);
        assert_eq!(to(b"/x/../admin"), None);
        // A host served whole has no route to get past: any path goes to it.
        let whole = build(&[routed(&m, 3, "site", &[])], &m, 2);
        assert!(whole.match_request(b"app.test", b"/x/../%61").is_some());
    }

    #[test]
    fn a_route_with_its_own_503_page_stays_without_a_serving_container() {
        let m = MachineId::generate();
        let mut stopped = obs(
            &m,
            1,
            &[("app.test", 8080, IngressProtocol::Http)],
            ContainerState::Exited,
            None,
        );
        stopped.spec.as_mut().unwrap().routes = vec![RouteSpec {
            hostname: "app.test".into(),
            path: prefix("/shop"),
            error_pages: [(503, "<p>back soon</p>".to_owned())].into(),
            ..Default::default()
        }];
        let t = build(&[stopped.clone()], &m, 1);
        let r = t.match_request(b"app.test", b"/shop/cart").unwrap();
        assert!(r.upstreams.is_empty());
        assert_eq!(
            r.policy.as_ref().unwrap().error_pages[&503].as_ref(),
            "<p>back soon</p>"
        );
        // A page for 502 alone does not keep it.
        stopped.spec.as_mut().unwrap().routes[0].error_pages = [(502, "x".to_owned())].into();
        assert!(build(&[stopped], &m, 2)
            .match_request(b"app.test", b"/shop")
            .is_none());
    }

    #[test]
    fn fixed_routes_take_a_path_after_the_hostname() {
        let up = |p: u16| vec![SocketAddr::from(([127, 0, 0, 1], p))];
        let t = RouteTable::from_static(&[
            ("Shop.test".into(), up(1)),
            ("shop.test/api/*".into(), up(2)),
            ("shop.test/api/health".into(), up(3)),
            ("shop.test/a b/*".into(), up(4)),
            ("bad host/*".into(), up(5)),
        ]);
        assert_eq!(t.len(), 1);
        assert_eq!(t.routes().count(), 3);
        let port = |target: &str| {
            t.match_request(b"shop.test", target.as_bytes())
                .map(|r| r.upstreams[0].addr.port())
        };
        assert_eq!(port("/x"), Some(1));
        assert_eq!(port("/api/x"), Some(2));
        assert_eq!(port("/api/health"), Some(3));
        assert_eq!(
            parse_static_route("shop.test/*"),
            Some(("shop.test".into(), PathMatch::root()))
        );
        assert_eq!(parse_static_route("shop.test/a?b"), None);
    }

    #[test]
    fn a_stripped_prefix_leaves_the_rest_of_the_target_and_never_an_empty_path() {
        let cases = [
            ("/api/users?id=1", 4, "/users?id=1"),
            ("/api", 4, "/"),
            ("/api/", 4, "/"),
            ("/api?x=1", 4, "/?x=1"),
            ("/api/v2/x", 7, "/x"),
            ("/other", 0, "/other"),
            ("*", 4, "*"),
        ];
        for (target, strip, want) in cases {
            let mut out = Vec::new();
            write_target(&mut out, target.as_bytes(), strip);
            assert_eq!(String::from_utf8(out).unwrap(), want, "{target}");
        }
    }

    #[test]
    fn a_route_path_from_elsewhere_that_is_not_plain_is_not_routed() {
        let m = MachineId::generate();
        let t = build(
            &[
                routed(&m, 1, "odd", &[(prefix("/a b"), false)]),
                routed(&m, 2, "fine", &[(prefix("/ok"), false)]),
            ],
            &m,
            1,
        );
        assert_eq!(t.routes().count(), 1);
        assert!(t.match_request(b"app.test", b"/ok/x").is_some());
    }

    #[test]
    fn round_robin_visits_every_upstream_and_skips_marked_ones() {
        let m = MachineId::generate();
        let h = [("app.test", 80, IngressProtocol::Http)];
        let t = build(
            &[
                obs(&m, 2, &h, ContainerState::Running, None),
                obs(&m, 3, &h, ContainerState::Running, None),
            ],
            &m,
            1,
        );
        let r = t.match_host(b"app.test").unwrap();
        let a = r.pick(0, &[]).unwrap();
        let b = r.pick(0, &[]).unwrap();
        assert_ne!(a, b);
        for _ in 0..4 {
            assert_eq!(r.pick(0, &[a]).unwrap(), b, "excluded");
        }
        assert!(r.pick(0, &[a, b]).is_none());
        r.mark_failed(a, 1000);
        for _ in 0..4 {
            assert_eq!(r.pick(500, &[]).unwrap(), b, "marked");
        }
        assert_eq!(r.pick(500, &[b]).unwrap(), a, "a marked one beats none");
        assert!([a, b].contains(&r.pick(1000, &[]).unwrap()));
    }

    #[test]
    fn containers_on_machines_observed_down_are_tried_last_never_dropped() {
        let here = MachineId::generate();
        let gone = MachineId::generate();
        let h = [("app.test", 80, IngressProtocol::Http)];
        let observations = [
            obs(&gone, 2, &h, ContainerState::Running, None),
            obs(&here, 3, &h, ContainerState::Running, None),
            obs(&MachineId::generate(), 4, &h, ContainerState::Running, None),
        ];
        let down = HashSet::from([gone.clone()]);
        let t = RouteTable::build(
            &observations,
            &HashSet::new(),
            (&here, &down),
            &FreshCounters,
            1,
        );
        let r = t.match_host(b"app.test").unwrap();
        // Listed local first, the down Machine's last.
        let listed: Vec<(bool, bool)> = r
            .upstreams
            .iter()
            .map(|u| (u.local, u.on_down_machine))
            .collect();
        assert_eq!(listed, [(true, false), (false, false), (false, true)]);
        // Round robin over the two that are up; the third only when they are excluded or marked.
        for _ in 0..6 {
            assert!(r.pick(0, &[]).unwrap() < 2);
        }
        assert_eq!(r.pick(0, &[0, 1]), Some(2));
        r.mark_failed(0, 1000);
        r.mark_failed(1, 1000);
        assert_eq!(
            r.pick(500, &[]),
            Some(2),
            "an unmarked one on a down Machine beats marked ones"
        );
        r.mark_failed(2, 1000);
        assert!(r.pick(500, &[]).is_some(), "all marked: still tried");
        // Observed up again: a rebuild puts it back in the rotation.
        let t = RouteTable::build(
            &observations,
            &HashSet::new(),
            (&here, &HashSet::new()),
            &FreshCounters,
            2,
        );
        assert_ne!(
            t.fingerprint(),
            RouteTable::build(
                &observations,
                &HashSet::new(),
                (&here, &down),
                &FreshCounters,
                3
            )
            .fingerprint()
        );
        let r = t.match_host(b"app.test").unwrap();
        let picked: HashSet<usize> = (0..6).map(|_| r.pick(0, &[]).unwrap()).collect();
        assert_eq!(picked.len(), 3);
    }

    #[test]
    fn draining_containers_are_left_out() {
        let m = MachineId::generate();
        let h = [("app.test", 80, IngressProtocol::Http)];
        let a = obs(&m, 2, &h, ContainerState::Running, None);
        let b = obs(&m, 3, &h, ContainerState::Running, None);
        let draining: HashSet<ContainerId> = [a.id.clone()].into();
        let t = RouteTable::build(
            &[a.clone(), b.clone()],
            &draining,
            (&m, &HashSet::new()),
            &FreshCounters,
            1,
        );
        assert!(!t.routes_to(&a.id));
        assert!(t.routes_to(&b.id));
        assert!(t.has_upstream("app.test", &PathMatch::root()));
    }

    #[tokio::test]
    async fn a_wait_for_zero_is_woken_by_the_last_release_and_unregisters_when_it_ends() {
        let far = tokio::time::Instant::now() + std::time::Duration::from_secs(3600);
        let counter = Arc::new(InFlight::new());
        assert_eq!(counter.wait_for_zero(far).await, 0, "nothing in flight");
        counter.acquire();
        counter.acquire();
        let waiter = tokio::spawn({
            let counter = counter.clone();
            async move { counter.wait_for_zero(far).await }
        });
        tokio::task::yield_now().await;
        assert_eq!(counter.waiters(), 1);
        counter.release();
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one request is still in flight");
        counter.release();
        let left = tokio::time::timeout(std::time::Duration::from_secs(30), waiter)
            .await
            .expect("woken by the release reaching zero")
            .unwrap();
        assert_eq!(left, 0);
        assert_eq!(counter.waiters(), 0);

        // A wait that ends at its deadline (or is dropped) stops counting as waiting.
        counter.acquire();
        let soon = tokio::time::Instant::now() + std::time::Duration::from_millis(10);
        assert_eq!(counter.wait_for_zero(soon).await, 1);
        assert_eq!(counter.waiters(), 0);
        counter.release();
        assert_eq!(counter.get(), 0);
    }

    #[test]
    fn equal_inputs_build_equal_fingerprints() {
        let m = MachineId::generate();
        let h = [
            ("app.test", 80, IngressProtocol::Http),
            ("b.test", 81, IngressProtocol::Http),
        ];
        let input = [
            obs(&m, 2, &h, ContainerState::Running, None),
            obs(&m, 3, &h, ContainerState::Running, None),
        ];
        let mut reversed = input.clone();
        reversed.reverse();
        assert_eq!(
            build(&input, &m, 1).fingerprint(),
            build(&reversed, &m, 2).fingerprint()
        );
    }
}
