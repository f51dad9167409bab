//! The management API's Cluster routes: joining (both sides), the member list, removal and
//! updates, and the mesh's status.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use ployz_core::api::{
    self, AdmitRequest, ErrorCode, JoinGrant, JoinTokenAnswer, PendingJoinRequest,
    RemoveMachineOutcome, RemoveMachineRequest, UpdateMachineRequest,
};

use crate::api::{blocking, failure, Failure};
use crate::local_machine::LocalMachine;
use crate::mesh::MeshView;

#[derive(Clone)]
struct Cluster {
    machine: Arc<LocalMachine>,
    mesh: Arc<MeshView>,
}

fn body<T: serde::de::DeserializeOwned>(bytes: &Bytes) -> Result<T, Failure> {
    serde_json::from_slice(bytes).map_err(|e| {
        failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            format!("request body is not valid: {e}"),
            None,
        )
    })
}

async fn machines(State(c): State<Cluster>) -> Result<Response, Failure> {
    let observed = c.mesh.observations();
    let list = blocking(move || c.machine.machines(&observed)).await?;
    Ok(Json(list).into_response())
}

async fn join_request(State(c): State<Cluster>) -> Result<Response, Failure> {
    let endpoints = c.mesh.advertised_endpoints();
    let request = blocking(move || c.machine.join_request(endpoints)).await?;
    Ok(Json(request).into_response())
}

async fn admit(State(c): State<Cluster>, bytes: Bytes) -> Result<Response, Failure> {
    let request: AdmitRequest = body(&bytes)?;
    let port = c.mesh.settings().wireguard_port;
    let endpoints = c.mesh.advertised_endpoints();
    let admission = blocking(move || c.machine.admit(request, port, endpoints)).await?;
    Ok((StatusCode::CREATED, Json(admission)).into_response())
}

async fn join(State(c): State<Cluster>, bytes: Bytes) -> Result<Response, Failure> {
    let grant: JoinGrant = body(&bytes)?;
    let view = blocking(move || c.machine.join(grant)).await?;
    Ok((StatusCode::CREATED, Json(view)).into_response())
}

async fn join_token(State(c): State<Cluster>) -> Result<Response, Failure> {
    let endpoints = c.mesh.advertised_endpoints();
    let port = c.mesh.settings().wireguard_port;
    let token = blocking(move || c.machine.join_token(endpoints, port)).await?;
    Ok(Json(JoinTokenAnswer {
        text: token.to_text(),
        token,
    })
    .into_response())
}

async fn take_join_token(State(c): State<Cluster>, bytes: Bytes) -> Result<Response, Failure> {
    let request: PendingJoinRequest = body(&bytes)?;
    if !c.mesh.settings().enabled {
        return Err(failure(
            StatusCode::CONFLICT,
            ErrorCode::FailedPrecondition,
            "the mesh is off on this Machine (mesh.enabled = false, or --no-mesh), and joining through a Join Token goes over it".to_owned(),
            Some("start the daemon with the mesh on, then join again"),
        ));
    }
    let endpoints = c.mesh.advertised_endpoints();
    let mesh = c.mesh.clone();
    let pending = blocking(move || c.machine.take_join_token(request, endpoints)).await?;
    mesh.set_pending_attempt(None);
    Ok((StatusCode::CREATED, Json(pending)).into_response())
}

async fn pending_join(State(c): State<Cluster>) -> Result<Response, Failure> {
    let machine = c.machine.clone();
    match blocking(move || Ok(machine.pending_join())).await? {
        Some(mut pending) => {
            pending.last_attempt = c.mesh.pending_attempt();
            Ok(Json(pending).into_response())
        }
        None => Err(failure(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            "this Machine holds no Join Token (it is initialised, or `ployz machine join TOKEN` was not run here)".to_owned(),
            None,
        )),
    }
}

async fn remove(State(c): State<Cluster>, bytes: Bytes) -> Result<Response, Failure> {
    let request: RemoveMachineRequest = body(&bytes)?;
    let own = c.machine.identity().map(|i| i.id);
    if own.as_ref() == Some(&request.id) {
        return Err(failure(
            StatusCode::CONFLICT,
            ErrorCode::FailedPrecondition,
            "a Machine cannot remove itself through its own daemon".to_owned(),
            Some("run `ployz machine rm` against another Machine of the Cluster"),
        ));
    }
    let machine = c.machine.clone();
    let id = request.id.clone();
    let member = blocking(move || machine.member(&id)).await?;
    // Reset it first, while it is still a peer: once its record is gone, no Machine reaches it.
    let reset = c.mesh.reset_peer(&member, request.stop_containers).await;
    let machine = c.machine.clone();
    let id = request.id.clone();
    let member = blocking(move || machine.remove_member(&id)).await?;
    Ok(Json(RemoveMachineOutcome {
        id: member.id,
        name: member.name,
        reset,
    })
    .into_response())
}

async fn update(State(c): State<Cluster>, bytes: Bytes) -> Result<Response, Failure> {
    let request: UpdateMachineRequest = body(&bytes)?;
    let member = blocking(move || c.machine.update_member(request)).await?;
    Ok(Json(member).into_response())
}

async fn mesh_status(State(c): State<Cluster>) -> Result<Response, Failure> {
    match c.mesh.status() {
        Some(status) => Ok(Json(status).into_response()),
        None => Err(failure(
            StatusCode::CONFLICT,
            ErrorCode::FailedPrecondition,
            c.mesh.not_running_reason(),
            None,
        )),
    }
}

/// The Cluster routes over one Machine.
pub fn router(machine: Arc<LocalMachine>, mesh: Arc<MeshView>) -> Router {
    Router::new()
        .route(api::paths::MACHINES, get(machines))
        .route(api::paths::JOIN_REQUEST, get(join_request))
        .route(api::paths::MACHINE_ADMIT, post(admit))
        .route(api::paths::JOIN, post(join))
        .route(api::paths::JOIN_TOKEN, get(join_token))
        .route(
            api::paths::JOIN_PENDING,
            get(pending_join).post(take_join_token),
        )
        .route(api::paths::MACHINE_REMOVE, post(remove))
        .route(api::paths::MACHINE_UPDATE, post(update))
        .route(api::paths::MESH, get(mesh_status))
        .with_state(Cluster { machine, mesh })
}
