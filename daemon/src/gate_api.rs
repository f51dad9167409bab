//! The Service Gates API: `GET /v1/gates` lists them, `PUT` sets one (`ployz service
//! maintenance` / `pause`), `DELETE ?service=ID` lifts it (`live` / `resume`). Every Machine's
//! edge follows the store's `gates` namespace and applies them to the Service's routes.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use ployz_core::api::{self, ErrorCode, GateRequest, SetGateRequest};
use ployz_core::gate::MAX_PAUSE_SECONDS;
use ployz_core::{GateState, ServiceGate};
use ployz_store::gates::{delete_gate, put_gate, stored_gates};

use crate::api::{failure, store_blocking, Failure};
use crate::lease::unix_ms;
use crate::local_machine::{LocalMachine, MachineError};

fn invalid(message: String, fix: &str) -> Failure {
    failure(
        StatusCode::BAD_REQUEST,
        ErrorCode::InvalidArgument,
        message,
        Some(fix),
    )
}

async fn list(State(machine): State<Arc<LocalMachine>>) -> Result<Response, Failure> {
    let store = machine
        .store()
        .ok_or_else(|| Failure::from(MachineError::NotInitialised))?;
    let gates = store_blocking(move || stored_gates(&store)).await?;
    Ok(Json(gates).into_response())
}

/// The gate `request` asks for, checked, as the store keeps it (a pause's end on this
/// Machine's clock).
fn gate_of(request: SetGateRequest, now_ms: u64) -> Result<ServiceGate, Failure> {
    if request.set_by.len() > 256 || request.set_by.chars().any(char::is_control) {
        return Err(invalid(
            "set_by: not one line of at most 256 bytes".to_owned(),
            "name who asks as user@host",
        ));
    }
    let state = match request.gate {
        GateRequest::Maintenance { message } => GateState::Maintenance { message },
        GateRequest::Paused { seconds } => {
            if seconds == 0 || seconds > MAX_PAUSE_SECONDS {
                return Err(invalid(
                    format!("seconds: {seconds} is not 1 to {MAX_PAUSE_SECONDS}"),
                    "hold requests for at most 5 minutes (--for 30s by default)",
                ));
            }
            GateState::Paused {
                until_ms: now_ms + seconds * 1000,
            }
        }
    };
    state
        .check()
        .map_err(|e| invalid(e, "a message of one paragraph of plain text"))?;
    Ok(ServiceGate {
        service_id: request.service_id,
        service_name: request.service_name,
        state,
        set_by: request.set_by,
        set_at_ms: now_ms,
    })
}

async fn set(State(machine): State<Arc<LocalMachine>>, body: Bytes) -> Result<Response, Failure> {
    let request: SetGateRequest = serde_json::from_slice(&body).map_err(|e| {
        invalid(
            format!("request body is not a gate request: {e}"),
            r#"send {"service_id", "service_name", "gate": {"gate": "maintenance", "message"} or {"gate": "paused", "seconds"}, "set_by"}"#,
        )
    })?;
    let gate = gate_of(request, unix_ms())?;
    let store = machine.writable_store()?;
    let stored = gate.clone();
    store_blocking(move || put_gate(&store, &stored)).await?;
    tracing::info!(service = %gate.service_name, service_id = %gate.service_id, gate = ?gate.state, set_by = %gate.set_by, "Service Gate set");
    Ok((StatusCode::OK, Json(gate)).into_response())
}

#[derive(serde::Deserialize)]
struct ServiceQuery {
    service: ployz_core::ServiceId,
}

async fn lift(
    State(machine): State<Arc<LocalMachine>>,
    Query(q): Query<ServiceQuery>,
) -> Result<Response, Failure> {
    let store = machine.writable_store()?;
    let service = q.service.clone();
    let lifted = store_blocking(move || delete_gate(&store, &service)).await?;
    if lifted {
        tracing::info!(service_id = %q.service, "Service Gate lifted");
    }
    Ok(Json(serde_json::json!({ "lifted": lifted })).into_response())
}

/// The gate routes over one Machine.
pub fn router(machine: Arc<LocalMachine>) -> Router {
    Router::new()
        .route(api::paths::GATES, get(list).put(set).delete(lift))
        .with_state(machine)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ployz_core::ServiceId;

    fn request(gate: GateRequest) -> SetGateRequest {
        SetGateRequest {
            service_id: ServiceId::generate(),
            service_name: "web".parse().unwrap(),
            gate,
            set_by: "me@here".into(),
        }
    }

    fn refused(request: SetGateRequest) -> String {
        match gate_of(request, 0) {
            Ok(g) => panic!("accepted: {g:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_pause_ends_on_this_machines_clock_and_bad_requests_name_the_field() {
        let g = gate_of(request(GateRequest::Paused { seconds: 30 }), 1_000)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(g.state, GateState::Paused { until_ms: 31_000 });
        assert_eq!(g.set_at_ms, 1_000);
        for seconds in [0, MAX_PAUSE_SECONDS + 1] {
            let e = refused(request(GateRequest::Paused { seconds }));
            assert!(
                e.starts_with(&format!("seconds: {seconds} is not 1 to 300")),
                "{e}"
            );
        }
        let e = refused(request(GateRequest::Maintenance {
            message: "\u{7}".into(),
        }));
        assert!(e.contains("control characters"), "{e}");
    }
}
