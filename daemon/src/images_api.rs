//! The management API's images on this Machine: list, describe, remove, and the two ends of an
//! image transfer without a registry ([`ployz_orchestrator::images`]): an offer answered with
//! the layers this Machine lacks, and the archive of those layers loaded into its Docker. A
//! peer pull is both at once: this Machine offers itself the image another Machine has and
//! fetches what it lacks from there, over the mesh.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Query, Request, State};
use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::TryStreamExt as _;
use ployz_core::api::{
    docker_paths as paths, ErrorCode, ImageOffer, PeerPullAnswer, PeerPullRequest,
};
use ployz_orchestrator::docker::MachineDocker;
use ployz_orchestrator::images::{self, TransferCounters};
use serde::Deserialize;

use crate::api::{failure, not_initialised, Failure};
use crate::local_machine::LocalMachine;
use crate::mesh::MeshView;

/// How long a peer's `docker save` may take to produce its first byte (Docker lays the image
/// out on its disk first).
const FIRST_BYTE_WITHIN: std::time::Duration = std::time::Duration::from_secs(600);
/// How long a peer's transfer may go without a byte once it began (the peer sends a keep-alive
/// every [`images::KEEPALIVE`]).
const IDLE_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

#[derive(Clone)]
struct Images {
    machine: Arc<LocalMachine>,
    mesh: Arc<MeshView>,
}

fn docker(machine: &LocalMachine) -> Result<MachineDocker, Failure> {
    machine.docker().ok_or_else(not_initialised)
}

/// This Machine's Docker and its engine's client (`long`: for a `docker load`).
async fn engine(s: &Images, long: bool) -> Result<(MachineDocker, images::Docker), Failure> {
    let docker = docker(&s.machine)?;
    let engine = docker.engine(long).await?;
    Ok((docker, engine))
}

