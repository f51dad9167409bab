//! Drains and drain marks: a container about to stop leaves every edge's route table and
//! finishes its requests in flight first, and the mark that takes it out of the tables never
//! outlives the command that set it.
//!
//! A drain (`POST /v1/containers/{id}/drain`) writes a [`DrainMark`] naming its setter (the lease
//! token and holder the lease's guard admitted the call with) and a deadline: the drain's own
//! wait, then the container's stop grace period and [`HANDOFF`] for the setter to stop it. It
//! then has this Machine's edge drain the container ([`ployz_edge::RouteController::drain`]):
//! wait for a published table without it (whose hostnames other Serving Containers serve keep an
//! upstream), then for the requests in flight to it to finish. The mark replicates, and every
//! other Machine's edge drops the container too and reports so in its
//! [`ployz_core::EdgeReport`]: the drain then waits, within the same timeout, until the report
//! of every Machine this one observes up shows this drain applied with no request in flight,
//! and answers the Machines that did not confirm. A drain whose caller goes away before it
//! completes, or that fails, lifts its mark at once.
//!
//! The [`Sweeper`] lifts the marks that should not stand, at start, every [`SWEEP_EVERY`] and
//! when a holder releases the lease (and every grant of the lease runs [`sweep`] before it is
//! answered): a mark whose deadline passed, a mark on a container that is gone, and a mark on a
//! running container that no call is draining or stopping now and whose setter no longer holds
//! this Machine's lease (it ended, died, or lost the lease).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use pingora::server::ShutdownWatch;
use pingora::services::background::BackgroundService;
use ployz_core::api::{docker_paths as paths, DrainRequest, DrainResult, ErrorCode};
use ployz_core::{ContainerId, ContainerRuntimeObservation, DrainMark};
use ployz_orchestrator::docker::DockerError;
use ployz_store::{drains, Store, StoreError};

use crate::api::{failure, not_initialised, Failure};
use crate::lease::{unix_ms, LeaseCall, MachineLease};
use crate::local_machine::LocalMachine;

/// What the drain route needs: this Machine, its edge's route controller, and which Machines it
/// observes up (whose edges must let the container go too).
#[derive(Clone)]
struct DrainState {
    machine: Arc<LocalMachine>,
    routes: ployz_edge::RouteController,
    mesh: Arc<crate::mesh::MeshView>,
}

/// How long the edge may take to publish a table without the drained container.
const PUBLISH_WAIT: Duration = Duration::from_secs(5);

/// How long a drain mark stands after its drain's wait and the container's stop grace period:
/// time for its setter to stop the container.
pub const HANDOFF: Duration = Duration::from_secs(60);

/// How long the mark of a drain called without a lease stands after the drain and the
/// container's stop grace period.
const UNLEASED_HANDOFF: Duration = Duration::from_secs(10);

/// Docker's stop timeout when a container sets none.
const DEFAULT_STOP_GRACE: Duration = Duration::from_secs(10);

/// How often the sweeper looks at this Machine's marks.
pub const SWEEP_EVERY: Duration = Duration::from_secs(2);

/// Held around every write of this Machine's drain marks, so a mark is lifted only while it is
/// still the one that was judged, never one a new drain wrote meanwhile.
static MARK_WRITES: Mutex<()> = Mutex::new(());

/// How long a drain waits for in-flight requests: what the request asks, else the container's
/// `stop_grace_period` (a request it would be given time to finish after SIGTERM deserves the
/// same time before it), else 30 s; at most an hour whatever was asked.
fn drain_timeout(asked: Option<u64>, container: &ContainerRuntimeObservation) -> Duration {
    asked
        .map(Duration::from_secs)
        .or(stop_grace_period(container))
        .unwrap_or(Duration::from_secs(30))
        .min(Duration::from_secs(3600))
}

fn stop_grace_period(container: &ContainerRuntimeObservation) -> Option<Duration> {
    container
        .spec
        .as_ref()
        .and_then(|s| s.container.stop_grace_period_ms)
        .map(Duration::from_millis)
}

fn container_id(id: &str) -> Result<ContainerId, Failure> {
    id.parse().map_err(|_| {
        failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            format!("'{id}' is not a Container ID"),
            Some("resolve names and prefixes with `GET /v1/containers` first"),
        )
    })
}

/// Lifts `mark` if it still stands as it was judged. Returns whether it did.
fn lift_if_unchanged(store: &Store, mark: &DrainMark, reason: &str) -> bool {
    let _writes = MARK_WRITES.lock().unwrap_or_else(PoisonError::into_inner);
    match drains::stored_mark(store, &mark.machine_id, &mark.container_id) {
        Ok(Some(current)) if &current == mark => {}
        _ => return false,
    }
    match store.delete(&drains::draining_key(&mark.machine_id, &mark.container_id)) {
        Ok(_) => {
            tracing::info!(
                container = %mark.container_id,
                set_by = %mark.set_by,
                lease_token = ?mark.lease_token,
                reason,
                "drain mark lifted"
            );
            true
        }
        Err(e) => {
            tracing::warn!(container = %mark.container_id, error = %e, "cannot lift a drain mark");
            false
        }
    }
}

