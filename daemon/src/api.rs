//! The management API: JSON over HTTP, served on the daemon's unix socket.
//!
//! Handlers translate between [`ployz_core::api`] wire types and [`LocalMachine`]; every failure
//! becomes an [`ApiError`] body with a code saying how the caller should react, the framework's
//! own refusals included (a body over [`api::MAX_BODY_BYTES`], unknown fields, a wrong method).
//! [`serve`] holds each connection to a header deadline and the listener to a connection cap.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ployz_core::api::{self, ApiError, ErrorCode, MachineInitRequest, VersionInfo};

use crate::local_machine::{LocalMachine, MachineError};

/// An [`ApiError`] with its HTTP status: what every handler of the API fails with.
pub(crate) struct Failure(StatusCode, ApiError);

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.1.message)
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (self.0, Json(self.1)).into_response()
    }
}

pub(crate) fn failure(
    status: StatusCode,
    code: ErrorCode,
    message: String,
    hint: Option<&str>,
) -> Failure {
    Failure(
        status,
        ApiError {
            code,
            message,
            hint: hint.map(str::to_owned),
        },
    )
}

/// The answer to anything that needs an initialised Machine before `machine init`.
pub(crate) fn not_initialised() -> Failure {
    failure(
        StatusCode::CONFLICT,
        ErrorCode::FailedPrecondition,
        "this Machine is not initialised yet".into(),
        Some("run `ployz machine init` first"),
    )
}

impl From<MachineError> for Failure {
    fn from(e: MachineError) -> Failure {
        use ErrorCode::*;
        let message = e.to_string();
        match e {
            MachineError::AlreadyInitialised { .. } => failure(
                StatusCode::CONFLICT,
                FailedPrecondition,
                message,
                Some("`ployz machine ls` shows it; a Machine is initialised once"),
            ),
            MachineError::NotInitialised => failure(
                StatusCode::CONFLICT,
                FailedPrecondition,
                message,
                Some("run `ployz machine init` first"),
            ),
            MachineError::InvalidName(_) => failure(
                StatusCode::BAD_REQUEST,
                InvalidArgument,
                format!("name: {message}"),
                None,
            ),
            MachineError::Refused { ref fix, .. } => {
                let fix = fix.clone();
                failure(
                    StatusCode::CONFLICT,
                    FailedPrecondition,
                    message,
                    Some(&fix),
                )
            }
            MachineError::NoSuchMember(_) => failure(
                StatusCode::NOT_FOUND,
                NotFound,
                message,
                Some("`ployz machine ls` lists the members and their IDs"),
            ),
            MachineError::UnusableHostname(_) => failure(
                StatusCode::BAD_REQUEST,
                InvalidArgument,
                message,
                Some("give one with --name NAME"),
            ),
            MachineError::Store(ref s) if s.is_io() => failure(
                StatusCode::SERVICE_UNAVAILABLE,
                Unavailable,
                message,
                Some("check the data dir's disk (full or read-only?) and the daemon log"),
            ),
            MachineError::Docker(_) => failure(
                StatusCode::SERVICE_UNAVAILABLE,
                Unavailable,
                message,
                Some("check that dockerd runs and --docker-host points at it"),
            ),
            MachineError::Store(_) | MachineError::Io { .. } => failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                Internal,
                message,
                Some("the daemon log has details"),
            ),
        }
    }
}

/// Runs blocking work (fsyncs, sled) off the async workers.
/// Runs a store operation off the runtime: a failed task is an internal error, a failed store
/// write means the Machine cannot take writes now (503).
pub async fn store_blocking<T: Send + 'static, E: std::fmt::Display + Send + 'static>(
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, Failure> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(|e| {
            failure(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Unavailable,
                e.to_string(),
                None,
            )
        }),
        Err(e) => Err(failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            format!("request handler failed: {e}"),
            None,
        )),
    }
}

