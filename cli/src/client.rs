//! The management API client: HTTP/1.1 over a unix socket, or over the stdio of the system `ssh`
//! running `ployz dial-stdio` on the far side.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _};
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::client::conn::http1::SendRequest;
use hyper::{Method, Request, StatusCode};
use hyper_util::rt::TokioIo;
use ployz_core::api::{ApiError, MAX_BODY_BYTES};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::process::{Child, Command};

use crate::connection::{Connection, SshTarget};

/// The program and options used for SSH; `PLOYZ_SSH_COMMAND` replaces the default `ssh`
/// (for instance `ssh -F /path/to/config`). Host keys are always checked: the CLI adds
/// `StrictHostKeyChecking=accept-new` on the command line, which a config file cannot weaken.
const SSH_COMMAND_ENV: &str = "PLOYZ_SSH_COMMAND";

/// How long [`ApiClient::answers`] waits: ssh's own connect timeout (5 s), its handshake and
/// the daemon's answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(15);

/// A request body: a small JSON document, or a stream (an image sent to a Machine).
type ApiBody = http_body_util::combinators::UnsyncBoxBody<Bytes, std::io::Error>;

fn full(bytes: Bytes) -> ApiBody {
    Full::new(bytes)
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A connected client.
pub struct ApiClient {
    sender: SendRequest<ApiBody>,
    connection: Connection,
    ssh: Option<SshProcess>,
    /// The Machine lease's fencing token, sent with every call while this client holds it.
    lease_token: Option<u64>,
    /// The Machine Targets (Machine IDs, or `*`) sent with every call while set.
    machine_target: Option<String>,
    /// How long the daemon keeps an idle connection (its `Keep-Alive: timeout=N`), once known.
    idle_limit: Option<Duration>,
    /// When the last answer ended: the connection has been idle since.
    idle_since: Instant,
}

struct SshProcess {
    child: Child,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl SshProcess {
    /// ssh's exit status and what it printed, once it has ended (bounded wait).
    async fn failure_report(&mut self) -> String {
        let status = tokio::time::timeout(Duration::from_secs(5), self.child.wait()).await;
        // Give the stderr reader a moment to drain.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let text = String::from_utf8_lossy(&self.stderr.lock().expect("stderr lock")).into_owned();
        let text: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.chars().all(|c| c == '@'))
            .collect();
        let status = match status {
            Ok(Ok(s)) => format!("{s}"),
            _ => "still running".to_owned(),
        };
        if text.is_empty() {
            format!("ssh {status}")
        } else {
            format!("ssh {status}: {}", text.join(" "))
        }
    }
}

trait Stream: AsyncRead + AsyncWrite + Send + Unpin + 'static {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin + 'static> Stream for T {}

fn ssh_command(target: &SshTarget) -> anyhow::Result<Command> {
    let mut cmd = ssh_to(target)?;
    cmd.args(["ployz", "dial-stdio"]);
    if let Some(socket) = &target.remote_socket {
        cmd.args(["--socket", socket]);
    }
    Ok(cmd)
}

/// The system `ssh` (or `$PLOYZ_SSH_COMMAND`) to `target`, with the options every Ployz
/// session uses; the remote command goes after it.
pub(crate) fn ssh_to(target: &SshTarget) -> anyhow::Result<Command> {
    let words = match std::env::var(SSH_COMMAND_ENV) {
        Ok(v) if !v.trim().is_empty() => shlex::split(&v)
            .ok_or_else(|| anyhow!("{SSH_COMMAND_ENV}='{v}' has unbalanced quotes"))?,
        _ => vec!["ssh".to_owned()],
    };
    let (program, args) = words.split_first().expect("at least one word");
    let mut cmd = Command::new(program);
    cmd.args(args);
    cmd.args([
        "-o",
        "StrictHostKeyChecking=accept-new",
        "-o",
        "BatchMode=yes",
        "-o",
        "ConnectTimeout=5",
        "-o",
        "LogLevel=ERROR",
    ]);
    if let Some(port) = target.port {
        cmd.args(["-p", &port.to_string()]);
    }
    if let Some(key) = &target.key_file {
        cmd.arg("-i").arg(key);
    }
    let destination = match &target.user {
        Some(u) => format!("{u}@{}", target.host),
        None => target.host.clone(),
    };
    cmd.arg("--").arg(destination);
    Ok(cmd)
}

impl ApiClient {
    /// Opens a connection to a daemon.
    pub async fn connect(connection: &Connection) -> anyhow::Result<ApiClient> {
        let (stream, ssh): (Box<dyn Stream>, Option<SshProcess>) = match connection {
            Connection::Unix(path) => {
                let stream = tokio::net::UnixStream::connect(path).await.map_err(|e| {
                    let why = match e.kind() {
                        std::io::ErrorKind::NotFound => {
                            "no socket there; is `ployz daemon run` running? Start it, or point --connect at its socket".to_owned()
                        }
                        std::io::ErrorKind::PermissionDenied => {
                            "permission denied; run as root or as a member of the 'ployz' group".to_owned()
                        }
                        std::io::ErrorKind::ConnectionRefused => {
                            "nothing listens there (a stale socket?); start `ployz daemon run`".to_owned()
                        }
                        _ => e.to_string(),
                    };
                    anyhow!("cannot reach the daemon at {connection}: {why}")
                })?;
                (Box::new(stream), None)
            }
            Connection::Ssh(target) => {
                let mut cmd = ssh_command(target)?;
                cmd.stdin(Stdio::piped())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .kill_on_drop(true);
                let mut child = cmd
                    .spawn()
                    .with_context(|| format!("cannot start ssh for {connection}"))?;
                let stdin = child.stdin.take().expect("piped stdin");
                let stdout = child.stdout.take().expect("piped stdout");
                let mut stderr = child.stderr.take().expect("piped stderr");
                let buffer = Arc::new(Mutex::new(Vec::new()));
                let sink = buffer.clone();
                tokio::spawn(async move {
                    let mut chunk = [0u8; 1024];
                    while let Ok(n) = stderr.read(&mut chunk).await {
                        if n == 0 {
                            break;
                        }
                        sink.lock()
                            .expect("stderr lock")
                            .extend_from_slice(&chunk[..n]);
                    }
                });
                (
                    Box::new(tokio::io::join(stdout, stdin)),
                    Some(SshProcess {
                        child,
                        stderr: buffer,
                    }),
                )
            }
        };
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .with_context(|| format!("cannot speak HTTP to the daemon at {connection}"))?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Ok(ApiClient {
            sender,
            connection: connection.clone(),
            ssh,
            lease_token: None,
            machine_target: None,
            idle_limit: None,
            idle_since: Instant::now(),
        })
    }

    /// Whether the daemon answers through this connection at all: one `GET /v1/version`,
    /// bounded by [`ANSWER_WITHIN`]. Any answer counts, an error included; only a connection
    /// that carries none (ssh failed, nothing at the far end, no answer in time) does not.
    /// The version, when the answer was one.
    pub async fn answers(&mut self) -> anyhow::Result<Option<ployz_core::api::VersionInfo>> {
        let asked = self.get::<serde_json::Value>(ployz_core::api::paths::VERSION);
        match tokio::time::timeout(ANSWER_WITHIN, asked).await {
            Ok(Ok(v)) => Ok(serde_json::from_value(v).ok()),
            Ok(Err(e)) if e.downcast_ref::<ApiError>().is_some() => Ok(None),
            Ok(Err(e)) if e.downcast_ref::<Unexpected>().is_some() => Ok(None),
            Ok(Err(e)) => Err(e),
            Err(_) => bail!(
                "the daemon at {} did not answer within {} s",
                self.connection,
                ANSWER_WITHIN.as_secs()
            ),
        }
    }

    /// Opens a new connection when the daemon closed this one, or may close it before a
    /// request would arrive: it closes idle connections after its header deadline, which it
    /// announces with each answer. What this client carries (its lease token) is kept.
    async fn fresh(&mut self) -> anyhow::Result<()> {
        let may_have_closed = self
            .idle_limit
            .is_some_and(|limit| self.idle_since.elapsed() >= limit / 2);
        if self.sender.is_closed() || may_have_closed {
            let ApiClient { sender, ssh, .. } = ApiClient::connect(&self.connection).await?;
            self.sender = sender;
            self.ssh = ssh;
            self.idle_since = Instant::now();
        }
        Ok(())
    }

    /// Notes an answer: what the daemon says about idle connections, and that this one is idle
    /// from now.
    fn answered(&mut self, headers: &hyper::HeaderMap) {
        if let Some(limit) = headers
            .get("keep-alive")
            .and_then(|v| v.to_str().ok())
            .and_then(keep_alive_timeout)
        {
            self.idle_limit = Some(limit);
        }
        self.idle_since = Instant::now();
    }

    /// `GET path`, decoding the JSON answer.
    pub async fn get<T: DeserializeOwned>(&mut self, path: &str) -> anyhow::Result<T> {
        self.call(Method::GET, path, None::<&()>).await
    }

    /// `POST path` with a JSON body, decoding the JSON answer.
    pub async fn post<B: Serialize, T: DeserializeOwned>(
        &mut self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.call(Method::POST, path, Some(body)).await
    }

    /// `PUT path` with a JSON body, decoding the JSON answer.
    pub async fn put<B: Serialize, T: DeserializeOwned>(
        &mut self,
        path: &str,
        body: &B,
    ) -> anyhow::Result<T> {
        self.call(Method::PUT, path, Some(body)).await
    }

    /// `DELETE path`.
    pub async fn delete(&mut self, path: &str) -> anyhow::Result<()> {
        let _: serde_json::Value = self.call(Method::DELETE, path, None::<&()>).await?;
        Ok(())
    }

    /// `DELETE path`, decoding the JSON answer.
    pub async fn delete_value<T: DeserializeOwned>(&mut self, path: &str) -> anyhow::Result<T> {
        self.call(Method::DELETE, path, None::<&()>).await
    }

    /// Where this client connects.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// Sends `token` (the Machine lease's fencing token) with every call from now on; `None`
    /// stops sending one.
    pub fn set_lease_token(&mut self, token: Option<u64>) {
        self.lease_token = token;
    }

    /// Sends `targets` (one Machine ID, several comma-separated, or `*`) as the Machine Target
    /// of every call from now on; `None`: the daemon reached.
    pub fn set_machine_target(&mut self, targets: Option<String>) {
        self.machine_target = targets;
    }

    fn request(&self, method: Method, path: &str) -> hyper::http::request::Builder {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "ployz");
        if let Some(targets) = &self.machine_target {
            builder = builder.header(ployz_core::api::MACHINE_TARGET_HEADER, targets);
        }
        match self.lease_token {
            Some(token) => builder.header(ployz_core::api::LEASE_TOKEN_HEADER, token),
            None => builder,
        }
    }

    /// `GET path`, handing each chunk of a streamed text answer to `sink` as it arrives.
    pub async fn get_stream(
        &mut self,
        path: &str,
        mut sink: impl FnMut(&[u8]),
    ) -> anyhow::Result<()> {
        self.fresh().await?;
        let request = self.request(Method::GET, path).body(full(Bytes::new()))?;
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        let status = response.status();
        self.answered(response.headers());
        let mut body = response.into_body();
        if !status.is_success() {
            let bytes = body.collect().await?.to_bytes();
            return match serde_json::from_slice::<ApiError>(&bytes) {
                Ok(e) => Err(e.into()),
                Err(_) => Err(unexpected(status, &bytes)),
            };
        }
        while let Some(frame) = body.frame().await {
            if let Some(data) = frame?.data_ref() {
                sink(data);
            }
        }
        self.idle_since = Instant::now();
        Ok(())
    }

    /// `POST path` with a body streamed from `body` as it is made (any length: the daemon
    /// takes it as it comes), decoding the JSON answer.
    pub async fn post_stream<S, T>(&mut self, path: &str, body: S) -> anyhow::Result<T>
    where
        S: futures_util::Stream<Item = std::io::Result<Bytes>> + Send + 'static,
        T: DeserializeOwned,
    {
        use futures_util::StreamExt as _;
        self.fresh().await?;
        let frames = body.map(|chunk| chunk.map(hyper::body::Frame::data));
        let request = self
            .request(Method::POST, path)
            .header("user-agent", concat!("ployz/", env!("CARGO_PKG_VERSION")))
            .header("content-type", "application/zstd")
            .body(http_body_util::StreamBody::new(frames).boxed_unsync())?;
        self.exchange(request, path, true).await
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &mut self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> anyhow::Result<T> {
        let bytes = match body {
            Some(b) => Bytes::from(serde_json::to_vec(b)?),
            None => Bytes::new(),
        };
        check_body_size(&format!("{method} {path}"), bytes.len())?;
        self.fresh().await?;
        let request = self
            .request(method, path)
            .header("user-agent", concat!("ployz/", env!("CARGO_PKG_VERSION")))
            .header("content-type", "application/json")
            .body(full(bytes))?;
        self.exchange(request, path, false).await
    }

    /// Sends `request` and decodes its JSON answer, or the daemon's error. `streamed`: its body
    /// is a stream being made as it goes (a transfer), so a broken connection is told as one,
    /// and ssh's report is given only when ssh itself has ended.
    async fn exchange<T: DeserializeOwned>(
        &mut self,
        request: Request<ApiBody>,
        path: &str,
        streamed: bool,
    ) -> anyhow::Result<T> {
        let sent = async {
            self.sender.ready().await?;
            let response = self.sender.send_request(request).await?;
            let status = response.status();
            let headers = response.headers().clone();
            let body = response.into_body().collect().await?.to_bytes();
            Ok::<_, hyper::Error>((status, headers, body))
        }
        .await;
        let (status, body) = match sent {
            Ok((status, headers, body)) => {
                self.answered(&headers);
                (status, body)
            }
            Err(e) => {
                if let Some(ssh) = &mut self.ssh {
                    if !streamed || ssh.child.try_wait().ok().flatten().is_some() {
                        let report = ssh.failure_report().await;
                        bail!("cannot reach the daemon at {}: {report}", self.connection);
                    }
                }
                if streamed {
                    // hyper's own text leaves out why the body stream failed: its sources say.
                    bail!(
                        "the transfer to the daemon at {} broke off: {:#}",
                        self.connection,
                        anyhow::Error::from(e)
                    );
                }
                bail!("the daemon at {} did not answer: {e}", self.connection);
            }
        };
        if status.is_success() {
            return serde_json::from_slice(&body).with_context(|| {
                format!("the daemon answered {path} with a body this CLI does not understand; compare `ployz version` on both sides")
            });
        }
        match serde_json::from_slice::<ApiError>(&body) {
            Ok(api_error) => Err(api_error.into()),
            Err(_) => Err(unexpected(status, &body)),
        }
    }
}

/// `timeout=N` of a `Keep-Alive` header value (`timeout=15, max=100`).
fn keep_alive_timeout(value: &str) -> Option<Duration> {
    value.split(',').find_map(|part| {
        let (key, seconds) = part.trim().split_once('=')?;
        (key.trim().eq_ignore_ascii_case("timeout"))
            .then(|| seconds.trim().parse().ok().map(Duration::from_secs))?
    })
}

/// Refuses a request body over the API's body limit before it is sent: the daemon would refuse
/// it, and the connection would break while it is still being written.
pub fn check_body_size(request: &str, bytes: usize) -> anyhow::Result<()> {
    if bytes > MAX_BODY_BYTES {
        bail!(
            "{request}: the request body is {bytes} bytes, over the API's body limit of {MAX_BODY_BYTES} bytes ({} MiB); send less: a command, environment, config or secret this large belongs in the image or a volume (secrets travel base64-encoded, a third larger than the file)",
            MAX_BODY_BYTES >> 20
        );
    }
    Ok(())
}

/// Checks, before anything runs (and in a dry run), that every request a Deploy Plan's
/// operations make fits the API's body limit, naming the Service whose does not.
pub fn check_plan_bodies(plan: &ployz_core::DeployPlan) -> anyhow::Result<()> {
    use ployz_core::api::{RunContainerRequest, RunHookRequest};
    use ployz_core::Operation;
    for op in plan.operations() {
        let (what, encoded) = match op {
            Operation::RunContainer {
                service_id, spec, ..
            }
            | Operation::ReplaceContainer {
                service_id, spec, ..
            } => (
                format!("service '{}': the request to run its container", spec.name),
                serde_json::to_vec(&RunContainerRequest {
                    service_id: service_id.clone(),
                    spec: spec.clone(),
                    plan_id: None,
                    registry_auth: None,
                }),
            ),
            Operation::RunHook {
                service_id,
                spec,
                hook,
                ..
            } => (
                format!(
                    "service '{}': the request to run its pre-deploy hook",
                    spec.name
                ),
                serde_json::to_vec(&RunHookRequest {
                    service_id: service_id.clone(),
                    spec: spec.clone(),
                    hook: hook.clone(),
                    registry_auth: None,
                }),
            ),
            Operation::CreateVolume { volume, .. } => (
                format!("volume '{}': the request to create it", volume.name),
                serde_json::to_vec(volume),
            ),
            Operation::StopContainer { .. } | Operation::RemoveContainer { .. } => continue,
        };
        check_body_size(&what, encoded?.len())?;
    }
    Ok(())
}

/// An answer that is not the API's: a status with a body the CLI cannot read as an error.
#[derive(Debug)]
struct Unexpected(String);

impl std::fmt::Display for Unexpected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Unexpected {}

fn unexpected(status: StatusCode, body: &[u8]) -> anyhow::Error {
    let text = String::from_utf8_lossy(body);
    Unexpected(format!(
        "the daemon answered {status}: {}",
        text.chars().take(200).collect::<String>()
    ))
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keep_alive_timeouts_parse() {
        assert_eq!(
            keep_alive_timeout("timeout=15"),
            Some(Duration::from_secs(15))
        );
        assert_eq!(
            keep_alive_timeout("max=100, Timeout = 2"),
            Some(Duration::from_secs(2))
        );
        assert_eq!(keep_alive_timeout("max=100"), None);
        assert_eq!(keep_alive_timeout("timeout=x"), None);
    }

    #[test]
    fn bodies_over_the_limit_are_refused_naming_it() {
        check_body_size("POST /v1/x", MAX_BODY_BYTES).unwrap();
        let e = check_body_size("POST /v1/x", MAX_BODY_BYTES + 1)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("over the API's body limit of 2097152 bytes (2 MiB)"),
            "{e}"
        );
    }

    #[test]
    fn ssh_always_checks_host_keys_and_runs_dial_stdio() {
        let target = SshTarget {
            user: Some("root".into()),
            host: "127.0.0.1".into(),
            port: Some(2222),
            remote_socket: Some("/tmp/p.sock".into()),
            key_file: Some("/k".into()),
        };
        let cmd = ssh_command(&target).unwrap();
        let args: Vec<String> = cmd
            .as_std()
            .get_args()
            .map(|a| a.to_string_lossy().into_owned())
            .collect();
        let joined = args.join(" ");
        assert!(
            joined.contains("-o StrictHostKeyChecking=accept-new"),
            "{joined}"
        );
        assert!(!joined.contains("StrictHostKeyChecking=no"));
        assert!(
            joined
                .ends_with("-p 2222 -i /k -- root@127.0.0.1 ployz dial-stdio --socket /tmp/p.sock"),
            "{joined}"
        );
    }
}
