//! The Machine lease: one command at a time (a Deploy, or `ployz rm`, `stop`, `start`) changes
//! this Machine's containers and volumes, and every call it makes carries the lease's fencing
//! token.
//!
//! - `POST /v1/lease` grants the lease when no live holder has it, with a token higher than any
//!   this Machine issued before: the highest is recorded in the store (flushed) before the grant
//!   is answered, so a restarted daemon never issues a token twice. A holder whose lease lapsed
//!   is taken over, and the drain sweeper runs before the grant is answered, so the newcomer's
//!   snapshot shows no mark its predecessor left.
//! - The holder is alive while one of its calls is in flight and for [`LEASE_TTL`] after its
//!   last one: every call carrying its token renews the lease (`PUT` renews it explicitly, for a
//!   holder waiting on a person). A holder that died loses the lease that long after its last
//!   call; a lapsed lease is never renewed again.
//! - [`guard`], a layer over the whole API, checks every call that changes containers or volumes
//!   (the Docker routes other than reads and exec). With a token that is not the live holder's,
//!   the call is refused and changes nothing: a stale holder's late operation is never applied.
//!   Without a token, it is refused while a holder is alive, and otherwise runs unleased (direct
//!   API calls, `ployz volume`); the lease is not granted while such calls run.
//! - The containers those calls act on are known while they run ([`MachineLease::busy_with`]),
//!   so the drain sweeper never lifts the mark of a container being drained or stopped.
//! - Each grant is recorded in the store as open until its holder releases it while alive. A
//!   lease that ends otherwise (its holder killed, cut off after it lapsed, or the daemon
//!   restarted under it) stays recorded: an interrupted command. The Deploy Snapshot reports the
//!   newest [`KEPT_INTERRUPTED`] of them, and containers carry the token they were created
//!   under (`ployz.lease-token`), so a later Deploy can tell what unfinished work left.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use ployz_core::api::{
    docker_paths as paths, ErrorCode, InterruptedLease, LeaseAnswer, LeaseHolder, LeaseRequest,
    LEASE_TOKEN_HEADER,
};
use ployz_core::{ContainerId, MachineId};
use ployz_store::{Key, KeyPrefix, Store, StoreError};

use crate::api::{failure, not_initialised, Failure};
use crate::local_machine::LocalMachine;

/// How long the lease outlives its holder's last call.
pub const LEASE_TTL: Duration = Duration::from_secs(10);

/// Store namespace of this Machine's lease records (machine-owned).
const LEASES_NAMESPACE: &str = "leases";

/// The record of the highest fencing token this Machine issued, in decimal.
fn highest_token_key(machine: &MachineId) -> Key {
    Key::machine(machine, LEASES_NAMESPACE, "highest-token")
}

/// How many interrupted commands' records a Machine keeps, newest first.
pub const KEPT_INTERRUPTED: usize = 16;

/// Names of the records of leases granted and not released by a live holder.
const OPEN_PREFIX: &str = "open-";

/// The record of lease `token` while it is open (JSON of an [`InterruptedLease`]).
fn open_key(machine: &MachineId, token: u64) -> Key {
    Key::machine(
        machine,
        LEASES_NAMESPACE,
        format!("{OPEN_PREFIX}{token:020}"),
    )
}

/// Every open lease record of this Machine, by token; one that does not decode is skipped.
fn open_records(store: &Store) -> Result<Vec<InterruptedLease>, StoreError> {
    let prefix = KeyPrefix::machine_namespace_of(LEASES_NAMESPACE, store.local());
    let mut out: Vec<InterruptedLease> = store
        .scan_live(&prefix)?
        .iter()
        .filter(|r| r.key.name().starts_with(OPEN_PREFIX))
        .filter_map(|r| r.live_value().and_then(|v| serde_json::from_slice(v).ok()))
        .collect();
    out.sort_by_key(|l| l.token);
    Ok(out)
}

/// Records lease `opened` as open, and forgets the oldest interrupted ones beyond
/// [`KEPT_INTERRUPTED`].
fn record_open(store: &Store, opened: &InterruptedLease) -> Result<(), StoreError> {
    store.put(
        &open_key(store.local(), opened.token),
        serde_json::to_vec(opened).expect("a lease record serializes"),
    )?;
    let earlier: Vec<u64> = open_records(store)?
        .into_iter()
        .map(|l| l.token)
        .filter(|t| *t != opened.token)
        .collect();
    for token in earlier
        .iter()
        .take(earlier.len().saturating_sub(KEPT_INTERRUPTED))
    {
        store.delete(&open_key(store.local(), *token))?;
    }
    Ok(())
}

