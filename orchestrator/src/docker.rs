//! One Machine's Docker, through bollard: Service Containers, Hook Containers, volumes, the
//! `ployz` network, and Container Runtime Observations read back from Docker.
//!
//! Only containers and volumes labelled with this Machine's ID are ever listed or touched, so
//! several Machines (or test daemons) can share one Docker engine without seeing each other's
//! work: every operation on a container or volume inspects it and checks the label first, and
//! every name or ID is checked against Docker's rules before it becomes part of a request.
//!
//! Every call waits a bounded time for Docker's answer ([`CALL_TIMEOUT`]; a stop, its grace
//! period more); a Docker that accepts connections but never answers fails the call with
//! [`DockerError::NoAnswer`], naming where Docker was asked. Streams that may rightly stay
//! quiet (a followed log, an exec's output, events) are bounded until Docker's answer begins.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::net::Ipv4Addr;
use std::time::Duration;

use bollard::models::{
    ContainerCreateBody, ContainerInspectResponse, EndpointSettings, HealthConfig, HostConfig,
    HostConfigLogConfig, Ipam, IpamConfig, MountTmpfsOptions, MountType, MountVolumeOptions,
    NetworkCreateRequest, NetworkingConfig, PortBinding, ResourcesUlimits, RestartPolicy,
    RestartPolicyNameEnum, VolumeCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, InspectNetworkOptions,
    ListContainersOptionsBuilder, ListImagesOptions, ListVolumesOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder, StopContainerOptionsBuilder,
    UploadToContainerOptionsBuilder,
};
use bollard::Docker;
use futures_util::{Stream, StreamExt, TryStreamExt};
use ployz_core::{
    ContainerHealth, ContainerId, ContainerKind, ContainerRef, ContainerRuntimeObservation,
    ContainerState, DockerVolume, Healthcheck, HostProtocol, MachineId, MachineSubnet, Mount,
    PortSpec, PreDeployHook, PullPolicy, ServiceId, ServiceName, ServiceSpec, VolumeSpec,
};
use rand::Rng;

/// The Docker network every Service Container joins.
pub const NETWORK: &str = "ployz";

/// The most output (stdout and stderr together) one exec answers with; past it the output is
/// cut and says so.
pub const EXEC_OUTPUT_LIMIT: usize = 8 << 20;

/// How long one Docker call (list, inspect, create, start, remove, the start of a stream) may
/// wait for Docker's answer before it fails with [`DockerError::NoAnswer`].
pub const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// How long an image pull may go without a progress message from Docker.
pub const PULL_IDLE_TIMEOUT: Duration = Duration::from_secs(120);

/// Where Docker listens when neither `--docker-host` nor `DOCKER_HOST` says.
const DEFAULT_DOCKER_SOCKET: &str = "unix:///var/run/docker.sock";

/// Docker's stop timeout when neither the caller nor the container sets one.
const DOCKER_DEFAULT_STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// Container labels, all under `ployz.`.
pub mod labels {
    pub const MANAGED: &str = "ployz.managed";
    pub const MACHINE_ID: &str = "ployz.machine.id";
    pub const SERVICE_ID: &str = "ployz.service.id";
    pub const SERVICE_NAME: &str = "ployz.service.name";
    pub const SERVICE_MODE: &str = "ployz.service.mode";
    pub const SERVICE_PORTS: &str = "ployz.service.ports";
    pub const SERVICE_SPEC: &str = "ployz.service.spec";
    pub const HOOK: &str = "ployz.service.hook";
    /// The Plan ID of the bound Deploy that ran the container (`ployz deploy --plan-id`).
    pub const PLAN_ID: &str = "ployz.plan-id";
    /// The fencing token of the Machine lease its creator held (see `ContainerRuntimeObservation`).
    pub const LEASE_TOKEN: &str = "ployz.lease-token";
}

/// Which command made a Service Container, recorded in its labels.
#[derive(Debug, Clone, Copy, Default)]
pub struct Provenance<'a> {
    /// The Plan ID of the bound Deploy that runs it.
    pub plan_id: Option<&'a str>,
    /// The fencing token of the lease the creating call carried.
    pub lease_token: Option<u64>,
}

/// Why a Docker operation failed, by how the caller reacts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DockerError {
    #[error("cannot reach Docker {0}; is dockerd running (set --docker-host or DOCKER_HOST)?")]
    Unreachable(String),
    #[error("Docker did not answer {call} within {} s at {host}; dockerd may be hung: check `docker info` and dockerd's log, and restart it (for example `systemctl restart docker`)", .waited.as_secs())]
    NoAnswer {
        /// Where Docker was asked (`unix:///var/run/docker.sock`).
        host: String,
        /// What was asked, as a phrase ("listing containers").
        call: String,
        waited: Duration,
    },
    #[error("no container '{0}' on this Machine")]
    NoSuchContainer(String),
    #[error("no volume '{0}' on this Machine (Ployz lists and removes only the volumes it created on this Machine)")]
    NoSuchVolume(String),
    #[error("{field} '{value}' is not {rule}")]
    InvalidName {
        /// The request field that held it (`id`, `name`, `image`).
        field: &'static str,
        /// The value, shortened and escaped for display.
        value: String,
        /// What it should be.
        rule: &'static str,
    },
    #[error("image '{image}' is not on this Machine and could not be pulled: {reason}")]
    ImageUnavailable { image: String, reason: String },
    /// An image sent to this Machine (an Image Transfer) that Docker did not load: the sender's
    /// stream broke off, stalled or was not an archive, or Docker refused it.
    #[error("image '{image}' did not load here: {reason}")]
    ImageNotLoaded { image: String, reason: String },
    #[error("the Docker network '{NETWORK}' exists with subnet {found}, but this Machine's subnet is {wanted}; remove that network (`docker network rm {NETWORK}`) or reset this Machine")]
    NetworkConflict { found: String, wanted: String },
    #[error("cannot build the configs archive for container '{container}': {reason}")]
    ConfigsArchive { container: String, reason: String },
    /// A spec to create a container from carries a secret's digest but not its value: it was
    /// read back from a container's label, which never holds one.
    #[error("service '{service}': the secret '{secret}' ({target}) carries no value, only its digest; a spec read back from a container cannot recreate its secrets: deploy the Service from its Compose file")]
    SecretWithoutValue {
        service: String,
        secret: String,
        target: String,
    },
    /// The engine keeps images in the containerd image store, whose `docker save` names and
    /// identifies an image by its manifest: what an Image Transfer reads is not there.
    #[error("the Docker at {host} keeps its images in the containerd image store, which Ployz's image transfers do not read yet; turn it off in its daemon.json (\"features\": {{\"containerd-snapshotter\": false}}) and restart it, or send the image through a registry")]
    ContainerdImageStore { host: String },
    #[error("docker: {0}")]
    Docker(#[from] bollard::errors::Error),
}

impl DockerError {
    /// Whether Docker could not be reached at all, or did not answer in time (as opposed to
    /// refusing one request).
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            DockerError::Unreachable(_) | DockerError::NoAnswer { .. }
        )
    }
}

fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// A value as an error message shows it: at most 80 characters, control characters escaped.
fn shown(value: &str) -> String {
    let mut out: String = value
        .chars()
        .take(80)
        .flat_map(char::escape_debug)
        .collect();
    if value.chars().count() > 80 {
        out.push_str("...");
    }
    out
}

/// Checks a Container ID as the API takes it: 1 to 64 hexadecimal digits (Docker resolves an
/// unambiguous prefix). Anything else never reaches a Docker request.
pub fn check_container_id(id: &str) -> Result<(), DockerError> {
    if id.is_empty() || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(DockerError::InvalidName {
            field: "id",
            value: shown(id),
            rule: "a Container ID (1 to 64 hexadecimal digits); resolve names and prefixes with `GET /v1/containers` first",
        });
    }
    Ok(())
}

/// Checks a Docker Volume name by Docker's own rule: `[a-zA-Z0-9][a-zA-Z0-9_.-]+`, at most 255
/// characters. Anything else never reaches a Docker request.
pub fn check_volume_name(name: &str) -> Result<(), DockerError> {
    let bytes = name.as_bytes();
    let ok = (2..=255).contains(&bytes.len())
        && bytes[0].is_ascii_alphanumeric()
        && bytes[1..]
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if !ok {
        return Err(DockerError::InvalidName {
            field: "name",
            value: shown(name),
            rule: "a Docker Volume name: 2 to 255 of letters, digits, '_', '.' and '-', starting with a letter or digit",
        });
    }
    Ok(())
}

