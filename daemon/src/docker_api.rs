//! The management API's Docker operations on this Machine: the Deploy Snapshot and the
//! primitives a Deploy executes (run, stop, start, remove, hooks, volumes, logs, exec).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use ployz_core::api::{
    docker_paths as paths, ErrorCode, ExecRequest, MachineView, RunContainerRequest,
    RunHookRequest, StopContainerRequest,
};
use ployz_core::{MachineSnapshot, MembershipObservation, VolumeSpec};
use ployz_orchestrator::docker::{DockerError, MachineDocker};
use serde::Deserialize;

use crate::api::{failure, not_initialised, Failure};
use crate::local_machine::LocalMachine;

impl From<DockerError> for Failure {
    fn from(e: DockerError) -> Failure {
        let message = e.to_string();
        match e {
            DockerError::Unreachable(_) => failure(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Unavailable,
                message,
                None,
            ),
            DockerError::NoSuchContainer(_) => {
                failure(StatusCode::NOT_FOUND, ErrorCode::NotFound, message, None)
            }
            DockerError::ImageUnavailable { .. } | DockerError::NetworkConflict { .. } => failure(
                StatusCode::CONFLICT,
                ErrorCode::FailedPrecondition,
                message,
                None,
            ),
            _ => failure(
                StatusCode::BAD_GATEWAY,
                ErrorCode::Internal,
                message,
                Some("Docker refused the request; the daemon log has details"),
            ),
        }
    }
}

fn docker(machine: &LocalMachine) -> Result<MachineDocker, Failure> {
    machine.docker().ok_or_else(not_initialised)
}

/// A JSON body whose every field is optional: empty means all defaults.
fn optional_body<T: serde::de::DeserializeOwned + Default>(body: &Bytes) -> Result<T, Failure> {
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

fn checked_id(id: &str) -> Result<&str, Failure> {
    if id.is_empty() || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            format!("'{id}' is not a Container ID"),
            Some("resolve names and prefixes with `GET /v1/containers` first"),
        ));
    }
    Ok(id)
}

async fn snapshot(
    State(machine): State<Arc<LocalMachine>>,
) -> Result<Json<MachineSnapshot>, Failure> {
    let d = docker(&machine)?;
    let info = machine.info().expect("initialised when docker exists");
    d.ensure_network().await?;
    Ok(Json(MachineSnapshot {
        machine: MachineView {
            info,
            membership: MembershipObservation::Up,
        },
        containers: d.observe().await?,
        volumes: d.volumes().await?,
        images: d.images().await?,
    }))
}

async fn list_containers(State(machine): State<Arc<LocalMachine>>) -> Result<Response, Failure> {
    Ok(Json(docker(&machine)?.observe().await?).into_response())
}

async fn stored_containers(State(machine): State<Arc<LocalMachine>>) -> Result<Response, Failure> {
    let store = machine.store().ok_or_else(not_initialised)?;
    let list = tokio::task::spawn_blocking(move || {
        ployz_orchestrator::observer::stored_observations(&store)
    })
    .await
    .unwrap_or_default();
    Ok(Json(list).into_response())
}

async fn run_container(
    State(machine): State<Arc<LocalMachine>>,
    Json(req): Json<RunContainerRequest>,
) -> Result<Response, Failure> {
    let c = docker(&machine)?
        .run_service_container(&req.service_id, &req.spec)
        .await?;
    tracing::info!(container = %c.name, service = %c.service_name, "service container started");
    Ok((StatusCode::CREATED, Json(c)).into_response())
}

async fn get_container(
    State(machine): State<Arc<LocalMachine>>,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    match docker(&machine)?
        .observe_container(checked_id(&id)?)
        .await?
    {
        Some(c) => Ok(Json(c).into_response()),
        None => Err(DockerError::NoSuchContainer(id).into()),
    }
}

async fn start_container(
    State(machine): State<Arc<LocalMachine>>,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    docker(&machine)?.start(checked_id(&id)?).await?;
    // A container stopped after a drain serves again once started.
    if let (Some(store), Ok(container)) = (machine.store(), id.parse::<ployz_core::ContainerId>()) {
        lift_drain_mark(&store, &container).await;
    }
    Ok(Json(serde_json::json!({})).into_response())
}