/// Milliseconds since the Unix epoch.
pub(crate) fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What the guard tells the handlers about a call: its lease token and who made it (what a drain
/// mark records as its setter).
#[derive(Debug, Clone)]
pub struct LeaseCall {
    pub token: Option<u64>,
    pub set_by: String,
}

/// This Machine's lease.
pub struct MachineLease {
    machine: Arc<LocalMachine>,
    ttl: Duration,
    state: Mutex<LeaseState>,
    /// Serializes grants (each writes the store).
    granting: tokio::sync::Mutex<()>,
    /// Woken when a holder releases the lease.
    released: tokio::sync::Notify,
}

#[derive(Default)]
struct LeaseState {
    holder: Option<Holder>,
    /// Calls without a lease that change the Machine, in flight.
    unleased: usize,
    /// Containers a call that changes them is acting on, with how many such calls.
    busy: HashMap<ContainerId, usize>,
    /// The highest token this process granted.
    highest: u64,
}

struct Holder {
    token: u64,
    holder: String,
    command: String,
    since_ms: u64,
    since: Instant,
    last_call: Instant,
    in_flight: usize,
}

impl Holder {
    fn alive(&self, ttl: Duration) -> bool {
        self.in_flight > 0 || self.last_call.elapsed() < ttl
    }

    fn view(&self, ttl: Duration) -> LeaseHolder {
        LeaseHolder {
            token: self.token,
            holder: self.holder.clone(),
            command: self.command.clone(),
            since_ms: self.since_ms,
            held_ms: self.since.elapsed().as_millis() as u64,
            ttl_ms: ttl.as_millis() as u64,
        }
    }

    /// Who makes calls with this lease, as a drain mark names its setter.
    fn describe(&self) -> String {
        format!("{}, running `{}`", self.holder, self.command)
    }
}

/// Whether a call may proceed (the holder that made it, or a call without a lease).
enum Admitted {
    Holder(u64),
    Unleased,
}

/// A call admitted by the guard; dropping it (the call ended, or its client went away) renews
/// the holder's lease from that moment and forgets the container.
struct Ticket {
    lease: Arc<MachineLease>,
    admitted: Admitted,
    container: Option<ContainerId>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut state = self.lease.lock();
        match self.admitted {
            Admitted::Holder(token) => {
                if let Some(h) = state.holder.as_mut().filter(|h| h.token == token) {
                    h.in_flight = h.in_flight.saturating_sub(1);
                    h.last_call = Instant::now();
                }
            }
            Admitted::Unleased => state.unleased = state.unleased.saturating_sub(1),
        }
        if let Some(c) = &self.container {
            if let Entry::Occupied(mut e) = state.busy.entry(c.clone()) {
                *e.get_mut() -= 1;
                if *e.get() == 0 {
                    e.remove();
                }
            }
        }
    }
}