/// The mark a drain wrote; dropped before the drain completed (its caller went away, or the
/// drain failed), it is lifted.
struct StandingMark {
    store: Arc<Store>,
    mark: Option<DrainMark>,
}

impl StandingMark {
    /// The drain completed: the mark stands for its setter to stop the container.
    fn keep(&mut self) {
        self.mark = None;
    }
}

impl Drop for StandingMark {
    fn drop(&mut self) {
        let Some(mark) = self.mark.take() else {
            return;
        };
        let store = self.store.clone();
        let lift = move || {
            lift_if_unchanged(&store, &mark, "its drain ended before completing");
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn_blocking(lift);
            }
            Err(_) => lift(),
        }
    }
}

async fn drain(
    State(s): State<DrainState>,
    call: Option<Extension<LeaseCall>>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, Failure> {
    let req: DrainRequest = crate::api::parse_body(&body)?;
    let d = s.machine.docker().ok_or_else(not_initialised)?;
    let store = s.machine.store().ok_or_else(not_initialised)?;
    let id = container_id(&id)?;
    let Some(container) = d.observe_container(id.as_str()).await? else {
        return Err(DockerError::NoSuchContainer(id.to_string()).into());
    };
    let started = tokio::time::Instant::now();
    // Bring the store up to date with Docker first, so the replacement this drain makes room for
    // is known healthy before the old one leaves the table.
    if let Err(e) = ployz_orchestrator::observer::resync(&d, &store).await {
        tracing::warn!(error = %e, "resync before drain failed");
    }
    let timeout = drain_timeout(req.timeout_seconds, &container);
    let call = call.map(|Extension(c)| c).unwrap_or(LeaseCall {
        token: None,
        set_by: "a call without a lease".to_owned(),
    });
    let set_at_ms = unix_ms();
    let stop_grace = stop_grace_period(&container).unwrap_or(DEFAULT_STOP_GRACE);
    let stands_for = PUBLISH_WAIT + timeout + stop_grace + HANDOFF;
    let unleased = call.token.is_none();
    let mark = DrainMark {
        container_id: container.id.clone(),
        machine_id: store.local().clone(),
        lease_token: call.token,
        set_by: call.set_by,
        set_at_ms,
        deadline_ms: set_at_ms + stands_for.as_millis() as u64,
    };
    let (mark_store, written) = (store.clone(), mark.clone());
    crate::api::store_blocking(move || {
        let _writes = MARK_WRITES.lock().unwrap_or_else(PoisonError::into_inner);
        drains::put_mark(&mark_store, &written)
    })
    .await?;
    let mut standing = StandingMark {
        store: store.clone(),
        mark: Some(mark),
    };

    // Hostnames another Serving Container still serves must keep an upstream meanwhile. A store
    // that cannot be read fails the drain (and lifts its mark): it cannot say which they are.
    let observations = {
        let store = store.clone();
        crate::api::store_blocking(move || ployz_store::observations::stored_observations(&store))
            .await?
    };
    let keep_served = ployz_edge::paths_served_by_others(&container, &observations);
    let drained = s
        .routes
        .drain(
            &container.id,
            &keep_served,
            started + PUBLISH_WAIT,
            started + timeout,
        )
        .await;
    if !drained.unrouted {
        tracing::warn!(
            container = %container.name,
            publish_wait_s = PUBLISH_WAIT.as_secs(),
            "the edge did not publish a table without the drained container (and with every \
             hostname others serve) in time; waiting for its requests in flight anyway"
        );
    }
    let left = drained.in_flight_left;
    let unconfirmed =
        confirmed_elsewhere(&s, &store, &container.id, set_at_ms, started + timeout).await;
    if !unconfirmed.is_empty() {
        tracing::warn!(
            container = %container.name,
            machines = %unconfirmed.join(", "),
            "these Machines' edges did not confirm they stopped routing to the drained container \
             and finished its requests before the drain timeout"
        );
    }
    if unleased {
        // A call without a lease has no holder whose going away lifts the mark: from here it
        // stands only for the stop that should follow, then the sweeper lifts it.
        if let Some(mark) = standing.mark.as_mut() {
            mark.deadline_ms = unix_ms() + (stop_grace + UNLEASED_HANDOFF).as_millis() as u64;
            let (mark_store, written) = (store.clone(), mark.clone());
            crate::api::store_blocking(move || {
                let _writes = MARK_WRITES.lock().unwrap_or_else(PoisonError::into_inner);
                drains::put_mark(&mark_store, &written)
            })
            .await?;
        }
    }
    standing.keep();
    let waited_ms = started.elapsed().as_millis() as u64;
    tracing::info!(container = %container.name, waited_ms, in_flight_left = left, "container drained");
    Ok(Json(DrainResult {
        waited_ms,
        in_flight_left: left,
        unconfirmed,
    })
    .into_response())
}

async fn undrain(State(s): State<DrainState>, Path(id): Path<String>) -> Result<Response, Failure> {
    let store = s.machine.store().ok_or_else(not_initialised)?;
    let container = container_id(&id)?;
    lift_drain_mark(&store, &container).await?;
    Ok(Json(serde_json::json!({})).into_response())
}

async fn list_drains(State(s): State<DrainState>) -> Result<Response, Failure> {
    let store = s.machine.store().ok_or_else(not_initialised)?;
    let marks = crate::api::store_blocking(move || drains::stored_marks(&store)).await?;
    Ok(Json(marks).into_response())
}

/// Deletes a container's drain mark, if it has one.
pub(crate) async fn lift_drain_mark(
    store: &Arc<Store>,
    container: &ContainerId,
) -> Result<(), Failure> {
    let key = drains::draining_key(store.local(), container);
    let store = store.clone();
    crate::api::store_blocking(move || {
        let _writes = MARK_WRITES.lock().unwrap_or_else(PoisonError::into_inner);
        if store.get(&key)?.is_some_and(|r| !r.tombstone) {
            store.delete(&key)?;
        }
        Ok::<(), StoreError>(())
    })
    .await
}

/// The drain marks standing on this Machine's containers, for the Deploy Snapshot: a Deploy
/// that could not see them would take a marked container for up to date.
pub(crate) async fn standing_marks(machine: &LocalMachine) -> Result<Vec<DrainMark>, Failure> {
    let store = machine.store().ok_or_else(not_initialised)?;
    crate::api::store_blocking(move || drains::marks_of(&store, store.local())).await
}

/// The drain routes, and the list of marks: they need the edge's route controller as well as
/// the Machine.
pub fn drain_router(
    machine: Arc<LocalMachine>,
    routes: ployz_edge::RouteController,
    mesh: Arc<crate::mesh::MeshView>,
) -> Router {
    Router::new()
        .route(paths::CONTAINER_DRAIN, post(drain).delete(undrain))
        .route(paths::DRAINS, get(list_drains))
        .with_state(DrainState {
            machine,
            routes,
            mesh,
        })
}

/// How often the Machines observed up are looked at again while a drain waits for their
/// reports (a report arriving wakes the wait at once).
const CONFIRM_RECHECK: Duration = Duration::from_millis(500);

/// Waits until the edge of every other Machine this Machine observes up reports the drain set at
/// `set_at_ms` on `container` applied with no request in flight, or until `deadline`. Answers
/// the Names of the Machines that did not (a Machine whose report cannot be read counts as one
/// that did not).
async fn confirmed_elsewhere(
    s: &DrainState,
    store: &Arc<Store>,
    container: &ContainerId,
    set_at_ms: u64,
    deadline: tokio::time::Instant,
) -> Vec<String> {
    let mut changes = store.watch(ployz_store::edge_reports::reports_prefix());
    loop {
        let up: Vec<ployz_core::MachineId> = s
            .mesh
            .observations()
            .into_iter()
            .filter(|(id, o)| {
                id != store.local() && o.membership == Some(ployz_core::MembershipObservation::Up)
            })
            .map(|(id, _)| id)
            .collect();
        let reports = {
            let store = store.clone();
            tokio::task::spawn_blocking(move || ployz_store::edge_reports::reports(&store))
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or_default()
        };
        let waiting: Vec<&ployz_core::MachineId> = up
            .iter()
            .filter(|id| {
                !reports
                    .iter()
                    .any(|(m, r)| m == *id && r.settled(container, set_at_ms))
            })
            .collect();
        if waiting.is_empty() {
            return Vec::new();
        }
        if tokio::time::Instant::now() >= deadline {
            return waiting
                .into_iter()
                .map(|id| {
                    s.machine
                        .member(id)
                        .map(|m| m.name.to_string())
                        .unwrap_or_else(|_| id.to_string())
                })
                .collect();
        }
        let recheck = (tokio::time::Instant::now() + CONFIRM_RECHECK).min(deadline);
        tokio::select! {
            _ = changes.next() => {}
            _ = tokio::time::sleep_until(recheck) => {}
        }
    }
}

/// Why a mark should not stand any more, if so. `running` is what Docker shows of its container
/// (`None`: gone), or `None` altogether when Docker did not answer.
fn lapsed(
    mark: &DrainMark,
    now_ms: u64,
    running: Option<Option<bool>>,
    lease: &MachineLease,
) -> Option<&'static str> {
    if now_ms >= mark.deadline_ms {
        return Some("its deadline passed");
    }
    match running? {
        None => Some("its container is gone"),
        Some(true)
            if !lease.busy_with(&mark.container_id) && !lease.setter_alive(mark.lease_token) =>
        {
            Some("the command that set it no longer holds this Machine's lease and the container still runs")
        }
        Some(_) => None,
    }
}