/// Runs a Machine operation off the runtime; its error becomes the API's.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, MachineError> + Send + 'static,
) -> Result<T, Failure> {
    match tokio::task::spawn_blocking(f).await {
        Ok(result) => result.map_err(Failure::from),
        Err(e) => Err(failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            format!("request handler failed: {e}"),
            None,
        )),
    }
}

/// A JSON body whose every field is optional: empty means all defaults.
pub(crate) fn parse_body<T: serde::de::DeserializeOwned + Default>(
    body: &Bytes,
) -> Result<T, Failure> {
    if body.is_empty() {
        return Ok(T::default());
    }
    serde_json::from_slice(body).map_err(|e| {
        failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            format!("request body is not valid: {e}"),
            None,
        )
    })
}

async fn version(State(machine): State<Arc<LocalMachine>>) -> Json<VersionInfo> {
    Json(VersionInfo {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        api: api::API_VERSION,
        phase: machine.phase(),
        machine: machine.identity().map(|i| i.id),
    })
}

async fn machine_init(
    State(machine): State<Arc<LocalMachine>>,
    body: Bytes,
) -> Result<Response, Failure> {
    let request: MachineInitRequest = parse_body(&body)?;
    let view =
        blocking(move || machine.init(request.name.as_deref(), request.public_addresses)).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn public_addresses(State(machine): State<Arc<LocalMachine>>) -> Result<Response, Failure> {
    let current = blocking(move || machine.public_addresses()).await?;
    Ok(Json(current).into_response())
}

async fn set_public_addresses(
    State(machine): State<Arc<LocalMachine>>,
    body: Bytes,
) -> Result<Response, Failure> {
    let request: api::SetPublicAddressesRequest = parse_body(&body)?;
    let now = blocking(move || machine.set_public_addresses(request.addresses)).await?;
    Ok(Json(now).into_response())
}

/// What to do when the daemon does not know a path or method: likely a version mismatch.
const VERSIONS_HINT: &str = "the CLI and daemon versions may differ; compare `ployz version`";

async fn not_found() -> Failure {
    failure(
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
        "no such API path".to_owned(),
        Some(VERSIONS_HINT),
    )
}

/// Gives the framework's own refusals (a body that is not the JSON expected or over the body
/// limit, a wrong method, a bad query) the API's error body, as every handler's failures have:
/// they come back as plain text or empty otherwise.
async fn rejections_as_api_errors(
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    use axum::http::header::{ALLOW, CONTENT_TYPE};
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let allow = response.headers().get(ALLOW).cloned();
    let text = match axum::body::to_bytes(response.into_body(), 64 * 1024).await {
        Ok(bytes) => String::from_utf8_lossy(&bytes).trim().to_owned(),
        Err(_) => String::new(),
    };
    let allowed = allow.as_ref().and_then(|a| a.to_str().ok());
    let mut answer = rejection(status, method.as_str(), &path, allowed, &text).into_response();
    if let Some(allow) = allow {
        answer.headers_mut().insert(ALLOW, allow);
    }
    answer
}

/// The API error for a refusal the framework made, from its status and text.
fn rejection(
    status: StatusCode,
    method: &str,
    path: &str,
    allowed: Option<&str>,
    text: &str,
) -> Failure {
    let limit = api::MAX_BODY_BYTES;
    match status {
        StatusCode::PAYLOAD_TOO_LARGE => failure(
            status,
            ErrorCode::InvalidArgument,
            format!(
                "the request body is over the API's body limit of {limit} bytes ({} MiB)",
                limit >> 20
            ),
            Some("send less: a command, environment or config file this large belongs in the image or a volume"),
        ),
        StatusCode::METHOD_NOT_ALLOWED => failure(
            status,
            ErrorCode::InvalidArgument,
            match allowed {
                Some(a) => format!("{method} is not allowed on {path}; it takes {a}"),
                None => format!("{method} is not allowed on {path}"),
            },
            Some(VERSIONS_HINT),
        ),
        StatusCode::NOT_FOUND => failure(
            status,
            ErrorCode::NotFound,
            format!("no such API path: {path}"),
            Some(VERSIONS_HINT),
        ),
        StatusCode::UNSUPPORTED_MEDIA_TYPE => failure(
            status,
            ErrorCode::InvalidArgument,
            "the request body must be JSON, sent with content-type: application/json".to_owned(),
            None,
        ),
        s if s.is_client_error() => {
            let message = if let Some(rest) =
                text.strip_prefix("Failed to deserialize the JSON body into the target type: ")
            {
                format!("request body is not valid: {rest}")
            } else if let Some(rest) = text.strip_prefix("Failed to parse the request body as JSON: ")
            {
                format!("request body is not JSON: {rest}")
            } else if let Some(rest) = text.strip_prefix("Failed to deserialize query string: ") {
                format!("query string is not valid: {rest}")
            } else if text.is_empty() {
                format!("{method} {path} was refused ({status})")
            } else {
                text.to_owned()
            };
            failure(s, ErrorCode::InvalidArgument, message, None)
        }
        s => failure(
            s,
            ErrorCode::Internal,
            if text.is_empty() {
                format!("{method} {path} failed ({status})")
            } else {
                text.to_owned()
            },
            Some("the daemon log has details"),
        ),
    }
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct LookupQuery {
    name: String,
    #[serde(rename = "type", default)]
    qtype: Option<String>,
}

async fn dns_lookup(
    State(dns): State<Option<ployz_dns::DnsController>>,
    axum::extract::Query(q): axum::extract::Query<LookupQuery>,
) -> Result<Response, Failure> {
    let Some(dns) = dns else {
        return Err(failure(
            StatusCode::CONFLICT,
            ErrorCode::Unavailable,
            "the internal DNS is off on this Machine".to_owned(),
            Some("start the daemon with --dns-listen gateway (the default) or ADDR:PORT"),
        ));
    };
    if dns.snapshot().load().generation() == 0 {
        return Err(failure(
            StatusCode::CONFLICT,
            ErrorCode::Unavailable,
            "the internal DNS has no answers yet: this Machine is not initialised".to_owned(),
            Some("run `ployz machine init` first"),
        ));
    }
    let qtype: api::QueryType = q.qtype.as_deref().unwrap_or("A").parse().map_err(|e| {
        failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            format!("type: {e}"),
            Some("use A, AAAA, ANY, TXT... or TYPE<n>"),
        )
    })?;
    let answer = ployz_dns::lookup(&dns.snapshot().load(), &q.name, qtype);
    Ok(Json(answer).into_response())
}

/// The routes this Machine's edge serves now.
async fn edge_routes(State(routes): State<ployz_edge::RouteController>) -> Response {
    Json(routes.view()).into_response()
}

/// The API's routes over one Machine.
pub fn router(
    machine: Arc<LocalMachine>,
    routes: ployz_edge::RouteController,
    dns: Option<ployz_dns::DnsController>,
    mesh: Arc<crate::mesh::MeshView>,
) -> Router {
    Router::new()
        .route(api::paths::VERSION, get(version))
        .route(api::paths::MACHINE_INIT, post(machine_init))
        .route(
            api::paths::MACHINE_PUBLIC_ADDRESSES,
            get(public_addresses).put(set_public_addresses),
        )
        .with_state(machine.clone())
        .merge(crate::cluster_api::router(machine.clone(), mesh.clone()))
        .merge(crate::store_api::router(machine.clone()))
        .merge(crate::gate_api::router(machine.clone()))
        .merge(crate::docker_api::router(machine.clone()))
        .merge(crate::images_api::router(machine.clone(), mesh.clone()))
        .merge(crate::cert_api::router(machine.clone()))
        .merge(
            Router::new()
                .route(api::paths::ROUTES, get(edge_routes))
                .with_state(routes.clone()),
        )
        .merge(crate::drain::drain_router(machine, routes, mesh))
        .merge(
            Router::new()
                .route(api::paths::DNS_LOOKUP, get(dns_lookup))
                .with_state(dns),
        )
        .fallback(not_found)
}

/// The API's limits and error bodies around every route of `app`, the framework's refusals
/// included: the body limit ([`api::MAX_BODY_BYTES`]) and [`rejections_as_api_errors`]. Applied
/// last, once every route is in.
pub fn with_api_errors(app: Router) -> Router {
    app.layer(axum::extract::DefaultBodyLimit::max(api::MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn(rejections_as_api_errors))
}

/// How many connections the management API serves at once. More wait in the listen backlog
/// until one ends: a descriptor each is never held beyond this.
pub const MAX_CONNECTIONS: usize = 256;

/// How long in-flight requests may take once shutdown begins (a followed log never ends).
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// The routes whose body is streamed to them as it arrives, of any length: an image sent to
/// this Machine. Its bytes must keep coming: a pause longer than the body deadline ends it.
const STREAMED_BODIES: &[&str] = &[ployz_core::api::docker_paths::IMAGE_LOAD];

/// `request` with a body that fails when no byte arrives for `idle` (a sender that stalls
/// does not hold a connection slot for ever).
fn idle_bounded(
    request: axum::extract::Request,
    idle: std::time::Duration,
) -> axum::extract::Request {
    use futures_util::StreamExt as _;
    let (parts, body) = request.into_parts();
    let stream =
        futures_util::stream::unfold(body.into_data_stream(), move |mut data| async move {
            match tokio::time::timeout(idle, data.next()).await {
                Ok(Some(item)) => Some((item.map_err(std::io::Error::other), data)),
                Ok(None) => None,
                Err(_) => Some((
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no byte of the body for {} s", idle.as_secs()),
                    )),
                    data,
                )),
            }
        });
    axum::extract::Request::from_parts(parts, axum::body::Body::from_stream(stream))
}

