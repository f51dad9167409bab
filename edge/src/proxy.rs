//! The edge's Pingora proxy: machine paths, host routing, round robin with connect retries,
//! forwarding headers and one access-log line per request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};

use ployz_core::MachineId;

use crate::route_table::{Route, RouteGate};
use crate::RouteController;

/// How many upstreams one request may try to connect to.
const MAX_TRIES: usize = 3;
/// How long an upstream that refused a connection is avoided.
const FAILURE_WINDOW_MS: u64 = 10_000;
/// The upstream connect timeout unless configured: enough for a lost SYN to be sent again
/// (after 1 s) to a local or mesh upstream, short enough that a dead one costs little.
pub const DEFAULT_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(1);

/// What the health endpoint reports, shared with the daemon.
#[derive(Debug, Default)]
pub struct EdgeState {
    /// This Machine's ID once it participates; `None` before `machine init`.
    machine_id: OnceLock<String>,
    /// Set on shutdown: health answers 503 while requests are still served.
    draining: AtomicBool,
    /// Set once another daemon process took over the listeners: responses close their
    /// connections (clients move to that process), health still answers as before.
    handing_over: AtomicBool,
    /// Why this Machine's store cannot write, while it cannot: health answers 503 meanwhile,
    /// since what is deployed or imported now would not be served.
    store_unwritable: std::sync::Mutex<Option<String>>,
}

