//! Machine Targets on the management API: a call whose [`MACHINE_TARGET_HEADER`] names another
//! Machine is forwarded over the mesh to that Machine's management API (its mesh listener,
//! `[Management Address]:51000`) and its answer handed back as it is; a call naming several
//! Machines, or `*`, is asked of each at once (`GET` only) and answered as a Partial Result
//! ([`FanOutAnswer`]): every answer, and per Machine that failed or did not answer within
//! [`PER_MACHINE_TIMEOUT`], why.
//!
//! A forwarded call carries no new authority: the Machine that receives it serves it like a call
//! on its own socket (the Machine lease included), and takes calls on its mesh listener only
//! from the Management Addresses of members of its roster ([`only_members`]), never from its own
//! ([`from_another_machine`]); a call that names yet another Machine there is refused, never
//! forwarded twice ([`no_second_hop`]).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Router;
use ployz_core::api::{
    ApiError, ErrorCode, FanOutAnswer, MachineAnswer, Member, MACHINE_TARGET_HEADER,
};
use ployz_core::{MachineId, TargetFailure};

use crate::api::{failure, ConnectedFrom, Failure};
use crate::local_machine::LocalMachine;
use crate::mesh::MeshView;

/// How long one Machine of a fan-out, or a forwarded call's connect and answer head, may take.
pub const PER_MACHINE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long this Machine's own share of a fan-out may take: its calls to Docker have their own
/// bound ([`CALL_TIMEOUT`](ployz_orchestrator::docker::CALL_TIMEOUT)), whose error names the
/// engine that did not answer; this one ends what has none (a followed log asked of every
/// Machine).
const LOCAL_SHARE_TIMEOUT: Duration =
    Duration::from_secs(ployz_orchestrator::docker::CALL_TIMEOUT.as_secs() + 5);
/// The most one Machine's share of a fan-out may hold: a listing of thousands of containers
/// fits many times over; what is longer (a log, a stream) is asked of one Machine alone.
const MAX_SHARE_BYTES: usize = 16 * 1024 * 1024;
/// The most a forwarded request's body may hold (the API's own limit).
const MAX_FORWARDED_BODY: usize = ployz_core::api::MAX_BODY_BYTES;

/// What forwarding needs: this Machine, the mesh's settings, and the local API (for this
/// Machine's own share of a fan-out).
#[derive(Clone)]
pub(crate) struct Forwarding {
    pub machine: Arc<LocalMachine>,
    pub mesh: Arc<MeshView>,
    pub local: Router,
}

/// The Machines a header names.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Targets {
    All,
    These(Vec<MachineId>),
}

fn parse_targets(value: &HeaderValue) -> Result<Targets, Failure> {
    let text = value.to_str().unwrap_or_default().trim();
    if text == "*" {
        return Ok(Targets::All);
    }
    let mut ids = Vec::new();
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let id: MachineId = part.parse().map_err(|_| {
            failure(
                StatusCode::BAD_REQUEST,
                ErrorCode::InvalidArgument,
                format!("{MACHINE_TARGET_HEADER}: '{part}' is not a Machine ID"),
                Some("name Machines by ID there (the CLI resolves names), or `*` for all"),
            )
        })?;
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    if ids.is_empty() {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            format!("{MACHINE_TARGET_HEADER} names no Machine"),
            Some("give Machine IDs, comma-separated, or `*`"),
        ));
    }
    Ok(Targets::These(ids))
}