async fn stop_container(
    State(machine): State<Arc<LocalMachine>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, Failure> {
    let req: StopContainerRequest = optional_body(&body)?;
    docker(&machine)?
        .stop(
            checked_id(&id)?,
            req.timeout_seconds.map(Duration::from_secs),
        )
        .await?;
    Ok(Json(serde_json::json!({})).into_response())
}

async fn remove_container(
    State(machine): State<Arc<LocalMachine>>,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    docker(&machine)?.remove(checked_id(&id)?).await?;
    if let (Some(store), Ok(container)) = (machine.store(), id.parse::<ployz_core::ContainerId>()) {
        lift_drain_mark(&store, &container).await;
    }
    tracing::info!(container = %id, "container removed");
    Ok(Json(serde_json::json!({})).into_response())
}

#[derive(Deserialize)]
struct LogsQuery {
    tail: Option<usize>,
    #[serde(default)]
    follow: bool,
    since: Option<i64>,
    until: Option<i64>,
}

async fn logs(
    State(machine): State<Arc<LocalMachine>>,
    Path(id): Path<String>,
    Query(q): Query<LogsQuery>,
) -> Result<Response, Failure> {
    let d = docker(&machine)?;
    let id = checked_id(&id)?.to_owned();
    if d.observe_container(&id).await?.is_none() {
        return Err(DockerError::NoSuchContainer(id).into());
    }
    let stream = d
        .log_stream(&id, q.follow, q.tail, q.since, q.until)
        .await?
        .map(|item| item.map_err(std::io::Error::other));
    Ok(Response::builder()
        .header("content-type", "text/plain; charset=utf-8")
        .body(Body::from_stream(stream))
        .expect("a valid response"))
}

async fn exec(
    State(machine): State<Arc<LocalMachine>>,
    Path(id): Path<String>,
    Json(req): Json<ExecRequest>,
) -> Result<Response, Failure> {
    if req.command.is_empty() {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            "command: empty; give the command to run".into(),
            None,
        ));
    }
    let result = docker(&machine)?
        .exec(checked_id(&id)?, req.command)
        .await?;
    Ok(Json(result).into_response())
}

async fn run_hook(
    State(machine): State<Arc<LocalMachine>>,
    Json(req): Json<RunHookRequest>,
) -> Result<Response, Failure> {
    let result = docker(&machine)?
        .run_hook(&req.service_id, &req.spec, &req.hook)
        .await?;
    tracing::info!(service = %req.spec.name, exit_code = ?result.exit_code, "pre-deploy hook ended");
    Ok(Json(result).into_response())
}

async fn list_volumes(State(machine): State<Arc<LocalMachine>>) -> Result<Response, Failure> {
    Ok(Json(docker(&machine)?.volumes().await?).into_response())
}

async fn create_volume(
    State(machine): State<Arc<LocalMachine>>,
    Json(spec): Json<VolumeSpec>,
) -> Result<Response, Failure> {
    let v = docker(&machine)?.create_volume(&spec).await?;
    Ok((StatusCode::CREATED, Json(v)).into_response())
}

#[derive(Deserialize)]
struct RemoveVolumeQuery {
    #[serde(default)]
    force: bool,
}

async fn remove_volume(
    State(machine): State<Arc<LocalMachine>>,
    Path(name): Path<String>,
    Query(q): Query<RemoveVolumeQuery>,
) -> Result<Response, Failure> {
    docker(&machine)?.remove_volume(&name, q.force).await?;
    Ok(Json(serde_json::json!({})).into_response())
}

/// The Docker routes over one Machine.
pub fn router(machine: Arc<LocalMachine>) -> Router {
    Router::new()
        .route(paths::SNAPSHOT, get(snapshot))
        .route(paths::CONTAINERS, get(list_containers).post(run_container))
        .route(paths::STORED_CONTAINERS, get(stored_containers))
        .route(
            paths::CONTAINER,
            get(get_container).delete(remove_container),
        )
        .route(paths::CONTAINER_START, post(start_container))
        .route(paths::CONTAINER_STOP, post(stop_container))
        .route(paths::CONTAINER_LOGS, get(logs))
        .route(paths::CONTAINER_EXEC, post(exec))
        .route(paths::HOOKS, post(run_hook))
        .route(paths::VOLUMES, get(list_volumes).post(create_volume))
        .route(paths::VOLUME, delete(remove_volume))
        .with_state(machine)
}

/// What the drain route needs: this Machine and its edge's route controller.
#[derive(Clone)]
struct DrainState {
    machine: Arc<LocalMachine>,
    routes: ployz_edge::RouteController,
}

/// How long the edge may take to publish a table without the drained container.
const PUBLISH_WAIT: Duration = Duration::from_secs(5);