impl EdgeState {
    pub fn set_participating(&self, machine_id: &str) {
        let _ = self.machine_id.set(machine_id.to_owned());
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// Another daemon process is taking over the listeners: every response says
    /// `Connection: close` (HTTP/2 connections get GOAWAY), so clients reconnect (to it, once
    /// it accepts), and health answers for the Machine as it was.
    pub fn set_handing_over(&self) {
        self.handing_over.store(true, Ordering::Relaxed);
    }

    /// Records why the store cannot write (`None`: it writes again).
    pub fn set_store_unwritable(&self, reason: Option<String>) {
        *self
            .store_unwritable
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = reason;
    }

    /// (HTTP status, JSON body) of the health endpoint; `routes_loaded`: the edge has its first
    /// route table from the store (before it, every host would be answered as unknown).
    pub fn health(&self, routes_loaded: bool) -> (u16, String) {
        if let (Some(id), true) = (
            self.machine_id.get(),
            self.handing_over.load(Ordering::Relaxed),
        ) {
            // The Machine goes on serving, through the process taking over; this one's modules
            // stopping (and its store handed over) say nothing about it.
            return (
                200,
                format!(r#"{{"status":"serving","machine_id":"{id}"}}"#),
            );
        }
        match (self.machine_id.get(), self.draining.load(Ordering::Relaxed)) {
            (None, _) => (
                503,
                r#"{"status":"unavailable","reason":"this Machine is not initialised"}"#.into(),
            ),
            (Some(id), true) => (
                503,
                format!(
                    r#"{{"status":"draining","reason":"the daemon is shutting down","machine_id":"{id}"}}"#
                ),
            ),
            (Some(id), false) => {
                let unwritable = self
                    .store_unwritable
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner)
                    .clone();
                match unwritable {
                    Some(reason) => (
                        503,
                        serde_json::json!({
                            "status": "unavailable",
                            "reason": format!("this Machine's store cannot write: {reason}"),
                            "machine_id": id,
                        })
                        .to_string(),
                    ),
                    None if !routes_loaded => (
                        503,
                        format!(
                            r#"{{"status":"starting","reason":"the route table is not loaded from the store yet","machine_id":"{id}"}}"#
                        ),
                    ),
                    None => (
                        200,
                        format!(r#"{{"status":"serving","machine_id":"{id}"}}"#),
                    ),
                }
            }
        }
    }
}

/// Request limits the edge enforces before any upstream work, and how it proxies.
#[derive(Debug, Clone, Copy)]
pub struct EdgeLimits {
    /// All header names and values together, bytes; more gets 431.
    pub max_header_bytes: usize,
    /// The request target (path and query), bytes; longer gets 414.
    pub max_uri_bytes: usize,
    /// The request body, bytes; more gets 413. `None`: no limit.
    pub max_body_bytes: Option<u64>,
    /// Write one access-log line per request.
    pub access_log: bool,
    /// Time a client has for a whole request header; slower clients are disconnected.
    pub header_timeout: std::time::Duration,
    /// Time a connection to an upstream may take; then the next Serving Container is tried
    /// and the silent one avoided for a while.
    pub connect_timeout: std::time::Duration,
    /// Pass request header fields whose names contain `_` on to upstreams. Off: they are
    /// dropped (as nginx does), so an application that reads `_` and `-` alike cannot be handed
    /// an `X_Forwarded_For` that passes for the edge's `X-Forwarded-For`.
    pub forward_underscore_headers: bool,
    /// Serve the common HTTP/1.1 request shape on the fast path; off: every request goes
    /// through Pingora's proxy.
    pub fast_path: bool,
}

impl Default for EdgeLimits {
    fn default() -> Self {
        EdgeLimits {
            max_header_bytes: 16 * 1024,
            max_uri_bytes: 8 * 1024,
            max_body_bytes: None,
            access_log: true,
            header_timeout: std::time::Duration::from_secs(15),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            forward_underscore_headers: false,
            fast_path: true,
        }
    }
}

/// The `ProxyHttp` of every Machine's edge.
#[derive(Clone)]
pub struct EdgeProxy {
    limits: EdgeLimits,
    routes: RouteController,
    state: Arc<EdgeState>,
    metrics: Arc<crate::EdgeMetrics>,
    /// The HTTPS listener's port, for redirects (omitted from the URL when 443).
    https_port: Option<u16>,
    /// Pending HTTP-01 challenges, answered on the plain-HTTP listener for any Host.
    challenges: crate::ChallengeResponder,
    /// Checks credentials on routes with basic authentication.
    auth: Arc<crate::auth::AuthChecker>,
}

/// The upstreams one request has tried, and the in-flight counter it holds. Both request paths
/// (Pingora's and the fast path) choose upstreams through [`EdgeProxy::choose_upstream`].
pub(crate) struct Attempts {
    route: Option<Arc<Route>>,
    /// The in-flight counter of the upstream this request currently holds.
    active: Option<Arc<crate::route_table::InFlight>>,
    tried: [usize; MAX_TRIES],
    tries: usize,
}

impl Default for Attempts {
    fn default() -> Attempts {
        Attempts {
            route: None,
            active: None,
            tried: [usize::MAX; MAX_TRIES],
            tries: 0,
        }
    }
}

impl Attempts {
    /// The upstream chosen last, if any.
    /// The upstream chosen last, when it is on another Machine: that Machine and its address.
    fn last_remote(&self) -> Option<(&MachineId, std::net::SocketAddr)> {
        let route = self.route.as_ref()?;
        let last = *self.tried[..self.tries].last()?;
        let up = route.upstreams.get(last)?;
        match &up.machine {
            Some(m) if !up.local => Some((m, up.addr)),
            _ => None,
        }
    }

    pub(crate) fn last_upstream(&self) -> Option<std::net::SocketAddr> {
        let route = self.route.as_ref()?;
        let last = *self.tried[..self.tries].last()?;
        route.upstreams.get(last).map(|u| u.addr)
    }

    /// Gives back the in-flight count this request holds (the request is over).
    pub(crate) fn release(&mut self) {
        if let Some(active) = self.active.take() {
            active.release();
        }
    }
}

impl Drop for Attempts {
    fn drop(&mut self) {
        self.release();
    }
}

/// Per-request state: the matched route and the upstreams tried.
pub struct EdgeCtx {
    attempts: Attempts,
    /// Request body bytes seen so far.
    body_bytes: u64,
    start: Instant,
    /// The upstream to try again: a kept connection to it turned out closed before anything
    /// came back, so the request goes to it once more on another connection.
    again: Option<std::net::SocketAddr>,
    /// The exchange with an upstream on another Machine, registered to be cut when that
    /// Machine is observed down.
    exchange: Option<crate::exchanges::Registered>,
}

impl EdgeProxy {
    /// The limits this edge enforces.
    pub fn limits(&self) -> &EdgeLimits {
        &self.limits
    }

    pub fn new(
        routes: RouteController,
        state: Arc<EdgeState>,
        metrics: Arc<crate::EdgeMetrics>,
        https_port: Option<u16>,
        limits: EdgeLimits,
    ) -> EdgeProxy {
        EdgeProxy {
            limits,
            routes,
            state,
            metrics,
            https_port,
            challenges: crate::ChallengeResponder::default(),
            auth: Arc::default(),
        }
    }

    /// Answers HTTP-01 challenges from `challenges`.
    pub fn with_challenges(mut self, challenges: crate::ChallengeResponder) -> EdgeProxy {
        self.challenges = challenges;
        self
    }

    fn now_ms(&self) -> u64 {
        self.routes.now_ms()
    }

    /// Holds a request of a paused route until a table without the pause is published or the
    /// pause's end passes (bounded by the longest pause there is), then answers the route it
    /// takes then; `None` when none takes it any more.
    async fn wait_while_paused(&self, host: &[u8], target: &[u8]) -> Option<Arc<Route>> {
        let cap =
            tokio::time::Instant::now() + Duration::from_secs(ployz_core::gate::MAX_PAUSE_SECONDS);
        loop {
            // Created before the table is looked at: a publish after the look wakes it.
            let published = self.routes.published();
            let route = self
                .routes
                .table()
                .load()
                .match_request(host, target)
                .cloned()?;
            let Some(RouteGate::Paused { until_ms }) = route.gate else {
                return Some(route);
            };
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64);
            let left = Duration::from_millis(until_ms.saturating_sub(now))
                .min(cap.saturating_duration_since(tokio::time::Instant::now()));
            if left.is_zero() {
                return Some(route);
            }
            let _ = tokio::time::timeout(left, published).await;
        }
    }

    /// The route table, loaded once.
    pub(crate) fn routes(&self) -> &RouteController {
        &self.routes
    }

    /// The port HTTP requests for HTTPS hostnames are redirected to, if any.
    pub(crate) fn https_port(&self) -> Option<u16> {
        self.https_port
    }

    /// Whether the daemon is shutting down (SIGTERM's drain delay or later).
    pub(crate) fn draining(&self) -> bool {
        self.state.is_draining()
    }

    /// Chooses the next upstream for `host` and takes an in-flight count on it. The pick is
    /// confirmed against the table published after the count went up: if a new table (say,
    /// one without a draining container) was published in between, the pick is undone and made
    /// again from the new table, so a drain that saw no request in flight never has one arrive
    /// afterwards. `None`: no Serving Container is left to try.
    pub(crate) fn choose_upstream(
        &self,
        host: &[u8],
        target: &[u8],
        attempts: &mut Attempts,
    ) -> Option<std::net::SocketAddr> {
        let mut table = self.routes.table().load_full();
        for round in 0..3 {
            let route = table.match_request(host, target)?.clone();
            if !attempts
                .route
                .as_ref()
                .is_some_and(|r| Arc::ptr_eq(r, &route))
            {
                // Indices of another table's route mean nothing here.
                attempts.tried = [usize::MAX; MAX_TRIES];
                attempts.route = Some(route.clone());
            }
            let i = route.pick(self.now_ms(), &attempts.tried[..attempts.tries])?;
            let upstream = &route.upstreams[i];
            upstream.in_flight.acquire();
            let now = self.routes.table().load_full();
            if round < 2 && !Arc::ptr_eq(&now, &table) {
                upstream.in_flight.release();
                table = now;
                continue;
            }
            if attempts.tries < MAX_TRIES {
                attempts.tried[attempts.tries] = i;
                attempts.tries += 1;
            }
            attempts.release();
            attempts.active = Some(upstream.in_flight.clone());
            return Some(upstream.addr);
        }
        unreachable!("the last round always returns")
    }

    /// Registers the exchange on socket `fd` with the upstream chosen last, when it is on
    /// another Machine, so that the Machine observed down cuts it at once
    /// ([`crate::exchanges::Exchanges`]); `None` for a local upstream.
    pub(crate) fn register_exchange(
        &self,
        attempts: &Attempts,
        fd: std::os::fd::RawFd,
    ) -> Option<crate::exchanges::Registered> {
        let (machine, addr) = attempts.last_remote()?;
        Some(self.routes.exchanges().register(machine, fd, addr))
    }

    /// Marks the upstream chosen last as failed for a while; whether another may be tried
    /// (nothing was sent, so any request may go to the next one).
    pub(crate) fn connect_failed(&self, attempts: &Attempts) -> bool {
        let (Some(route), Some(&last)) = (&attempts.route, attempts.tried[..attempts.tries].last())
        else {
            return false;
        };
        route.mark_failed(last, self.now_ms() + FAILURE_WINDOW_MS);
        attempts.tries < MAX_TRIES && attempts.tries < route.upstreams.len()
    }

    /// The edge's metrics.
    pub fn metrics(&self) -> &crate::EdgeMetrics {
        &self.metrics
    }

    /// Counts one finished request in the metrics and writes its access-log line: no bodies,
    /// credentials, cookies or query strings.
    pub(crate) fn finish(&self, request: Finished<'_>, attempts: &mut Attempts) {
        attempts.release();
        let elapsed = request.start.elapsed().as_secs_f64();
        self.metrics.observe(
            request.status,
            elapsed,
            request.error.is_some() && attempts.tries > 0,
        );
        if !self.limits.access_log {
            return;
        }
        let upstream = attempts
            .last_upstream()
            .map(|a| a.to_string())
            .unwrap_or_default();
        tracing::info!(
            target: "ployz::access",
            method = request.method,
            host = %String::from_utf8_lossy(request.host),
            path = request.path,
            status = request.status,
            upstream,
            tries = attempts.tries,
            ms = elapsed * 1000.0,
            error = request.error.unwrap_or_default(),
        );
    }
}

impl EdgeState {
    /// Whether SIGTERM arrived: every HTTP/1 response then says `Connection: close`.
    /// Whether connections close after their response: draining, or handing over.
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Relaxed) || self.handing_over.load(Ordering::Relaxed)
    }
}

