//! The management API's Certificate Material: import (validated, then stored cluster-scoped)
//! and listing (never the keys).

use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use ployz_core::api::{paths, ErrorCode, ImportCertificateRequest, SetCertificatePolicyRequest};
use ployz_core::{CertificateMaterial, CertificatePolicy, CertificateSummary};
use ployz_store::certificates::{
    certificate_key, clear_policy, policy_key, stored_statuses, write_policy,
    CERTIFICATES_NAMESPACE,
};
use ployz_store::KeyPrefix;

use crate::api::{failure, not_initialised, store_blocking, Failure};
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
    let mut material =
        CertificateMaterial::check(&req.hostname, &req.chain_pem, &req.key_pem, now_unix())
            .map_err(|e| {
                failure(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::InvalidArgument,
                    format!("certificate for '{}': {e}", req.hostname),
                    None,
                )
            })?;
    // The issuer leaves imported material alone until it expires.
    material.imported = true;
    let summary = CertificateSummary::from(&material);
    let value = serde_json::to_vec(&material).expect("material serialises");
    let key = certificate_key(&material.hostname);
    store_blocking(move || store.put(&key, value)).await?;
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

fn unavailable(e: impl std::fmt::Display) -> Failure {
    failure(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::Unavailable,
        e.to_string(),
        None,
    )
}

/// The policy as a caller may see it: the HMAC key withheld.
fn shown(mut policy: CertificatePolicy) -> CertificatePolicy {
    if policy.eab_hmac_key.is_some() {
        policy.eab_hmac_key = Some(WITHHELD.into());
    }
    policy
}

/// What `GET` shows in place of the EAB HMAC key.
const WITHHELD: &str = "(withheld)";

async fn get_policy(State(machine): State<Arc<LocalMachine>>) -> Result<Response, Failure> {
    let store = store(&machine)?;
    let policy = match store.get(&policy_key()).map_err(unavailable)? {
        Some(r) => match r.live_value() {
            Some(v) => serde_json::from_slice::<CertificatePolicy>(v).map_err(unavailable)?,
            None => CertificatePolicy::default(),
        },
        None => CertificatePolicy::default(),
    };
    Ok(Json(shown(policy)).into_response())
}

async fn set_policy(
    State(machine): State<Arc<LocalMachine>>,
    Json(req): Json<SetCertificatePolicyRequest>,
) -> Result<Response, Failure> {
    let store = store(&machine)?;
    let base = if req.reset {
        CertificatePolicy::default()
    } else {
        match store.get(&policy_key()).map_err(unavailable)? {
            Some(r) => match r.live_value() {
                // A stored policy this daemon cannot read is not silently replaced by defaults.
                Some(v) => serde_json::from_slice(v).map_err(|e| {
                    failure(
                        StatusCode::CONFLICT,
                        ErrorCode::InvalidArgument,
                        format!("the stored Certificate Policy cannot be read ({e}), so it cannot be changed field by field"),
                        Some("replace it whole with `ployz cert policy set --reset ...` or `ployz cert policy reset`"),
                    )
                })?,
                None => CertificatePolicy::default(),
            },
            None => CertificatePolicy::default(),
        }
    };
    let policy = base.merged_with(req.policy);
    policy.validate().map_err(|e| {
        failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            e.to_string(),
            None,
        )
    })?;
    let to_store = policy.clone();
    store_blocking(move || write_policy(&store, &to_store)).await?;
    tracing::info!(
        directory = policy.directory_url(),
        "certificate policy changed"
    );
    Ok(Json(shown(policy)).into_response())
}

async fn reset_policy(State(machine): State<Arc<LocalMachine>>) -> Result<Response, Failure> {
    let store = store(&machine)?;
    store_blocking(move || clear_policy(&store)).await?;
    tracing::info!("certificate policy reset to the defaults");
    Ok(Json(CertificatePolicy::default()).into_response())
}

async fn statuses(State(machine): State<Arc<LocalMachine>>) -> Result<Response, Failure> {
    let store = store(&machine)?;
    Ok(Json(stored_statuses(&store)).into_response())
}

/// The certificate routes.
pub fn router(machine: Arc<LocalMachine>) -> Router {
    Router::new()
        .route(paths::CERTIFICATES, get(list).post(import))
        .route(
            paths::CERTIFICATE_POLICY,
            get(get_policy).put(set_policy).delete(reset_policy),
        )
        .route(paths::CERTIFICATE_STATUS, get(statuses))
        .with_state(machine)
}