/// Lifts the marks of this Machine that should not stand (see the module docs). Returns how
/// many it lifted.
pub async fn sweep(machine: &LocalMachine, lease: &MachineLease) -> usize {
    let Some(store) = machine.store() else {
        return 0;
    };
    let marks = {
        let store = store.clone();
        match crate::api::store_blocking(move || drains::marks_of(&store, store.local())).await {
            Ok(marks) => marks,
            Err(e) => {
                tracing::warn!(error = %e, "drain marks: the store cannot be read; the next sweep tries again");
                return 0;
            }
        }
    };
    if marks.is_empty() {
        return 0;
    }
    // What Docker shows now; when it does not answer, only deadlines count.
    let observed: Option<HashMap<ContainerId, bool>> = match machine.docker() {
        Some(d) => match d.observe().await {
            Ok(list) => Some(
                list.iter()
                    .map(|c| (c.id.clone(), c.is_running()))
                    .collect(),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "drain marks: Docker did not answer; lifting only those past their deadline");
                None
            }
        },
        None => None,
    };
    let now = unix_ms();
    let lift: Vec<(DrainMark, &'static str)> = marks
        .into_iter()
        .filter_map(|mark| {
            let running = observed
                .as_ref()
                .map(|o| o.get(&mark.container_id).copied());
            lapsed(&mark, now, running, lease).map(|why| (mark, why))
        })
        .collect();
    if lift.is_empty() {
        return 0;
    }
    tokio::task::spawn_blocking(move || {
        lift.iter()
            .filter(|(mark, why)| lift_if_unchanged(&store, mark, why))
            .count()
    })
    .await
    .unwrap_or(0)
}

