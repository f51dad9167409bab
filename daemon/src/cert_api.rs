//! The management API's Certificate Material: import (validated, then stored cluster-scoped)
//! and listing (never the keys).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use ployz_core::api::{paths, ErrorCode, ImportCertificateRequest};
use ployz_core::{CertificateMaterial, CertificateSummary};
use ployz_edge::certificates::{certificate_key, validate, CERTIFICATES_NAMESPACE};
use ployz_store::KeyPrefix;

use crate::api::{failure, not_initialised, Failure};
use crate::local_machine::LocalMachine;

fn store(machine: &LocalMachine) -> Result<Arc<ployz_store::Store>, Failure> {
    machine.store().ok_or_else(not_initialised)
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

async fn import(
    State(machine): State<Arc<LocalMachine>>,
    Json(req): Json<ImportCertificateRequest>,
) -> Result<Response, Failure> {
    let store = store(&machine)?;
    let material =
        validate(&req.hostname, &req.chain_pem, &req.key_pem, now_unix()).map_err(|e| {
            failure(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidArgument,
                format!("certificate for '{}': {e}", req.hostname),
                None,
            )
        })?;
    let summary = CertificateSummary::from(&material);
    let value = serde_json::to_vec(&material).expect("material serialises");
    let key = certificate_key(&material.hostname);
    tokio::task::spawn_blocking(move || store.put(&key, value))
        .await
        .map_err(|e| {
            failure(
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                e.to_string(),
                None,
            )
        })?
        .map_err(|e| {
            failure(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Unavailable,
                e.to_string(),
                None,
            )
        })?;
    tracing::info!(hostname = %summary.hostname, not_after = summary.not_after, "certificate material imported");
    Ok((StatusCode::CREATED, Json(summary)).into_response())
}

async fn list(State(machine): State<Arc<LocalMachine>>) -> Result<Response, Failure> {
    let store = store(&machine)?;
    let records = store
        .scan_live(&KeyPrefix::cluster_namespace(CERTIFICATES_NAMESPACE))
        .map_err(|e| {
            failure(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Unavailable,
                e.to_string(),
                None,
            )
        })?;
    let summaries: Vec<CertificateSummary> = records
        .iter()
        .filter_map(|r| serde_json::from_slice::<CertificateMaterial>(&r.value).ok())
        .map(|m| CertificateSummary::from(&m))
        .collect();
    Ok(Json(summaries).into_response())
}

/// The certificate routes.
pub fn router(machine: Arc<LocalMachine>) -> Router {
    Router::new()
        .route(paths::CERTIFICATES, get(list).post(import))
        .with_state(machine)
}