/// The layer on the socket API: serves a call for this Machine here, forwards one for another
/// Machine, fans out one for several.
pub(crate) async fn forward(State(f): State<Forwarding>, request: Request, next: Next) -> Response {
    let Some(value) = request.headers().get(MACHINE_TARGET_HEADER).cloned() else {
        return next.run(request).await;
    };
    let targets = match parse_targets(&value) {
        Ok(t) => t,
        Err(e) => return e.into_response(),
    };
    let Some(own) = f.machine.identity().map(|i| i.id) else {
        // Before init there is no other Machine: the route answers for this one alone (and
        // says so when it needs an initialised Machine).
        let mut request = request;
        request.headers_mut().remove(MACHINE_TARGET_HEADER);
        return next.run(request).await;
    };
    match targets {
        Targets::These(ids) if ids.len() == 1 && ids[0] == own => {
            let mut request = request;
            request.headers_mut().remove(MACHINE_TARGET_HEADER);
            next.run(request).await
        }
        Targets::These(ids) if ids.len() == 1 => match forward_one(&f, &ids[0], request).await {
            Ok(response) => response,
            Err(e) => e.into_response(),
        },
        targets => match fan_out(&f, targets, request).await {
            Ok(answer) => axum::Json(answer).into_response(),
            Err(e) => e.into_response(),
        },
    }
}

/// The member `id` as this Machine observes the roster.
fn member_of(f: &Forwarding, id: &MachineId) -> Result<Member, Failure> {
    member_seen_by(&f.machine, id)
}

fn member_seen_by(machine: &LocalMachine, id: &MachineId) -> Result<Member, Failure> {
    if machine.identity().is_none() {
        return Err(failure(
            StatusCode::CONFLICT,
            ErrorCode::FailedPrecondition,
            format!("this Machine is not initialised, so it reaches no Machine {id}"),
            Some("run `ployz machine init` or join a Cluster first"),
        ));
    }
    machine.member(id).map_err(|_| {
        failure(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            format!("no Machine {id} in this Machine's roster"),
            Some("`ployz machine ls` lists the Machines it observes"),
        )
    })
}

fn mesh_addr(f: &Forwarding, member: &Member) -> SocketAddr {
    member_addr(&f.mesh, member)
}

fn member_addr(mesh: &MeshView, member: &Member) -> SocketAddr {
    SocketAddr::new(
        IpAddr::V6(member.management_address.addr()),
        mesh.settings().management_port,
    )
}

/// A call of this Machine's own to another member's management API over the mesh (a peer
/// pull fetching an image): served there like a forwarded call; the answer's head within
/// `answer_within`, its body streamed.
pub(crate) async fn call_member(
    machine: &LocalMachine,
    mesh: &MeshView,
    id: &MachineId,
    method: Method,
    path_and_query: &str,
    body: Body,
    answer_within: Option<Duration>,
) -> Result<hyper::Response<hyper::body::Incoming>, Failure> {
    let member = member_seen_by(machine, id)?;
    let addr = member_addr(mesh, &member);
    let mut headers = HeaderMap::new();
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(
        axum::http::header::USER_AGENT,
        HeaderValue::from_static(concat!("ployz/", env!("CARGO_PKG_VERSION"))),
    );
    if let Ok(v) = HeaderValue::from_str(id.as_str()) {
        headers.insert(MACHINE_TARGET_HEADER, v);
    }
    headers.insert(axum::http::header::HOST, HeaderValue::from_static("ployz"));
    send(addr, method, path_and_query, headers, body, answer_within)
        .await
        .map_err(|why| unreachable_member(&member, &why))
}

/// A request to forward: its head, its path with the query, and its body as it comes (the
/// Machine it goes to bounds it as it bounds its own).
fn streamed_parts(request: Request) -> (axum::http::request::Parts, String, Body) {
    let (parts, body) = request.into_parts();
    let path = path_of(&parts);
    (parts, path, body)
}

fn path_of(parts: &axum::http::request::Parts) -> String {
    parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| parts.uri.path().to_owned())
}

/// The parts of a request to ask of several Machines: its head, its path with the query, and
/// its body read whole (bounded as the API bounds its own), to send to each.
async fn request_parts(
    request: Request,
) -> Result<(axum::http::request::Parts, String, Bytes), Failure> {
    let (parts, body) = request.into_parts();
    let path = path_of(&parts);
    let bytes = axum::body::to_bytes(body, MAX_FORWARDED_BODY)
        .await
        .map_err(|e| {
            failure(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::InvalidArgument,
                format!("the request body cannot be forwarded: {e}"),
                None,
            )
        })?;
    Ok((parts, path, bytes))
}