/// One finished request, for [`EdgeProxy::finish`].
pub(crate) struct Finished<'a> {
    pub method: &'a str,
    pub host: &'a [u8],
    /// The path, without the query.
    pub path: &'a str,
    /// 0 when no response was written.
    pub status: u16,
    pub start: Instant,
    pub error: Option<String>,
}

/// Appends the forwarding header values for a request from `client` (an IP address) for
/// `host` over `proto`: `X-Forwarded-For` (after `previous`, the values of every
/// `X-Forwarded-For` line the request carried, in order, empty ones left out), `Forwarded`,
/// `X-Forwarded-Proto` and `X-Forwarded-Host`, as `name: value\r\n` lines.
pub(crate) fn write_forwarding<'a>(
    out: &mut Vec<u8>,
    client: Option<&str>,
    previous: impl IntoIterator<Item = &'a [u8]>,
    host: &[u8],
    proto: &str,
) {
    if let Some(ip) = client {
        out.extend_from_slice(b"X-Forwarded-For: ");
        for p in previous {
            let p = p.trim_ascii();
            if !p.is_empty() {
                out.extend_from_slice(p);
                out.extend_from_slice(b", ");
            }
        }
        out.extend_from_slice(ip.as_bytes());
        out.extend_from_slice(b"\r\nForwarded: for=");
        if ip.contains(':') {
            out.extend_from_slice(b"\"[");
            out.extend_from_slice(ip.as_bytes());
            out.extend_from_slice(b"]\"");
        } else {
            out.extend_from_slice(ip.as_bytes());
        }
        out.extend_from_slice(b";host=\"");
        out.extend_from_slice(host);
        out.extend_from_slice(b"\";proto=");
        out.extend_from_slice(proto.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"X-Forwarded-Proto: ");
    out.extend_from_slice(proto.as_bytes());
    out.extend_from_slice(b"\r\nX-Forwarded-Host: ");
    out.extend_from_slice(host);
    out.extend_from_slice(b"\r\n");
}

/// A request target as the edge reads it (RFC 9112 section 3.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target<'a> {
    /// A path, with its query: passed on as it is.
    Origin,
    /// `http://authority/path?query` (any case of the scheme): the authority is the request's
    /// host, whatever `Host` says, and the upstream gets `path_and_query` (`/` when empty).
    Absolute {
        authority: &'a [u8],
        path_and_query: &'a [u8],
    },
    /// Nothing a proxy can pass on: `*` (for `OPTIONS` too), a query alone, an authority
    /// (`CONNECT`'s form), another scheme. Answered 400.
    Refused,
}

impl<'a> Target<'a> {
    pub(crate) fn of(raw: &'a [u8]) -> Target<'a> {
        if raw.first() == Some(&b'/') {
            return Target::Origin;
        }
        let rest = match raw.iter().position(|b| *b == b':') {
            Some(i)
                if (raw[..i].eq_ignore_ascii_case(b"http")
                    || raw[..i].eq_ignore_ascii_case(b"https"))
                    && raw[i..].starts_with(b"://") =>
            {
                &raw[i + 3..]
            }
            _ => return Target::Refused,
        };
        let end = rest
            .iter()
            .position(|b| matches!(b, b'/' | b'?' | b'#'))
            .unwrap_or(rest.len());
        Target::Absolute {
            authority: &rest[..end],
            path_and_query: &rest[end..],
        }
    }
}

/// Why a request's `Content-Length` fields are refused, if they are: a list (`5,5`), more than
/// one field (even with equal values), or a value that is not digits. Leading zeros are
/// accepted; the upstream gets the plain decimal value.
pub(crate) fn content_length_refusal<'a>(
    mut values: impl Iterator<Item = &'a [u8]>,
) -> Option<&'static str> {
    let first = values.next()?;
    if values.next().is_some() {
        return Some("more than one Content-Length field");
    }
    if first.contains(&b',') {
        return Some("a list as Content-Length");
    }
    match parse_content_length(first) {
        Some(_) => None,
        None => Some("a Content-Length that is not a decimal number"),
    }
}

/// A `Content-Length` value: digits only, any leading zeros, at most `u64::MAX`.
pub(crate) fn parse_content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let digits = &value[value.iter().position(|b| *b != b'0').unwrap_or(value.len())..];
    if digits.len() > 20 {
        return None;
    }
    digits.iter().try_fold(0u64, |n, d| {
        n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
    })
}