/// Checks an image reference's shape (`[registry/]name[:tag][@digest]`): letters, digits and
/// `. _ - / : @ +`, no empty, `.` or `..` path part. Docker judges the rest.
pub fn check_image_reference(image: &str) -> Result<(), DockerError> {
    let path = image.split('@').next().unwrap_or(image);
    let ok = !image.is_empty()
        && image.len() <= 1024
        && image
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-/:@+".contains(&b))
        && !image.starts_with(['-', '.', '/', ':', '@'])
        && path
            .split('/')
            .all(|part| !part.is_empty() && part != "." && part != "..");
    if !ok {
        return Err(DockerError::InvalidName {
            field: "image",
            value: shown(image),
            rule:
                "an image reference such as nginx:1.27 or registry.example.com/team/app@sha256:...",
        });
    }
    Ok(())
}

pub use ployz_core::api::{ExecResult, HookResult};

/// What Docker says about a container, by whose it is.
enum Lookup {
    /// This Machine's, as Docker inspected it just now.
    Mine(Box<ContainerInspectResponse>),
    /// Docker has no such container.
    Gone,
    /// It exists but carries another Machine's ID, or none.
    NotMine,
}

/// This Machine's Docker.
#[derive(Clone)]
pub struct MachineDocker {
    /// The client before API version negotiation.
    base: Docker,
    /// The client speaking the engine's API version, negotiated on first use.
    negotiated: std::sync::Arc<tokio::sync::OnceCell<Docker>>,
    /// Where Docker is asked, as messages name it.
    host: std::sync::Arc<str>,
    machine_id: MachineId,
    subnet: MachineSubnet,
    /// The mesh's WireGuard interface, which the `ployz` network trusts: Docker 28 drops
    /// packets for container addresses arriving from other interfaces unless the network names
    /// the interface in `trusted_host_interfaces`.
    mesh_interface: Option<std::sync::Arc<str>>,
    /// Held by a resync from its look at Docker to its write ([`crate::observer::resync`]).
    pub(crate) resyncs: std::sync::Arc<tokio::sync::Mutex<()>>,
}

/// The `ployz` network as Docker shows it ([`MachineDocker::observe_network`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkObservation {
    /// Its IPAM subnets.
    pub subnets: Vec<String>,
    /// Its bridge interface's name, when set by option.
    pub bridge: Option<String>,
    /// How many containers it holds.
    pub containers: usize,
}

/// The bridge name Docker gives the `ployz` network, so the mesh's forwarding rules can name it.
pub const BRIDGE_NAME: &str = "ployz";

fn random_suffix() -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::thread_rng();
    (0..4)
        .map(|_| ALPHABET[rng.gen_range(0..ALPHABET.len())] as char)
        .collect()
}

/// The longest host name a container can be given (a DNS label; Linux refuses more than 64).
const MAX_HOSTNAME_LEN: usize = 63;

/// A container's name and host name for `service`, both ending in `tail` (for example `-x7k2`
/// or `-pre-deploy-x7k2`). The name keeps the Service Name as written (without the leading
/// characters Docker refuses, see [`ServiceName::container_stem`]); the host name starts with
/// the Service DNS Label cut so that the whole stays a valid DNS label, so that `My_App` runs as
/// `My_App-x7k2` with host name `my-app-x7k2`.
fn container_names(service: &ServiceName, tail: &str) -> (String, String) {
    let name = format!("{}{tail}", service.container_stem());
    let mut label = service.dns_label();
    label.truncate(MAX_HOSTNAME_LEN.saturating_sub(tail.len()));
    let hostname = format!("{}{tail}", label.trim_end_matches('-'));
    (name, hostname)
}

fn ms_to_ns(ms: Option<u64>) -> Option<i64> {
    ms.map(|v| (v as i64).saturating_mul(1_000_000))
}

impl MachineDocker {
    /// Connects to Docker at `host` (`unix:///path`), or where `DOCKER_HOST` or the default
    /// socket says. Connecting is lazy: the first call reports an unreachable engine.
    /// The same Machine's Docker with the `ployz` network trusting `interface` (the mesh's).
    pub fn with_mesh_interface(mut self, interface: &str) -> MachineDocker {
        self.mesh_interface = Some(interface.into());
        self
    }

    pub fn connect(
        host: Option<&str>,
        machine_id: MachineId,
        subnet: MachineSubnet,
    ) -> Result<MachineDocker, DockerError> {
        let shown_host = match host {
            Some(h) => h.to_owned(),
            None => std::env::var("DOCKER_HOST")
                .ok()
                .filter(|h| h.starts_with("unix://"))
                .unwrap_or_else(|| DEFAULT_DOCKER_SOCKET.to_owned()),
        };
        let docker = match host {
            Some(h) => Docker::connect_with_host(h),
            None => Docker::connect_with_local_defaults(),
        }
        .map_err(|e| DockerError::Unreachable(format!("at {shown_host}: {e}")))?
        // Bounds every request until Docker's answer begins, streams included.
        .with_timeout(CALL_TIMEOUT);
        Ok(MachineDocker {
            base: docker,
            negotiated: Default::default(),
            host: shown_host.into(),
            machine_id,
            subnet,
            mesh_interface: None,
            resyncs: Default::default(),
        })
    }

    /// Where Docker is asked (`unix:///var/run/docker.sock`).
    pub fn host(&self) -> &str {
        &self.host
    }

    fn no_answer(&self, call: &str, waited: Duration) -> DockerError {
        DockerError::NoAnswer {
            host: self.host.to_string(),
            call: call.to_owned(),
            waited,
        }
    }

    /// Waits at most `limit` for Docker's answer to `call`. The outer error is Docker not
    /// answering in time; the inner result is Docker's answer, for the caller to judge.
    async fn answer<T>(
        &self,
        call: &str,
        limit: Duration,
        request: impl Future<Output = Result<T, bollard::errors::Error>>,
    ) -> Result<Result<T, bollard::errors::Error>, DockerError> {
        match tokio::time::timeout(limit, request).await {
            Err(_) | Ok(Err(bollard::errors::Error::RequestTimeoutError)) => {
                Err(self.no_answer(call, limit))
            }
            Ok(answer) => Ok(answer),
        }
    }

    /// The client, speaking the API version the engine supports.
    async fn api(&self) -> Result<&Docker, DockerError> {
        let negotiate = self.negotiated.get_or_try_init(|| async {
            match self.base.clone().negotiate_version().await {
                Ok(d) => Ok(d),
                Err(bollard::errors::Error::RequestTimeoutError) => {
                    Err(self.no_answer("the version check", CALL_TIMEOUT))
                }
                Err(e) => Err(DockerError::Unreachable(format!("at {}: {e}", self.host))),
            }
        });
        // Bounded as a whole: a caller queued behind another's attempt waits no longer.
        match tokio::time::timeout(CALL_TIMEOUT, negotiate).await {
            Ok(result) => result,
            Err(_) => Err(self.no_answer("the version check", CALL_TIMEOUT)),
        }
    }

    /// The engine's client for image transfers ([`crate::images`]), speaking its API version:
    /// each request bounded by [`CALL_TIMEOUT`] until Docker's answer begins, or with `long`
    /// by [`crate::images::LOAD_TIMEOUT`] (`docker load` answers once the whole archive is in).
    pub async fn engine(&self, long: bool) -> Result<Docker, DockerError> {
        let api = self.api().await?.clone();
        Ok(if long {
            api.with_timeout(crate::images::LOAD_TIMEOUT)
        } else {
            api
        })
    }

    /// Checks the engine answers.
    pub async fn ping(&self) -> Result<(), DockerError> {
        let api = self.api().await?;
        self.answer("a ping", CALL_TIMEOUT, api.ping())
            .await?
            .map(|_| ())
            .map_err(|e| self.classify(e))
    }

    /// The `ployz` network as Docker shows it now (the inner error is Docker's answer, e.g. not
    /// found).
    async fn inspect_network(
        &self,
    ) -> Result<Result<bollard::models::NetworkInspect, bollard::errors::Error>, DockerError> {
        let api = self.api().await?;
        self.answer(
            "inspecting the network",
            CALL_TIMEOUT,
            api.inspect_network(NETWORK, None::<InspectNetworkOptions>),
        )
        .await
    }

    /// The name of the `ployz` network's bridge interface on this Machine: [`BRIDGE_NAME`] for
    /// networks Ployz created with it, `br-<id>` for older ones. Creates the network first when
    /// it is missing.
    pub async fn bridge_name(&self) -> Result<String, DockerError> {
        self.ensure_network().await?;
        let net = self.inspect_network().await??;
        if let Some(name) = net
            .options
            .as_ref()
            .and_then(|o| o.get("com.docker.network.bridge.name"))
        {
            return Ok(name.clone());
        }
        let id = net.id.unwrap_or_default();
        Ok(format!("br-{}", &id[..id.len().min(12)]))
    }