/// The headers a forwarded call keeps.
fn forwarded_headers(from: &HeaderMap, target: &MachineId) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for name in [
        axum::http::header::CONTENT_TYPE,
        axum::http::header::USER_AGENT,
        axum::http::header::ACCEPT,
    ] {
        if let Some(v) = from.get(&name) {
            headers.insert(name, v.clone());
        }
    }
    if let Some(v) = from.get(ployz_core::api::LEASE_TOKEN_HEADER) {
        headers.insert(ployz_core::api::LEASE_TOKEN_HEADER, v.clone());
    }
    if let Ok(v) = HeaderValue::from_str(target.as_str()) {
        headers.insert(MACHINE_TARGET_HEADER, v);
    }
    headers.insert(axum::http::header::HOST, HeaderValue::from_static("ployz"));
    headers
}

/// Sends one call to `addr`: the connection within [`PER_MACHINE_TIMEOUT`], the answer's head
/// within `answer_within` when given (a forwarded `exec` or drain answers when it is done, so a
/// single forwarded call waits as long as its caller does).
async fn send(
    addr: SocketAddr,
    method: Method,
    path_and_query: &str,
    headers: HeaderMap,
    body: Body,
    answer_within: Option<Duration>,
) -> Result<hyper::Response<hyper::body::Incoming>, String> {
    let connected = tokio::time::timeout(PER_MACHINE_TIMEOUT, tokio::net::TcpStream::connect(addr))
        .await
        .map_err(|_| {
            format!(
                "no connection within {} s to {addr}",
                PER_MACHINE_TIMEOUT.as_secs()
            )
        })?;
    let exchange = async {
        let stream = connected.map_err(|e| format!("cannot connect to {addr}: {e}"))?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| format!("{addr}: {e}"))?;
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut request = hyper::Request::builder()
            .method(method)
            .uri(path_and_query)
            .body(body)
            .map_err(|e| e.to_string())?;
        *request.headers_mut() = headers;
        sender
            .send_request(request)
            .await
            .map_err(|e| format!("{addr}: {e}"))
    };
    match answer_within {
        None => exchange.await,
        Some(limit) => match tokio::time::timeout(limit, exchange).await {
            Ok(result) => result,
            Err(_) => Err(format!("no answer within {} s at {addr}", limit.as_secs())),
        },
    }
}

/// Forwards the call to `id` and hands back its answer as it comes (a followed log streams).
async fn forward_one(
    f: &Forwarding,
    id: &MachineId,
    request: Request,
) -> Result<Response, Failure> {
    let member = member_of(f, id)?;
    let addr = mesh_addr(f, &member);
    let (parts, path, body) = streamed_parts(request);
    let headers = forwarded_headers(&parts.headers, id);
    let answer = send(addr, parts.method, &path, headers, body, None)
        .await
        .map_err(|why| unreachable_member(&member, &why))?;
    let (head, incoming) = answer.into_parts();
    let mut response = Response::new(Body::new(incoming));
    *response.status_mut() = head.status;
    for name in [
        axum::http::header::CONTENT_TYPE,
        axum::http::header::CONTENT_LENGTH,
    ] {
        if let Some(v) = head.headers.get(&name) {
            response.headers_mut().insert(name, v.clone());
        }
    }
    response.headers_mut().insert(
        MACHINE_TARGET_HEADER,
        HeaderValue::from_str(id.as_str()).unwrap_or(HeaderValue::from_static("")),
    );
    Ok(response)
}

fn unreachable_member(member: &Member, why: &str) -> Failure {
    failure(
        StatusCode::BAD_GATEWAY,
        ErrorCode::Unavailable,
        format!(
            "Machine '{}' ({}) did not answer over the mesh: {why}",
            member.name, member.id
        ),
        Some("`ployz machine ls` shows how this Machine observes it"),
    )
}

