//! The peer routes: this store's side of the sync protocol, served to the other Machines.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::BodyExt as _;
use ployz_core::api::ErrorCode;
use ployz_store::{Owner, Store, StoreError, SyncBatch};
use serde::de::DeserializeOwned;

use super::{
    bounded_batch, paths, PullAnswer, PullRequest, PushAnswer, DEFAULT_MAX_BATCH_BYTES,
    DEFAULT_MAX_BATCH_RECORDS, MACHINE_HEADER, MAX_BODY_BYTES,
};
use crate::api::{failure, Failure};

/// The bounds the peer routes keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeLimits {
    /// The largest request body taken, in bytes; a larger one gets 413.
    pub max_body_bytes: usize,
    /// At most this many records in one pull answer.
    pub max_batch_records: usize,
    /// About this many bytes in one pull answer at most (one larger record still travels,
    /// alone).
    pub max_batch_bytes: usize,
}

impl Default for ServeLimits {
    fn default() -> ServeLimits {
        ServeLimits {
            max_body_bytes: MAX_BODY_BYTES,
            max_batch_records: DEFAULT_MAX_BATCH_RECORDS,
            max_batch_bytes: DEFAULT_MAX_BATCH_BYTES,
        }
    }
}

#[derive(Clone)]
struct Served {
    store: Arc<Store>,
    limits: ServeLimits,
}

/// The peer routes over `store`, with the default [`ServeLimits`]. See the
/// [module documentation](super) for what each answers.
pub fn routes(store: Arc<Store>) -> Router {
    routes_with(store, ServeLimits::default())
}

/// The peer routes over `store`, keeping `limits`.
pub fn routes_with(store: Arc<Store>, limits: ServeLimits) -> Router {
    let machine = HeaderValue::from_str(store.local().as_str())
        .expect("a Machine ID is lowercase hex, a valid header value");
    Router::new()
        .route(paths::DIGEST, get(digest))
        .route(paths::PULL, post(pull))
        .route(paths::PUSH, post(push))
        .with_state(Served { store, limits })
        .layer(axum::middleware::map_response(move |mut r: Response| {
            let machine = machine.clone();
            async move {
                r.headers_mut()
                    .insert(HeaderName::from_static(MACHINE_HEADER), machine);
                if r.status() == StatusCode::SERVICE_UNAVAILABLE {
                    r.headers_mut().insert(
                        axum::http::header::RETRY_AFTER,
                        HeaderValue::from_static("1"),
                    );
                }
                r
            }
        }))
}

async fn digest(State(served): State<Served>) -> Result<Response, Failure> {
    let store = served.store;
    let digest = on_store(move || store.digest()).await?;
    Ok(Json(digest).into_response())
}

async fn pull(State(served): State<Served>, body: Body) -> Result<Response, Failure> {
    let bytes = read_body(body, served.limits.max_body_bytes, paths::PULL).await?;
    let request: PullRequest = parse(&bytes, "a pull request (requests: [{origin, after}])")?;
    let limits = served.limits;
    let max_records = request
        .max_records
        .unwrap_or(limits.max_batch_records)
        .min(limits.max_batch_records)
        .max(1);
    let max_bytes = request
        .max_bytes
        .unwrap_or(limits.max_batch_bytes)
        .min(limits.max_batch_bytes)
        .max(1);
    let store = served.store;
    let body = on_store(move || {
        let answer = answer_pull(&store, &request, max_records, max_bytes)?;
        serde_json::to_vec(&answer)
            .map_err(|e| StoreError::Malformed(format!("a pull answer does not serialise: {e}")))
    })
    .await?;
    Ok(json_bytes(body))
}

