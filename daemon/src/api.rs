//! The management API: JSON over HTTP, served on the daemon's unix socket.
//!
//! Handlers translate between [`ployz_core::api`] wire types and [`LocalMachine`]; every failure
//! becomes an [`ApiError`] body with a code saying how the caller should react.

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

async fn blocking<T: Send + 'static>(
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

fn parse_body<T: serde::de::DeserializeOwned + Default>(body: &Bytes) -> Result<T, Failure> {
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
    })
}

async fn machines(State(machine): State<Arc<LocalMachine>>) -> Result<Response, Failure> {
    let list = blocking(move || machine.machines()).await?;
    Ok(Json(list).into_response())
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

async fn not_found() -> Failure {
    failure(
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
        "no such API path".to_owned(),
        Some("the CLI and daemon versions may differ; compare `ployz version`"),
    )
}

#[derive(serde::Deserialize)]
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
    let qtype: ployz_dns::QueryType = q.qtype.as_deref().unwrap_or("A").parse().map_err(|e| {
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

/// The API's routes over one Machine.
pub fn router(
    machine: Arc<LocalMachine>,
    routes: ployz_edge::RouteController,
    dns: Option<ployz_dns::DnsController>,
) -> Router {
    Router::new()
        .route(api::paths::VERSION, get(version))
        .route(api::paths::MACHINES, get(machines))
        .route(api::paths::MACHINE_INIT, post(machine_init))
        .route(
            api::paths::MACHINE_PUBLIC_ADDRESSES,
            get(public_addresses).put(set_public_addresses),
        )
        .with_state(machine.clone())
        .merge(crate::docker_api::router(machine.clone()))
        .merge(crate::cert_api::router(machine.clone()))
        .merge(crate::docker_api::drain_router(machine, routes))
        .merge(
            Router::new()
                .route(api::paths::DNS_LOOKUP, get(dns_lookup))
                .with_state(dns),
        )
        .fallback(not_found)
}