/// Appends `n` in decimal, without allocating.
pub(crate) fn push_decimal(out: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// The answer, with 503 and `Retry-After`, for any host while a participating Machine's edge has
/// no route table from the store yet (just started): it cannot tell which hosts it routes.
pub(crate) const ROUTES_NOT_LOADED: &str =
    "this Machine is starting: its routes are not loaded yet\n";

/// The answer for a hostname the edge routes, at a path none of its routes takes.
const NO_ROUTE_FOR_PATH: &str = "no Service routes this path of this host\n";

/// The edge's own failure answers, the same words on every path (Pingora's proxy, the fast path,
/// HTTP/2): the container broke the exchange or answered nonsense.
pub(crate) const UPSTREAM_FAILED: &str = "upstream failed\n";
/// No connection to the container could be made.
pub(crate) const UPSTREAM_UNREACHABLE: &str = "upstream unreachable\n";
/// The host is routed, but to no Serving Container now.
pub(crate) const NO_SERVING_CONTAINER: &str = "no Serving Container for this host\n";

/// Answers `status` with `body` ([`write_own_answer`]).
async fn respond(
    session: &mut Session,
    status: u16,
    content_type: &str,
    body: String,
) -> Result<()> {
    let resp = own_head(status, content_type, body.len())?;
    write_own_answer(session, resp, Bytes::from(body)).await
}

/// The head of an answer of the edge's own, never cached.
fn own_head(status: u16, content_type: &str, length: usize) -> Result<ResponseHeader> {
    let mut resp = ResponseHeader::build(status, Some(4))?;
    resp.insert_header("content-type", content_type)?;
    resp.insert_header("content-length", length.to_string())?;
    resp.insert_header("cache-control", "no-store")?;
    Ok(resp)
}

/// Writes an answer of the edge's own: its head, then `body` unless the request was HEAD (the
/// head then ends it: Pingora's HTTP/2 session would send the body as DATA, which a HEAD stream
/// must not carry).
async fn write_own_answer(session: &mut Session, resp: ResponseHeader, body: Bytes) -> Result<()> {
    let head_request = session.req_header().method == http::Method::HEAD;
    session
        .write_response_header(Box::new(resp), head_request)
        .await?;
    if head_request {
        return Ok(());
    }
    session.write_response_body(Some(body), true).await
}

/// What the edge answers, in text, when it could not get a container's answer: the same words
/// as the fast paths ([`UPSTREAM_FAILED`] and the others), so a client sees one edge whichever
/// path its request took.
///
/// Chosen by the status and the kind of failure alone: an error's context may name the
/// container's address (Pingora adds the peer), which is not the client's to see.
fn failure_text(code: u16, e: &Error) -> &'static str {
    let unreachable = matches!(
        e.etype(),
        ErrorType::ConnectTimedout
            | ErrorType::ConnectRefused
            | ErrorType::ConnectNoRoute
            | ErrorType::ConnectError
            | ErrorType::BindError
            | ErrorType::SocketError
    );
    match code {
        502 if unreachable => UPSTREAM_UNREACHABLE,
        502 => UPSTREAM_FAILED,
        503 => NO_SERVING_CONTAINER,
        413 => "request body too large\n",
        504 => "the container took longer than the route allows\n",
        400 => "bad request\n",
        _ => "the edge could not answer this request\n",
    }
}

/// Answers `code` with [`failure_text`] (no body to a HEAD request), and closes the connection
/// after it as Pingora's own error answers do.
async fn respond_failure(session: &mut Session, code: u16, e: &Error) -> Result<()> {
    let body = failure_text(code, e);
    let mut resp = pingora::protocols::http::ServerSession::generate_error(code);
    resp.insert_header("content-type", "text/plain")?;
    resp.set_content_length(body.len())?;
    // Pingora's HTTP/2 session would send it as DATA, which a HEAD answer must not carry.
    let body = if session.req_header().method == http::Method::HEAD {
        Bytes::new()
    } else {
        Bytes::from_static(body.as_bytes())
    };
    session.write_error_response(resp, body).await
}

/// Answers a request basic authentication did not admit: 401 with the realm's challenge, or
/// 503 for a moment while the route's users list has not reached this Machine.
async fn respond_refused(
    session: &mut Session,
    verdict: crate::auth::Verdict,
    realm: &str,
) -> Result<()> {
    let (status, body, field) = match verdict {
        crate::auth::Verdict::ListUnknown => (
            503,
            "this path's users list has not reached this Machine yet; try again in a moment\n",
            ("retry-after", "1".to_owned()),
        ),
        crate::auth::Verdict::Busy => (
            503,
            "too many credentials are being checked; try again in a moment\n",
            ("retry-after", "1".to_owned()),
        ),
        _ => (
            401,
            "this path needs a user and password\n",
            ("www-authenticate", crate::auth::challenge(realm)),
        ),
    };
    let mut resp = ResponseHeader::build(status, Some(5))?;
    resp.insert_header(field.0, field.1)?;
    resp.insert_header("content-type", "text/plain")?;
    resp.insert_header("content-length", body.len().to_string())?;
    resp.insert_header("cache-control", "no-store")?;
    write_own_answer(session, resp, Bytes::from_static(body.as_bytes())).await
}

/// Whether a request's Content-Length says more than `limit` bytes.
fn declares_more_than(req: &RequestHeader, limit: u64) -> bool {
    req.headers
        .get("content-length")
        .and_then(|v| parse_content_length(v.as_bytes()))
        .is_some_and(|n| n > limit)
}

/// Whether raw HTTP/1 header bytes carry a header field `name` (lowercase), any case.
fn has_header(raw: &[u8], name: &[u8]) -> bool {
    raw.split(|b| *b == b'\n').skip(1).any(|line| {
        line.len() > name.len()
            && line[name.len()] == b':'
            && line[..name.len()].eq_ignore_ascii_case(name)
    })
}

fn is_tls(session: &Session) -> bool {
    session
        .digest()
        .and_then(|d| d.ssl_digest.as_ref())
        .is_some()
}