/// The most a request's body may hold: the API's [`api::MAX_BODY_BYTES`], and the replication
/// routes' own [`crate::replication::MAX_BODY_BYTES`] (a batch of about 1 MiB, one larger record
/// alone; served on the mesh listener, to members only).
fn body_limit(path: &str) -> usize {
    use crate::replication::paths;
    if path == paths::PUSH || path == paths::PULL {
        crate::replication::MAX_BODY_BYTES
    } else {
        api::MAX_BODY_BYTES
    }
}

/// Reads a request's whole body within `deadline` before the route sees it (every body the API
/// takes is a small JSON document): a client that sends a head and then trickles or withholds
/// its body gets 408 and its connection closed instead of holding a connection slot.
async fn body_within(
    deadline: std::time::Duration,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if STREAMED_BODIES.contains(&request.uri().path()) {
        return next.run(idle_bounded(request, deadline)).await;
    }
    let (method, path) = (request.method().clone(), request.uri().path().to_owned());
    // Peers come over TCP (the mesh listener); the unix socket serves no replication.
    let over_tcp = request
        .extensions()
        .get::<ConnectedFrom<std::net::SocketAddr>>()
        .is_some();
    let limit = if over_tcp {
        body_limit(&path)
    } else {
        api::MAX_BODY_BYTES
    };
    let too_large = || {
        let mut refused = rejection(
            StatusCode::PAYLOAD_TOO_LARGE,
            method.as_str(),
            &path,
            None,
            "",
        );
        if limit != api::MAX_BODY_BYTES {
            refused = failure(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::InvalidArgument,
                format!("the request body is over {path}'s limit of {limit} bytes"),
                None,
            );
        }
        refused
    };
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let (parts, body) = request.into_parts();
    let refused = if declared.is_some_and(|n| n > limit as u64) {
        too_large()
    } else {
        // One byte over the limit is enough to know it is over (a body without a length).
        let read = axum::body::to_bytes(body, limit + 1);
        match tokio::time::timeout(deadline, read).await {
            Ok(Ok(bytes)) if bytes.len() <= limit => {
                return next
                    .run(axum::extract::Request::from_parts(
                        parts,
                        axum::body::Body::from(bytes),
                    ))
                    .await;
            }
            Ok(Ok(_)) => too_large(),
            Ok(Err(e)) if e.to_string().contains("length limit exceeded") => too_large(),
            Ok(Err(e)) => failure(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidArgument,
                format!("the request body could not be read: {e}"),
                None,
            ),
            Err(_) => failure(
                StatusCode::REQUEST_TIMEOUT,
                ErrorCode::InvalidArgument,
                format!(
                    "the request body did not arrive within {} s",
                    deadline.as_secs()
                ),
                Some("send the whole body with the request"),
            ),
        }
    };
    let mut answer = refused.into_response();
    answer.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    answer
}