impl MachineLease {
    pub fn new(machine: Arc<LocalMachine>) -> Arc<MachineLease> {
        Arc::new(MachineLease {
            machine,
            ttl: LEASE_TTL,
            state: Mutex::default(),
            granting: tokio::sync::Mutex::new(()),
            released: tokio::sync::Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, LeaseState> {
        self.state.lock().expect("lease state poisoned")
    }

    /// The live holder, if any.
    pub fn status(&self) -> Option<LeaseHolder> {
        let state = self.lock();
        state
            .holder
            .as_ref()
            .filter(|h| h.alive(self.ttl))
            .map(|h| h.view(self.ttl))
    }

    /// Whether the command that set a drain mark with `token` may still stop its container: the
    /// live holder when the mark was set under a lease; when it was set without one, anyone, as
    /// long as no one holds the lease (such a caller's stop would be refused meanwhile).
    pub fn setter_alive(&self, token: Option<u64>) -> bool {
        let state = self.lock();
        let live = state.holder.as_ref().filter(|h| h.alive(self.ttl));
        match (token, live) {
            (Some(t), Some(h)) => h.token == t,
            (Some(_), None) => false,
            (None, live) => live.is_none(),
        }
    }

    /// Whether a call that changes `container` (a drain, stop, removal...) is running now.
    pub fn busy_with(&self, container: &ContainerId) -> bool {
        self.lock().busy.contains_key(container)
    }

    /// Completes when a holder releases the lease.
    pub async fn released(&self) {
        self.released.notified().await
    }

    /// Why the lease cannot be granted now, if it cannot.
    fn refusal(&self, state: &LeaseState) -> Option<LeaseAnswer> {
        if let Some(h) = state.holder.as_ref().filter(|h| h.alive(self.ttl)) {
            return Some(LeaseAnswer::Held {
                holder: h.view(self.ttl),
            });
        }
        (state.unleased > 0).then_some(LeaseAnswer::Busy {
            operations: state.unleased,
        })
    }

    /// Grants the lease unless a live holder has it or unleased calls run.
    async fn acquire(&self, request: LeaseRequest) -> Result<LeaseAnswer, Failure> {
        check_text("holder", &request.holder)?;
        check_text("command", &request.command)?;
        let store = self.machine.store().ok_or_else(not_initialised)?;
        let _granting = self.granting.lock().await;
        let floor = {
            let state = self.lock();
            if let Some(answer) = self.refusal(&state) {
                return Ok(answer);
            }
            state.highest
        };
        let (holder_name, command) = (request.holder.clone(), request.command.clone());
        let token = crate::api::store_blocking(move || {
            let token = next_token(&store, floor)?;
            record_open(
                &store,
                &InterruptedLease {
                    token,
                    holder: holder_name,
                    command,
                    since_ms: unix_ms(),
                },
            )?;
            Ok::<_, StoreError>(token)
        })
        .await?;
        let mut state = self.lock();
        state.highest = state.highest.max(token);
        // An unleased call may have started while the token was written.
        if let Some(answer) = self.refusal(&state) {
            return Ok(answer);
        }
        let now = Instant::now();
        let holder = Holder {
            token,
            holder: request.holder,
            command: request.command,
            since_ms: unix_ms(),
            since: now,
            last_call: now,
            in_flight: 0,
        };
        let view = holder.view(self.ttl);
        let took_over = state.holder.replace(holder).map(|h| h.view(self.ttl));
        Ok(LeaseAnswer::Granted {
            holder: view,
            took_over,
        })
    }

    /// Renews the live holder's lease.
    fn renew(&self, token: u64) -> Result<LeaseHolder, Failure> {
        let mut state = self.lock();
        let ttl = self.ttl;
        match state.holder.as_mut() {
            Some(h) if h.token == token && h.alive(ttl) => {
                h.last_call = Instant::now();
                Ok(h.view(ttl))
            }
            _ => Err(self.stale(token, &state)),
        }
    }

    /// Releases the lease if `token` holds it (lapsed or not), answering whether its holder
    /// was alive; anything else is a no-op (`None`).
    fn release(&self, token: u64) -> Option<bool> {
        let mut state = self.lock();
        let alive = state
            .holder
            .as_ref()
            .filter(|h| h.token == token)
            .map(|h| h.alive(self.ttl))?;
        state.holder = None;
        drop(state);
        self.released.notify_one();
        Some(alive)
    }

    /// The commands whose lease ended without a release by a live holder, oldest first: every
    /// open record but the live holder's.
    pub async fn interrupted(&self) -> Result<Vec<InterruptedLease>, Failure> {
        let store = self.machine.store().ok_or_else(not_initialised)?;
        let mut records = crate::api::store_blocking(move || open_records(&store)).await?;
        if let Some(live) = self.status() {
            records.retain(|r| r.token != live.token);
        }
        Ok(records)
    }

    /// Admits a call that changes the Machine, or says why not.
    fn admit(
        self: &Arc<Self>,
        token: Option<u64>,
        container: Option<ContainerId>,
    ) -> Result<(Ticket, String), Failure> {
        let mut state = self.lock();
        let ttl = self.ttl;
        let (admitted, set_by) = match token {
            Some(t) => match state.holder.as_mut() {
                Some(h) if h.token == t && h.alive(ttl) => {
                    h.in_flight += 1;
                    h.last_call = Instant::now();
                    (Admitted::Holder(t), h.describe())
                }
                _ => return Err(self.stale(t, &state)),
            },
            None => {
                if let Some(h) = state.holder.as_ref().filter(|h| h.alive(ttl)) {
                    return Err(self.busy(h.view(ttl)));
                }
                state.unleased += 1;
                (Admitted::Unleased, UNLEASED.to_owned())
            }
        };
        if let Some(c) = &container {
            *state.busy.entry(c.clone()).or_default() += 1;
        }
        let ticket = Ticket {
            lease: self.clone(),
            admitted,
            container,
        };
        Ok((ticket, set_by))
    }

    /// A call that changes nothing: when it carries the live holder's token, it renews the
    /// lease (and keeps it while it runs).
    fn touch(self: &Arc<Self>, token: Option<u64>) -> Option<(Ticket, String)> {
        let token = token?;
        let mut state = self.lock();
        let ttl = self.ttl;
        let h = state
            .holder
            .as_mut()
            .filter(|h| h.token == token && h.alive(ttl))?;
        h.in_flight += 1;
        h.last_call = Instant::now();
        let set_by = h.describe();
        drop(state);
        let ticket = Ticket {
            lease: self.clone(),
            admitted: Admitted::Holder(token),
            container: None,
        };
        Some((ticket, set_by))
    }

    fn stale(&self, token: u64, state: &LeaseState) -> Failure {
        let now = match state.holder.as_ref().filter(|h| h.alive(self.ttl)) {
            Some(h) => format!("it is held by {}", h.view(self.ttl)),
            None => format!(
                "no one holds it: lease {token} was released, or lapsed after {} s without a call from its holder",
                self.ttl.as_secs()
            ),
        };
        failure(
            StatusCode::CONFLICT,
            ErrorCode::FailedPrecondition,
            format!(
                "lease token {token} is not this Machine's lease ({now}); this call was refused and changed nothing"
            ),
            Some("the command lost its lease; run it again, and it plans from what the Machine shows then"),
        )
    }

    fn busy(&self, holder: LeaseHolder) -> Failure {
        failure(
            StatusCode::CONFLICT,
            ErrorCode::Unavailable,
            format!("this Machine is busy: its lease is held by {holder}"),
            Some(&format!(
                "wait for that command to finish and try again (a holder that died loses the lease {} s after its last call)",
                self.ttl.as_secs()
            )),
        )
    }
}

/// How long the drain-mark sweep before a grant may take: well under the lease's time to live.
const GRANT_SWEEP_LIMIT: Duration = Duration::from_secs(3);

/// What a drain mark set by a call without a lease names as its setter.
const UNLEASED: &str = "a call without a lease";

/// The next fencing token: above both what the store recorded and what this process granted,
/// recorded (flushed) before it is returned.
fn next_token(store: &Store, floor: u64) -> Result<u64, StoreError> {
    let key = highest_token_key(store.local());
    let stored = match store.get(&key)?.as_ref().and_then(|r| r.live_value()) {
        None => 0,
        Some(v) => match std::str::from_utf8(v)
            .ok()
            .and_then(|s| s.trim().parse().ok())
        {
            Some(n) => n,
            None => {
                // Never issue a token twice: the clock in milliseconds is above any count.
                tracing::error!(
                    "the record of the highest lease token does not decode; counting on from the clock"
                );
                unix_ms()
            }
        },
    };
    let token = stored.max(floor).checked_add(1).ok_or_else(|| {
        StoreError::Malformed(format!(
            "the highest lease token issued is recorded as {}, the largest there is: no token \
             higher can be issued; restore the data dir",
            stored.max(floor)
        ))
    })?;
    store.put(&key, token.to_string().into_bytes())?;
    Ok(token)
}

fn check_text(field: &str, value: &str) -> Result<(), Failure> {
    if value.trim().is_empty() || value.len() > 200 || value.chars().any(char::is_control) {
        let shown: String = value.chars().filter(|c| !c.is_control()).take(60).collect();
        return Err(failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            format!("{field}: '{shown}' is not a one-line description of 1 to 200 characters"),
            Some("name who asks (user@host (pid N)) and what for (the command)"),
        ));
    }
    Ok(())
}

/// The token a call carries, if any.
fn lease_token(headers: &HeaderMap) -> Result<Option<u64>, Failure> {
    let Some(value) = headers.get(LEASE_TOKEN_HEADER) else {
        return Ok(None);
    };
    value
        .to_str()
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map(Some)
        .ok_or_else(|| {
            let shown: String = String::from_utf8_lossy(value.as_bytes())
                .chars()
                .take(40)
                .collect();
            failure(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidArgument,
                format!("header {LEASE_TOKEN_HEADER}: '{shown}' is not a lease token"),
                Some("send the decimal token that `POST /v1/lease` granted"),
            )
        })
}

/// What a call does to the Machine.
#[derive(Debug, PartialEq, Eq)]
enum Call {
    /// The lease's own routes: they check the token themselves.
    Lease,
    /// Reads, and exec (it runs in a container; no container is created, changed or removed).
    Read,
    /// Creates, starts, stops, drains or removes containers, runs hooks, creates or removes
    /// volumes; `container` when the path names one.
    Change { container: Option<ContainerId> },
}

fn classify(method: &Method, path: &str) -> Call {
    if path == paths::LEASE {
        return Call::Lease;
    }
    let under = |prefix: &str| {
        path == prefix
            || path
                .strip_prefix(prefix)
                .is_some_and(|rest| rest.starts_with('/'))
    };
    let docker = under(paths::CONTAINERS) || under(paths::HOOKS) || under(paths::VOLUMES);
    if !docker || matches!(*method, Method::GET | Method::HEAD) {
        return Call::Read;
    }
    let mut segments = path
        .strip_prefix(paths::CONTAINERS)
        .and_then(|rest| rest.strip_prefix('/'))
        .map(|rest| rest.split('/'))
        .into_iter()
        .flatten();
    let container = segments.next().and_then(|id| id.parse().ok());
    if *method == Method::POST && segments.next() == Some("exec") {
        return Call::Read;
    }
    Call::Change { container }
}

/// The layer over the API: admits or refuses each call by its lease token (see the module
/// docs), and hands the handlers a [`LeaseCall`].
pub async fn guard(
    State(lease): State<Arc<MachineLease>>,
    mut request: Request,
    next: Next,
) -> Response {
    let token = match lease_token(request.headers()) {
        Ok(t) => t,
        Err(f) => return f.into_response(),
    };
    let admitted = match classify(request.method(), request.uri().path()) {
        Call::Lease => None,
        Call::Read => lease.touch(token),
        Call::Change { container } => match lease.admit(token, container) {
            Ok(a) => Some(a),
            Err(f) => return f.into_response(),
        },
    };
    let (ticket, set_by) = match admitted {
        Some((ticket, set_by)) => (Some(ticket), set_by),
        None => (None, UNLEASED.to_owned()),
    };
    request.extensions_mut().insert(LeaseCall { token, set_by });
    request.extensions_mut().insert(lease.clone());
    let response = next.run(request).await;
    drop(ticket);
    response
}

async fn take(State(lease): State<Arc<MachineLease>>, body: Bytes) -> Result<Response, Failure> {
    let request: LeaseRequest = serde_json::from_slice(&body).map_err(|e| {
        failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            format!("request body is not a lease request: {e}"),
            Some(r#"send {"holder": "who asks", "command": "what for"}"#),
        )
    })?;
    let answer = lease.acquire(request).await?;
    if let LeaseAnswer::Granted { holder, took_over } = &answer {
        match took_over {
            Some(previous) => tracing::warn!(
                token = holder.token,
                holder = %holder.holder,
                command = %holder.command,
                took_over_from = %previous,
                "Machine lease taken over from a holder that stopped calling"
            ),
            None => tracing::info!(
                token = holder.token,
                holder = %holder.holder,
                command = %holder.command,
                "Machine lease granted"
            ),
        }
        // The newcomer plans from what it observes next: no mark a predecessor left stands.
        // Bounded, so a slow Docker cannot outlast the lease being granted.
        if tokio::time::timeout(
            GRANT_SWEEP_LIMIT,
            crate::drain::sweep(&lease.machine, &lease),
        )
        .await
        .is_err()
        {
            tracing::warn!(
                limit_s = GRANT_SWEEP_LIMIT.as_secs(),
                "drain marks: the sweep before a grant took too long; the periodic sweep goes on"
            );
        }
        // The lease's time runs from the answer, not from the grant before the sweep.
        if let Ok(renewed) = lease.renew(holder.token) {
            return Ok(Json(LeaseAnswer::Granted {
                holder: renewed,
                took_over: took_over.clone(),
            })
            .into_response());
        }
    }
    Ok(Json(answer).into_response())
}

fn required_token(headers: &HeaderMap) -> Result<u64, Failure> {
    lease_token(headers)?.ok_or_else(|| {
        failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            format!("header {LEASE_TOKEN_HEADER}: missing"),
            Some("send the token the lease was granted with"),
        )
    })
}

async fn renew(
    State(lease): State<Arc<MachineLease>>,
    headers: HeaderMap,
) -> Result<Json<LeaseHolder>, Failure> {
    lease.renew(required_token(&headers)?).map(Json)
}

async fn release(
    State(lease): State<Arc<MachineLease>>,
    headers: HeaderMap,
) -> Result<Json<serde_json::Value>, Failure> {
    let token = required_token(&headers)?;
    match lease.release(token) {
        Some(true) => {
            // Released by a live holder: its work ended, it did not break off.
            let store = lease.machine.store().ok_or_else(not_initialised)?;
            let key = open_key(store.local(), token);
            crate::api::store_blocking(move || store.delete(&key).map(|_| ())).await?;
            tracing::info!(token, "Machine lease released");
        }
        Some(false) => tracing::warn!(
            token,
            "Machine lease released after it lapsed; it stays recorded as interrupted"
        ),
        None => {}
    }
    Ok(Json(serde_json::json!({})))
}

async fn status(State(lease): State<Arc<MachineLease>>) -> Json<Option<LeaseHolder>> {
    Json(lease.status())
}

/// The API with the lease's routes, and the lease's guard over every call.
pub fn guarded(api: Router, lease: Arc<MachineLease>) -> Router {
    api.merge(
        Router::new()
            .route(
                paths::LEASE,
                get(status).post(take).put(renew).delete(release),
            )
            .with_state(lease.clone()),
    )
    .layer(axum::middleware::from_fn_with_state(lease, guard))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_rise_from_the_record_and_never_wrap() {
        let store = Store::temporary(MachineId::generate()).unwrap();
        assert_eq!(next_token(&store, 0).unwrap(), 1);
        assert_eq!(next_token(&store, 0).unwrap(), 2);
        assert_eq!(next_token(&store, 40).unwrap(), 41);
        store
            .put(
                &highest_token_key(store.local()),
                u64::MAX.to_string().into_bytes(),
            )
            .unwrap();
        let err = next_token(&store, 0).unwrap_err().to_string();
        assert!(err.contains("no token higher can be issued"), "{err}");
    }

    #[test]
    fn open_records_keep_the_newest_interrupted_ones() {
        let store = Store::temporary(MachineId::generate()).unwrap();
        let lease = |token| InterruptedLease {
            token,
            holder: "ci@runner (pid 1)".into(),
            command: format!("deploy {token}"),
            since_ms: token,
        };
        for token in 1..=(KEPT_INTERRUPTED as u64 + 5) {
            record_open(&store, &lease(token)).unwrap();
        }
        let kept: Vec<u64> = open_records(&store)
            .unwrap()
            .iter()
            .map(|l| l.token)
            .collect();
        // The newest one (open now) and the KEPT_INTERRUPTED before it.
        let want: Vec<u64> = (5..=KEPT_INTERRUPTED as u64 + 5).collect();
        assert_eq!(kept, want);
        assert_eq!(open_records(&store).unwrap()[0], lease(5));
        // A record that does not decode is skipped, not fatal.
        store
            .put(&open_key(store.local(), 99), b"{not json".to_vec())
            .unwrap();
        assert_eq!(open_records(&store).unwrap().len(), want.len());
    }

    fn change(container: Option<&str>) -> Call {
        Call::Change {
            container: container.map(|c| c.parse().unwrap()),
        }
    }

    #[test]
    fn calls_that_change_containers_or_volumes_are_the_guarded_ones() {
        let id = "ab12";
        let cases = [
            (Method::GET, "/v1/snapshot", Call::Read),
            (Method::GET, "/v1/containers", Call::Read),
            (Method::POST, "/v1/containers", change(None)),
            (Method::GET, "/v1/containers/ab12", Call::Read),
            (Method::DELETE, "/v1/containers/ab12", change(Some(id))),
            (Method::POST, "/v1/containers/ab12/stop", change(Some(id))),
            (Method::POST, "/v1/containers/ab12/start", change(Some(id))),
            (Method::POST, "/v1/containers/ab12/drain", change(Some(id))),
            (
                Method::DELETE,
                "/v1/containers/ab12/drain",
                change(Some(id)),
            ),
            (Method::POST, "/v1/containers/ab12/exec", Call::Read),
            (Method::GET, "/v1/containers/ab12/logs", Call::Read),
            (Method::POST, "/v1/hooks", change(None)),
            (Method::POST, "/v1/volumes", change(None)),
            (Method::DELETE, "/v1/volumes/data", change(None)),
            (
                Method::DELETE,
                "/v1/volumes/..%2Fcontainers%2Fab12",
                change(None),
            ),
            (Method::POST, "/v1/containers/NOT-AN-ID/stop", change(None)),
            (Method::POST, "/v1/lease", Call::Lease),
            (Method::PUT, "/v1/lease", Call::Lease),
            (Method::POST, "/v1/machines/init", Call::Read),
            (Method::POST, "/v1/containersx", Call::Read),
        ];
        for (method, path, want) in cases {
            assert_eq!(classify(&method, path), want, "{method} {path}");
        }
    }

    fn lease() -> (tempfile::TempDir, Arc<MachineLease>) {
        let dir = tempfile::tempdir().unwrap();
        let machine = crate::local_machine::LocalMachine::open(
            crate::identity::DataDir::new(dir.path()),
            None,
        )
        .unwrap();
        (dir, MachineLease::new(Arc::new(machine)))
    }

    fn message(f: Failure) -> String {
        let body = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(axum::body::to_bytes(f.into_response().into_body(), 1 << 20))
            .unwrap();
        String::from_utf8_lossy(&body).into_owned()
    }

    fn holder(lease: &MachineLease, token: u64, last_call_ago: Duration) {
        let now = Instant::now();
        lease.lock().holder = Some(Holder {
            token,
            holder: "alice@build-1 (pid 7)".into(),
            command: "deploy of web".into(),
            since_ms: 0,
            since: now,
            last_call: now - last_call_ago,
            in_flight: 0,
        });
    }

    #[test]
    fn only_the_live_holder_is_admitted_and_a_lapsed_one_never_again() {
        let (_dir, lease) = lease();
        // Free: a call without a lease runs, and the lease is not granted meanwhile.
        let (unleased, set_by) = lease.admit(None, None).ok().expect("admitted");
        assert_eq!(set_by, UNLEASED);
        assert!(matches!(
            lease.refusal(&lease.lock()),
            Some(LeaseAnswer::Busy { operations: 1 })
        ));
        drop(unleased);
        assert!(lease.refusal(&lease.lock()).is_none());

        holder(&lease, 5, Duration::ZERO);
        let err = message(lease.admit(None, None).err().unwrap());
        assert!(err.contains("busy"), "{err}");
        assert!(
            err.contains("alice@build-1 (pid 7), running `deploy of web`"),
            "{err}"
        );
        let err = message(lease.admit(Some(4), None).err().unwrap());
        assert!(
            err.contains("lease token 4 is not this Machine's lease"),
            "{err}"
        );
        let container: ContainerId = "ab12".parse().unwrap();
        let (ticket, set_by) = lease
            .admit(Some(5), Some(container.clone()))
            .ok()
            .expect("admitted");
        assert!(set_by.contains("alice@build-1"), "{set_by}");
        assert!(lease.busy_with(&container));
        assert!(lease.setter_alive(Some(5)));
        assert!(!lease.setter_alive(Some(4)));
        assert!(!lease.setter_alive(None));
        drop(ticket);
        assert!(!lease.busy_with(&container));

        // A call in flight keeps the lease however long it takes; after it, the lease lasts
        // its TTL; a lapsed lease is neither admitted nor renewed.
        holder(&lease, 5, LEASE_TTL * 2);
        assert!(lease.admit(Some(5), None).is_err());
        assert!(lease.renew(5).is_err());
        assert!(!lease.setter_alive(Some(5)));
        assert!(lease.setter_alive(None));
        assert!(lease.status().is_none());
        assert!(lease.admit(None, None).is_ok());
    }
}