/// How long a drain waits for in-flight requests: what the request asks, else the container's
/// `stop_grace_period` (a request it would be given time to finish after SIGTERM deserves the
/// same time before it), else 30 s; at most an hour whatever was asked.
fn drain_timeout(
    asked: Option<u64>,
    container: &ployz_core::ContainerRuntimeObservation,
) -> Duration {
    let grace = container
        .spec
        .as_ref()
        .and_then(|s| s.container.stop_grace_period_ms)
        .map(Duration::from_millis);
    asked
        .map(Duration::from_secs)
        .or(grace)
        .unwrap_or(Duration::from_secs(30))
        .min(Duration::from_secs(3600))
}

async fn drain(
    State(s): State<DrainState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, Failure> {
    let req: ployz_core::api::DrainRequest = optional_body(&body)?;
    let d = docker(&s.machine)?;
    let store = s.machine.store().expect("initialised when docker exists");
    let Some(container) = d.observe_container(checked_id(&id)?).await? else {
        return Err(DockerError::NoSuchContainer(id).into());
    };
    let started = tokio::time::Instant::now();
    // Bring the store up to date with Docker first, so the replacement this drain makes room for
    // is known healthy before the old one leaves the table.
    if let Err(e) = ployz_orchestrator::observer::resync(&d, &store).await {
        tracing::warn!(error = %e, "resync before drain failed");
    }
    let key = ployz_edge::draining_key(store.local(), &container.id);
    let mark_store = store.clone();
    crate::api::store_blocking(move || mark_store.put(&key, Vec::new())).await?;

    // Hostnames another Serving Container still serves must keep an upstream meanwhile.
    let hostnames: Vec<String> = container
        .spec
        .iter()
        .flat_map(|spec| spec.ports.iter())
        .filter_map(|p| match p {
            ployz_core::PortSpec::Ingress {
                hostname: Some(h), ..
            } => Some(h.to_ascii_lowercase()),
            _ => None,
        })
        .collect();
    let others: Vec<String> = {
        let observations = ployz_orchestrator::observer::stored_observations(&store);
        hostnames
            .into_iter()
            .filter(|h| {
                observations.iter().any(|o| {
                    o.id != container.id
                        && o.is_serving()
                        && o.spec.as_ref().is_some_and(|spec| {
                            spec.ports.iter().any(|p| matches!(p, ployz_core::PortSpec::Ingress { hostname: Some(x), .. } if x.eq_ignore_ascii_case(h)))
                        })
                })
            })
            .collect()
    };
    let publish_deadline = started + PUBLISH_WAIT;
    loop {
        let table = s.routes.table().load();
        let ready = !table.routes_to(&container.id) && others.iter().all(|h| table.has_upstream(h));
        if ready || tokio::time::Instant::now() >= publish_deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let drain_deadline = started + drain_timeout(req.timeout_seconds, &container);
    let mut left = s.routes.in_flight(&container.id);
    while left > 0 && tokio::time::Instant::now() < drain_deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
        left = s.routes.in_flight(&container.id);
    }
    let waited_ms = started.elapsed().as_millis() as u64;
    tracing::info!(container = %container.name, waited_ms, in_flight_left = left, "container drained");
    Ok(Json(ployz_core::api::DrainResult {
        waited_ms,
        in_flight_left: left,
    })
    .into_response())
}

async fn undrain(State(s): State<DrainState>, Path(id): Path<String>) -> Result<Response, Failure> {
    let store = s.machine.store().ok_or_else(not_initialised)?;
    let container: ployz_core::ContainerId = checked_id(&id)?.parse().map_err(|_| {
        failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            format!("'{id}' is not a Container ID"),
            None,
        )
    })?;
    lift_drain_mark(&store, &container).await;
    Ok(Json(serde_json::json!({})).into_response())
}

/// Deletes a container's drain mark, if it has one.
async fn lift_drain_mark(store: &Arc<ployz_store::Store>, container: &ployz_core::ContainerId) {
    let key = ployz_edge::draining_key(store.local(), container);
    let store = store.clone();
    let _ = tokio::task::spawn_blocking(move || {
        if store.get(&key).ok().flatten().is_some_and(|r| !r.tombstone) {
            let _ = store.delete(&key);
        }
    })
    .await;
}

/// The drain routes: they need the edge's route controller as well as the Machine.
pub fn drain_router(machine: Arc<LocalMachine>, routes: ployz_edge::RouteController) -> Router {
    Router::new()
        .route(paths::CONTAINER_DRAIN, post(drain).delete(undrain))
        .with_state(DrainState { machine, routes })
}