/// The address a request's connection came from (a request extension [`serve`] sets).
#[derive(Debug, Clone)]
pub(crate) struct ConnectedFrom<A>(pub A);

/// Serves `app` on `listener` until `shutdown`: HTTP/1.1, at most `max_connections` at once, and
/// each connection closed when a request head (or the next one, on a kept-alive connection) is
/// not complete within `header_timeout`, or its body within twice that. Answers carry `Keep-Alive: timeout=N` so a client
/// knows when to open a new connection rather than reuse an idle one.
pub(crate) async fn serve<L>(
    mut listener: L,
    app: Router,
    header_timeout: std::time::Duration,
    max_connections: usize,
    mut shutdown: tokio::sync::watch::Receiver<bool>,
) where
    L: axum::serve::Listener,
    L::Addr: Clone + Send + Sync + 'static,
{
    let keep_alive =
        axum::http::HeaderValue::from_str(&format!("timeout={}", header_timeout.as_secs().max(1)))
            .expect("digits are a header value");
    let body_deadline = header_timeout * 2;
    let app = app.layer(axum::middleware::from_fn(
        move |request: axum::extract::Request, next: axum::middleware::Next| {
            body_within(body_deadline, request, next)
        },
    ));
    let app = app.layer(axum::middleware::map_response(move |mut r: Response| {
        let keep_alive = keep_alive.clone();
        async move {
            r.headers_mut().insert(
                axum::http::header::HeaderName::from_static("keep-alive"),
                keep_alive,
            );
            r
        }
    }));
    let slots = Arc::new(tokio::sync::Semaphore::new(max_connections));
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let mut connections = tokio::task::JoinSet::new();
    let mut reported_full = false;
    loop {
        while connections.try_join_next().is_some() {}
        let slot = match slots.clone().try_acquire_owned() {
            Ok(slot) => {
                reported_full = false;
                slot
            }
            Err(_) => {
                if !reported_full {
                    tracing::warn!(
                        max_connections,
                        "the management API serves as many connections as it takes; more wait to be accepted"
                    );
                    reported_full = true;
                }
                tokio::select! {
                    _ = shutdown.changed() => break,
                    slot = slots.clone().acquire_owned() => match slot {
                        Ok(slot) => slot,
                        Err(_) => break,
                    },
                }
            }
        };
        let (io, from) = tokio::select! {
            _ = shutdown.changed() => break,
            accepted = listener.accept() => accepted,
        };
        let service =
            hyper_util::service::TowerToHyperService::new(tower::ServiceExt::map_request(
                app.clone(),
                move |mut r: hyper::Request<hyper::body::Incoming>| {
                    r.extensions_mut().insert(ConnectedFrom(from.clone()));
                    r
                },
            ));
        let mut stopping = stopping.clone();
        connections.spawn(async move {
            let _slot = slot;
            let mut http = hyper::server::conn::http1::Builder::new();
            http.timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(header_timeout);
            let connection = http.serve_connection(hyper_util::rt::TokioIo::new(io), service);
            tokio::pin!(connection);
            tokio::select! {
                _ = connection.as_mut() => {}
                _ = stopping.changed() => {
                    connection.as_mut().graceful_shutdown();
                    let _ = connection.await;
                }
            }
        });
    }
    let _ = stop.send(true);
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::info!(
            left = connections.len(),
            "management API connections still open at shutdown were closed"
        );
    }
}