/// The host a request names: the authority of an absolute-form target (which wins over `Host`,
/// RFC 9112 section 3.2.2) or HTTP/2's `:authority`, else `Host`.
fn host_of(req: &RequestHeader) -> &[u8] {
    if let Some(authority) = req.uri.authority() {
        return authority.as_str().as_bytes();
    }
    if let Target::Absolute { authority, .. } = Target::of(req.raw_path()) {
        return authority;
    }
    req.headers
        .get("host")
        .map(|h| h.as_bytes())
        .unwrap_or_default()
}

#[async_trait]
impl ProxyHttp for EdgeProxy {
    type CTX = EdgeCtx;

    fn new_ctx(&self) -> EdgeCtx {
        EdgeCtx {
            attempts: Attempts::default(),
            body_bytes: 0,
            start: Instant::now(),
            again: None,
            exchange: None,
        }
    }

    /// Answers the machine paths, then matches the Host; an unknown host gets 404 here, before
    /// any upstream work.
    async fn request_filter(&self, session: &mut Session, ctx: &mut EdgeCtx) -> Result<bool> {
        // An HTTP/1.0 client gets no interim response (RFC 9110 section 15.2), as on the fast
        // path.
        if session.req_header().version == pingora::http::Version::HTTP_10 {
            if let pingora::protocols::http::ServerSession::H1(h1) = session.as_downstream_mut() {
                h1.set_ignore_info_resp(true);
            }
        }
        if self.state.is_draining() {
            // Shutting down: this response says `Connection: close`, and the client moves on
            // to another Machine (or to this one's next process) before the listeners close.
            session.set_keepalive(None);
        }
        let req = session.req_header();
        let uri_len = req.uri.path_and_query().map_or(0, |pq| pq.as_str().len());
        if uri_len > self.limits.max_uri_bytes {
            respond(
                session,
                414,
                "text/plain",
                "request target too long\n".into(),
            )
            .await?;
            return Ok(true);
        }
        let header_bytes: usize = req
            .headers
            .iter()
            .map(|(k, v)| k.as_str().len() + v.len() + 4)
            .sum();
        if header_bytes > self.limits.max_header_bytes {
            respond(
                session,
                431,
                "text/plain",
                "request header fields too large\n".into(),
            )
            .await?;
            return Ok(true);
        }
        // Ambiguous framing is a smuggling vector: refuse it instead of picking a reading. Pingora
        // drops Content-Length when Transfer-Encoding is present, so look at the raw header too.
        let lengths = req
            .headers
            .get_all("content-length")
            .iter()
            .map(|v| v.as_bytes());
        let chunked = req.headers.contains_key("transfer-encoding");
        let raw_has_length = chunked
            && session
                .as_downstream()
                .as_http1()
                .is_some_and(|h1| has_header(&h1.get_headers_raw_bytes(), b"content-length"));
        let framing = if raw_has_length || (chunked && req.headers.contains_key("content-length")) {
            Some("Content-Length beside Transfer-Encoding")
        } else {
            content_length_refusal(lengths)
        };
        if let Some(why) = framing {
            session.set_keepalive(None);
            respond(
                session,
                400,
                "text/plain",
                format!("ambiguous message framing: {why}\n"),
            )
            .await?;
            return Ok(true);
        }
        // Only a path, or an http(s) URI whose authority then names the host, can be passed on.
        let req = session.req_header();
        let target_refused = match Target::of(req.raw_path()) {
            Target::Origin => false,
            Target::Absolute { authority, .. } => authority.is_empty(),
            Target::Refused => true,
        };
        if target_refused {
            respond(
                session,
                400,
                "text/plain",
                "the request target is neither a path nor an http or https URI with a host\n"
                    .into(),
            )
            .await?;
            return Ok(true);
        }
        let req = session.req_header();
        if let Some(limit) = self.limits.max_body_bytes {
            if declares_more_than(req, limit) {
                respond(
                    session,
                    413,
                    "text/plain",
                    "request body too large\n".into(),
                )
                .await?;
                return Ok(true);
            }
        }
        let path = session.req_header().uri.path();
        if path == "/.ployz/health" {
            let loaded = self.routes.table().load().generation() > 0;
            let (status, body) = self.state.health(loaded);
            respond(session, status, "application/json", body).await?;
            return Ok(true);
        }
        if path == "/.ployz/verify" {
            let (status, body) = match self.state.machine_id.get() {
                Some(id) => (200, id.clone()),
                None => (503, "this Machine is not initialised\n".to_owned()),
            };
            respond(session, status, "text/plain", body).await?;
            return Ok(true);
        }
        // HTTP-01 challenges, for any Host; a token this Cluster did not issue goes on to the
        // Service (which may run its own ACME client).
        if !is_tls(session) {
            if let Some(body) = ployz_store::certificates::token_from_path(path)
                .and_then(|token| self.challenges.response(token))
            {
                respond(session, 200, "text/plain", body).await?;
                return Ok(true);
            }
        }
        if !crate::route_table::valid_host(host_of(session.req_header())) {
            respond(
                session,
                400,
                "text/plain",
                "the Host header is not a host name or address with an optional port\n".into(),
            )
            .await?;
            return Ok(true);
        }
        let table = self.routes.table().load();
        let target = session
            .req_header()
            .uri
            .path_and_query()
            .map_or("/", |pq| pq.as_str());
        let found = table
            .match_hostname(host_of(session.req_header()))
            .map(|h| h.route_for(target.as_bytes()).cloned());
        // A participating Machine's edge before its first table from the store: the host is
        // not known to be unknown yet.
        let starting = table.generation() == 0 && self.state.machine_id.get().is_some();
        drop(table);
        if let Some(Some(route)) = &found {
            let client = session
                .client_addr()
                .and_then(|a| a.as_inet())
                .map(|a| a.ip());
            if route.allow.is_some() && !client.is_some_and(|ip| route.admits(ip)) {
                respond(
                    session,
                    403,
                    "text/plain",
                    "this path admits only some client addresses\n".into(),
                )
                .await?;
                return Ok(true);
            }
            if let Some(limit) = route.policy.as_ref().and_then(|p| p.max_body) {
                if declares_more_than(session.req_header(), limit) {
                    respond(
                        session,
                        413,
                        "text/plain",
                        "request body too large for this path\n".into(),
                    )
                    .await?;
                    return Ok(true);
                }
            }
        }
        match found {
            Some(Some(route)) if route.redirect.is_some() => {
                // The route's own redirect, before any to HTTPS: one hop to where it goes.
                let (status, to) = route.redirect.clone().expect("matched as Some");
                let mut location = to.as_bytes().to_vec();
                crate::route_table::write_target(&mut location, target.as_bytes(), route.strip);
                let mut resp = ResponseHeader::build(status, Some(3))?;
                resp.insert_header("location", location)?;
                resp.insert_header("content-length", "0")?;
                session.write_response_header(Box::new(resp), true).await?;
                Ok(true)
            }
            Some(Some(route)) if route.https && !is_tls(session) && self.https_port.is_some() => {
                // Hostnames served over HTTPS redirect plain HTTP there (the ACME challenge
                // path excepted, so validation over HTTP keeps working).
                if path
                    .strip_prefix("/.well-known/acme-challenge/")
                    .is_some_and(|token| {
                        !token.is_empty()
                            && token
                                .bytes()
                                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                    })
                {
                    ctx.attempts.route = Some(route.clone());
                    return Ok(false);
                }
                let port = match self.https_port {
                    Some(443) | None => String::new(),
                    Some(p) => format!(":{p}"),
                };
                let target = session
                    .req_header()
                    .uri
                    .path_and_query()
                    .map_or("/", |pq| pq.as_str());
                let location = format!("https://{}{port}{target}", route.hostname);
                let mut resp = ResponseHeader::build(308, Some(3))?;
                resp.insert_header("location", location)?;
                resp.insert_header("content-length", "0")?;
                session.write_response_header(Box::new(resp), true).await?;
                Ok(true)
            }
            Some(Some(route)) => {
                if let Some(auth) = route.policy.as_ref().and_then(|p| p.auth.as_ref()) {
                    let field = session
                        .req_header()
                        .headers
                        .get("authorization")
                        .map(|v| v.as_bytes().to_vec());
                    let verdict = self.auth.check(auth, field.as_deref()).await;
                    if verdict != crate::auth::Verdict::Admitted {
                        respond_refused(session, verdict, &auth.realm).await?;
                        return Ok(true);
                    }
                }
                match &route.gate {
                    Some(RouteGate::Maintenance { page }) => {
                        respond(session, 503, "text/html; charset=utf-8", page.to_string()).await?;
                        Ok(true)
                    }
                    Some(RouteGate::Paused { .. }) => {
                        let host = host_of(session.req_header()).to_vec();
                        let target = target.as_bytes().to_vec();
                        match self.wait_while_paused(&host, &target).await {
                            Some(route) => {
                                ctx.attempts.route = Some(route);
                                Ok(false)
                            }
                            None => {
                                respond(session, 404, "text/plain", NO_ROUTE_FOR_PATH.into())
                                    .await?;
                                Ok(true)
                            }
                        }
                    }
                    None => {
                        ctx.attempts.route = Some(route.clone());
                        Ok(false)
                    }
                }
            }
            Some(None) if !crate::route_table::plain_path(path.as_bytes()) => {
                respond(
                    session,
                    400,
                    "text/plain",
                    "the request path is not in its plain form (an encoded letter, digit or /, a . or .. segment, //, a backslash or ;), and this host is routed by path\n".into(),
                )
                .await?;
                Ok(true)
            }
            Some(None) => {
                respond(session, 404, "text/plain", NO_ROUTE_FOR_PATH.into()).await?;
                Ok(true)
            }
            None if starting => {
                let mut resp = own_head(503, "text/plain", ROUTES_NOT_LOADED.len())?;
                resp.insert_header("retry-after", "1")?;
                write_own_answer(
                    session,
                    resp,
                    Bytes::from_static(ROUTES_NOT_LOADED.as_bytes()),
                )
                .await?;
                Ok(true)
            }
            None => {
                respond(
                    session,
                    404,
                    "text/plain",
                    "no Service publishes this host\n".into(),
                )
                .await?;
                Ok(true)
            }
        }
    }