/// Asks every target at once and gathers what each answered.
async fn fan_out(
    f: &Forwarding,
    targets: Targets,
    request: Request,
) -> Result<FanOutAnswer, Failure> {
    if request.method() != Method::GET {
        return Err(failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::InvalidArgument,
            format!(
                "{} {} names several Machines; only a listing (GET) goes to several at once",
                request.method(),
                request.uri().path()
            ),
            Some("name one Machine for a call that changes something"),
        ));
    }
    let own = f.machine.identity().map(|i| i.id);
    let ids: Vec<MachineId> = match targets {
        Targets::These(ids) => ids,
        Targets::All => {
            let mut ids: Vec<MachineId> = match f.machine.identity() {
                Some(_) => {
                    let machine = f.machine.clone();
                    tokio::task::spawn_blocking(move || machine.roster_ids())
                        .await
                        .map_err(|e| {
                            failure(
                                StatusCode::INTERNAL_SERVER_ERROR,
                                ErrorCode::Internal,
                                e.to_string(),
                                None,
                            )
                        })?
                        .map_err(Failure::from)?
                }
                None => Vec::new(),
            };
            if let Some(own) = &own {
                if !ids.contains(own) {
                    ids.push(own.clone());
                }
            }
            ids
        }
    };
    let (parts, path, body) = request_parts(request).await?;
    let mut asks = tokio::task::JoinSet::new();
    for (order, id) in ids.into_iter().enumerate() {
        let f = f.clone();
        let headers = parts.headers.clone();
        let path = path.clone();
        let body = body.clone();
        let own = own.clone();
        asks.spawn(async move {
            let result = if Some(&id) == own.as_ref() {
                ask_here(&f.local, &path, &headers, body, LOCAL_SHARE_TIMEOUT).await
            } else {
                ask_there(&f, &id, &path, &headers, body).await
            };
            (order, id, result)
        });
    }
    let mut gathered = Vec::new();
    while let Some(done) = asks.join_next().await {
        if let Ok(one) = done {
            gathered.push(one);
        }
    }
    gathered.sort_by_key(|(order, _, _)| *order);
    let names = f.machine.member_names();
    let mut answer = FanOutAnswer::default();
    for (_, id, result) in gathered {
        let name = names.get(&id).cloned().unwrap_or_default();
        match result {
            Ok(value) => answer.values.push(MachineAnswer {
                machine: id,
                name,
                answer: value,
            }),
            Err(reason) => answer.failures.push(TargetFailure {
                target: if name.is_empty() {
                    id.to_string()
                } else {
                    format!("{name} ({id})")
                },
                reason,
            }),
        }
    }
    Ok(answer)
}

/// This Machine's own share of a fan-out, through its own routes (`local`), bounded as another
/// Machine's is: in time (`within`) and in size ([`MAX_SHARE_BYTES`]).
async fn ask_here(
    local: &Router,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
    within: Duration,
) -> Result<serde_json::Value, String> {
    let mut request = Request::new(Body::from(body));
    *request.uri_mut() = path.parse().map_err(|e| format!("{e}"))?;
    *request.headers_mut() = headers.clone();
    request.headers_mut().remove(MACHINE_TARGET_HEADER);
    let exchange = async {
        let response = tower::ServiceExt::oneshot(local.clone(), request)
            .await
            .map_err(|e| e.to_string())?;
        share_answer(response).await
    };
    match tokio::time::timeout(within, exchange).await {
        Ok(result) => result,
        Err(_) => Err(format!("no answer within {} s", within.as_secs_f32())),
    }
}

