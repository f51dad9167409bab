//! The management API's Docker operations on this Machine: the Deploy Snapshot and the
//! primitives a Deploy executes (run, stop, start, remove, hooks, volumes, logs, exec).
//!
//! Every route that names a container or a volume acts only on this Machine's: the ID or name
//! is checked against Docker's rules (400 naming the field), then [`MachineDocker`] inspects it
//! and checks its `ployz.machine.id` label before acting (404 for anything else).

use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Extension, Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use axum::{Json, Router};
use futures_util::StreamExt;
use ployz_core::api::{
    docker_paths as paths, ErrorCode, ExecRequest, MachineView, RunContainerRequest,
    RunHookRequest, StopContainerRequest,
};
use ployz_core::{
    HostProtocol, Listener, ListenerRole, MachineSnapshot, MembershipObservation, VolumeSpec,
};
use ployz_orchestrator::docker::{DockerError, MachineDocker, Provenance};
use serde::Deserialize;

use crate::api::{failure, not_initialised, Failure};
use crate::config::{DaemonConfig, DnsListen};
use crate::drain::lift_drain_mark;
use crate::lease::{LeaseCall, MachineLease};
use crate::local_machine::LocalMachine;

impl From<DockerError> for Failure {
    fn from(e: DockerError) -> Failure {
        let message = e.to_string();
        match e {
            DockerError::Unreachable(_) | DockerError::NoAnswer { .. } => failure(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Unavailable,
                message,
                None,
            ),
            DockerError::NoSuchContainer(_) | DockerError::NoSuchVolume(_) => {
                failure(StatusCode::NOT_FOUND, ErrorCode::NotFound, message, None)
            }
            DockerError::InvalidName { .. } => failure(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidArgument,
                message,
                None,
            ),
            DockerError::ImageUnavailable { .. }
            | DockerError::ImageNotLoaded { .. }
            | DockerError::NetworkConflict { .. } => failure(
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

/// A container that could not be created: an image missing here is named with this Machine and
/// how to get it here (a peer that had it was asked first, when the plan named one).
fn creation_failure(machine: &LocalMachine, e: DockerError) -> Failure {
    let DockerError::ImageUnavailable { image, reason } = &e else {
        return e.into();
    };
    let name = machine
        .info()
        .map(|i| i.name.to_string())
        .unwrap_or_else(|| "this Machine".to_owned());
    failure(
        StatusCode::CONFLICT,
        ErrorCode::FailedPrecondition,
        format!("image '{image}' is not on Machine {name} and could not be pulled there: {reason}"),
        Some(&format!(
            "put it on {name}: `ployz image push {image} -m {name}` where the image is, or push it to a registry {name} reaches, then deploy again"
        )),
    )
}

fn docker(machine: &LocalMachine) -> Result<MachineDocker, Failure> {
    machine.docker().ok_or_else(not_initialised)
}

/// A Container ID from a request path, checked before anything reaches Docker (400 naming the
/// field otherwise).
pub(crate) fn checked_id(id: &str) -> Result<&str, Failure> {
    ployz_orchestrator::docker::check_container_id(id)?;
    Ok(id)
}

/// The addresses this daemon listens on, from its configuration: reported in the Deploy
/// Snapshot so a Deploy refuses a host port one of them holds instead of failing in Docker.
#[derive(Debug, Clone)]
pub struct OwnListeners {
    http: std::net::SocketAddr,
    https: std::net::SocketAddr,
    metrics: std::net::SocketAddr,
    dns: DnsListen,
}

impl OwnListeners {
    /// The edge's HTTP and HTTPS listeners, the metrics listener and the internal DNS (unless
    /// it is off) of `config`.
    pub fn from_config(config: &DaemonConfig) -> OwnListeners {
        OwnListeners {
            http: config.http_listen,
            https: config.https_listen,
            metrics: config.metrics_listen,
            dns: config.dns.listen,
        }
    }

    /// The listeners on a Machine whose Machine Gateway is `gateway` (where the internal DNS
    /// listens by default), DNS on both UDP and TCP.
    pub fn listeners(&self, gateway: std::net::Ipv4Addr) -> Vec<Listener> {
        let listener = |role, addr: std::net::SocketAddr, protocol| Listener {
            role,
            address: addr.ip().to_string(),
            port: addr.port(),
            protocol,
        };
        let mut out = vec![
            listener(ListenerRole::EdgeHttp, self.http, HostProtocol::Tcp),
            listener(ListenerRole::EdgeHttps, self.https, HostProtocol::Tcp),
            listener(ListenerRole::Metrics, self.metrics, HostProtocol::Tcp),
        ];
        let dns = match self.dns {
            DnsListen::Gateway => Some(std::net::SocketAddr::new(gateway.into(), 53)),
            DnsListen::At(a) => Some(a),
            DnsListen::Off => None,
        };
        if let Some(dns) = dns {
            out.push(listener(ListenerRole::Dns, dns, HostProtocol::Udp));
            out.push(listener(ListenerRole::Dns, dns, HostProtocol::Tcp));
        }
        out
    }
}

/// The Deploy Snapshot of this Machine. `own` is absent where the router was built without the
/// daemon's configuration (then no listeners are reported).
async fn snapshot(
    State(machine): State<Arc<LocalMachine>>,
    own: Option<Extension<OwnListeners>>,
    lease: Option<Extension<Arc<MachineLease>>>,
) -> Result<Json<MachineSnapshot>, Failure> {
    let d = docker(&machine)?;
    let info = machine.info().expect("initialised when docker exists");
    d.ensure_network().await?;
    let listeners = own
        .map(|Extension(own)| own.listeners(info.subnet.gateway()))
        .unwrap_or_default();
    let image_ids = d.image_tags().await?;
    Ok(Json(MachineSnapshot {
        machine: MachineView {
            info,
            membership: MembershipObservation::Up,
            selected_endpoint: None,
            subnet_collisions: Vec::new(),
        },
        containers: d.observe().await?,
        // Every volume on the engine: a Deploy mounts `external` ones made outside Ployz.
        volumes: d.engine_volumes().await?,
        images: image_ids.keys().cloned().collect(),
        image_ids,
        drains: crate::drain::standing_marks(&machine).await?,
        listeners,
        interrupted: match lease {
            Some(Extension(lease)) => lease.interrupted().await?,
            None => Vec::new(),
        },
    }))
}

async fn list_containers(State(machine): State<Arc<LocalMachine>>) -> Result<Response, Failure> {
    Ok(Json(docker(&machine)?.observe().await?).into_response())
}

async fn stored_containers(State(machine): State<Arc<LocalMachine>>) -> Result<Response, Failure> {
    let store = machine.store().ok_or_else(not_initialised)?;
    let list =
        crate::api::store_blocking(move || ployz_store::observations::stored_observations(&store))
            .await?;
    Ok(Json(list).into_response())
}

async fn run_container(
    State(machine): State<Arc<LocalMachine>>,
    call: Option<Extension<LeaseCall>>,
    Json(req): Json<RunContainerRequest>,
) -> Result<Response, Failure> {
    let d = docker(&machine)?;
    // The edge routes what the store holds: a container whose observation cannot be stored
    // would run unrouted while its Deploy reported success.
    let m = machine.clone();
    let store = crate::api::store_blocking(move || m.writable_store()).await?;
    keep_route_users(&store, &req.spec).await?;
    let c = d
        .run_service_container(
            &req.service_id,
            &req.spec,
            Provenance {
                plan_id: req.plan_id.as_deref(),
                lease_token: call.and_then(|Extension(c)| c.token),
            },
            req.registry_auth.as_ref(),
        )
        .await
        .map_err(|e| creation_failure(&machine, e))?;
    if let Err(e) = ployz_orchestrator::observer::resync(&d, &store).await {
        // Docker not answering a later call is not the store refusing: the observer stores
        // the container on its next pass. Only a store that cannot write leaves it unrouted.
        let m = machine.clone();
        if crate::api::store_blocking(move || m.writable_store())
            .await
            .is_ok()
        {
            tracing::warn!(container = %c.name, error = %e, "service container started; its observation waits for the observer's next pass");
            return Ok((StatusCode::CREATED, Json(c)).into_response());
        }
        let _ = d.stop(c.id.as_str(), None).await;
        return Err(failure(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unavailable,
            format!(
                "container {} started, but its observation cannot be stored, so the edge would \
                 not route to it ({e}); it was stopped",
                c.name
            ),
            Some("free space on the data dir's filesystem (the store resumes by itself), then deploy again"),
        ));
    }
    tracing::info!(container = %c.name, service = %c.service_name, "service container started");
    Ok((StatusCode::CREATED, Json(c)).into_response())
}

/// Keeps the users list of each route's basic authentication in the store, where every edge
/// reads it, before the container that serves the route exists. A spec carrying a list's
/// digest alone (a rollback) needs the list kept already; without it the route would admit no
/// one, so the container is refused before it is made.
async fn keep_route_users(
    store: &Arc<ployz_store::Store>,
    spec: &ployz_core::ServiceSpec,
) -> Result<(), Failure> {
    for route in &spec.routes {
        let Some(auth) = &route.basic_auth else {
            continue;
        };
        let s = store.clone();
        match auth.users.clone() {
            Some(users) => {
                if users.digest() != auth.digest {
                    return Err(failure(
                        StatusCode::BAD_REQUEST,
                        ErrorCode::InvalidArgument,
                        format!(
                            "the users list of route {}{} does not have the digest the spec names",
                            route.hostname, route.path
                        ),
                        Some("deploy again from the Compose file"),
                    ));
                }
                crate::api::store_blocking(move || ployz_store::route_users::put_users(&s, &users))
                    .await?;
            }
            None => {
                let digest = auth.digest.clone();
                let known = crate::api::store_blocking(move || {
                    ployz_store::route_users::has_users(&s, &digest)
                })
                .await?;
                if !known {
                    return Err(failure(
                        StatusCode::BAD_REQUEST,
                        ErrorCode::InvalidArgument,
                        format!(
                            "route {}{} names a users list ({}) this Cluster's store does not hold",
                            route.hostname, route.path, auth.digest
                        ),
                        Some("deploy from the Compose file, which carries the list"),
                    ));
                }
            }
        }
    }
    Ok(())
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
    let full = docker(&machine)?.start(checked_id(&id)?).await?;
    // A container stopped after a drain serves again once started; its mark is kept under the
    // full ID whatever prefix this call named it by.
    if let (Some(store), Ok(container)) = (machine.store(), full.parse::<ployz_core::ContainerId>())
    {
        lift_drain_mark(&store, &container).await?;
    }
    Ok(Json(serde_json::json!({})).into_response())
}

async fn stop_container(
    State(machine): State<Arc<LocalMachine>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, Failure> {
    let req: StopContainerRequest = crate::api::parse_body(&body)?;
    let d = docker(&machine)?;
    d.stop(
        checked_id(&id)?,
        req.timeout_seconds.map(Duration::from_secs),
    )
    .await?;
    // The store says the container stopped before the call returns, so nothing routed by it
    // outlives the stop (the observer's next pass would say it too, a moment later).
    if let Some(store) = machine.store() {
        if let Err(e) = ployz_orchestrator::observer::resync(&d, &store).await {
            tracing::warn!(container = %id, error = %e, "the stopped container's observation waits for the observer's next pass");
        }
    }
    Ok(Json(serde_json::json!({})).into_response())
}

async fn remove_container(
    State(machine): State<Arc<LocalMachine>>,
    Path(id): Path<String>,
) -> Result<Response, Failure> {
    let d = docker(&machine)?;
    let full = d.remove(checked_id(&id)?).await?;
    if let (Some(store), Ok(container)) = (machine.store(), full.parse::<ployz_core::ContainerId>())
    {
        // The store forgets the container before its mark goes: lifted first, the mark would
        // hand the edge back an observation of a container that no longer exists (502s until
        // the observer's next pass). Either way the container is gone; a mark left behind is
        // swept as the mark of a container that no longer exists.
        match ployz_orchestrator::observer::resync(&d, &store).await {
            Ok(_) => {
                if let Err(e) = lift_drain_mark(&store, &container).await {
                    tracing::warn!(container = %id, error = %e, "the removed container's drain mark stays until the sweep");
                }
            }
            Err(e) => {
                tracing::warn!(container = %id, error = %e, "the removed container's observation and drain mark stay until the observer's next pass and the sweep");
            }
        }
    }
    tracing::info!(container = %id, "container removed");
    Ok(Json(serde_json::json!({})).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
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
    let stream = docker(&machine)?
        .log_stream(checked_id(&id)?, q.follow, q.tail, q.since, q.until)
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
        .run_hook(
            &req.service_id,
            &req.spec,
            &req.hook,
            req.registry_auth.as_ref(),
        )
        .await
        .map_err(|e| creation_failure(&machine, e))?;
    tracing::info!(service = %req.spec.name, exit_code = ?result.exit_code, "pre-deploy hook ended");
    Ok(Json(result).into_response())
}

/// The volumes this Machine created; others on the engine are not listed.
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
#[serde(deny_unknown_fields)]
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_configuration_reports_the_edge_metrics_and_dns() {
        let own = OwnListeners::from_config(&DaemonConfig::default());
        let got: Vec<String> = own
            .listeners(std::net::Ipv4Addr::new(10, 210, 0, 1))
            .iter()
            .map(|l| format!("{} {}/{}", l.role, l.socket_text(), l.protocol))
            .collect();
        let metrics = DaemonConfig::default().metrics_listen;
        assert_eq!(
            got,
            [
                "edge HTTP listener 0.0.0.0:80/tcp".to_owned(),
                "edge HTTPS listener 0.0.0.0:443/tcp".to_owned(),
                format!("metrics listener {metrics}/tcp"),
                "internal DNS 10.210.0.1:53/udp".to_owned(),
                "internal DNS 10.210.0.1:53/tcp".to_owned(),
            ]
        );
    }

    #[test]
    fn dns_turned_off_is_not_reported() {
        let mut config = DaemonConfig::default();
        config.dns.listen = DnsListen::Off;
        config.http_listen = "[::]:8080".parse().unwrap();
        let got = OwnListeners::from_config(&config).listeners(std::net::Ipv4Addr::LOCALHOST);
        assert_eq!(got.len(), 3);
        assert_eq!(got[0].socket_text(), "[::]:8080");
        assert!(got.iter().all(|l| l.role != ListenerRole::Dns));
    }
}