async fn list(State(s): State<Images>) -> Result<Response, Failure> {
    let (docker, engine) = engine(&s, false).await?;
    Ok(Json(images::list(&engine, docker.host()).await?).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RemoveQuery {
    reference: String,
    #[serde(default)]
    force: bool,
}

async fn remove(
    State(s): State<Images>,
    Query(q): Query<RemoveQuery>,
) -> Result<Response, Failure> {
    let (docker, engine) = engine(&s, false).await?;
    let removed = images::remove(&engine, docker.host(), &q.reference, q.force).await?;
    Ok(Json(removed).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct DescribeQuery {
    reference: String,
}

async fn describe(
    State(s): State<Images>,
    Query(q): Query<DescribeQuery>,
) -> Result<Response, Failure> {
    let (docker, engine) = engine(&s, false).await?;
    match images::describe(&engine, docker.host(), &q.reference).await? {
        Some(offer) => Ok(Json(offer).into_response()),
        None => Err(no_image(&s.machine, &q.reference)),
    }
}

fn no_image(machine: &LocalMachine, reference: &str) -> Failure {
    let name = machine
        .info()
        .map(|i| format!("Machine '{}'", i.name))
        .unwrap_or_else(|| "this Machine".to_owned());
    failure(
        StatusCode::NOT_FOUND,
        ErrorCode::NotFound,
        format!("{name} has no image '{reference}'"),
        Some("`ployz image ls` lists the images each Machine has"),
    )
}

async fn offer(
    State(s): State<Images>,
    Json(offer): Json<ImageOffer>,
) -> Result<Response, Failure> {
    let (docker, engine) = engine(&s, false).await?;
    Ok(Json(images::offer(&engine, docker.host(), &offer).await?).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LoadQuery {
    id: String,
    /// Tags to point at it, comma-separated.
    #[serde(default)]
    tags: String,
}

async fn load(
    State(s): State<Images>,
    Query(q): Query<LoadQuery>,
    request: Request,
) -> Result<Response, Failure> {
    let (docker, engine) = engine(&s, true).await?;
    let body = request
        .into_body()
        .into_data_stream()
        .map_err(std::io::Error::other);
    let tags: Vec<String> = q
        .tags
        .split(',')
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect();
    let loaded = images::load(&engine, docker.host(), &q.id, &tags, Box::pin(body)).await?;
    tracing::info!(image = %loaded.id, tags = ?loaded.tags, received = loaded.received, "an image arrived");
    Ok(Json(loaded).into_response())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportQuery {
    id: String,
    /// Diff IDs to leave out, comma-separated.
    #[serde(default)]
    skip: String,
}

async fn export(
    State(s): State<Images>,
    Query(q): Query<ExportQuery>,
) -> Result<Response, Failure> {
    if !images::is_digest(&q.id) {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            format!("id: '{}' is not an image ID", q.id.escape_debug()),
            Some("give sha256: and 64 lowercase hexadecimal digits"),
        ));
    }
    let skip: std::collections::HashSet<String> = q
        .skip
        .split(',')
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    if let Some(bad) = skip.iter().find(|l| !images::is_digest(l)) {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            format!("skip: '{}' is not a diff ID", bad.escape_debug()),
            Some("give diff IDs (sha256: and 64 hexadecimal digits), comma-separated"),
        ));
    }
    let (docker, engine) = engine(&s, false).await?;
    // Checked here, so a missing image is a 404 rather than a stream that fails at once.
    let Some(offer) = images::describe(&engine, docker.host(), &q.id).await? else {
        return Err(no_image(&s.machine, &q.id));
    };
    let layers = offer.layers.into_iter().collect();
    let stream = images::export(
        &engine,
        &q.id,
        skip,
        layers,
        Arc::new(TransferCounters::default()),
    );
    Ok((
        [(axum::http::header::CONTENT_TYPE, "application/zstd")],
        Body::from_stream(stream),
    )
        .into_response())
}

/// Reads a JSON answer of another Machine's.
async fn json_answer<T: serde::de::DeserializeOwned>(
    response: hyper::Response<hyper::body::Incoming>,
    what: &str,
) -> Result<T, Failure> {
    let status = response.status();
    let bytes = http_body_util::BodyExt::collect(response.into_body())
        .await
        .map_err(|e| peer_failed(what, &e.to_string()))?
        .to_bytes();
    if status.is_success() {
        return serde_json::from_slice(&bytes).map_err(|e| peer_failed(what, &e.to_string()));
    }
    match serde_json::from_slice::<ployz_core::api::ApiError>(&bytes) {
        Ok(e) => Err(peer_failed(what, &e.to_string())),
        Err(_) => Err(peer_failed(what, &format!("it answered {status}"))),
    }
}

fn peer_failed(what: &str, why: &str) -> Failure {
    failure(
        StatusCode::BAD_GATEWAY,
        ErrorCode::Unavailable,
        format!("{what}: {why}"),
        None,
    )
}

/// Fetches an image from another Machine over the mesh: asks it for its offer, offers that to
/// this Machine's Docker, fetches only the layers missing here, and loads them.
async fn pull_from_peer(
    State(s): State<Images>,
    Json(ask): Json<PeerPullRequest>,
) -> Result<Response, Failure> {
    ployz_orchestrator::docker::check_image_reference(&ask.image)?;
    let (docker, engine) = engine(&s, false).await?;
    let from = format!("Machine {}", ask.from);
    let path = format!(
        "{}?reference={}",
        paths::IMAGE_DESCRIBE,
        ployz_core::api::query_value(&ask.image)
    );
    let described = crate::forward::call_member(
        &s.machine,
        &s.mesh,
        &ask.from,
        Method::GET,
        &path,
        Body::empty(),
        Some(crate::forward::PER_MACHINE_TIMEOUT),
    )
    .await?;
    let offer: ImageOffer =
        json_answer(described, &format!("{from} describing '{}'", ask.image)).await?;
    let answer = images::offer(&engine, docker.host(), &offer).await?;
    if answer.present {
        return Ok(Json(PeerPullAnswer {
            id: offer.id,
            present: true,
            layers_sent: 0,
            layers: offer.layers.len(),
            received: 0,
        })
        .into_response());
    }
    let skip: Vec<String> = images::skipped(&offer, &answer.missing)
        .into_iter()
        .collect();
    let path = format!(
        "{}?id={}&skip={}",
        paths::IMAGE_EXPORT,
        offer.id,
        skip.join(",")
    );
    let exported = crate::forward::call_member(
        &s.machine,
        &s.mesh,
        &ask.from,
        Method::GET,
        &path,
        Body::empty(),
        Some(ployz_orchestrator::docker::CALL_TIMEOUT),
    )
    .await?;
    if !exported.status().is_success() {
        let e: Result<serde_json::Value, Failure> =
            json_answer(exported, &format!("{from} sending '{}'", ask.image)).await;
        return Err(e.err().unwrap_or_else(|| {
            peer_failed(&format!("{from} sending '{}'", ask.image), "no image came")
        }));
    }
    // The peer sends a keep-alive while it reads what it does not send: a link that stops
    // carrying the image ends the pull rather than holding it (and the Deploy) for TCP's time.
    let body = images::bounded(
        http_body_util::BodyDataStream::new(exported.into_body()).map_err(std::io::Error::other),
        FIRST_BYTE_WITHIN,
        IDLE_WITHIN,
    );
    let long = docker.engine(true).await?;
    let loaded = images::load(&long, docker.host(), &offer.id, &offer.tags, body).await?;
    tracing::info!(image = %offer.id, from = %ask.from, received = loaded.received, layers = answer.missing.len(), "an image arrived from a peer");
    Ok(Json(PeerPullAnswer {
        id: offer.id,
        present: false,
        layers_sent: answer.missing.len(),
        layers: offer.layers.len(),
        received: loaded.received,
    })
    .into_response())
}

/// The image routes over one Machine.
pub fn router(machine: Arc<LocalMachine>, mesh: Arc<MeshView>) -> Router {
    Router::new()
        .route(paths::IMAGES, get(list).delete(remove))
        .route(paths::IMAGE_DESCRIBE, get(describe))
        .route(paths::IMAGE_OFFERS, post(offer))
        .route(paths::IMAGE_LOAD, post(load))
        .route(paths::IMAGE_EXPORT, get(export))
        .route(paths::IMAGE_PULL_FROM_PEER, post(pull_from_peer))
        .with_state(Images { machine, mesh })
}