/// One Machine's share of a fan-out, read whole (at most [`MAX_SHARE_BYTES`]) and decoded.
async fn share_answer<B>(response: axum::http::Response<B>) -> Result<serde_json::Value, String>
where
    B: axum::body::HttpBody<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let status = response.status();
    let bytes = http_body_util::BodyExt::collect(http_body_util::Limited::new(
        response.into_body(),
        MAX_SHARE_BYTES,
    ))
    .await
    .map_err(share_error)?
    .to_bytes();
    decode_answer(status, &bytes)
}

/// Why a share's answer could not be read: over [`MAX_SHARE_BYTES`], or broken off.
fn share_error(e: Box<dyn std::error::Error + Send + Sync>) -> String {
    if e.is::<http_body_util::LengthLimitError>() {
        format!(
            "its answer is over {} MiB, more than a fan-out takes from one Machine; ask it alone (`-m MACHINE`)",
            MAX_SHARE_BYTES >> 20
        )
    } else {
        e.to_string()
    }
}

/// Another Machine's share of a fan-out, over the mesh.
async fn ask_there(
    f: &Forwarding,
    id: &MachineId,
    path: &str,
    headers: &HeaderMap,
    body: Bytes,
) -> Result<serde_json::Value, String> {
    let member = member_of(f, id).map_err(|e| e.to_string())?;
    let addr = mesh_addr(f, &member);
    let exchange = async {
        let response = send(
            addr,
            Method::GET,
            path,
            forwarded_headers(headers, id),
            Body::from(body),
            Some(PER_MACHINE_TIMEOUT),
        )
        .await?;
        share_answer(response).await
    };
    match tokio::time::timeout(PER_MACHINE_TIMEOUT, exchange).await {
        Ok(result) => result,
        Err(_) => Err(format!(
            "no answer within {} s over the mesh ({addr})",
            PER_MACHINE_TIMEOUT.as_secs()
        )),
    }
}

fn decode_answer(status: StatusCode, bytes: &[u8]) -> Result<serde_json::Value, String> {
    if status.is_success() {
        return serde_json::from_slice(bytes).map_err(|e| format!("its answer is not JSON: {e}"));
    }
    match serde_json::from_slice::<ApiError>(bytes) {
        Ok(e) => Err(e.to_string()),
        Err(_) => Err(format!(
            "it answered {status}: {}",
            String::from_utf8_lossy(bytes)
                .chars()
                .take(200)
                .collect::<String>()
        )),
    }
}

/// The address a request's connection came from (set by `api::serve`).
fn caller(request: &Request) -> Option<IpAddr> {
    request
        .extensions()
        .get::<ConnectedFrom<SocketAddr>>()
        .map(|c| c.0.ip())
}

/// The layer on the whole mesh listener: a connection from this Machine's own Management
/// Address is refused. Only this host can make one (over loopback, which the firewall refuses
/// too: this is the layer behind it), the daemon never calls itself there (its share of a fan-out is served in process),
/// and this Machine is a member of its own roster: any local user would otherwise reach what
/// the unix socket keeps to root and the `ployz` group.
pub(crate) async fn from_another_machine(
    State(machine): State<Arc<LocalMachine>>,
    request: Request,
    next: Next,
) -> Response {
    let from = caller(&request);
    let own = machine
        .identity()
        .map(|i| IpAddr::V6(i.management_address().addr()));
    if from.is_none() || from == own {
        return failure(
            StatusCode::FORBIDDEN,
            ErrorCode::FailedPrecondition,
            "the mesh listener serves other Machines, not this one's own address".to_owned(),
            Some("on this Machine, use the daemon's unix socket (root or the 'ployz' group)"),
        )
        .into_response();
    }
    next.run(request).await
}