/// One batch per request, in order, until the answer holds `max_records` records or about
/// `max_bytes` bytes. The first batch carries at least one record when there is one, so a
/// record larger than the bound still travels.
fn answer_pull(
    store: &Store,
    request: &PullRequest,
    max_records: usize,
    max_bytes: usize,
) -> Result<PullAnswer, StoreError> {
    let mut answer = PullAnswer {
        batches: Vec::new(),
    };
    let (mut records, mut bytes) = (0usize, 0usize);
    for sync in &request.requests {
        if records >= max_records || bytes >= max_bytes {
            break;
        }
        let batch = bounded_batch(
            store,
            sync,
            max_records - records,
            max_bytes - bytes,
            records == 0,
        )?;
        records += batch.records.len();
        bytes += batch.records.iter().map(super::wire_size).sum::<usize>();
        let cut = batch.records.is_empty() && batch.up_to == batch.after;
        if !cut {
            answer.batches.push(batch);
        }
    }
    Ok(answer)
}

async fn push(State(served): State<Served>, body: Body) -> Result<Response, Failure> {
    let bytes = read_body(body, served.limits.max_body_bytes, paths::PUSH).await?;
    let batch: SyncBatch = parse(&bytes, "a sync batch (origin, after, up_to, records)")?;
    check_batch(&batch)?;
    let store = served.store;
    let answer = on_store(move || {
        let report = store.apply_batch(&batch)?;
        let seq = store.digest()?.get(&batch.origin);
        Ok(PushAnswer {
            origin: batch.origin,
            seq,
            applied: report.applied,
            ignored: report.ignored,
        })
    })
    .await?;
    Ok(Json(answer).into_response())
}

/// What the store would refuse in a batch, refused before it is offered: a 400 naming the
/// record, never a store error.
fn check_batch(batch: &SyncBatch) -> Result<(), Failure> {
    let invalid = |message: String| {
        failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            message,
            None,
        )
    };
    if batch.up_to < batch.after {
        return Err(invalid(format!(
            "up_to: {} is below after ({}); a batch covers the origin's writes in (after, up_to]",
            batch.up_to, batch.after
        )));
    }
    for (i, record) in batch.records.iter().enumerate() {
        if let Owner::Machine(owner) = record.key.owner() {
            if owner != &record.origin {
                return Err(invalid(format!(
                    "records[{i}]: '{}' belongs to Machine {owner}, but the record comes from \
                     Machine {}; only a key's owner writes it",
                    record.key, record.origin
                )));
            }
        }
        if record.tombstone && !record.value.is_empty() {
            return Err(invalid(format!(
                "records[{i}]: the tombstone for '{}' carries a value ({} bytes); a tombstone's \
                 value is empty",
                record.key,
                record.value.len()
            )));
        }
    }
    Ok(())
}

/// The request body, whole, refused with 413 when over `limit` bytes.
async fn read_body(body: Body, limit: usize, path: &str) -> Result<Bytes, Failure> {
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(failure(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::InvalidArgument,
            format!("the body of POST {path} is over the limit of {limit} bytes"),
            Some("send smaller batches (a sender keeps max_batch_bytes well below the limit)"),
        )),
        Err(e) => Err(failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            format!("the body of POST {path} could not be read: {e}"),
            None,
        )),
    }
}

fn parse<T: DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, Failure> {
    serde_json::from_slice(bytes).map_err(|e| {
        failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            format!("the request body is not {what}: {e}"),
            None,
        )
    })
}

fn json_bytes(body: Vec<u8>) -> Response {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        body,
    )
        .into_response()
}

/// Runs a store call off the async workers; a store that cannot write (or read) answers 503
/// with its reason (and `Retry-After: 1`), anything else 500.
async fn on_store<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
) -> Result<T, Failure> {
    match tokio::task::spawn_blocking(f).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(store_failure(e)),
        Err(e) => Err(failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            format!("a replication request failed: {e}"),
            Some("the daemon log has details"),
        )),
    }
}

fn store_failure(e: StoreError) -> Failure {
    match e {
        e if e.is_io() => failure(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unavailable,
            format!("this Machine's store does not take records now: {e}"),
            Some("the sender retries; the Machine's daemon log says why its store refuses"),
        ),
        e @ StoreError::ForeignWrite { .. } => failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            e.to_string(),
            None,
        ),
        e => failure(
            StatusCode::INTERNAL_SERVER_ERROR,
            ErrorCode::Internal,
            e.to_string(),
            Some("the daemon log has details"),
        ),
    }
}
