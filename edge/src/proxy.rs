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

/// Per-request state: the matched route and the upstreams tried.
pub struct EdgeCtx {
    route: Option<Arc<Route>>,
    /// Request body bytes seen so far.
    body_bytes: u64,
    /// The in-flight counter of the upstream this request currently holds.
    active: Option<Arc<std::sync::atomic::AtomicUsize>>,
    tried: [usize; MAX_TRIES],
    tries: usize,
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
            route: None,
            body_bytes: 0,
            active: None,
            tried: [usize::MAX; MAX_TRIES],
            tries: 0,
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
        let table = self.routes.table().load();
        match table.match_host(host_of(session.req_header())) {
            Some(route) if route.https && !is_tls(session) && self.https_port.is_some() => {
                // Hostnames served over HTTPS redirect plain HTTP there (the ACME challenge
                // path excepted, so validation over HTTP keeps working).
                if path.starts_with("/.well-known/acme-challenge/") {
                    ctx.route = Some(route.clone());
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
                ctx.route = Some(route.clone());
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

    /// Picks the upstream. The pick is confirmed against the table published after the
    /// in-flight counter went up: if a new table (say, one without a draining container) was
    /// published in between, the pick is undone and made again from the new table, so a drain
    /// that saw no request in flight never has one arrive afterwards.
    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut EdgeCtx,
    ) -> Result<Box<HttpPeer>> {
        let mut table = self.routes.table().load_full();
        for round in 0..3 {
            let route = match table.match_host(host_of(session.req_header())) {
                Some(r) => r.clone(),
                None => {
                    return Err(Error::explain(
                        ErrorType::HTTPStatus(503),
                        "no Serving Container for this host",
                    ))
                }
            };
            if !ctx.route.as_ref().is_some_and(|r| Arc::ptr_eq(r, &route)) {
                // Indices of another table's route mean nothing here.
                ctx.tried = [usize::MAX; MAX_TRIES];
                ctx.route = Some(route.clone());
            }
            let tried = &ctx.tried[..ctx.tries];
            let Some(i) = route.pick(self.now_ms(), tried) else {
                return Err(Error::explain(
                    ErrorType::HTTPStatus(503),
                    "no Serving Container for this host",
                ));
            };
            let upstream = &route.upstreams[i];
            upstream.in_flight.fetch_add(1, Ordering::SeqCst);
            let now = self.routes.table().load_full();
            if round < 2 && !Arc::ptr_eq(&now, &table) {
                upstream.in_flight.fetch_sub(1, Ordering::SeqCst);
                table = now;
                continue;
            }
            if ctx.tries < MAX_TRIES {
                ctx.tried[ctx.tries] = i;
                ctx.tries += 1;
            }
            if let Some(previous) = ctx.active.replace(upstream.in_flight.clone()) {
                previous.fetch_sub(1, Ordering::SeqCst);
            }
            return Ok(Box::new(HttpPeer::new(upstream.addr, false, String::new())));
        }
        unreachable!("the last round always returns")
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut EdgeCtx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        if let (Some(route), Some(&last)) = (&ctx.route, ctx.tried[..ctx.tries].last()) {
            route.mark_failed(last, self.now_ms() + FAILURE_WINDOW_MS);
            // Nothing was sent yet, so any request may go to the next upstream.
            if ctx.tries < MAX_TRIES && ctx.tries < route.upstreams.len() {
                e.set_retry(true);
            }
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
        let host = String::from_utf8_lossy(host_of(session.req_header())).into_owned();
        let proto = if is_tls(session) { "https" } else { "http" };
        if let Some(ip) = &client {
            let xff = match upstream_request.headers.get("x-forwarded-for") {
                Some(prev) => format!("{}, {ip}", String::from_utf8_lossy(prev.as_bytes())),
                None => ip.clone(),
            };
            upstream_request.insert_header("x-forwarded-for", xff)?;
            let for_value = if ip.contains(':') {
                format!("\"[{ip}]\"")
            } else {
                ip.clone()
            };
            upstream_request.insert_header(
                "forwarded",
                format!("for={for_value};host=\"{host}\";proto={proto}"),
            )?;
        }
        upstream_request.insert_header("x-forwarded-proto", proto)?;
        upstream_request.insert_header("x-forwarded-host", host)?;
        Ok(())
    }

    /// One access-log line per request: no bodies, credentials, cookies or query strings.
    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut EdgeCtx) {
        if let Some(active) = ctx.active.take() {
            active.fetch_sub(1, Ordering::SeqCst);
        }
        let req = session.req_header();
        let status = session
            .response_written()
            .map(|r| r.status.as_u16())
            .unwrap_or(0);
        let elapsed = ctx.start.elapsed().as_secs_f64();
        self.metrics
            .observe(status, elapsed, e.is_some() && ctx.tries > 0);
        if !self.limits.access_log {
            return;
        }
        let upstream = match (&ctx.route, ctx.tries) {
            (Some(r), n) if n > 0 => r
                .upstreams
                .get(ctx.tried[n - 1])
                .map(|u| u.addr.to_string())
                .unwrap_or_default(),
            _ => String::new(),
        };
        tracing::info!(
            target: "ployz::access",
            method = %req.method,
            host = %String::from_utf8_lossy(host_of(req)),
            path = req.uri.path(),
            status,
            upstream,
            tries = ctx.tries,
            ms = elapsed * 1000.0,
            error = e.map(|e| e.to_string()).unwrap_or_default(),
        );
    }
}
