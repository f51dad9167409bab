//! The edge's Pingora proxy: machine paths, host routing, round robin with connect retries,
//! forwarding headers and one access-log line per request.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use async_trait::async_trait;
use bytes::Bytes;
use pingora::http::{RequestHeader, ResponseHeader};
use pingora::prelude::*;
use pingora::proxy::{ProxyHttp, Session};

use crate::route_table::Route;
use crate::RouteController;

/// How many upstreams one request may try to connect to.
const MAX_TRIES: usize = 3;
/// How long an upstream that refused a connection is avoided.
const FAILURE_WINDOW_MS: u64 = 10_000;

/// What the health endpoint reports, shared with the daemon.
#[derive(Debug, Default)]
pub struct EdgeState {
    /// This Machine's ID once it participates; `None` before `machine init`.
    machine_id: OnceLock<String>,
    /// Set on shutdown: health answers 503 while requests are still served.
    draining: AtomicBool,
}

impl EdgeState {
    pub fn set_participating(&self, machine_id: &str) {
        let _ = self.machine_id.set(machine_id.to_owned());
    }

    pub fn set_draining(&self) {
        self.draining.store(true, Ordering::Relaxed);
    }

    /// (HTTP status, JSON body) of the health endpoint.
    pub fn health(&self) -> (u16, String) {
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
            (Some(id), false) => (
                200,
                format!(r#"{{"status":"serving","machine_id":"{id}"}}"#),
            ),
        }
    }
}

/// Request limits the edge enforces before any upstream work.
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
}

