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
            clock_went_back_ms: store
                .clock_went_back()
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
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

/// The revisions namespace (cluster-scoped): `<service id>.<revision, 8 digits>` to a
/// [`api::ServiceRevision`] as JSON.
pub const REVISIONS_NAMESPACE: &str = "revisions";

#[derive(serde::Deserialize)]
struct ServiceQuery {
    service: ployz_core::ServiceId,
}

/// The revisions kept of one Service, oldest first (unreadable records are skipped).
fn revisions_of(
    store: &ployz_store::Store,
    service: &ployz_core::ServiceId,
) -> Result<Vec<api::ServiceRevision>, ployz_store::StoreError> {
    let prefix = format!("{service}.");
    let mut out: Vec<api::ServiceRevision> = store
        .scan_live(&KeyPrefix::cluster_namespace(REVISIONS_NAMESPACE))?
        .into_iter()
        .filter(|r| r.key.name().starts_with(&prefix))
        .filter_map(|r| serde_json::from_slice(&r.value).ok())
        .collect();
    out.sort_by_key(|r: &api::ServiceRevision| r.revision);
    Ok(out)
}

async fn list_revisions(
    State(machine): State<Arc<LocalMachine>>,
    Query(q): Query<ServiceQuery>,
) -> Result<Response, Failure> {
    let store = machine
        .store()
        .ok_or_else(|| Failure::from(MachineError::NotInitialised))?;
    let out = store_blocking(move || revisions_of(&store, &q.service)).await?;
    Ok(Json(out).into_response())
}

async fn record_revision(
    State(machine): State<Arc<LocalMachine>>,
    body: Bytes,
) -> Result<Response, Failure> {
    let request: api::RecordRevisionRequest = serde_json::from_slice(&body)
        .map_err(|e| invalid(format!("request body is not valid: {e}")))?;
    if request.by.len() > 256 {
        return Err(invalid("by has more than 256 bytes".to_owned()));
    }
    if request.spec.has_secret_values() {
        return Err(invalid(
            "a revision keeps secrets by digest only; strip their values first".to_owned(),
        ));
    }
    let store = machine.writable_store()?;
    let recorded = store_blocking(move || record_revision_in(&store, request)).await?;
    Ok(Json(serde_json::json!({ "recorded": recorded })).into_response())
}

/// Records `request` as the Service's next revision unless the newest one has the same spec,
/// and deletes the oldest beyond what the Service keeps (`x-revisions`, else
/// [`api::KEPT_REVISIONS`]). Answers the revision recorded.
fn record_revision_in(
    store: &ployz_store::Store,
    request: api::RecordRevisionRequest,
) -> Result<Option<u64>, ployz_store::StoreError> {
    let kept = revisions_of(store, &request.service_id)?;
    let spec_digest = ployz_orchestrator::plan::binding::spec_digest(&request.spec);
    if kept.last().is_some_and(|r| r.spec_digest == spec_digest) {
        return Ok(None);
    }
    let revision = kept.last().map_or(1, |r| r.revision + 1);
    let record = api::ServiceRevision {
        service_id: request.service_id.clone(),
        revision,
        recorded_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        by: request.by,
        spec_digest,
        spec: request.spec,
    };
    let key = |n: u64| {
        Key::cluster(
            REVISIONS_NAMESPACE,
            format!("{}.{n:08}", request.service_id),
        )
    };
    store.put(
        &key(revision),
        serde_json::to_vec(&record).unwrap_or_default(),
    )?;
    // Keep the newest few (`x-revisions` of the Service as now deployed): older ones are
    // deleted.
    let keep = record.spec.revisions.map_or(api::KEPT_REVISIONS, |n| {
        (n as usize).clamp(1, api::MAX_KEPT_REVISIONS)
    });
    let excess = (kept.len() + 1).saturating_sub(keep);
    for old in kept.iter().take(excess) {
        store.delete(&key(old.revision))?;
    }
    Ok(Some(revision))
}

/// The store routes over one Machine.
pub fn router(machine: Arc<LocalMachine>) -> Router {
    Router::new()
        .route(api::paths::STORE_DIGEST, get(digest))
        .route(api::paths::STORE_SCRATCH, get(list).put(put).delete(delete))
        .route(
            api::paths::REVISIONS,
            get(list_revisions).post(record_revision),
        )
        .with_state(machine)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_core::{ContainerSpec, MachineId, ServiceId, ServiceMode, ServiceSpec};

    fn spec(image: &str, revisions: Option<u32>) -> ServiceSpec {
        ServiceSpec {
            name: "web".parse().unwrap(),
            mode: ServiceMode::Replicated,
            replicas: 1,
            container: ContainerSpec {
                image: image.into(),
                ..Default::default()
            },
            ports: vec![],
            machines: vec![],
            update: Default::default(),
            pre_deploy: None,
            depends_on: vec![],
            revisions,
            routes: vec![],
        }
    }

    #[test]
    fn a_service_keeps_the_revisions_its_compose_file_asks_for() {
        let store = ployz_store::Store::temporary(MachineId::generate()).unwrap();
        let id = ServiceId::generate();
        let record = |image: &str, keep| {
            record_revision_in(
                &store,
                api::RecordRevisionRequest {
                    service_id: id.clone(),
                    by: "ci@runner".into(),
                    spec: spec(image, keep),
                },
            )
            .unwrap()
        };
        let kept = || -> Vec<u64> {
            revisions_of(&store, &id)
                .unwrap()
                .iter()
                .map(|r| r.revision)
                .collect()
        };
        for n in 1..=7 {
            assert_eq!(record(&format!("app:{n}"), None), Some(n));
        }
        assert_eq!(kept(), [3, 4, 5, 6, 7], "5 by default");
        // The same spec again is not a new revision.
        assert_eq!(record("app:7", None), None);
        // x-revisions: 2 keeps two from the next Deploy on.
        assert_eq!(record("app:8", Some(2)), Some(8));
        assert_eq!(kept(), [7, 8]);
        // And more, once asked: nothing deleted comes back, the newer ones add up.
        for n in 9..=12 {
            record(&format!("app:{n}"), Some(10));
        }
        assert_eq!(kept(), [7, 8, 9, 10, 11, 12]);
        // A value past the bound keeps the bound.
        for n in 13..=130 {
            record(&format!("app:{n}"), Some(u32::MAX));
        }
        assert_eq!(kept().len(), api::MAX_KEPT_REVISIONS);
    }
}