/// Lifts the drain marks that should not stand: at start, every [`SWEEP_EVERY`], and when the
/// lease is released.
pub struct Sweeper {
    machine: Arc<LocalMachine>,
    lease: Arc<MachineLease>,
}

impl Sweeper {
    pub fn new(machine: Arc<LocalMachine>, lease: Arc<MachineLease>) -> Sweeper {
        Sweeper { machine, lease }
    }
}

#[async_trait]
impl BackgroundService for Sweeper {
    async fn start(&self, mut shutdown: ShutdownWatch) {
        loop {
            sweep(&self.machine, &self.lease).await;
            tokio::select! {
                _ = shutdown.changed() => return,
                _ = tokio::time::sleep(SWEEP_EVERY) => {}
                _ = self.lease.released() => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(token: Option<u64>, deadline_ms: u64) -> DrainMark {
        DrainMark {
            container_id: "ab12".parse().unwrap(),
            machine_id: ployz_core::MachineId::generate(),
            lease_token: token,
            set_by: "alice@build-1 (pid 7), running `deploy of web`".into(),
            set_at_ms: 1_000,
            deadline_ms,
        }
    }

    #[test]
    fn a_mark_stands_only_while_its_setter_may_still_stop_the_container() {
        let dir = tempfile::tempdir().unwrap();
        let machine =
            Arc::new(LocalMachine::open(crate::identity::DataDir::new(dir.path()), None).unwrap());
        let lease = MachineLease::new(machine);
        let now = 50_000;
        // No one holds the lease: a mark set under lease 3 is an orphan on a running container.
        let leased = mark(Some(3), 100_000);
        assert!(lapsed(&leased, now, Some(Some(true)), &lease).is_some());
        // ...but harmless on a stopped one, which keeps it until its deadline.
        assert_eq!(lapsed(&leased, now, Some(Some(false)), &lease), None);
        assert_eq!(
            lapsed(&leased, 100_000, Some(Some(false)), &lease),
            Some("its deadline passed")
        );
        assert_eq!(
            lapsed(&leased, now, Some(None), &lease),
            Some("its container is gone")
        );
        // Docker did not answer: only the deadline counts.
        assert_eq!(lapsed(&leased, now, None, &lease), None);
        // A mark set without a lease stands while no one holds it, until its deadline.
        let unleased = mark(None, 100_000);
        assert_eq!(lapsed(&unleased, now, Some(Some(true)), &lease), None);
        assert!(lapsed(&unleased, 100_000, Some(Some(true)), &lease).is_some());
    }
}