    /// Counts chunked bodies against the limit a Content-Length check cannot see.
    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut EdgeCtx,
    ) -> Result<()> {
        let route_limit = ctx
            .attempts
            .route
            .as_ref()
            .and_then(|r| r.policy.as_ref())
            .and_then(|p| p.max_body);
        let limit = match (self.limits.max_body_bytes, route_limit) {
            (Some(edge), Some(route)) => Some(edge.min(route)),
            (edge, route) => edge.or(route),
        };
        if let (Some(limit), Some(chunk)) = (limit, body.as_ref()) {
            ctx.body_bytes += chunk.len() as u64;
            if ctx.body_bytes > limit {
                return Err(Error::explain(
                    ErrorType::HTTPStatus(413),
                    "request body too large",
                ));
            }
        }
        Ok(())
    }

    /// Picks the upstream: [`EdgeProxy::choose_upstream`].
    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut EdgeCtx,
    ) -> Result<Box<HttpPeer>> {
        // The retry after a dead kept connection keeps the upstream (and its in-flight count).
        let again = ctx.again.take();
        let req = session.req_header();
        let target = req.uri.path_and_query().map_or("/", |pq| pq.as_str());
        match again
            .or_else(|| self.choose_upstream(host_of(req), target.as_bytes(), &mut ctx.attempts))
        {
            Some(addr) => {
                let mut peer = HttpPeer::new(addr, false, String::new());
                peer.options.connection_timeout = Some(self.limits.connect_timeout);
                peer.options.total_connection_timeout = Some(self.limits.connect_timeout);
                if let Some(timeout) = ctx
                    .attempts
                    .route
                    .as_ref()
                    .and_then(|r| r.policy.as_ref())
                    .and_then(|p| p.timeout)
                {
                    peer.options.read_timeout = Some(timeout);
                }
                Ok(Box::new(peer))
            }
            None => Err(Error::explain(
                ErrorType::HTTPStatus(503),
                NO_SERVING_CONTAINER.trim_end(),
            )),
        }
    }

    /// Pingora's policy (an idempotent request may be sent again after a reused connection
    /// failed), sent to the same upstream: it did not fail, its kept connection had closed.
    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut EdgeCtx,
        client_reused: bool,
    ) -> Box<Error> {
        let mut e = e.more_context(format!("Peer: {peer}"));
        let cut = ctx.exchange.take().is_some_and(|r| r.was_cut());
        if !session.req_header().method.is_idempotent() || session.as_ref().retry_buffer_truncated()
        {
            e.set_retry(false);
        } else if cut {
            // Its Machine was observed down: another Serving Container, if nothing of the
            // answer went to the client yet.
            e.set_retry(session.response_written().is_none());
            return e;
        } else {
            e.retry.decide_reuse(client_reused);
        }
        if e.retry() {
            ctx.again = ctx.attempts.last_upstream();
        }
        e
    }

    /// Registers an exchange with a container on another Machine, to be cut when the mesh
    /// observes that Machine down.
    async fn connected_to_upstream(
        &self,
        _session: &mut Session,
        _reused: bool,
        _peer: &HttpPeer,
        fd: std::os::unix::io::RawFd,
        _digest: Option<&pingora::protocols::Digest>,
        ctx: &mut EdgeCtx,
    ) -> Result<()> {
        ctx.exchange = self.register_exchange(&ctx.attempts, fd);
        Ok(())
    }

    /// Answers a request the edge could not get an answer for: Pingora's status (a container
    /// that took longer than its route's timeout is 504), with the route's own page for 502,
    /// 503 and 504 when it has one.
    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut EdgeCtx,
    ) -> pingora::proxy::FailToProxy {
        let code = match e.etype() {
            ErrorType::HTTPStatus(code) => *code,
            ErrorType::ReadTimedout if e.esource() == &pingora::ErrorSource::Upstream => 504,
            _ => match e.esource() {
                pingora::ErrorSource::Upstream => 502,
                pingora::ErrorSource::Downstream => match e.etype() {
                    ErrorType::WriteError | ErrorType::ReadError | ErrorType::ConnectionClosed => 0,
                    _ => 400,
                },
                pingora::ErrorSource::Internal | pingora::ErrorSource::Unset => 500,
            },
        };
        let page = ctx
            .attempts
            .route
            .as_ref()
            .and_then(|r| r.policy.as_ref())
            .and_then(|p| p.error_pages.get(&code).cloned());
        if code > 0 {
            let sent = match page {
                // Nothing of the answer may have been sent yet for a page to replace it.
                Some(page) if session.response_written().is_none() => {
                    respond(session, code, "text/html; charset=utf-8", page.to_string()).await
                }
                // As the fast paths answer: a short text saying what failed.
                None if session.response_written().is_none() => {
                    respond_failure(session, code, e).await
                }
                _ => session.respond_error(code).await,
            };
            if let Err(e) = sent {
                tracing::debug!(error = %e, "the error response could not be sent");
            }
        }
        pingora::proxy::FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut EdgeCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        if self.connect_failed(&ctx.attempts) {
            e.set_retry(true);
        }
        e
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        upstream_request: &mut RequestHeader,
        ctx: &mut EdgeCtx,
    ) -> Result<()> {
        let client = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip().to_string());
        let proto = if is_tls(session) { "https" } else { "http" };
        let downstream = session.req_header();
        // The fields are defined once, as the lines the fast path writes into its upstream
        // head; here they are split back into name and value for Pingora's header map.
        let mut lines = Vec::with_capacity(256);
        write_forwarding(
            &mut lines,
            client.as_deref(),
            downstream
                .headers
                .get_all("x-forwarded-for")
                .iter()
                .map(|v| v.as_bytes()),
            host_of(downstream),
            proto,
        );
        // An absolute-form target goes upstream in origin-form, its authority as `Host`.
        if let Target::Absolute {
            authority,
            path_and_query,
        } = Target::of(downstream.raw_path())
        {
            let mut origin = Vec::with_capacity(path_and_query.len() + 1);
            if path_and_query.first() != Some(&b'/') {
                origin.push(b'/');
            }
            origin.extend_from_slice(path_and_query);
            let authority = authority.to_vec();
            upstream_request.set_raw_path(&origin)?;
            upstream_request.insert_header("host", authority)?;
        }
        // A `strip_prefix` route's container gets the path without the prefix.
        if let Some(strip) = ctx
            .attempts
            .route
            .as_ref()
            .map(|r| r.strip)
            .filter(|s| *s > 0)
        {
            let target = upstream_request.raw_path().to_vec();
            let mut stripped = Vec::with_capacity(target.len());
            crate::route_table::write_target(&mut stripped, &target, strip);
            upstream_request.set_raw_path(&stripped)?;
        }
        // `Content-Length` as plain decimal (leading zeros gone); more than one was refused.
        if let Some(n) = upstream_request
            .headers
            .get("content-length")
            .and_then(|v| parse_content_length(v.as_bytes()))
        {
            let mut value = Vec::with_capacity(20);
            push_decimal(&mut value, n);
            upstream_request.insert_header("content-length", value)?;
        }
        // An HTTP/2 client may split `cookie` into several fields; the HTTP/1.1 upstream gets
        // them joined into one (RFC 9113 section 8.2.3), as on the edge's own HTTP/2 path.
        if downstream.version == pingora::http::Version::HTTP_2
            && upstream_request
                .headers
                .get_all("cookie")
                .iter()
                .nth(1)
                .is_some()
        {
            let mut joined = Vec::new();
            for (i, value) in upstream_request
                .headers
                .get_all("cookie")
                .iter()
                .enumerate()
            {
                if i > 0 {
                    joined.extend_from_slice(b"; ");
                }
                joined.extend_from_slice(value.as_bytes());
            }
            upstream_request.insert_header("cookie", joined)?;
        }
        if !self.limits.forward_underscore_headers {
            let underscored: Vec<_> = upstream_request
                .headers
                .keys()
                .filter(|name| name.as_str().contains('_'))
                .cloned()
                .collect();
            for name in underscored {
                upstream_request.remove_header(&name);
            }
        }
        for line in lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|b| *b == b':').unwrap_or(line.len());
            let name = String::from_utf8_lossy(&line[..colon]).into_owned();
            let value = line.get(colon + 2..).unwrap_or_default().to_vec();
            upstream_request.insert_header(name, value)?;
        }
        // The route's own changes come last; Compose keeps them off the forwarding and
        // framing fields.
        if let Some(headers) = ctx.attempts.route.as_ref().and_then(|r| r.headers.clone()) {
            let rules = &headers.0;
            for name in &rules.remove {
                upstream_request.remove_header(name.as_str());
            }
            for (name, value) in &rules.set {
                upstream_request.insert_header(name.clone(), value.as_str())?;
            }
            for (name, value) in &rules.add {
                upstream_request.append_header(name.clone(), value.as_str())?;
            }
        }
        Ok(())
    }

    /// Hop-by-hop fields of the upstream's answer stay on its connection, as on the fast path:
    /// `Keep-Alive`, `Proxy-Connection` and whatever `Connection` names (but the framing
    /// fields). An upgrade's 101 keeps its `Connection` and `Upgrade`.
    async fn upstream_response_filter(
        &self,
        session: &mut Session,
        upstream_response: &mut ResponseHeader,
        ctx: &mut EdgeCtx,
    ) -> Result<()> {
        // A switch of protocols nobody asked for (an HTTP/2 request cannot ask) would leave
        // the client waiting for ever: 502, as on the fast paths.
        if upstream_response.status == 101 && !session.is_upgrade_req() {
            return Err(Error::explain(
                ErrorType::HTTPStatus(502),
                "101 without an upgrade request",
            ));
        }
        if upstream_response.status.is_informational() {
            return Ok(());
        }

        let nominated: Vec<String> = upstream_response
            .headers
            .get_all("connection")
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .map(|t| String::from_utf8_lossy(t.trim_ascii()).to_ascii_lowercase())
            .filter(|t| !t.is_empty() && t != "content-length" && t != "transfer-encoding")
            .collect();
        for name in nominated.iter().map(String::as_str).chain([
            "connection",
            "keep-alive",
            "proxy-connection",
        ]) {
            upstream_response.remove_header(name);
        }
        if let Some(headers) = ctx.attempts.route.as_ref().and_then(|r| r.headers.clone()) {
            let rules = &headers.1;
            for name in &rules.remove {
                upstream_response.remove_header(name.as_str());
            }
            for (name, value) in &rules.set {
                upstream_response.insert_header(name.clone(), value.as_str())?;
            }
            for (name, value) in &rules.add {
                upstream_response.append_header(name.clone(), value.as_str())?;
            }
        }
        Ok(())
    }

    /// An HTTP/1.0 client cannot read chunked framing: a body without a length reaches it
    /// unframed and ends with the connection, as on the fast path.
    async fn response_filter(
        &self,
        session: &mut Session,
        response: &mut ResponseHeader,
        _ctx: &mut EdgeCtx,
    ) -> Result<()> {
        if session.req_header().version == pingora::http::Version::HTTP_10
            && response.headers.contains_key("transfer-encoding")
        {
            response.remove_header("transfer-encoding");
            response.remove_header("content-length");
            session.set_keepalive(None);
        }
        Ok(())
    }

    /// One access-log line per request: [`EdgeProxy::finish`].
    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut EdgeCtx) {
        let req = session.req_header();
        let status = session
            .response_written()
            .map(|r| r.status.as_u16())
            .unwrap_or(0);
        self.finish(
            Finished {
                method: req.method.as_str(),
                host: host_of(req),
                path: req.uri.path(),
                status,
                start: ctx.start,
                error: e.map(|e| e.to_string()),
            },
            &mut ctx.attempts,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_paths_or_http_uris_and_nothing_else() {
        assert_eq!(Target::of(b"/a?b"), Target::Origin);
        assert_eq!(
            Target::of(b"https://app.test/x?y"),
            Target::Absolute {
                authority: b"app.test",
                path_and_query: b"/x?y"
            }
        );
        assert_eq!(
            Target::of(b"HTTP://app.test:8080"),
            Target::Absolute {
                authority: b"app.test:8080",
                path_and_query: b""
            }
        );
        assert_eq!(
            Target::of(b"http://app.test?q"),
            Target::Absolute {
                authority: b"app.test",
                path_and_query: b"?q"
            }
        );
        for refused in [
            &b"*"[..],
            b"?a",
            b"",
            b"app.test:443",
            b"ftp://app.test/",
            b"http:/app.test/",
            b"a/b",
        ] {
            assert_eq!(
                Target::of(refused),
                Target::Refused,
                "{}",
                String::from_utf8_lossy(refused)
            );
        }
    }

    #[test]
    fn content_length_is_one_decimal_field() {
        let check = |values: &[&[u8]]| content_length_refusal(values.iter().copied());
        assert_eq!(check(&[]), None);
        assert_eq!(check(&[b"5"]), None);
        assert_eq!(check(&[b"05"]), None);
        assert_eq!(check(&[b"00000000000000000000000005"]), None);
        assert!(check(&[b"5,5"]).is_some());
        assert!(check(&[b"5", b"5"]).is_some());
        assert!(check(&[b"+5"]).is_some());
        assert!(check(&[b"5 5"]).is_some());
        assert!(check(&[b""]).is_some());
        assert!(check(&[b"18446744073709551616"]).is_some());
        assert_eq!(parse_content_length(b"0005"), Some(5));
        assert_eq!(parse_content_length(b"0"), Some(0));
        assert_eq!(parse_content_length(b"000"), Some(0));
        assert_eq!(
            parse_content_length(b"18446744073709551615"),
            Some(u64::MAX)
        );
        let mut out = Vec::new();
        for n in [0, 7, 10, 65536, u64::MAX] {
            out.clear();
            push_decimal(&mut out, n);
            assert_eq!(out, n.to_string().as_bytes());
        }
    }

    #[test]
    fn every_forwarded_for_line_is_kept_in_order() {
        let lines: Vec<String> = (0..12).map(|i| format!("10.0.0.{i}")).collect();
        let mut out = Vec::new();
        write_forwarding(
            &mut out,
            Some("192.0.2.1"),
            lines.iter().map(|l| l.as_bytes()).chain([&b"  "[..]]),
            b"a.test",
            "http",
        );
        let text = String::from_utf8(out).unwrap();
        let expected = format!("X-Forwarded-For: {}, 192.0.2.1\r\n", lines.join(", "));
        assert!(text.starts_with(&expected), "{text}");
    }
}