impl Default for EdgeLimits {
    fn default() -> Self {
        EdgeLimits {
            max_header_bytes: 16 * 1024,
            max_uri_bytes: 8 * 1024,
            max_body_bytes: None,
            access_log: true,
            header_timeout: std::time::Duration::from_secs(15),
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
    /// Milliseconds are measured from here (cheap, monotonic).
    epoch: Instant,
    /// Pending HTTP-01 challenges, answered on the plain-HTTP listener for any Host.
    challenges: crate::ChallengeResponder,
}

/// The upstreams one request has tried, and the in-flight counter it holds. Both request paths
/// (Pingora's and the fast path) choose upstreams through [`EdgeProxy::choose_upstream`].
pub(crate) struct Attempts {
    route: Option<Arc<Route>>,
    /// The in-flight counter of the upstream this request currently holds.
    active: Option<Arc<std::sync::atomic::AtomicUsize>>,
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
    pub(crate) fn last_upstream(&self) -> Option<std::net::SocketAddr> {
        let route = self.route.as_ref()?;
        let last = *self.tried[..self.tries].last()?;
        route.upstreams.get(last).map(|u| u.addr)
    }

    /// Gives back the in-flight count this request holds (the request is over).
    pub(crate) fn release(&mut self) {
        if let Some(active) = self.active.take() {
            active.fetch_sub(1, Ordering::SeqCst);
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
            epoch: Instant::now(),
            challenges: crate::ChallengeResponder::default(),
        }
    }

    /// Answers HTTP-01 challenges from `challenges`.
    pub fn with_challenges(mut self, challenges: crate::ChallengeResponder) -> EdgeProxy {
        self.challenges = challenges;
        self
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// The route table, loaded once.
    pub(crate) fn routes(&self) -> &RouteController {
        &self.routes
    }

    /// The port HTTP requests for HTTPS hostnames are redirected to, if any.
    pub(crate) fn https_port(&self) -> Option<u16> {
        self.https_port
    }

    /// Chooses the next upstream for `host` and takes an in-flight count on it. The pick is
    /// confirmed against the table published after the count went up: if a new table (say,
    /// one without a draining container) was published in between, the pick is undone and made
    /// again from the new table, so a drain that saw no request in flight never has one arrive
    /// afterwards. `None`: no Serving Container is left to try.
    pub(crate) fn choose_upstream(
        &self,
        host: &[u8],
        attempts: &mut Attempts,
    ) -> Option<std::net::SocketAddr> {
        let mut table = self.routes.table().load_full();
        for round in 0..3 {
            let route = table.match_host(host)?.clone();
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
            upstream.in_flight.fetch_add(1, Ordering::SeqCst);
            let now = self.routes.table().load_full();
            if round < 2 && !Arc::ptr_eq(&now, &table) {
                upstream.in_flight.fetch_sub(1, Ordering::SeqCst);
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
/// `host` over `proto`: `X-Forwarded-For` (after `previous`, the values the request carried),
/// `Forwarded`, `X-Forwarded-Proto` and `X-Forwarded-Host`, as `name: value\r\n` lines.
pub(crate) fn write_forwarding(
    out: &mut Vec<u8>,
    client: Option<&str>,
    previous: &[&[u8]],
    host: &[u8],
    proto: &str,
) {
    if let Some(ip) = client {
        out.extend_from_slice(b"X-Forwarded-For: ");
        for p in previous {
            out.extend_from_slice(p);
            out.extend_from_slice(b", ");
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

async fn respond(
    session: &mut Session,
    status: u16,
    content_type: &str,
    body: String,
) -> Result<()> {
    let mut resp = ResponseHeader::build(status, Some(3))?;
    resp.insert_header("content-type", content_type)?;
    resp.insert_header("content-length", body.len().to_string())?;
    resp.insert_header("cache-control", "no-store")?;
    session.write_response_header(Box::new(resp), false).await?;
    session
        .write_response_body(Some(Bytes::from(body)), true)
        .await
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

fn host_of(req: &RequestHeader) -> &[u8] {
    req.headers
        .get("host")
        .map(|h| h.as_bytes())
        .or_else(|| req.uri.host().map(str::as_bytes))
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
        }
    }

    /// Answers the machine paths, then matches the Host; an unknown host gets 404 here, before
    /// any upstream work.
    async fn request_filter(&self, session: &mut Session, ctx: &mut EdgeCtx) -> Result<bool> {
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
        let lengths: Vec<&[u8]> = req
            .headers
            .get_all("content-length")
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        let chunked = req.headers.contains_key("transfer-encoding");
        let raw_has_length = chunked
            && session
                .as_downstream()
                .as_http1()
                .is_some_and(|h1| has_header(&h1.get_headers_raw_bytes(), b"content-length"));
        if raw_has_length
            || (chunked && !lengths.is_empty())
            || lengths.windows(2).any(|w| w[0] != w[1])
        {
            respond(
                session,
                400,
                "text/plain",
                "ambiguous message framing\n".into(),
            )
            .await?;
            return Ok(true);
        }
        let req = session.req_header();
        if let Some(limit) = self.limits.max_body_bytes {
            let declared = req
                .headers
                .get("content-length")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok());
            if declared.is_some_and(|n| n > limit) {
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
            let (status, body) = self.state.health();
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
        match table.match_host(host_of(session.req_header())) {
            Some(route) if route.https && !is_tls(session) && self.https_port.is_some() => {
                // Hostnames served over HTTPS redirect plain HTTP there (the ACME challenge
                // path excepted, so validation over HTTP keeps working).
                if path.starts_with("/.well-known/acme-challenge/") {
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
            Some(route) => {
                ctx.attempts.route = Some(route.clone());
                Ok(false)
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
        if let (Some(limit), Some(chunk)) = (self.limits.max_body_bytes, body.as_ref()) {
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
        match self.choose_upstream(host_of(session.req_header()), &mut ctx.attempts) {
            Some(addr) => Ok(Box::new(HttpPeer::new(addr, false, String::new()))),
            None => Err(Error::explain(
                ErrorType::HTTPStatus(503),
                "no Serving Container for this host",
            )),
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
        _ctx: &mut EdgeCtx,
    ) -> Result<()> {
        let client = session
            .client_addr()
            .and_then(|a| a.as_inet())
            .map(|a| a.ip().to_string());
        let previous: Vec<&[u8]> = session
            .req_header()
            .headers
            .get_all("x-forwarded-for")
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        let proto = if is_tls(session) { "https" } else { "http" };
        // The fields are defined once, as the lines the fast path writes into its upstream
        // head; here they are split back into name and value for Pingora's header map.
        let mut lines = Vec::with_capacity(256);
        write_forwarding(
            &mut lines,
            client.as_deref(),
            &previous,
            host_of(session.req_header()),
            proto,
        );
        for line in lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let colon = line.iter().position(|b| *b == b':').unwrap_or(line.len());
            let name = String::from_utf8_lossy(&line[..colon]).into_owned();
            let value = line.get(colon + 2..).unwrap_or_default().to_vec();
            upstream_request.insert_header(name, value)?;
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