    /// The `ployz` network as Docker shows it now; `None` when there is none.
    pub async fn observe_network(&self) -> Result<Option<NetworkObservation>, DockerError> {
        match self.inspect_network().await? {
            Ok(net) => Ok(Some(NetworkObservation {
                subnets: net
                    .ipam
                    .and_then(|i| i.config)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(|c| c.subnet)
                    .collect(),
                bridge: net
                    .options
                    .as_ref()
                    .and_then(|o| o.get("com.docker.network.bridge.name"))
                    .cloned(),
                containers: net.containers.map_or(0, |c| c.len()),
            })),
            Err(e) if is_not_found(&e) => Ok(None),
            Err(e) => Err(self.classify(e)),
        }
    }

    /// Creates the `ployz` bridge network on the Machine Subnet with the Machine Gateway, leaves
    /// a matching one alone, and reports a conflicting one.
    pub async fn ensure_network(&self) -> Result<(), DockerError> {
        // The mesh module and the orchestrator both ensure the network right after init. Docker
        // refuses the second of two concurrent creates ("Pool overlaps") before the first is
        // visible by name, so the callers in this process take turns.
        static ENSURING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
        let _turn = ENSURING.lock().await;
        let wanted = self.subnet.to_string();
        let inspected = self.inspect_network().await?;
        match inspected {
            Ok(net) => self.has_our_subnet(net),
            Err(e) if is_not_found(&e) => {
                let request = NetworkCreateRequest {
                    name: NETWORK.to_owned(),
                    driver: Some("bridge".into()),
                    ipam: Some(Ipam {
                        driver: Some("default".into()),
                        config: Some(vec![IpamConfig {
                            subnet: Some(wanted),
                            gateway: Some(self.subnet.gateway().to_string()),
                            ..Default::default()
                        }]),
                        options: None,
                    }),
                    labels: Some(HashMap::from([(labels::MANAGED.to_owned(), String::new())])),
                    options: Some(self.network_options()),
                    ..Default::default()
                };
                let api = self.api().await?;
                match self
                    .answer(
                        "creating the network",
                        CALL_TIMEOUT,
                        api.create_network(request),
                    )
                    .await?
                {
                    Ok(_) => {
                        tracing::info!(subnet = %self.subnet, "created the Docker network '{NETWORK}'");
                        Ok(())
                    }
                    // Another process created it meanwhile: Docker answers 409 for the name,
                    // or 403 "Pool overlaps" when the other's subnet landed first. Check what
                    // is there now, once; an overlap with some other network stands.
                    Err(
                        e @ bollard::errors::Error::DockerResponseServerError {
                            status_code: 403 | 409,
                            ..
                        },
                    ) => self.check_network_after_conflict(e).await,
                    Err(e) => Err(e.into()),
                }
            }
            Err(e) => Err(self.classify(e)),
        }
    }

