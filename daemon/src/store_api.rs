//! The management API's store diagnostics: the digest (how much of each origin this store holds)
//! and the scratch namespace, cluster-scoped values nothing in Ployz reads, for checking
//! replication by hand (`ployz store put` on one Machine, `ployz store ls` on another).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use ployz_core::api::{self, ErrorCode, PutScratchRequest, ScratchRecord, StoreDigest};
use ployz_store::{Key, KeyPrefix};

use crate::api::{failure, store_blocking, Failure};
use crate::local_machine::{LocalMachine, MachineError};

/// The scratch namespace (cluster-scoped).
pub const SCRATCH_NAMESPACE: &str = "scratch";
/// The largest scratch value.
pub const MAX_SCRATCH_VALUE: usize = 64 * 1024;

/// Checks a scratch name: 1 to 128 letters, digits, `.`, `_` or `-`.
pub fn check_name(name: &str) -> Result<(), String> {
    if name.is_empty()
        || name.len() > 128
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(format!(
            "scratch name '{name}' is not usable: use 1 to 128 letters, digits, '.', '_' or '-'"
        ));
    }
    Ok(())
}

fn invalid(message: String) -> Failure {
    failure(
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidArgument,
        message,
        None,
    )
}

async fn digest(State(machine): State<Arc<LocalMachine>>) -> Result<Response, Failure> {
    let store = machine
        .store()
        .ok_or_else(|| Failure::from(MachineError::NotInitialised))?;
    let answer = store_blocking(move || -> Result<StoreDigest, ployz_store::StoreError> {
        Ok(StoreDigest {
            digest: store.digest()?.0,
            clock_refusals: store.clock_refusals(),
            forgotten: store.forgotten()?.into_iter().collect(),
        })
    })
    .await?;
    Ok(Json(answer).into_response())
}

async fn list(State(machine): State<Arc<LocalMachine>>) -> Result<Response, Failure> {
    let store = machine
        .store()
        .ok_or_else(|| Failure::from(MachineError::NotInitialised))?;
    let records =
        store_blocking(move || store.scan_live(&KeyPrefix::cluster_namespace(SCRATCH_NAMESPACE)))
            .await?;
    let out: Vec<ScratchRecord> = records
        .into_iter()
        .map(|r| ScratchRecord {
            name: r.key.name().to_owned(),
            value: String::from_utf8_lossy(&r.value).into_owned(),
            origin: r.origin,
            hlc: r.hlc.to_string(),
        })
        .collect();
    Ok(Json(out).into_response())
}

async fn put(State(machine): State<Arc<LocalMachine>>, body: Bytes) -> Result<Response, Failure> {
    let request: PutScratchRequest = serde_json::from_slice(&body)
        .map_err(|e| invalid(format!("request body is not valid: {e}")))?;
    for (name, value) in &request.values {
        check_name(name).map_err(invalid)?;
        if value.len() > MAX_SCRATCH_VALUE {
            return Err(invalid(format!(
                "the value of '{name}' has {} bytes; a scratch value holds at most {MAX_SCRATCH_VALUE}",
                value.len()
            )));
        }
    }
    let store = machine.writable_store()?;
    let written = store_blocking(move || -> Result<usize, ployz_store::StoreError> {
        for (name, value) in &request.values {
            store.put(
                &Key::cluster(SCRATCH_NAMESPACE, name.as_str()),
                value.clone().into_bytes(),
            )?;
        }
        Ok(request.values.len())
    })
    .await?;
    Ok(Json(serde_json::json!({ "written": written })).into_response())
}

#[derive(serde::Deserialize)]
struct NameQuery {
    name: String,
}

async fn delete(
    State(machine): State<Arc<LocalMachine>>,
    Query(q): Query<NameQuery>,
) -> Result<Response, Failure> {
    check_name(&q.name).map_err(invalid)?;
    let store = machine.writable_store()?;
    let name = q.name.clone();
    store_blocking(move || store.delete(&Key::cluster(SCRATCH_NAMESPACE, q.name.as_str()))).await?;
    Ok(Json(serde_json::json!({ "deleted": name })).into_response())
}

/// The store routes over one Machine.
pub fn router(machine: Arc<LocalMachine>) -> Router {
    Router::new()
        .route(api::paths::STORE_DIGEST, get(digest))
        .route(api::paths::STORE_SCRATCH, get(list).put(put).delete(delete))
        .with_state(machine)
}