/// The layer on the mesh listener: only members of this Machine's roster are served, by the
/// Management Address their connection comes from (WireGuard vouches for it).
pub(crate) async fn only_members(
    State(machine): State<Arc<LocalMachine>>,
    request: Request,
    next: Next,
) -> Response {
    let from = caller(&request);
    let member = match from {
        Some(IpAddr::V6(addr)) => {
            let machine = machine.clone();
            tokio::task::spawn_blocking(move || machine.is_member_address(addr))
                .await
                .unwrap_or(false)
        }
        _ => false,
    };
    if !member {
        return failure(
            StatusCode::FORBIDDEN,
            ErrorCode::FailedPrecondition,
            format!(
                "{} is not the Management Address of a member of this Machine's roster",
                from.map(|a| a.to_string())
                    .unwrap_or_else(|| "the caller".into())
            ),
            None,
        )
        .into_response();
    }
    next.run(request).await
}

/// The layer on the mesh listener: a call naming another Machine is refused (calls are
/// forwarded once, by the Machine the CLI reached).
pub(crate) async fn no_second_hop(
    State(machine): State<Arc<LocalMachine>>,
    request: Request,
    next: Next,
) -> Response {
    if let Some(value) = request.headers().get(MACHINE_TARGET_HEADER) {
        let own = machine.identity().map(|i| i.id.to_string());
        let named = value.to_str().unwrap_or_default().trim();
        if own.as_deref() != Some(named) {
            return failure(
                StatusCode::MISDIRECTED_REQUEST,
                ErrorCode::InvalidArgument,
                format!(
                    "this is Machine {}, and the call names {named}: calls are forwarded once, by the Machine the CLI reached",
                    own.unwrap_or_default()
                ),
                None,
            )
            .into_response();
        }
    }
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(value: &str) -> Result<Targets, String> {
        parse_targets(&HeaderValue::from_str(value).unwrap()).map_err(|e| e.to_string())
    }

    #[tokio::test]
    async fn this_machines_share_of_a_fan_out_is_bounded_in_time_and_size() {
        use axum::routing::get;
        let local = Router::new()
            .route(
                "/ok",
                get(|| async { axum::Json(serde_json::json!({"a": 1})) }),
            )
            .route("/silent", get(std::future::pending::<&'static str>))
            .route(
                "/endless",
                get(|| async {
                    Body::from_stream(futures_util::stream::repeat_with(|| {
                        Ok::<_, std::io::Error>(Bytes::from_static(&[b' '; 64 * 1024]))
                    }))
                }),
            );
        let within = Duration::from_millis(300);
        let ask = |path: &'static str| {
            let local = local.clone();
            async move { ask_here(&local, path, &HeaderMap::new(), Bytes::new(), within).await }
        };
        assert_eq!(ask("/ok").await, Ok(serde_json::json!({"a": 1})));
        let started = std::time::Instant::now();
        let silent = ask("/silent").await.unwrap_err();
        assert!(silent.contains("no answer within 0.3 s"), "{silent}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let endless = ask("/endless").await.unwrap_err();
        assert!(endless.contains("over 16 MiB"), "{endless}");
    }

    #[test]
    fn a_target_header_names_all_or_distinct_machine_ids() {
        assert_eq!(parsed("*"), Ok(Targets::All));
        let a = MachineId::generate();
        let b = MachineId::generate();
        assert_eq!(
            parsed(&format!("{a}, {b},{a}")),
            Ok(Targets::These(vec![a.clone(), b.clone()]))
        );
        let bad = parsed("m1").unwrap_err();
        assert!(bad.contains("'m1' is not a Machine ID"), "{bad}");
        assert!(parsed(" , ").is_err());
    }

    #[test]
    fn a_failed_answer_reads_as_its_api_error() {
        let body = br#"{"code":"not_found","message":"no such service 'x'","hint":"try ls"}"#;
        assert_eq!(
            decode_answer(StatusCode::NOT_FOUND, body).unwrap_err(),
            "no such service 'x'; try ls"
        );
        assert!(decode_answer(StatusCode::BAD_GATEWAY, b"<html>")
            .unwrap_err()
            .contains("502"));
        assert_eq!(
            decode_answer(StatusCode::OK, b"[1]").unwrap(),
            serde_json::json!([1])
        );
    }
}