    /// Whether the existing `ployz` network carries this Machine's subnet.
    fn has_our_subnet(&self, net: bollard::models::NetworkInspect) -> Result<(), DockerError> {
        let wanted = self.subnet.to_string();
        let found: Vec<String> = net
            .ipam
            .and_then(|i| i.config)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|c| c.subnet)
            .collect();
        if found.iter().any(|s| s == &wanted) {
            Ok(())
        } else {
            Err(DockerError::NetworkConflict {
                found: found.join(","),
                wanted,
            })
        }
    }

    /// After a refused create: the `ployz` network as it is now, if another caller made it;
    /// else the refusal itself.
    async fn check_network_after_conflict(
        &self,
        refusal: bollard::errors::Error,
    ) -> Result<(), DockerError> {
        let inspected = self.inspect_network().await?;
        match inspected {
            Ok(net) => self.has_our_subnet(net),
            Err(e) if is_not_found(&e) => Err(refusal.into()),
            Err(e) => Err(self.classify(e)),
        }
    }

    /// The bridge options of the `ployz` network: a fixed bridge name (the firewall names it),
    /// and the mesh interface as trusted, so containers of other Machines reach this Machine's
    /// containers by Container Address.
    fn network_options(&self) -> HashMap<String, String> {
        let mut options = HashMap::from([(
            "com.docker.network.bridge.name".to_owned(),
            BRIDGE_NAME.to_owned(),
        )]);
        if let Some(interface) = &self.mesh_interface {
            options.insert(
                "com.docker.network.bridge.trusted_host_interfaces".to_owned(),
                interface.to_string(),
            );
        }
        options
    }

    fn classify(&self, e: bollard::errors::Error) -> DockerError {
        match e {
            bollard::errors::Error::DockerResponseServerError { .. } => DockerError::Docker(e),
            bollard::errors::Error::RequestTimeoutError => {
                self.no_answer("a request", CALL_TIMEOUT)
            }
            other => DockerError::Unreachable(format!("at {}: {other}", self.host)),
        }
    }

    fn is_mine(&self, labels: Option<&HashMap<String, String>>) -> bool {
        labels
            .and_then(|l| l.get(labels::MACHINE_ID))
            .is_some_and(|m| m.as_str() == self.machine_id.as_str())
    }

    /// Inspects a container and says whose it is. `id` is checked first: nothing unchecked is
    /// put into a Docker request's path.
    async fn lookup(&self, id: &str) -> Result<Lookup, DockerError> {
        check_container_id(id)?;
        let api = self.api().await?;
        match self
            .answer(
                "inspecting a container",
                CALL_TIMEOUT,
                api.inspect_container(id, None),
            )
            .await?
        {
            Ok(c) if self.is_mine(c.config.as_ref().and_then(|c| c.labels.as_ref())) => {
                Ok(Lookup::Mine(Box::new(c)))
            }
            Ok(_) => Ok(Lookup::NotMine),
            Err(e) if is_not_found(&e) => Ok(Lookup::Gone),
            Err(e) => Err(self.classify(e)),
        }
    }

    /// A container of this Machine, inspected now, and its full ID; `NoSuchContainer` when it
    /// is gone or is not this Machine's.
    async fn mine(&self, id: &str) -> Result<(String, Box<ContainerInspectResponse>), DockerError> {
        match self.lookup(id).await? {
            Lookup::Mine(c) => Ok((c.id.clone().unwrap_or_else(|| id.to_owned()), c)),
            Lookup::Gone | Lookup::NotMine => Err(DockerError::NoSuchContainer(id.to_owned())),
        }
    }

    /// Every managed container of this Machine, observed now.
    pub async fn observe(&self) -> Result<Vec<ContainerRuntimeObservation>, DockerError> {
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![format!("{}={}", labels::MACHINE_ID, self.machine_id)],
        )]);
        let api = self.api().await?;
        let list = self
            .answer(
                "listing containers",
                CALL_TIMEOUT,
                api.list_containers(Some(
                    ListContainersOptionsBuilder::default()
                        .all(true)
                        .filters(&filters)
                        .build(),
                )),
            )
            .await?
            .map_err(|e| self.classify(e))?;
        let mut out = Vec::with_capacity(list.len());
        for summary in list {
            let Some(id) = summary.id else { continue };
            if let Some(o) = self.observe_container(&id).await? {
                out.push(o);
            }
        }
        out.sort_by(|a, b| (&a.service_name, a.created_at).cmp(&(&b.service_name, b.created_at)));
        Ok(out)
    }

    /// One container, observed now; `None` when it is gone or is not this Machine's.
    pub async fn observe_container(
        &self,
        id: &str,
    ) -> Result<Option<ContainerRuntimeObservation>, DockerError> {
        match self.lookup(id).await? {
            Lookup::Mine(c) => Ok(self.observation(*c)),
            Lookup::Gone | Lookup::NotMine => Ok(None),
        }
    }

    /// A Container Runtime Observation from what Docker said about one of this Machine's
    /// containers; `None` when it lacks the Service labels.
    fn observation(&self, c: ContainerInspectResponse) -> Option<ContainerRuntimeObservation> {
        let config = c.config.unwrap_or_default();
        let labels = config.labels.unwrap_or_default();
        let (Some(service_id), Some(service_name)) = (
            labels
                .get(labels::SERVICE_ID)
                .and_then(|s| s.parse::<ServiceId>().ok()),
            labels
                .get(labels::SERVICE_NAME)
                .and_then(|s| s.parse().ok()),
        ) else {
            return None;
        };
        let container_id = c.id.and_then(|i| i.parse::<ContainerId>().ok())?;
        let state = c.state.unwrap_or_default();
        let status = state.status.map(|s| s.to_string()).unwrap_or_default();
        let health =
            state
                .health
                .and_then(|h| h.status)
                .and_then(|s| match s.to_string().as_str() {
                    "starting" => Some(ContainerHealth::Starting),
                    "healthy" => Some(ContainerHealth::Healthy),
                    "unhealthy" => Some(ContainerHealth::Unhealthy),
                    _ => None,
                });
        let address = c
            .network_settings
            .and_then(|n| n.networks)
            .and_then(|mut n| n.remove(NETWORK))
            .and_then(|e| e.ip_address)
            .and_then(|ip| ip.parse::<Ipv4Addr>().ok());
        let created_at = c
            .created
            .as_deref()
            .and_then(parse_rfc3339_seconds)
            .unwrap_or(0);
        Some(ContainerRuntimeObservation {
            id: container_id,
            name: c
                .name
                .unwrap_or_default()
                .trim_start_matches('/')
                .to_owned(),
            machine_id: self.machine_id.clone(),
            service_id,
            service_name,
            kind: if labels.contains_key(labels::HOOK) {
                ContainerKind::Hook
            } else {
                ContainerKind::Service
            },
            state: ContainerState::from_docker(&status),
            health,
            restart_count: c.restart_count.unwrap_or(0).max(0) as u32,
            address,
            image: config.image.unwrap_or_default(),
            created_at,
            spec: labels
                .get(labels::SERVICE_SPEC)
                .and_then(|s| serde_json::from_str(s).ok()),
            plan_id: labels.get(labels::PLAN_ID).cloned(),
            lease_token: labels.get(labels::LEASE_TOKEN).and_then(|t| t.parse().ok()),
        })
    }

    fn docker_volume(&self, v: bollard::models::Volume) -> DockerVolume {
        DockerVolume {
            machine_id: self.machine_id.clone(),
            name: v.name,
            driver: v.driver,
            labels: v.labels.into_iter().collect(),
        }
    }

    async fn list_volumes(&self, mine_only: bool) -> Result<Vec<DockerVolume>, DockerError> {
        let mut options = ListVolumesOptionsBuilder::default();
        let filters = HashMap::from([(
            "label".to_owned(),
            vec![format!("{}={}", labels::MACHINE_ID, self.machine_id)],
        )]);
        if mine_only {
            options = options.filters(&filters);
        }
        let api = self.api().await?;
        let list = self
            .answer(
                "listing volumes",
                CALL_TIMEOUT,
                api.list_volumes(Some(options.build())),
            )
            .await?
            .map_err(|e| self.classify(e))?;
        let mut out: Vec<DockerVolume> = list
            .volumes
            .unwrap_or_default()
            .into_iter()
            // Docker applied the filter; the label is checked here again all the same.
            .filter(|v| !mine_only || self.is_mine(Some(&v.labels)))
            .map(|v| self.docker_volume(v))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// The Docker Volumes this Machine created (labelled with its Machine ID).
    pub async fn volumes(&self) -> Result<Vec<DockerVolume>, DockerError> {
        self.list_volumes(true).await
    }

    /// Every Docker Volume on this Machine's engine, whoever created it: what a Deploy needs to
    /// know exists (an `external` volume is by definition made outside Ployz). Nothing is done
    /// to a volume that is not this Machine's but mounting it where a Compose file names it.
    pub async fn engine_volumes(&self) -> Result<Vec<DockerVolume>, DockerError> {
        self.list_volumes(false).await
    }

    /// The image references (`repo:tag`) present on this Machine.
    pub async fn images(&self) -> Result<Vec<String>, DockerError> {
        Ok(self.image_tags().await?.into_keys().collect())
    }

    /// Every `repo:tag` this Docker holds, with the image ID it names.
    pub async fn image_tags(&self) -> Result<BTreeMap<String, String>, DockerError> {
        let api = self.api().await?;
        let list = self
            .answer(
                "listing images",
                CALL_TIMEOUT,
                api.list_images(None::<ListImagesOptions>),
            )
            .await?
            .map_err(|e| self.classify(e))?;
        Ok(list
            .into_iter()
            .flat_map(|i| {
                let id = i.id;
                i.repo_tags.into_iter().map(move |tag| (tag, id.clone()))
            })
            .collect())
    }

    /// Creates a Docker Volume labelled with this Machine's ID; an existing one of that name is
    /// left as it is.
    pub async fn create_volume(&self, spec: &VolumeSpec) -> Result<DockerVolume, DockerError> {
        check_volume_name(&spec.name)?;
        let mut volume_labels: HashMap<String, String> = spec.labels.clone().into_iter().collect();
        volume_labels.insert(labels::MANAGED.to_owned(), String::new());
        volume_labels.insert(labels::MACHINE_ID.to_owned(), self.machine_id.to_string());
        let api = self.api().await?;
        let v = self
            .answer(
                "creating a volume",
                CALL_TIMEOUT,
                api.create_volume(VolumeCreateRequest {
                    name: Some(spec.name.clone()),
                    driver: spec.driver.clone(),
                    driver_opts: Some(spec.driver_opts.clone().into_iter().collect()),
                    labels: Some(volume_labels),
                    ..Default::default()
                }),
            )
            .await?
            .map_err(|e| self.classify(e))?;
        Ok(self.docker_volume(v))
    }

    /// Removes a Docker Volume this Machine created; any other volume is refused as not found.
    pub async fn remove_volume(&self, name: &str, force: bool) -> Result<(), DockerError> {
        check_volume_name(name)?;
        let api = self.api().await?;
        match self
            .answer(
                "inspecting a volume",
                CALL_TIMEOUT,
                api.inspect_volume(name),
            )
            .await?
        {
            Ok(v) if self.is_mine(Some(&v.labels)) => {}
            Ok(_) => return Err(DockerError::NoSuchVolume(name.to_owned())),
            Err(e) if is_not_found(&e) => return Err(DockerError::NoSuchVolume(name.to_owned())),
            Err(e) => return Err(self.classify(e)),
        }
        match self
            .answer(
                "removing a volume",
                CALL_TIMEOUT,
                api.remove_volume(
                    name,
                    Some(RemoveVolumeOptionsBuilder::default().force(force).build()),
                ),
            )
            .await?
        {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Err(DockerError::NoSuchVolume(name.to_owned())),
            Err(e) => Err(self.classify(e)),
        }
    }

    /// Makes sure the image is here, by the spec's pull policy.
    async fn ensure_image(
        &self,
        image: &str,
        policy: PullPolicy,
        auth: Option<&ployz_core::api::RegistryAuth>,
    ) -> Result<(), DockerError> {
        check_image_reference(image)?;
        let api = self.api().await?;
        let present = match self
            .answer(
                "inspecting an image",
                CALL_TIMEOUT,
                api.inspect_image(image),
            )
            .await?
        {
            Ok(_) => true,
            Err(e) if is_not_found(&e) => false,
            Err(e) => return Err(self.classify(e)),
        };
        match policy {
            PullPolicy::Missing if present => Ok(()),
            PullPolicy::Never if present => Ok(()),
            PullPolicy::Never => Err(DockerError::ImageUnavailable {
                image: image.to_owned(),
                reason: "pull_policy is never".into(),
            }),
            PullPolicy::Missing | PullPolicy::Always => {
                let (from, tag) = split_tag(image);
                let mut pull = api.create_image(
                    Some(
                        CreateImageOptionsBuilder::default()
                            .from_image(from)
                            .tag(tag)
                            .build(),
                    ),
                    None,
                    auth.map(|a| bollard::auth::DockerCredentials {
                        username: Some(a.username.clone()).filter(|u| !u.is_empty()),
                        password: Some(a.password.clone()).filter(|p| !p.is_empty()),
                        serveraddress: Some(a.server.clone()),
                        identitytoken: a.identity_token.clone(),
                        ..Default::default()
                    }),
                );
                // A pull reports progress as it goes: silence for this long means Docker hung.
                while let Some(item) = self
                    .answer("pulling an image", PULL_IDLE_TIMEOUT, async {
                        Ok::<_, bollard::errors::Error>(pull.next().await)
                    })
                    .await?
                    .map_err(|e| self.classify(e))?
                {
                    if let Err(e) = item {
                        if matches!(e, bollard::errors::Error::RequestTimeoutError) {
                            return Err(self.no_answer("pulling an image", CALL_TIMEOUT));
                        }
                        // A local image that cannot be refreshed still serves `always`.
                        if present {
                            tracing::warn!(image, error = %e, "pull failed; using the local image");
                            return Ok(());
                        }
                        return Err(DockerError::ImageUnavailable {
                            image: image.to_owned(),
                            reason: e.to_string(),
                        });
                    }
                }
                Ok(())
            }
        }
    }

    /// Creates and starts a Service Container carrying `spec` as its Resolved Service Spec
    /// (without secret values: the secrets are copied in as files, and the label holds their
    /// digests only), and its `provenance`.
    pub async fn run_service_container(
        &self,
        service_id: &ServiceId,
        spec: &ServiceSpec,
        provenance: Provenance<'_>,
        auth: Option<&ployz_core::api::RegistryAuth>,
    ) -> Result<ContainerRuntimeObservation, DockerError> {
        check_secret_values(spec)?;
        let plan_id = provenance.plan_id;
        if let Some(id) = plan_id {
            // A label value nothing but a plan id: it is shown back to users.
            if id.len() > 64 || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'.') {
                return Err(DockerError::InvalidName {
                    field: "plan_id",
                    value: id
                        .chars()
                        .take(64)
                        .collect::<String>()
                        .escape_debug()
                        .to_string(),
                    rule: "a plan id (p1. and five 8-digit hashes)",
                });
            }
        }
        self.ensure_network().await?;
        self.ensure_image(&spec.container.image, spec.container.pull_policy, auth)
            .await?;
        let (name, hostname) = container_names(&spec.name, &format!("-{}", random_suffix()));
        let mut body = self.service_container_body(service_id, spec, &hostname);
        if let Some(id) = plan_id {
            body.labels
                .get_or_insert_with(HashMap::new)
                .insert(labels::PLAN_ID.to_owned(), id.to_owned());
        }
        if let Some(token) = provenance.lease_token {
            body.labels
                .get_or_insert_with(HashMap::new)
                .insert(labels::LEASE_TOKEN.to_owned(), token.to_string());
        }
        let created_id = self.create_and_start(&name, body, spec).await?;
        self.observe_container(&created_id)
            .await?
            .ok_or(DockerError::NoSuchContainer(created_id))
    }

    /// Creates a container named `name`, copies the spec's configs and secrets in, starts it;
    /// its ID.
    async fn create_and_start(
        &self,
        name: &str,
        body: ContainerCreateBody,
        spec: &ServiceSpec,
    ) -> Result<String, DockerError> {
        let api = self.api().await?;
        let created = self
            .answer(
                "creating a container",
                CALL_TIMEOUT,
                api.create_container(
                    Some(CreateContainerOptionsBuilder::default().name(name).build()),
                    body,
                ),
            )
            .await?
            .map_err(|e| self.classify(e))?;
        check_container_id(&created.id)?;
        if !spec.container.configs.is_empty() || !spec.container.secrets.is_empty() {
            self.copy_configs(&created.id, spec).await?;
        }
        self.answer(
            "starting a container",
            CALL_TIMEOUT,
            api.start_container(&created.id, None),
        )
        .await?
        .map_err(|e| self.classify(e))?;
        Ok(created.id)
    }

    fn common_labels(&self, service_id: &ServiceId, spec: &ServiceSpec) -> HashMap<String, String> {
        HashMap::from([
            (labels::MANAGED.to_owned(), String::new()),
            (labels::MACHINE_ID.to_owned(), self.machine_id.to_string()),
            (labels::SERVICE_ID.to_owned(), service_id.to_string()),
            (labels::SERVICE_NAME.to_owned(), spec.name.to_string()),
            (
                labels::SERVICE_MODE.to_owned(),
                spec.mode.as_str().to_owned(),
            ),
        ])
    }

    fn service_container_body(
        &self,
        service_id: &ServiceId,
        spec: &ServiceSpec,
        hostname: &str,
    ) -> ContainerCreateBody {
        let c = &spec.container;
        let mut labels = self.common_labels(service_id, spec);
        labels.insert(
            labels::SERVICE_PORTS.to_owned(),
            spec.ports
                .iter()
                .map(|p| p.to_string())
                .collect::<Vec<_>>()
                .join(","),
        );
        // The label is read by anyone who can inspect the container: never a secret's value.
        labels.insert(
            labels::SERVICE_SPEC.to_owned(),
            serde_json::to_string(&spec.without_secret_values()).expect("a spec serialises"),
        );
        let mut env: Vec<String> = c.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        env.push(format!("PLOYZ_MACHINE_ID={}", self.machine_id));
        let mut port_bindings: HashMap<String, Option<Vec<PortBinding>>> = HashMap::new();
        let mut exposed = Vec::new();
        for p in &spec.ports {
            if let PortSpec::Host {
                host_ip,
                host_port,
                container_port,
                protocol,
            } = p
            {
                let key = format!(
                    "{container_port}/{}",
                    match protocol {
                        HostProtocol::Tcp => "tcp",
                        HostProtocol::Udp => "udp",
                    }
                );
                // One container port may be bound on several host addresses or ports.
                if !exposed.contains(&key) {
                    exposed.push(key.clone());
                }
                port_bindings
                    .entry(key)
                    .or_insert_with(|| Some(Vec::new()))
                    .get_or_insert_with(Vec::new)
                    .push(PortBinding {
                        host_ip: host_ip.clone(),
                        // None: Docker picks a free port.
                        host_port: host_port.map(|p| p.to_string()),
                    });
            }
        }
        let healthcheck = c.healthcheck.as_ref().map(|h| match h {
            Healthcheck::Disabled => HealthConfig {
                test: Some(vec!["NONE".into()]),
                ..Default::default()
            },
            Healthcheck::Configured(hc) => HealthConfig {
                test: Some(hc.test().to_vec()),
                interval: ms_to_ns(hc.interval_ms),
                timeout: ms_to_ns(hc.timeout_ms),
                retries: hc.retries.map(i64::from),
                start_period: ms_to_ns(hc.start_period_ms),
                start_interval: ms_to_ns(hc.start_interval_ms),
            },
        });
        let host_config = HostConfig {
            restart_policy: Some(RestartPolicy {
                name: Some(RestartPolicyNameEnum::UNLESS_STOPPED),
                maximum_retry_count: None,
            }),
            network_mode: Some(NETWORK.to_owned()),
            dns: Some(vec![self.subnet.gateway().to_string()]),
            dns_search: Some(vec!["internal".into()]),
            dns_options: Some(vec!["ndots:1".into()]),
            init: c.init,
            privileged: Some(c.privileged),
            cap_add: (!c.cap_add.is_empty()).then(|| c.cap_add.clone()),
            cap_drop: (!c.cap_drop.is_empty()).then(|| c.cap_drop.clone()),
            sysctls: (!c.sysctls.is_empty()).then(|| c.sysctls.clone().into_iter().collect()),
            ulimits: (!c.ulimits.is_empty()).then(|| {
                c.ulimits
                    .iter()
                    .map(|(name, u)| ResourcesUlimits {
                        name: Some(name.clone()),
                        soft: Some(u.soft),
                        hard: Some(u.hard),
                    })
                    .collect()
            }),
            shm_size: c.shm_size_bytes.map(|v| v as i64),
            nano_cpus: c.resources.nano_cpus.map(|v| v as i64),
            memory: c.resources.memory_limit_bytes.map(|v| v as i64),
            memory_reservation: c.resources.memory_reservation_bytes.map(|v| v as i64),
            mounts: Some(c.mounts.iter().map(docker_mount).collect()),
            port_bindings: (!port_bindings.is_empty()).then_some(port_bindings),
            log_config: Some(match &c.logging {
                Some(l) => HostConfigLogConfig {
                    typ: Some(l.driver.clone()),
                    config: Some(l.options.clone().into_iter().collect()),
                },
                None => HostConfigLogConfig {
                    typ: Some("local".into()),
                    config: None,
                },
            }),
            ..Default::default()
        };
        ContainerCreateBody {
            hostname: Some(hostname.to_owned()),
            user: c.user.clone(),
            env: Some(env),
            cmd: c.command.clone(),
            entrypoint: c.entrypoint.clone(),
            image: Some(c.image.clone()),
            labels: Some(labels),
            healthcheck,
            stop_timeout: c.stop_grace_period_ms.map(|ms| (ms / 1000) as i64),
            exposed_ports: (!exposed.is_empty()).then_some(exposed),
            host_config: Some(host_config),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(
                    NETWORK.to_owned(),
                    EndpointSettings::default(),
                )])),
            }),
            ..Default::default()
        }
    }

    /// Copies the spec's configs and secrets into a created container, as files with their
    /// mode (0444 when unset), uid and gid (root when unset).
    async fn copy_configs(&self, container: &str, spec: &ServiceSpec) -> Result<(), DockerError> {
        let bytes = files_archive(spec).map_err(|e| match e {
            ArchiveError::Io(e) => DockerError::ConfigsArchive {
                container: container.to_owned(),
                reason: e.to_string(),
            },
            ArchiveError::Docker(e) => e,
        })?;
        let api = self.api().await?;
        self.answer(
            "copying configs and secrets into a container",
            CALL_TIMEOUT,
            api.upload_to_container(
                container,
                Some(UploadToContainerOptionsBuilder::default().path("/").build()),
                bollard::body_full(bytes.into()),
            ),
        )
        .await?
        .map_err(|e| self.classify(e))
    }

    /// Starts a stopped container of this Machine; its full Container ID.
    pub async fn start(&self, id: &str) -> Result<String, DockerError> {
        let (full, _) = self.mine(id).await?;
        let api = self.api().await?;
        match self
            .answer(
                "starting a container",
                CALL_TIMEOUT,
                api.start_container(&full, None),
            )
            .await?
        {
            Ok(()) => Ok(full),
            Err(e) if is_not_found(&e) => Err(DockerError::NoSuchContainer(id.to_owned())),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 304, ..
            }) => Ok(full),
            Err(e) => Err(self.classify(e)),
        }
    }

    /// Stops a container of this Machine, giving it `timeout` (else its own stop timeout)
    /// before SIGKILL. Already stopped is fine. Docker is waited for that long and
    /// [`CALL_TIMEOUT`] more.
    pub async fn stop(&self, id: &str, timeout: Option<Duration>) -> Result<(), DockerError> {
        let (full, inspected) = self.mine(id).await?;
        let mut options = StopContainerOptionsBuilder::default();
        if let Some(t) = timeout {
            options = options.t(t.as_secs().min(i32::MAX as u64) as i32);
        }
        let grace = timeout
            .or_else(|| {
                inspected
                    .config
                    .as_ref()
                    .and_then(|c| c.stop_timeout)
                    .map(|s| Duration::from_secs(s.max(0) as u64))
            })
            .unwrap_or(DOCKER_DEFAULT_STOP_TIMEOUT);
        let limit = grace.saturating_add(CALL_TIMEOUT);
        // Docker answers a stop once the container has stopped: the client waits as long.
        let api = self.api().await?.clone().with_timeout(limit);
        match self
            .answer(
                "stopping a container",
                limit,
                api.stop_container(&full, Some(options.build())),
            )
            .await?
        {
            Ok(()) => Ok(()),
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 304, ..
            }) => Ok(()),
            Err(e) if is_not_found(&e) => Err(DockerError::NoSuchContainer(id.to_owned())),
            Err(e) => Err(self.classify(e)),
        }
    }

    /// Removes a container of this Machine (stopping it if needed) and its anonymous volumes.
    /// Gone is fine; another Machine's container (or one no Machine owns) is refused. Answers
    /// the full Container ID (the one given, when it was already gone).
    pub async fn remove(&self, id: &str) -> Result<String, DockerError> {
        let full = match self.lookup(id).await? {
            Lookup::Mine(c) => c.id.clone().unwrap_or_else(|| id.to_owned()),
            Lookup::Gone => return Ok(id.to_owned()),
            Lookup::NotMine => return Err(DockerError::NoSuchContainer(id.to_owned())),
        };
        let api = self.api().await?;
        match self
            .answer(
                "removing a container",
                CALL_TIMEOUT,
                api.remove_container(
                    &full,
                    Some(
                        RemoveContainerOptionsBuilder::default()
                            .force(true)
                            .v(true)
                            .build(),
                    ),
                ),
            )
            .await?
        {
            Ok(()) => Ok(full),
            Err(e) if is_not_found(&e) => Ok(full),
            Err(e) => Err(self.classify(e)),
        }
    }

    /// The last `tail` log lines of a container of this Machine (stdout and stderr interleaved
    /// as Docker stored them).
    pub async fn tail_logs(&self, id: &str, tail: usize) -> Result<Vec<String>, DockerError> {
        let (full, _) = self.mine(id).await?;
        let options = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .tail(&tail.to_string())
            .build();
        let api = self.api().await?;
        let chunks: Vec<_> = self
            .answer(
                "reading a container's log",
                CALL_TIMEOUT,
                api.logs(&full, Some(options)).try_collect(),
            )
            .await?
            .map_err(|e| {
                if is_not_found(&e) {
                    DockerError::NoSuchContainer(id.to_owned())
                } else {
                    self.classify(e)
                }
            })?;
        let text: String = chunks.iter().map(|c| c.to_string()).collect();
        Ok(text.lines().map(str::to_owned).collect())
    }

    /// A container's log as a stream of chunks, for a container of this Machine. Docker must
    /// begin answering within [`CALL_TIMEOUT`]; a log read to its end must also not pause that
    /// long between chunks, while a followed log may stay quiet for as long as the container.
    pub async fn log_stream(
        &self,
        id: &str,
        follow: bool,
        tail: Option<usize>,
        since: Option<i64>,
        until: Option<i64>,
    ) -> Result<impl Stream<Item = Result<bytes::Bytes, DockerError>> + Send + 'static, DockerError>
    {
        let (full, _) = self.mine(id).await?;
        let mut options = LogsOptionsBuilder::default()
            .stdout(true)
            .stderr(true)
            .follow(follow)
            .tail(&tail.map_or("all".to_owned(), |t| t.to_string()));
        if let Some(s) = since {
            options = options.since(s.clamp(0, i32::MAX as i64) as i32);
        }
        if let Some(u) = until {
            options = options.until(u.clamp(0, i32::MAX as i64) as i32);
        }
        let chunks = self.api().await?.logs(&full, Some(options.build()));
        let docker = self.clone();
        let idle = (!follow).then_some(CALL_TIMEOUT);
        Ok(futures_util::stream::unfold(
            Some(Box::pin(chunks)),
            move |chunks| {
                let docker = docker.clone();
                async move {
                    let mut chunks = chunks?;
                    let next = match idle {
                        Some(limit) => match tokio::time::timeout(limit, chunks.next()).await {
                            Ok(next) => next,
                            Err(_) => {
                                return Some((
                                    Err(docker.no_answer("reading a container's log", limit)),
                                    None,
                                ))
                            }
                        },
                        None => chunks.next().await,
                    };
                    match next? {
                        Ok(chunk) => Some((Ok(chunk.into_bytes()), Some(chunks))),
                        Err(e) => Some((Err(docker.classify(e)), None)),
                    }
                }
            },
        ))
    }

    /// Runs `cmd` in a container of this Machine to completion, capturing its output. Docker
    /// must begin answering within [`CALL_TIMEOUT`]; the command itself may run as long as it
    /// runs.
    pub async fn exec(&self, id: &str, cmd: Vec<String>) -> Result<ExecResult, DockerError> {
        let (full, _) = self.mine(id).await?;
        let api = self.api().await?;
        let exec = self
            .answer(
                "creating an exec",
                CALL_TIMEOUT,
                api.create_exec(
                    &full,
                    bollard::models::ExecConfig {
                        attach_stdout: Some(true),
                        attach_stderr: Some(true),
                        cmd: Some(cmd),
                        ..Default::default()
                    },
                ),
            )
            .await?
            .map_err(|e| {
                if is_not_found(&e) {
                    DockerError::NoSuchContainer(id.to_owned())
                } else {
                    self.classify(e)
                }
            })?;
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        if let bollard::exec::StartExecResults::Attached { mut output, .. } = self
            .answer(
                "starting an exec",
                CALL_TIMEOUT,
                api.start_exec(&exec.id, None),
            )
            .await?
            .map_err(|e| self.classify(e))?
        {
            while let Some(chunk) = output.next().await {
                match chunk.map_err(|e| self.classify(e))? {
                    bollard::container::LogOutput::StdErr { message } => {
                        stderr.extend_from_slice(&message)
                    }
                    other => stdout.extend_from_slice(&other.into_bytes()),
                }
                if stdout.len() + stderr.len() > EXEC_OUTPUT_LIMIT {
                    // The daemon holds the whole answer in memory: stop reading here.
                    stdout.truncate(EXEC_OUTPUT_LIMIT);
                    stderr.truncate(EXEC_OUTPUT_LIMIT.saturating_sub(stdout.len()));
                    stderr.extend_from_slice(
                        format!(
                            "\n[ployz: the output was cut at {} MiB; for more, redirect it to a file \
                             in the container]\n",
                            EXEC_OUTPUT_LIMIT >> 20
                        )
                        .as_bytes(),
                    );
                    break;
                }
            }
        }
        let inspect = self
            .answer(
                "inspecting an exec",
                CALL_TIMEOUT,
                api.inspect_exec(&exec.id),
            )
            .await?
            .map_err(|e| self.classify(e))?;
        Ok(ExecResult {
            exit_code: inspect.exit_code.unwrap_or(-1),
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        })
    }

    /// Runs a pre-deploy hook in a Hook Container `<service>-pre-deploy-<4>` and waits for it to
    /// exit, at most its timeout (then it is stopped). Old hook containers of the Service are
    /// removed first. The hook container is kept for inspection.
    pub async fn run_hook(
        &self,
        service_id: &ServiceId,
        spec: &ServiceSpec,
        hook: &PreDeployHook,
        auth: Option<&ployz_core::api::RegistryAuth>,
    ) -> Result<HookResult, DockerError> {
        for old in self.observe().await? {
            if old.kind == ContainerKind::Hook && &old.service_id == service_id {
                self.remove(old.id.as_str()).await?;
            }
        }
        self.ensure_network().await?;
        self.ensure_image(&spec.container.image, spec.container.pull_policy, auth)
            .await?;
        let (name, hostname) =
            container_names(&spec.name, &format!("-pre-deploy-{}", random_suffix()));
        let mut labels = self.common_labels(service_id, spec);
        labels.insert(labels::HOOK.to_owned(), "pre-deploy".to_owned());
        let mut env: Vec<String> = spec
            .container
            .env
            .iter()
            .chain(hook.env.iter())
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        env.push(format!("PLOYZ_MACHINE_ID={}", self.machine_id));
        env.push("PLOYZ_HOOK_PRE_DEPLOY=true".into());
        let body = ContainerCreateBody {
            hostname: Some(hostname),
            image: Some(spec.container.image.clone()),
            cmd: Some(hook.command.clone()),
            entrypoint: spec.container.entrypoint.clone(),
            user: hook.user.clone().or_else(|| spec.container.user.clone()),
            env: Some(env),
            labels: Some(labels),
            healthcheck: Some(HealthConfig {
                test: Some(vec!["NONE".into()]),
                ..Default::default()
            }),
            host_config: Some(HostConfig {
                restart_policy: Some(RestartPolicy {
                    name: Some(RestartPolicyNameEnum::NO),
                    maximum_retry_count: None,
                }),
                network_mode: Some(NETWORK.to_owned()),
                dns: Some(vec![self.subnet.gateway().to_string()]),
                dns_search: Some(vec!["internal".into()]),
                privileged: Some(hook.privileged),
                mounts: Some(spec.container.mounts.iter().map(docker_mount).collect()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let created_id = self.create_and_start(&name, body, spec).await?;
        let deadline = tokio::time::Instant::now() + Duration::from_millis(hook.timeout_ms);
        let exit_code = loop {
            let api = self.api().await?;
            let c = self
                .answer(
                    "inspecting a hook container",
                    CALL_TIMEOUT,
                    api.inspect_container(&created_id, None),
                )
                .await?
                .map_err(|e| self.classify(e))?;
            let state = c.state.unwrap_or_default();
            if state.running != Some(true)
                && state.status.map(|s| s.to_string()).as_deref() != Some("created")
            {
                break state.exit_code;
            }
            if tokio::time::Instant::now() >= deadline {
                self.stop(&created_id, Some(Duration::from_secs(5))).await?;
                break None;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let logs = self.tail_logs(&created_id, 20).await.unwrap_or_default();
        Ok(HookResult {
            container: ContainerRef {
                id: created_id
                    .parse()
                    .map_err(|_| DockerError::NoSuchContainer(created_id.clone()))?,
                name,
            },
            exit_code,
            logs,
        })
    }

    /// Docker's event stream for this Machine's containers. Docker must begin answering within
    /// [`CALL_TIMEOUT`]; the stream itself may stay quiet for as long as nothing happens.
    pub async fn container_events(
        &self,
    ) -> Result<
        impl Stream<Item = Result<bollard::models::EventMessage, DockerError>> + Send + 'static,
        DockerError,
    > {
        let filters = HashMap::from([
            ("type".to_owned(), vec!["container".to_owned()]),
            (
                "label".to_owned(),
                vec![format!("{}={}", labels::MACHINE_ID, self.machine_id)],
            ),
        ]);
        let docker = self.clone();
        Ok(self
            .api()
            .await?
            .events(Some(
                bollard::query_parameters::EventsOptionsBuilder::default()
                    .filters(&filters)
                    .build(),
            ))
            .map(move |e| e.map_err(|e| docker.classify(e))))
    }
}

/// Refuses a spec whose secrets lack their values: a container created from it would get no
/// secret files (or empty ones).
fn check_secret_values(spec: &ServiceSpec) -> Result<(), DockerError> {
    match spec.container.secrets.iter().find(|s| s.value.is_none()) {
        Some(s) => Err(DockerError::SecretWithoutValue {
            service: spec.name.to_string(),
            secret: s.name.clone(),
            target: s.target.clone(),
        }),
        None => Ok(()),
    }
}

/// Why the files archive could not be built.
enum ArchiveError {
    Io(std::io::Error),
    Docker(DockerError),
}

/// The tar archive of a spec's configs and secrets, each at its target (relative to `/`).
fn files_archive(spec: &ServiceSpec) -> Result<Vec<u8>, ArchiveError> {
    let mut archive = tar::Builder::new(Vec::new());
    let mut append =
        |content: &[u8], target: &str, mode: Option<u32>, uid: Option<u32>, gid: Option<u32>| {
            let mut header = tar::Header::new_gnu();
            header.set_size(content.len() as u64);
            header.set_mode(mode.unwrap_or(0o444));
            header.set_uid(uid.unwrap_or(0) as u64);
            header.set_gid(gid.unwrap_or(0) as u64);
            header.set_mtime(0);
            archive.append_data(&mut header, target.trim_start_matches('/'), content)
        };
    for cfg in &spec.container.configs {
        append(
            cfg.content.as_bytes(),
            &cfg.target,
            cfg.mode,
            cfg.uid,
            cfg.gid,
        )
        .map_err(ArchiveError::Io)?;
    }
    check_secret_values(spec).map_err(ArchiveError::Docker)?;
    for secret in &spec.container.secrets {
        let value = secret
            .value
            .as_ref()
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        append(value, &secret.target, secret.mode, secret.uid, secret.gid)
            .map_err(ArchiveError::Io)?;
    }
    archive.into_inner().map_err(ArchiveError::Io)
}

/// A spec's mount as Docker's. An anonymous volume is a volume mount without a source: Docker
/// creates it with the container, and removing the container (which Ployz does with `v`) removes
/// it too.
fn docker_mount(m: &Mount) -> bollard::models::Mount {
    match m {
        Mount::Volume {
            source,
            target,
            read_only,
            no_copy,
        } => bollard::models::Mount {
            typ: Some(MountType::VOLUME),
            source: Some(source.clone()),
            target: Some(target.clone()),
            read_only: Some(*read_only),
            volume_options: no_copy.then(|| MountVolumeOptions {
                no_copy: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        },
        Mount::Bind {
            source,
            target,
            read_only,
        } => bollard::models::Mount {
            typ: Some(MountType::BIND),
            source: Some(source.clone()),
            target: Some(target.clone()),
            read_only: Some(*read_only),
            ..Default::default()
        },
        Mount::Anonymous { target, read_only } => bollard::models::Mount {
            typ: Some(MountType::VOLUME),
            target: Some(target.clone()),
            read_only: Some(*read_only),
            ..Default::default()
        },
        Mount::Tmpfs {
            target,
            size_bytes,
            mode,
        } => bollard::models::Mount {
            typ: Some(MountType::TMPFS),
            target: Some(target.clone()),
            tmpfs_options: Some(MountTmpfsOptions {
                size_bytes: size_bytes.map(|v| v as i64),
                mode: mode.map(i64::from),
                options: None,
            }),
            ..Default::default()
        },
    }
}

/// `repo[:tag]` -> (repo, tag), `latest` when absent; digests stay whole.
fn split_tag(image: &str) -> (&str, &str) {
    if image.contains('@') {
        return (image, "");
    }
    let last = image.rsplit('/').next().unwrap_or(image);
    match last.rfind(':') {
        Some(i) => {
            let cut = image.len() - last.len() + i;
            (&image[..cut], &image[cut + 1..])
        }
        None => (image, "latest"),
    }
}

/// Seconds since the epoch of an RFC 3339 timestamp such as `2026-11-30T14:00:00.123Z`.
fn parse_rfc3339_seconds(s: &str) -> Option<i64> {
    let (date, time) = s.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let hms: Vec<i64> = time
        .get(..8)?
        .split(':')
        .map(|p| p.parse::<i64>().ok())
        .collect::<Option<_>>()?;
    // Days from civil (Howard Hinnant's algorithm).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = if y2 >= 0 { y2 } else { y2 - 399 } / 400;
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hms[0] * 3600 + hms[1] * 60 + hms[2])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_split_like_docker() {
        assert_eq!(split_tag("busybox"), ("busybox", "latest"));
        assert_eq!(split_tag("busybox:1.36"), ("busybox", "1.36"));
        assert_eq!(
            split_tag("localhost:5000/app"),
            ("localhost:5000/app", "latest")
        );
        assert_eq!(
            split_tag("localhost:5000/app:2"),
            ("localhost:5000/app", "2")
        );
    }

    #[test]
    fn names_and_ids_follow_dockers_rules_before_any_request() {
        check_container_id("0123456789abcdef").unwrap();
        check_container_id(&"a".repeat(64)).unwrap();
        for bad in ["", "../containers/x", "abc/def", "xyz", &"a".repeat(65)] {
            let e = check_container_id(bad).unwrap_err().to_string();
            assert!(e.starts_with("id '"), "{e}");
        }
        check_volume_name("app_data").unwrap();
        check_volume_name("a1.b-c").unwrap();
        for bad in [
            "",
            "a",
            "..",
            "../containers/abc",
            "..%2Fimages%2Fx",
            "_x",
            "a/b",
            "a b",
        ] {
            let e = check_volume_name(bad).unwrap_err().to_string();
            assert!(e.starts_with("name '"), "{e}");
        }
        for good in [
            "busybox",
            "ployz-test/busybox:1",
            "localhost:5000/team/app:2",
            "nginx@sha256:0123abcd",
        ] {
            check_image_reference(good).unwrap();
        }
        for bad in [
            "",
            "../containers/x",
            "a/../b",
            "/abs",
            "a//b",
            "a b",
            "a?b",
            "a#b",
        ] {
            let e = check_image_reference(bad).unwrap_err().to_string();
            assert!(e.starts_with("image '"), "{e}");
        }
        let long = check_volume_name(&format!("/{}", "x".repeat(500)))
            .unwrap_err()
            .to_string();
        assert!(long.len() < 400, "values are shortened: {long}");
    }

    #[test]
    fn container_names_keep_the_service_name_and_host_names_are_dns_labels() {
        /// Docker's rule for a container name.
        fn docker_accepts(name: &str) -> bool {
            let mut chars = name.chars();
            chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
                && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | '-'))
        }
        let long = format!("_{}", "Ab_".repeat(20) + "xy");
        let cases = [
            ("web", "-x7k2", "web-x7k2", "web-x7k2"),
            ("My_App", "-x7k2", "My_App-x7k2", "my-app-x7k2"),
            ("_app.v2", "-x7k2", "app.v2-x7k2", "app-v2-x7k2"),
            (
                "web",
                "-pre-deploy-x7k2",
                "web-pre-deploy-x7k2",
                "web-pre-deploy-x7k2",
            ),
        ];
        for (service, tail, name, hostname) in cases {
            let service: ServiceName = service.parse().unwrap();
            assert_eq!(
                container_names(&service, tail),
                (name.to_owned(), hostname.to_owned())
            );
        }
        for tail in ["-x7k2", "-pre-deploy-x7k2"] {
            for service in [long.as_str(), &"z".repeat(63), &"a_".repeat(31)] {
                let parsed: ServiceName = service.parse().unwrap();
                let (name, hostname) = container_names(&parsed, tail);
                assert!(docker_accepts(&name), "{name}");
                assert!(name.ends_with(tail), "{name}");
                assert!(hostname.len() <= 63, "{hostname}");
                assert!(hostname.ends_with(tail), "{hostname}");
                assert!(
                    !hostname.contains("--x") && !hostname.contains("--p"),
                    "{hostname}"
                );
                assert!(
                    hostname
                        .chars()
                        .all(|c| matches!(c, 'a'..='z' | '0'..='9' | '-')),
                    "{hostname}"
                );
            }
        }
    }

    #[test]
    fn timestamps_parse() {
        assert_eq!(parse_rfc3339_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            parse_rfc3339_seconds("2026-11-30T14:00:05.123456789Z"),
            Some(1_796_047_205)
        );
    }

    fn spec_with_secrets() -> ServiceSpec {
        use ployz_core::{ConfigFile, ContainerSpec, SecretFile, SecretValue};
        ServiceSpec {
            name: "db".parse().unwrap(),
            mode: ployz_core::ServiceMode::Replicated,
            replicas: 1,
            container: ContainerSpec {
                image: "busybox:latest".into(),
                configs: vec![ConfigFile {
                    name: "motd".into(),
                    target: "/etc/motd".into(),
                    content: "hello".into(),
                    mode: None,
                    uid: None,
                    gid: None,
                }],
                secrets: vec![
                    SecretFile::new(
                        "pw".into(),
                        "/run/secrets/pw".into(),
                        SecretValue::new(b"hunter2-not-in-labels".to_vec()),
                        None,
                        None,
                        None,
                    ),
                    SecretFile::new(
                        "key".into(),
                        "/etc/app/key".into(),
                        SecretValue::new(vec![0, 1, 2, 255]),
                        Some(0o400),
                        Some(999),
                        Some(998),
                    ),
                ],
                ..Default::default()
            },
            ports: vec![],
            machines: vec![],
            update: Default::default(),
            pre_deploy: None,
            depends_on: vec![],
            revisions: None,
            routes: vec![],
        }
    }

    #[test]
    fn the_spec_label_carries_secret_digests_and_never_values() {
        let subnet: MachineSubnet = "10.210.3.0/24".to_owned().try_into().unwrap();
        let docker = MachineDocker::connect(
            // Never asked: building a request body makes no call.
            Some("unix:///dev/null"),
            MachineId::generate(),
            subnet,
        )
        .unwrap();
        let spec = spec_with_secrets();
        let body = docker.service_container_body(&ServiceId::generate(), &spec, "db-abcd");
        let labels = body.labels.unwrap();
        let label = &labels[labels::SERVICE_SPEC];
        let every_label = format!("{labels:?}");
        assert!(!every_label.contains("hunter2"), "{every_label}");
        let encoded = serde_json::to_string(&ployz_core::SecretValue::new(
            b"hunter2-not-in-labels".to_vec(),
        ))
        .unwrap();
        let encoded = encoded.trim_matches('"');
        assert!(!every_label.contains(encoded), "{every_label}");
        assert!(!label.contains("\"value\""), "{label}");
        assert!(label.contains(&spec.container.secrets[0].digest), "{label}");
        let back: ServiceSpec = serde_json::from_str(label).unwrap();
        assert_eq!(
            back, spec,
            "the label form compares equal to the spec it came from"
        );
        assert!(!back.has_secret_values());
    }

    #[test]
    fn secrets_and_configs_are_archived_with_their_mode_and_owner() {
        let bytes = match files_archive(&spec_with_secrets()) {
            Ok(b) => b,
            Err(_) => panic!("the archive could not be built"),
        };
        let mut archive = tar::Archive::new(&bytes[..]);
        let mut seen = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let h = entry.header();
            let row = (
                entry.path().unwrap().display().to_string(),
                h.mode().unwrap(),
                h.uid().unwrap(),
                h.gid().unwrap(),
            );
            let mut content = Vec::new();
            std::io::Read::read_to_end(&mut entry, &mut content).unwrap();
            seen.push((row, content));
        }
        assert_eq!(
            seen,
            vec![
                (("etc/motd".to_owned(), 0o444, 0, 0), b"hello".to_vec()),
                (
                    ("run/secrets/pw".to_owned(), 0o444, 0, 0),
                    b"hunter2-not-in-labels".to_vec()
                ),
                (
                    ("etc/app/key".to_owned(), 0o400, 999, 998),
                    vec![0, 1, 2, 255]
                ),
            ]
        );
    }

    #[test]
    fn a_spec_whose_secrets_lost_their_values_creates_nothing() {
        let spec = spec_with_secrets().without_secret_values();
        let err = check_secret_values(&spec).unwrap_err().to_string();
        assert!(err.contains("service 'db'"), "{err}");
        assert!(
            err.contains("the secret 'pw' (/run/secrets/pw) carries no value"),
            "{err}"
        );
        assert!(
            err.contains("deploy the Service from its Compose file"),
            "{err}"
        );
        assert!(files_archive(&spec).is_err());
        assert!(check_secret_values(&spec_with_secrets()).is_ok());
    }
}
